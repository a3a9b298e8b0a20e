/** Small, dependency-free statistics for the bench: medians and quartiles of step times. */

export function quantile(xs: readonly number[], q: number): number {
  if (!xs.length) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos),
    hi = Math.ceil(pos);
  return s[lo] + (s[hi] - s[lo]) * (pos - lo);
}

export function median(xs: readonly number[]): number {
  return quantile(xs, 0.5);
}

export interface Summary {
  n: number;
  median: number;
  p25: number;
  p75: number;
  min: number;
  max: number;
}

export function summarize(xs: readonly number[]): Summary {
  return {
    n: xs.length,
    median: median(xs),
    p25: quantile(xs, 0.25),
    p75: quantile(xs, 0.75),
    min: xs.length ? Math.min(...xs) : Number.NaN,
    max: xs.length ? Math.max(...xs) : Number.NaN,
  };
}

/** Round to `d` decimals; NaN/inf become null so the JSON stays valid. */
export function r(x: number | null | undefined, d = 1): number | null {
  if (x === null || x === undefined || !Number.isFinite(x)) return null;
  const f = 10 ** d;
  return Math.round(x * f) / f;
}
