/**
 * The webgpu engine (src/model/engine/webgpu/engine.ts, its WGSL in webgpu/shaders/) on this machine's WebGPU adapter (in CI
 * the llvmpipe software adapter of Mesa 25, TSTRAIN_REQUIRE_WEBGPU=1; elsewhere skipped, saying why):
 *  - every kernel, forward and backward, against the JS reference (js.ts; matmul against float64) within 1e-5
 *    relative, on views at unaligned offsets and on a SharedArrayBuffer, and bit-identical when run again;
 *  - the matmul's four transpose pipelines, split along K forced on, off and by shape, against float64 on shapes
 *    off the tile (K past 4096, beta 0 over a NaN C, alpha != 1); matmuls (several jobs, a residual add, chained
 *    terms, split jobs) equal to the separate matmul calls bit for bit; a planted defect in each matmul shader
 *    (built through the engine's shaders option) fails the comparison;
 *  - the column sums on edge shapes (N = 1, N off rmsnormBackward's row block, a token repeated many times):
 *    rmsnormBackward's deferred dw within 1e-5, embeddingBackward bit-identical to js.ts, ropeQK as the two
 *    rope calls; and each of their shaders with a planted defect FAILS those checks;
 *  - llama-tiny's loss, logits and every gradient against the float64 fixture within the parity test's
 *    tolerances (1e-5, 1e-4, 1e-4), gradient checkpointing on and off bit-identical, and a second micro-batch
 *    accumulating into the read-back gradient;
 *  - (the fused attention: model.webgpu-attention.test.ts)
 *  - the forward with the KV cache equal to the training forward at every position (G11's tolerance);
 *  - `--backend webgpu` refused before any work (P1, exit 2) with the command that gets an adapter, when none opens.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { jsKernels } from "../src/model/engine/js";
import { type DeferredKernels, type MatmulJob, matmulsInSequence } from "../src/model/kernels";
import { rmsnormRows } from "../src/model/engine/webgpu/shaders/rows";
import { SHADERS, type ShaderName } from "../src/model/engine/webgpu/shaders/catalog";
import { KvCache, Llama } from "../src/model/llama";
import { buildConfig } from "../src/model/llama-config";
import { paramLayout } from "../src/model/layout";
import { initWeights } from "../src/model/init";
import { readSafetensors } from "../src/model/safetensors";
import { lcg, maxAbs, maxAbsDiff, relErr, sameBits } from "./helpers/numeric";
import { FIX, loadTinyFixture } from "./helpers/fixture";
import { rand, settleOf, useWebgpu, useWebgpuWith } from "./helpers/webgpu";
import { matmulReference } from "./helpers/matmul-reference";

/** n pseudo-random floats in [-1, 1), as a view at an unaligned offset (3 floats) of a bigger buffer, or on a SharedArrayBuffer. */
function copyOf(a: Float32Array): Float32Array {
  const c = new Float32Array(a.length + 5).subarray(1, 1 + a.length);
  c.set(a);
  return c;
}

/** Runs `call` on the webgpu kernels twice (fresh copies of the outputs), settles, checks both against `ref` and each other. */
async function check(
  k: DeferredKernels,
  what: string,
  outs: Float32Array[],
  call: (o: Float32Array[]) => void,
  ref: ArrayLike<number>[],
  tol = 1e-5,
): Promise<void> {
  const runs: Float32Array[][] = [];
  for (let r = 0; r < 2; r++) {
    const o = outs.map(copyOf);
    call(o);
    await settleOf(k)(o);
    runs.push(o);
  }
  for (let i = 0; i < outs.length; i++) {
    const err = relErr(runs[0][i], ref[i]);
    assert.ok(err < tol, `${what}: output ${i} rel err ${err}`);
    assert.ok(sameBits(runs[0][i], runs[1][i]), `${what}: output ${i} differs run to run`);
  }
}

