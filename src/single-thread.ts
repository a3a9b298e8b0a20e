/**
 * The single-thread loop, framework-free (G8, A5): the whole step in the calling thread, with no workers, no
 * shared memory and no messages: the same model, data path, micro-batch loop, optimizer, precision and step
 * decision (decideStep) as the actor runtime. It runs every rank's micro-batches one after another through the one
 * micro-batch loop the ranks run (actors/micro-batches.ts runMicroBatches: a deferred engine folds on the device,
 * or on the host once each gradient is read back), so one step does exactly the work of one step of the actor run (same windows, same
 * update), on every engine, and the bench can compare the two. It uses nothing else from the actors but that loop
 * (gradientArrays, runMicroBatches) and the StepResult type, so it sits beside run.ts, not in src/actors.
 *
 * The training step, module by module. SingleThreadTrainer.step below is the whole step on one screen; the actor
 * runtime (`node dist/main.js --world N`) splits the same work across threads, in this order (paths under src/):
 *
 * PLAN (once, before step 1)
 *   1. main.ts parses the flags (config.ts: the one validated config) → run.ts runSession: the run folder
 *      (outdir.ts), the embedded Hub, the plan and every refusal (session/setup.ts), then the actors:
 *      actors/coordinator.ts spawn starts one actors/rank.ts thread per rank over the shared memory of
 *      actors/shm.ts (weights, moments, one float64 gradient slot per rank).
 *
 * STEP (session/loop.ts trainLoop calls actors/coordinator.ts step once per optimizer step; every message is a
 *       ToRank or FromRank of actors/protocol.ts)
 *   2. compute: each actors/rank.ts runs its micro-batches (actors/micro-batches.ts runMicroBatches): reads their
 *      windows (data/sampler.ts TrainStream, over data/permutation.ts and data/token-store.ts), runs
 *      model/llama.ts lossAndGrads (forward + backward on the kernels of model/kernels.ts: model/engine/native.ts
 *      over native/tstrain.c and the built-in GEMM in native/, model/engine/tfjs.ts with model/engine/js.ts, or
 *      model/engine/webgpu/engine.ts, a deferred engine whose results come back at settle) and adds each
 *      micro-batch's gradient into its float64 slot (optim/optim.ts foldMicro; on webgpu its fold shader, the same
 *      bits).
 *   3. reduce: each rank sums the slots over its chunks of the parameters, averages and unscales them into
 *      the float32 gradient and takes each chunk's sum of squares (optim/optim.ts reduceChunks64).
 *   4. decide: actors/coordinator.ts step calls optim/optim.ts decideStep (finite? the clip coefficient, the
 *      LR of this optimizer step, the loss scaler), the one step decision of both loops.
 *   5. update: each rank, and the coordinator's own slice when a core is free, applies AdamW to its slice of
 *      the weights and moments (optim/optim-simd.ts updateSlice: the addon's C kernel, native/ops/optim.c, where
 *      it loads, else a WebAssembly SIMD kernel with the same bits).
 *
 * BETWEEN STEPS (session/loop.ts)
 *   6. session/metrics.ts (log line, metrics.jsonl, progress, the sample), session/in-flight.ts (a checkpoint
 *      handed to actors/uploader.ts; its own map is in checkpoint/index.ts), session/stop.ts (a signal),
 *      session/finish.ts (the segment's end: validation, export, RUN_JSON).
 */
import { Llama } from "./model/llama";
import { initEngine, type BackendName, webgpuRanks } from "./model/backend";
import type { GpuSelect } from "./model/engine/webgpu/gpus";
import type { NativeOptions } from "./model/engine/native";
import type { Kernels } from "./model/kernels";
import { initWeights } from "./model/init";
import { paramLayout } from "./model/layout";
import type { LlamaConfig } from "./model/llama-config";
import { readManifest } from "./data/manifest";
import { PackedTokenStore } from "./data/token-store";
import { WindowPermutation } from "./data/permutation";
import { TrainStream } from "./data/sampler";
import {
  chunkCount,
  decideStep,
  fixedScaler,
  foldMicro,
  meanLossInOrder,
  newScaler,
  scalerModeOf,
  reduceChunks64,
  totalSquares,
  unscaleFactor,
  ADAMW_DEFAULTS,
  type DecayRange,
  type LrShape,
  type OptimizerPosition,
} from "./optim/optim";
import { adamwSliceSimd } from "./optim/optim-simd";
import type { StepResult } from "./actors/coordinator";
import { gradientArrays, runMicroBatches } from "./actors/micro-batches";
import { activationBudget, type FoldPlace, nativeChoice, type RunConfig } from "./config";
import type { Reporter } from "./report";

