/**
 * One forward + backward of the frozen 106M model (M1) on the wasm backend (world 1), timed over several warm
 * calls, with the backend's own matMul rate measured in the same run, right before and right after the calls:
 *
 *   model_flops_per_token = 6 * params + 12 * layers * seq * hidden
 *     (params = every parameter, the tied embedding included: 2 FLOPs per parameter forward, 4 backward;
 *      the attention term is QK^T and PV forward + backward without causal savings; recomputation under
 *      gradient checkpointing is NOT counted: it is overhead, as usual for MFU)
 *   mfu = model_flops_per_token * tok_per_s / matmul_flops_per_s
 *     (matmul_flops_per_s: the backend's plain 2-D tf.matMul rate, right operand reused as the model's weights
 *      are, measured right before and right after the timed calls: the median over reps per shape, of
 *      [512,576]x[576,1536], [512,512]x[512,512] and [1024,1024]x[1024,1024], and the BEST of those shapes,
 *      so the MFU is the conservative one)
 *
 * Prints a `BENCH_JSON` line (case "frozen-step"). Also importable: frozenStepBench(o).
 * Usage: node dist/bench/model-frozen-step.js [--seq 256] [--micro-batch 1] [--grad-ckpt|--no-grad-ckpt] [--calls 3]
 *        [--layers N] [--backend wasm] [--ckpt-keep-mb 512 (0: whole-block recomputation)]
 */
import * as tf from "@tensorflow/tfjs-core";
import { initEngine, type BackendName } from "../src/model/backend";
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

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b), n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/** GFLOP/s of an [m,k] x [k,n] tf.matMul (right operand reused, as the model's weights are), one sample per rep. */
function matmulRates(m: number, k: number, n: number, reps: number): number[] {
  const a = tf.randomUniform([m, k]) as tf.Tensor2D, b = tf.randomUniform([k, n]) as tf.Tensor2D;
  const out: number[] = [];
  try {
    tf.tidy(() => { tf.matMul(a, b); }); // XNNPACK packs b once (cached per tensor)
    for (let i = 0; i < reps; i++) {
      // wasm kernels run synchronously: the product is done when matMul returns (no dataSync: it would add a copy
      // of the output at ~10 ns/float to the time)
      const t0 = performance.now();
      const c = tf.matMul(a, b);
      const dt = (performance.now() - t0) / 1000;
      c.dispose();
      out.push((2 * m * k * n) / dt / 1e9);
    }
  } finally {
    tf.dispose([a, b]);
  }
  return out;
}

