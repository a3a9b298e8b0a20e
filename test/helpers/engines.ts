// The compute engines a model test runs on (#11): tfjs-wasm always, tfjs-cpu, and native when it loads. With
// TSTRAIN_REQUIRE_NATIVE=1 a native engine that cannot load FAILS the test instead of skipping it.
import type { TestContext } from "node:test";
import { initEngine, type Engine } from "../../src/model/backend";

export type EngineChoice = "wasm" | "cpu" | "native";
export const ENGINES: readonly EngineChoice[] = ["wasm", "cpu", "native"];

/** The engine, or null after marking the test skipped (native unavailable and not required). */
export async function useEngine(t: TestContext, name: EngineChoice): Promise<Engine | null> {
  try {
    return await initEngine(name as Parameters<typeof initEngine>[0]);
  } catch (e) {
    if (name === "native" && process.env.TSTRAIN_REQUIRE_NATIVE !== "1") {
      t.skip(`native engine unavailable here: ${(e as Error).message.split("\n")[0]}`);
      return null;
    }
    throw e;
  }
}