test("on webgpu, every kernel matches the JS reference (matmul: float64), on unaligned views and shared memory, bit-identical run to run", async (t) => {
  const k = await useWebgpu(t);
  if (!k) return;
  // matmul: every transpose pair, alpha and beta (beta 0 ignores a NaN C), shapes off the 64-tile
  let seed = 1;
  for (const [M, N, K] of [
    [5, 7, 3],
    [70, 65, 129],
    [1, 96, 48],
    [33, 1, 200],
  ]) {
    for (const tA of [false, true])
      for (const tB of [false, true])
        for (const [alpha, beta] of [
          [1, 0],
          [1, 1],
          [0.25, 0.5],
        ]) {
          const A = rand(M * K, seed++, seed % 2 === 0),
            B = rand(K * N, seed++),
            C = rand(M * N, seed++);
          if (beta === 0) C.fill(Number.NaN);
          const want = matmulReference(tA, tB, M, N, K, alpha, A, B, beta, C).out;
          await check(
            k,
            `matmul ${tA} ${tB} ${M}x${N}x${K} a${alpha} b${beta}`,
            [C],
            ([c]) => k.matmul(tA, tB, M, N, K, alpha, A, B, beta, c),
            [want],
          );
        }
  }
  const N = 37,
    D = 48,
    V = 96;
  const ids = Int32Array.from({ length: N }, (_, i) => (i * 7) % 11); // repeats: the scatter-add order
  const E = rand(V * D, 5, true),
    dout = rand(N * D, 6);
  {
    const want = new Float32Array(N * D);
    jsKernels.embeddingForward(want, ids, E, N, D);
    await check(k, "embeddingForward", [new Float32Array(N * D)], ([o]) => k.embeddingForward(o, ids, E, N, D), [want]);
    const dE = rand(V * D, 7),
      wantE = copyOf(dE);
    jsKernels.embeddingBackward(wantE, ids, dout, N, D);
    await check(k, "embeddingBackward", [dE], ([o]) => k.embeddingBackward(o, ids, dout, N, D), [wantE]);
  }
  {
    const x = rand(N * D, 8),
      w = rand(D, 9),
      out = new Float32Array(N * D),
      rstd = new Float32Array(N);
    jsKernels.rmsnormForward(out, rstd, x, w, N, D, 1e-5);
    await check(
      k,
      "rmsnormForward",
      [new Float32Array(N * D), new Float32Array(N)],
      ([o, r]) => k.rmsnormForward(o, r, x, w, N, D, 1e-5),
      [out, rstd],
    );
    const dx = rand(N * D, 10),
      dw = rand(D, 11),
      wdx = copyOf(dx),
      wdw = copyOf(dw);
    jsKernels.rmsnormBackward(wdx, wdw, dout, x, w, rstd, N, D);
    await check(k, "rmsnormBackward", [dx, dw], ([a, b]) => k.rmsnormBackward(a, b, dout, x, w, rstd, N, D), [
      wdx,
      wdw,
    ]);
  }
  const B = 2,
    T = 9,
    H = 6,
    KV = 2,
    Eh = 8;
  const cos = rand(T * (Eh / 2), 12),
    sin = rand(T * (Eh / 2), 13);
  for (const dir of ["ropeForward", "ropeBackward"] as const) {
    const x = rand(B * T * H * Eh, 14),
      want = copyOf(x);
    jsKernels[dir](want, cos, sin, B, T, H, Eh);
    await check(k, dir, [x], ([o]) => k[dir](o, cos, sin, B, T, H, Eh), [want]);
  }
  {
    const q = rand(B * T * H * Eh, 15),
      kk = rand(B * T * KV * Eh, 16),
      v = rand(B * T * KV * Eh, 17);
    const out = new Float32Array(B * T * H * Eh),
      lse = new Float32Array(B * H * T);
    jsKernels.attentionForward(out, lse, q, kk, v, B, T, H, KV, Eh);
    await check(
      k,
      "attentionForward",
      [rand(out.length, 18), rand(lse.length, 19)],
      ([o, a]) => k.attentionForward(o, a, q, kk, v, B, T, H, KV, Eh),
      [out, lse],
    );
    const dO = rand(out.length, 20),
      dq = new Float32Array(q.length),
      dk = new Float32Array(kk.length),
      dv = new Float32Array(v.length);
    jsKernels.attentionBackward(dq, dk, dv, dO, q, kk, v, out, lse, B, T, H, KV, Eh);
    await check(
      k,
      "attentionBackward",
      [rand(dq.length, 21), rand(dk.length, 22), rand(dv.length, 23)],
      ([a, b, c]) => k.attentionBackward(a, b, c, dO, q, kk, v, out, lse, B, T, H, KV, Eh),
      [dq, dk, dv],
    );
    // cached: 3 new positions after 5 cached ones, against a cache of 11 rows
    const P = 5,
      Tn = 3,
      S = 11,
      qn = rand(Tn * H * Eh, 24),
      kc = rand(S * KV * Eh, 25),
      vc = rand(S * KV * Eh, 26);
    const co = new Float32Array(Tn * H * Eh);
    jsKernels.attentionCachedForward(co, qn, kc, vc, P, Tn, H, KV, Eh);
    await check(
      k,
      "attentionCachedForward",
      [new Float32Array(co.length)],
      ([o]) => k.attentionCachedForward(o, qn, kc, vc, P, Tn, H, KV, Eh),
      [co],
    );
  }
  {
    const n = 1000,
      g = rand(n, 27),
      u = rand(n, 28),
      d = rand(n, 29);
    for (let i = 0; i < n; i++) g[i] *= 8; // into silu's tails
    const out = new Float32Array(n),
      dg = new Float32Array(n),
      du = new Float32Array(n);
    jsKernels.swigluForward(out, g, u, n);
    jsKernels.swigluBackward(dg, du, d, g, u, n);
    await check(k, "swigluForward", [new Float32Array(n)], ([o]) => k.swigluForward(o, g, u, n), [out]);
    await check(k, "swigluBackward", [rand(n, 30), rand(n, 31)], ([a, b]) => k.swigluBackward(a, b, d, g, u, n), [
      dg,
      du,
    ]);
  }
  {
    const rows = 7,
      Vc = 300,
      logits = rand(rows * Vc, 32),
      tg = Int32Array.of(3, -1, 299, 0, 150, -1, 7);
    for (let i = 0; i < logits.length; i++) logits[i] *= 6;
    for (const gs of [0, 0.125]) {
      const want = copyOf(logits),
        loss = jsKernels.crossEntropy(want, tg, rows, Vc, gs);
      const got = copyOf(logits);
      assert.equal(k.crossEntropy(got, tg, rows, Vc, gs), 0, "deferred: crossEntropy returns 0");
      const r = await settleOf(k)([got]);
      assert.equal(r.rows, 5, "the targeted rows");
      assert.ok(
        Math.abs(r.loss - loss / 5) / (loss / 5) < 1e-6,
        `crossEntropy gs ${gs}: loss ${r.loss} vs ${loss / 5}`,
      );
      assert.ok(relErr(got, want) < 1e-5, `crossEntropy gs ${gs}: logits / gradient rel err ${relErr(got, want)}`);
    }
  }
  {
    const src = rand(500, 33),
      dst = rand(500, 34),
      z = rand(300, 35);
    await check(k, "copy", [dst], ([o]) => k.copy(o, src), [src]);
    await check(k, "fill", [z], ([o]) => k.fill(o, 0.5), [new Float32Array(300).fill(0.5)]);
  }
  k.dispose();
});

