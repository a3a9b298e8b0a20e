/**
 * The optimizer's two hot loops (reduce + unscale, AdamW) as a WebAssembly SIMD kernel: four float32 lanes per
 * instruction instead of one float64 scalar in JS, ~3-4x faster over the 106M-parameter vectors (bench/optim.ts).
 * The kernel cannot see the SharedArrayBuffers (a wasm module reads only its own memory), so each call streams its
 * slice through a small private memory in chunks of CHUNK floats: copy in (TypedArray.set, a memmove), compute,
 * copy out. Where the native addon loads, AdamW runs instead on its C kernel (native/ops/optim.c), which reads and
 * writes the shared arrays in place: the same float32 operations in the same order, so the same bits, with no
 * copies (the bench's optim case: ~0.93 of the bandwidth probe against ~0.69 for the wasm path).
 *
 * Same arithmetic as optim.ts's reference loops, in float32 (as torch's fp32 AdamW): the reduce is bit-identical to
 * reduceSlice when the unscale factor is a float32 value (a power of two over world*accum in {1, 2, 4, ...}); its
 * sum of squares is exact products summed in float64 in another order. AdamW differs from adamwSlice (float64
 * intermediates) by float32 rounding: tests bound both against the references (train.optim.test.ts).
 *
 * The module is assembled here from its opcodes (a few hundred bytes; no toolchain at build or run time).
 */
import { nativeAdamw } from "../model/engine/native";
import { reduceSlice, ADAMW_DEFAULTS, type AdamHyper, type DecayRange, type ReduceResult } from "./optim";

/** Floats per region; region r starts at byte r * CHUNK * 4 (= r << 14). */
const CHUNK = 4096;
const REGION_BYTES = CHUNK * 4;
/** Regions the private memory holds: AdamW uses 4 (g, m, v, p); the reduce one per gradient slot. */
const MAX_REGIONS = 16;

// ------------------------------------------------------------------ a minimal wasm assembler

const uleb = (n: number): number[] => {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n !== 0) b |= 0x80;
    out.push(b);
  } while (n !== 0);
  return out;
};
const sleb = (n: number): number[] => {
  const out: number[] = [];
  for (;;) {
    const b = n & 0x7f;
    n >>= 7;
    if ((n === 0 && (b & 0x40) === 0) || (n === -1 && (b & 0x40) !== 0)) {
      out.push(b);
      return out;
    }
    out.push(b | 0x80);
  }
};
const vec = (items: number[][]): number[] => [...uleb(items.length), ...items.flat()];
const section = (id: number, body: number[]): number[] => [id, ...uleb(body.length), ...body];
const name = (s: string): number[] => vec([...Buffer.from(s, "utf8")].map((b) => [b]));

const I32 = 0x7f,
  F32 = 0x7d,
  F64 = 0x7c,
  V128 = 0x7b;
const get = (i: number) => [0x20, ...uleb(i)];
const set = (i: number) => [0x21, ...uleb(i)];
const i32c = (v: number) => [0x41, ...sleb(v)];
const simd = (op: number, ...imm: number[]) => [0xfd, ...uleb(op), ...imm];
const load = (offset: number) => simd(0x00, 4, ...uleb(offset)); // v128.load align=16
const store = (offset: number) => simd(0x0b, 4, ...uleb(offset)); // v128.store align=16
const F32X4 = { splat: 0x13, sqrt: 0xe3, add: 0xe4, sub: 0xe5, mul: 0xe6, div: 0xe7 };
const F64X2 = { extract: 0x21, add: 0xf0, mul: 0xf2, promoteLow: 0x5f };
const SHUFFLE = 0x0d,
  V128_CONST = 0x0c;
const BLOCK = [0x02, 0x40],
  LOOP = [0x03, 0x40],
  END = 0x0b,
  BR = 0x0c,
  BR_IF = 0x0d;
const I32_ADD = 0x6a,
  I32_SHL = 0x74,
  I32_GE_U = 0x4f,
  F64_ADD = 0xa0;

