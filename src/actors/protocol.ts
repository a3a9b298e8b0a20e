/**
 * Every message between actors, as discriminated unions (comlink's protocol.ts style). Bulk data
 * never travels in messages: gradients, weights and moments live in the SharedArrayBuffers of
 * shm.ts; messages carry commands, scalars and errors. Errors cross threads as plain objects
 * (`WireError`), so callers branch on `name`, never on `instanceof`.
 */
import type { SharedBuffers } from "./shm";
import type { LlamaConfig } from "../model/llama-config";
import type { BackendName } from "../model/backend";
import type { FoldPlace } from "../config";
import type { NativeOptions } from "../model/engine/native";
import type { GpuSelect } from "../model/engine/webgpu/gpus";
import type { DecayRange } from "../optim/optim";
import type { CheckpointDocs, Pointer } from "../checkpoint";
import type { RankFault } from "./injected-faults";

export interface WireError {
  name: string;
  message: string;
  stack?: string;
  rule?: string;
}

export function toWireError(e: unknown): WireError {
  if (e instanceof Error) {
    const rule = (e as { rule?: unknown }).rule;
    return { name: e.name, message: e.message, stack: e.stack, ...(typeof rule === "string" ? { rule } : {}) };
  }
  return { name: "Error", message: String(e) };
}

/** Everything a rank needs to build its model (which reads the shared master weights in place) and its data stream. */
export interface RankInit {
  /** This rank's thread number in its process: its gradient slot. */
  rank: number;
  /** Rank threads in this process. */
  world: number;
  /** The global rank whose windows this rank reads: process rank x world + rank (A9); = rank in one process. */
  dataRank: number;
  /** Ranks in the whole job: processes x world; the sampler splits each step among them (D6). */
  dataWorld: number;
  model: LlamaConfig;
  gradCkpt: boolean;
  /** M6: the bytes the rank's training arena may take; the model runs the fastest policy that fits (activationPlan). */
  activationBudgetBytes: number;
  backend: BackendName;
  /** The native engine's GEMM and precision (`--gemm`, `--isa`, `--precision`); absent = the built-in GEMM on the
   *  widest kernel, fp32. */
  native?: NativeOptions;
  /**
   * --backend webgpu (A13): this rank's GPU (webgpuPlan); its device-select variables are in the process's
   * environment while the rank starts. Absent: Dawn's first adapter.
   */
  gpu?: GpuSelect | null;
  /** A deferred engine's fold place (`--webgpu-fold`, A10); absent = on the device. */
  fold?: FoldPlace;
  data: { root: string; seqLen: number; dataSeed: number; microBatch: number; accum: number; nVal: number };
  shared: SharedBuffers;
  decayRanges: DecayRange[];
  /** This rank's [lo, hi) share of the parameter vector for the update. */
  slice: [number, number];
  /** This rank's [c0, c1) share of the SQ_CHUNK chunks for the reduce and the sum of squares (A10). */
  chunks: [number, number];
  /** Test-only (TSTRAIN_FAULT, injected-faults.ts): null in a real run. */
  fault: RankFault | null;
}

// ---------------------------------------------------------------- coordinator -> rank

export type ToRank =
  | { type: "init"; init: RankInit }
  /** Forward+backward over this rank's `accum` micro-batches of `step`; add each one's grads into its float64 slot (A10). */
  | { type: "compute"; step: number; gradScale: number }
  /**
   * Over this rank's chunks: `final`: the averaged, unscaled gradient (grad) and its squares per chunk (sq);
   * `sum`: slot 0 = the sum of the process's slots, for the combine across processes (A9).
   */
  | { type: "reduce"; step: number; invScale: number; mode: "final" | "sum" }
  /** The squares per chunk of grad over this rank's chunks (after a combine across processes). */
  | { type: "squares"; step: number }
  /** AdamW over this rank's slice. `t` is the 1-based optimizer step. */
  | { type: "update"; step: number; lr: number; coef: number; t: number }
  /** Validation loss over val windows [from, to) (D7). */
  | { type: "eval"; from: number; to: number }
  | { type: "memory" }
  /** Let the engine go (a device engine destroys its device), answer `closed`, then close the port. */
  | { type: "close" };

// ---------------------------------------------------------------- rank -> coordinator

/**
 * heapPeakBytes: V8 heap; tfPeakBytes: tfjs tensors (0 when no tfjs backend runs, e.g. native); wasmHeapBytes: the
 * tfjs-wasm heap (0 elsewhere); arenaBytes: the model's activation arena (typed arrays outside the V8 heap).
 */
