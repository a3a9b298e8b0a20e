// The webgpu engine for a test (src/model/engine/webgpu/engine.ts): this thread's own adapter and device, or null after
// marking the test skipped. With TSTRAIN_REQUIRE_WEBGPU=1 (CI, where .ci/run installed Mesa 25's lavapipe) an
// engine that cannot open FAILS the test instead.
import type { TestContext } from "node:test";
import { type DeferredKernels, isDeferred, type Kernels } from "../../src/model/kernels";
import { createWebgpuKernels, webgpuEngineOn } from "../../src/model/engine/webgpu/engine";
import { openWebgpuDevice, probeWebgpuSync } from "../../src/model/engine/webgpu/device";

export const REQUIRE_WEBGPU = "TSTRAIN_REQUIRE_WEBGPU";

function unavailable(t: TestContext, reason: string, fix: string): null {
  const why = `webgpu engine unavailable here: ${reason}; fix: ${fix}`;
  if (process.env[REQUIRE_WEBGPU] === "1") throw new Error(`${REQUIRE_WEBGPU}=1 but the ${why}`);
  t.skip(why);
  return null;
}

export async function useWebgpu(t: TestContext): Promise<DeferredKernels | null> {
  const w = await createWebgpuKernels();
  if ("reason" in w) return unavailable(t, w.reason, w.fix);
  return w.kernels;
}

/** Whether a child process (a run) can open an adapter here; false after marking the test skipped. */
export function webgpuRuns(t: TestContext): boolean {
  const w = probeWebgpuSync();
  if ("reason" in w) return unavailable(t, w.reason, w.fix) !== null;
  return true;
}

/** The settle of a deferred engine (kernels.ts: DeferredKernels; the webgpu engine is one). */
export function settleOf(k: Kernels): DeferredKernels["settle"] {
  if (!isDeferred(k)) throw new Error(`${k.name} has no settle()`);
  return k.settle;
}

/** A webgpu engine with options (split-K forced, a planted defect) on its own device, or null as useWebgpu. */
export async function useWebgpuWith(
  t: TestContext,
  opts: Parameters<typeof webgpuEngineOn>[2],
): Promise<DeferredKernels | null> {
  const d = await openWebgpuDevice();
  if ("reason" in d) return unavailable(t, d.reason, d.fix);
  return webgpuEngineOn(d.device, d.name, opts).kernels;
}
