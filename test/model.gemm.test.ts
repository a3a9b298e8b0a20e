/**
 * The built-in GEMM (native/gemm/): every kernel (AVX-512, AVX2, portable; those this CPU runs) against an
 * exact reference of its documented order of summation (a = fround(alpha*A[i,k]); s = 0; s = fma(a, B[k,j], s)
 * for k = 0..K-1; C = s, or fma(beta, C, s)), emulated bit for bit in float64, on every transpose flag, alpha,
 * beta and leading dimension, on shapes that are not multiples of the blocking (1, 7, 17, 63, 65, 577, 1537 in
 * each dimension) and on the frozen model's shapes; the kernels' bits do not depend on the operands' alignment.
 * With TSTRAIN_REQUIRE_NATIVE=1 an addon that does not load fails these tests instead of skipping them.
 */
import { test } from "node:test";
import { spawnSync } from "node:child_process";
import assert from "node:assert/strict";
import { loadNative, supportedIsas } from "../src/model/engine/native";
import { builtinGemm } from "../bench/native-probes";
import { fmaf, nextUp } from "./helpers/numeric";
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
  alpha: number;
  beta: number;
  lda: number;
  ldb: number;
  ldc: number;
}

function rand(n: number, seed: number): Float32Array {
  const a = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    a[i] = (s / 4294967296 - 0.5) * 2;
  }
  return a;
}

/** The documented order, element (i, j); alpha and beta are float32 inside the GEMM. */
function reference(c: Case, A: Float32Array, B: Float32Array, C0: Float32Array, i: number, j: number): number {
  const alpha = Math.fround(c.alpha),
    beta = Math.fround(c.beta);
  let s = 0;
  for (let k = 0; k < c.K; k++) {
    const a = c.ta ? A[k * c.lda + i] : A[i * c.lda + k];
    const b = c.tb ? B[j * c.ldb + k] : B[k * c.ldb + j];
    s = fmaf(alpha === 1 ? a : Math.fround(alpha * a), b, s);
  }
  const old = C0[i * c.ldc + j];
  return beta === 0 ? s : fmaf(beta, old, s);
}

function operands(c: Case, seed: number) {
  const rowsA = c.ta ? c.K : c.M,
    rowsB = c.tb ? c.N : c.K;
  const A = rand(Math.max(1, rowsA * c.lda), seed),
    B = rand(Math.max(1, rowsB * c.ldb), seed + 1);
  const C0 = rand(Math.max(1, c.M * c.ldc), seed + 2);
  if (c.beta === 0) C0.fill(NaN); // beta 0 ignores C, NaN included
  return { A, B, C0 };
}

/** Runs the case on every kernel; checks each against the reference on `samples` elements (all when 0) and
 *  returns the kernels' outputs (which must be identical). */
