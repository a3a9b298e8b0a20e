/**
 * The webgpu engine's fused attention (src/model/engine/webgpu/shaders/attention.ts) on this machine's WebGPU
 * adapter (in CI the llvmpipe software adapter of Mesa 25, TSTRAIN_REQUIRE_WEBGPU=1; elsewhere skipped, saying why):
 *  - the forward, backward and cached forward against js.ts on shapes with partial blocks, T = 1, GQA groups of 3,
 *    B = 2 and head sizes up to 128 (each its own pipeline), bit-identical run to run;
 *  - each of its shaders with a planted defect (no causal mask, the last key tile skipped, the wrong GQA head, ...)
 *    FAILS that comparison;
 *  - at the frozen model's shape (B 4, T 1024, H 9, K 3, E 64) the engine allocates no buffer of B*H*T*T floats.
 * Its own file: with an empty shader cache, llvmpipe compiles each head size's pipelines (up to 27 s a shader at
 * E 128 on 2 cores), and the other webgpu tests keep their own time.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { jsKernels } from "../src/model/engine/js";
import type { DeferredKernels } from "../src/model/kernels";
import { SHADERS, type ShaderName } from "../src/model/engine/webgpu/shaders/catalog";
import { maxAbs, maxAbsDiff, relErr, sameBits } from "./helpers/numeric";
import { rand, settleOf, useWebgpu } from "./helpers/webgpu";
import { webgpuEngineOn } from "../src/model/engine/webgpu/engine";
import { type GpuDevice, openWebgpuDevice } from "../src/model/engine/webgpu/device";

interface AttShape {
  B: number;
  T: number;
  H: number;
  K: number;
  E: number;
  /** The cached forward's cache rows before the new positions. */
  P: number;
}

/**
 * The three attention kernels on `k` (twice each, fresh outputs), against js.ts: each output's relative error
 * (forward out, lse; backward dq, dk, dv; cached out; the absolute one where the reference is zero), and whether
 * the second run gave the same bits.
 */
async function attentionErrors(
  k: DeferredKernels,
  s: AttShape,
  seed: number,
): Promise<{ err: number[]; same: boolean }> {
  const { B, T, H, K, E, P } = s;
  const q = rand(B * T * H * E, seed),
    kk = rand(B * T * K * E, seed + 1),
    v = rand(B * T * K * E, seed + 2, true),
    dO = rand(B * T * H * E, seed + 3);
  const out = new Float32Array(q.length),
    lse = new Float32Array(B * H * T);
  jsKernels.attentionForward(out, lse, q, kk, v, B, T, H, K, E);
  const dq = new Float32Array(q.length),
    dk = new Float32Array(kk.length),
    dv = new Float32Array(kk.length);
  jsKernels.attentionBackward(dq, dk, dv, dO, q, kk, v, out, lse, B, T, H, K, E);
  // cached: the T positions after P cached ones of sequence 0, against a cache of P + T + 2 rows
  const S = P + T + 2,
    kc = rand(S * K * E, seed + 4),
    vc = rand(S * K * E, seed + 5),
    qn = q.subarray(0, T * H * E),
    co = new Float32Array(T * H * E);
  jsKernels.attentionCachedForward(co, qn, kc, vc, P, T, H, K, E);
  const want = [out, lse, dq, dk, dv, co];
  const runs: Float32Array[][] = [];
  for (let r = 0; r < 2; r++) {
    const o = want.map((w, i) => rand(w.length, 100 + i)); // garbage: every element must be written
    k.attentionForward(o[0], o[1], q, kk, v, B, T, H, K, E);
    k.attentionBackward(o[2], o[3], o[4], dO, q, kk, v, out, lse, B, T, H, K, E);
    k.attentionCachedForward(o[5], qn, kc, vc, P, T, H, K, E);
    await settleOf(k)(o);
    runs.push(o);
  }
  return {
    // a reference that is zero up to rounding (dq and dk at T = 1, where dS = p (dp - D) = 0): the largest difference
    err: want.map((w, i) => (maxAbs(w) > 1e-6 ? relErr(runs[0][i], w) : maxAbsDiff(runs[0][i], w).diff)),
    same: runs[0].every((o, i) => sameBits(o, runs[1][i])),
  };
}

const ATT_OUTPUTS = ["forward out", "forward lse", "dq", "dk", "dv", "cached out"];

/**
 * Partial blocks (of 64 rows) and tiles (16 keys; 16 rows, 8 past E 64), T = 1, GQA groups of 1, 2 and 3, B = 2,
 * E from 1 to 128 (each its own pipeline), off the vec4 (5, 1, 99) and on it.
 */
