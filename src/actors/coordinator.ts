/**
 * Coordinator actor (A2): owns the step. It spawns the rank workers and the uploader, and is the
 * only one that decides: the loss scale, skip or apply, the clip coefficient and the LR (decideStep,
 * optim.ts, from the ranks' figures). When to checkpoint and when to stop is the session loop's
 * (src/session/loop.ts, on this same thread). The arithmetic runs in the ranks, each on its slice of the shared
 * buffers; the coordinator moves scalars, and when the machine has a core the ranks leave idle
 * (world < available cores) it takes one slice of the update (AdamW) itself, so at world 1 the update runs on
 * two threads instead of one. The reduce is the ranks' alone, split by chunks (with --dist mpi the coordinator
 * also unscales its process's block between the reduce-scatter and the allgather).
 *
 * One step, as messages (every phase is a barrier: all ranks answer before the next phase):
 *   compute(step, scale) -> each rank adds its accum micro-batch gradients into its float64 slot (A10)
 *   reduce(1/(world*accum*scale)) -> grad = averaged, unscaled gradient; its squares per fixed chunk (A10)
 *   (--dist mpi, A9: reduce(sum) -> slot 0 = the process's sum; across processes MPI_Reduce_scatter_block of
 *    slot 0 (float64), each process unscales its block, MPI_Allgather of the float32 blocks -> grad, the
 *    same bits on every process; then squares -> grad's squares per chunk)
 *   skip (non-finite) | update(lr, clip coef, t) -> AdamW on each rank's slice of the master weights, which the
 *                                                 ranks' models read directly in the next compute (shm.ts)
 */
import { Worker } from "node:worker_threads";
import * as path from "node:path";
import * as Comlink from "comlink";
import nodeEndpoint from "comlink/dist/umd/node-adapter";
import * as os from "node:os";
import { paramLayout } from "../model/layout";
import { type GpuSelect, withDeviceEnv } from "../model/engine/webgpu/gpus";
import {
  CTL_ABORT,
  allocShared,
  viewShared,
  stagingView,
  STAGE_M,
  STAGE_PARAMS,
  STAGE_PARTS,
  STAGE_V,
  type SharedBuffers,
  type SharedViews,
} from "./shm";
import {
  chunkSlices,
  decideStep,
  meanLossInOrder,
  slices,
  totalSquares,
  unscaleFactor,
  unscaleInto,
  type DecayRange,
  type OptimizerPosition,
} from "../optim/optim";
import type { MpiWorld } from "../mpi/world";
import { scalerModeOf, type LrShape } from "../optim/optim";
import { updateSlice } from "../optim/optim-simd";
import type {
  CheckpointJob,
  FromRank,
  RankInit,
  RankMemory,
  ToRank,
  UploaderApi,
  UploaderEvent,
  CheckpointOutcome,
  DrainResult,
  UploaderInit,
  WireError,
  WriteOutcome,
} from "./protocol";

/**
 * What the coordinator is given to start its ranks: each rank's RankInit less what the coordinator works out
 * itself (the rank number, the shared buffers, the decay ranges, the rank's slice and chunks, its global rank and
 * the job's rank count).
 */
export type RankSetup = Omit<
  RankInit,
  "rank" | "shared" | "decayRanges" | "slice" | "chunks" | "dataRank" | "dataWorld" | "gpu"
> & {
  /** --backend webgpu (A13): rank r's GPU (backend.ts webgpuPlan); absent: Dawn's first adapter for every rank. */
  gpus?: GpuSelect[] | null;
  /**
   * Whether the coordinator thread takes a slice of the update (see the header). Default: when world <
   * os.availableParallelism(). The results do not depend on it (A10).
   */
  coordinatorShare?: boolean;
  /** --dist mpi (A9): this process's MPI world; its ranks are global ranks mpi.rank x world + r of mpi.size x world. */
  mpi?: MpiWorld | null;
  /** --dist mpi (O3): whether this process has been asked to stop (a signal); every process learns it with the step. */
  stopAsked?: () => boolean;
};

/** A rank that threw, exited or reported a failure; the message names the rank and the error. */
export class RankFailure extends Error {
  constructor(
    readonly rank: number,
    readonly phase: string,
    detail: string,
  ) {
    super(`rank ${rank} failed during ${phase}: ${detail}`);
    this.name = "RankFailure";
  }
}

