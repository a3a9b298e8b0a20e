/**
 * Per-kernel profile of one forward+backward of the frozen model on wasm: every registered wasm kernel's
 * kernelFunc is wrapped with a timer (wasm kernels are synchronous, so the wall time around the call is the
 * kernel's time; no dataSync is added). Prints ms per step by kernel, by kernel+shapes, and by op group, plus
 * the host-side remainder (JS loops, readHost, addInto, dispatch) = step total - sum of kernels.
 * Usage: node dist/bench/model-profile.js [--seq 256] [--micro 1] [--no-ckpt] [--calls 3] [--top 40]
 */
import * as tf from "@tensorflow/tfjs-core";
import { initEngine } from "../src/model/backend";
import { buildConfig } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { Llama } from "../src/model/llama";
import { arg } from "./args";
import { Seeded } from "./seeded";

interface Rec {
  ms: number;
  n: number;
}

let recording = false;
const byKey = new Map<string, Rec>();

function instrument(backend: string): void {
  for (const k of tf.getKernelsForBackend(backend)) {
    const cfg = k as unknown as {
      kernelName: string;
      kernelFunc: (a: { inputs: Record<string, tf.TensorInfo> }) => unknown;
    };
    const orig = cfg.kernelFunc;
    cfg.kernelFunc = (a) => {
      if (!recording) return orig(a);
      const t0 = performance.now();
      const r = orig(a);
      const dt = performance.now() - t0;
      const shapes = Object.values(a.inputs)
        .map((t) => (t ? `[${t.shape.join(",")}]` : "-"))
        .join(" ");
      const key = `${cfg.kernelName} ${shapes}`;
      const e = byKey.get(key) ?? { ms: 0, n: 0 };
      e.ms += dt;
      e.n++;
      byKey.set(key, e);
      return r;
    };
  }
}

/** Op group of a kernel call, from its name and input shapes (frozen shapes: D 576, F 1536, V 49152). */
function group(key: string, V: number): string {
  const [name] = key.split(" ");
  const hasV = key.includes(`${V}`);
  if (hasV) return `LM head/CE: ${name}`;
  if (name === "_FusedMatMul" || name === "BatchMatMul") return "matMul (blocks)";
  if (name === "Transpose") return "transpose";
  if (name === "Softmax") return "softmax (attn)";
  if (name === "Pack" || name === "Unpack" || name === "Concat" || name === "Slice") return "pack/unpack/concat/slice";
  return `elementwise/reduce: ${name}`;
}

async function main(): Promise<void> {
  const seq = Number(arg("--seq", "256")),
    micro = Number(arg("--micro", "1")),
    calls = Number(arg("--calls", "3"));
  const top = Number(arg("--top", "40"));
  const gradCkpt = !process.argv.includes("--no-ckpt");
  const be = await initEngine("wasm");
  tf.env().set("CHECK_COMPUTATION_FOR_ERRORS", false);
  instrument("wasm");
  const cfg = buildConfig({ seqLen: seq });
  const { total } = paramLayout(cfg);
  const w = new Float32Array(total);
  initWeights(cfg, 20260919, w);
  const m = new Llama(cfg, be.kernels, { gradCkpt });
  m.bindParams(w);
  const ids = new Seeded(12345).ids(micro * seq, cfg.vocabSize);
  const grads = new Float32Array(total);
  m.lossAndGrads(ids, micro, seq, 1, grads); // warm: weight packing
  let wall = 0;
  recording = true;
  for (let i = 0; i < calls; i++) {
    const t0 = performance.now();
    m.lossAndGrads(ids, micro, seq, 1, grads);
    const dt = performance.now() - t0;
    wall += dt;
    console.log(`call ${i + 1}: ${dt.toFixed(0)} ms`);
  }
  recording = false;
  const per = (ms: number) => ms / calls;
  let kernelMs = 0,
    nOps = 0;
  for (const e of byKey.values()) {
    kernelMs += e.ms;
    nOps += e.n;
  }
  const groups = new Map<string, Rec>();
  for (const [k, e] of byKey) {
    const g = group(k, cfg.vocabSize);
    const r = groups.get(g) ?? { ms: 0, n: 0 };
    r.ms += e.ms;
    r.n += e.n;
    groups.set(g, r);
  }
  console.log(
    `\nstep ${per(wall).toFixed(0)} ms; kernels ${per(kernelMs).toFixed(0)} ms in ${nOps / calls} ops; host-side/dispatch ${per(wall - kernelMs).toFixed(0)} ms`,
  );
  console.log("\n| op group | ms/step | calls/step |\n|---|---:|---:|");
  for (const [g, e] of [...groups].sort((a, b) => b[1].ms - a[1].ms))
    console.log(`| ${g} | ${per(e.ms).toFixed(1)} | ${e.n / calls} |`);
  console.log(`| host side (JS, readHost, addInto, dispatch) | ${per(wall - kernelMs).toFixed(1)} | |`);
  console.log("\n| kernel + input shapes | ms/step | calls/step |\n|---|---:|---:|");
  for (const [k, e] of [...byKey].sort((a, b) => b[1].ms - a[1].ms).slice(0, top))
    console.log(`| ${k} | ${per(e.ms).toFixed(1)} | ${e.n / calls} |`);
  console.log(
    "PROFILE_JSON " +
      JSON.stringify({
        seq,
        micro,
        gradCkpt,
        step_ms: per(wall),
        kernel_ms: per(kernelMs),
        ops: nOps / calls,
        groups: Object.fromEntries([...groups].map(([g, e]) => [g, +per(e.ms).toFixed(2)])),
      }),
  );
  m.dispose();
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
