/**
 * One forward + backward of the frozen 106M model (M1) on one engine (world 1; `auto` = native when it loads),
 * timed over several warm calls, with the engine's own single-thread matrix-product rate measured in the same run,
 * right before and right after the calls, and one more, profiled call that gives each kernel's share of the step:
 *
 *   model_flops_per_token = 6 * params + 12 * layers * seq * hidden
 *     (params = every parameter, the tied embedding included: 2 FLOPs per parameter forward, 4 backward;
 *      the attention term is QK^T and PV forward + backward without causal savings; recomputation under
 *      gradient checkpointing is NOT counted: it is overhead, as usual for MFU)
 *   mfu = model_flops_per_token * tok_per_s / matmul_flops_per_s
 *     (matmul_flops_per_s: the engine's kernels.matmul rate, one thread (the native engine: OpenBLAS sgemm pinned
 *      to 1 thread), measured right before and right after the timed calls: the median over reps per shape, of the
 *      model's own products at N = micro_batch x seq tokens (x W^T [N,576]x[576,1536], dy W [N,1536]x[1536,576],
 *      the weight gradient dy^T x [1536,N]x[N,576], the LM head's logits [N,576]x[576,49152]) and of 2048^2, and
 *      the BEST of those shapes, so the MFU is the conservative one)
 *
 * Prints a `BENCH_JSON` line (case "frozen-step"). Also importable: frozenStepBench(o).
 * Usage: node dist/bench/model-frozen-step.js [--seq 256] [--micro-batch 1] [--grad-ckpt|--no-grad-ckpt] [--calls 3]
 *        [--activation-budget-gb G (0 = half the machine's memory over --world ranks)] [--world 1]
 *        [--layers N] [--backend auto|native|wasm|cpu|webgpu] [--precision fp32|bf16] [--isa avx2|...]
 * (bf16: the products on bf16 operands, P8; the native engine's built-in GEMM only; --isa: its kernel, as the
 * trainer's --isa forces it)
 */
import * as tf from "@tensorflow/tfjs-core";
import { activationBudget, type IsaChoice, type Precision } from "../src/config";
import { initEngine, type BackendName } from "../src/model/backend";
import { DEFAULT_NATIVE } from "../src/model/engine/native";
import { profiledAttention } from "./native-probes";
import { isDeferred, type Kernels } from "../src/model/kernels";
import { buildConfig, countParams } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { activationPlan, Llama } from "../src/model/llama";
import {
  cpuMs as cpuNowMs,
  profiledKernels,
  profileSummary,
  type KernelRow,
  type ProfileSummary,
} from "./kernel-profile";
import { arg } from "./args";
import { Seeded } from "./seeded";