/** adam(n, decayMul, b1, b1c, b2, b2c, coef, ibc2, eps, stepSize) over regions g=0, m=1, v=2, p=3; n a multiple of 4. */
function adamBody(): number[] {
  // params 0..9; locals: 10 o (i32 byte offset); 11..19 splats; 20 gi, 21 mi, 22 vi
  const [N, O] = [0, 10];
  const splats = [1, 2, 3, 4, 5, 6, 7, 8, 9].flatMap((p, j) => [...get(p), ...simd(F32X4.splat), ...set(11 + j)]);
  const [DEC, B1, B1C, B2, B2C, COEF, IBC2, EPS, STEP] = [11, 12, 13, 14, 15, 16, 17, 18, 19];
  const [GI, MI, VI] = [20, 21, 22];
  const f = (op: keyof typeof F32X4) => simd(F32X4[op]);
  const code = [
    ...splats,
    ...BLOCK,
    ...LOOP,
    ...get(O),
    ...get(N),
    ...i32c(2),
    I32_SHL,
    I32_GE_U,
    BR_IF,
    1,
    // gi = g * coef
    ...get(O),
    ...load(0),
    ...get(COEF),
    ...f("mul"),
    ...set(GI),
    // mi = b1 * m + b1c * gi; store m
    ...get(B1),
    ...get(O),
    ...load(REGION_BYTES),
    ...f("mul"),
    ...get(B1C),
    ...get(GI),
    ...f("mul"),
    ...f("add"),
    ...set(MI),
    ...get(O),
    ...get(MI),
    ...store(REGION_BYTES),
    // vi = b2 * v + b2c * (gi * gi); store v
    ...get(B2),
    ...get(O),
    ...load(2 * REGION_BYTES),
    ...f("mul"),
    ...get(B2C),
    ...get(GI),
    ...get(GI),
    ...f("mul"),
    ...f("mul"),
    ...f("add"),
    ...set(VI),
    ...get(O),
    ...get(VI),
    ...store(2 * REGION_BYTES),
    // p = p * decayMul - stepSize * (mi / (sqrt(vi) * ibc2 + eps)); store p
    ...get(O),
    ...get(O),
    ...load(3 * REGION_BYTES),
    ...get(DEC),
    ...f("mul"),
    ...get(STEP),
    ...get(MI),
    ...get(VI),
    ...f("sqrt"),
    ...get(IBC2),
    ...f("mul"),
    ...get(EPS),
    ...f("add"),
    ...f("div"),
    ...f("mul"),
    ...f("sub"),
    ...store(3 * REGION_BYTES),
    ...get(O),
    ...i32c(16),
    I32_ADD,
    ...set(O),
    BR,
    0,
    END,
    END,
    END,
  ];
  return [
    ...vec([
      [1, I32],
      [12, V128],
    ]),
    ...code,
  ];
}

/** reduce(n, k, scale) -> f64: region 0 = (region 0 + ... + region k-1) * scale, returns the sum of its squares. */
function reduceBody(): number[] {
  // params 0 n, 1 k, 2 scale; locals: 3 o, 4 r (i32); 5 acc, 6 vscale, 7 s0, 8 s1, 9 tmp (v128)
  const [N, K, SC, O, R, ACC, VS, S0, S1, TMP] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
  const zero = simd(V128_CONST, ...new Array<number>(16).fill(0));
  const hiToLo = [8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7];
  const sq = (src: number[], accLocal: number) => [
    ...src,
    ...set(TMP),
    ...get(accLocal),
    ...get(TMP),
    ...get(TMP),
    ...simd(F64X2.mul),
    ...simd(F64X2.add),
    ...set(accLocal),
  ];
  const code = [
    ...get(SC),
    ...simd(F32X4.splat),
    ...set(VS),
    ...zero,
    ...set(S0),
    ...zero,
    ...set(S1),
    ...BLOCK,
    ...LOOP,
    ...get(O),
    ...get(N),
    ...i32c(2),
    I32_SHL,
    I32_GE_U,
    BR_IF,
    1,
    ...get(O),
    ...load(0),
    ...set(ACC),
    ...i32c(1),
    ...set(R),
    ...BLOCK,
    ...LOOP,
    ...get(R),
    ...get(K),
    I32_GE_U,
    BR_IF,
    1,
    ...get(ACC),
    ...get(O),
    ...get(R),
    ...i32c(14),
    I32_SHL,
    I32_ADD,
    ...load(0),
    ...simd(F32X4.add),
    ...set(ACC),
    ...get(R),
    ...i32c(1),
    I32_ADD,
    ...set(R),
    BR,
    0,
    END,
    END,
    ...get(ACC),
    ...get(VS),
    ...simd(F32X4.mul),
    ...set(ACC),
    ...get(O),
    ...get(ACC),
    ...store(0),
    ...sq([...get(ACC), ...simd(F64X2.promoteLow)], S0),
    ...sq([...get(ACC), ...get(ACC), ...simd(SHUFFLE, ...hiToLo), ...simd(F64X2.promoteLow)], S1),
    ...get(O),
    ...i32c(16),
    I32_ADD,
    ...set(O),
    BR,
    0,
    END,
    END,
    ...get(S0),
    ...get(S1),
    ...simd(F64X2.add),
    ...set(S0),
    ...get(S0),
    ...simd(F64X2.extract, 0),
    ...get(S0),
    ...simd(F64X2.extract, 1),
    F64_ADD,
    END,
  ];
  return [
    ...vec([
      [2, I32],
      [5, V128],
    ]),
    ...code,
  ];
}