/** Runs `call` twice (fresh copies of the outputs), settles, and requires js.ts's bits (`ref`) both times. */
async function checkExact(
  k: DeferredKernels,
  what: string,
  outs: Float32Array[],
  call: (o: Float32Array[]) => void,
  ref: Float32Array[],
): Promise<void> {
  for (let r = 0; r < 2; r++) {
    const o = outs.map(copyOf);
    call(o);
    await settleOf(k)(o);
    for (let i = 0; i < outs.length; i++)
      assert.ok(sameBits(o[i], ref[i]), `${what}: output ${i} differs from js.ts's bits (run ${r})`);
  }
}

/** rmsnormBackward's shapes: N = 1, N a multiple of the row block, N off it (last block short), D past a workgroup. */
const NORM_SHAPES: [number, number][] = [
  [1, 48],
  [37, 48],
  [1025, 300], // rows of 3: 341 full blocks and one of 2
  [1537, 64], // rows of 4: 384 full blocks and one of 1
];

async function checkRmsnormBackward(k: DeferredKernels, N: number, D: number): Promise<void> {
  const x = rand(N * D, 40 + N),
    w = rand(D, 41),
    dout = rand(N * D, 42, true),
    rstd = new Float32Array(N),
    out = new Float32Array(N * D);
  jsKernels.rmsnormForward(out, rstd, x, w, N, D, 1e-5);
  const dx = rand(N * D, 43),
    dw = rand(D, 44),
    wdx = copyOf(dx),
    wdw = copyOf(dw);
  jsKernels.rmsnormBackward(wdx, wdw, dout, x, w, rstd, N, D);
  await check(
    k,
    `rmsnormBackward N=${N} D=${D}`,
    [dx, dw],
    ([a, b]) => k.rmsnormBackward(a, b, dout, x, w, rstd, N, D),
    [wdx, wdw],
  );
}

/** embeddingBackward's shapes: one row; one token for every row; a few tokens repeated many times, D past a workgroup. */
function embeddingCases(): { what: string; ids: Int32Array; D: number; V: number }[] {
  const skew = lcg(7);
  return [
    { what: "N=1", ids: Int32Array.of(5), D: 48, V: 96 },
    { what: "one token 300 times", ids: new Int32Array(300).fill(17), D: 48, V: 96 },
    { what: "37 rows of 11 tokens", ids: Int32Array.from({ length: 37 }, (_, i) => (i * 7) % 11), D: 48, V: 96 },
    {
      what: "513 rows, skewed",
      ids: Int32Array.from({ length: 513 }, () => (skew() >>> 29) * ((skew() >>> 31) + 1)),
      D: 300,
      V: 20,
    },
  ];
}

async function checkEmbeddingBackward(k: DeferredKernels): Promise<void> {
  for (const { what, ids, D, V } of embeddingCases()) {
    const N = ids.length,
      dout = rand(N * D, 50 + N),
      dE = rand(V * D, 51, true),
      want = copyOf(dE);
    jsKernels.embeddingBackward(want, ids, dout, N, D);
    await checkExact(k, `embeddingBackward ${what}`, [dE], ([o]) => k.embeddingBackward(o, ids, dout, N, D), [want]);
  }
}

