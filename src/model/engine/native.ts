/**
 * The native CPU engine: the Kernels interface on a Node-API addon built from the C under native/ (tstrain.c the
 * Node-API layer, ops/ the row, attention and optimizer kernels, gemm/ the GEMM; the list is binding.gyp's) by
 * scripts/build-native.cjs, run by `npm ci`. Matrix products run on the project's own GEMM (native/gemm/:
 * AVX-512, AVX2 or portable micro-kernels chosen at run time, one order of summation, the same bits on each) or,
 * with `--gemm openblas`, on the system's OpenBLAS (cblas_sgemm, found at run time with dlopen, pinned to 1
 * thread per rank). Arrays are read and written in place (ArrayBuffer, SharedArrayBuffer, subarray views): no
 * copies, no per-rank replica.
 *
 * loadNative() never throws: it returns the kernels, or why they cannot load and the command that fixes it.
 * Every worker thread calls it for itself (the addon loads once per thread; the BLAS once per process).
 */
import * as fs from "node:fs";
import * as path from "node:path";
import type { Kernels } from "../kernels";
import type { GemmChoice, IsaChoice, Precision } from "../../config";
import type { FixWay } from "../../errors";

/** What the addon exports (native/tstrain.c): the Kernels methods with the same arguments, plus the loader. The
 *  tests' and the bench's probes are another addon's (native/probes.c, loaded by bench/native-probes.ts only). */
interface Addon {
  loadBlas(paths: string[]): { ok: boolean; path: string; config: string; threads: number; tried: string };
  simd(): string;
  /** This thread's GEMM from now on; throws a RangeError for an instruction set the CPU lacks. */
  setGemm(
    kind: "builtin" | "blas",
    isa: IsaChoice,
    precision?: Precision,
  ): {
    kind: string;
    isa: string;
    detail: string;
    best: string;
    supported: string[];
    precision: Precision;
    /** bf16: why the VDPBF16PS kernel is not used ("" where it passed its self-check, or the CPU has AMX) */
    bf16Check: string;
  };
  /** The process's weights: the bf16 AMX and VDPBF16PS kernels keep their packed copies until bf16WeightsChanged(). */
  bf16Weights(params: Float32Array): void;
  bf16WeightsChanged(): void;
  bf16WeightsPrepack(part: number, parts: number): void;
  matmul: Kernels["matmul"];
  embeddingForward: Kernels["embeddingForward"];
  embeddingBackward: Kernels["embeddingBackward"];
  rmsnormForward: Kernels["rmsnormForward"];
  rmsnormBackward: Kernels["rmsnormBackward"];
  ropeForward: Kernels["ropeForward"];
  ropeBackward: Kernels["ropeBackward"];
  attentionForward: Kernels["attentionForward"];
  attentionBackward: Kernels["attentionBackward"];
  attentionCachedForward: Kernels["attentionCachedForward"];
  swigluForward: Kernels["swigluForward"];
  swigluBackward: Kernels["swigluBackward"];
  crossEntropy: Kernels["crossEntropy"];
  /** acc = g (first) or acc += g in float64, then g = 0, over all of g (native/ops/optim.c); isa: that copy of the
   *  vector code (the tests), undefined: this thread's GEMM kernel's. */
  fold(acc: Float64Array, g: Float32Array, first: boolean, isa: Exclude<IsaChoice, "auto"> | undefined): void;
  /** reduceChunks64 over chunks [c0, c1) (native/ops/optim.c). */
  reduceChunks(
    slots: readonly Float64Array[],
    grad: Float32Array,
    invScale: number,
    P: number,
    sq: Float64Array,
    c0: number,
    c1: number,
  ): void;
  /** AdamW over [lo, hi) in place (native/ops/optim.c); h: the 9 float32 hyperparameters; isa as for fold. */
  adamw(
    params: Float32Array,
    m: Float32Array,
    v: Float32Array,
    g: Float32Array,
    lo: number,
    hi: number,
    h: Float32Array,
    isa: Exclude<IsaChoice, "auto"> | undefined,
  ): void;
}

/**
 * The native kernels, or why not: `fix` is the command that mends this machine or checkout (none: ""), and `ways`
 * the changes to the run's flags that do without it (errors.ts FixWay).
 */
