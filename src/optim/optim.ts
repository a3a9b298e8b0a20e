/**
 * The step math, on flat Float32Arrays (views on SharedArrayBuffers in the actor runtime, plain arrays in the
 * single-thread loop): the step's decision from global figures (decideStep: skip or apply, the loss scaler (P2),
 * the clip coefficient (P4), the LR of optimizer step k (P5)), and the sums whose order is fixed by the data (A10):
 * foldMicro (a micro-batch's gradient into a rank's float64 slot), the reduce (reduceChunks64: the slots averaged
 * and unscaled into the float32 gradient, with each chunk's sum of squares; across processes sumSlots64,
 * unscaleInto and chunkSquares) and totalSquares. AdamW (P3) is optim-simd.ts's adamwSliceSimd. The loops work on
 * [lo, hi) slices or chunk ranges, so the ranks split them by parameter range; decideStep is pure and is the only
 * place either runtime decides anything about a step.
 */
import { nativeFold, nativeReduce } from "../model/engine/native";

// ---------------------------------------------------------------- LR (P5)

/** The trapezoid LR schedule's shape in optimizer steps (P5); trainer_state.json keeps it as lr_shape. */
export interface LrShape {
  warmup: number;
  decayStart: number;
  total: number;
}

/** LambdaLR factor at optimizer step k = 0, 1, ... exactly as the seed's `fn(cur)`. */
export function lrFactor(k: number, s: LrShape): number {
  if (k < s.warmup) return (k + 1) / Math.max(1, s.warmup);
  if (k < s.decayStart) return 1.0;
  return Math.max(0.0, 1.0 - (k - s.decayStart) / Math.max(1, s.total - s.decayStart));
}

// ---------------------------------------------------------------- loss scaler (P2)

/** torch.amp.GradScaler's state (P2); trainer_state.json keeps it as scaler. */
export interface ScalerState {
  scale: number;
  growthTracker: number;
}

/** torch.amp.GradScaler semantics: init 65536, x2 after 2000 clean steps, x0.5 on inf/NaN. */
export const SCALER_DEFAULTS = {
  initScale: 65536,
  growthFactor: 2.0,
  backoffFactor: 0.5,
  growthInterval: 2000,
} as const;

export function newScaler(): ScalerState {
  return { scale: SCALER_DEFAULTS.initScale, growthTracker: 0 };
}

/** The scaler's update after a step; `foundNonFinite`: the unscaled gradients held inf/NaN. */
export function scalerUpdate(s: ScalerState, foundNonFinite: boolean): ScalerState {
  if (foundNonFinite) return { scale: s.scale * SCALER_DEFAULTS.backoffFactor, growthTracker: 0 };
  const t = s.growthTracker + 1;
  if (t === SCALER_DEFAULTS.growthInterval) return { scale: s.scale * SCALER_DEFAULTS.growthFactor, growthTracker: 0 };
  return { scale: s.scale, growthTracker: t };
}

/**
 * How the scale moves (P2, P8): "dynamic" = GradScaler's rule (scalerUpdate); "fixed" = never (bf16 products keep
 * fp32's exponent range, so a run in bf16 holds the scale at 1 and only skips a non-finite step).
 */
export type ScalerMode = "dynamic" | "fixed";

/** The scaler mode of a run's precision (P8): fixed for bf16 products, dynamic otherwise. */
export function scalerModeOf(precision: "fp32" | "bf16" | undefined): ScalerMode {
  return precision === "bf16" ? "fixed" : "dynamic";
}

/** Where a fixed scaler stands (P8): scale 1, no growth count. */
export function fixedScaler(): ScalerState {
  return { scale: 1, growthTracker: 0 };
}

/** What validScaler demands, in the words a refusal quotes. */
export const SCALER_RULE = `must be {scale > 0, growthTracker in [0, ${SCALER_DEFAULTS.growthInterval})}`;

/**
 * The one check of a scaler state, saved or read (P2): a finite scale > 0 and a whole growth count below the
 * growth interval (scalerUpdate never leaves it at growthInterval: that step doubles the scale and resets it).
 */
export function validScaler(s: unknown): s is ScalerState {
  const o = s as ScalerState;
  return (
    typeof o === "object" &&
    o !== null &&
    Number.isFinite(o.scale) &&
    o.scale > 0 &&
    Number.isSafeInteger(o.growthTracker) &&
    o.growthTracker >= 0 &&
    o.growthTracker < SCALER_DEFAULTS.growthInterval
  );
}