async function checkRopeQK(k: DeferredKernels): Promise<void> {
  const [B, T, H, K, E] = [2, 9, 6, 2, 8];
  const cos = rand(T * (E / 2), 60),
    sin = rand(T * (E / 2), 61);
  assert.ok(k.ropeQK, "the webgpu engine has ropeQK");
  for (const backward of [false, true]) {
    const q = rand(B * T * H * E, 62),
      kk = rand(B * T * K * E, 63, true),
      wq = copyOf(q),
      wk = copyOf(kk);
    const dir = backward ? "ropeBackward" : "ropeForward";
    jsKernels[dir](wq, cos, sin, B, T, H, E);
    jsKernels[dir](wk, cos, sin, B, T, K, E);
    await check(
      k,
      `ropeQK backward=${backward}`,
      [q, kk],
      ([a, b]) => k.ropeQK?.(a, b, cos, sin, B, T, H, K, E, backward),
      [wq, wk],
    );
  }
}

test("on webgpu, the column sums and ropeQK match js.ts on edge shapes: rmsnormBackward's dw (deferred) within 1e-5, embeddingBackward bit-identical", async (t) => {
  const k = await useWebgpu(t);
  if (!k) return;
  assert.ok(
    NORM_SHAPES.some(([n]) => n % rmsnormRows(n) !== 0),
    "a shape whose last block of rows is short",
  );
  for (const [N, D] of NORM_SHAPES) await checkRmsnormBackward(k, N, D);
  await checkEmbeddingBackward(k);
  await checkRopeQK(k);
  // the deferred dw: two calls on one dw between settles add twice, and a kernel that reads dw between them sees
  // the first call's sum; a second norm's dw in the same flush gets its own
  const [N, D] = [70, 40];
  const x = rand(N * D, 70),
    w = rand(D, 71),
    dout = rand(N * D, 72),
    rstd = new Float32Array(N);
  jsKernels.rmsnormForward(new Float32Array(N * D), rstd, x, w, N, D, 1e-5);
  const dx = rand(N * D, 73),
    dw = rand(D, 74),
    dw2 = rand(D, 75),
    seen = new Float32Array(D);
  const wdx = copyOf(dx),
    wdw = copyOf(dw),
    wdw2 = copyOf(dw2);
  jsKernels.rmsnormBackward(wdx, wdw, dout, x, w, rstd, N, D);
  const wseen = copyOf(wdw);
  jsKernels.rmsnormBackward(wdx, wdw, dout, x, w, rstd, N, D);
  jsKernels.rmsnormBackward(wdx, wdw2, dout, x, w, rstd, N, D);
  k.rmsnormBackward(dx, dw, dout, x, w, rstd, N, D);
  k.copy(seen, dw);
  k.rmsnormBackward(dx, dw, dout, x, w, rstd, N, D);
  k.rmsnormBackward(dx, dw2, dout, x, w, rstd, N, D);
  await settleOf(k)([dx, dw, dw2, seen]);
  for (const [name, got, want] of [
    ["dx", dx, wdx],
    ["dw read between the calls", seen, wseen],
    ["dw after two calls", dw, wdw],
    ["the second norm's dw", dw2, wdw2],
  ] as const)
    assert.ok(relErr(got, want) < 1e-5, `deferred rmsnormBackward: ${name} rel err ${relErr(got, want)}`);
  k.dispose();
});

/** Shader `name` with `from` replaced by `to` (which must occur). */
function planted(name: ShaderName, from: string, to: string): Partial<Record<ShaderName, string>> {
  const code = SHADERS[name].code;
  assert.ok(code.includes(from), `${name}'s WGSL has ${JSON.stringify(from)}`);
  return { [name]: code.replace(from, to) };
}

test("on webgpu, each column-sum and ropeQK shader with a planted defect fails its check against js.ts", async (t) => {
  const defects: {
    what: string;
    shaders: Partial<Record<ShaderName, string>>;
    run: (k: DeferredKernels) => Promise<void>;
    fails: RegExp;
  }[] = [
    {
      what: "rmsnormBackwardW drops the last partial block",
      shaders: planted("rmsnormBackwardW", "b < nb; b++", "b + 1u < nb; b++"),
      run: (k) => checkRmsnormBackward(k, 1025, 300),
      fails: /rmsnormBackward N=1025 D=300: output 1 rel err/,
    },
    {
      what: "rmsnormBackward's partial drops each block's last row",
      shaders: planted(
        "rmsnormBackward",
        "for (var n = n0; n < n1; n++) { acc",
        "for (var n = n0; n + 1u < n1; n++) { acc",
      ),
      run: (k) => checkRmsnormBackward(k, 1025, 300),
      fails: /rmsnormBackward N=1025 D=300: output 1 rel err/,
    },
    {
      what: "embeddingBackward sums a token's rows in reverse order",
      shaders: planted(
        "embeddingBackward",
        "for (var j = s0; j < s1; j++) { acc = acc + dout[p.oD + u32(csr[rows + j]) * p.D + d]; }",
        "for (var j = s1; j > s0; j--) { acc = acc + dout[p.oD + u32(csr[rows + j - 1u]) * p.D + d]; }",
      ),
      run: checkEmbeddingBackward,
      fails: /embeddingBackward one token 300 times: output 0 differs from js\.ts's bits/,
    },
    {
      what: "ropeQK takes k's positions with q's head count",
      shaders: planted("ropeQK", "select(p.H, p.K, isK)", "select(p.H, p.H, isK)"),
      run: checkRopeQK,
      fails: /ropeQK backward=false: output 1 rel err/,
    },
  ];
  for (const d of defects) {
    const k = await useWebgpuWith(t, { shaders: d.shaders });
    if (!k) return;
    await assert.rejects(d.run(k), d.fails, `the planted defect "${d.what}" was not caught`);
    k.dispose();
  }
});