/**
 * A refusal (UserError) raised inside a rank: it keeps its own message and rule (name "UserError"), so
 * main prints it as any refusal and exits 2, not as a rank's failure (A1).
 */
export class RankRefusal extends Error {
  readonly rule: string | undefined;
  constructor(
    readonly rank: number,
    readonly phase: string,
    message: string,
    rule?: string,
  ) {
    super(message);
    this.name = "UserError";
    this.rule = rule;
  }
}

type Reply<T extends FromRank["type"]> = Extract<FromRank, { type: T }>;

/**
 * What a RankHandle uses of its rank's thread: a Worker's message, error and exit events, postMessage and terminate.
 * The coordinator always gives it a Worker running rank.js; the tests also give it scripted Workers (a rank that
 * misbehaves on purpose).
 */
export interface RankThread {
  on(event: "message", listener: (m: FromRank) => void): unknown;
  on(event: "error", listener: (e: Error) => void): unknown;
  on(event: "exit", listener: (code: number) => void): unknown;
  postMessage(msg: ToRank): void;
  terminate(): Promise<number>;
}

/** The coordinator's end of one rank: one request at a time, answered by the reply it expects or a RankFailure. */
export class RankHandle {
  private pending: {
    expect: string;
    phase: string;
    resolve: (m: FromRank) => void;
    reject: (e: Error) => void;
  } | null = null;
  private dead: Error | null = null;

  constructor(
    readonly rank: number,
    readonly worker: RankThread = new Worker(path.join(__dirname, "rank.js")),
  ) {
    this.worker.on("message", (m: FromRank) => this.onMessage(m));
    this.worker.on("error", (e: Error) =>
      this.fail(new RankFailure(rank, this.pending?.phase ?? "idle", `${e.name}: ${e.message}`)),
    );
    this.worker.on("exit", (code: number) => {
      if (code !== 0 || this.pending)
        this.fail(new RankFailure(rank, this.pending?.phase ?? "idle", `worker thread exited with code ${code}`));
      else this.dead = this.dead ?? new Error(`rank ${rank} has exited`);
    });
  }

  private onMessage(m: FromRank): void {
    const p = this.pending;
    if (!p) return;
    this.pending = null;
    if (m.type === "failed") {
      const e: WireError = m.error;
      if (e.name === "UserError") {
        p.reject(new RankRefusal(this.rank, p.phase, e.message, e.rule));
        return;
      }
      p.reject(new RankFailure(this.rank, p.phase, e.name === "Error" ? e.message : `${e.name}: ${e.message}`));
      return;
    }
    if (m.type !== p.expect) {
      p.reject(new RankFailure(this.rank, p.phase, `protocol error: expected ${p.expect}, got ${m.type}`));
      return;
    }
    p.resolve(m);
  }

  private fail(e: Error): void {
    if (!this.dead) this.dead = e;
    const p = this.pending;
    this.pending = null;
    p?.reject(e);
  }

  request<T extends FromRank["type"]>(msg: ToRank, expect: T, phase: string): Promise<Reply<T>> {
    if (this.dead) return Promise.reject(this.dead);
    if (this.pending)
      return Promise.reject(
        new Error(`rank ${this.rank}: request ${msg.type} while ${this.pending.expect} is pending`),
      );
    return new Promise<Reply<T>>((resolve, reject) => {
      this.pending = { expect, phase, resolve: resolve as (m: FromRank) => void, reject };
      this.worker.postMessage(msg);
    });
  }

  /**
   * Asks the rank to let its engine go and waits for its `closed` (at most `graceMs`), then ends the thread. Ending
   * it first could cut a native call short (a device engine's device.destroy()), which aborts the whole process.
   * A rank that is dead, busy with another request or silent past the grace is ended as it is.
   */
  async close(graceMs = RANK_CLOSE_GRACE_MS): Promise<void> {
    if (!this.dead && !this.pending) {
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, graceMs);
      });
      await Promise.race([this.request({ type: "close" }, "closed", "close").catch(() => {}), grace]);
      clearTimeout(timer);
    }
    await this.worker.terminate();
  }
}

