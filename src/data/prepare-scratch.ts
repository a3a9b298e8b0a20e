/**
 * The scratch folders of a prepare (D2): the staging folder `<out>.partial-<pid>` a mix is built in (and a
 * Hub tokenizer's download folder). A build registers them while it runs; the CLI's signal handler removes
 * them and says what it removed (removeScratchNow); the next prepare into the same --out removes the
 * partial folders that processes no longer running left behind (removeStalePartials).
 */
import * as fs from "node:fs";
import * as path from "node:path";

const live = new Set<string>();

/** The staging folder of a build of `out` by process `pid`. */
export function stagingDirOf(out: string, pid = process.pid): string {
  return `${out}.partial-${pid}`;
}

export function trackScratch(dir: string): void {
  live.add(dir);
}

export function untrackScratch(dir: string): void {
  live.delete(dir);
}

/** Removes every scratch folder of the build in progress (on a signal); returns those that were there. */
export function removeScratchNow(): string[] {
  const removed: string[] = [];
  for (const d of live) {
    if (!fs.existsSync(d)) continue;
    try {
      fs.rmSync(d, { recursive: true, force: true });
      removed.push(d);
    } catch {
      // best effort: the message names only what is gone
    }
  }
  live.clear();
  return removed;
}

function pidRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"; // alive, owned by someone else
  }
}

/** Removes `<out>.partial-<pid>` folders whose process is gone, saying so; a running one's is left alone. */
export function removeStalePartials(out: string, log: (line: string) => void): void {
  const dir = path.dirname(out);
  const prefix = `${path.basename(out)}.partial-`;
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return; // the parent does not exist yet: nothing was left there
  }
  for (const n of names) {
    if (!n.startsWith(prefix) || !/^\d+$/.test(n.slice(prefix.length))) continue;
    const pid = Number(n.slice(prefix.length));
    if (pid === process.pid) continue; // ours: emptied when the build starts
    const p = path.join(dir, n);
    if (pidRunning(pid)) {
      log(`prepare: leaving ${p} alone: pid ${pid} is still running (another prepare into ${out}?)`);
      continue;
    }
    fs.rmSync(p, { recursive: true, force: true });
    log(`prepare: removed ${p}, the partial build of an interrupted prepare (pid ${pid} is not running)`);
  }
}
