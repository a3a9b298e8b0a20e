// The compute engines a model test runs on: tfjs-wasm always, tfjs-cpu, native (the project's own GEMM) when its
// addon loads, and native with `--gemm openblas` when OpenBLAS also loads. With TSTRAIN_REQUIRE_NATIVE=1 (or
// TSTRAIN_REQUIRE_OPENBLAS=1) an engine that cannot load FAILS the test instead of skipping it.
import type { TestContext } from "node:test";
import { initEngine, type Engine } from "../../src/model/backend";
import { loadNative, type NativeLoad } from "../../src/model/engine/native";
import { parseArgs } from "../../src/config";

export type EngineChoice = "wasm" | "cpu" | "native" | "openblas";
export const ENGINES: readonly EngineChoice[] = ["wasm", "cpu", "native", "openblas"];

/** The native load behind a native choice, and the variable that makes its absence a failure. */
function nativeChoice(name: "native" | "openblas"): { n: NativeLoad; require: string } {
  return name === "native"
    ? { n: loadNative(), require: "TSTRAIN_REQUIRE_NATIVE" }
    : { n: loadNative({ gemm: "openblas", isa: "auto" }), require: "TSTRAIN_REQUIRE_OPENBLAS" };
}

/** The engine, or null after marking the test skipped (native/OpenBLAS unavailable and not required). */
export async function useEngine(t: TestContext, name: EngineChoice): Promise<Engine | null> {
  if (name !== "native" && name !== "openblas") return initEngine(name);
  const { n, require } = nativeChoice(name);
  if ("kernels" in n) return { kernels: n.kernels, engine: "native", detail: n.kernels.name };
  const why = `${name} engine unavailable here: ${n.reason}; fix: ${n.fix}`;
  if (process.env[require] === "1") throw new Error(`${require}=1 but the ${why}`);
  t.skip(why);
  return null;
}

/** Engines the end-to-end (actor) tests run on: the portable fallback, the fast path, the fast path on OpenBLAS,
 *  and the fast path with bf16 products (`--precision bf16`, P8). */
export type RunEngine = "wasm" | "native" | "openblas" | "bf16";
export const RUN_ENGINES: readonly RunEngine[] = ["wasm", "native", "openblas", "bf16"];

/** What a run on this choice reports as its backend (RUN_JSON's `backend`). */
export function backendOf(name: RunEngine): string {
  return name === "wasm" ? "wasm" : "native";
}

/** What a run on this choice reports as its precision (RUN_JSON's `precision`). */
export function precisionOf(name: RunEngine): string {
  return name === "bf16" ? "bf16" : "fp32";
}

/**
 * The `--backend` argv for an actor run on this engine, or null after marking the test skipped (native: the addon
 * or BLAS unavailable, or this checkout's --backend has no `native`; a failure under TSTRAIN_REQUIRE_NATIVE=1 or
 * TSTRAIN_REQUIRE_OPENBLAS=1).
 */
export function runEngineArgs(t: TestContext, name: RunEngine): string[] | null {
  if (name === "wasm") return ["--backend", "wasm"];
  const args = {
    native: ["--backend", "native"],
    openblas: ["--backend", "native", "--gemm", "openblas"],
    bf16: ["--backend", "native", "--precision", "bf16"],
  }[name];
  const { n, require } = nativeChoice(name === "bf16" ? "native" : name);
  let why: string | null = null;
  if (!("kernels" in n)) why = `${name} engine unavailable here: ${n.reason}; fix: ${n.fix}`;
  else {
    try {
      parseArgs(args);
    } catch (e) {
      why = `${args.join(" ")} is not accepted here (${(e as Error).message.split("\n")[0]})`;
    }
  }
  if (why === null) return args;
  if (process.env[require] === "1") throw new Error(`${require}=1 but ${why}`);
  t.skip(why);
  return null;
}