export interface SingleThreadSetup {
  model: LlamaConfig;
  gradCkpt: boolean;
  /** M6: the bytes the training arena may take (activationPlan). */
  activationBudgetBytes: number;
  backend: BackendName;
  native?: NativeOptions;
  /** --backend webgpu: the GPU it opens (rank 0's, A13); absent: Dawn's first adapter. */
  gpu?: GpuSelect | null;
  /** A deferred engine's fold place (--webgpu-fold, A10); absent = on the device. */
  fold?: FoldPlace;
  root: string;
  seqLen: number;
  dataSeed: number;
  world: number;
  accum: number;
  microBatch: number;
  seed: number;
}

export class SingleThreadTrainer {
  readonly params: Float32Array;
  readonly m: Float32Array;
  readonly v: Float32Array;
  /** The averaged, unscaled gradient (after the reduce). */
  readonly grad: Float32Array;
  /** One micro-batch's gradient (two on a deferred engine folding on the host: gradientArrays), and their sum in float64 (A10, as the ranks do). */
  private readonly grads: Float32Array[];
  private readonly sum: Float64Array;
  private readonly sq: Float64Array;
  private readonly ranges: DecayRange[];
  private readonly stream: TrainStream;
  private readonly ids: Int32Array;
  backend = "?";

  private constructor(
    readonly setup: SingleThreadSetup,
    readonly llama: Llama,
    private readonly kernels: Kernels,
  ) {
    const layout = paramLayout(setup.model);
    this.params = new Float32Array(layout.total);
    this.m = new Float32Array(layout.total);
    this.v = new Float32Array(layout.total);
    this.grad = new Float32Array(layout.total);
    this.grads = gradientArrays(kernels, layout.total, setup.fold);
    this.sum = new Float64Array(layout.total);
    this.sq = new Float64Array(chunkCount(layout.total));
    this.ranges = layout.entries.map((e) => ({ lo: e.offset, hi: e.offset + e.size, decay: e.decay }));
    const manifest = readManifest(setup.root);
    const store = PackedTokenStore.open(setup.root, manifest, "train");
    const perm = new WindowPermutation(store.numWindows(setup.seqLen), setup.dataSeed);
    this.stream = new TrainStream(store, perm, {
      world: setup.world,
      accum: setup.accum,
      microBatch: setup.microBatch,
      seqLen: setup.seqLen,
    });
    this.ids = new Int32Array(setup.microBatch * setup.seqLen);
    initWeights(setup.model, setup.seed, this.params);
    llama.bindParams(this.params); // AdamW updates them in place; the next pass reads them as they are
    kernels.weightsAre?.(this.params); // P8: as a rank does (the bf16 engine keeps them packed between updates)
  }

  static async create(setup: SingleThreadSetup): Promise<SingleThreadTrainer> {
    const be = await initEngine(setup.backend, setup.native, setup.gpu);
    const t = new SingleThreadTrainer(
      setup,
      new Llama(setup.model, be.kernels, {
        gradCkpt: setup.gradCkpt,
        activationBudgetBytes: setup.activationBudgetBytes,
      }),
      be.kernels,
    );
    t.backend = be.engine;
    return t;
  }

