/**
 * One forward+backward of the frozen model on the webgpu engine of a built tree (this one, or a base revision built
 * by bench/native/build-base.sh), the same code timing both: the bench's webgpu case runs it once per tree in its
 * own process. Each call is timed to its settle (the gradient and the loss read back). Prints one line:
 * `WEBGPU_STEP {"ms":[...],"loss":L,"adapter":"...","dispatches":D|null}` (dispatches: where the tree's engine
 * counts them).
 *
 *   node dist/bench/webgpu-step.js [--tree DIR] [--seq 256] [--micro-batch 1] [--calls 2] [--layers N]
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { arg } from "./args";
import { Seeded } from "./seeded";

/** The webgpu engine's module in a built tree: its own file since the engine's split into rooms, one file before. */
export const WEBGPU_ENGINE_FILES = ["engine/webgpu/engine.js", "engine/webgpu.js"];

async function main(): Promise<void> {
  const tree = path.resolve(arg("--tree", path.join(__dirname, "..", "..")));
  const seq = Number(arg("--seq", "256")),
    mb = Number(arg("--micro-batch", "1")),
    calls = Number(arg("--calls", "2")),
    layers = arg("--layers", "");
  // the tree's own modules: its engine and model
  const mod = (p: string) => require(path.join(tree, "dist", "src", "model", p));
  const engine = WEBGPU_ENGINE_FILES.find((f) => fs.existsSync(path.join(tree, "dist", "src", "model", f)));
  if (!engine) throw new Error(`${tree}: no built webgpu engine (dist/src/model/${WEBGPU_ENGINE_FILES.join(" or ")})`);
  const { createWebgpuKernels } = mod(engine);
  const { buildConfig } = mod("llama-config.js");
  const { paramLayout } = mod("layout.js");
  const { initWeights } = mod("init.js");
  const { Llama } = mod("llama.js");
  const w = await createWebgpuKernels();
  if ("reason" in w) throw new Error(`webgpu: ${w.reason}; fix: ${w.fix}`);
  const k = w.kernels;
  const cfg = buildConfig({ seqLen: seq, layers: layers ? Number(layers) : undefined });
  const { total } = paramLayout(cfg);
  const params = new Float32Array(total);
  initWeights(cfg, 20260919, params);
  const m = new Llama(cfg, k, { gradCkpt: false });
  m.bindParams(params);
  k.weightsAre?.(params);
  const ids = new Seeded(12345).ids(mb * seq, cfg.vocabSize);
  const grads = new Float32Array(total);
  const pass = async () => {
    m.lossAndGrads(ids, mb, seq, 1, grads);
    // as a rank does: the gradient read back, its device copy zeroed (a tree without settle's clear ignores it and
    // uploads the gradient again at the next call, as its rank did)
    return (await k.settle([grads], { clear: true })).loss as number;
  };
  const loss = await pass(); // the first call compiles the pipelines
  const before = k.traffic?.().dispatches ?? null;
  const ms: number[] = [];
  for (let i = 0; i < calls; i++) {
    const t0 = performance.now();
    await pass();
    ms.push(performance.now() - t0);
  }
  const after = k.traffic?.().dispatches ?? null;
  const dispatches = before === null || after === null ? null : (after - before) / calls;
  process.stdout.write(`WEBGPU_STEP ${JSON.stringify({ ms, loss, adapter: k.name, dispatches })}\n`);
  k.dispose();
}

// a process of its own (bench/webgpu.ts starts it); bench.ts imports only WEBGPU_ENGINE_FILES
if (require.main === module)
  main().catch((e) => {
    process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(1);
  });