/** How long RankHandle.close waits for a rank's `closed` before it ends the thread anyway. */
export const RANK_CLOSE_GRACE_MS = 10_000;

export interface StepResult {
  step: number;
  loss: number;
  applied: boolean;
  gradNorm: number | null;
  lr: number;
  scaleUsed: number;
  computeMs: number;
  reduceMs: number;
  /** --dist mpi: the time of the combine across processes (reduce-scatter + allgather); 0 in one process. */
  allreduceMs: number;
  /** --dist mpi (O3): some process of the job has been asked to stop (mpirun signals one process at a time). */
  stopAsked: boolean;
  updateMs: number;
  /**
   * A device engine (webgpu): this process's ranks' bytes up and down in the step, dispatches per micro-batch, and
   * a rank thread's milliseconds on the host per micro-batch (the mean over the ranks' micro-batches).
   */
  device?: { up: number; down: number; gradientUp: number; dispatchesPerMicro: number; hostMsPerMicro: number };
}

/** The actor runtime: ranks + shared memory + uploader. */
export class Coordinator {
  readonly shared: SharedBuffers;
  readonly views: SharedViews;
  readonly P: number;
  readonly decayRanges: DecayRange[];
  /** The coordinator's own [lo, hi) of the update, or null (see RankSetup.coordinatorShare). */
  readonly ownSlice: [number, number] | null;
  private readonly rankSlices: Array<[number, number]>;
  private readonly rankChunks: Array<[number, number]>;
  /** Ranks in the whole job (processes x world) and this process's first global rank (A9). */
  readonly dataWorld: number;
  private readonly dataRank0: number;
  private readonly mpi: MpiWorld | null;
  private ranks: RankHandle[] = [];
  private uploaderWorker: Worker | null = null;
  private uploader: Comlink.Remote<UploaderApi> | null = null;
  private staging: SharedArrayBuffer | null = null;
  backendInfo = { backend: "?", detail: "" };

  private constructor(readonly setup: RankSetup) {
    const layout = paramLayout(setup.model);
    this.P = layout.total;
    this.decayRanges = layout.entries.map((e) => ({ lo: e.offset, hi: e.offset + e.size, decay: e.decay }));
    const share = setup.coordinatorShare ?? setup.world < os.availableParallelism();
    const parts = slices(this.P, setup.world + (share ? 1 : 0));
    this.rankSlices = parts.slice(0, setup.world);
    this.ownSlice = share ? parts[setup.world] : null;
    this.rankChunks = chunkSlices(this.P, setup.world);
    this.mpi = setup.mpi ?? null;
    const hosts = this.mpi?.size ?? 1;
    this.dataWorld = setup.world * hosts;
    this.dataRank0 = (this.mpi?.rank ?? 0) * setup.world;
    this.shared = allocShared(this.P, setup.world, hosts);
    this.views = viewShared(this.shared);
  }

  /** Allocate the shared buffers; the caller fills params/m/v before `spawn`. */
  static create(setup: RankSetup): Coordinator {
    return new Coordinator(setup);
  }

  /**
   * Start every rank and wait until each has built its backend, model and data stream. On --backend webgpu with
   * GPUs chosen (A13), the ranks of one GPU choice start together with its device-select variables in this
   * process's environment (a rank's Dawn instance reads them when it enumerates), one choice after the other.
   */
  async spawn(): Promise<void> {
    const parts = this.rankSlices;
    for (let r = 0; r < this.setup.world; r++) this.ranks.push(new RankHandle(r));
    const gpus = this.setup.gpus ?? null;
    const groups = new Map<string, RankHandle[]>();
    for (const h of this.ranks) {
      const key = JSON.stringify(gpus?.[h.rank]?.env ?? {});
      groups.set(key, [...(groups.get(key) ?? []), h]);
    }
    const ready: Reply<"ready">[] = [];
    for (const [key, group] of groups) {
      const restore = gpus ? withDeviceEnv(JSON.parse(key) as Record<string, string | null>) : () => {};
      try {
        ready.push(...(await this.startRanks(group, parts, gpus)));
      } finally {
        restore();
      }
    }
    ready.sort((a, b) => a.rank - b.rank);
    const names = new Set(ready.map((m) => m.backend));
    if (names.size !== 1) throw new Error(`ranks built different backends: ${[...names].join(", ")}`);
    const devices = ready.some((m) => m.device)
      ? `; GPUs: ${ready.map((m) => `rank ${m.rank} on ${m.device ?? "?"}`).join(", ")}`
      : "";
    this.backendInfo = { backend: ready[0].backend, detail: `${ready[0].detail}${devices}` };
  }

