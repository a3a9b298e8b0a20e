/**
 * The micro-batch fold on the device (A10; engine.ts: DeferredKernels.fold): a rank's float64 slot
 * slot[i] = (double)g[i] on the step's first micro-batch, else slot[i] + (double)g[i], and g[i] = 0: foldMicro's
 * operations (src/optim/optim.ts, native/ops/optim.c), each one IEEE binary64 conversion or add rounded to nearest,
 * ties to even. WGSL has no f64: a binary64 is a vec2u (its low word, its high word: the bytes of a little-endian
 * Float64Array), and the add is done on integers: the significands widened by 3 bits (guard, round, sticky), the
 * smaller aligned to the larger with every bit shifted out kept in the sticky bit, added or subtracted, normalized,
 * rounded to nearest even. 64-bit integers are u32 pairs, the carry and the borrow passed between the halves.
 *
 * Exact everywhere, not only on the values a run makes: signed zeros (-0 + -0 = -0, -0 + +0 = +0, an exact
 * cancellation +0), subnormal accumulators and results (a float32 sum never makes one: its terms are multiples of
 * 2^-149, far above binary64's 2^-1022; a slot the host wrote can hold one), a carry past the largest exponent to
 * infinity (no finite slot reaches it: the largest float32 is 2^128, under half an ulp of the largest binary64,
 * 2^970). Infinities and NaN: inf + -inf is the default NaN, a NaN operand comes back quieted (its payload kept, the
 * slot's before the gradient's): NaN where the host has NaN, though a NaN's payload may differ from the CPU's.
 *
 * One thread per element; a dispatch covers up to 4C elements, C = the slot elements one binding holds: the
 * gradient through two bindings (g0, g1: 2C floats each), the slot through four (s0..s3: C binary64 each), so a
 * device whose bindings hold 128 MiB (WebGPU's guarantee) folds 67M parameters a dispatch (the frozen model's 106M
 * in 2).
 */
import { idx, shader, WG } from "./framework";

/** 64-bit unsigned integers as vec2u(low, high). The carry and the borrow cross from the low word to the high. */
const u64 = `
fn add64(a: vec2u, b: vec2u) -> vec2u {
  let lo = a.x + b.x;
  return vec2u(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn sub64(a: vec2u, b: vec2u) -> vec2u {
  return vec2u(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
fn shr64(v: vec2u, s: u32) -> vec2u {
  if (s == 0u) { return v; }
  if (s >= 64u) { return vec2u(0u); }
  if (s >= 32u) { return vec2u(v.y >> (s - 32u), 0u); }
  return vec2u((v.x >> s) | (v.y << (32u - s)), v.y >> s);
}
fn shl64(v: vec2u, s: u32) -> vec2u {
  if (s == 0u) { return v; }
  if (s >= 64u) { return vec2u(0u); }
  if (s >= 32u) { return vec2u(0u, v.x << (s - 32u)); }
  return vec2u(v.x << s, (v.y << s) | (v.x >> (32u - s)));
}
fn clz64(v: vec2u) -> u32 { return select(32u + countLeadingZeros(v.x), countLeadingZeros(v.y), v.y != 0u); }
fn less64(a: vec2u, b: vec2u) -> bool { return a.y < b.y || (a.y == b.y && a.x < b.x); }
fn zero64(v: vec2u) -> bool { return (v.x | v.y) == 0u; }`;

/**
 * binary64 on u32 pairs: widen (a float32's bits to the binary64 of the same value, exact) and addF64 (a + b
 * rounded to nearest even), as the CPU's cvtss2sd and addsd.
 */