  /**
   * One optimizer step, as Coordinator.step: every micro-batch, the reduce, decideStep, AdamW; `pos` moves on. The
   * micro-batches run through the ranks' loop (runMicroBatches), micro-batch m being rank m % world's micro-batch
   * floor(m / world), each folded into one float64 sum.
   */
  async step(step: number, pos: OptimizerPosition, baseLr: number, shape: LrShape): Promise<StepResult> {
    const { world, accum, microBatch, seqLen } = this.setup;
    const t0 = performance.now();
    const scale = pos.scaler.scale;
    const run = await runMicroBatches({
      kernels: this.kernels,
      accum: world * accum,
      ids: this.ids,
      grads: this.grads,
      slot: this.sum,
      foldPlace: this.setup.fold,
      stop: () => false,
      read: (m, ids) => this.stream.readMicroBatch(step, m % world, Math.floor(m / world), ids),
      lossAndGrads: (ids, g) => this.llama.lossAndGrads(ids, microBatch, seqLen, scale, g),
      fold: (g, first) => foldMicro(this.sum, g, first),
    });
    const losses = new Float64Array(world * accum);
    run.losses.forEach((loss, m) => {
      losses[(m % world) * accum + Math.floor(m / world)] = loss;
    });
    const t1 = performance.now();
    const P = this.grad.length;
    reduceChunks64([this.sum], this.grad, unscaleFactor(world, accum, scale), P, this.sq, 0, this.sq.length);
    const t2 = performance.now();
    const d = decideStep(pos, totalSquares(this.sq), baseLr, shape, scalerModeOf(this.setup.native?.precision));
    const res: StepResult = {
      step,
      loss: meanLossInOrder(losses, world, accum),
      applied: d.apply,
      gradNorm: d.gradNorm,
      lr: d.lr,
      scaleUsed: scale,
      computeMs: t1 - t0,
      reduceMs: t2 - t1,
      allreduceMs: 0,
      updateMs: 0,
      stopAsked: false,
    };
    if (d.apply) {
      adamwSliceSimd(
        this.params,
        this.m,
        this.v,
        this.grad,
        this.ranges,
        0,
        this.params.length,
        { lr: d.lr, ...ADAMW_DEFAULTS },
        d.coef,
        d.t,
      );
      this.kernels.weightsChanged?.(); // P8: copies made before this update are stale
      res.updateMs = performance.now() - t2;
    }
    Object.assign(pos, d.next);
    return res;
  }

  dispose(): void {
    this.kernels.weightsAre?.(new Float32Array(0)); // the engine lets its copies go
    this.llama.dispose();
    this.kernels.dispose();
  }
}

/** What the benchmark needs of the session's plan (session/setup.ts's Session has it all). */
export interface BenchmarkPlan {
  cfg: RunConfig;
  model: { config: LlamaConfig; params: { sum_numel: number } };
  data: { root: string };
  start: { startStep: number };
  plan: { tokensPerStep: number; lrShape: LrShape };
}

/** G8: N steps without the actor machinery; the first step is excluded from timing; no checkpoint. */
export async function runBenchmark(s: BenchmarkPlan, n: number, rep: Reporter): Promise<Record<string, unknown>> {
  const { cfg } = s;
  const t = await SingleThreadTrainer.create({
    model: s.model.config,
    gradCkpt: cfg.gradCkpt,
    activationBudgetBytes: activationBudget(cfg).bytes,
    backend: cfg.backend,
    native: nativeChoice(cfg),
    gpu: webgpuRanks(cfg.backend, cfg.world, cfg.gpus)?.[0],
    fold: cfg.webgpuFold,
    root: s.data.root,
    seqLen: cfg.seqLen,
    dataSeed: cfg.dataSeed,
    world: cfg.world,
    accum: cfg.accum,
    microBatch: cfg.microBatch,
    seed: cfg.seed,
  });
  rep.say(
    `benchmark mode: ${n} steps in one thread, no actors, micro=${cfg.microBatch} accum=${cfg.accum} world-share=${cfg.world} seq=${cfg.seqLen} backend=${t.backend} precision=${cfg.precision}`,
  );
  const mode = scalerModeOf(cfg.precision);
  const pos: OptimizerPosition = { optSteps: 0, scaler: mode === "fixed" ? fixedScaler() : newScaler(), skipped: 0 };
  const times: number[] = [];
  let last: StepResult | null = null;
  for (let i = 0; i < n + 1; i++) {
    const a = performance.now();
    last = await t.step(s.start.startStep + i, pos, cfg.lr, s.plan.lrShape);
    if (i > 0) times.push(performance.now() - a);
  }
  t.dispose();
  const sorted = [...times].sort((a, b) => a - b);
  const med = sorted.length ? sorted[Math.floor(sorted.length / 2)] : Number.NaN;
  const tokensPerStep = s.plan.tokensPerStep;
  const j = {
    case: "framework-free",
    benchmark_steps: n,
    backend: t.backend,
    world: cfg.world,
    params: s.model.params.sum_numel,
    seq_len: cfg.seqLen,
    micro_batch: cfg.microBatch,
    accum: cfg.accum,
    step_ms_median: Math.round(med * 10) / 10,
    tok_per_s: Math.round((tokensPerStep / med) * 1000 * 10) / 10,
    loss: last?.loss ?? null,
    grad_ckpt: cfg.gradCkpt,
  };
  rep.say(`BENCH_JSON ${JSON.stringify(j)}`);
  return j;
}
