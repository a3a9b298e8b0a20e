/**
 * Engine selection (P1; docs/engines.md). `auto` takes the native engine (the Node-API addon with its
 * built-in GEMM, src/model/engine/native.ts) when it loads, else a tfjs backend: tfjs-node-gpu,
 * then tfjs-node (both optionalDependencies whose install may have failed offline, or whose libtensorflow may
 * not load), else wasm (XNNPACK, SIMD; single-threaded in Node), else cpu. The `backend:` line says what was
 * tried, why it was passed over, and the command that gets the fast path. Every worker thread calls this for
 * itself: each thread has its own tfjs engine and wasm instance (and loads the addon for itself).
 */
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs-core";
import type { BackendName } from "../config";
import { changesInWords, type FixWay, UserError } from "../errors";
import type { Kernels } from "./kernels";
import { createTfjsKernels } from "./engine/tfjs";
import { bf16Support, DEFAULT_NATIVE, loadNative, supportedIsas, type NativeOptions } from "./engine/native";
import { createWebgpuKernels } from "./engine/webgpu/engine";
import { listWebgpuGpus, probeWebgpuSync, type WebgpuUnavailable } from "./engine/webgpu/device";
import { type GpuPlan, type GpuSelect, planGpus } from "./engine/webgpu/gpus";

/** What `--backend` accepts: defined once, with the config. */
export type { BackendName };
/** The tfjs backends (initBackend). */
export type TfjsBackendName = Exclude<BackendName, "native" | "webgpu">;

const NODE_PACKAGES = ["@tensorflow/tfjs-node-gpu", "@tensorflow/tfjs-node"] as const;

let wasmPathsSet = false;

function why(e: unknown): string {
  const m = e instanceof Error ? e.message : String(e);
  if (/Cannot find module/.test(m)) return "not installed";
  return m.split("\n")[0].slice(0, 200);
}

async function tryTensorflow(tried: string[]): Promise<string | null> {
  for (const pkg of NODE_PACKAGES) {
    try {
      // A computed name, so tsc neither needs the package nor its types; it registers "tensorflow".
      const req: (id: string) => unknown = require;
      req(pkg);
      if (!tf.findBackendFactory("tensorflow")) {
        tried.push(
          `${pkg}: loaded but registered no "tensorflow" backend with this @tensorflow/tfjs-core (version mismatch?)`,
        );
        continue;
      }
      if (await tf.setBackend("tensorflow")) return pkg;
      tried.push(`${pkg}: the tensorflow backend failed to initialise`);
    } catch (e) {
      tried.push(`${pkg}: ${why(e)}`);
    }
  }
  return null;
}

async function tryWasm(tried: string[]): Promise<boolean> {
  try {
    const wasm = require("@tensorflow/tfjs-backend-wasm") as typeof import("@tensorflow/tfjs-backend-wasm");
    if (!wasmPathsSet && !tf.engine().registry.wasm) {
      // Load the .wasm binaries from the package's own dist folder: no network, any cwd, any thread.
      wasm.setWasmPaths(path.dirname(require.resolve("@tensorflow/tfjs-backend-wasm")) + path.sep);
      wasmPathsSet = true;
    }
    if (await tf.setBackend("wasm")) return true;
    tried.push("wasm: the backend failed to initialise");
  } catch (e) {
    tried.push(`wasm: ${why(e)}`);
  }
  return false;
}

async function tryCpu(tried: string[]): Promise<boolean> {
  try {
    require("@tensorflow/tfjs-backend-cpu");
    if (await tf.setBackend("cpu")) return true;
    tried.push("cpu: the backend failed to initialise");
  } catch (e) {
    tried.push(`cpu: ${why(e)}`);
  }
  return false;
}

export async function initBackend(
  requested: TfjsBackendName,
): Promise<{ backend: "tensorflow" | "wasm" | "cpu"; detail: string }> {
  const tried: string[] = [];
  const done = async (backend: "tensorflow" | "wasm" | "cpu", what: string) => {
    await tf.ready();
    const flags =
      backend === "wasm"
        ? ` (SIMD ${tf.env().getBool("WASM_HAS_SIMD_SUPPORT") ? "on" : "off"}, ${tf.env().getBool("WASM_HAS_MULTITHREAD_SUPPORT") ? "multi" : "single"}-threaded)`
        : "";
    const fell = tried.length ? `; tried before: ${tried.join("; ")}` : "";
    return { backend, detail: `${requested}: ${what}${flags}${fell}` };
  };
  switch (requested) {
    case "tensorflow": {
      const pkg = await tryTensorflow(tried);
      if (pkg) return done("tensorflow", `using ${pkg}`);
      throw tensorflowRefusal(tried);
    }
    case "wasm":
      if (await tryWasm(tried)) return done("wasm", "using @tensorflow/tfjs-backend-wasm");
      throw new UserError(
        "P1",
        `--backend wasm failed to load (${tried.join("; ")}); reinstall @tensorflow/tfjs-backend-wasm, or run `,
        { ways: [{ changes: [["--backend", "cpu"]], why: "tfjs-cpu, slower" }] },
      );
    case "cpu":
      if (await tryCpu(tried)) return done("cpu", "using @tensorflow/tfjs-backend-cpu (plain JS, slow)");
      throw new UserError(
        "P1",
        `--backend cpu failed to load (${tried.join("; ")}); reinstall @tensorflow/tfjs-backend-cpu`,
      );
    case "auto": {
      const pkg = await tryTensorflow(tried);
      if (pkg) return done("tensorflow", `using ${pkg}`);
      if (await tryWasm(tried)) return done("wasm", "using @tensorflow/tfjs-backend-wasm");
      if (await tryCpu(tried)) return done("cpu", "using @tensorflow/tfjs-backend-cpu (plain JS, slow)");
      throw new UserError(
        "P1",
        `no tfjs backend could be loaded (${tried.join("; ")}); reinstall the project's dependencies`,
      );
    }
    default: {
      const never: never = requested;
      throw new UserError("P1", `--backend ${String(never)} is not one of auto, tensorflow, wasm, cpu`);
    }
  }
}