// ---------------------------------------------------------------- gradient clipping (P4)

/** P4: the global gradient norm is clipped to this (torch clip_grad_norm_'s max_norm). */
export const MAX_GRAD_NORM = 1.0;

/** P4: torch clip_grad_norm_ coefficient, clamped to 1. */
export function clipCoef(totalNorm: number, maxNorm = MAX_GRAD_NORM): number {
  return Math.min(1.0, maxNorm / (totalNorm + 1e-6));
}

// ---------------------------------------------------------------- the step's decision (P2, P4, P5)

/** Where the optimizer stands: applied steps (AdamW's t - 1 and the LR's k), the loss scaler, skipped steps. */
export interface OptimizerPosition {
  optSteps: number;
  scaler: ScalerState;
  skipped: number;
}

/**
 * The factor the reduce multiplies the summed gradient slots by: the average over world*accum micro-batches and
 * the loss scale's unscale (P2) in one multiply.
 */
export function unscaleFactor(world: number, accum: number, scale: number): number {
  return 1 / (world * accum * scale);
}

/**
 * What to do with a step, and where the optimizer stands after it. `lr` is reported either way; the AdamW
 * arguments (lr, coef, t) exist only for a step that is applied.
 */
export type StepDecision =
  | { apply: true; lr: number; gradNorm: number; coef: number; t: number; next: OptimizerPosition }
  | { apply: false; lr: number; gradNorm: null; next: OptimizerPosition };

/**
 * The step's decision from the reduced gradient's global figures, pure (the caller applies it):
 * - P2: a gradient holding inf/NaN is not applied; the skip is counted and the optimizer step does not advance;
 *   the scaler backs off on it, grows after growthInterval clean steps (scalerUpdate), unless `mode` is "fixed"
 *   (P8: bf16 products; the scale stays where it is, 1);
 * - P4: the clip coefficient of the global norm sqrt(sumSq);
 * - P5: the LR of optimizer step k = pos.optSteps (applied steps so far, not the data step), and AdamW's
 *   1-based bias-correction step t = k + 1.
 */
export function decideStep(
  pos: OptimizerPosition,
  grad: ReduceResult,
  baseLr: number,
  shape: LrShape,
  mode: ScalerMode = "dynamic",
): StepDecision {
  const lr = baseLr * lrFactor(pos.optSteps, shape);
  const scaler = mode === "fixed" ? pos.scaler : scalerUpdate(pos.scaler, !grad.finite);
  if (!grad.finite)
    return { apply: false, lr, gradNorm: null, next: { optSteps: pos.optSteps, scaler, skipped: pos.skipped + 1 } };
  const gradNorm = Math.sqrt(grad.sumSq);
  return {
    apply: true,
    lr,
    gradNorm,
    coef: clipCoef(gradNorm),
    t: pos.optSteps + 1,
    next: { optSteps: pos.optSteps + 1, scaler, skipped: pos.skipped },
  };
}

// ---------------------------------------------------------------- reduce + unscale

/** The reduce's figures summed over all chunks (totalSquares): the unscaled gradient's sum of squares, and whether it is all finite. */
export interface ReduceResult {
  sumSq: number;
  finite: boolean;
}

// ---------------------------------------------------------------- AdamW (P3)

export interface AdamHyper {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
}
export const ADAMW_DEFAULTS = { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 } as const;

/** A parameter range [lo, hi) and whether it is decayed (2-D weights only, as the HF Trainer groups them). */
export interface DecayRange {
  lo: number;
  hi: number;
  decay: boolean;
}

/** Split [0, total) into `parts` contiguous slices of near-equal size. */
export function slices(total: number, parts: number): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (let p = 0; p < parts; p++) out.push([Math.floor((total * p) / parts), Math.floor((total * (p + 1)) / parts)]);
  return out;
}

// ---------------------------------------------------------------- sums in an order fixed by the data (A10)

/**
 * A10: the sum of squares behind the clip is taken over chunks of this many parameters, each summed in float64 in
 * SQ_LANES interleaved lanes (the chunk's element i in lane i % 4, each lane in index order, from 0) and the lanes
 * added as (lane 0 + lane 1) + (lane 2 + lane 3), and the chunks' sums added in chunk order: a figure of the
 * gradient alone, whatever slices the threads or processes work on. Four chains instead of one: a single chain of
 * float64 adds ran the reduce at the add's latency (about 2 ns an element), not at memory speed.
 */
export const SQ_CHUNK = 4096;
export const SQ_LANES = 4;