  /** Starts `group`'s ranks (init) and waits for each to be ready. */
  private startRanks(
    group: RankHandle[],
    parts: Array<[number, number]>,
    gpus: GpuSelect[] | null,
  ): Promise<Reply<"ready">[]> {
    return this.all(
      (h) => ({
        type: "init",
        init: {
          rank: h.rank,
          world: this.setup.world,
          dataRank: this.dataRank0 + h.rank,
          dataWorld: this.dataWorld,
          model: this.setup.model,
          gradCkpt: this.setup.gradCkpt,
          activationBudgetBytes: this.setup.activationBudgetBytes,
          backend: this.setup.backend,
          native: this.setup.native,
          gpu: gpus?.[h.rank] ?? null,
          fold: this.setup.fold,
          data: this.setup.data,
          shared: this.shared,
          decayRanges: this.decayRanges,
          slice: parts[h.rank],
          chunks: this.rankChunks[h.rank],
          fault: this.setup.fault,
        },
      }),
      "ready",
      "init",
      group,
    );
  }

  private async all<T extends FromRank["type"]>(
    make: (h: RankHandle) => ToRank,
    expect: T,
    phase: string,
    ranks: RankHandle[] = this.ranks,
  ): Promise<Reply<T>[]> {
    const pending = ranks.map((h) => h.request(make(h), expect, phase));
    try {
      return await Promise.all(pending);
    } catch (e) {
      // One rank failed: tell the others to stop at their next micro-batch, let their replies arrive
      // (so no request is left pending on any rank), and surface the first error.
      Atomics.store(this.views.ctl, CTL_ABORT, 1);
      await Promise.allSettled(pending);
      throw e;
    }
  }

  /**
   * One optimizer step (A2): the ranks' phases (compute, the reduce, then the update, with the coordinator's own
   * slice of it when it has one), the decision (decideStep, optim.ts) from their figures, and `pos` moved to where
   * the decision leaves it. Does not touch the data position: the step number is the position.
   */
  async step(step: number, pos: OptimizerPosition, baseLr: number, shape: LrShape): Promise<StepResult> {
    const accum = this.setup.data.accum;
    const scale = pos.scaler.scale;
    const computed = await this.all(
      () => ({ type: "compute", step, gradScale: scale }),
      "computed",
      `step ${step} compute`,
    );
    const { losses, stopAsked } = await this.jobLosses(computed);
    const loss = meanLossInOrder(losses, this.dataWorld, accum);
    const invScale = unscaleFactor(this.dataWorld, accum, scale);
    const { reduceMs, allreduceMs } = await this.reduce(step, invScale);
    const mode = scalerModeOf(this.setup.native?.precision);
    const d = decideStep(pos, totalSquares(this.views.sq), baseLr, shape, mode); // A10: chunk sums added in chunk order
    const res: StepResult = {
      step,
      loss,
      applied: d.apply,
      gradNorm: d.gradNorm,
      lr: d.lr,
      scaleUsed: scale,
      computeMs: Math.max(...computed.map((m) => m.ms)),
      reduceMs,
      allreduceMs,
      updateMs: 0,
      stopAsked,
    };
    const dev = computed.map((m) => m.device).filter((x) => x !== undefined);
    if (dev.length > 0) {
      const sum = (f: (t: (typeof dev)[number]) => number) => dev.reduce((a, t) => a + f(t), 0);
      const micros = computed.reduce((a, m) => a + m.micro, 0);
      res.device = {
        up: sum((t) => t.up),
        down: sum((t) => t.down),
        gradientUp: sum((t) => t.gradientUp),
        dispatchesPerMicro: Math.round(sum((t) => t.dispatches) / Math.max(1, micros)),
        hostMsPerMicro: sum((t) => t.hostMs) / Math.max(1, micros),
      };
    }
    if (d.apply) {
      const { lr, coef, t } = d;
      const { ranks: updated, ...mine } = await this.withOwn(
        this.all(() => ({ type: "update", step, lr, coef, t }), "updated", `step ${step} update`),
        () => updateSlice(this.views, this.decayRanges, ...this.ownSlice!, lr, coef, t),
      );
      res.updateMs = Math.max(mine.ms, ...updated.map((m) => m.ms));
    }
    Object.assign(pos, d.next);
    return res;
  }