function check(c: Case, seed: number, samples = 0): void {
  const g = builtinGemm()!;
  const { A, B, C0 } = operands(c, seed);
  const outs = supportedIsas().map((isa) => {
    const C = C0.slice();
    g(isa, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A, c.lda, B, c.ldb, c.beta, C, c.ldc);
    return { isa, C };
  });
  const label = `${c.ta ? "T" : "N"}${c.tb ? "T" : "N"} M=${c.M} N=${c.N} K=${c.K} alpha=${c.alpha} beta=${c.beta} ld=${c.lda}/${c.ldb}/${c.ldc}`;
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

function mk(ta: boolean, tb: boolean, M: number, N: number, K: number, alpha: number, beta: number, pad = 0): Case {
  return { ta, tb, M, N, K, alpha, beta, lda: (ta ? M : K) + pad, ldb: (tb ? K : N) + pad, ldc: N + pad };
}

const DIMS = [1, 7, 17, 63, 65, 577, 1537];
const FLAGS: Array<[boolean, boolean]> = [
  [false, false],
  [false, true],
  [true, false],
  [true, true],
];

test("the fma emulation is exact where float64 rounding twice would not be", () => {
  // 1 + 2^-24 is a float32 tie; the product's tail 2^-60 decides it: fma rounds up, fround(a*b + c) would not.
  const a = 1 + 2 ** -23,
    b = 1 + 2 ** -23; // a*b = 1 + 2^-22 + 2^-46
  assert.equal(fmaf(a, b, -(2 ** -22)), Math.fround(1 + 2 ** -46));
  const t = Math.fround(1 + 2 ** -23);
  assert.equal(fmaf(t, 1, 2 ** -24 + 2 ** -50), nextUp(t), "a tie broken by the tail rounds away from the even float");
  assert.equal(fmaf(t, 1, 2 ** -24 - 2 ** -50), t);
  assert.equal(fmaf(1, 1, 2 ** -24), 1, "an exact tie rounds to even");
});

test("every kernel gives the documented order's bits: each dimension over 1, 7, 17, 63, 65, 577, 1537, every transpose", {
  skip,
  timeout: 600_000,
}, () => {
  assert.ok(supportedIsas().includes("portable"));
  let seed = 1;
  for (const d of DIMS)
    for (const [ta, tb] of FLAGS) {
      check(mk(ta, tb, d, 17, 65, 1, 0), seed++);
      check(mk(ta, tb, 63, d, 17, 1, 1), seed++);
      check(mk(ta, tb, 17, 65, d, 0.125, 0), seed++);
      check(mk(ta, tb, 7, 63, d, 1, 1), seed++); // K over several blocks with beta 1: chains in a workspace
    }
  // beta != 0 over several K blocks (K = 700: every kernel, AVX-512's one-block limit included) with a C of more
  // than 2^20 floats (the LM head's dE): C in bands of rows; 2,000 elements against the reference, every element
  // across the kernels
  for (const [ta, tb] of FLAGS) check(mk(ta, tb, 3600, 300, 700, -0.7, 1.5, 3), seed++, 2000);
});

test("alpha, beta (0 ignores NaN in C, 1, any other) and leading dimensions wider than the rows", {
  skip,
  timeout: 300_000,
}, () => {
  let seed = 100;
  for (const [ta, tb] of FLAGS)
    for (const alpha of [1, -0.7, 0.125])
      for (const beta of [0, 1, -0.35, 2])
        for (const pad of [0, 3]) {
          check(mk(ta, tb, 65, 33, 400, alpha, beta, pad), seed++);
          check(mk(ta, tb, 13, 47, 9, alpha, beta, pad), seed++);
        }
  check({ ta: false, tb: false, M: 5, N: 6, K: 0, alpha: 1, beta: 0, lda: 1, ldb: 6, ldc: 6 }, seed++);
  check({ ta: false, tb: false, M: 5, N: 6, K: 0, alpha: 1, beta: 2, lda: 1, ldb: 6, ldc: 6 }, seed++);
});

test("A stored [M,K] with whole row tiles, read in place: edge columns, several K and M blocks, every beta", {
  skip,
  timeout: 300_000,
}, () => {
  // M a multiple of both kernels' row tiles (8, 6) and over the small-product limit (64): blocked() reads A's rows in
  // place instead of packing them; N leaves a cut column tile, K = 600 runs in several K blocks, M = 240 in two M
  // blocks of the AVX-512 kernel
  let seed = 300;
  for (const tb of [false, true])
    for (const [M, N, K] of [
      [96, 45, 600],
      [240, 77, 600],
      [240, 64, 100],
    ])
      for (const beta of [0, 1, -0.35]) for (const pad of [0, 3]) check(mk(false, tb, M, N, K, 1, beta, pad), seed++);
});

test("A stored [M,K] read in place with a last row tile cut by M (the LM head's 341-row chunks), every beta", {
  skip,
  timeout: 300_000,
}, () => {
  // M over the small-product limit and not a multiple of the AVX-512 row tile (8): blocked() reads A's rows in place
  // and its last row tile reads the 8 rows that end at M, keeping only its new ones; K = 700 runs in two K blocks
  // (beta 0: the chains continue in C; beta != 0: in the workspace, where A is packed instead)
  let seed = 400;
  for (const tb of [false, true])
    for (const [M, N, K] of [
      [341, 45, 600],
      [101, 77, 100],
      [75, 64, 700],
    ])
      for (const beta of [0, 1, -0.35]) for (const pad of [0, 3]) check(mk(false, tb, M, N, K, 1, beta, pad), seed++);
});

test("the frozen model's shapes at seq 256 (sampled elements against the documented order, all kernels identical)", {
  skip,
  timeout: 600_000,
}, () => {
  const T = 256,
    D = 576,
    F = 1536,
    KV = 192;
  let seed = 500;
  for (const [ta, tb, M, N, K] of [
    [false, true, T, D, D],
    [false, true, T, KV, D],
    [false, true, T, F, D],
    [false, true, T, D, F], // forward x W^T
    [false, false, T, D, D],
    [false, false, T, D, F], // backward dx = dy W
    [true, false, D, D, T],
    [true, false, F, D, T],
    [true, false, D, F, T], // dW = dy^T x
    [false, true, 64, T, 64],
    [false, false, 64, T, 64], // attention scores, keys laid out [E, T]
    [false, false, 64, 64, T],
    [true, false, 64, 64, T], // attention per head
  ] as Array<[boolean, boolean, number, number, number]>) {
    check(mk(ta, tb, M, N, K, 1, 0), seed++, 64);
    check(mk(ta, tb, M, N, K, 1, 1), seed++, 64);
  }
});

test("products with few rows, run straight from their operands, give the documented order's bits", {
  skip,
  timeout: 300_000,
}, () => {
  // up to 64 rows, B stored [K,N], alpha 1: the AVX2 and AVX-512 kernels read A and B in place (no packing, the
  // whole K in one chain; the last row and column tiles overlap the ones before when M or N is not a whole number
  // of tiles); the portable kernel, and the float64 emulation, must agree
  let seed = 700;
  for (const ta of [false, true])
    for (const [M, N] of [
      [8, 32],
      [64, 64],
      [40, 96],
      [13, 45],
      [61, 17],
    ])
      for (const K of [1, 7, 300, 1537])
        for (const beta of [0, 1, -0.35])
          for (const pad of [0, 3]) check(mk(ta, false, M, N, K, 1, beta, pad), seed++, M * N > 2048 ? 64 : 0);
  // A stored [K,M] inside a wider matrix whose rows lie a page or more apart (attention's dk and dv at T >= 1024):
  // copied dense before the tiles run, the same chains
  for (const [M, N, lda] of [
    [64, 64, 1024],
    [13, 45, 1031],
  ])
    for (const K of [7, 300])
      for (const beta of [0, 1])
        check({ ta: true, tb: false, M, N, K, alpha: 1, beta, lda, ldb: N + 3, ldc: N }, seed++, M * N > 2048 ? 64 : 0);
});

test("the bits do not depend on the operands' alignment (views at every float offset within a cache line)", {
  skip,
}, () => {
  const g = builtinGemm()!;
  // packed, and read in place (few rows: A stored [M,K] and [K,M])
  for (const c of [
    mk(false, true, 37, 45, 300, 1, 1),
    mk(false, false, 16, 64, 300, 1, 1),
    mk(true, false, 16, 64, 300, 1, 0),
  ]) {
    const { A, B, C0 } = operands(c, 900);
    let ref: Float32Array | null = null;
    for (const isa of supportedIsas())
      for (const off of [0, 1, 2, 3, 5, 8, 15]) {
        const a = new Float32Array(A.length + 16).subarray(off),
          b = new Float32Array(B.length + 16).subarray((off * 7) % 16);
        const cc = new Float32Array(C0.length + 16).subarray((off * 3) % 16);
        a.set(A);
        b.set(B);
        cc.set(C0);
        g(isa, c.ta, c.tb, c.M, c.N, c.K, c.alpha, a, c.lda, b, c.ldb, c.beta, cc, c.ldc);
        const out = cc.slice(0, C0.length);
        if (!ref) ref = out;
        else assert.deepEqual(new Uint32Array(out.buffer), new Uint32Array(ref.buffer), `${isa} at offset ${off}`);
      }
  }
});

test("the kernels' matmul (the engine's entry point) runs the same GEMM: --isa forced per kernels object", {
  skip,
}, () => {
  const c = mk(true, false, 50, 70, 90, 1, 1);
  const { A, B, C0 } = operands(c, 1000);
  const outs = supportedIsas().map((isa) => {
    const n = loadNative({ gemm: "builtin", isa });
    assert.ok("kernels" in n, `--isa ${isa} loads`);
    assert.match(n.kernels.name, new RegExp(`built-in ${isa}`));
    const C = C0.slice();
    n.kernels.matmul(c.ta, c.tb, c.M, c.N, c.K, 1, A, B, 1, C);
    return C;
  });
  for (const o of outs.slice(1)) assert.deepEqual(new Uint32Array(o.buffer), new Uint32Array(outs[0].buffer));
  assert.ok(supportedIsas().length >= 1);
});

test("gemm with calls (the bench's timing) runs the product that many times and returns CPU seconds", { skip }, () => {
  const g = builtinGemm()!;
  const c = mk(false, true, 40, 50, 300, 1, 1);
  const { A, B, C0 } = operands(c, 1200);
  for (const isa of supportedIsas()) {
    const once = C0.slice();
    for (let i = 0; i < 3; i++) g(isa, c.ta, c.tb, c.M, c.N, c.K, 1, A, c.lda, B, c.ldb, 1, once, c.ldc);
    const timed = C0.slice();
    const s = g(isa, c.ta, c.tb, c.M, c.N, c.K, 1, A, c.lda, B, c.ldb, 1, timed, c.ldc, 3);
    assert.ok(typeof s === "number" && s > 0 && s < 60, `${isa}: ${s} s`);
    assert.deepEqual(
      new Uint32Array(timed.buffer),
      new Uint32Array(once.buffer),
      `${isa}: three products, C += AB each`,
    );
    assert.equal(g(isa, c.ta, c.tb, c.M, c.N, c.K, 1, A, c.lda, B, c.ldb, 1, timed, c.ldc), undefined);
  }
  assert.throws(
    () => g("auto", c.ta, c.tb, c.M, c.N, c.K, 1, A, c.lda, B, c.ldb, 0, C0.slice(), c.ldc, 0),
    /calls must be a number from 1 to 1e6/,
  );
});

test("a kernel this CPU lacks is refused by name with the fix, and a bad name is a RangeError", { skip }, () => {
  const g = builtinGemm()!;
  assert.throws(
    () =>
      g(
        "sse9" as never,
        false,
        false,
        1,
        1,
        1,
        1,
        new Float32Array(1),
        1,
        new Float32Array(1),
        1,
        0,
        new Float32Array(1),
        1,
      ),
    /isa must be auto, avx512, avx2 or portable/,
  );
  assert.throws(
    () =>
      g("auto", false, false, 2, 2, 2, 1, new Float32Array(3), 2, new Float32Array(4), 2, 0, new Float32Array(4), 2),
    /A has 3 elements, the shapes need 4/,
  );
  assert.throws(
    () =>
      g("auto", false, false, 2, 2, 2, 1, new Float32Array(4), 1, new Float32Array(4), 2, 0, new Float32Array(4), 2),
    /leading dimension/,
  );
  const missing = (["avx512", "avx2"] as const).filter((i) => !supportedIsas().includes(i));
  for (const isa of missing) {
    const n = loadNative({ gemm: "builtin", isa });
    assert.ok("reason" in n && /this CPU has no/.test(n.reason) && /--isa auto/.test(n.fix), JSON.stringify(n));
  }
});

test("worker threads that multiply and exit leave a process that exits cleanly (the addon loaded only in workers)", {
  skip,
  timeout: 120_000,
}, () => {
  // Node unloads an addon when the last environment that loaded it ends; per-thread GEMM buffers must not leave
  // a destructor behind in unloaded code (it crashed the next exiting thread: SIGSEGV at the end of a run whose
  // main thread never multiplied, e.g. --no-sample).
  const native = require.resolve("../src/model/engine/native");
  const script = `
    const { Worker } = require("node:worker_threads");
    const body = ${JSON.stringify(`
      const n = require(${JSON.stringify(native)}).loadNative();
      const a = new Float32Array(64 * 64).fill(1), c = new Float32Array(64 * 64);
      n.kernels.matmul(false, false, 64, 64, 64, 1, a, a, 0, c);
      if (c[0] !== 64) throw new Error("matmul gave " + c[0]);
    `)};
    const run = () => new Promise((res, rej) => { const w = new Worker(body, { eval: true }); w.on("error", rej); w.on("exit", res); });
    (async () => { await Promise.all([run(), run()]); await run(); await Promise.all([run(), run(), run()]); console.log("done"); })();`;
  const r = spawnSync(process.execPath, ["-e", script], { encoding: "utf8", timeout: 100_000 });
  assert.equal(r.signal, null, `the process died of ${r.signal}: ${r.stderr}`);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /done/);
});