/** The chunk's tail (its last n % 4 elements, from index i): lanes 0, 1, 2 in order, then the lanes combined. */
function laneTail(x: ArrayLike<number>, i: number, hi: number, s0: number, s1: number, s2: number, s3: number): number {
  if (i < hi) s0 += x[i] * x[i];
  if (i + 1 < hi) s1 += x[i + 1] * x[i + 1];
  if (i + 2 < hi) s2 += x[i + 2] * x[i + 2];
  return s0 + s1 + (s2 + s3);
}

/** The number of SQ_CHUNK chunks of a vector of P parameters. */
export function chunkCount(P: number): number {
  return Math.ceil(P / SQ_CHUNK);
}

/**
 * A10: one micro-batch's float32 gradient added into a rank's float64 accumulator (`first`: the rank's first
 * micro-batch of the step, which sets it). The sum of float32 values in
 * float64 is exact while an element's terms lie within 2^(29 - log2 terms) of each other, so the accumulated sum
 * is the same whichever rank, process or micro-batch each term came from, and in whichever order they are added.
 * `kernel`: the addon's C loop (native/ops/optim.c, the same bits; its first fold's streaming stores skip reading
 * the slot's lines before writing them) where it loads ("auto"; an instruction set's name: that copy), or this JS
 * loop ("js"; the tests hold one to the other).
 */
export function foldMicro(
  acc: Float64Array,
  g: Float32Array,
  first: boolean,
  kernel: "auto" | "js" | "avx512" | "avx2" | "portable" = "auto",
): void {
  const nat = kernel === "js" ? null : nativeFold();
  if (nat) {
    nat(acc, g, first, kernel === "auto" || kernel === "js" ? undefined : kernel);
    return;
  }
  if (kernel !== "auto" && kernel !== "js")
    throw new Error("foldMicro: the native addon does not load (npm run build:native)");
  const n = g.length;
  // Every sum starts from its first term (never from 0 + it), here, in sumSlots64/reduceChunks64 and in MPI's sum, so a
  // -0 term sums alike in every split. `g` is left zeroed for the next micro-batch's += (lossAndGrads).
  if (first)
    for (let i = 0; i < n; i++) {
      acc[i] = g[i];
      g[i] = 0;
    }
  else
    for (let i = 0; i < n; i++) {
      acc[i] += g[i];
      g[i] = 0;
    }
}

/** out[i] = slots[0][i] + slots[1][i] + ... over [lo, hi), in float64 (out may be slots[0]). */
export function sumSlots64(slots: readonly Float64Array[], out: Float64Array, lo: number, hi: number): void {
  const k = slots.length;
  if (k === 2) {
    const a = slots[0],
      b = slots[1];
    for (let i = lo; i < hi; i++) out[i] = a[i] + b[i];
    return;
  }
  for (let i = lo; i < hi; i++) {
    let acc = slots[0][i];
    for (let s = 1; s < k; s++) acc += slots[s][i];
    out[i] = acc;
  }
}

/** grad[at + i] = fround(sum[i] * invScale) for i in [0, n): the averaged, unscaled float32 gradient. */
export function unscaleInto(sum: Float64Array, grad: Float32Array, at: number, n: number, invScale: number): void {
  for (let i = 0; i < n; i++) grad[at + i] = sum[i] * invScale;
}

/**
 * The whole-process reduce over chunks [c0, c1) of a P-vector (one process, A10): grad[i] = fround((slots[0][i] +
 * ...) * invScale), and sq[c] = the chunk's sum of squares as chunkSquares takes it, in the same pass. Bit-identical
 * to sumSlots64 across processes, unscaleInto and chunkSquares (the float64 sums are exact, see foldMicro). One and
 * two slots have their own loops (about twice the generic loop's speed over 106M parameters). `kernel`: the addon's
 * C loop (native/ops/optim.c: these operations in this order, the same bits) where it loads ("auto"), or this one
 * ("js"; the tests hold one to the other).
 */
