// The step math: LR (P5), loss scaler (P2), clipping (P4), the reduce and the fold (A10), AdamW (P3).
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  lrFactor,
  newScaler,
  scalerUpdate,
  clipCoef,
  slices,
  validScaler,
  ADAMW_DEFAULTS,
  chunkCount,
  chunkSquares,
  foldMicro,
  reduceChunks64,
  SQ_CHUNK,
  SQ_LANES,
  sumSlots64,
  totalSquares,
  unscaleInto,
} from "../src/optim/optim";
import { adamwSliceSimd, type AdamwKernel } from "../src/optim/optim-simd";
import { adamwSlice as adamwRef } from "./helpers/optim-reference";
import { nativeAdamw, nativeFold, nativeReduce, supportedIsas } from "../src/model/engine/native";

// The AdamW kernels to hold: the wasm one always; the addon's C one where it loads (under TSTRAIN_REQUIRE_NATIVE=1,
// as in CI, an addon that does not load fails the native test instead of skipping it).
const nativeSkip =
  (nativeAdamw() && nativeFold() && nativeReduce()) || process.env.TSTRAIN_REQUIRE_NATIVE === "1"
    ? false
    : "the native addon does not load (npm run build:native)";

test("the trapezoid LR equals the original script's formula at k = 0, warmup-1, warmup, decay_start and steps-1 (P5)", () => {
  // steps 1000: warmup = max(100, int(1000*0.02)) = 100, decay_start = int(1000*0.8) = 800
  const s = { warmup: 100, decayStart: 800, total: 1000 };
  assert.equal(lrFactor(0, s), 1 / 100);
  assert.equal(lrFactor(99, s), 1.0);
  assert.equal(lrFactor(100, s), 1.0);
  assert.equal(lrFactor(800, s), 1.0);
  assert.equal(lrFactor(801, s), 1 - 1 / 200);
  assert.equal(lrFactor(999, s), 1 - 199 / 200);
  assert.equal(lrFactor(1000, s), 0);
  assert.equal(lrFactor(5000, s), 0, "never negative past the horizon");
});

test("a warmup longer than the decay start still follows LambdaLR's branch order (P5)", () => {
  const s = { warmup: 100, decayStart: 40, total: 50 };
  assert.equal(lrFactor(45, s), 46 / 100);
  assert.equal(lrFactor(100, s), 0);
});

test("an overflow skips the step and halves the scale; growth restarts (P2)", () => {
  let s = newScaler();
  assert.equal(s.scale, 65536);
  s = scalerUpdate(s, false);
  s = scalerUpdate(s, false);
  assert.equal(s.growthTracker, 2);
  s = scalerUpdate(s, true);
  assert.deepEqual(s, { scale: 32768, growthTracker: 0 });
});

test("2000 clean steps double the scale, 1999 do not (P2)", () => {
  let s = newScaler();
  for (let i = 0; i < 1999; i++) s = scalerUpdate(s, false);
  assert.equal(s.scale, 65536);
  assert.equal(s.growthTracker, 1999);
  s = scalerUpdate(s, false);
  assert.deepEqual(s, { scale: 131072, growthTracker: 0 });
  assert.ok(validScaler(s));
  assert.ok(!validScaler({ scale: -1, growthTracker: 0 }));
});

test("a saved scaler state is accepted only with a finite positive scale and a whole growth count in [0, 2000) (P2)", () => {
  assert.equal(validScaler({ scale: 65536, growthTracker: 0 }), true);
  assert.equal(validScaler({ scale: 1e-3, growthTracker: 1999 }), true, "the last count before growth");
  for (const bad of [
    null,
    undefined,
    65536,
    "65536",
    { scale: 0, growthTracker: 0 },
    { scale: -2, growthTracker: 0 },
    { scale: Number.NaN, growthTracker: 0 },
    { scale: Number.POSITIVE_INFINITY, growthTracker: 0 },
    { growthTracker: 0 },
    { scale: 65536, growthTracker: -1 },
    { scale: 65536, growthTracker: 2000 },
    { scale: 65536, growthTracker: 1.5 },
    { scale: 65536 },
    Object.assign(() => 0, { scale: 65536, growthTracker: 0 }),
  ])
    assert.equal(validScaler(bad), false, `refused: ${JSON.stringify(bad)}`);
});

test("the clip coefficient is min(1, max/(norm+1e-6)) (P4)", () => {
  assert.equal(clipCoef(0.5), 1);
  assert.equal(clipCoef(2.2806797437103916), 1 / (2.2806797437103916 + 1e-6));
});