function wasmHeapBytes(): number | null {
  try {
    const be = tf.backend() as unknown as { wasm?: { HEAPU8?: Uint8Array } };
    return be.wasm?.HEAPU8 ? be.wasm.HEAPU8.buffer.byteLength : null;
  } catch {
    return null; // no tfjs backend in this process (the native engine)
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b),
    n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

export interface MatmulShape {
  name: string;
  tA: boolean;
  tB: boolean;
  M: number;
  N: number;
  K: number;
  reps: number;
}

/** The products the rate is measured on: the model's own, at N tokens, and 2048^2. */
export function rateShapes(N: number, D: number, F: number, V: number): MatmulShape[] {
  return [
    { name: `x W^T [${N},${D}]x[${D},${F}]`, tA: false, tB: true, M: N, N: F, K: D, reps: 7 },
    { name: `dy W [${N},${F}]x[${F},${D}]`, tA: false, tB: false, M: N, N: D, K: F, reps: 7 },
    { name: `dy^T x [${F},${N}]x[${N},${D}]`, tA: true, tB: false, M: F, N: D, K: N, reps: 7 },
    { name: `LM head [${N},${D}]x[${D},${V}]`, tA: false, tB: true, M: N, N: V, K: D, reps: 3 },
    { name: "2048^2 [2048,2048]x[2048,2048]", tA: false, tB: false, M: 2048, N: 2048, K: 2048, reps: 3 },
  ];
}

/** GFLOP/s of the engine's matmul on one shape, one sample per rep (one untimed call first; a deferred engine is awaited). */
export async function matmulRates(k: Kernels, sh: MatmulShape): Promise<number[]> {
  const g = new Seeded(7);
  const a = g.floats(sh.M * sh.K),
    b = g.floats(sh.K * sh.N),
    c = new Float32Array(sh.M * sh.N);
  k.matmul(sh.tA, sh.tB, sh.M, sh.N, sh.K, 1, a, b, 0, c);
  if (isDeferred(k)) await k.settle([c]);
  const out: number[] = [];
  for (let i = 0; i < sh.reps; i++) {
    const t0 = performance.now();
    k.matmul(sh.tA, sh.tB, sh.M, sh.N, sh.K, 1, a, b, 0, c);
    if (isDeferred(k)) await k.settle([c]);
    out.push((2 * sh.M * sh.N * sh.K) / ((performance.now() - t0) / 1000) / 1e9);
  }
  return out;
}

export async function frozenStepBench(o: {
  seq: number;
  microBatch: number;
  gradCkpt: boolean;
  /** M6: the training arena's budget (activationPlan); the row names the policy it gives */
  activationBudgetBytes: number;
  calls: number;
  layers?: number;
  backend?: BackendName;
  log?: (s: string) => void;
  /** the products' precision (bf16: the native engine's built-in GEMM, P8); default fp32 */
  precision?: Precision;
  /** the native engine's kernel (`--isa`, as the trainer forces one); default auto */
  isa?: IsaChoice;
}): Promise<
  Record<string, unknown> & { kernel_profile: KernelRow[]; profile_step_ms: number; profile_summary: ProfileSummary }
> {
  const log = o.log ?? (() => undefined);
  const precision = o.precision ?? "fp32";
  const native = { ...DEFAULT_NATIVE, precision, isa: o.isa ?? DEFAULT_NATIVE.isa };
  const be = await initEngine(o.backend ?? "auto", native);
  log(`frozen-step engine: ${be.detail}`);
  const cfg = buildConfig({ seqLen: o.seq, layers: o.layers });
  const { total } = paramLayout(cfg);
  const params = countParams(cfg).sum_numel;
  const w = new Float32Array(total);
  initWeights(cfg, 20260919, w);
  // the model calls the kernels through this object: the profiled call swaps its methods for timed ones
  const k: Kernels = { ...be.kernels };
  const m = new Llama(cfg, k, { gradCkpt: o.gradCkpt, activationBudgetBytes: o.activationBudgetBytes });
  const plan = activationPlan(cfg, o.microBatch, o.seq, o.gradCkpt, o.activationBudgetBytes);
  log(
    `frozen-step activations: recompute ${plan.recompute}${plan.attnKept ? "" : " (attention too)"}, ${(plan.bytes / 2 ** 30).toFixed(2)} GiB of a ${(o.activationBudgetBytes / 2 ** 30).toFixed(2)} GiB budget`,
  );
  // a deferred engine (webgpu): each pass is timed to its settle, the loss and the gradient read back
  const pass = async (ids: Int32Array, grads: Float32Array): Promise<number> => {
    const loss = m.lossAndGrads(ids, o.microBatch, o.seq, 1, grads);
    return isDeferred(be.kernels) ? (await be.kernels.settle([grads])).loss : loss;
  };
  try {
    let t0 = performance.now();
    m.bindParams(w);
    be.kernels.weightsAre?.(w);
    const setMs = performance.now() - t0;
    const ids = new Seeded(12345).ids(o.microBatch * o.seq, cfg.vocabSize);
    const grads = new Float32Array(total);
    const tok = o.microBatch * o.seq;
    t0 = performance.now();
    const loss0 = await pass(ids, grads);
    const firstMs = performance.now() - t0;
    log(`first call: ${firstMs.toFixed(0)} ms, loss ${loss0.toFixed(4)}`);
    const shapes = rateShapes(tok, cfg.hiddenSize, cfg.intermediateSize, cfg.vocabSize);
    const mmBefore: number[][] = [];
    for (const sh of shapes) mmBefore.push(await matmulRates(be.kernels, sh));
    const stepMs: number[] = [],
      cpuMs: number[] = [];
    const tfjs = be.engine !== "native" && be.engine !== "webgpu"; // no tfjs backend is initialised under these
    const tensorsBefore = tfjs ? tf.memory().numTensors : 0;
    for (let i = 0; i < o.calls; i++) {
      const c0 = process.cpuUsage();
      t0 = performance.now();
      await pass(ids, grads);
      const dt = performance.now() - t0;
      const cu = process.cpuUsage(c0);
      stepMs.push(dt);
      cpuMs.push((cu.user + cu.system) / 1000);
      log(
        `call ${i + 1}: ${dt.toFixed(0)} ms wall (${((tok / dt) * 1000).toFixed(1)} tok/s), ${cpuMs[i].toFixed(0)} ms CPU`,
      );
    }
    const mmAfter: number[][] = [];
    for (const sh of shapes) mmAfter.push(await matmulRates(be.kernels, sh));
    // one more call through the timing proxy: each kernel's share of the step
    const prof = profiledKernels(be.kernels, be.engine === "native" ? profiledAttention(native) : null);
    Object.assign(k, prof.kernels);
    // the proxy's clock: CPU time; a deferred engine's rows are the time to record each kernel, its total the whole
    // pass on the wall clock (the device's time is not this thread's)
    const clock = be.engine === "webgpu" ? () => performance.now() : cpuNowMs;
    t0 = clock();
    await pass(ids, grads);
    const profMs = clock() - t0;
    Object.assign(k, be.kernels);
    const kernelRows = prof.rows(profMs);
    const perShape = shapes.map((sh, i) => ({
      shape: sh.name,
      gflops: +median([...mmBefore[i], ...mmAfter[i]]).toFixed(2),
      before: +median(mmBefore[i]).toFixed(2),
      after: +median(mmAfter[i]).toFixed(2),
    }));
    const stepMedian = median(stepMs);
    const tokPerS = tok / (stepMedian / 1000);
    const gflops = Math.max(...perShape.map((x) => x.gflops));
    const flopsPerTok = 6 * params + 12 * cfg.numLayers * o.seq * cfg.hiddenSize;
    const mfu = (flopsPerTok * tokPerS) / (gflops * 1e9);
    const heap = wasmHeapBytes();
    return {
      case: "frozen-step",
      backend: be.engine,
      detail: be.detail,
      kernels_name: be.kernels.name,
      world: 1,
      params,
      layers: cfg.numLayers,
      seq_len: o.seq,
      micro_batch: o.microBatch,
      precision,
      isa: native.isa,
      grad_ckpt: o.gradCkpt,
      recompute: plan.attnKept ? plan.recompute : "whole+attention",
      activation_bytes: plan.bytes,
      calls: o.calls,
      step_ms_median: +stepMedian.toFixed(1),
      step_ms: stepMs.map((x) => +x.toFixed(1)),
      step_cpu_ms: cpuMs.map((x) => +x.toFixed(1)),
      tok_per_s: +tokPerS.toFixed(2),
      tok_per_cpu_s: +(tok / (median(cpuMs) / 1000)).toFixed(2),
      matmul_gflops: +gflops.toFixed(2),
      matmul_rates: perShape,
      sgemm_2048_gflops: perShape[perShape.length - 1].gflops,
      matmul_rate_what:
        be.engine === "webgpu"
          ? "the webgpu engine's kernels.matmul on its device, each call to its settle (read back included), best of the shapes (median per shape)"
          : `the ${be.engine} engine's kernels.matmul, one thread, best of the shapes (median per shape)`,
      model_flops_per_token: flopsPerTok,
      model_flops_formula: "6*params + 12*layers*seq*hidden",
      mfu: +mfu.toFixed(3),
      first_call_ms: +firstMs.toFixed(1),
      set_weights_ms: +setMs.toFixed(1),
      loss: +loss0.toFixed(5),
      tensor_leak: tfjs ? tf.memory().numTensors - tensorsBefore : null,
      wasm_heap_bytes: heap,
      wasm_heap_limit_bytes: heap === null ? null : 4 * 1024 ** 3,
      rss_bytes: process.memoryUsage().rss,
      profile_step_ms: +profMs.toFixed(1),
      kernel_profile: kernelRows,
      profile_summary: profileSummary(kernelRows, profMs),
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
  const precision = arg("--precision", "fp32");
  if (precision !== "fp32" && precision !== "bf16")
    throw new Error(`--precision ${JSON.stringify(precision)}: use fp32 or bf16`);
  const isa = arg("--isa", "auto");
  const isas = ["auto", "amx", "avx512bf16", "avx512", "avx2", "portable"];
  if (!isas.includes(isa)) throw new Error(`--isa ${JSON.stringify(isa)}: use one of ${isas.join(", ")}`);
  const res = await frozenStepBench({
    seq,
    microBatch,
    gradCkpt,
    activationBudgetBytes: activationBudget({
      activationBudgetGb: Number(arg("--activation-budget-gb", "0")),
      world: Number(arg("--world", "1")),
    }).bytes,
    calls,
    layers: layersArg ? Number(layersArg) : undefined,
    backend: arg("--backend", "auto") as BackendName,
    precision,
    isa: isa as IsaChoice,
    log: (s) => console.log(s),
  });
  console.log(`BENCH_JSON ${JSON.stringify(res)}`);
}

if (require.main === module)
  main().catch((e) => {
    console.error(e);
    process.exitCode = 1;
  });
