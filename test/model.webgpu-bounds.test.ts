/**
 * The webgpu engine without Dawn's robustness (device.ts: `disable_robustness`, `disable_workgroup_init`), on this
 * machine's adapter (CI: Mesa 25's lavapipe; skipped with the reason where none opens, a failure under
 * TSTRAIN_REQUIRE_WEBGPU=1). With robustness off nothing clamps a shader's index to its binding, so every shader
 * must keep to the ranges its settings describe (shaders/framework.ts). Checked here on one device, tiny shapes:
 *  - every kernel runs with each storage binding extended past its array into a guard region (the engine's device
 *    wrapped so that each bind group binds GUARD more floats, which the host array holds after the view, a NaN
 *    pattern, and LEAD before it): the guards come back unchanged, and every output is bit-identical to the same
 *    kernels on the unwrapped device (a read of a guard would bring its NaN into an output);
 *  - a planted defect in each family (a bounds check removed from copy, rmsnormForward, the matmul's tile edge,
 *    the attention forward's log-sum-exp rows, and the fold) writes into the guard and is caught by that check;
 *  - a dispatch whose read-only array shares its device buffer with a written one runs (the recorder binds it
 *    read_write: shaders/framework.ts withWritable) and gives the same bits.
 * On lavapipe a write past a binding is dropped whatever the toggles (llvmpipe bounds-checks every storage access),
 * so only a binding that holds the guard shows a shader's own bounds; on a GPU without robustness such a write
 * lands in the next array of the buffer.
 */
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import type { DeferredKernels } from "../src/model/kernels";
import { webgpuEngineOn } from "../src/model/engine/webgpu/engine";
import { type GpuDevice, openWebgpuDevice } from "../src/model/engine/webgpu/device";
import { SHADERS, type ShaderName } from "../src/model/engine/webgpu/shaders/catalog";
import { REQUIRE_WEBGPU } from "./helpers/webgpu";

/** Floats of guard after each array (inside the extended binding) and before it (inside its aligned binding). */
const GUARD = 96;
const LEAD = 3;
/** The guards' bits: a quiet NaN with a payload, kept bit for bit by every copy. */
const GUARD_BITS = 0x7fc0beef;

type Arr = Float32Array | Int32Array | Float64Array;

/** The device, or null after marking the test skipped (a failure under TSTRAIN_REQUIRE_WEBGPU=1). */
async function device(t: TestContext): Promise<{ device: GpuDevice; name: string } | null> {
  const d = await openWebgpuDevice();
  if ("reason" in d) {
    const why = `webgpu engine unavailable here: ${d.reason}; fix: ${d.fix}`;
    if (process.env[REQUIRE_WEBGPU] === "1") throw new Error(`${REQUIRE_WEBGPU}=1 but the ${why}`);
    t.skip(why);
    return null;
  }
  return d;
}

/**
 * `real` with each storage binding of every bind group extended by GUARD floats, where its buffer has them and no
 * other binding of the group starts there (writable bindings may not overlap: the matmul's spare slices).
 */
function guarding(real: GpuDevice): GpuDevice {
  return new Proxy(real, {
    get(target, key) {
      if (key === "createBindGroup")
        return (d: Parameters<GpuDevice["createBindGroup"]>[0]) =>
          target.createBindGroup({
            ...d,
            entries: d.entries.map((e, i) => {
              if (i === d.entries.length - 1) return e; // the uniform
              const { buffer, offset = 0, size = buffer.size - offset } = e.resource;
              const next = d.entries
                .filter((f) => f.resource.buffer === buffer && (f.resource.offset ?? 0) > offset)
                .map((f) => f.resource.offset ?? 0);
              const end = Math.min(buffer.size, offset + size + 4 * GUARD, ...next);
              return { ...e, resource: { buffer, offset, size: Math.max(size, end - offset) } };
            }),
          });
      const v = Reflect.get(target, key) as unknown;
      return typeof v === "function" ? v.bind(target) : v;
    },
    set: (target, key, v) => Reflect.set(target, key, v),
  });
}

