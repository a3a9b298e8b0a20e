// The compute engines a model test runs on (#11): tfjs-wasm always, tfjs-cpu, and native when it loads. With
// TSTRAIN_REQUIRE_NATIVE=1 a native engine that cannot load FAILS the test instead of skipping it.
import type { TestContext } from "node:test";
import { initEngine, type Engine } from "../../src/model/backend";
import { loadNative } from "../../src/model/engine/native";
import { parseArgs } from "../../src/config";

export type EngineChoice = "wasm" | "cpu" | "native";
export const ENGINES: readonly EngineChoice[] = ["wasm", "cpu", "native"];

/** The engine, or null after marking the test skipped (native unavailable and not required). */
export async function useEngine(t: TestContext, name: EngineChoice): Promise<Engine | null> {
  if (name !== "native") return initEngine(name);
  const n = loadNative();
  if ("kernels" in n) return { kernels: n.kernels, engine: "native", detail: n.kernels.name };
  const why = `native engine unavailable here: ${n.reason}; fix: ${n.fix}`;
  if (process.env.TSTRAIN_REQUIRE_NATIVE === "1") throw new Error(`TSTRAIN_REQUIRE_NATIVE=1 but the ${why}`);
  t.skip(why);
  return null;
}

/** Engines the end-to-end (actor) tests run on: the portable fallback and the fast path. */
export const RUN_ENGINES: readonly ("wasm" | "native")[] = ["wasm", "native"];

/**
 * The `--backend` argv for an actor run on this engine, or null after marking the test skipped (native: the addon
 * or BLAS unavailable, or this checkout's --backend has no `native`; a failure under TSTRAIN_REQUIRE_NATIVE=1).
 */
export function runEngineArgs(t: TestContext, name: "wasm" | "native"): string[] | null {
  if (name === "wasm") return ["--backend", "wasm"];
  let why: string | null = null;
  const n = loadNative();
  if (!("kernels" in n)) why = `native engine unavailable here: ${n.reason}; fix: ${n.fix}`;
  else {
    try { parseArgs(["--backend", "native"]); } catch (e) { why = `--backend native is not accepted here (${(e as Error).message.split("\n")[0]})`; }
  }
  if (why === null) return ["--backend", "native"];
  if (process.env.TSTRAIN_REQUIRE_NATIVE === "1") throw new Error(`TSTRAIN_REQUIRE_NATIVE=1 but ${why}`);
  t.skip(why);
  return null;
}
