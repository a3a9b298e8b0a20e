/**
 * AdamW (P3) in float32, as torch's fp32 AdamW: the optimizer's update of the weights and both moments over a
 * parameter slice. Where the native addon loads it runs on the addon's C kernel (native/ops/optim.c), which reads
 * and writes the shared arrays in place; without the addon it runs on a small WebAssembly SIMD kernel built here
 * (four float32 lanes per instruction, ~3-4x a float64 JS loop over the 106M-parameter vectors). The two do the same
 * float32 operations in the same order, so they give the same bits. The wasm kernel cannot see the
 * SharedArrayBuffers (a wasm module reads only its own memory), so each call streams its slice through a small
 * private memory in chunks of CHUNK floats: copy in (TypedArray.set, a memmove), compute, copy out. The bench's
 * optim case times the C kernel (bench/results/latest.md: 1.16 of its bandwidth probe on one thread); when the C
 * kernel came (2026-12-03, an older probe) it ran at 0.93 of the probe and the wasm path at 0.69.
 *
 * It differs from the float64-intermediate reference loop (test/helpers/optim-reference.ts adamwSlice) by float32
 * rounding; train.optim.test.ts bounds both kernels against it. The reduce that feeds it the averaged gradient is
 * optim.ts's reduceChunks64 (the addon's C loop or its JS one), not this module.
 *
 * The module is assembled here from its opcodes (a few hundred bytes; no toolchain at build or run time).
 */
import { nativeAdamw } from "../model/engine/native";
import { ADAMW_DEFAULTS, type AdamHyper, type DecayRange } from "./optim";

/** Floats per region; region r starts at byte r * CHUNK * 4 (= r << 14). */
const CHUNK = 4096;
const REGION_BYTES = CHUNK * 4;
/** Regions the private memory holds: AdamW's four (g, m, v, p). */
const MAX_REGIONS = 4;

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
  V128 = 0x7b;
const get = (i: number) => [0x20, ...uleb(i)];
const set = (i: number) => [0x21, ...uleb(i)];
const i32c = (v: number) => [0x41, ...sleb(v)];
const simd = (op: number, ...imm: number[]) => [0xfd, ...uleb(op), ...imm];
const load = (offset: number) => simd(0x00, 4, ...uleb(offset)); // v128.load align=16
const store = (offset: number) => simd(0x0b, 4, ...uleb(offset)); // v128.store align=16
const F32X4 = { splat: 0x13, sqrt: 0xe3, add: 0xe4, sub: 0xe5, mul: 0xe6, div: 0xe7 };
const BLOCK = [0x02, 0x40],
  LOOP = [0x03, 0x40],
  END = 0x0b,
  BR = 0x0c,
  BR_IF = 0x0d;
const I32_ADD = 0x6a,
  I32_SHL = 0x74,
  I32_GE_U = 0x4f;

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

function moduleBytes(): Uint8Array {
  const types = vec([[0x60, ...vec([[I32], ...new Array<number[]>(9).fill([F32])]), ...vec([])]]);
  const pages = Math.ceil((MAX_REGIONS * REGION_BYTES) / 65536);
  const imports = vec([[...name("env"), ...name("mem"), 0x02, 0x00, ...uleb(pages)]]);
  const funcs = vec([[0]]);
  const exports = vec([[...name("adam"), 0x00, 0]]);
  const code = vec([adamBody()].map((b) => [...uleb(b.length), ...b]));
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
  const ex = inst.exports as unknown as Pick<Kernel, "adam">;
  kernel = { heap: new Float32Array(mem.buffer), adam: ex.adam };
  return kernel;
}

/** Multiple of 4 at or above n (the kernel works in whole vectors; the pad lanes are never copied out). */
const up4 = (n: number) => (n + 3) & ~3;

/** Which AdamW kernel runs: "native" (the addon's C, in place, on this thread's instruction set; "native-<isa>":
 *  that copy of its vector code, for the tests), "wasm" (this module's, through its regions), or "auto" (native
 *  where the addon loads). All give the same bits. */
export type AdamwKernel = "auto" | "native" | "native-avx512" | "native-avx2" | "native-portable" | "wasm";

/** The kernel "auto" picks in this thread: "native" where the addon loads, else "wasm". */
export function adamwKernel(): "native" | "wasm" {
  return nativeAdamw() ? "native" : "wasm";
}

/**
 * AdamW over a slice in float32 arithmetic (the float64 reference loop is test/helpers/optim-reference.ts's
 * adamwSlice), on the addon's C kernel (native/ops/optim.c: the arrays read and written in place) or this module's
 * wasm kernel (the same operations in the same order: the same bits).
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