/** Makes a case's arrays: each a view with LEAD guard floats before it and GUARD after, in its own ArrayBuffer. */
class Arrays {
  private seed = 1;
  readonly made: Arr[] = [];
  f32(n: number, fill?: (i: number) => number): Float32Array {
    const a = new Float32Array(LEAD + n + GUARD);
    new Uint32Array(a.buffer).fill(GUARD_BITS);
    const v = a.subarray(LEAD, LEAD + n);
    let s = this.seed++ * 2654435761;
    for (let i = 0; i < n; i++) {
      s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
      v[i] = fill ? fill(i) : (s / 2 ** 32) * 2 - 1;
    }
    this.made.push(v);
    return v;
  }
  /** A float64 array (a rank's slot), its guards the same 32-bit pattern on each half of a float64. */
  f64(n: number, fill: (i: number) => number): Float64Array {
    const a = new Float64Array(LEAD + n + GUARD);
    new Uint32Array(a.buffer).fill(GUARD_BITS);
    const v = a.subarray(LEAD, LEAD + n);
    for (let i = 0; i < n; i++) v[i] = fill(i);
    this.made.push(v);
    return v;
  }
  i32(values: number[]): Int32Array {
    const a = new Int32Array(LEAD + values.length + GUARD).fill(GUARD_BITS | 0);
    const v = a.subarray(LEAD, LEAD + values.length);
    v.set(values);
    this.made.push(v);
    return v;
  }
}

/** Whether the guards around `v` (in its whole ArrayBuffer) still hold GUARD_BITS. */
function intact(v: Arr): boolean {
  const all = new Uint32Array(v.buffer);
  const lo = v.byteOffset / 4,
    hi = lo + v.byteLength / 4;
  for (let i = 0; i < all.length; i++) if ((i < lo || i >= hi) && all[i] !== GUARD_BITS) return false;
  return true;
}

/** A case: kernels called on fresh arrays; returns the arrays they write (settled and compared). */
type Case = (k: DeferredKernels, a: Arrays) => (Float32Array | Float64Array)[];

const B = 2,
  T = 5,
  H = 2,
  KV = 1,
  E = 6,
  D = 5,
  V = 7;
const ids = [3, 0, 3, 6, 1, 2, 3, 0, 5, 6];

