/**
 * The coordinator's step math, on flat Float32Arrays (views on SharedArrayBuffers in the actor
 * runtime, plain arrays in the single-thread loop): gradient averaging, unscale + finite check,
 * global norm and clipping (P4), AdamW with torch semantics (P3), the dynamic loss scaler (P2) and
 * the trapezoid LR (P5). Every function works on a [lo, hi) slice so the ranks can split the
 * reduce and the update by parameter range while the coordinator decides from global figures.
 */

// ---------------------------------------------------------------- LR (P5)

export interface LrShape { warmup: number; decayStart: number; total: number }

/** LambdaLR factor at optimizer step k = 0, 1, ... exactly as the seed's `fn(cur)`. */
export function lrFactor(k: number, s: LrShape): number {
  if (k < s.warmup) return (k + 1) / Math.max(1, s.warmup);
  if (k < s.decayStart) return 1.0;
  return Math.max(0.0, 1.0 - (k - s.decayStart) / Math.max(1, s.total - s.decayStart));
}

// ---------------------------------------------------------------- loss scaler (P2)

/** torch.amp.GradScaler semantics: init 65536, x2 after 2000 clean steps, x0.5 on inf/NaN. */
export interface ScalerState { scale: number; growthTracker: number }
export const SCALER_DEFAULTS = { initScale: 65536, growthFactor: 2.0, backoffFactor: 0.5, growthInterval: 2000 } as const;

export function newScaler(): ScalerState {
  return { scale: SCALER_DEFAULTS.initScale, growthTracker: 0 };
}

/** The scaler's update after a step: `found` = the unscaled gradients held inf/NaN. */
export function scalerUpdate(s: ScalerState, foundNonFinite: boolean): ScalerState {
  if (foundNonFinite) return { scale: s.scale * SCALER_DEFAULTS.backoffFactor, growthTracker: 0 };
  const t = s.growthTracker + 1;
  if (t === SCALER_DEFAULTS.growthInterval) return { scale: s.scale * SCALER_DEFAULTS.growthFactor, growthTracker: 0 };
  return { scale: s.scale, growthTracker: t };
}

export function validScaler(s: unknown): s is ScalerState {
  const o = s as ScalerState;
  return typeof o === "object" && o !== null && Number.isFinite(o.scale) && o.scale > 0 &&
    Number.isSafeInteger(o.growthTracker) && o.growthTracker >= 0 && o.growthTracker < SCALER_DEFAULTS.growthInterval;
}

// ---------------------------------------------------------------- reduce + unscale

export interface ReduceResult { sumSq: number; finite: boolean }

/**
 * out[i] = (sum over slots of slots[s][i]) * invScale for i in [lo, hi), where invScale folds the
 * 1/(world*accum) average and the 1/scale unscale together. Returns the slice's sum of squares
 * (float64) and whether every value is finite. Slots are summed in rank order, so the result does
 * not depend on which thread runs the slice.
 */
export function reduceSlice(slots: readonly Float32Array[], out: Float32Array, invScale: number, lo: number, hi: number): ReduceResult {
  const n = slots.length;
  let sumSq = 0;
  const s0 = slots[0]!;
  if (n === 1) {
    for (let i = lo; i < hi; i++) {
      const g = Math.fround(s0[i]! * invScale);
      out[i] = g;
      sumSq += g * g;
    }
  } else if (n === 2) {
    // The common world-2 case, unrolled: ~2x the generic loop's bandwidth (bench/optim.ts).
    const s1 = slots[1]!;
    for (let i = lo; i < hi; i++) {
      const g = Math.fround(Math.fround(s0[i]! + s1[i]!) * invScale);
      out[i] = g;
      sumSq += g * g;
    }
  } else {
    for (let i = lo; i < hi; i++) {
      let acc = s0[i]!;
      for (let s = 1; s < n; s++) acc = Math.fround(acc + slots[s]![i]!);
      const g = Math.fround(acc * invScale);
      out[i] = g;
      sumSq += g * g;
    }
  }
  // A NaN or inf anywhere makes sumSq non-finite: one test instead of one per element.
  return { sumSq, finite: Number.isFinite(sumSq) };
}

/** P4: torch clip_grad_norm_ coefficient, clamped to 1. */
export function clipCoef(totalNorm: number, maxNorm = 1.0): number {
  return Math.min(1.0, maxNorm / (totalNorm + 1e-6));
}

// ---------------------------------------------------------------- AdamW (P3)

export interface AdamHyper { lr: number; beta1: number; beta2: number; eps: number; weightDecay: number }
export const ADAMW_DEFAULTS = { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 } as const;

/** A parameter range [lo, hi) and whether it is decayed (2-D weights only, as the HF Trainer groups them). */
export interface DecayRange { lo: number; hi: number; decay: boolean }

/**
 * One AdamW update of params/m/v over [lo, hi) with grads `g` (already averaged and unscaled),
 * multiplied by `coef` (the clip coefficient). `t` is the 1-based optimizer step (bias correction).
 * torch.optim.AdamW (foreach=False) order: decay, moments, bias-corrected step.
 */
export function adamwSlice(
  params: Float32Array, m: Float32Array, v: Float32Array, g: Float32Array,
  ranges: readonly DecayRange[], lo: number, hi: number, h: AdamHyper, coef: number, t: number,
): void {
  const { lr, beta1, beta2, eps, weightDecay } = h;
  const bc1 = 1 - Math.pow(beta1, t);
  const bc2 = 1 - Math.pow(beta2, t);
  const stepSize = lr / bc1;
  const bc2Sqrt = Math.sqrt(bc2);
  const b1c = 1 - beta1;
  const b2c = 1 - beta2;
  for (const r of ranges) {
    const a = Math.max(lo, r.lo);
    const b = Math.min(hi, r.hi);
    if (a >= b) continue;
    const decayMul = r.decay ? 1 - lr * weightDecay : 1;
    for (let i = a; i < b; i++) {
      const gi = g[i]! * coef;
      const mi = beta1 * m[i]! + b1c * gi;
      const vi = beta2 * v[i]! + b2c * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const denom = Math.sqrt(vi) / bc2Sqrt + eps;
      params[i] = params[i]! * decayMul - stepSize * (mi / denom);
    }
  }
}

/** Split [0, total) into `parts` contiguous slices of near-equal size. */
export function slices(total: number, parts: number): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (let p = 0; p < parts; p++) out.push([Math.floor((total * p) / parts), Math.floor((total * (p + 1)) / parts)]);
  return out;
}
