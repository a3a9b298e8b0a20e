/**
 * Shared-memory layout: every SharedArrayBuffer the actors share, and every named slot in the
 * control block. No other module indexes these buffers with bare numbers.
 *
 *   params  Float32Array[P]          fp32 master weights (B4: once, written only in `update`); every rank's
 *                                    model multiplies against them directly (no replica, no copy)
 *   m, v    Float32Array[P] each     AdamW moments (B4: once, not per rank)
 *   slots   world x Float64Array[Pp] each rank's sum of its micro-batch gradients for the step, in float64 (A10);
 *                                    across processes (--dist mpi) slot 0 holds the process's sum of its slots
 *   grad    Float32Array[Pp]         the averaged, unscaled gradient the update reads (after `reduce`)
 *   sq      Float64Array[chunks]     the gradient's sum of squares per SQ_CHUNK chunk (A10, optim.ts)
 *   ctl     Int32Array[CTL_LENGTH]   Atomics words (below)
 *   staging Float32Array[3P]         a checkpoint's snapshot of params|m|v for the uploader (B3)
 *
 * P = the model's parameter count in the layout order of src/model/layout.ts; Pp = P rounded up to a multiple of
 * the process count (MPI_Reduce_scatter_block hands each process an equal block; the padding stays 0).
 */
import { chunkCount } from "../optim/optim";

/** Control words (Int32 indices into `ctl`). */
export const CTL_ABORT = 0; // != 0: stop at the next micro-batch (a rank or the coordinator's slice failed, or close)
export const CTL_LENGTH = 4;

export interface SharedBuffers {
  P: number;
  /** P padded to a multiple of the process count. */
  Pp: number;
  world: number;
  params: SharedArrayBuffer;
  m: SharedArrayBuffer;
  v: SharedArrayBuffer;
  slots: SharedArrayBuffer[];
  grad: SharedArrayBuffer;
  sq: SharedArrayBuffer;
  ctl: SharedArrayBuffer;
}

export interface SharedViews {
  params: Float32Array;
  m: Float32Array;
  v: Float32Array;
  slots: Float64Array[];
  grad: Float32Array;
  sq: Float64Array;
  ctl: Int32Array;
}

/** The buffers of `world` rank threads for a P-parameter model, the gradient buffers padded to a multiple of `hosts`. */
export function allocShared(P: number, world: number, hosts = 1): SharedBuffers {
  const Pp = Math.ceil(P / hosts) * hosts;
  const f32 = () => new SharedArrayBuffer(P * Float32Array.BYTES_PER_ELEMENT);
  const slots: SharedArrayBuffer[] = [];
  for (let r = 0; r < world; r++) slots.push(new SharedArrayBuffer(Pp * Float64Array.BYTES_PER_ELEMENT));
  return {
    P,
    Pp,
    world,
    params: f32(),
    m: f32(),
    v: f32(),
    slots,
    grad: new SharedArrayBuffer(Pp * Float32Array.BYTES_PER_ELEMENT),
    sq: new SharedArrayBuffer(chunkCount(P) * Float64Array.BYTES_PER_ELEMENT),
    ctl: new SharedArrayBuffer(CTL_LENGTH * 4),
  };
}

export function viewShared(b: SharedBuffers): SharedViews {
  return {
    params: new Float32Array(b.params),
    m: new Float32Array(b.m),
    v: new Float32Array(b.v),
    slots: b.slots.map((s) => new Float64Array(s)),
    grad: new Float32Array(b.grad, 0, b.P),
    sq: new Float64Array(b.sq),
    ctl: new Int32Array(b.ctl),
  };
}

/** The staging buffer holds [params | m | v] back to back. */
export const STAGE_PARAMS = 0;
export const STAGE_M = 1;
export const STAGE_V = 2;
export const STAGE_PARTS = 3;

export function stagingView(buf: SharedArrayBuffer, P: number, part: number): Float32Array {
  return new Float32Array(buf, part * P * Float32Array.BYTES_PER_ELEMENT, P);
}