/** Every kernel of the engine, on shapes whose grids run past the arrays (WG 256, tiles of 64, blocks of 16). */
const CASES: Record<string, Case> = {
  matmul: (k, a) => {
    const out: Float32Array[] = [];
    for (const [tA, tB] of [
      [false, false],
      [false, true],
      [true, false],
      [true, true],
    ] as const) {
      const C = a.f32(5 * 7);
      k.matmul(tA, tB, 5, 7, 3, 0.5, a.f32(15), a.f32(21), 0.25, C);
      out.push(C);
    }
    const split = a.f32(3 * 5); // K = 2000 on a 3 x 5 output: split along K, then matmul_reduce
    k.matmul(true, true, 3, 5, 2000, 1, a.f32(6000), a.f32(10000), 1, split);
    return [...out, split];
  },
  matmuls: (k, a) => {
    const C = a.f32(15),
      C2 = a.f32(15);
    const t = { tA: false, tB: true, M: 3, N: 5, K: 7, alpha: 1 };
    k.matmuls([
      { C, beta: 0, terms: [{ ...t, A: a.f32(21), B: a.f32(35) }] },
      {
        C: C2,
        beta: 0,
        add: a.f32(15),
        terms: [
          { ...t, A: a.f32(21), B: a.f32(35) },
          { ...t, tA: true, A: a.f32(21), B: a.f32(35) },
        ],
      },
    ]);
    return [C, C2];
  },
  embedding: (k, a) => {
    const out = a.f32(ids.length * D),
      dE = a.f32(V * D);
    k.embeddingForward(out, a.i32(ids), a.f32(V * D), ids.length, D);
    k.embeddingBackward(dE, a.i32(ids), a.f32(ids.length * D), ids.length, D);
    return [out, dE];
  },
  rmsnorm: (k, a) => {
    const N = 3,
      out = a.f32(N * D),
      rstd = a.f32(N),
      dx = a.f32(N * D),
      dw = a.f32(D);
    const x = a.f32(N * D),
      w = a.f32(D);
    k.rmsnormForward(out, rstd, x, w, N, D, 1e-5);
    k.rmsnormBackward(
      dx,
      dw,
      a.f32(N * D),
      x,
      w,
      a.f32(N, () => 0.7),
      N,
      D,
    ); // dw: rmsnormBackwardW at settle
    return [out, rstd, dx, dw];
  },
  rope: (k, a) => {
    const x = a.f32(B * T * H * E),
      y = a.f32(B * T * H * E),
      q = a.f32(B * T * H * E),
      kk = a.f32(B * T * KV * E);
    const cos = a.f32(T * (E / 2)),
      sin = a.f32(T * (E / 2));
    k.ropeForward(x, cos, sin, B, T, H, E);
    k.ropeBackward(y, cos, sin, B, T, H, E);
    k.ropeQK(q, kk, cos, sin, B, T, H, KV, E, false);
    return [x, y, q, kk];
  },
  attention: (k, a) => {
    const out = a.f32(B * T * H * E),
      lse = a.f32(B * H * T),
      dq = a.f32(B * T * H * E),
      dk = a.f32(B * T * KV * E),
      dv = a.f32(B * T * KV * E);
    const q = a.f32(B * T * H * E),
      kk = a.f32(B * T * KV * E),
      v = a.f32(B * T * KV * E);
    k.attentionForward(out, lse, q, kk, v, B, T, H, KV, E);
    k.attentionBackward(dq, dk, dv, a.f32(B * T * H * E), q, kk, v, out, lse, B, T, H, KV, E);
    const P = 2,
      cached = a.f32(T * H * E);
    k.attentionCachedForward(
      cached,
      a.f32(T * H * E),
      a.f32((P + T) * KV * E),
      a.f32((P + T) * KV * E),
      P,
      T,
      H,
      KV,
      E,
    );
    return [out, lse, dq, dk, dv, cached];
  },
  swiglu: (k, a) => {
    const out = a.f32(7),
      dg = a.f32(7),
      du = a.f32(7),
      g = a.f32(7),
      u = a.f32(7);
    k.swigluForward(out, g, u, 7);
    k.swigluBackward(dg, du, a.f32(7), g, u, 7);
    return [out, dg, du];
  },
  crossEntropy: (k, a) => {
    const x = a.f32(3 * V);
    k.crossEntropy(x, a.i32([2, -1, 6]), 3, V, 0.5);
    return [x];
  },
  fold: (k, a) => {
    // the step's first micro-batch sets the slot, the next adds into it; both zero their gradient
    const n = 300;
    const slot = a.f64(n, (i) => i / 7);
    const g = a.f32(n),
      g2 = a.f32(n);
    k.fold(slot, g, true);
    k.fold(slot, g2, false);
    return [slot, g, g2];
  },
  copyFill: (k, a) => {
    const dst = a.f32(9),
      x = a.f32(9);
    k.copy(dst, a.f32(9));
    k.fill(x, 2.5);
    return [dst, x];
  },
};

/** Runs a case on an engine and settles its outputs; returns them and every array it made. */
async function run(k: DeferredKernels, c: Case): Promise<{ outs: (Float32Array | Float64Array)[]; made: Arr[] }> {
  const a = new Arrays();
  const outs = c(k, a);
  await k.settle(outs);
  return { outs, made: a.made };
}

/** `name`'s WGSL with `from` replaced by `to` (a planted defect), or a failure where `from` is not in it. */
function planted(name: ShaderName, from: string, to: string): Partial<Record<ShaderName, string>> {
  const code = SHADERS[name].code;
  assert.ok(code.includes(from), `${name} no longer holds ${JSON.stringify(from)}: update this planted defect`);
  return { [name]: code.split(from).join(to) };
}