const { cfg, ref, B, T, ids, layout, weights } = loadTinyFixture();
const refGrads = readSafetensors(path.join(FIX, "grads.f64.safetensors")).tensors;
const refLogits = readSafetensors(path.join(FIX, "logits.f64.safetensors")).tensors.get("logits")?.data as Float64Array;

/** The max relative error of alpha op(A) op(B) + beta C on `k` against float64 (beta 0: C full of NaN, never read). */
async function matmulErr(
  k: DeferredKernels,
  tA: boolean,
  tB: boolean,
  M: number,
  N: number,
  K: number,
  alpha: number,
  beta: number,
  seed: number,
): Promise<{ err: number; out: Float32Array }> {
  const A = rand(M * K, seed, seed % 2 === 0),
    B = rand(K * N, seed + 1),
    C = rand(M * N, seed + 2);
  if (beta === 0) C.fill(Number.NaN);
  const want = matmulReference(tA, tB, M, N, K, alpha, A, B, beta, C).out;
  k.matmul(tA, tB, M, N, K, alpha, A, B, beta, C);
  await settleOf(k)([C]);
  return { err: relErr(C, want), out: C };
}

/** The matmul shapes off the 64-tile and K past 4096, every transpose pair, alpha and beta (beta 0 with a NaN C). */
const MATMUL_CASES: [M: number, N: number, K: number, alpha: number, beta: number][] = [
  [1, 1, 1, 1, 0],
  [67, 130, 33, 0.75, 0],
  [67, 130, 33, 1, 1],
  [40, 70, 4500, 1, 0.5],
];

test("on webgpu, the matmul's four pipelines, split along K and not, match float64 on shapes off the tile, bit-identical run to run", async (t) => {
  for (const splitK of ["off", "on", "auto"] as const) {
    const k = await useWebgpuWith(t, { splitK });
    if (!k) return;
    let seed = 100;
    for (const [M, N, K, alpha, beta] of MATMUL_CASES)
      for (const tA of [false, true])
        for (const tB of [false, true]) {
          const what = `split ${splitK}: matmul ${tA ? "T" : "N"}${tB ? "T" : "N"} ${M}x${N}x${K} a${alpha} b${beta}`;
          const one = await matmulErr(k, tA, tB, M, N, K, alpha, beta, seed);
          const two = await matmulErr(k, tA, tB, M, N, K, alpha, beta, seed);
          seed += 3;
          assert.ok(one.err < 1e-5, `${what}: rel err ${one.err}`);
          assert.ok(sameBits(one.out, two.out), `${what}: differs run to run`);
        }
    k.dispose();
  }
});

/** Views into one arena (the model's operands are views into a few big buffers), filled pseudo-randomly. */
function arena(sizes: number[], seed: number): Float32Array[] {
  const all = rand(
    sizes.reduce((a, b) => a + b + 7, 0),
    seed,
  );
  let at = 0;
  return sizes.map((n) => {
    const v = all.subarray(at + 3, at + 3 + n);
    at += n + 7;
    return v;
  });
}

