/**
 * The micro-batch fold on the device (A10; src/model/engine/webgpu/shaders/fold.ts, DeferredKernels.fold) against
 * foldMicro (src/optim/optim.ts: the host's fold, the rank's with --webgpu-fold host), bit for bit, on this machine's
 * adapter (CI: Mesa 25's llvmpipe; skipped elsewhere, saying why), one device for the file:
 *  - a step of micro-batches (the first sets the slot, the rest add) on random float32 gradients of mixed
 *    magnitudes and signs, on random bit patterns (infinities and NaN among them), and on edge columns: signed zeros
 *    (-0 + -0, -0 + +0, a first micro-batch of -0), float32's largest and smallest magnitudes (3.4e38, the
 *    subnormal 2^-149), exact cancellation, inf + -inf, NaN in the slot or in the gradient;
 *  - adds into a slot the host wrote (uploaded, then folded): random binary64 accumulators plus float32 addends at
 *    exponent gaps from -3 to 70 (sticky bits, ties to even), large accumulators plus tiny addends, carries and
 *    borrows across the two 32-bit words, a carry to the next binade, binary64 subnormals and the largest binary64;
 *  - every gradient element zeroed on the device as it is folded;
 *  - the engine's binding limit lowered, so that the step's folds run through several dispatches, both gradient
 *    bindings, all four slot bindings and the spare ones, on views that start past an aligned offset;
 *  - planted defects fail the same comparison: round-to-odd in place of round-to-even, and the carry from the
 *    low word to the high word lost.
 * NaN is compared as NaN-ness: the CPU's and the shader's NaN payloads may differ (the shader returns the slot's NaN
 * quieted before the gradient's, and inf + -inf as the negative default NaN, as x86 does; V8 may not keep either).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { DeferredKernels } from "../src/model/kernels";
import { foldMicro } from "../src/optim/optim";
import { webgpuEngineOn } from "../src/model/engine/webgpu/engine";
import { type GpuDevice, openWebgpuDevice } from "../src/model/engine/webgpu/device";
import { SHADERS } from "../src/model/engine/webgpu/shaders/catalog";
import { REQUIRE_WEBGPU } from "./helpers/webgpu";

const MICRO = 4;
/** A binding limit of 4096 bytes: 512 slot elements a binding, 2048 elements a fold dispatch (less the view's offset). */
const SMALL_BINDING = 4096;

/** A seeded generator of 32-bit words. */
function words(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return s >>> 0;
  };
}

const f32 = (bits: number) => new Float32Array(new Uint32Array([bits]).buffer)[0];
const f64 = (hi: number, lo: number) => new Float64Array(new Uint32Array([lo, hi]).buffer)[0];
const F32_MAX = f32(0x7f7fffff);
const F32_TINY = f32(1); // 2^-149
const F32_MAX_SUBNORMAL = f32(0x007fffff);

/** A step's gradients, one Float32Array per micro-batch, columns of edge cases then random ones. */
function stepGradients(n: number): Float32Array[] {
  const cols: number[][] = [
    [-0, -0, -0, -0], // -0 all along: -0
    [-0, 0, -0, -0], // -0 + +0 = +0
    [0, -0, -0, -0],
    [-0], // a first micro-batch of -0
    [1.5, -1.5], // exact cancellation: +0
    [-2.25, 2.25, -0], // +0 + -0
    [F32_MAX, F32_MAX, F32_MAX, F32_MAX], // 4 x 3.4e38, exact in binary64
    [F32_MAX, -F32_MAX],
    [-F32_MAX, -F32_MAX, F32_MAX],
    [F32_TINY, F32_TINY, F32_TINY], // 3 x 2^-149
    [F32_TINY, -F32_TINY],
    [-F32_TINY],
    [F32_MAX_SUBNORMAL, F32_TINY, -F32_MAX_SUBNORMAL],
    [F32_MAX, F32_TINY, -F32_MAX], // 2^-149 survives next to 3.4e38 in binary64
    [2 ** 40, 2 ** -60, 2 ** -60, -(2 ** 40)], // large accumulator, tiny addends
    [1, 2 ** -53, 2 ** -53], // ties to even at 1
    [Infinity, 1, -2],
    [-Infinity, -Infinity],
    [Infinity, -Infinity], // NaN
    [Number.NaN, 1],
    [1, Number.NaN, 1],
    [f32(0x7fa00000), 2], // a signalling NaN's bits in the gradient
    [Infinity],
    [Number.NaN],
  ];
  const gs = Array.from({ length: MICRO }, () => new Float32Array(n));
  cols.forEach((col, c) => {
    for (let m = 0; m < MICRO; m++) gs[m][c] = m < col.length ? col[m] : -0; // x + -0 = x for every x
  });
  const w = words(59);
  const third = Math.floor((n - cols.length) / 3);
  for (let i = cols.length; i < n; i++)
    for (let m = 0; m < MICRO; m++) {
      if (i < cols.length + 2 * third) {
        // gradients of mixed magnitudes and signs: near and far exponents, cancellations, carries
        const e = i < cols.length + third ? (w() % 12) - 6 : (w() % 80) - 60;
        gs[m][i] = (w() & 1 ? -1 : 1) * 2 ** e * (1 + w() / 2 ** 32);
      } else gs[m][i] = f32(w()); // any bit pattern: subnormals, infinities, NaN
    }
  return gs;
}

