/**
 * The built-in bf16 GEMM (native/gemm/, gemm_bf16): the AMX-BF16 kernel (TDPBF16PS, where this CPU and OS have it)
 * and the emulations on the fp32 kernels (AVX-512, AVX2, portable; those this CPU runs) against an exact reference
 * of the documented order, emulated in float64: every operand rounded to bf16 (a denormal read as 0, then to
 * nearest even); per C element, K padded with zeros to a multiple of 32 and cut into chunks of 32; per chunk
 * e = ftz(fma(a[k], b[k], e)) over its 16 even k and o likewise over its 16 odd k, each from 0, then
 * acc = ftz(acc + ftz(e + o)) from acc = 0; then C = acc, ftz(ftz(C) + acc) or ftz(fma(beta, ftz(C), acc)). Every
 * kernel gives the same bits, so a bf16 run is bit-identical on machines with and without AMX.
 * With TSTRAIN_REQUIRE_NATIVE=1 an addon that does not load fails these tests instead of skipping them.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { loadNative, supportedIsas } from "../src/model/engine/native";
import { builtinGemmBf16 } from "../bench/native-probes";
import { bf16, fmaf, fmaFtz, ftz } from "./helpers/numeric";
import { checkKernelOutputs } from "./helpers/gemm-check";

const native = loadNative();
const skip =
  "reason" in native && process.env.TSTRAIN_REQUIRE_NATIVE !== "1"
    ? `native engine unavailable here: ${native.reason}`
    : false;

interface Case {
  ta: boolean;
  tb: boolean;
  M: number;
  N: number;
  K: number;
  beta: number;
  lda: number;
  ldb: number;
  ldc: number;
}

/** The kernels this CPU runs: the hardware ones first where there are some. */
function kernels(): Array<"amx" | "avx512bf16" | "avx512" | "avx2" | "portable"> {
  const g = builtinGemmBf16()!;
  const emu = supportedIsas() as Array<"avx512" | "avx2" | "portable">;
  return [...(g.hw ? (["amx"] as const) : []), ...(g.dp ? (["avx512bf16"] as const) : []), ...emu];
}

/** Values in [-1, 1), one in 40 scaled into float32's denormal range (those the flushes act on). */
function rand(n: number, seed: number): Float32Array {
  const a = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    a[i] = (s / 4294967296 - 0.5) * 2 * (s % 40 === 7 ? 2 ** -127 : 1);
  }
  return a;
}

function reference(c: Case, A: Float32Array, B: Float32Array, C0: Float32Array, i: number, j: number): number {
  const a = (k: number) => bf16(c.ta ? A[k * c.lda + i] : A[i * c.lda + k]);
  const b = (k: number) => bf16(c.tb ? B[j * c.ldb + k] : B[k * c.ldb + j]);
  let s = 0;
  for (let k0 = 0; k0 < c.K; k0 += 32) {
    let e = 0,
      o = 0;
    for (let k = k0; k < k0 + 32; k += 2) {
      e = k < c.K ? fmaFtz(a(k), b(k), e) : fmaFtz(0, 0, e); // past K: zeros (the padding)
      o = k + 1 < c.K ? fmaFtz(a(k + 1), b(k + 1), o) : fmaFtz(0, 0, o);
    }
    s = ftz(Math.fround(s + ftz(Math.fround(e + o))));
  }
  const beta = Math.fround(c.beta),
    old = ftz(C0[i * c.ldc + j]);
  return beta === 0 ? s : beta === 1 ? ftz(Math.fround(old + s)) : fmaFtz(ftz(beta), old, s);
}

/** scale: A, B and C's old values times these (tiny ones make the products and sums denormal, where the flushes
 *  decide the bits). */
function check(c: Case, seed: number, samples = 0, scale: [number, number, number] = [1, 1, 1]): void {
  const { gemm } = builtinGemmBf16()!;
  const A = rand(Math.max(1, (c.ta ? c.K : c.M) * c.lda), seed).map((x) => x * scale[0]),
    B = rand(Math.max(1, (c.tb ? c.N : c.K) * c.ldb), seed + 1).map((x) => x * scale[1]),
    C0 = rand(Math.max(1, c.M * c.ldc), seed + 2).map((x) => x * scale[2]);
  if (c.beta === 0) C0.fill(Number.NaN);
  const label = `${c.ta ? "T" : "N"}${c.tb ? "T" : "N"} M=${c.M} N=${c.N} K=${c.K} beta=${c.beta} ld=${c.lda}/${c.ldb}/${c.ldc}`;
  const outs = kernels().map((isa) => {
    const C = C0.slice();
    gemm(isa, c.ta, c.tb, c.M, c.N, c.K, 1, A, c.lda, B, c.ldb, c.beta, C, c.ldc);
    return { isa, C };
  });
  checkKernelOutputs({
    label,
    outs,
    C0,
    M: c.M,
    N: c.N,
    ldc: c.ldc,
    samples,
    reference: (i, j) => reference(c, A, B, C0, i, j),
  });
}