const ATT_SHAPES: AttShape[] = [
  { B: 2, T: 9, H: 6, K: 2, E: 8, P: 5 },
  { B: 2, T: 100, H: 6, K: 2, E: 24, P: 3 },
  { B: 1, T: 1, H: 3, K: 1, E: 5, P: 0 },
  { B: 2, T: 1, H: 2, K: 2, E: 1, P: 7 },
  { B: 2, T: 33, H: 9, K: 3, E: 64, P: 17 },
  { B: 1, T: 17, H: 2, K: 2, E: 128, P: 16 },
  { B: 1, T: 70, H: 4, K: 1, E: 99, P: 1 },
];

test("on webgpu, the fused attention matches the JS reference on partial blocks, T=1, GQA groups of 3, B=2 and head sizes to 128, bit-identical run to run", async (t) => {
  const k = await useWebgpu(t);
  if (!k) return;
  let seed = 500;
  for (const s of ATT_SHAPES) {
    const { err, same } = await attentionErrors(k, s, (seed += 10));
    for (const [i, e] of err.entries()) assert.ok(e < 1e-5, `${JSON.stringify(s)}: ${ATT_OUTPUTS[i]} rel err ${e}`);
    assert.ok(same, `${JSON.stringify(s)}: differs run to run`);
  }
  assert.throws(
    () => k.attentionForward(rand(8, 1), rand(1, 2), rand(8, 3), rand(8, 4), rand(8, 5), 1, 1, 1, 1, 129),
    /^Error: webgpu: attention takes a head size of at most 128/,
  );
  k.dispose();
});

/** `code` with `from` replaced by `to`; fails the test when `from` is not in it (the defect would not be planted). */
function plant(code: string, from: string, to: string): string {
  assert.ok(code.includes(from), `the defect's target is in the shader: ${from}`);
  return code.split(from).join(to);
}

/**
 * Each planted defect: the shader, its WGSL with the defect, and the outputs that must then be wrong. The shape has
 * two blocks of rows a head (T 77 over blocks of 64) and a head size off the vec4 (E 22: 5 vec4s and a half).
 */
const DEFECTS: { what: string; shader: ShaderName; from: string; to: string; wrong: number[] }[] = [
  // the forward's code (flashForward) is both forwards': each of its defects is planted in each, the training
  // forward's out and lse wrong (out alone where `outOnly`), the cached forward's out
  ...[
    { what: "without the causal mask", from: "<= vec4u(last)", to: "<= vec4u(nkeys - 1u)" },
    { what: "skipping the last key tile", from: "u0 < nkeys;", to: "u0 + BK < nkeys;" },
    {
      what: "on the wrong GQA head",
      from: "let j = (h * p.K) / p.H;",
      to: "let j = (h * p.K) / p.H + 1u - (h % 2u);",
    },
    { what: "without the running-max rescale of the sum", from: "lsum * alpha + pu.x", to: "lsum + pu.x" },
    {
      what: "without the running-max rescale of the output",
      from: "acc[i] * alpha + pu.x",
      to: "acc[i] + pu.x",
      outOnly: true,
    },
    { what: "skipping a tile's last group of 4 keys", from: "u < n; u += 4u", to: "u + 4u < n; u += 4u" },
    {
      what: "with the head size's vec4 count rounded down (its pipeline constant E)",
      from: "override E4: u32 = (E + 3u) / 4u;",
      to: "override E4: u32 = E / 4u;",
    },
    {
      what: "reading its own row one vec4 short (the rolled row loop)",
      from: "for (var i = 0u; i < p.n4; i++) {\n    var w",
      to: "for (var i = 1u; i < p.n4; i++) {\n    var w",
    },
  ].flatMap(({ what, from, to, outOnly }) => [
    { what: `forward ${what}`, shader: "attentionForward" as const, from, to, wrong: outOnly ? [0] : [0, 1] },
    { what: `cached forward ${what}`, shader: "attentionCachedForward" as const, from, to, wrong: [5] },
  ]),
  {
    what: "backward dk, dv without the causal mask",
    shader: "attentionBackward",
    from: "t0 + t < p.T && u <= t0 + t",
    to: "t0 + t < p.T",
    wrong: [3, 4],
  },
  {
    what: "backward dk, dv skipping the group's last query head",
    shader: "attentionBackward",
    from: "if ((h * p.K) / p.H != j) { continue; }",
    to: "if ((h * p.K) / p.H != j || (h + 1u) * p.K / p.H != j) { continue; }",
    wrong: [3, 4],
  },
  {
    what: "backward dk, dv skipping the last query tile",
    shader: "attentionBackward",
    from: "t0 < p.T; t0 +=",
    to: "t0 + BT < p.T; t0 +=",
    wrong: [3, 4],
  },
  {
    what: "backward dk without D (its partials dout * out, summed per query row)",
    shader: "attentionBackward",
    from: "(dp - dt)",
    to: "dp",
    wrong: [3],
  },
  {
    what: "backward dk with D of the tile's first row for every row",
    shader: "attentionBackward",
    from: "let w = Wd[t * E4 + i];",
    to: "let w = Wd[i];",
    wrong: [3],
  },
  {
    what: "backward dk with D summed past the head size (the tiles' zeros past E)",
    shader: "attentionBackward",
    from: "let inE = e < E;",
    to: "let inE = e < E + 1u;",
    wrong: [3],
  },
  {
    what: "backward dq skipping the last key tile",
    shader: "attentionBackward",
    from: "u0 < nkeys;",
    to: "u0 + BT < nkeys;",
    wrong: [2],
  },
  { what: "backward dq without D", shader: "attentionBackward", from: "(dp - dd)", to: "dp", wrong: [2] },
  {
    what: "backward dq with D short of the row's last vec4",
    shader: "attentionBackward",
    from: "for (var i = 0u; i < E4; i++) { dd = dd + dot(gr[i], row[i]); }",
    to: "for (var i = 1u; i < E4; i++) { dd = dd + dot(gr[i], row[i]); }",
    wrong: [2],
  },
  {
    what: "backward dq on the wrong GQA head",
    shader: "attentionBackward",
    from: "let j = (h * p.K) / p.H;",
    to: "let j = (h * p.K) / p.H + 1u - (h % 2u);",
    wrong: [2],
  },
  {
    what: "backward with the head size's vec4 count rounded down",
    shader: "attentionBackward",
    from: "override E4: u32 = (E + 3u) / 4u;",
    to: "override E4: u32 = E / 4u;",
    wrong: [2, 3, 4],
  },
];