/** A compute engine: the kernels the model runs on, which engine that is, and the `backend:` line's detail. */
export interface Engine {
  kernels: Kernels;
  engine: "native" | "tensorflow" | "wasm" | "cpu" | "webgpu";
  detail: string;
  /** A device engine (webgpu): which GPU this thread opened, in words. */
  device?: string;
}

/**
 * The refusal of an explicit `--backend native` that cannot load (P1), with the command that fixes it. The tfjs
 * fallback is offered for fp32 only: --precision bf16 runs on the native GEMM alone (P8), so it would be refused.
 */
function nativeRefusal(
  requested: BackendName,
  native: NativeOptions,
  n: { reason: string; fix: string; ways?: readonly FixWay[] },
): UserError {
  const what =
    requested === "native"
      ? "--backend native"
      : native.gemm !== DEFAULT_NATIVE.gemm
        ? `--gemm ${native.gemm}`
        : native.isa !== DEFAULT_NATIVE.isa
          ? `--isa ${native.isa}`
          : `--precision ${native.precision}`;
  const ways: FixWay[] = [
    ...(n.ways ?? []),
    ...((native.precision ?? "fp32") === "bf16"
      ? []
      : [{ changes: [["--backend", "wasm"]] as const, why: "tfjs-wasm, slower" }]),
  ];
  const fix = n.fix ? `fix: ${n.fix}${ways.length ? ", or run " : ""}` : ways.length ? "run " : "";
  return new UserError("P1", `${what} is not available: ${n.reason}; ${fix}`, ways.length ? { ways } : undefined);
}

/** Whether the native options name something other than the defaults (an explicit --gemm, --isa or --precision bf16). */
function explicitNative(native: NativeOptions): boolean {
  return (
    native.gemm !== DEFAULT_NATIVE.gemm ||
    native.isa !== DEFAULT_NATIVE.isa ||
    (native.precision ?? "fp32") !== DEFAULT_NATIVE.precision
  );
}

/** The refusal of `--backend webgpu` with no adapter (P1), with the command that gets one. */
function webgpuRefusal(w: WebgpuUnavailable): UserError {
  return new UserError("P1", `--backend webgpu is not available: ${w.reason}; fix: ${w.fix}; or run `, {
    ways: [{ changes: [["--backend", "native"]], why: "the CPU's native engine" }],
  });
}

/** The refusal of an explicit `--backend tensorflow` that cannot load (P1); `tried` says why for each package. */
function tensorflowRefusal(tried: string[]): UserError {
  return new UserError(
    "P1",
    `--backend tensorflow is not available (${tried.join("; ")}); install @tensorflow/tfjs-node-gpu or @tensorflow/tfjs-node with network access (it downloads libtensorflow), or run `,
    { ways: [{ changes: [["--backend", "wasm"]], why: "tfjs-wasm" }] },
  );
}

/**
 * `--backend webgpu`'s ranks on the host's GPUs (A13, gpus.ts): the GPUs listed (once a process), each rank's
 * chosen by `--gpus` (`choice`, "" = all in order), refused before any work where a named GPU is not there; the
 * first rank's opened in a child process (P1). The plan's notes are the start's warnings.
 */
export function webgpuPlan(world: number, choice: string): GpuPlan {
  const plan = planGpus(listWebgpuGpus(), world, choice);
  const w = probeWebgpuSync(plan.ranks[0].index >= 0 ? plan.ranks[0] : null);
  if ("reason" in w) throw webgpuRefusal(w);
  return plan;
}

/** Each rank's GPU under --backend webgpu (webgpuPlan's, from the listing taken once a process); null otherwise. */
export function webgpuRanks(backend: BackendName, world: number, choice: string): GpuSelect[] | null {
  return backend === "webgpu" ? planGpus(listWebgpuGpus(), world, choice).ranks : null;
}

