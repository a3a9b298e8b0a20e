/**
 * The bench's and the tests' native probes: the second addon, build/Release/tstrain_probes.node (native/probes.c and
 * peak.c on their own copy of the engine's GEMM and row kernels; binding.gyp), which the trainer never loads. It
 * holds the built-in GEMM on one kernel by name, the core's FMA / TDPBF16PS / VDPBF16PS peak, the row maths' copies,
 * the bandwidth probes and the fused attention's timed copy.
 *
 * Each getter returns null where the native engine itself does not load (no C toolchain: the tests that need it skip,
 * the bench leaves its C probes out), and throws, naming the command that builds it, where the engine loads but the
 * probes addon is missing, does not load or is older than this checkout.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import type { Kernels } from "../src/model/kernels";
import {
  blasCandidates,
  DEFAULT_NATIVE,
  loadNative,
  NATIVE_BUILD_FIX,
  type IsaChoice,
  type NativeOptions,
  type Precision,
} from "../src/model/engine/native";

/** gemm.h's arguments after the kernel: transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc. */
type GemmArgs = [
  transA: boolean,
  transB: boolean,
  M: number,
  N: number,
  K: number,
  alpha: number,
  A: Float32Array,
  lda: number,
  B: Float32Array,
  ldb: number,
  beta: number,
  C: Float32Array,
  ldc: number,
];

/** What the probes addon exports (native/probes.c). */
interface Probes {
  /** This addon's own GEMM for its timed attention (setup.c, as the engine's setGemm). */
  setGemm(kind: "builtin" | "blas", isa: IsaChoice, precision?: Precision): { supported: string[]; bf16Check: string };
  loadBlas(paths: string[]): { ok: boolean; tried: string };
  gemmPeak(isa: IsaChoice, iters: number): number;
  gemm(isa: IsaChoice, ...args: GemmArgs): void;
  /** With calls: the product that many times back to back; returns this thread's CPU seconds for them. */
  gemm(isa: IsaChoice, ...args: [...GemmArgs, calls: number]): number;
  /** gemm on bf16 operands (native/gemm.h: gemm_bf16), alpha 1; "amx" is the AMX-BF16 kernel, "avx512bf16" the
   *  VDPBF16PS one. */
  gemmBf16(isa: IsaChoice, ...args: GemmArgs): void;
  gemmBf16(isa: IsaChoice, ...args: [...GemmArgs, calls: number]): number;
  gemmBf16Hw(): boolean;
  /** The process's weights, whose products' B the AMX and VDPBF16PS kernels keep packed (empty: forgotten). */
  bf16Weights(params: Float32Array): void;
  /** out = exp(x) (Float32Array) or log(x) (Float64Array) on one instruction set's copy of the row kernels' maths. */
  vmath(fn: "exp", isa: Exclude<IsaChoice, "auto">, x: Float32Array, out: Float32Array): void;
  vmath(fn: "log", isa: Exclude<IsaChoice, "auto">, x: Float64Array, out: Float64Array): void;
  /** The bandwidth probes over all of x: "triad" x = y + s z, "axpy" x += s y. */
  streamProbe(kind: "triad" | "axpy", x: Float64Array, y: Float64Array, z: Float64Array, s: number): void;
  /** The fused attention's timed copy (the engine's arguments and bits), and the ms (wall) its work between the
   *  block products took on this thread since the last attentionProfile(). */
  attentionForwardProfiled: Kernels["attentionForward"];
  attentionBackwardProfiled: Kernels["attentionBackward"];
  attentionProfile(): number;
}

/** The probes addon's path (this file runs as dist/bench/native-probes.js). */
export const PROBES_FILE = path.resolve(__dirname, "..", "..", "build", "Release", "tstrain_probes.node");

let cache: Probes | null | undefined;

/** The probes addon; null where the native engine does not load; throws with the build command where the engine
 *  loads and the probes do not. */
export function loadProbes(): Probes | null {
  if (cache === undefined) cache = "reason" in loadNative() ? null : probesAt(PROBES_FILE);
  return cache;
}

