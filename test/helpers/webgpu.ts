// The webgpu engine for a test (src/model/engine/webgpu/engine.ts): this thread's own adapter and device, or null after
// marking the test skipped. With TSTRAIN_REQUIRE_WEBGPU=1 (CI, where .ci/run installed Mesa 25's lavapipe) an
// engine that cannot open FAILS the test instead.
import * as fs from "node:fs";
import * as path from "node:path";
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

/**
 * Two Vulkan devices on a machine with one software adapter (test-only): Mesa's lavapipe driver loaded twice, its
 * copy in `dir` with its own ICD file. `rename` patches the copy's device name ("llvmpipe (LLVM ..." to "llvmpipX
 * (LLVM ...", the same length) so that a run shows which of the two a rank opened; without it the two are identical,
 * as two GPUs of one model look to Dawn but for their PCI addresses, which lavapipe has none of. Returns the
 * VK_DRIVER_FILES value that loads both (the original first), or why not (no lavapipe here).
 */
export function twoLavapipes(dir: string, rename: boolean): { driverFiles: string } | { why: string } {
  const icd = ["lvp_icd.json", "lvp_icd.x86_64.json"]
    .map((f) => path.join("/usr/share/vulkan/icd.d", f))
    .find((f) => fs.existsSync(f));
  if (!icd) return { why: "no lavapipe ICD file in /usr/share/vulkan/icd.d" };
  const doc = JSON.parse(fs.readFileSync(icd, "utf8")) as { ICD: { library_path: string } };
  const lib = doc.ICD.library_path;
  const found = path.isAbsolute(lib)
    ? lib
    : ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]
        .map((d) => path.join(d, lib))
        .find((f) => fs.existsSync(f));
  if (!found || !fs.existsSync(found)) return { why: `lavapipe's library ${lib} not found` };
  const bytes = fs.readFileSync(found);
  if (rename) {
    const from = Buffer.from("llvmpipe (LLVM ");
    const at = bytes.indexOf(from);
    if (at < 0 || bytes.indexOf(from, at + 1) >= 0)
      throw new Error(`${found}: no single "llvmpipe (LLVM " name to rename (Mesa changed its device name?)`);
    bytes.write("llvmpipX (LLVM ", at, "latin1");
  }
  const copy = path.join(dir, "libvulkan_lvp_copy.so");
  fs.writeFileSync(copy, bytes);
  const copyIcd = path.join(dir, "lvp_copy_icd.json");
  fs.writeFileSync(copyIcd, JSON.stringify({ ...doc, ICD: { ...doc.ICD, library_path: copy } }));
  return { driverFiles: `${icd}:${copyIcd}` };
}

/** n floats in [-1, 1) from `seed`, as a view 3 floats into its buffer (in a SharedArrayBuffer when `shared`): the
 *  engine must honour a view's offset. */
export function rand(n: number, seed: number, shared = false): Float32Array {
  const a = shared
    ? new Float32Array(new SharedArrayBuffer(4 * (n + 5))).subarray(3, 3 + n)
    : new Float32Array(n + 5).subarray(3, 3 + n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    a[i] = (s / 2 ** 32) * 2 - 1;
  }
  return a;
}