export function reduceChunks64(
  slots: readonly Float64Array[],
  grad: Float32Array,
  invScale: number,
  P: number,
  sq: Float64Array,
  c0: number,
  c1: number,
  kernel: "auto" | "js" = "auto",
): void {
  const nat = kernel === "js" || slots.length > 64 ? null : nativeReduce();
  if (nat) {
    nat(slots, grad, invScale, P, sq, c0, c1);
    return;
  }
  const k = slots.length,
    a = slots[0],
    b = k > 1 ? slots[1] : a;
  for (let c = c0; c < c1; c++) {
    const lo = c * SQ_CHUNK,
      hi = Math.min(P, lo + SQ_CHUNK),
      end = lo + ((hi - lo) & ~3);
    let s0 = 0,
      s1 = 0,
      s2 = 0,
      s3 = 0;
    // the chunk's whole quads (its sum of squares in SQ_LANES lanes), then its tail through grad (laneTail)
    if (k === 1) {
      for (let i = lo; i < end; i += 4) {
        const x0 = Math.fround(a[i] * invScale),
          x1 = Math.fround(a[i + 1] * invScale),
          x2 = Math.fround(a[i + 2] * invScale),
          x3 = Math.fround(a[i + 3] * invScale);
        grad[i] = x0;
        grad[i + 1] = x1;
        grad[i + 2] = x2;
        grad[i + 3] = x3;
        s0 += x0 * x0;
        s1 += x1 * x1;
        s2 += x2 * x2;
        s3 += x3 * x3;
      }
      for (let i = end; i < hi; i++) grad[i] = a[i] * invScale;
    } else if (k === 2) {
      for (let i = lo; i < end; i += 4) {
        const x0 = Math.fround((a[i] + b[i]) * invScale),
          x1 = Math.fround((a[i + 1] + b[i + 1]) * invScale),
          x2 = Math.fround((a[i + 2] + b[i + 2]) * invScale),
          x3 = Math.fround((a[i + 3] + b[i + 3]) * invScale);
        grad[i] = x0;
        grad[i + 1] = x1;
        grad[i + 2] = x2;
        grad[i + 3] = x3;
        s0 += x0 * x0;
        s1 += x1 * x1;
        s2 += x2 * x2;
        s3 += x3 * x3;
      }
      for (let i = end; i < hi; i++) grad[i] = (a[i] + b[i]) * invScale;
    } else {
      for (let i = lo; i < hi; i++) {
        let acc = a[i];
        for (let r = 1; r < k; r++) acc += slots[r][i];
        const x = Math.fround(acc * invScale);
        grad[i] = x;
        if (i < end) {
          const lane = (i - lo) & 3;
          if (lane === 0) s0 += x * x;
          else if (lane === 1) s1 += x * x;
          else if (lane === 2) s2 += x * x;
          else s3 += x * x;
        }
      }
    }
    sq[c] = laneTail(grad, end, hi, s0, s1, s2, s3);
  }
}

/** sq[c] = the sum of g[i]^2 over chunk c (float64, in SQ_LANES lanes: SQ_CHUNK) for chunks [c0, c1) of a P-vector. */
export function chunkSquares(g: Float32Array, P: number, sq: Float64Array, c0: number, c1: number): void {
  for (let c = c0; c < c1; c++) {
    const lo = c * SQ_CHUNK,
      hi = Math.min(P, lo + SQ_CHUNK),
      end = lo + ((hi - lo) & ~3);
    let s0 = 0,
      s1 = 0,
      s2 = 0,
      s3 = 0;
    for (let i = lo; i < end; i += 4) {
      const x0 = g[i],
        x1 = g[i + 1],
        x2 = g[i + 2],
        x3 = g[i + 3];
      s0 += x0 * x0;
      s1 += x1 * x1;
      s2 += x2 * x2;
      s3 += x3 * x3;
    }
    sq[c] = laneTail(g, end, hi, s0, s1, s2, s3);
  }
}

/** The chunks' sums added in chunk order: the gradient's sum of squares and whether it is all finite. */
export function totalSquares(sq: Float64Array): ReduceResult {
  let sumSq = 0;
  for (let c = 0; c < sq.length; c++) sumSq += sq[c];
  return { sumSq, finite: Number.isFinite(sumSq) };
}

/** Split the chunks of a P-vector among `parts` owners: each owner's [c0, c1) chunk range. */
export function chunkSlices(P: number, parts: number): Array<[number, number]> {
  return slices(chunkCount(P), parts);
}

/**
 * A10: the step's mean loss from every rank's micro-batch losses, added in global micro-batch order (micro-batch
 * `m` of global rank `g` is number m * world + g). `losses[g * accum + m]`: global rank g's loss of micro-batch m.
 */
export function meanLossInOrder(losses: ArrayLike<number>, world: number, accum: number): number {
  let s = 0;
  for (let m = 0; m < accum; m++) for (let g = 0; g < world; g++) s += losses[g * accum + m];
  return s / (world * accum);
}
