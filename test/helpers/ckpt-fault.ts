/**
 * Preloaded with `node --require` into a CLI run (worker threads inherit it): strikes one checkpoint
 * folder's write at one point, named by TSTRAIN_TEST_CKPT_FAULT=<mode>:<step>:
 *   manifest-fails     writing manifest.json fails with EIO after its first half is on disk
 *   die-in-manifest    the process is SIGKILLed with half of manifest.json written
 *   die-before-rename  the process is SIGKILLed after the manifest, as the folder is renamed into place
 *   slow-write         (TSTRAIN_TEST_CKPT_FAULT=slow-write:<ms>) every checkpoint folder's write takes <ms>
 *                      longer: the uploader's thread sleeps before renaming it into place
 * Test-only: the trainer knows nothing of it.
 */
import * as path from "node:path";
// The module object itself (not an import's read-only view of it), so the trainer's fs calls see the patches.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const fs: typeof import("node:fs") = require("node:fs");

const spec = process.env.TSTRAIN_TEST_CKPT_FAULT;
if (spec) {
  const [mode, step] = spec.split(":");
  const partial = new RegExp(`[/\\\\]checkpoint-${step}\\.partial-\\d+$`);
  // Its manifest wherever it is written: in the partial folder, or (a broken writer) in the final one.
  const folder = new RegExp(`[/\\\\]checkpoint-${step}(\\.partial-\\d+)?$`);
  const isManifest = (p: unknown) =>
    typeof p === "string" && path.basename(p) === "manifest.json" && folder.test(path.dirname(p));
  const manifestFds = new Set<number>();
  const open = fs.openSync,
    write = fs.writeSync,
    rename = fs.renameSync;
  (fs as { openSync: unknown }).openSync = (...a: unknown[]): number => {
    const fd = (open as (...x: unknown[]) => number)(...a);
    if (isManifest(a[0])) manifestFds.add(fd);
    return fd;
  };
  (fs as { writeSync: unknown }).writeSync = (...a: unknown[]): number => {
    const [fd, buf] = a as [number, Uint8Array];
    if (manifestFds.has(fd) && (mode === "manifest-fails" || mode === "die-in-manifest")) {
      write(fd, buf, 0, Math.max(1, buf.byteLength >> 1));
      if (mode === "die-in-manifest") process.kill(process.pid, "SIGKILL");
      throw Object.assign(new Error("EIO: i/o error, write (injected by test/helpers/ckpt-fault)"), {
        code: "EIO",
        errno: -5,
        syscall: "write",
      });
    }
    return (write as (...x: unknown[]) => number)(...a);
  };
  (fs as { renameSync: unknown }).renameSync = (
    from: import("node:fs").PathLike,
    to: import("node:fs").PathLike,
  ): void => {
    if (mode === "die-before-rename" && partial.test(String(from))) process.kill(process.pid, "SIGKILL");
    if (mode === "slow-write" && /[/\\]checkpoint-\d+\.partial-\d+$/.test(String(from)))
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Number(step));
    rename(from, to);
  };
}
