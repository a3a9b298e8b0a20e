/**
 * The native CPU engine (issue 11): the Kernels interface on a Node-API addon built from native/tstrain.c
 * (scripts/build-native.cjs, run by `npm ci`), with every matrix product on the system's OpenBLAS
 * (cblas_sgemm, found at run time with dlopen, pinned to 1 thread per rank). Arrays are read and written in
 * place (ArrayBuffer, SharedArrayBuffer, subarray views): no copies, no per-rank replica.
 *
 * loadNative() never throws: it returns the kernels, or why they cannot load and the command that fixes it.
 * Every worker thread calls it for itself (the addon loads once per thread; the BLAS once per process).
 */
import * as fs from "node:fs";
import * as path from "node:path";
import type { Kernels } from "../kernels";

/** What the addon exports (native/tstrain.c): the Kernels methods with the same arguments, plus the loader. */
interface Addon {
  loadBlas(paths: string[]): { ok: boolean; path: string; config: string; threads: number; tried: string };
  simd(): string;
  matmul: Kernels["matmul"];
  embeddingForward: Kernels["embeddingForward"];
  embeddingBackward: Kernels["embeddingBackward"];
  rmsnormForward: Kernels["rmsnormForward"];
  rmsnormBackward: Kernels["rmsnormBackward"];
  ropeForward: Kernels["ropeForward"];
  ropeBackward: Kernels["ropeBackward"];
  attentionForward: Kernels["attentionForward"];
  attentionBackward: Kernels["attentionBackward"];
  swigluForward: Kernels["swigluForward"];
  swigluBackward: Kernels["swigluBackward"];
  crossEntropy: Kernels["crossEntropy"];
}

export type NativeLoad = { kernels: Kernels; blas: string; addon: string } | { reason: string; fix: string };

/** The command that builds the addon, in any state of the checkout (it never fails; it says what is missing). */
export const NATIVE_BUILD_FIX = "npm run build:native (needs a C compiler, make and python3: apt-get install build-essential python3)";
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
    return ["libopenblas.dylib", "/opt/homebrew/opt/openblas/lib/libopenblas.dylib", "/usr/local/opt/openblas/lib/libopenblas.dylib"];
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

let cached: NativeLoad | null = null;

/** The native kernels, or why not and the fix. Cached per thread. */
export function loadNative(): NativeLoad {
  if (cached) return cached;
  cached = load();
  return cached;
}

function load(): NativeLoad {
  const root = repoRoot();
  const file = root ? path.join(root, "build", "Release", "tstrain_native.node") : null;
  if (!file || !fs.existsSync(file)) {
    return { reason: `the addon is not built (no ${file ? path.relative(process.cwd(), file) || file : "build/Release/tstrain_native.node"})`, fix: NATIVE_BUILD_FIX };
  }
  let addon: Addon;
  try {
    // A computed require: tsc needs no types for the .node file.
    const req: (id: string) => unknown = require;
    addon = req(file) as Addon;
  } catch (e) {
    const m = (e instanceof Error ? e.message : String(e)).split("\n")[0]!.slice(0, 200);
    return { reason: `the addon does not load (${m})`, fix: NATIVE_BUILD_FIX };
  }
  const candidates = blasCandidates();
  const b = addon.loadBlas(candidates);
  if (!b.ok) {
    const where = process.env.TSTRAIN_BLAS ? `TSTRAIN_BLAS=${process.env.TSTRAIN_BLAS}` : "OpenBLAS";
    return { reason: `no BLAS found (${where}: ${b.tried || "no candidate"})`, fix: BLAS_FIX };
  }
  const threads = b.threads > 0 ? `${b.threads} thread` : "threads as configured";
  const name = `native (${b.config} from ${b.path}, ${threads}; C kernels ${addon.simd()})`;
  return { kernels: nativeKernels(addon, name), blas: b.config, addon: file };
}

function nativeKernels(a: Addon, name: string): Kernels {
  // The addon's functions do not use `this`: the object hands them out as they are (no wrapper per call).
  return {
    name,
    matmul: a.matmul,
    embeddingForward: a.embeddingForward,
    embeddingBackward: a.embeddingBackward,
    rmsnormForward: a.rmsnormForward,
    rmsnormBackward: a.rmsnormBackward,
    ropeForward: a.ropeForward,
    ropeBackward: a.ropeBackward,
    attentionForward: a.attentionForward,
    attentionBackward: a.attentionBackward,
    swigluForward: a.swigluForward,
    swigluBackward: a.swigluBackward,
    crossEntropy: a.crossEntropy,
    dispose: () => undefined, // the addon keeps no state between calls (attention's scratch is per call)
  };
}