test("on webgpu, each fused attention shader with a planted defect fails the comparison with the JS reference", async (t) => {
  const first = await useWebgpu(t); // skips (or fails under TSTRAIN_REQUIRE_WEBGPU=1) when no adapter opens
  if (!first) return;
  const shape: AttShape = { B: 2, T: 77, H: 6, K: 2, E: 22, P: 3 };
  const clean = await attentionErrors(first, shape, 900);
  for (const [i, e] of clean.err.entries()) assert.ok(e < 1e-5, `without a defect: ${ATT_OUTPUTS[i]} rel err ${e}`);
  first.dispose();
  for (const d of DEFECTS) {
    const dev = await openWebgpuDevice();
    assert.ok(!("reason" in dev));
    const code = plant(SHADERS[d.shader].code, d.from, d.to);
    const k = webgpuEngineOn(dev.device, dev.name, { shaders: { [d.shader]: code } }).kernels;
    const { err } = await attentionErrors(k, shape, 900);
    // the comparison the passing test makes (rel err < 1e-5) fails: a NaN fails it too
    for (const i of d.wrong) assert.ok(!(err[i] < 1e-5), `${d.what}: ${ATT_OUTPUTS[i]} rel err ${err[i]} passes`);
    k.dispose();
  }
});

test("on webgpu, the fused attention at the frozen model's shape allocates no buffer of B*H*T*T floats", async (t) => {
  const first = await useWebgpu(t);
  if (!first) return;
  first.dispose();
  const dev = await openWebgpuDevice();
  assert.ok(!("reason" in dev));
  const sizes: number[] = [];
  const real = dev.device;
  // the real device (the real engine path), every createBuffer's size recorded on the way
  const device = new Proxy(real, {
    get(target, prop) {
      if (prop === "createBuffer")
        return (d: Parameters<GpuDevice["createBuffer"]>[0]) => {
          sizes.push(d.size);
          return target.createBuffer(d);
        };
      const v = Reflect.get(target, prop, target);
      return typeof v === "function" ? v.bind(target) : v;
    },
    set(target, prop, value) {
      return Reflect.set(target, prop, value, target);
    },
  });
  const k = webgpuEngineOn(device, dev.name).kernels;
  const [B, T, H, K, E] = [4, 1024, 9, 3, 64];
  const q = rand(B * T * H * E, 1),
    kk = rand(B * T * K * E, 2),
    v = rand(B * T * K * E, 3),
    dO = rand(B * T * H * E, 4),
    out = new Float32Array(q.length),
    lse = new Float32Array(B * H * T),
    dq = new Float32Array(q.length),
    dk = new Float32Array(kk.length),
    dv = new Float32Array(kk.length);
  k.attentionForward(out, lse, q, kk, v, B, T, H, K, E);
  k.attentionBackward(dq, dk, dv, dO, q, kk, v, out, lse, B, T, H, K, E);
  k.attentionCachedForward(out.subarray(0, T * H * E), q.subarray(0, T * H * E), kk, v, 0, T, H, K, E);
  // recorded, not awaited: the software adapter would take minutes over this shape
  assert.ok(sizes.length > 0, "the wrapper saw the engine's buffers");
  const limit = B * H * T * T * 4;
  const big = sizes.filter((s) => s >= limit);
  assert.deepEqual(big, [], `no buffer of ${limit} bytes or more (largest ${Math.max(...sizes)})`);
  assert.ok(
    Math.max(...sizes) <= q.byteLength + 4096,
    `the largest buffer is an operand's mirror: ${Math.max(...sizes)}`,
  );
  k.dispose();
});