/**
 * Refuses an explicit `--backend native`, `--gemm openblas` or `--isa X` that cannot load, or an explicit
 * `--backend tensorflow` when neither tfjs-node package is installed, in the calling (main) thread, before any work
 * is started (P1). `--backend webgpu` with no adapter (P1), or on a GPU that is not there (A13: webgpuPlan, with
 * `gpus`: the ranks and --gpus). Other requests pass: their engines are chosen in each rank by initEngine (whose
 * refusals also exit 2, A1); and `--isa amx` or `--isa avx512bf16` in an fp32 run (P8). Returns the start's
 * warnings (ranks sharing a GPU).
 */
export function checkEngineRequest(
  requested: BackendName,
  native: NativeOptions = DEFAULT_NATIVE,
  gpus: { world: number; choice: string } = { world: 1, choice: "" },
): string[] {
  if (requested === "webgpu") return webgpuPlan(gpus.world, gpus.choice).notes;
  if (requested === "tensorflow") {
    const tried: string[] = [];
    for (const pkg of NODE_PACKAGES) {
      try {
        require.resolve(pkg);
        return []; // installed: whether its libtensorflow loads is seen by the ranks
      } catch (e) {
        tried.push(`${pkg}: ${why(e)}`);
      }
    }
    throw tensorflowRefusal(tried);
  }
  if (requested !== "native" && !(requested === "auto" && explicitNative(native))) return [];
  refuseBf16KernelInFp32(native);
  const n = loadNative(native);
  if ("reason" in n) throw nativeRefusal(requested, native, n);
  return [];
}

/**
 * P8: --isa amx and --isa avx512bf16 compute bf16 products only, so an fp32 run that names one is refused, with the
 * fixes this CPU runs: its widest fp32 kernel, and --precision bf16 on the bf16 kernel it has (none where it has
 * neither). Where the addon does not load, the P1 refusal that follows names the fix.
 */
function refuseBf16KernelInFp32(native: NativeOptions): void {
  const isa = native.isa;
  if ((native.precision ?? "fp32") !== "fp32" || (isa !== "amx" && isa !== "avx512bf16")) return;
  const fp32 = supportedIsas();
  const k = bf16Support();
  if (!fp32.length || !k) return;
  const has = (i: "amx" | "avx512bf16") => (i === "amx" ? k.hw : k.dp);
  const bf16 = (["amx", "avx512bf16"] as const).filter(has);
  const name = (i: string) => (i === "amx" ? "AMX-BF16" : "AVX512_BF16");
  const ways: FixWay[] = [{ changes: [["--isa", fp32[0]]], why: "fp32 products" }];
  if (has(isa)) ways.push({ changes: [["--precision", "bf16"]], why: "bf16 products" });
  else if (bf16.length)
    ways.push({
      changes: [
        ["--precision", "bf16"],
        ["--isa", bf16[0]],
      ],
      why: "bf16 products",
    });
  const lacks = has(isa) ? "" : `; this CPU has no ${name(isa)} (it runs ${[...bf16, ...fp32].join(", ")})`;
  throw new UserError(
    "P8",
    `--isa ${isa} is a bf16 kernel (${name(isa)}), and this run computes in fp32${lacks}: run `,
    {
      ways,
    },
  );
}

/**
 * The engine for `--backend` (P1). `native`: the native kernels, or a UserError naming the fix. `auto`: native
 * when it loads, else a tfjs backend as initBackend selects it, with the reason native was passed over and its
 * fix in the detail. `webgpu`: the webgpu engine on this thread's own adapter and device (engine/webgpu/engine.ts),
 * on `gpu` (webgpuPlan's choice for the rank; else Dawn's first adapter), or a UserError with the command that gets an
 * adapter. `tensorflow` / `wasm` / `cpu`: that tfjs backend, with the tfjs engine's kernels (matmul on that backend,
 * the rest in JS) on top. Each worker thread calls this for itself.
 */
export async function initEngine(
  requested: BackendName,
  native: NativeOptions = DEFAULT_NATIVE,
  gpu: GpuSelect | null = null,
): Promise<Engine> {
  if (requested === "webgpu") {
    const w = await createWebgpuKernels(gpu);
    if ("reason" in w) throw webgpuRefusal(w);
    return { kernels: w.kernels, engine: "webgpu", detail: `webgpu: ${w.kernels.name}`, device: w.device };
  }
  if (requested === "native" || requested === "auto") {
    const n = loadNative(native);
    if ("kernels" in n) return { kernels: n.kernels, engine: "native", detail: `${requested}: ${n.kernels.name}` };
    if (requested === "native" || explicitNative(native)) throw nativeRefusal(requested, native, n);
    const be = await initBackend("auto");
    const fast = n.fix || (n.ways?.length ? changesInWords(n.ways[0].changes) : "none");
    return {
      kernels: createTfjsKernels(),
      engine: be.backend,
      detail: `${be.detail}; native engine passed over: ${n.reason} (fast path: ${fast})`,
    };
  }
  const be = await initBackend(requested);
  return { kernels: createTfjsKernels(), engine: be.backend, detail: be.detail };
}