for (const kernel of ["js", "native"] as const)
  test(`reduce (${kernel}) averages the slots, unscales, and reports the sum of squares and non-finite values`, {
    skip: kernel === "native" ? nativeSkip : false,
  }, () => {
    const run = (slots: Float64Array[], inv: number) => {
      const P = slots[0].length,
        grad = new Float32Array(P),
        sq = new Float64Array(chunkCount(P));
      reduceChunks64(slots, grad, inv, P, sq, 0, sq.length, kernel === "js" ? "js" : "auto");
      return { grad: [...grad], ...totalSquares(sq) };
    };
    const r = run([new Float64Array([2, 4, 6, 8]), new Float64Array([2, 0, -2, 0])], 1 / 4);
    assert.deepEqual(r.grad, [1, 1, 1, 2]);
    assert.equal(r.sumSq, 7);
    assert.equal(r.finite, true);
    const r3 = run([new Float64Array([3, 3]), new Float64Array([3, 0]), new Float64Array([0, 3])], 1 / 3);
    assert.deepEqual(r3.grad, [2, 2], "three slots: the generic path");
    assert.equal(r3.sumSq, 8);
    assert.equal(run([new Float64Array([1, Number.POSITIVE_INFINITY])], 1).finite, false);
    assert.equal(run([new Float64Array([1, Number.NaN])], 1).finite, false);
  });

test("slices cover [0, total) without gaps or overlaps", () => {
  for (const [total, parts] of [
    [10, 3],
    [7, 7],
    [5, 1],
    [106194240, 2],
  ] as const) {
    const s = slices(total, parts);
    assert.equal(s[0][0], 0);
    assert.equal(s[s.length - 1][1], total);
    for (let i = 1; i < s.length; i++) assert.equal(s[i][0], s[i - 1][1]);
  }
});

for (const [impl, adamwSlice, skip] of [
  ["reference", adamwRef, false],
  ["wasm", (...a: Parameters<typeof adamwRef>) => adamwSliceSimd(...a, "wasm"), false],
  ["native", (...a: Parameters<typeof adamwRef>) => adamwSliceSimd(...a, "native"), nativeSkip],
] as const)
  test(`AdamW (${impl}) decays 2-D weights only and takes a sign-sized first step (P3)`, { skip }, () => {
    const p = new Float32Array([1, 1, 1, 1]);
    const m = new Float32Array(4),
      v = new Float32Array(4);
    const g = new Float32Array([0.5, -0.5, 0.5, -0.5]);
    adamwSlice(
      p,
      m,
      v,
      g,
      [
        { lo: 0, hi: 2, decay: true },
        { lo: 2, hi: 4, decay: false },
      ],
      0,
      4,
      { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 },
      1,
      1,
    );
    assert.ok(Math.abs(p[0] - (1 * (1 - 1e-4) - 1e-3)) < 1e-7);
    assert.ok(Math.abs(p[1] - (1 * (1 - 1e-4) + 1e-3)) < 1e-7);
    assert.ok(Math.abs(p[2] - (1 - 1e-3)) < 1e-7);
    assert.ok(Math.abs(p[3] - (1 + 1e-3)) < 1e-7);
  });

test("the wasm AdamW kernel matches the reference loop within float32 rounding, on odd slices (P3)", () => {
  let seed = 99;
  const rnd = () => {
    seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
    return seed / 2 ** 32 - 0.5;
  };
  const P = 3 * 4096 + 4103; // several kernel chunks and a tail that is not a multiple of 4
  const fill = (scale: number) => Float32Array.from({ length: P }, () => rnd() * scale);
  const g = fill(2e-3);
  const ranges = [
    { lo: 0, hi: 5000, decay: true },
    { lo: 5000, hi: 5577, decay: false },
    { lo: 5577, hi: P, decay: true },
  ];
  const state = () => ({
    p: fill(0.04),
    m: fill(2e-4),
    v: Float32Array.from({ length: P }, () => (rnd() + 0.5) * 1e-7),
  });
  const A = state(),
    B = { p: Float32Array.from(A.p), m: Float32Array.from(A.m), v: Float32Array.from(A.v) };
  const p0 = Float32Array.from(A.p);
  for (let t = 1; t <= 3; t++) {
    adamwRef(A.p, A.m, A.v, g, ranges, 7, P - 2, { lr: 3e-3, ...ADAMW_DEFAULTS }, 0.8, t);
    adamwSliceSimd(B.p, B.m, B.v, g, ranges, 7, P - 2, { lr: 3e-3, ...ADAMW_DEFAULTS }, 0.8, t, "wasm");
  }
  for (const key of ["p", "m", "v"] as const) {
    const x = A[key],
      y = B[key];
    let worst = 0,
      mag = 0;
    for (let i = 0; i < P; i++) {
      worst = Math.max(worst, Math.abs(x[i] - y[i]));
      mag = Math.max(mag, Math.abs(x[i]));
    }
    assert.ok(worst <= 1e-6 * mag, `${key}: max difference ${worst} against magnitude ${mag}`);
    assert.equal(y[0], x[0], `${key}: below the slice untouched`);
    assert.equal(y[P - 1], x[P - 1], `${key}: above the slice untouched`);
  }
  // Both moved from the common start (the comparison above is not between two unmoved copies): 3 steps of ~lr each.
  let moved = 0;
  for (let i = 7; i < P - 2; i++) if (Math.abs(B.p[i] - p0[i]) > 1e-3) moved++;
  assert.ok(moved > 0.5 * (P - 9), `only ${moved} of ${P - 9} weights in the slice moved by more than 1e-3`);
});