  /**
   * Every global rank's micro-batch losses, `losses[g * accum + m]` (A10): this process's, and with --dist mpi
   * every process's (MPI_Allgather), so every process reports the same loss; and whether any process has been
   * asked to stop (one more number per process in the same allgather).
   */
  private async jobLosses(computed: Reply<"computed">[]): Promise<{ losses: Float64Array; stopAsked: boolean }> {
    const A = this.setup.data.accum;
    const n = this.setup.world * A;
    const mine = new Float64Array(n + 1).fill(Number.NaN);
    computed.forEach((m, t) => {
      m.losses.forEach((l, i) => {
        mine[t * A + i] = l;
      });
    });
    mine[n] = this.setup.stopAsked?.() ? 1 : 0;
    if (!this.mpi) return { losses: mine.subarray(0, n), stopAsked: false };
    const all = new Float64Array(mine.length * this.mpi.size);
    await this.mpi.allgather(mine, all);
    const losses = new Float64Array(n * this.mpi.size);
    let stopAsked = false;
    for (let p = 0; p < this.mpi.size; p++) {
      losses.set(all.subarray(p * (n + 1), p * (n + 1) + n), p * n);
      stopAsked = stopAsked || all[p * (n + 1) + n] === 1;
    }
    return { losses, stopAsked };
  }

  /**
   * The averaged, unscaled gradient into `grad` and its squares per chunk into `sq` (A10). In one process the
   * ranks do it in one phase; with --dist mpi (A9) the processes combine their slot sums in float64 with a
   * reduce-scatter (each element summed once, by its block's owner) and an allgather of the float32 blocks, so
   * every process holds the same bits, and the ranks then take the squares.
   */
  private async reduce(step: number, invScale: number): Promise<{ reduceMs: number; allreduceMs: number }> {
    const mpi = this.mpi;
    if (!mpi) {
      const r = await this.all(
        () => ({ type: "reduce", step, invScale, mode: "final" }),
        "reduced",
        `step ${step} reduce`,
      );
      return { reduceMs: Math.max(...r.map((m) => m.ms)), allreduceMs: 0 };
    }
    const local =
      this.setup.world > 1
        ? await this.all(() => ({ type: "reduce", step, invScale, mode: "sum" }), "reduced", `step ${step} reduce`)
        : [];
    const t0 = performance.now();
    const blk = this.shared.Pp / mpi.size;
    this.recv ??= { sum: new Float64Array(blk), mine: new Float32Array(blk), grad: new Float32Array(this.shared.grad) };
    await mpi.reduceScatterSum(this.views.slots[0], this.recv.sum);
    unscaleInto(this.recv.sum, this.recv.mine, 0, blk, invScale);
    await mpi.allgather(this.recv.mine, this.recv.grad);
    const allreduceMs = performance.now() - t0;
    const sq = await this.all(() => ({ type: "squares", step }), "squared", `step ${step} squares`);
    return { reduceMs: Math.max(0, ...local.map((m) => m.ms)) + Math.max(...sq.map((m) => m.ms)), allreduceMs };
  }

  /** The combine's buffers (--dist mpi): this process's block of the sum, its float32 block, the whole padded grad. */
  private recv: { sum: Float64Array; mine: Float32Array; grad: Float32Array } | null = null;

  /**
   * The coordinator's own slice of a phase, run on this thread while the ranks run theirs (`pending`: their
   * requests, already posted), then the ranks' replies. Nothing of its own when it has no slice. If its own
   * part throws, the ranks are told to stop and their replies drained before the error surfaces.
   */
  private async withOwn<T, R>(pending: Promise<T>, fn: () => R): Promise<{ ranks: T; r: R | null; ms: number }> {
    let r: R | null = null;
    let ms = 0;
    if (this.ownSlice) {
      const t0 = performance.now();
      try {
        r = fn();
      } catch (e) {
        Atomics.store(this.views.ctl, CTL_ABORT, 1);
        await Promise.allSettled([pending]);
        throw e;
      }
      ms = performance.now() - t0;
    }
    return { ranks: await pending, r, ms };
  }