/** Jobs like the model's: q/k/v forward (one A), a residual add, dW jobs split along K, a dx job of 3 terms. */
function jobsLike(): { jobs: MatmulJob[]; outs: Float32Array[] } {
  const [T, D, Q, KV] = [300, 48, 64, 24];
  const [x, wq, wk, wv, res, dq, dk, dv, C1, C2, C3, C4, dWq, dWk, dWv, dh] = arena(
    [
      T * D,
      Q * D,
      KV * D,
      KV * D,
      T * Q,
      T * Q,
      T * KV,
      T * KV,
      T * Q,
      T * KV,
      T * KV,
      T * Q,
      Q * D,
      KV * D,
      KV * D,
      T * D,
    ],
    7,
  );
  dh.fill(Number.NaN); // beta 0: never read
  const f = (A: Float32Array, B: Float32Array, M: number, N: number, K: number) => ({
    tA: false,
    tB: true,
    M,
    N,
    K,
    alpha: 1,
    A,
    B,
  });
  const w = (dy: Float32Array, M: number) => ({ tA: true, tB: false, M, N: D, K: T, alpha: 1, A: dy, B: x });
  const g = (dy: Float32Array, W: Float32Array, K: number) => ({
    tA: false,
    tB: false,
    M: T,
    N: D,
    K,
    alpha: 1,
    A: dy,
    B: W,
  });
  return {
    jobs: [
      { C: C1, beta: 0, terms: [f(x, wq, T, Q, D)] },
      { C: C2, beta: 0, terms: [f(x, wk, T, KV, D)] },
      { C: C3, beta: 0.5, terms: [{ ...f(x, wv, T, KV, D), alpha: 0.25 }] },
      { C: C4, beta: 0, add: res, terms: [f(x, wq, T, Q, D)] },
      { C: dWq, beta: 1, terms: [w(dq, Q)] },
      { C: dWk, beta: 1, terms: [w(dk, KV)] },
      { C: dWv, beta: 1, terms: [w(dv, KV)] },
      { C: dh, beta: 0, terms: [g(dq, wq, Q), g(dk, wk, KV), g(dv, wv, KV)] },
    ],
    outs: [C1, C2, C3, C4, dWq, dWk, dWv, dh],
  };
}

test("on webgpu, matmuls (several jobs, chained terms, add, split along K) equals the separate matmul calls bit for bit", async (t) => {
  for (const splitK of ["auto", "on", "off"] as const) {
    const k = await useWebgpuWith(t, { splitK });
    if (!k) return;
    assert.ok(k.matmuls, "the webgpu engine has matmuls");
    const got: Float32Array[][] = [];
    for (const fused of [true, false]) {
      const { jobs, outs } = jobsLike();
      if (fused) k.matmuls(jobs);
      else matmulsInSequence(k, jobs);
      await settleOf(k)(outs);
      got.push(outs.map((o) => o.slice()));
    }
    got[0].forEach((o, i) => {
      assert.ok(!o.some(Number.isNaN), `split ${splitK}: output ${i} has no NaN`);
      assert.ok(sameBits(o, got[1][i]), `split ${splitK}: output ${i} differs from the separate calls`);
    });
    // and each against float64: job 7's dh = dq Wq + dk Wk + dv Wv
    const { jobs } = jobsLike();
    const j7 = jobs[7];
    const want = new Float64Array(j7.C.length);
    for (const tm of j7.terms) {
      const r = matmulReference(tm.tA, tm.tB, tm.M, tm.N, tm.K, 1, tm.A, tm.B, 0, j7.C).out;
      r.forEach((x, i) => {
        want[i] += x;
      });
    }
    assert.ok(relErr(got[0][7], want) < 1e-5, `split ${splitK}: the chained terms against float64`);
    k.dispose();
  }
});

/** WGSL with `from` replaced by `to`, failing when `from` is not in it (the defect must be planted). */
function plantFirst(code: string, from: string | RegExp, to: string): string {
  const out = code.replace(from, to);
  assert.notEqual(out, code, `the planted defect ${String(from)} is in the shader`);
  return out;
}