export interface RankMemory {
  rank: number;
  heapPeakBytes: number;
  tfPeakBytes: number;
  wasmHeapBytes: number;
  arenaBytes: number;
}

export type FromRank =
  /** device: a device engine's GPU, as the rank opened it (webgpu: the GPU in words and the adapter's name). */
  | { type: "ready"; rank: number; backend: string; detail: string; device?: string }
  /** losses[m]: the loss of micro-batch m (A10: the coordinator adds them in global micro-batch order). */
  | {
      type: "computed";
      rank: number;
      step: number;
      losses: number[];
      micro: number;
      ms: number;
      /** A device engine: what crossed during the step (bytes), the part that uploaded kernel-written state, and its dispatches. */
      device?: StepTraffic;
    }
  | { type: "reduced"; rank: number; step: number; ms: number }
  | { type: "squared"; rank: number; step: number; ms: number }
  | { type: "updated"; rank: number; step: number; ms: number }
  | { type: "evaluated"; rank: number; lossSum: number; count: number }
  | { type: "memory"; memory: RankMemory }
  /** The engine is let go: the coordinator may end the thread now without cutting a native call short. */
  | { type: "closed"; rank: number }
  | { type: "failed"; rank: number; error: WireError };

// ---------------------------------------------------------------- coordinator -> uploader

export interface CheckpointJob {
  step: number;
  /** Local folder to write (checkpointDir(runDir, step)); written via a temp folder and renamed. */
  dir: string;
  staging: SharedArrayBuffer;
  P: number;
  model: LlamaConfig;
  docs: CheckpointDocs;
  /** Hub publication (K3) when a repo is set; the pointer is written only after verification. */
  publish: null | { pathInRepo: string; pointer: Pointer; loss: number | null };
}

export interface UploaderInit {
  hub: null | { hubUrl: string; repo: string; repoType: "dataset" | "model"; timeoutMs?: number };
  prune: boolean;
  minFreeGb: number;
  /** Local checkpoint folders kept besides the one in flight (K1). */
  keepLocal: number;
  runDir: string;
  /** K6: stop only after a checkpoint has failed to publish for this long (default 30 min). */
  hubRetryMs?: number;
  /** K8: the repo head the run starts from (every commit names its parent); absent = read it at init. */
  head?: string | null;
  /** K6 backoff (base, cap) in ms; absent = 500 / 30 000. */
  backoff?: { baseMs: number; capMs: number };
  /** Steps whose local copy in runDir/ckpt is known to equal a verified Hub checkpoint (R6). */
  verifiedLocal?: number[];
  /** Bytes one checkpoint folder takes (estimate, for the disk budget); absent = no budget check. */
  checkpointBytes?: number;
}

/** The local write of a checkpoint is done: the staging copy may be reused. */
export interface WriteOutcome {
  step: number;
  dir: string;
  writeSeconds: number;
}

export interface DrainResult {
  head: string | null;
  outcomes: CheckpointOutcome[];
  failure: null | { step: number; error: WireError & { rule?: string } };
}

/** What the uploader reports while it publishes in the background. */
export type UploaderEvent =
  | { type: "published"; outcome: CheckpointOutcome }
  | { type: "failed"; step: number; error: WireError & { rule?: string } };

export interface CheckpointOutcome {
  step: number;
  dir: string;
  writeSeconds: number;
  published: null | import("../hub/cycle").PublishResult;
}

/** The uploader's comlink surface (see uploader.ts). */
export interface UploaderApi {
  init(o: UploaderInit, onEvent: (e: UploaderEvent) => void): Promise<void>;
  /** Write the folder (staging -> disk), queue its publication, return once written (B3, K6). */
  write(job: CheckpointJob): Promise<WriteOutcome>;
  /** Wait until every queued checkpoint is published, or publishing stopped for good; the full account
   *  (every publication, the failure if any, the repo head this uploader left: K8). */
  drain(): Promise<DrainResult>;
}

/** Exhaustiveness guard for every `switch (msg.type)`. */
export function unreachable(x: never): never {
  throw new Error(`unhandled message ${JSON.stringify(x)}`);
}

/** A device rank's traffic in one step (DeferredKernels.traffic, differenced). */
export interface StepTraffic {
  up: number;
  down: number;
  /** Bytes of arrays a kernel writes that were uploaded (0 once the run is going: the gradient stays on the device). */
  gradientUp: number;
  dispatches: number;
  /** The rank thread's milliseconds on the host in the step's micro-batches (runMicroBatches: not waiting for the device). */
  hostMs: number;
}