/** Accumulators the host wrote and float32 addends (folded with first = false), as bit pairs and numbers. */
function intoHostSlot(n: number): { acc: Float64Array; g: Float32Array } {
  const pairs: [number, number][] = [
    [-0, -0],
    [-0, 0],
    [0, -0],
    [f64(0x3ff00000, 0xffffffff), 2 ** -52], // a carry out of the low word: 0x3ff00001_00000000
    [f64(0x3ff00001, 0), -(2 ** -52)], // a borrow from the high word
    [f64(0x3ff00000, 0xfffffffe), 2 ** -52 + 2 ** -53], // a carry and a tie
    [2 - 2 ** -52, 2 ** -52], // a carry into the next binade: 2
    [2 - 2 ** -52, 2 ** -51 + 2 ** -60], // a carry out of the top, the bit shifted out sticky: past the tie, 2 + 2^-51
    [2 - 2 ** -52, 2 ** -53], // a tie at the binade's top: to even, 2
    [1, 2 ** -53], // a tie: to even, 1
    [1 + 2 ** -52, 2 ** -53], // a tie: to even, 1 + 2^-51
    [1, 2 ** -53 + 2 ** -60], // past the tie: 1 + 2^-52
    [1, -(2 ** -54)], // a tie below a binade: 1
    [1, -(2 ** -53)], // exact: 1 - 2^-53
    [2 ** 60, 1], // an exponent gap of 60: the sticky bit alone
    [2 ** 60, 2 ** 7], // a tie at 2^60: to even
    [2 ** 60 + 2 ** 8, 2 ** 7], // a tie: to even, up
    [2 ** 60, 2 ** 7 + 2 ** -10], // past the tie
    [2 ** 60, -(2 ** 7 + 2 ** -10)],
    [2 ** 80, -(2 ** 20)], // a gap of 60, subtracted
    [2 ** 100, F32_TINY], // a gap of 249
    [-(2 ** 100), F32_TINY],
    [5e-324, 0], // binary64 subnormals stay
    [-5e-324, -0],
    [-5e-324, 0],
    [2 ** -1022 - 2 ** -1074, -0],
    [5e-324, F32_TINY],
    [-(2 ** -1022), F32_TINY],
    [Number.MAX_VALUE, F32_MAX], // never overflows: 2^128 is under half an ulp of 2^1024
    [-Number.MAX_VALUE, -F32_MAX],
    [Infinity, F32_MAX],
    [-Infinity, Infinity],
    [Number.NaN, 1],
    [1, Number.NaN],
  ];
  const acc = new Float64Array(n),
    g = new Float32Array(n);
  pairs.forEach(([a, b], i) => {
    acc[i] = a;
    g[i] = b;
    assert.ok(Object.is(g[i], b) || Number.isNaN(b), `the addend ${b} is a float32`);
  });
  const w = words(61);
  for (let i = pairs.length; i < n; i++) {
    // a random binary64 near 2^e, and a float32 addend at a gap of -3 to 70 binades, either sign
    const e = (w() % 40) - 20;
    acc[i] = f64(((w() & 1) << 31) | ((1023 + e) << 20) | (w() & 0xfffff), w());
    const gap = (w() % 74) - 3;
    g[i] = (w() & 1 ? -1 : 1) * 2 ** (e - gap) * (1 + w() / 2 ** 32);
  }
  return { acc, g };
}

/**
 * The fold on the device: the step's gradients folded into a slot (set by the first, or added into `init`, a slot
 * the host wrote), each gradient written by the host and read back after its fold; the slot and whether every
 * gradient came back zeroed.
 */
async function deviceFold(
  k: DeferredKernels,
  gs: Float32Array[],
  init: Float64Array | null,
): Promise<{ slot: Float64Array; zeroed: boolean }> {
  const n = gs[0].length;
  // views past an aligned offset (3 floats, 2 doubles): the fold's bindings start below them
  const slot = new Float64Array(n + 2).subarray(2),
    g = new Float32Array(n + 3).subarray(3);
  if (init) slot.set(init);
  let zeroed = true;
  for (let m = 0; m < gs.length; m++) {
    g.set(gs[m]); // host-owned: the fold uploads it
    k.fold(slot, g, init === null && m === 0);
    await k.endMicroBatch();
    await k.settle([g]); // read back: the fold zeroed it
    zeroed &&= new Uint32Array(g.buffer, g.byteOffset, n).every((x) => x === 0);
  }
  await k.settle([slot]);
  return { slot, zeroed };
}