export type NativeLoad =
  | { kernels: Kernels; blas: string; addon: string }
  | { reason: string; fix: string; ways?: readonly FixWay[] };

export type { GemmChoice, IsaChoice, Precision };
export interface NativeOptions {
  gemm: GemmChoice;
  isa: IsaChoice;
  /** The matrix products' operands (P8): fp32, or bf16 on the built-in GEMM (accumulating in fp32). Default fp32. */
  precision?: Precision;
}
export const DEFAULT_NATIVE: NativeOptions = { gemm: "builtin", isa: "auto", precision: "fp32" };

/** The command that builds the addon, in any state of the checkout (it never fails; it says what is missing). */
export const NATIVE_BUILD_FIX =
  "npm run build:native (needs a C compiler, make and python3: apt-get install build-essential python3)";
export const BLAS_FIX = "apt-get install libopenblas0-pthread (or set TSTRAIN_BLAS=/path/to/libopenblas.so)";

/** The repository root: the nearest folder above this file with binding.gyp (dist/src/model/engine or src/model/engine). */
function repoRoot(): string | null {
  let d = __dirname;
  for (let i = 0; i < 6; i++) {
    if (fs.existsSync(path.join(d, "binding.gyp"))) return d;
    const up = path.dirname(d);
    if (up === d) break;
    d = up;
  }
  return null;
}

/** Where OpenBLAS is looked for, in order: TSTRAIN_BLAS alone when set, else the usual names and Debian/Ubuntu/Fedora/Homebrew paths. */
export function blasCandidates(env: NodeJS.ProcessEnv = process.env): string[] {
  if (env.TSTRAIN_BLAS) return [env.TSTRAIN_BLAS];
  const arch = process.arch === "arm64" ? "aarch64" : process.arch === "x64" ? "x86_64" : process.arch;
  if (process.platform === "darwin") {
    return [
      "libopenblas.dylib",
      "/opt/homebrew/opt/openblas/lib/libopenblas.dylib",
      "/usr/local/opt/openblas/lib/libopenblas.dylib",
    ];
  }
  return [
    "libopenblas.so.0",
    `/usr/lib/${arch}-linux-gnu/openblas-pthread/libopenblas.so.0`,
    `/usr/lib/${arch}-linux-gnu/libopenblas.so.0`,
    `/usr/lib/${arch}-linux-gnu/openblas-openmp/libopenblas.so.0`,
    `/usr/lib/${arch}-linux-gnu/openblas-serial/libopenblas.so.0`,
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
    "libopenblas.so",
  ];
}

const cached = new Map<string, NativeLoad>();
let addonCache: { addon: Addon; file: string } | { reason: string; fix: string } | null = null;
/** The GEMM this thread's addon runs now (setGemm is per thread): kernels objects switch it when they differ. */
let current = "";

/** The native kernels with this GEMM, or why not and the fix. Cached per thread and per choice. */
export function loadNative(opts: NativeOptions = DEFAULT_NATIVE): NativeLoad {
  const key = `${opts.gemm}/${opts.isa}/${opts.precision ?? "fp32"}`;
  let n = cached.get(key);
  if (!n) {
    n = load(opts);
    cached.set(key, n);
  }
  return n;
}

function loadAddon(): { addon: Addon; file: string } | { reason: string; fix: string } {
  addonCache ??= requireAddon();
  return addonCache;
}

function requireAddon(): { addon: Addon; file: string } | { reason: string; fix: string } {
  const root = repoRoot();
  const file = root ? path.join(root, "build", "Release", "tstrain_native.node") : null;
  if (!file || !fs.existsSync(file)) {
    return {
      reason: `the addon is not built (no ${file ? path.relative(process.cwd(), file) || file : "build/Release/tstrain_native.node"})`,
      fix: NATIVE_BUILD_FIX,
    };
  }
  let addon: Addon;
  try {
    // A computed require: tsc needs no types for the .node file.
    const req: (id: string) => unknown = require;
    addon = req(file) as Addon;
  } catch (e) {
    const m = (e instanceof Error ? e.message : String(e)).split("\n")[0].slice(0, 200);
    return { reason: `the addon does not load (${m})`, fix: NATIVE_BUILD_FIX };
  }
  if (typeof addon.setGemm !== "function")
    return { reason: "the addon is older than this checkout (no setGemm)", fix: NATIVE_BUILD_FIX };
  return { addon: playedCpu(addon, process.env.TSTRAIN_TEST_ISAS), file };
}