/** The probes addon at `file`, or an Error naming what is wrong with it and the command that builds it. */
export function probesAt(file: string): Probes {
  // named from the working directory where it lies under it (build/Release/...), else by its absolute path
  const under = path.relative(process.cwd(), file);
  const rel = under && !under.startsWith("..") && !path.isAbsolute(under) ? under : file;
  const refuse = (why: string) => new Error(`the bench's native probes ${why}: ${NATIVE_BUILD_FIX}`);
  if (!fs.existsSync(file)) throw refuse(`are not built (no ${rel})`);
  let p: Probes;
  try {
    const req: (id: string) => unknown = require; // a computed require: tsc needs no types for the .node file
    p = req(file) as Probes;
  } catch (e) {
    throw refuse(`do not load (${rel}: ${(e instanceof Error ? e.message : String(e)).split("\n")[0].slice(0, 200)})`);
  }
  if (typeof p.attentionProfile !== "function" || typeof p.bf16Weights !== "function")
    throw refuse(`are older than this checkout (${rel} has no attentionProfile or bf16Weights)`);
  return p;
}

/** GFLOP/s of one core on a register-only loop of independent chains of that kernel's instruction set ("amx":
 *  TDPBF16PS tiles, "avx512bf16": VDPBF16PS; what the bench measures a GEMM against); 0 when the CPU lacks it. */
export function fmaPeak(isa: Exclude<IsaChoice, "auto">, iters: number): number | null {
  return loadProbes()?.gemmPeak(isa, iters) ?? null;
}

/** The built-in GEMM on one kernel, with leading dimensions (gemm.h's contract), whatever the thread's --isa. */
export function builtinGemm(): Probes["gemm"] | null {
  return loadProbes()?.gemm ?? null;
}

/** The built-in bf16 GEMM on one kernel. hw: the CPU has AMX-BF16 ("amx"); dp: the VDPBF16PS kernel ("avx512bf16")
 *  runs here (else check says why not); weights: the process's weights (their products' B kept packed, as a rank
 *  keeps them; an empty array forgets them). */
export function builtinGemmBf16(): {
  gemm: Probes["gemmBf16"];
  hw: boolean;
  dp: boolean;
  check: string;
  weights: (p: Float32Array) => void;
} | null {
  const p = loadProbes();
  if (!p) return null;
  const s = p.setGemm("builtin", "auto", "bf16");
  p.setGemm("builtin", "auto");
  current = "";
  return {
    gemm: p.gemmBf16,
    hw: p.gemmBf16Hw(),
    dp: s.supported.includes("avx512bf16"),
    check: s.bf16Check,
    weights: (w: Float32Array) => p.bf16Weights(w),
  };
}

/** The row kernels' exp (float) and log (double) on one instruction set's copy (native/ops/vmath.h). */
export function vmath(): Probes["vmath"] | null {
  return loadProbes()?.vmath ?? null;
}

/** The C bandwidth probes (a triad and an in-place axpy over float64). */
export function streamProbe(): Probes["streamProbe"] | null {
  return loadProbes()?.streamProbe ?? null;
}

/** The fused attention's timed copy, for the bench's split of a step into products and the rest: the same operations
 *  and bits as the engine's; restMs() is the ms (wall) its work between the block products (softmax rows, transposes,
 *  row dots) took on this thread since the previous call. On the GEMM of `opts`, as loadNative(opts)'s kernels run
 *  it (the probes addon's own setGemm); null when those do not load. */
export interface ProfiledAttention {
  forward: Kernels["attentionForward"];
  backward: Kernels["attentionBackward"];
  restMs(): number;
}

/** The GEMM the probes addon's thread runs now (its setGemm is per thread, as the engine's). */
let current = "";

export function profiledAttention(opts: NativeOptions = DEFAULT_NATIVE): ProfiledAttention | null {
  if ("reason" in loadNative(opts)) return null;
  const p = loadProbes();
  if (!p) return null;
  const blas = opts.gemm === "openblas";
  if (blas) {
    const b = p.loadBlas(blasCandidates());
    if (!b.ok) throw new Error(`the bench's native probes: no BLAS found (${b.tried || "no candidate"})`);
  }
  const key = blas ? "blas/auto/fp32" : `builtin/${opts.isa}/${opts.precision ?? "fp32"}`;
  const use = () => {
    if (current !== key) {
      p.setGemm(blas ? "blas" : "builtin", blas ? "auto" : opts.isa, blas ? "fp32" : (opts.precision ?? "fp32"));
      current = key;
    }
  };
  return {
    forward: (...args) => {
      use();
      p.attentionForwardProfiled(...args);
    },
    backward: (...args) => {
      use();
      p.attentionBackwardProfiled(...args);
    },
    restMs: () => p.attentionProfile(),
  };
}
