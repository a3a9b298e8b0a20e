/**
 * Shared-memory layout: every SharedArrayBuffer the actors share, and every named slot in the
 * control block. No other module indexes these buffers with bare numbers.
 *
 *   params  Float32Array[P]          fp32 master weights (B4: once, written only in `update`); every rank's
 *                                    model multiplies against them directly (no replica, no copy)
 *   m, v    Float32Array[P] each     AdamW moments (B4: once, not per rank)
 *   slots   world x Float32Array[P]  each rank's local gradient sum for the step; after `reduce`,
 *                                    slot 0 holds the averaged, unscaled gradient (in place)
 *   ctl     Int32Array[CTL_LENGTH]   Atomics words (below)
 *   staging Float32Array[3P]         a checkpoint's snapshot of params|m|v for the uploader (B3)
 *
 * P = the model's parameter count in the layout order of src/model/layout.ts.
 */

/** Control words (Int32 indices into `ctl`). */
export const CTL_ABORT = 0;        // != 0: stop at the next micro-batch boundary (a rank failed, or a stop was asked)
export const CTL_LENGTH = 4;

export interface SharedBuffers {
  P: number;
  world: number;
  params: SharedArrayBuffer;
  m: SharedArrayBuffer;
  v: SharedArrayBuffer;
  slots: SharedArrayBuffer[];
  ctl: SharedArrayBuffer;
}

export interface SharedViews {
  params: Float32Array;
  m: Float32Array;
  v: Float32Array;
  slots: Float32Array[];
  ctl: Int32Array;
}

export function allocShared(P: number, world: number): SharedBuffers {
  const f32 = () => new SharedArrayBuffer(P * Float32Array.BYTES_PER_ELEMENT);
  const slots: SharedArrayBuffer[] = [];
  for (let r = 0; r < world; r++) slots.push(f32());
  return { P, world, params: f32(), m: f32(), v: f32(), slots, ctl: new SharedArrayBuffer(CTL_LENGTH * 4) };
}

export function viewShared(b: SharedBuffers): SharedViews {
  return {
    params: new Float32Array(b.params),
    m: new Float32Array(b.m),
    v: new Float32Array(b.v),
    slots: b.slots.map((s) => new Float32Array(s)),
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