  /** Mean validation loss over windows [0, nVal), split across ranks by contiguous ranges (D7). */
  async evaluate(nVal: number): Promise<number> {
    const parts = slices(nVal, this.setup.world);
    const got = await this.all(
      (h) => ({ type: "eval", from: parts[h.rank][0], to: parts[h.rank][1] }),
      "evaluated",
      "validation",
    );
    const count = got.reduce((a, m) => a + m.count, 0);
    if (count !== nVal) throw new Error(`validation covered ${count} of ${nVal} windows`);
    return got.reduce((a, m) => a + m.lossSum, 0) / count;
  }

  async memory(): Promise<RankMemory[]> {
    const got = await this.all(() => ({ type: "memory" }), "memory", "memory report");
    return got.map((m) => m.memory);
  }

  // ------------------------------------------------------------ uploader (A3)

  private readonly waiting = new Map<
    number,
    { resolve: (o: CheckpointOutcome) => void; reject: (e: unknown) => void }
  >();

  /** Start the uploader; `onEvent` hears every publication and the failure that stops publishing. */
  async startUploader(o: UploaderInit, onEvent?: (e: UploaderEvent) => void): Promise<void> {
    this.uploaderWorker = new Worker(path.join(__dirname, "uploader.js"));
    this.uploader = Comlink.wrap<UploaderApi>(nodeEndpoint(this.uploaderWorker));
    const dispatch = (e: UploaderEvent): void => {
      if (e.type === "published") {
        this.waiting.get(e.outcome.step)?.resolve(e.outcome);
        this.waiting.delete(e.outcome.step);
      } else {
        const err = Object.assign(new Error(e.error.message), e.error);
        for (const w of this.waiting.values()) w.reject(err);
        this.waiting.clear();
      }
      onEvent?.(e);
    };
    await this.uploader.init(o, Comlink.proxy(dispatch));
  }

  /** Wait until the uploader has published every checkpoint handed to it (K6); returns the repo head it left. */
  async drainUploads(): Promise<DrainResult> {
    if (!this.uploader) return { head: null, outcomes: [], failure: null };
    return this.uploader.drain();
  }

  /**
   * Snapshot params|m|v into the staging buffer and hand the checkpoint to the uploader. Returns at
   * once with the write's promise: the ranks train on while the uploader writes, and publishing runs
   * behind the write (B3, K6). The caller must not stage again before that promise settles (the
   * staging copy is single).
   */
  stageWrite(job: Omit<CheckpointJob, "staging" | "P" | "model">): Promise<WriteOutcome> {
    if (!this.uploader) throw new Error("uploader not started");
    if (!this.staging) this.staging = new SharedArrayBuffer(STAGE_PARTS * this.P * 4);
    stagingView(this.staging, this.P, STAGE_PARAMS).set(this.views.params);
    stagingView(this.staging, this.P, STAGE_M).set(this.views.m);
    stagingView(this.staging, this.P, STAGE_V).set(this.views.v);
    return this.uploader.write({ ...job, staging: this.staging, P: this.P, model: this.setup.model });
  }

  /** stageWrite, then the publication of that very checkpoint (bench and tests: one checkpoint at a time). */
  stageCheckpoint(job: Omit<CheckpointJob, "staging" | "P" | "model">): Promise<CheckpointOutcome> {
    const published = new Promise<CheckpointOutcome>((resolve, reject) =>
      this.waiting.set(job.step, { resolve, reject }),
    );
    return this.stageWrite(job).then(
      (w) => published.then((o) => ({ ...o, writeSeconds: w.writeSeconds })),
      (e) => {
        this.waiting.delete(job.step);
        throw e;
      },
    );
  }

  async close(): Promise<void> {
    Atomics.store(this.views.ctl, CTL_ABORT, 1);
    await Promise.all(this.ranks.map((h) => h.close()));
    if (this.uploader) this.uploader[Comlink.releaseProxy]();
    if (this.uploaderWorker) await this.uploaderWorker.terminate();
  }
}