export const F64 = `${u64}
fn widen(b: u32) -> vec2u {
  let s = b & 0x80000000u;
  let e = (b >> 23u) & 0xffu;
  let m = b & 0x7fffffu;
  if (e == 0xffu) { return vec2u(m << 29u, s | 0x7ff00000u | select(0u, 0x80000u, m != 0u) | (m >> 3u)); }
  if (e == 0u) {
    if (m == 0u) { return vec2u(0u, s); }
    let sh = countLeadingZeros(m) - 8u; // a float32 subnormal: its top bit moved to the hidden place
    let n = (m << sh) & 0x7fffffu;
    return vec2u(n << 29u, s | ((897u - sh) << 20u) | (n >> 3u));
  }
  return vec2u(m << 29u, s | ((e + 896u) << 20u) | (m >> 3u));
}
fn addF64(a: vec2u, b: vec2u) -> vec2u {
  let ea = (a.y >> 20u) & 0x7ffu;
  let eb = (b.y >> 20u) & 0x7ffu;
  let fa = vec2u(a.x, a.y & 0xfffffu);
  let fb = vec2u(b.x, b.y & 0xfffffu);
  if (ea == 0x7ffu || eb == 0x7ffu) {
    if (ea == 0x7ffu && !zero64(fa)) { return vec2u(a.x, a.y | 0x80000u); }
    if (eb == 0x7ffu && !zero64(fb)) { return vec2u(b.x, b.y | 0x80000u); }
    if (ea == 0x7ffu && eb == 0x7ffu && ((a.y ^ b.y) >> 31u) == 1u) { return vec2u(0u, 0xfff80000u); }
    return select(b, a, ea == 0x7ffu);
  }
  let sa = a.y & 0x80000000u;
  let sb = b.y & 0x80000000u;
  // the significands with their hidden bit (a subnormal has none, at exponent 1), 3 bits below: guard, round, sticky
  var xa = shl64(vec2u(fa.x, fa.y | select(0u, 0x100000u, ea != 0u)), 3u);
  var xb = shl64(vec2u(fb.x, fb.y | select(0u, 0x100000u, eb != 0u)), 3u);
  var e = max(ea, 1u);
  var eo = max(eb, 1u);
  var s = sa;
  if (eo > e || (eo == e && less64(xa, xb))) {
    let t = xa; xa = xb; xb = t;
    let u = e; e = eo; eo = u;
    s = sb;
  }
  // the smaller aligned to the larger: every bit shifted out is kept as the sticky bit
  let d = e - eo;
  if (d >= 56u) {
    xb = vec2u(select(0u, 1u, !zero64(xb)), 0u);
  } else if (d > 0u) {
    let kept = shr64(xb, d);
    xb = vec2u(kept.x | select(0u, 1u, !zero64(sub64(xb, shl64(kept, d)))), kept.y);
  }
  var x: vec2u;
  if (sa == sb) {
    x = add64(xa, xb);
    if (x.y >= 0x1000000u) { // a carry out of the top: one place right, the bit shifted out kept as sticky
      x = vec2u((x.x >> 1u) | (x.y << 31u) | (x.x & 1u), x.y >> 1u);
      e = e + 1u;
    }
  } else {
    x = sub64(xa, xb);
    if (zero64(x)) { return vec2u(0u, 0u); } // an exact cancellation is +0
    let sh = min(clz64(x) - 8u, e - 1u); // normalized, or subnormal at exponent 1
    x = shl64(x, sh);
    e = e - sh;
  }
  if (zero64(x)) { return vec2u(0u, s); } // a zero plus a zero of its sign
  // to nearest, ties to even
  let low = x.x & 7u;
  x = shr64(x, 3u);
  if (low > 4u || (low == 4u && (x.x & 1u) == 1u)) { x = add64(x, vec2u(1u, 0u)); }
  if (x.y >= 0x200000u) { x = shr64(x, 1u); e = e + 1u; }
  if (e >= 0x7ffu) { return vec2u(0u, s | 0x7ff00000u); }
  let field = select(0u, e, x.y >= 0x100000u); // no hidden bit: a subnormal
  return vec2u(x.x, s | (field << 20u) | (x.y & 0xfffffu));
}`;

/**
 * The fold of `n` elements: element i of the dispatch is gradient element j = oG + i counted from g0's start (g0
 * holds j < 2C, g1 the next 2C) and slot element oS + i counted from s0's start (s0, s1, s2, s3: C each), so the
 * bindings are consecutive aligned ranges of their buffers, none overlapping another; `sets` (the step's first
 * micro-batch) sets the slot, never reading it, else adds into it; the gradient element is zeroed.
 */
export const foldMicro = shader(
  [
    "g0:read_write:u32",
    "g1:read_write:u32",
    "s0:read_write:vec2u",
    "s1:read_write:vec2u",
    "s2:read_write:vec2u",
    "s3:read_write:vec2u",
  ],
  { n: "u32", C: "u32", oG: "u32", oS: "u32", sets: "u32" },
  `
${idx}
${F64}
fn slotAt(k: u32, j: u32) -> vec2u {
  switch k {
    case 0u: { return s0[j]; }
    case 1u: { return s1[j]; }
    case 2u: { return s2[j]; }
    default: { return s3[j]; }
  }
}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) gid: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let i = flat(gid, nw);
  if (i >= p.n) { return; }
  let j = p.oG + i;
  var b: u32;
  if (j < 2u * p.C) {
    b = g0[j]; g0[j] = 0u;
  } else {
    b = g1[j - 2u * p.C]; g1[j - 2u * p.C] = 0u;
  }
  let k = (p.oS + i) / p.C;
  let js = (p.oS + i) % p.C;
  var r = widen(b);
  if (p.sets == 0u) { r = addF64(slotAt(k, js), r); }
  switch k {
    case 0u: { s0[js] = r; }
    case 1u: { s1[js] = r; }
    case 2u: { s2[js] = r; }
    default: { s3[js] = r; }
  }
}`,
);

/**
 * C, the slot elements one binding of at most `maxBinding` bytes holds in a fold dispatch: a multiple of 64, so that
 * 8C bytes (C binary64, 2C floats) are a multiple of any storage offset alignment (at most 256).
 */
export function foldChunk(maxBinding: number): number {
  const c = Math.floor(maxBinding / (8 * 64)) * 64;
  if (c <= 0) throw new Error(`webgpu: a storage binding of ${maxBinding} bytes holds no fold chunk`);
  return c;
}
