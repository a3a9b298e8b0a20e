/**
 * The per-repo commit lock, shared by every process that serves the same --dir (L2). In one
 * process, callers queue on a promise chain; across processes, the lock is a file created with
 * O_EXCL holding "pid nonce". A lock whose pid is no longer alive (a server SIGKILLed
 * mid-commit) is stale and is broken by the next writer.
 */
import * as fsp from "node:fs/promises";
import { randomBytes } from "node:crypto";
import { HttpError } from "./http";

const chains = new Map<string, Promise<unknown>>();

function alive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Removes the lock file when its holder is dead. Renaming first means two breakers cannot both
 *  remove it: the second one's rename fails with ENOENT. */
async function breakIfStale(lockPath: string): Promise<void> {
  let text: string;
  try {
    text = await fsp.readFile(lockPath, "utf8");
  } catch {
    return;
  }
  const pid = Number(text.split(" ")[0]);
  if (text === "" || alive(pid)) return;
  const aside = `${lockPath}.stale.${randomBytes(4).toString("hex")}`;
  try {
    await fsp.rename(lockPath, aside);
  } catch {
    return;
  }
  const moved = await fsp.readFile(aside, "utf8").catch(() => "");
  // Another breaker replaced it in between and a live writer took it: put that one back.
  if (moved !== text) await fsp.link(aside, lockPath).catch(() => undefined);
  await fsp.rm(aside, { force: true });
}

async function acquire(lockPath: string, timeoutMs: number, onWait: () => void): Promise<string> {
  const token = `${process.pid} ${randomBytes(8).toString("hex")}`;
  const t0 = Date.now();
  for (let i = 0; ; i++) {
    try {
      await fsp.writeFile(lockPath, token, { flag: "wx" });
      return token;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ENOENT") throw new HttpError(404, "Repository not found", "RepoNotFound");
      if (code !== "EEXIST") throw e;
    }
    if (i === 0) onWait();
    await breakIfStale(lockPath);
    if (Date.now() - t0 > timeoutMs) throw new HttpError(503, "the repo is locked by another commit; try again");
    await new Promise((r) => setTimeout(r, Math.min(2 ** i, 50)));
  }
}

async function release(lockPath: string, token: string): Promise<void> {
  const text = await fsp.readFile(lockPath, "utf8").catch(() => "");
  if (text === token) await fsp.rm(lockPath, { force: true });
}

/** Runs fn holding the repo's lock (in this process and across processes on the same directory). */
export function withRepoLock<T>(
  lockPath: string,
  fn: () => Promise<T>,
  onWait: () => void = () => undefined,
  timeoutMs = 60_000,
): Promise<T> {
  const run = async (): Promise<T> => {
    const token = await acquire(lockPath, timeoutMs, onWait);
    try {
      return await fn();
    } finally {
      await release(lockPath, token);
    }
  };
  const prev = chains.get(lockPath) ?? Promise.resolve();
  const next = prev.then(run, run);
  const tail = next.catch(() => undefined);
  chains.set(lockPath, tail);
  void tail.then(() => {
    if (chains.get(lockPath) === tail) chains.delete(lockPath);
  });
  return next;
}
