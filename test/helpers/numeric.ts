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

// ---------------------------------------------------------------- float32 and bf16 arithmetic, exactly, in float64
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
/** The next float32 above x (x a finite float32). */
export function nextUp(x: number): number {
  f32[0] = x;
  if (x === 0) {
    u32[0] = 1;
    return f32[0];
  }
  u32[0] = x > 0 ? u32[0] + 1 : u32[0] - 1;
  return f32[0];
}
/**
 * fmaf(a, b, c) for float32 a, b, c, correctly rounded: a*b is exact in float64 (48 bits); s + e = a*b + c exactly
 * (TwoSum); fround(s) is the answer unless s is a float32 rounding tie, where e decides the side.
 */
export function fmaf(a: number, b: number, c: number): number {
  const p = a * b,
    s = p + c;
  const bb = s - p,
    e = p - (s - bb) + (c - bb);
  const r = Math.fround(s);
  if (e === 0 || r === s || !Number.isFinite(s)) return r;
  const lo = r < s ? r : -nextUp(-r),
    hi = r < s ? nextUp(r) : r;
  if (s !== (lo + hi) / 2) return r; // not a tie: s is on the same side of every float32 boundary as s + e
  return e > 0 ? hi : lo;
}

/**
 * fmaf(a, b, c) flushed as x86 flushes under flush-to-zero (a, b, c normal or 0): a result whose magnitude, rounded
 * to 24 bits with an unbounded exponent, is below 2^-126 is a signed 0. Flushing the IEEE result (ftz(fmaf(...)))
 * differs for an exact value in [2^-126 - 2^-150, 2^-126 - 2^-151): IEEE rounds it up to 2^-126, x86 flushes it.
 */
export function fmaFtz(a: number, b: number, c: number): number {
  const p = a * b,
    s = p + c;
  const bb = s - p,
    e = p - (s - bb) + (c - bb);
  const v = Math.abs(s),
    lim = 2 ** -126 - 2 ** -151;
  if (s !== 0 && Number.isFinite(s) && (v < lim || (v === lim && (s > 0 ? e < 0 : e > 0)))) return s > 0 ? 0 : -0;
  return ftz(fmaf(a, b, c));
}

/** x (a float32) rounded to bf16 as VCVTNE2PS2BF16 does: a denormal is a signed 0, the rest to nearest even, a
 *  NaN stays NaN; returned as the float32 it widens to. */
export function bf16(x: number): number {
  f32[0] = x;
  const u = u32[0];
  if ((u & 0x7fffffff) > 0x7f800000) return Number.NaN;
  if ((u & 0x7f800000) === 0) u32[0] = u & 0x80000000;
  else u32[0] = ((u + 0x7fff + ((u >>> 16) & 1)) & 0xffff0000) >>> 0;
  return f32[0];
}

/** x (a float32) with a denormal flushed to a signed 0 (flush-to-zero / denormals-are-zero). */
export function ftz(x: number): number {
  f32[0] = x;
  if ((u32[0] & 0x7f800000) === 0) u32[0] = u32[0] & 0x80000000;
  return f32[0];
}
