/**
 * Bench worker for case 4: one thread's share of the gradient average and the AdamW update, on a
 * slice of SharedArrayBuffers, exactly as a rank runs them (the SIMD kernel's reduceSliceSimd over every
 * slot into slot 0, then adamwSliceSimd over its [lo, hi)). Commands arrive one at a time; each answer carries the time
 * the thread spent inside the call.
 */
import { parentPort } from "node:worker_threads";
import { ADAMW_DEFAULTS, type DecayRange } from "../src/optim/optim";
import { adamwSliceSimd, reduceSliceSimd } from "../src/optim/optim-simd";

export interface OptimWorkerInit {
  params: SharedArrayBuffer;
  m: SharedArrayBuffer;
  v: SharedArrayBuffer;
  slots: SharedArrayBuffer[];
}
export type OptimCmd =
  | { op: "init"; init: OptimWorkerInit }
  | { op: "reduce"; P: number; lo: number; hi: number; invScale: number }
  | { op: "update"; P: number; lo: number; hi: number; ranges: DecayRange[]; lr: number; coef: number; t: number };
export type OptimReply = { op: string; ms: number; sumSq: number };

let views: { params: Float32Array; m: Float32Array; v: Float32Array; slots: Float32Array[] } | null = null;

parentPort!.on("message", (c: OptimCmd) => {
  const t0 = performance.now();
  let sumSq = 0;
  if (c.op === "init") {
    views = {
      params: new Float32Array(c.init.params),
      m: new Float32Array(c.init.m),
      v: new Float32Array(c.init.v),
      slots: c.init.slots.map((s) => new Float32Array(s)),
    };
  } else if (c.op === "reduce") {
    const w = views!;
    const slots = w.slots.map((s) => s.subarray(0, c.P));
    sumSq = reduceSliceSimd(slots, slots[0], c.invScale, c.lo, c.hi).sumSq;
  } else {
    const w = views!;
    adamwSliceSimd(
      w.params.subarray(0, c.P),
      w.m.subarray(0, c.P),
      w.v.subarray(0, c.P),
      w.slots[0].subarray(0, c.P),
      c.ranges,
      c.lo,
      c.hi,
      { lr: c.lr, ...ADAMW_DEFAULTS },
      c.coef,
      c.t,
    );
  }
  parentPort!.postMessage({ op: c.op, ms: performance.now() - t0, sumSq } satisfies OptimReply);
});