const mk = (ta: boolean, tb: boolean, M: number, N: number, K: number, beta: number, pad = 0): Case => ({
  ta,
  tb,
  M,
  N,
  K,
  beta,
  lda: (ta ? M : K) + pad,
  ldb: (tb ? K : N) + pad,
  ldc: N + pad,
});

test("bf16 rounding: ties to even, denormals read as 0, overflow to infinity, NaN kept (K = 1 against 1.0)", {
  skip,
}, () => {
  const { gemm } = builtinGemmBf16()!;
  const xs = [
    1 + 2 ** -8, // a tie: to even (1)
    1 + 3 * 2 ** -8, // a tie: to even (1 + 2^-6)
    1 + 2 ** -8 + 2 ** -20, // above the tie: up
    -(1 + 2 ** -8),
    2 ** -126 * (1 - 2 ** -20), // a denormal that would round up to the smallest normal: read as 0
    -(2 ** -130),
    2 ** -126,
    3.3895313892515355e38, // the largest bf16
    3.4e38, // rounds past it: infinity
    Number.NaN,
    0.1,
    -7.123456,
  ].map(Math.fround);
  for (const isa of kernels()) {
    const A = Float32Array.from(xs),
      B = Float32Array.of(1),
      C = new Float32Array(xs.length);
    gemm(isa, false, false, xs.length, 1, 1, 1, A, 1, B, 1, 0, C, 1);
    // s = fma(bf16(x), 1, +0): bf16(x) itself, but a -0 comes out +0 (as +0 + -0 does)
    xs.forEach((x, i) => {
      const want = ftz(fmaf(bf16(x), 1, 0));
      assert.ok(Object.is(C[i], want), `${isa}: bf16(${x}) * 1 = ${C[i]}, want ${want}`);
    });
  }
});

test("every bf16 kernel gives the documented order's bits: odd and even K, every transpose, beta, padding", {
  skip,
  timeout: 600_000,
}, () => {
  let seed = 1;
  for (const [ta, tb] of [
    [false, false],
    [false, true],
    [true, false],
    [true, true],
  ] as const)
    for (const [M, N, K] of [
      [1, 1, 1],
      [7, 17, 2],
      [9, 33, 63],
      [17, 65, 545], // K over the AMX kernel's block of 512, odd
      [64, 64, 256],
      [13, 37, 770],
      [5, 33, 2113], // K over the AMX kernel's one-block limit (2048): blocks of 512, the workspace for beta
    ])
      for (const beta of [0, 1, -0.35])
        for (const pad of [0, 3]) check(mk(ta, tb, M, N, K, beta, pad), seed++, M * N > 1024 ? 96 : 0);
});

test("each chunk's even and odd sums meet the running sum as acc + (e + o), never (acc + e) + o: 1 + 2^-23 where that order gives 1, on every kernel, tile edge and K block (P8)", {
  skip,
}, () => {
  const { gemm } = builtinGemmBf16()!;
  // the first chunk leaves acc = 1 (k = 0: 1 x 1); the last one has e = o = 2^-24 (its first even and odd k:
  // 2^-12 x 2^-12), every other product 0. acc + (e + o) = 1 + 2^-23; (acc + e) + o rounds 1 + 2^-24 to even (1)
  // twice. K: one chunk beyond the first, and enough for several K blocks on every kernel (the sum crosses them),
  // the last chunk cut by K
  for (const K of [64, 33 * 32, 2146])
    for (const [M, N] of [
      [1, 1],
      [13, 37],
      [40, 70],
    ]) {
      const last = Math.floor((K - 1) / 32) * 32;
      const A = new Float32Array(M * K),
        B = new Float32Array(K * N);
      for (let i = 0; i < M; i++) {
        A[i * K] = 1;
        A[i * K + last] = 2 ** -12;
        A[i * K + last + 1] = 2 ** -12;
      }
      for (let j = 0; j < N; j++) {
        B[j] = 1;
        B[last * N + j] = 2 ** -12;
        B[(last + 1) * N + j] = 2 ** -12;
      }
      for (const isa of kernels())
        for (const beta of [0, 1]) {
          const C = new Float32Array(M * N);
          gemm(isa, false, false, M, N, K, 1, A, K, B, N, beta, C, N);
          const bad = C.findIndex((x) => x !== 1 + 2 ** -23);
          assert.equal(bad, -1, `${isa} M=${M} N=${N} K=${K} beta=${beta}: C[${bad}] = ${C[bad]}, want 1 + 2^-23`);
        }
    }
});