/**
 * Tests and the bench only (unset in every real run): TSTRAIN_TEST_ISAS="avx2,portable" makes the addon play a CPU
 * that runs only those of this CPU's kernels (amx and avx512bf16 among them or not), so that what a run says and
 * advises on another CPU is checked here, as test/train.isa-* check each kernel's bits. `auto` takes the widest
 * kernel played; any other is refused as such a CPU refuses it; a bf16 run without avx512bf16 played is emulated,
 * and says the CPU has no AVX512_BF16.
 */
function playedCpu(addon: Addon, played: string | undefined): Addon {
  if (!played) return addon;
  const only = new Set(played.split(",").map((s) => s.trim()));
  const real: Addon["setGemm"] = (kind, isa, precision) =>
    precision === undefined ? addon.setGemm(kind, isa) : addon.setGemm(kind, isa, precision);
  const setGemm: Addon["setGemm"] = (kind, isa, precision) => {
    if (kind !== "builtin") return real(kind, isa, precision);
    const all = real("builtin", "auto", precision);
    const supported = all.supported.filter((i) => only.has(i));
    const pick = isa === "auto" ? supported[0] : isa;
    if (pick === undefined || !supported.includes(pick))
      throw new RangeError("tstrain native setGemm: this CPU does not have that instruction set (TSTRAIN_TEST_ISAS)");
    const info = real("builtin", pick as IsaChoice, precision);
    const noDp = precision === "bf16" && !only.has("avx512bf16");
    return { ...info, supported, best: supported[0], bf16Check: noDp ? "the CPU has no AVX512_BF16" : info.bf16Check };
  };
  // the addon's exports are read-only: the played functions shadow them on an object that inherits the rest
  return Object.create(addon, { setGemm: { value: setGemm } }) as Addon;
}

function load(opts: NativeOptions): NativeLoad {
  const got = loadAddon();
  if ("reason" in got) return got;
  const { addon, file } = got;
  if (opts.gemm === "openblas") {
    const b = addon.loadBlas(blasCandidates());
    if (!b.ok) {
      const where = process.env.TSTRAIN_BLAS ? `TSTRAIN_BLAS=${process.env.TSTRAIN_BLAS}` : "OpenBLAS";
      return {
        reason: `no BLAS found (${where}: ${b.tried || "no candidate"})`,
        fix: BLAS_FIX,
        ways: [{ changes: [["--gemm", null]], why: "the built-in GEMM" }],
      };
    }
    const threads = b.threads > 0 ? `${b.threads} thread` : "threads as configured";
    const name = `native (GEMM: ${b.config} from ${b.path}, ${threads}; C kernels ${addon.simd()})`;
    return { kernels: nativeKernels(addon, name, "blas", "auto", "fp32"), blas: b.config, addon: file };
  }
  const precision = opts.precision ?? "fp32";
  let info: ReturnType<Addon["setGemm"]>;
  try {
    info = addon.setGemm("builtin", opts.isa, precision);
    current = "";
  } catch (e) {
    const best = addon.setGemm("builtin", "auto", precision);
    addon.setGemm("builtin", "auto");
    current = "";
    return {
      reason: `--isa ${opts.isa}: this CPU has no ${opts.isa} (it runs ${best.supported.join(", ")}: ${(e as Error).message})`,
      fix: "",
      ways: [{ changes: [["--isa", null]], why: `--isa auto, here ${best.supported[0]}` }],
    };
  }
  const hwBf16 = info.isa === "amx" || info.isa === "avx512bf16";
  const prec =
    precision === "fp32"
      ? "fp32"
      : `bf16 products${hwBf16 ? "" : ` (TDPBF16PS emulated${info.bf16Check ? `: ${info.bf16Check}` : ""})`}, fp32 accumulation`;
  const name = `native (GEMM: built-in ${info.isa}, ${info.detail} micro-kernel, ${prec}; C kernels ${addon.simd()}, row kernels ${hwBf16 ? "avx512" : info.isa})`;
  return {
    kernels: nativeKernels(addon, name, "builtin", opts.isa, precision),
    blas: `built-in ${info.isa}`,
    addon: file,
  };
}