test("on webgpu, a planted defect in each matmul shader fails the float64 comparison", async (t) => {
  const skipLastK = (name: ShaderName) =>
    plantFirst(SHADERS[name].code, /kb < k1; kb \+= (\d+)u/, "kb + $1u < k1; kb += $1u");
  const cases: { shader: ShaderName; splitK: "on" | "off"; run: (k: DeferredKernels) => Promise<number> }[] = [];
  for (const tA of [false, true])
    for (const tB of [false, true]) {
      const shader = `matmul_${tA ? "t" : "n"}${tB ? "t" : "n"}` as ShaderName;
      cases.push({ shader, splitK: "off", run: async (k) => (await matmulErr(k, tA, tB, 67, 130, 33, 1, 0, 9)).err });
    }
  const chained = async (k: DeferredKernels) => {
    const { jobs, outs } = jobsLike();
    assert.ok(k.matmuls);
    k.matmuls(jobs);
    await settleOf(k)(outs);
    const j = jobs[7],
      want = new Float64Array(j.C.length);
    for (const tm of j.terms)
      matmulReference(tm.tA, tm.tB, tm.M, tm.N, tm.K, 1, tm.A, tm.B, 0, j.C).out.forEach((x, i) => {
        want[i] += x;
      });
    return relErr(outs[7], want);
  };
  cases.push({ shader: "matmuls", splitK: "off", run: chained });
  for (const c of cases) {
    const clean = await useWebgpuWith(t, { splitK: c.splitK });
    if (!clean) return;
    const bad = await useWebgpuWith(t, { splitK: c.splitK, shaders: { [c.shader]: skipLastK(c.shader) } });
    assert.ok(bad);
    assert.ok((await c.run(clean)) < 1e-5, `${c.shader}: the clean shader passes`);
    const err = await c.run(bad);
    assert.ok(err > 1e-5, `${c.shader} without its last K tile: rel err ${err} fails the comparison`);
    clean.dispose();
    bad.dispose();
  }
  // the reduce: the last split's partial sums dropped, or the partials summed in the wrong order
  const lastSplit = plantFirst(SHADERS.matmul_reduce.code, "s < tm.S; s++", "s + 1u < tm.S; s++");
  const clean = await useWebgpuWith(t, { splitK: "on" }),
    bad = await useWebgpuWith(t, { splitK: "on", shaders: { matmul_reduce: lastSplit } });
  assert.ok(clean && bad);
  const good = await matmulErr(clean, true, false, 40, 70, 4500, 1, 0, 11);
  assert.ok(good.err < 1e-5, "the clean reduce passes");
  const err = (await matmulErr(bad, true, false, 40, 70, 4500, 1, 0, 11)).err;
  assert.ok(err > 1e-5, `the reduce without its last split: rel err ${err} fails the comparison`);
  // summing the splits from the last: within tolerance, but not the fixed order's bits
  const reversed = plantFirst(
    SHADERS.matmul_reduce.code,
    /var acc = part\[tm\.pO \+ e\];\s*for \(var s = 1u; s < tm\.S; s\+\+\) \{ acc = acc \+ part\[tm\.pO \+ s \* jb\.MN \+ e\]; \}/,
    "var acc = part[tm.pO + (tm.S - 1u) * jb.MN + e]; for (var s = 1u; s < tm.S; s++) { acc = acc + part[tm.pO + (tm.S - 1u - s) * jb.MN + e]; }",
  );
  const rev = await useWebgpuWith(t, { splitK: "on", shaders: { matmul_reduce: reversed } });
  assert.ok(rev);
  const r = await matmulErr(rev, true, false, 40, 70, 4500, 1, 0, 11);
  assert.ok(!sameBits(r.out, good.out), "the splits summed in reverse order give other bits than the fixed order");
  for (const k of [clean, bad, rev]) k.dispose();
});

test("on webgpu, llama-tiny's loss, logits and every gradient match the float64 reference, gradient checkpointing on and off bit-identical (M4, M6)", async (t) => {
  const k = await useWebgpu(t);
  if (!k) return;
  const settle = settleOf(k);
  const got = new Map<boolean, Float32Array>();
  for (const gradCkpt of [false, true]) {
    const m = new Llama(cfg, k, { gradCkpt });
    m.bindParams(weights);
    k.weightsAre?.(weights);
    const grads = new Float32Array(layout.total);
    m.lossAndGrads(ids, B, T, 1, grads);
    const { loss } = await settle([grads]);
    assert.ok(Math.abs(loss - ref.loss) / ref.loss < 1e-5, `loss ${loss} vs ${ref.loss}`);
    m.loss(ids, B, T);
    const again = (await settle([])).loss;
    assert.ok(Math.abs(again - ref.loss) / ref.loss < 1e-5, `loss() ${again} vs ${ref.loss}`);
    const logits = m.logits(ids, B, T);
    await settle([logits]);
    const le = relErr(logits, refLogits);
    assert.ok(le < 1e-4, `logits rel err ${le}`);
    let worst = 0;
    for (const en of layout.entries) {
      const r = refGrads.get(en.name);
      assert.ok(r, `reference has ${en.name}`);
      const err = relErr(grads.subarray(en.offset, en.offset + en.size), r.data as Float64Array);
      assert.ok(err < 1e-4, `${en.name}: gradient rel err ${err}`);
      worst = Math.max(worst, err);
    }
    console.log(
      `# PARITY webgpu gradCkpt=${gradCkpt}: loss rel err ${(Math.abs(loss - ref.loss) / ref.loss).toExponential(2)}, logits ${le.toExponential(2)}, worst gradient ${worst.toExponential(2)}`,
    );
    got.set(gradCkpt, grads);
    if (gradCkpt) {
      // a second micro-batch adds into the gradient read back (the host's values are uploaded, not the device's)
      const twice = Float32Array.from(grads, (g) => g);
      m.lossAndGrads(ids, B, T, 1, twice);
      await settle([twice]);
      const doubled = Float32Array.from(grads, (g) => 2 * g);
      assert.ok(relErr(twice, doubled) < 1e-6, `a second micro-batch accumulates: rel err ${relErr(twice, doubled)}`);
    }
    m.dispose();
  }
  assert.ok(
    sameBits(got.get(false) as Float32Array, got.get(true) as Float32Array),
    "gradient checkpointing changes no bit (M6)",
  );
  k.dispose();
});