/** The same fold on the host: foldMicro, the rank's. */
function hostFold(gs: Float32Array[], init: Float64Array | null): Float64Array {
  const slot = new Float64Array(gs[0].length);
  if (init) slot.set(init);
  for (const [m, g] of gs.entries()) foldMicro(slot, Float32Array.from(g), init === null && m === 0);
  return slot;
}

/** The device's slot has the host's bits (NaN: NaN-ness); else the first differences, with their inputs. */
function sameFold(what: string, dev: Float64Array, host: Float64Array, inputs: (i: number) => string): void {
  const bits = (x: Float64Array) => new BigUint64Array(x.buffer, x.byteOffset, x.length);
  const d = bits(dev),
    h = bits(host);
  const bad: string[] = [];
  let count = 0;
  for (let i = 0; i < host.length; i++) {
    const same = Number.isNaN(host[i]) ? Number.isNaN(dev[i]) : d[i] === h[i];
    if (!same && count++ < 4)
      bad.push(
        `[${i}] ${inputs(i)}: device ${dev[i]} (0x${d[i].toString(16)}), host ${host[i]} (0x${h[i].toString(16)})`,
      );
  }
  assert.equal(
    count,
    0,
    `${what}: ${count} of ${host.length} slot elements differ from foldMicro's bits: ${bad.join("; ")}`,
  );
}

/** Both folds of the file on `k`, against foldMicro. */
async function checkFolds(k: DeferredKernels, n: number): Promise<void> {
  const gs = stepGradients(n);
  const step = await deviceFold(k, gs, null);
  sameFold("a step of micro-batches", step.slot, hostFold(gs, null), (i) => gs.map((g) => g[i]).join(", "));
  assert.ok(step.zeroed, "every gradient element is zeroed on the device as it is folded");
  const { acc, g } = intoHostSlot(n);
  const into = await deviceFold(k, [g], acc);
  sameFold("adds into a slot the host wrote", into.slot, hostFold([g], acc), (i) => `${acc[i]} + ${g[i]}`);
  assert.ok(into.zeroed, "the gradient is zeroed on the device");
}

/** One device for the file: every engine below is made on it (the last one destroys it). */
let device: { device: GpuDevice; name: string } | null = null;
async function onDevice(t: { skip(m: string): void }): Promise<{ device: GpuDevice; name: string } | null> {
  if (device) return device;
  const d = await openWebgpuDevice();
  if ("reason" in d) {
    const why = `webgpu engine unavailable here: ${d.reason}; fix: ${d.fix}`;
    if (process.env[REQUIRE_WEBGPU] === "1") throw new Error(`${REQUIRE_WEBGPU}=1 but the ${why}`);
    t.skip(why);
    return null;
  }
  device = d;
  return d;
}

test("on webgpu, the fold on the device has foldMicro's bits: a step of micro-batches, and adds into a slot the host wrote (A10)", async (t) => {
  const d = await onDevice(t);
  if (!d) return;
  // the device's own binding limit: one dispatch a fold
  await checkFolds(webgpuEngineOn(d.device, d.name).kernels, 20_000);
  // a limit of 4096 bytes: 5000 elements fold in three dispatches, through every binding and the spare ones
  await checkFolds(webgpuEngineOn(d.device, d.name, { maxBinding: SMALL_BINDING }).kernels, 5000);
});

test("on webgpu, a fold shader that rounds to odd, or loses the carry between its 32-bit words, fails the comparison", async (t) => {
  const d = await onDevice(t);
  if (!d) return;
  const code = SHADERS.foldMicro.code;
  const plant = (from: string, to: string) => {
    assert.ok(code.includes(from), `the fold's WGSL has ${JSON.stringify(from)}`);
    return code.replace(from, to);
  };
  const defects = [
    {
      what: "round to odd",
      code: plant(
        "if (low > 4u || (low == 4u && (x.x & 1u) == 1u)) { x = add64(x, vec2u(1u, 0u)); }",
        "if (low != 0u) { x.x = x.x | 1u; }",
      ),
    },
    {
      what: "the carry from the low word lost",
      code: plant("a.y + b.y + select(0u, 1u, lo < a.x)", "a.y + b.y"),
    },
  ];
  for (const defect of defects) {
    const k = webgpuEngineOn(d.device, d.name, { shaders: { foldMicro: defect.code } }).kernels;
    await assert.rejects(checkFolds(k, 5000), /differ from foldMicro's bits/, `${defect.what} passes`);
  }
  webgpuEngineOn(d.device, d.name).kernels.dispose(); // the device, destroyed once
});
