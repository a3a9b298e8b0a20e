// The compute engines a model test runs on (#11): tfjs-wasm always, tfjs-cpu, and native when it loads. With
// TSTRAIN_REQUIRE_NATIVE=1 a native engine that cannot load FAILS the test instead of skipping it.
import type { TestContext } from "node:test";
import { initEngine, type Engine } from "../../src/model/backend";
import { loadNative } from "../../src/model/engine/native";

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