function moduleBytes(): Uint8Array {
  if (REGION_BYTES !== 1 << 14) throw new Error("optim-simd: the reduce kernel addresses regions as r << 14");
  const types = vec([
    [0x60, ...vec([[I32], ...new Array<number[]>(9).fill([F32])]), ...vec([])],
    [0x60, ...vec([[I32], [I32], [F32]]), ...vec([[F64]])],
  ]);
  const pages = Math.ceil((MAX_REGIONS * REGION_BYTES) / 65536);
  const imports = vec([[...name("env"), ...name("mem"), 0x02, 0x00, ...uleb(pages)]]);
  const funcs = vec([[0], [1]]);
  const exports = vec([
    [...name("adam"), 0x00, 0],
    [...name("reduce"), 0x00, 1],
  ]);
  const code = vec([adamBody(), reduceBody()].map((b) => [...uleb(b.length), ...b]));
  return Uint8Array.from([
    0x00,
    0x61,
    0x73,
    0x6d,
    0x01,
    0x00,
    0x00,
    0x00,
    ...section(1, types),
    ...section(2, imports),
    ...section(3, funcs),
    ...section(7, exports),
    ...section(10, code),
  ]);
}

// ------------------------------------------------------------------ the kernel, one instance per thread

interface Kernel {
  heap: Float32Array;
  adam: (
    n: number,
    decayMul: number,
    b1: number,
    b1c: number,
    b2: number,
    b2c: number,
    coef: number,
    ibc2: number,
    eps: number,
    stepSize: number,
  ) => void;
  reduce: (n: number, k: number, scale: number) => number;
}

/** The few WebAssembly JS-API members used here (the project compiles without the DOM type library). */
declare const WebAssembly: {
  Memory: new (d: { initial: number }) => { buffer: ArrayBuffer };
  Module: new (bytes: Uint8Array) => object;
  Instance: new (m: object, imports: object) => { exports: Record<string, unknown> };
};

let kernel: Kernel | null = null;

function getKernel(): Kernel {
  if (kernel) return kernel;
  const bytes = moduleBytes();
  const mem = new WebAssembly.Memory({ initial: Math.ceil((MAX_REGIONS * REGION_BYTES) / 65536) });
  const inst = new WebAssembly.Instance(new WebAssembly.Module(bytes), { env: { mem } });
  const ex = inst.exports as unknown as Pick<Kernel, "adam" | "reduce">;
  kernel = { heap: new Float32Array(mem.buffer), adam: ex.adam, reduce: ex.reduce };
  return kernel;
}

/** Multiple of 4 at or above n (the kernel works in whole vectors; the pad lanes are never copied out). */
const up4 = (n: number) => (n + 3) & ~3;

/**
 * reduceSlice (optim.ts) on the kernel: out[i] = (sum over slots of slots[s][i]) * invScale over [lo, hi), in slot
 * order. Falls back to the reference loop for more slots than the private memory holds.
 */
export function reduceSliceSimd(
  slots: readonly Float32Array[],
  out: Float32Array,
  invScale: number,
  lo: number,
  hi: number,
): ReduceResult {
  const k = slots.length;
  if (k > MAX_REGIONS) return reduceSlice(slots, out, invScale, lo, hi);
  const K = getKernel(),
    H = K.heap;
  let sumSq = 0;
  for (let a = lo; a < hi; a += CHUNK) {
    const n = Math.min(CHUNK, hi - a),
      n4 = up4(n);
    for (let s = 0; s < k; s++) {
      H.set(slots[s].subarray(a, a + n), s * CHUNK);
      if (n4 !== n) H.fill(0, s * CHUNK + n, s * CHUNK + n4); // zero pad lanes: they enter the sum of squares
    }
    sumSq += K.reduce(n4, k, invScale);
    out.set(H.subarray(0, n), a);
  }
  return { sumSq, finite: Number.isFinite(sumSq) };
}

