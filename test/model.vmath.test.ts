/**
 * The row kernels' exp and log (native/ops/vmath.h), on every copy this CPU runs (AVX-512, AVX2 + FMA, portable C):
 * - exp (float): on a sweep of [-87, 88] on a 2^-12 grid, the clamps' neighbourhoods, ±0, tiny values and random
 *   floats, in arrays whose length is not a multiple of any vector width (the padded tail runs too), every copy
 *   gives the same bits, equal to the documented sequence of operations emulated in float64 (fmaf, Math.fround:
 *   the clamp, the FMA rounding, the two-step reduction, Cephes' polynomial by Horner, the 2^n scaling); and each
 *   result is within EXP_ULP ulp of float64 exp (Math.exp) inside the clamps, exp(-87) below them, exp(88) above;
 * - log (double): on a sweep of positive doubles (denormals to 1e300, the sums cross-entropy and attention take: 1
 *   to 1e6), every copy gives the same bits, within LOG_ULP ulp of Math.log; log(0) = -Infinity, log(Infinity) =
 *   Infinity, negative and NaN give NaN.
 * With TSTRAIN_REQUIRE_NATIVE=1 an addon that does not load fails these tests instead of skipping them.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { loadNative, supportedIsas } from "../src/model/engine/native";
import { vmath } from "../bench/native-probes";
import { fmaf, lcg } from "./helpers/numeric";

const native = loadNative();
const skip =
  "reason" in native && process.env.TSTRAIN_REQUIRE_NATIVE !== "1"
    ? `native engine unavailable here: ${native.reason}`
    : false;

/** The bounds the header states (measured by this test on every copy). */
const EXP_ULP = 1;
const LOG_ULP = 1;

const f = Math.fround;

/** vmath.h's exp, operation by operation, in float64 with each float result rounded (the documented sequence). */
function expReference(xin: number): number {
  const v = f(xin);
  const x = Math.min(Number.isNaN(v) ? -87 : Math.max(v, -87), 88); // MAXPS: NaN gives the second operand, -87
  const t = fmaf(x, f(Math.LOG2E), 12582912);
  const n = f(t - 12582912);
  let r = fmaf(n, -0.693359375, x);
  r = fmaf(n, f(2.1219444e-4), r);
  let p = f(1.98756915e-4);
  for (const c of [1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1])
    p = fmaf(p, r, f(c));
  const y = f(fmaf(p, f(r * r), r) + 1);
  return f(y * 2 ** n);
}

/** ulps of x's float format (float: 24 bits; double: 53) between a and the exact value ref. */
function ulpErr(a: number, ref: number, bits: 24 | 53): number {
  const e = Math.max(Math.floor(Math.log2(Math.abs(ref))), bits === 24 ? -126 : -1022);
  return Math.abs(a - ref) / 2 ** (e - (bits - 1));
}

function expInputs(): Float32Array {
  const xs: number[] = [];
  for (let x = -87; x <= 88; x += 2 ** -12) xs.push(x);
  for (const c of [-87, 88]) for (let k = -64; k <= 64; k++) xs.push(c + k * 2 ** -16);
  xs.push(0, -0, 1e-30, -1e-30, 1e-45, -1e-45, 2 ** -126, -(2 ** -126), -100, 100, -1e30, 1e30, -Infinity, Infinity);
  const g = lcg(20261203),
    rnd = () => g() / 2 ** 32;
  for (let i = 0; i < 100_000; i++) xs.push((rnd() - 0.5) * 200);
  if (xs.length % 16 === 0) xs.push(0.5);
  return Float32Array.from(xs);
}

function logInputs(): Float64Array {
  const xs: number[] = [5e-324, 1e-320, 2.2250738585072014e-308, 2.225073858507201e-308, 1, 2, 0.5, Math.SQRT2];
  for (let x = 1; x <= 1e6; x *= 1.0007) xs.push(x);
  const g = lcg(7),
    rnd = () => g() / 2 ** 32;
  for (let i = 0; i < 100_000; i++) xs.push(2 ** ((rnd() - 0.5) * 2000) * (1 + rnd()));
  for (let i = 0; i < 20_000; i++) xs.push(1 + (rnd() - 0.5) * 1e-3); // near 1: log's cancellation
  return Float64Array.from(xs);
}

