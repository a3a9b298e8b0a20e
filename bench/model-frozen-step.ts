/**
 * One forward + backward of the frozen 106M model (M1) at seq 256, micro-batch 1, gradient checkpointing
 * on (M6), on the wasm backend: seconds and tok/s for a first and a second call, plus the wasm heap
 * (capped at 4 GB per thread). Usage: node dist/bench/model-frozen-step.js [--seq 256] [--micro 1] [--no-ckpt] [--steps 2]
 */
import * as tf from "@tensorflow/tfjs-core";
import { initBackend, type BackendName } from "../src/model/backend";
import { buildConfig, countParams } from "../src/model/config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { Llama } from "../src/model/llama";

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

function wasmHeapBytes(): number | null {
  const be = tf.backend() as unknown as { wasm?: { HEAPU8?: Uint8Array } };
  return be.wasm?.HEAPU8 ? be.wasm.HEAPU8.buffer.byteLength : null;
}

async function main(): Promise<void> {
  const seq = Number(arg("--seq", "256")), micro = Number(arg("--micro", "1")), steps = Number(arg("--steps", "2"));
  const gradCkpt = !process.argv.includes("--no-ckpt");
  const be = await initBackend(arg("--backend", "wasm") as BackendName);
  const layersArg = arg("--layers", "");
  const cfg = buildConfig({ seqLen: seq, layers: layersArg ? Number(layersArg) : undefined });
  const { total } = paramLayout(cfg);
  // wall seconds and this process's CPU seconds (the dev machine is shared: CPU time is the steadier figure)
  const clock = () => ({ wall: performance.now(), cpu: process.cpuUsage() });
  const since = (c: ReturnType<typeof clock>) => {
    const u = process.cpuUsage(c.cpu);
    return { wall: (performance.now() - c.wall) / 1000, cpu: (u.user + u.system) / 1e6 };
  };
  let t0 = clock();
  const w = new Float32Array(total);
  initWeights(cfg, 20260919, w);
  const initS = since(t0);
  const m = new Llama(cfg, { gradCkpt });
  t0 = clock();
  m.setWeights(w);
  const setS = since(t0);
  const ids = new Int32Array(micro * seq);
  let s = 12345;
  for (let i = 0; i < ids.length; i++) { s = (Math.imul(s, 1103515245) + 12345) >>> 0; ids[i] = s % cfg.vocabSize; }
  const grads = new Float32Array(total);
  const calls: { seconds: number; tok_per_s: number; cpu_seconds: number; tok_per_cpu_s: number; loss: number }[] = [];
  for (let i = 0; i < steps; i++) {
    t0 = clock();
    const loss = m.lossAndGrads(ids, micro, seq, 1, grads);
    const d = since(t0), tok = micro * seq;
    calls.push({ seconds: +d.wall.toFixed(3), tok_per_s: +(tok / d.wall).toFixed(1), cpu_seconds: +d.cpu.toFixed(3), tok_per_cpu_s: +(tok / d.cpu).toFixed(1), loss: +loss.toFixed(4) });
    console.log(`call ${i + 1}: ${d.wall.toFixed(2)} s wall (${(tok / d.wall).toFixed(1)} tok/s), ${d.cpu.toFixed(2)} s CPU (${(tok / d.cpu).toFixed(1)} tok/CPU-s), loss ${loss.toFixed(4)}`);
  }
  t0 = clock();
  m.setWeights(w); // a second upload: the per-optimizer-step cost, with the wasm heap already grown
  const setAgain = since(t0);
  console.log(`setWeights again: ${setAgain.wall.toFixed(2)} s wall, ${setAgain.cpu.toFixed(2)} s CPU`);
  // the call after an upload pays XNNPACK's weight packing again (tfjs-wasm caches it per tensor id):
  // this is the first micro-batch of every optimizer step
  t0 = clock();
  m.lossAndGrads(ids, micro, seq, 1, grads);
  const afterUpload = since(t0);
  console.log(`call after re-upload: ${afterUpload.wall.toFixed(2)} s wall, ${afterUpload.cpu.toFixed(2)} s CPU`);
  const heap = wasmHeapBytes();
  const res = {
    bench: "model-frozen-step", backend: be.backend, detail: be.detail, params: countParams(cfg).sum_numel, seq, micro, grad_ckpt: gradCkpt,
    layers: cfg.numLayers, init_weights_s: +initS.wall.toFixed(2), init_weights_cpu_s: +initS.cpu.toFixed(2),
    set_weights_s: +setS.wall.toFixed(2), set_weights_cpu_s: +setS.cpu.toFixed(2),
    set_weights_again_s: +setAgain.wall.toFixed(2), set_weights_again_cpu_s: +setAgain.cpu.toFixed(2), calls,
    call_after_reupload_s: +afterUpload.wall.toFixed(3), call_after_reupload_cpu_s: +afterUpload.cpu.toFixed(3),
    tf_bytes_after: tf.memory().numBytes, tf_tensors_after: tf.memory().numTensors,
    wasm_heap_bytes: heap, wasm_heap_limit_bytes: heap === null ? null : 4 * 1024 ** 3,
    rss_bytes: process.memoryUsage().rss,
  };
  console.log("BENCH_JSON " + JSON.stringify(res));
  m.dispose();
}

main().catch((e) => { console.error(e); process.exitCode = 1; });