/** Which AdamW kernel runs: "native" (the addon's C, in place, on this thread's instruction set; "native-<isa>":
 *  that copy of its vector code, for the tests), "wasm" (this module's, through its regions), or "auto" (native
 *  where the addon loads). All give the same bits. */
export type AdamwKernel = "auto" | "native" | "native-avx512" | "native-avx2" | "native-portable" | "wasm";

/** The kernel "auto" picks in this thread: "native" where the addon loads, else "wasm". */
export function adamwKernel(): "native" | "wasm" {
  return nativeAdamw() ? "native" : "wasm";
}

/**
 * adamwSlice (optim.ts) in float32 arithmetic, on the addon's C kernel (native/ops/optim.c: the arrays read and
 * written in place) or this module's wasm kernel (the same operations in the same order: the same bits).
 */
export function adamwSliceSimd(
  params: Float32Array,
  m: Float32Array,
  v: Float32Array,
  g: Float32Array,
  ranges: readonly DecayRange[],
  lo: number,
  hi: number,
  h: AdamHyper,
  coef: number,
  t: number,
  kernel: AdamwKernel = "auto",
): void {
  const { lr, beta1, beta2, eps, weightDecay } = h;
  const stepSize = lr / (1 - Math.pow(beta1, t));
  const ibc2 = 1 / Math.sqrt(1 - Math.pow(beta2, t));
  const nat = kernel === "wasm" ? null : nativeAdamw();
  if (kernel.startsWith("native") && !nat)
    throw new Error("adamwSliceSimd: the native addon does not load (npm run build:native)");
  const isa = kernel.startsWith("native-") ? (kernel.slice(7) as "avx512" | "avx2" | "portable") : undefined;
  if (nat) {
    const hp = new Float32Array(9); // the wasm kernel's f32 parameters, rounded the same way (to nearest)
    for (const r of ranges) {
      const a0 = Math.max(lo, r.lo),
        b0 = Math.min(hi, r.hi);
      if (a0 >= b0) continue;
      hp.set([r.decay ? 1 - lr * weightDecay : 1, beta1, 1 - beta1, beta2, 1 - beta2, coef, ibc2, eps, stepSize]);
      nat(params, m, v, g, a0, b0, hp, isa);
    }
    return;
  }
  const K = getKernel(),
    H = K.heap;
  for (const r of ranges) {
    const a0 = Math.max(lo, r.lo),
      b0 = Math.min(hi, r.hi);
    if (a0 >= b0) continue;
    const decayMul = r.decay ? 1 - lr * weightDecay : 1;
    for (let a = a0; a < b0; a += CHUNK) {
      const n = Math.min(CHUNK, b0 - a);
      H.set(g.subarray(a, a + n), 0);
      H.set(m.subarray(a, a + n), CHUNK);
      H.set(v.subarray(a, a + n), 2 * CHUNK);
      H.set(params.subarray(a, a + n), 3 * CHUNK);
      K.adam(up4(n), decayMul, beta1, 1 - beta1, beta2, 1 - beta2, coef, ibc2, eps, stepSize);
      m.set(H.subarray(CHUNK, CHUNK + n), a);
      v.set(H.subarray(2 * CHUNK, 2 * CHUNK + n), a);
      params.set(H.subarray(3 * CHUNK, 3 * CHUNK + n), a);
    }
  }
}

/**
 * One owner's share of the update phase (a rank's slice, or the coordinator's): AdamW over [lo, hi) of the shared
 * weights and moments (`shared`: the actors' shared views, src/actors/shm.ts) with the averaged gradient in `grad`, as decideStep decided
 * (lr, the clip coefficient, t). The ranks multiply against these weights directly: nothing else to write.
 */
export function updateSlice(
  shared: { params: Float32Array; m: Float32Array; v: Float32Array; grad: Float32Array },
  ranges: readonly DecayRange[],
  lo: number,
  hi: number,
  lr: number,
  coef: number,
  t: number,
): void {
  adamwSliceSimd(shared.params, shared.m, shared.v, shared.grad, ranges, lo, hi, { lr, ...ADAMW_DEFAULTS }, coef, t);
}