test("on webgpu, the forward with the KV cache equals the training forward at every position (G11)", async (t) => {
  const k = await useWebgpu(t);
  if (!k) return;
  const settle = settleOf(k);
  const c = buildConfig({ seqLen: 48, layers: 3, hidden: 144, vocabSize: 300 });
  const params = new Float32Array(paramLayout(c).total);
  initWeights(c, 1234, params);
  for (const e of paramLayout(c).entries) // sharpen: logits far from flat (as test/generate.test.ts does)
    if (e.name.endsWith("embed_tokens.weight") || e.name.includes("_proj."))
      for (let i = e.offset; i < e.offset + e.size; i++) params[i] *= 6;
  const model = new Llama(c, k, { gradCkpt: false });
  model.bindParams(params);
  k.weightsAre?.(params);
  const Tn = 40,
    V = c.vocabSize;
  const seq = Int32Array.from({ length: Tn }, (_, i) => (i * 37 + 11) % V);
  const full = model.logits(seq, 1, Tn);
  await settle([full]);
  const scale = maxAbs(full);
  assert.ok(scale > 1, `logits are not flat (max |logit| ${scale})`);
  const cache = new KvCache(c, Tn);
  // a prompt of 7 positions at once, then one position per pass
  const first = model.forwardCached(seq.subarray(0, 7), cache);
  await settle([first]);
  for (let p = 0; p < 7; p++) {
    const { diff } = maxAbsDiff(first.subarray(p * V, (p + 1) * V), full.subarray(p * V, (p + 1) * V));
    assert.ok(diff <= 1e-5 * scale, `prompt position ${p}: max |diff| ${diff} (scale ${scale})`);
  }
  for (let p = 7; p < Tn; p++) {
    const got = model.forwardCached(seq.subarray(p, p + 1), cache);
    await settle([got]);
    const { diff, at } = maxAbsDiff(got, full.subarray(p * V, (p + 1) * V));
    assert.ok(diff <= 1e-5 * scale, `position ${p}: max |diff| ${diff} at vocab ${at} (scale ${scale})`);
  }
  assert.equal(cache.length, Tn);
  k.dispose();
});

test("on webgpu, the loss settle returns is the same with the LM head in chunks: each chunk's loss rows are read back from where they were written", async (t) => {
  const k = await useWebgpu(t);
  if (!k) return;
  const c = buildConfig({ seqLen: 64, layers: 1, hidden: 72, vocabSize: 300 });
  const P = paramLayout(c).total;
  const params = new Float32Array(P);
  initWeights(c, 7, params);
  k.weightsAre?.(params);
  const ids = Int32Array.from({ length: 4 * 64 }, (_, i) => (i * 7 + 3) % c.vocabSize);
  const losses: number[] = [];
  // one chunk of 256 rows, then chunks of 100 (the second's rows start past the binding alignment), then of 7
  for (const headChunkTokens of [undefined, 100, 7]) {
    const model = new Llama(c, k, { gradCkpt: false, headChunkTokens });
    model.bindParams(params);
    const g = new Float32Array(P);
    model.lossAndGrads(ids, 4, 64, 1, g);
    losses.push((await settleOf(k)([g])).loss);
    model.dispose();
  }
  t.diagnostic(`loss: one chunk ${losses[0]}, chunks of 100 ${losses[1]}, of 7 ${losses[2]}`);
  assert.ok(losses[0] > 1, `the loss ${losses[0]} is a cross-entropy near log(vocab)`);
  for (const l of losses.slice(1))
    assert.ok(Math.abs(l - losses[0]) <= 1e-6 * losses[0], `chunked ${l} vs one chunk ${losses[0]}`);
  k.dispose();
});

test("--backend webgpu with no adapter is refused before any work (P1, exit 2), with the command that gets one", () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-webgpu-refuse-"));
  const run = path.join(out, "run");
  // the Vulkan loader finds no driver: Dawn has no adapter
  const env = {
    ...process.env,
    VK_DRIVER_FILES: path.join(out, "none.json"),
    VK_ICD_FILENAMES: path.join(out, "none.json"),
  };
  const r = spawnSync(
    process.execPath,
    [path.join(__dirname, "..", "main.js"), "--demo", "--backend", "webgpu", "--out", run],
    { env, encoding: "utf8", timeout: 120_000 },
  );
  const text = `${r.stdout}${r.stderr}`;
  assert.equal(r.status, 2, text);
  assert.match(text, /P1/);
  assert.match(text, /--backend webgpu is not available/);
  assert.match(text, /scripts\/mesa-backports\.sh \(as root|npm install webgpu@0\.6\.2/);
  // the driver advice is a command that runs here (cli.refusals.test.ts runs it on planted apt sources)
  const script = /Debian 12: (\S+) \(as root/.exec(text)?.[1];
  if (script) {
    const dry = spawnSync(script, ["--dry-run"], { encoding: "utf8" });
    assert.ok(dry.status === 0 || dry.status === 2, `${script} --dry-run: exit ${dry.status} ${dry.stderr}`);
  }
  assert.ok(!fs.existsSync(run), "nothing was written: refused before any work");
  fs.rmSync(out, { recursive: true, force: true });
});