/** The built-in GEMM's kernels this CPU runs, widest first (empty when the addon does not load). */
export function supportedIsas(): Exclude<IsaChoice, "auto">[] {
  const got = loadAddon();
  if ("reason" in got) return [];
  const s = got.addon.setGemm("builtin", "auto").supported as Exclude<IsaChoice, "auto">[];
  current = "";
  return s;
}

/** The CPU's bf16 kernels (P8), as setGemm reports them: hw, AMX-BF16 ("amx"); dp, the VDPBF16PS kernel
 *  ("avx512bf16") runs here (AVX512_BF16, and it passed its start-up self-check; else check says why not); null when
 *  the addon does not load. */
export function bf16Support(): { hw: boolean; dp: boolean; check: string } | null {
  const got = loadAddon();
  if ("reason" in got) return null;
  const s = got.addon.setGemm("builtin", "auto", "bf16");
  got.addon.setGemm("builtin", "auto");
  current = "";
  return { hw: s.supported.includes("amx"), dp: s.supported.includes("avx512bf16"), check: s.bf16Check };
}

/** One of the addon's functions, or null when the addon does not load or is older than this checkout (no such
 *  export): the getters of the optimizer kernels. */
function addonMethod<K extends "adamw" | "fold" | "reduceChunks">(key: K): Addon[K] | null {
  const got = loadAddon();
  return "reason" in got || typeof got.addon[key] !== "function" ? null : got.addon[key];
}

/** The optimizer's AdamW pass in C, on the arrays in place (native/ops/optim.c: the WebAssembly kernel's float32
 *  operations in its order, the same bits); null when the addon does not load or is older than this checkout. */
export function nativeAdamw(): Addon["adamw"] | null {
  return addonMethod("adamw");
}

/** foldMicro in C (native/ops/optim.c: each element one exact conversion and add, so the JS loop's bits; the first
 *  fold with streaming stores); null when the addon does not load or is older than this checkout. */
export function nativeFold(): Addon["fold"] | null {
  return addonMethod("fold");
}

/** reduceChunks64 in C (native/ops/optim.c: the JS loop's operations in its order, its bits); null when the addon
 *  does not load or is older than this checkout. */
export function nativeReduce(): Addon["reduceChunks"] | null {
  return addonMethod("reduceChunks");
}

/** A function that makes this thread's GEMM this choice, when another loadNative choice in the thread switched it. */
function gemmUser(a: Addon, kind: "builtin" | "blas", isa: IsaChoice, precision: Precision): () => void {
  const key = `${kind}/${isa}/${precision}`;
  return () => {
    if (current !== key) {
      a.setGemm(kind, isa, precision);
      current = key;
    }
  };
}

/** The Kernels over the addon. The products (matmul and attention's) first make this thread's GEMM the one this
 *  object was loaded with, when another loadNative choice in the same thread switched it. */
function nativeKernels(
  a: Addon,
  name: string,
  kind: "builtin" | "blas",
  isa: IsaChoice,
  precision: Precision,
): Kernels {
  const use = gemmUser(a, kind, isa, precision);
  return {
    name,
    matmul: (...args) => {
      use();
      a.matmul(...args);
    },
    embeddingForward: a.embeddingForward,
    embeddingBackward: a.embeddingBackward,
    rmsnormForward: a.rmsnormForward,
    rmsnormBackward: a.rmsnormBackward,
    ropeForward: a.ropeForward,
    ropeBackward: a.ropeBackward,
    attentionForward: (...args) => {
      use();
      a.attentionForward(...args);
    },
    attentionBackward: (...args) => {
      use();
      a.attentionBackward(...args);
    },
    attentionCachedForward: a.attentionCachedForward,
    swigluForward: a.swigluForward,
    swigluBackward: a.swigluBackward,
    crossEntropy: a.crossEntropy,
    ...(precision === "bf16"
      ? {
          weightsAre: (p: Float32Array) => a.bf16Weights(p),
          weightsChanged: () => a.bf16WeightsChanged(),
          prepareWeights: (part: number, parts: number) => a.bf16WeightsPrepack(part, parts),
        }
      : {}),
    // nothing held per object: attention's scratch is per call, and the bf16 weight copies are the process's,
    // shared by its threads (native/gemm/weights.c)
    dispose: () => undefined,
  };
}