test("the native AdamW kernel gives the wasm kernel's bits on every instruction set, in place on shared memory, on odd slices and edge values", {
  skip: nativeSkip,
}, () => {
  const isas = supportedIsas().filter((x) => x !== "amx" && x !== "avx512bf16");
  assert.ok(isas.includes("portable"), `the instruction sets found: ${isas.join(", ")}`);
  let seed = 7;
  const rnd = () => {
    seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
    return seed / 2 ** 32 - 0.5;
  };
  const P = 2 * 4096 + 4101;
  const shared = (f: (i: number) => number) => {
    const a = new Float32Array(new SharedArrayBuffer(P * 4));
    for (let i = 0; i < P; i++) a[i] = f(i);
    return a;
  };
  // gradients: ordinary, zero, subnormal, large (its square overflows float32 to inf), and a NaN
  const g = shared((i) => (i % 97 === 0 ? 0 : i % 89 === 0 ? 1e-41 : i % 83 === 0 ? 3e19 : rnd() * 4e-3));
  g[P - 50] = Number.NaN;
  const state = () => ({
    p: shared(() => rnd() * 0.08),
    m: shared((i) => (i % 71 === 0 ? 0 : rnd() * 4e-4)),
    v: shared((i) => (i % 71 === 0 ? 0 : (rnd() + 0.5) * 2e-7)),
  });
  const W = state();
  const copies = isas.map((isa) => ({
    isa,
    x: { p: shared((i) => W.p[i]), m: shared((i) => W.m[i]), v: shared((i) => W.v[i]) },
  }));
  const edges = [W.p[4], W.p[P - 3], W.m[4], W.v[P - 3]];
  const ranges = [
    { lo: 0, hi: 3001, decay: true },
    { lo: 3001, hi: 3003, decay: false },
    { lo: 3003, hi: P, decay: true },
  ];
  const run = (x: typeof W, k: AdamwKernel, t: number, coef: number, lr: number) =>
    adamwSliceSimd(x.p, x.m, x.v, g, ranges, 5, P - 3, { lr, ...ADAMW_DEFAULTS }, coef, t, k);
  for (const [t, coef, lr] of [
    [1, 1, 3e-4],
    [2, 0.37, 2.9e-4],
    [1000, 1, 1e-5],
  ] as const) {
    run(W, "wasm", t, coef, lr);
    for (const { isa, x: N } of copies) {
      run(N, `native-${isa as "avx512" | "avx2" | "portable"}`, t, coef, lr);
      for (const key of ["p", "m", "v"] as const)
        for (let i = 0; i < P; i++)
          if (!Object.is(W[key][i], N[key][i]))
            assert.fail(`step ${t}, ${isa}: ${key}[${i}] is ${N[key][i]} native, ${W[key][i]} on wasm (g ${g[i]})`);
    }
  }
  const bad = "sse9" as unknown as "avx2";
  assert.throws(
    () => nativeAdamw()!(W.p, W.m, W.v, g, 0, 4, new Float32Array(9), bad),
    /isa must be avx512, avx2 or portable/,
  );
  assert.throws(
    () => nativeFold()!(new Float64Array(4), new Float32Array(4), true, bad),
    /isa must be avx512, avx2 or portable/,
  );
  for (const { isa, x: N } of copies) {
    assert.ok(Number.isNaN(N.p[P - 50]), `${isa}: the NaN gradient reached its weight`);
    assert.deepEqual([N.p[4], N.p[P - 3], N.m[4], N.v[P - 3]], edges, `${isa}: outside the slice untouched`);
  }
});