test("denormal products, sums and old C values are flushed to 0 on every kernel", { skip }, () => {
  let seed = 300;
  for (const [ta, tb] of [
    [false, false],
    [true, true],
  ] as const)
    for (const K of [1, 2, 5, 40])
      for (const beta of [0, 1, -0.35]) check(mk(ta, tb, 9, 35, K, beta), seed++, 0, [2 ** -118, 2 ** -12, 2 ** -126]);
});

test("the frozen model's shapes at seq 256 in bf16 (sampled elements, all kernels identical)", {
  skip,
  timeout: 600_000,
}, () => {
  let seed = 500;
  for (const [ta, tb, M, N, K] of [
    [false, true, 256, 576, 576], // forward x W^T
    [false, false, 256, 576, 1536], // backward dx = dy W
    [true, false, 1536, 576, 256], // dW = dy^T x
    [false, false, 64, 256, 64], // attention scores
  ] as Array<[boolean, boolean, number, number, number]>)
    for (const beta of [0, 1]) check(mk(ta, tb, M, N, K, beta), seed++, 48);
});

test("gemmBf16 refuses an alpha other than 1 and names the kernels", { skip }, () => {
  const { gemm } = builtinGemmBf16()!;
  const a = new Float32Array(4);
  assert.throws(() => gemm("portable", false, false, 2, 2, 1, 0.5, a, 1, a, 2, 0, a, 2), /alpha must be 1/);
  assert.throws(() => gemm("sse" as "portable", false, false, 2, 2, 1, 1, a, 1, a, 2, 0, a, 2), /amx/);
});

/** n values of one input class: the edges of the order's arithmetic (denormals read as 0, products and sums near
 *  2^-126 where x86's flush decides, exact cancellation, rounding ties, infinities, NaN, overflow). */
function classValues(cls: string, n: number, seed: number): Float32Array {
  const r = rand(n, seed);
  const pick = (xs: number[]) => r.map((x, i) => xs[(((x + 1) * 1e6) | 0) % xs.length] * (i % 2 ? 1 : -1));
  switch (cls) {
    case "normal":
      return r;
    case "denormal": // denormal inputs (read as 0) among normal ones
      return r.map((x, i) => (i % 3 === 0 ? x * 2 ** -127 : x));
    case "tiny": // products and chain sums about 2^-126: the flushes and x86's window below 2^-126
      return r.map((x) => x * 2 ** -63);
    case "cancel": // sums that cancel exactly and nearly
      return pick([1, 1 + 2 ** -7, 2 ** -8, 3, 0.5, 1 - 2 ** -8]);
    case "ties": // sums that land on half an ulp
      return pick([1, 2 ** -12, 2 ** -13, 1 + 2 ** -7, 2 ** -24, 3 * 2 ** -12]);
    default: // specials: signed zeros, infinities, NaN, the largest values, among ordinary ones
      return r.map((x, i) =>
        i % 4 === 0 ? [0, -0, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, Number.NaN, 3e38, -3e38][i % 7] : x,
      );
  }
}