test("without robustness, every webgpu kernel keeps to its ranges: guards past each binding stay, outputs as on exact bindings; a planted defect is caught", async (t) => {
  const d = await device(t);
  if (!d) return;
  const guarded = webgpuEngineOn(guarding(d.device), "guarded").kernels;
  const exact = webgpuEngineOn(d.device, "exact").kernels;
  for (const [name, c] of Object.entries(CASES)) {
    const g = await run(guarded, c);
    const x = await run(exact, c);
    for (const [i, v] of g.made.entries()) assert.ok(intact(v), `${name}: array ${i}'s guard was written`);
    for (const [i, v] of g.outs.entries())
      assert.deepEqual(
        new Uint32Array(v.slice().buffer),
        new Uint32Array(x.outs[i].slice().buffer),
        `${name}: output ${i}`,
      );
  }
  // each family's planted defect: a bounds check removed writes into the guard past the binding
  const defects: { what: string; case: Case; shaders: Partial<Record<ShaderName, string>> }[] = [
    {
      what: "copy without its i < n",
      case: (k, a) => {
        const dst = a.f32(9);
        k.copy(dst, a.f32(9));
        return [dst];
      },
      shaders: planted("copy", "if (i >= p.n) { return; }", ""),
    },
    {
      what: "rmsnormForward's columns to WG, not D",
      case: (k, a) => {
        const out = a.f32(3 * D);
        k.rmsnormForward(out, a.f32(3), a.f32(3 * D), a.f32(D), 3, D, 1e-5);
        return [out];
      },
      shaders: planted(
        "rmsnormForward",
        "for (var d = l; d < p.D; d += 256u) { out[",
        "for (var d = l; d < 256u; d += 256u) { out[",
      ),
    },
    {
      what: "the matmul's tile edge unchecked",
      case: (k, a) => {
        const C = a.f32(5 * 7);
        k.matmul(false, false, 5, 7, 3, 1, a.f32(15), a.f32(21), 0, C);
        return [C];
      },
      shaders: planted("matmul_nn", "if (m >= jb.M || n >= jb.N) { return; }", ""),
    },
    {
      what: "the attention forward's log-sum-exp of rows past T written",
      case: (k, a) => {
        const out = a.f32(B * T * H * E),
          lse = a.f32(B * H * T);
        k.attentionForward(
          out,
          lse,
          a.f32(B * T * H * E),
          a.f32(B * T * KV * E),
          a.f32(B * T * KV * E),
          B,
          T,
          H,
          KV,
          E,
        );
        return [out, lse];
      },
      shaders: planted("attentionForward", "if (!live) { return; }", ""),
    },
    {
      what: "the fold without its i < n",
      case: (k, a) => {
        const slot = a.f64(300, () => 0);
        const g = a.f32(300);
        k.fold(slot, g, true);
        return [slot, g];
      },
      shaders: planted("foldMicro", "if (i >= p.n) { return; }", ""),
    },
  ];
  for (const p of defects) {
    const bad = webgpuEngineOn(guarding(d.device), `planted ${p.what}`, { shaders: p.shaders }).kernels;
    const r = await run(bad, p.case);
    assert.ok(!r.outs.every(intact), `${p.what}: the planted defect was not caught (the guard stayed)`);
  }
});

test("a dispatch whose read-only array shares its device buffer with a written one runs, bound read_write, with the same bits", async (t) => {
  const d = await device(t);
  if (!d) return;
  const k = webgpuEngineOn(d.device, "shared").kernels;
  // one host array, views 256 bytes apart (bindings start aligned: they do not overlap): copy's src and dst,
  // swiglu's inputs and output, in one device buffer
  const arena = new Float32Array(512).map((_, i) => Math.sin(i));
  const v = (at: number, n: number) => arena.subarray(at, at + n);
  const want = arena.slice();
  k.copy(v(0, 9), v(64, 9));
  want.copyWithin(0, 64, 73);
  k.swigluForward(v(128, 7), v(192, 7), v(256, 7), 7);
  for (let i = 0; i < 7; i++) {
    const x = want[192 + i];
    want[128 + i] = (x / (1 + Math.exp(-x))) * want[256 + i];
  }
  await k.settle([arena]);
  assert.deepEqual([...arena.subarray(0, 9)], [...want.subarray(0, 9)], "copy within one buffer");
  for (let i = 0; i < 7; i++)
    assert.ok(Math.abs(arena[128 + i] - want[128 + i]) < 1e-6, `swiglu within one buffer: ${i}`);
});