test("foldMicro: the native fold gives the JS loop's bits on every instruction set (first and later micro-batches), zeroes g, touches nothing past it (A10)", {
  skip: nativeSkip,
}, () => {
  let seed = 11;
  const rnd = () => {
    seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
    return seed / 2 ** 32 - 0.5;
  };
  assert.ok(nativeFold(), "the addon's fold loads");
  const specials = [-0, 0, 1e-42, -3e38, Number.POSITIVE_INFINITY, Number.NaN];
  for (const isa of supportedIsas().filter((x) => x !== "amx" && x !== "avx512bf16"))
    for (const [off, n] of [
      [0, 4096 * 3 + 5],
      [3, 1001], // acc starts 24 bytes into a line: the streaming stores' alignment prologue
      [7, 9],
      [1, 0],
    ]) {
      const A = new Float64Array(new SharedArrayBuffer((off + n + 3) * 8)),
        B = new Float64Array(new SharedArrayBuffer((off + n + 3) * 8));
      A.fill(42);
      B.fill(42);
      const a = A.subarray(off, off + n + 3),
        b = B.subarray(off, off + n + 3);
      for (let micro = 0; micro < 3; micro++) {
        const gs = Float32Array.from({ length: n }, (_, i) => (i % 37 === 5 ? specials[(i + micro) % 6] : rnd() * 10));
        const ga = new Float32Array(new SharedArrayBuffer(n * 4)),
          gb = new Float32Array(new SharedArrayBuffer(n * 4));
        ga.set(gs);
        gb.set(gs);
        foldMicro(a, ga, micro === 0, "js");
        foldMicro(b, gb, micro === 0, isa);
        for (let i = 0; i < A.length; i++)
          if (!Object.is(A[i], B[i]))
            assert.fail(
              `${isa}, offset ${off}, n ${n}, micro-batch ${micro}: acc[${i - off}] is ${B[i]} native, ${A[i]} in JS`,
            );
        assert.ok(
          gb.every((x) => Object.is(x, 0)),
          `offset ${off}, n ${n}: g zeroed (+0) after the fold`,
        );
      }
      assert.deepEqual([A[off + n], A[off + n + 2]], [42, 42], "the accumulator past g untouched");
      if (off > 0) assert.equal(A[off - 1], 42);
    }
});

for (const [kernel, skip] of [
  ["js", false],
  ["native", nativeSkip],
] as const)
  test(`reduceChunks64 (${kernel}) equals the path across processes (sumSlots64, unscaleInto, chunkSquares) bit for bit, for 1, 2 and 3 slots, grad aligned or not (A10)`, {
    skip,
  }, () => {
    const P = 3 * SQ_CHUNK + 123;
    let seed = 12345;
    const rnd = () => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed / 2147483648 - 0.5;
    };
    // grad at the start of its buffer (16-byte aligned: the C kernel streams its stores) and one float in (plain stores)
    for (const [k, off] of [1, 2, 3].flatMap((k) => [0, 1].map((off) => [k, off] as const))) {
      // float64 slots holding sums of float32 micro-batch gradients, as foldMicro leaves them
      const slots = Array.from({ length: k }, () =>
        Float64Array.from({ length: P }, () => Math.fround(rnd() * 1e-3) + Math.fround(rnd() * 1e-6)),
      );
      const inv = 1 / (3 * k * 65536);
      const grad = new Float32Array(new ArrayBuffer((P + 1) * 4), off * 4, P),
        sq = new Float64Array(chunkCount(P));
      // in two calls, as two owners split the chunks (the second's range ends at the partial last chunk)
      reduceChunks64(slots, grad, inv, P, sq, 0, 2, kernel === "js" ? "js" : "auto");
      reduceChunks64(slots, grad, inv, P, sq, 2, sq.length, kernel === "js" ? "js" : "auto");
      const sum = new Float64Array(P);
      sumSlots64(slots, sum, 0, P);
      const grad2 = new Float32Array(P),
        sq2 = new Float64Array(chunkCount(P));
      unscaleInto(sum, grad2, 0, P, inv);
      chunkSquares(grad2, P, sq2, 0, sq2.length);
      const bits = Buffer.from(grad.buffer, grad.byteOffset, grad.byteLength);
      assert.ok(bits.equals(Buffer.from(grad2.buffer)), `${k} slots, grad at float ${off}: the same gradient bits`);
      assert.ok(Buffer.from(sq.buffer).equals(Buffer.from(sq2.buffer)), `${k} slots: the same chunk sums`);
      assert.equal(totalSquares(sq).sumSq, totalSquares(sq2).sumSq);
      // each chunk's sum in the documented order: element i of the chunk in lane i % SQ_LANES, each lane in index
      // order, then (lane 0 + lane 1) + (lane 2 + lane 3); the last chunk (123 elements) ends in a partial quad
      for (let c = 0; c < sq.length; c++) {
        const lanes = [0, 0, 0, 0];
        for (let i = c * SQ_CHUNK; i < Math.min(P, (c + 1) * SQ_CHUNK); i++)
          lanes[(i - c * SQ_CHUNK) % SQ_LANES] += grad2[i] * grad2[i];
        assert.equal(sq[c], lanes[0] + lanes[1] + (lanes[2] + lanes[3]), `${k} slots: chunk ${c} in the lanes' order`);
      }
    }
  });
