/**
 * tfjs backend selection (DESIGN "Backends"). `auto` takes tfjs-node-gpu, then tfjs-node (both are
 * optionalDependencies whose install may have failed offline, or whose libtensorflow may not load),
 * else wasm (XNNPACK, SIMD; single-threaded in Node), else cpu. Every worker thread calls this for
 * itself: each thread has its own tfjs engine and its own wasm instance.
 */
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs-core";
import { UserError } from "../errors";
import type { Kernels } from "./kernels";
import { createTfjsKernels } from "./engine/tfjs";

export type BackendName = "auto" | "tensorflow" | "wasm" | "cpu";

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
        tried.push(`${pkg}: loaded but registered no "tensorflow" backend with this @tensorflow/tfjs-core (version mismatch?)`);
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
    if (!wasmPathsSet && !tf.engine().registry["wasm"]) {
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

export async function initBackend(requested: BackendName): Promise<{ backend: "tensorflow" | "wasm" | "cpu"; detail: string }> {
  const tried: string[] = [];
  const done = async (backend: "tensorflow" | "wasm" | "cpu", what: string) => {
    await tf.ready();
    const flags = backend === "wasm"
      ? ` (SIMD ${tf.env().getBool("WASM_HAS_SIMD_SUPPORT") ? "on" : "off"}, ${tf.env().getBool("WASM_HAS_MULTITHREAD_SUPPORT") ? "multi" : "single"}-threaded)`
      : "";
    const fell = tried.length ? `; tried before: ${tried.join("; ")}` : "";
    return { backend, detail: `${requested}: ${what}${flags}${fell}` };
  };
  switch (requested) {
    case "tensorflow": {
      const pkg = await tryTensorflow(tried);
      if (pkg) return done("tensorflow", `using ${pkg}`);
      throw new UserError("P1", `--backend tensorflow is not available (${tried.join("; ")}); install @tensorflow/tfjs-node-gpu or @tensorflow/tfjs-node with network access (it downloads libtensorflow), or pass --backend wasm`);
    }
    case "wasm":
      if (await tryWasm(tried)) return done("wasm", "using @tensorflow/tfjs-backend-wasm");
      throw new UserError("P1", `--backend wasm failed to load (${tried.join("; ")}); reinstall @tensorflow/tfjs-backend-wasm or pass --backend cpu`);
    case "cpu":
      if (await tryCpu(tried)) return done("cpu", "using @tensorflow/tfjs-backend-cpu (plain JS, slow)");
      throw new UserError("P1", `--backend cpu failed to load (${tried.join("; ")}); reinstall @tensorflow/tfjs-backend-cpu`);
    case "auto": {
      const pkg = await tryTensorflow(tried);
      if (pkg) return done("tensorflow", `using ${pkg}`);
      if (await tryWasm(tried)) return done("wasm", "using @tensorflow/tfjs-backend-wasm");
      if (await tryCpu(tried)) return done("cpu", "using @tensorflow/tfjs-backend-cpu (plain JS, slow)");
      throw new UserError("P1", `no tfjs backend could be loaded (${tried.join("; ")}); reinstall the project's dependencies`);
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
  engine: "native" | "tensorflow" | "wasm" | "cpu";
  detail: string;
}

/**
 * The engine for `--backend` (P1): a tfjs backend as initBackend selects it (same order, same messages), with the
 * tfjs engine's kernels (matmul on that backend, the rest in JS) on top. Each worker thread calls this for itself.
 */
export async function initEngine(requested: BackendName): Promise<Engine> {
  const be = await initBackend(requested);
  return { kernels: createTfjsKernels(), engine: be.backend, detail: be.detail };
}