export async function frozenStepBench(o: { seq: number; microBatch: number; gradCkpt: boolean; calls: number; layers?: number; backend?: BackendName; ckptKeepBytes?: number; log?: (s: string) => void }): Promise<Record<string, unknown>> {
  const log = o.log ?? (() => undefined);
  const be = await initEngine(o.backend ?? "wasm");
  const cfg = buildConfig({ seqLen: o.seq, layers: o.layers });
  const { total } = paramLayout(cfg);
  const params = countParams(cfg).sum_numel;
  const w = new Float32Array(total);
  initWeights(cfg, 20260919, w);
  const m = new Llama(cfg, be.kernels, { gradCkpt: o.gradCkpt });
  try {
    let t0 = performance.now();
    m.bindParams(w);
    const setMs = performance.now() - t0;
    const ids = new Int32Array(o.microBatch * o.seq);
    let s = 12345;
    for (let i = 0; i < ids.length; i++) { s = (Math.imul(s, 1103515245) + 12345) >>> 0; ids[i] = s % cfg.vocabSize; }
    const grads = new Float32Array(total);
    const tok = o.microBatch * o.seq;
    // warm-up: the first call after an upload pays XNNPACK's weight packing
    t0 = performance.now();
    const loss0 = m.lossAndGrads(ids, o.microBatch, o.seq, 1, grads);
    const firstMs = performance.now() - t0;
    log(`first call (packing): ${firstMs.toFixed(0)} ms, loss ${loss0.toFixed(4)}`);
    const shapes: [number, number, number][] = [[512, 576, 1536], [512, 512, 512], [1024, 1024, 1024]];
    const mmBefore = shapes.map(([a, b, c]) => matmulRates(a, b, c, 7));
    const stepMs: number[] = [], cpuMs: number[] = [];
    const tensorsBefore = tf.memory().numTensors;
    for (let i = 0; i < o.calls; i++) {
      const c0 = process.cpuUsage();
      t0 = performance.now();
      m.lossAndGrads(ids, o.microBatch, o.seq, 1, grads);
      const dt = performance.now() - t0;
      const cu = process.cpuUsage(c0);
      stepMs.push(dt); cpuMs.push((cu.user + cu.system) / 1000);
      log(`call ${i + 1}: ${dt.toFixed(0)} ms wall (${(tok / dt * 1000).toFixed(1)} tok/s), ${cpuMs[i].toFixed(0)} ms CPU`);
    }
    const mmAfter = shapes.map(([a, b, c]) => matmulRates(a, b, c, 7));
    const perShape = shapes.map((sh, i) => ({ shape: sh.join("x"), gflops: +median([...mmBefore[i], ...mmAfter[i]]).toFixed(2),
      before: +median(mmBefore[i]).toFixed(2), after: +median(mmAfter[i]).toFixed(2) }));
    const stepMedian = median(stepMs);
    const tokPerS = tok / (stepMedian / 1000);
    const gflops = Math.max(...perShape.map((x) => x.gflops));
    const flopsPerTok = 6 * params + 12 * cfg.numLayers * o.seq * cfg.hiddenSize;
    const mfu = (flopsPerTok * tokPerS) / (gflops * 1e9);
    const heap = wasmHeapBytes();
    return {
      case: "frozen-step", backend: be.engine, detail: be.detail, world: 1, params, layers: cfg.numLayers,
      seq_len: o.seq, micro_batch: o.microBatch, grad_ckpt: o.gradCkpt, ckpt_keep_bytes: o.ckptKeepBytes ?? "default", calls: o.calls,
      step_ms_median: +stepMedian.toFixed(1), step_ms: stepMs.map((x) => +x.toFixed(1)), step_cpu_ms: cpuMs.map((x) => +x.toFixed(1)),
      tok_per_s: +tokPerS.toFixed(2),
      tok_per_cpu_s: +(tok / (median(cpuMs) / 1000)).toFixed(2),
      matmul_gflops: +gflops.toFixed(2), matmul_rates: perShape,
      model_flops_per_token: flopsPerTok, model_flops_formula: "6*params + 12*layers*seq*hidden",
      mfu: +mfu.toFixed(3),
      first_call_ms: +firstMs.toFixed(1), set_weights_ms: +setMs.toFixed(1), loss: +loss0.toFixed(5),
      tensor_leak: tf.memory().numTensors - tensorsBefore,
      wasm_heap_bytes: heap, wasm_heap_limit_bytes: heap === null ? null : 4 * 1024 ** 3,
      tf_bytes: tf.memory().numBytes, rss_bytes: process.memoryUsage().rss,
    };
  } finally {
    m.dispose();
  }
}

async function main(): Promise<void> {
  const seq = Number(arg("--seq", "256"));
  const microBatch = Number(arg("--micro-batch", arg("--micro", "1")));
  const calls = Number(arg("--calls", arg("--steps", "3")));
  const gradCkpt = !(process.argv.includes("--no-grad-ckpt") || process.argv.includes("--no-ckpt"));
  const layersArg = arg("--layers", "");
  const keepMb = arg("--ckpt-keep-mb", ""); // M6 selective-recomputation budget; 0: recompute whole blocks
  const res = await frozenStepBench({
    seq, microBatch, gradCkpt, calls, layers: layersArg ? Number(layersArg) : undefined,
    backend: arg("--backend", "wasm") as BackendName,
    ckptKeepBytes: keepMb ? Number(keepMb) * 1024 * 1024 : undefined, log: (s) => console.log(s),
  });
  console.log("BENCH_JSON " + JSON.stringify(res));
}

if (require.main === module) main().catch((e) => { console.error(e); process.exitCode = 1; });
