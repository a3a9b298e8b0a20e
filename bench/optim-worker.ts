/**
 * Bench worker for case 4: one thread's share of the optimizer's memory-bound passes, on SharedArrayBuffers, with
 * the trainer's own functions, exactly as a rank runs them (src/actors/rank.ts): foldMicro (a micro-batch's float32
 * gradient into the rank's float64 slot), reduceChunks64 (the float64 slots averaged and unscaled into the float32
 * gradient, with each chunk's sum of squares) and adamwSliceSimd (AdamW on the thread's slice); and the bandwidth
 * probes the passes are compared with: a triad and a copy over float64 arrays. Commands arrive one at a time; each
 * answer carries the time the thread spent inside the call.
 */
import { parentPort } from "node:worker_threads";
import { ADAMW_DEFAULTS, foldMicro, reduceChunks64, type DecayRange } from "../src/optim/optim";
import { adamwSliceSimd } from "../src/optim/optim-simd";
import { streamProbe } from "./native-probes";

export interface OptimWorkerInit {
  params: SharedArrayBuffer;
  m: SharedArrayBuffer;
  v: SharedArrayBuffer;
  /** the ranks' float64 gradient slots */
  slots: SharedArrayBuffer[];
  /** each thread's float32 micro-batch gradient (folded into slots[thread]) */
  micro: SharedArrayBuffer[];
  /** the averaged float32 gradient and the chunks' sums of squares */
  grad: SharedArrayBuffer;
  sq: SharedArrayBuffer;
  /** the probes' float64 output */
  probe: SharedArrayBuffer;
}
export type OptimCmd =
  | { op: "init"; init: OptimWorkerInit }
  | { op: "fill"; P: number; thread: number; salt: number }
  | { op: "fold"; P: number; thread: number; first: boolean }
  | { op: "reduce"; P: number; c0: number; c1: number; invScale: number }
  | { op: "update"; P: number; lo: number; hi: number; ranges: DecayRange[]; lr: number; coef: number; t: number }
  | { op: "triad" | "copy" | "ctriad" | "axpy"; lo: number; hi: number };
export type OptimReply = { op: string; ms: number };

interface Views {
  params: Float32Array;
  m: Float32Array;
  v: Float32Array;
  slots: Float64Array[];
  micro: Float32Array[];
  grad: Float32Array;
  sq: Float64Array;
  probe: Float64Array;
}
let views: Views | null = null;

/** x = y + s * z over [lo, hi): STREAM's triad, 24 bytes an element. */
function triad(x: Float64Array, y: Float64Array, z: Float64Array, lo: number, hi: number): void {
  const s = 0.5;
  for (let i = lo; i < hi; i++) x[i] = y[i] + s * z[i];
}

/** A micro-batch's gradient as the backward leaves it (untimed): nonzero float32 values of a few 1e-3, other ones
 *  every round. foldMicro zeroes g, and the passes must not run on zeros: the memory system moves lines of zeros
 *  at other speeds (2-thread reduce over 106M zeros here: 145 ms; over gradient-like values: 90 ms). */
function fill(g: Float32Array, P: number, salt: number): void {
  for (let i = 0; i < P; i++) g[i] = 1e-3 * ((((i + salt) * 2654435761) >>> 0) / 4294967296 - 0.5);
}

parentPort!.on("message", (c: OptimCmd) => {
  const t0 = performance.now();
  if (c.op === "init") {
    views = {
      params: new Float32Array(c.init.params),
      m: new Float32Array(c.init.m),
      v: new Float32Array(c.init.v),
      slots: c.init.slots.map((s) => new Float64Array(s)),
      micro: c.init.micro.map((s) => new Float32Array(s)),
      grad: new Float32Array(c.init.grad),
      sq: new Float64Array(c.init.sq),
      probe: new Float64Array(c.init.probe),
    };
  } else {
    const w = views!;
    if (c.op === "fill") fill(w.micro[c.thread], c.P, c.salt);
    else if (c.op === "fold")
      foldMicro(w.slots[c.thread].subarray(0, c.P), w.micro[c.thread].subarray(0, c.P), c.first);
    else if (c.op === "reduce")
      reduceChunks64(
        w.slots.map((s) => s.subarray(0, c.P)),
        w.grad,
        c.invScale,
        c.P,
        w.sq,
        c.c0,
        c.c1,
      );
    else if (c.op === "update")
      adamwSliceSimd(
        w.params.subarray(0, c.P),
        w.m.subarray(0, c.P),
        w.v.subarray(0, c.P),
        w.grad.subarray(0, c.P),
        c.ranges,
        c.lo,
        c.hi,
        { lr: c.lr, ...ADAMW_DEFAULTS },
        c.coef,
        c.t,
      );
    else if (c.op === "triad") triad(w.probe, w.slots[0], w.slots[1 % w.slots.length], c.lo, c.hi);
    else if (c.op === "ctriad" || c.op === "axpy") {
      const probe = streamProbe();
      if (!probe) throw new Error(`optim bench: the ${c.op} probe needs the probes addon (npm run build:native)`);
      const sub = (x: Float64Array) => x.subarray(c.lo, c.hi);
      probe(c.op === "ctriad" ? "triad" : "axpy", sub(w.probe), sub(w.slots[0]), sub(w.slots[1 % w.slots.length]), 0.5);
    } else w.probe.set(w.slots[0].subarray(c.lo, c.hi), c.lo);
  }
  parentPort!.postMessage({ op: c.op, ms: performance.now() - t0 } satisfies OptimReply);
});