test("the VDPBF16PS kernel gives the portable emulation's bits: every tile edge, K not a multiple of 32, several K blocks, every beta, every input class (NaN where it gives NaN)", {
  skip: skip || (builtinGemmBf16()?.dp ? false : `no VDPBF16PS kernel here: ${builtinGemmBf16()?.check}`),
  timeout: 600_000,
}, () => {
  const { gemm } = builtinGemmBf16()!;
  const u32 = (a: Float32Array) => new Uint32Array(a.buffer, a.byteOffset, a.length);
  let seed = 900,
    cases = 0;
  for (const [M, N, K] of [
    [1, 1, 1],
    [5, 31, 31], // under one register tile (6 x 32) and one chunk (32)
    [6, 32, 32], // one tile, one chunk
    [7, 33, 33], // one over each
    [13, 17, 95],
    [12, 64, 64],
    [19, 100, 65],
    [385, 33, 70], // rows over the A block (384)
    [7, 65, 641], // K over the one-block limit (640): two K blocks
    [11, 40, 1100], // three K blocks of 512: the sums wait in the workspace band where beta != 0
  ])
    for (const [ta, tb] of [
      [false, false],
      [false, true],
      [true, false],
      [true, true],
    ] as const)
      for (const beta of [0, 1, 0.75, -2])
        for (const cls of ["normal", "denormal", "tiny", "cancel", "ties", "special"]) {
          const c = mk(ta, tb, M, N, K, beta, seed % 2 ? 3 : 0);
          const A = classValues(cls, Math.max(1, (ta ? K : M) * c.lda), seed++),
            B = classValues(cls, Math.max(1, (tb ? N : K) * c.ldb), seed++),
            C0 = classValues(cls === "special" ? "normal" : cls, Math.max(1, M * c.ldc), seed++);
          const want = C0.slice(),
            got = C0.slice();
          gemm("portable", ta, tb, M, N, K, 1, A, c.lda, B, c.ldb, beta, want, c.ldc);
          gemm("avx512bf16", ta, tb, M, N, K, 1, A, c.lda, B, c.ldb, beta, got, c.ldc);
          const w = u32(want),
            g = u32(got);
          for (let i = 0; i < w.length; i++)
            if (w[i] !== g[i] && !(Number.isNaN(want[i]) && Number.isNaN(got[i])))
              assert.fail(
                `${cls} ${ta ? "T" : "N"}${tb ? "T" : "N"} M=${M} N=${N} K=${K} beta=${beta} ld=${c.lda}/${c.ldb}/${c.ldc}: element ${i} is ${got[i]} (0x${g[i].toString(16)}) on VDPBF16PS, ${want[i]} (0x${w[i].toString(16)}) on the portable emulation`,
              );
          cases++;
        }
  assert.equal(cases, 10 * 4 * 4 * 6);
});

test("x86's flush on every kernel, the portable one included: a chain or a beta combine whose exact value lies just below 2^-126 is 0 where x86 rounds it under 2^-126, 2^-126 where it does not", {
  skip,
}, () => {
  const { gemm } = builtinGemmBf16()!;
  // the exact value 2^-126 - q 2^-151: q 1.5 and 2 lie in [2^-126 - 2^-150, 2^-126 - 2^-151), where IEEE rounds up to
  // 2^-126 and x86 (24 bits, unbounded exponent) rounds under it and flushes; q 1 is the tie (to even: 2^-126), q
  // 0.5 rounds up either way, q 2.5 is denormal either way
  for (const [q, want] of [
    [0.5, 2 ** -126],
    [1, 2 ** -126],
    [1.5, 0],
    [2, 0],
    [2.5, 0],
  ]) {
    assert.ok(Object.is(fmaFtz(-(2 ** -75), q * 2 ** -76, 2 ** -126), want), `the reference at q ${q}`);
    for (const isa of kernels()) {
      // the even chain: fma(1, 2^-126, 0) = 2^-126, then fma(-2^-75, q 2^-76, 2^-126)
      const C = new Float32Array(1);
      gemm(
        isa,
        false,
        false,
        1,
        1,
        3,
        1,
        Float32Array.of(1, 0, -(2 ** -75)),
        3,
        Float32Array.of(2 ** -126, 0, q * 2 ** -76),
        1,
        0,
        C,
        1,
      );
      assert.ok(Object.is(C[0], want), `${isa}, the chain, q ${q}: ${C[0]} (want ${want})`);
      // the combine: fma(beta 2^-30, C -q 2^-121, acc 2^-126)
      const D = Float32Array.of(-q * 2 ** -121);
      gemm(isa, false, false, 1, 1, 1, 1, Float32Array.of(1), 1, Float32Array.of(2 ** -126), 1, 2 ** -30, D, 1);
      assert.ok(Object.is(D[0], want), `${isa}, the beta combine, q ${q}: ${D[0]} (want ${want})`);
    }
  }
});
