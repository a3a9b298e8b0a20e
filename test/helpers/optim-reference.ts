/**
 * The optimizer's reference loop for the tests: AdamW (P3) with torch semantics in float64 intermediates. The
 * trainer runs adamwSliceSimd (src/optim/optim-simd.ts: the addon's C kernel or the wasm one, in float32); the tests
 * hold both against this loop within float32 rounding (train.optim.test.ts) and follow the actor runtime's steps
 * with it (train.runtime.test.ts).
 */
import type { AdamHyper, DecayRange } from "../../src/optim/optim";

/**
 * One AdamW update of params/m/v over [lo, hi) with grads `g` (already averaged and unscaled),
 * multiplied by `coef` (the clip coefficient). `t` is the 1-based optimizer step (bias correction).
 * torch.optim.AdamW (foreach=False) order: decay, moments, bias-corrected step.
 */
export function adamwSlice(
  params: Float32Array,
  m: Float32Array,
  v: Float32Array,
  g: Float32Array,
  ranges: readonly DecayRange[],
  lo: number,
  hi: number,
  h: AdamHyper,
  coef: number,
  t: number,
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
      const gi = g[i] * coef;
      const mi = beta1 * m[i] + b1c * gi;
      const vi = beta2 * v[i] + b2c * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const denom = Math.sqrt(vi) / bc2Sqrt + eps;
      params[i] = params[i] * decayMul - stepSize * (mi / denom);
    }
  }
}
