// Numeric comparisons shared by the tests (one copy of each).
import assert from "node:assert/strict";

/** ||a - b|| / ||b|| (Euclidean); the arrays must have the same length. */
export function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  assert.equal(a.length, b.length, "relErr: lengths differ");
  let num = 0,
    den = 0;
  for (let i = 0; i < a.length; i++) {
    const d = a[i] - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  return Math.sqrt(num) / Math.sqrt(den);
}

/** max |a[i] - b[i]| and the index where it occurs. */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): { diff: number; at: number } {
  assert.equal(a.length, b.length, "maxAbsDiff: lengths differ");
  let diff = 0,
    at = -1;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (!(d <= diff)) {
      diff = d;
      at = i;
    } // a NaN difference wins
  }
  return { diff, at };
}

/** max |a[i]| */
export function maxAbs(a: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]));
  return m;
}

/** Same bytes (so NaN payloads and -0 count). */
export function sameBits(a: ArrayBufferView, b: ArrayBufferView): boolean {
  return (
    Buffer.compare(
      Buffer.from(a.buffer, a.byteOffset, a.byteLength),
      Buffer.from(b.buffer, b.byteOffset, b.byteLength),
    ) === 0
  );
}

/** A seeded uniform generator in [0, 2^32) (LCG): reproducible test data without Math.random. */
export function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s;
  };
}