test("vmath's exp gives the same bits on every instruction set, the documented sequence's, within its stated ulps", {
  skip,
}, () => {
  const ex = vmath();
  assert.ok(ex, "the addon loads");
  const isas = supportedIsas();
  assert.ok(isas.includes("portable"), `portable is always run (got ${isas.join(", ")})`);
  const x = expInputs();
  const outs = new Map<string, Float32Array>();
  for (const isa of isas) {
    const out = new Float32Array(x.length);
    ex("exp", isa, x, out);
    outs.set(isa, out);
  }
  const base = outs.get("portable") ?? new Float32Array(0);
  for (const [isa, out] of outs) {
    const a = new Uint32Array(out.buffer),
      b = new Uint32Array(base.buffer);
    let first = -1;
    for (let i = 0; i < a.length && first < 0; i++) if (a[i] !== b[i]) first = i;
    assert.equal(first, -1, `exp on ${isa} differs from portable at x = ${x[first]}: ${out[first]} vs ${base[first]}`);
  }
  let worst = 0,
    at = 0;
  for (let i = 0; i < x.length; i++) {
    const ref = expReference(x[i]);
    assert.ok(Object.is(base[i], ref), `exp(${x[i]}) = ${base[i]}, the documented sequence gives ${ref}`);
    const xi = x[i];
    const exact = Math.exp(Number.isNaN(xi) ? -87 : Math.min(Math.max(xi, -87), 88));
    const u = ulpErr(base[i], exact, 24);
    if (u > worst) [worst, at] = [u, xi];
  }
  console.log(`# exp: at most ${worst.toFixed(3)} ulp from float64 exp (at x = ${at}), ${x.length} inputs`);
  assert.ok(worst <= EXP_ULP, `exp is ${worst} ulp off float64 at x = ${at} (stated: ${EXP_ULP})`);
  assert.equal(base[x.indexOf(-Infinity)], base[x.indexOf(-100)], "below the clamp: exp(-87)");
  assert.equal(base[x.indexOf(Infinity)], base[x.indexOf(100)], "above the clamp: exp(88)");
});

test("vmath's log gives the same bits on every instruction set, within its stated ulp of float64 log", { skip }, () => {
  const lg = vmath();
  assert.ok(lg, "the addon loads");
  const x = logInputs();
  const outs = new Map<string, Float64Array>();
  for (const isa of supportedIsas()) {
    const out = new Float64Array(x.length);
    lg("log", isa, x, out);
    outs.set(isa, out);
  }
  const base = outs.get("portable") ?? new Float64Array(0);
  for (const [isa, out] of outs)
    for (let i = 0; i < x.length; i++)
      if (!Object.is(out[i], base[i])) assert.fail(`log on ${isa} differs from portable at x = ${x[i]}`);
  let worst = 0,
    at = 0;
  for (let i = 0; i < x.length; i++) {
    const ref = Math.log(x[i]);
    if (ref === 0) {
      assert.equal(base[i], 0, "log(1) = 0");
      continue;
    }
    const u = ulpErr(base[i], ref, 53);
    if (u > worst) [worst, at] = [u, x[i]];
  }
  console.log(`# log: at most ${worst.toFixed(3)} ulp from Math.log (at x = ${at}), ${x.length} inputs`);
  assert.ok(worst <= LOG_ULP, `log is ${worst} ulp off Math.log at x = ${at} (stated: ${LOG_ULP})`);
  const special = new Float64Array([0, -0, Infinity, -1, Number.NaN]),
    out = new Float64Array(5);
  lg("log", "portable", special, out);
  assert.deepEqual([...out], [-Infinity, -Infinity, Infinity, Number.NaN, Number.NaN]);
});

test("vmath refuses an unknown function or instruction set, and arrays of the wrong type", { skip }, () => {
  const v = vmath();
  assert.ok(v, "the addon loads");
  const x = new Float32Array(4),
    o = new Float32Array(4);
  assert.throws(() => v("exp", "sse9" as "avx2", x, o), /isa must be avx512, avx2 or portable/);
  assert.throws(() => (v as (...a: unknown[]) => void)("sin", "portable", x, o), /fn must be exp or log/);
  assert.throws(() => (v as (...a: unknown[]) => void)("log", "portable", x, o), /x must be a Float64Array for log/);
  assert.throws(() => v("exp", "portable", x, new Float32Array(3)), /out/);
});
