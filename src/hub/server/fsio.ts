/**
 * Durable file writes for the local Hub: every file is written under a temporary name, fsynced,
 * renamed into place, and its directory fsynced, so that once a commit is acknowledged it survives
 * a crash of the process or the machine, and a crash before that leaves the previous state.
 */
import * as fsp from "node:fs/promises";
import * as path from "node:path";
import { randomBytes } from "node:crypto";

export function tmpName(p: string, tag = "tmp"): string {
  return `${p}.${process.pid}.${randomBytes(4).toString("hex")}.${tag}`;
}

/** Open `p` with `flags`, fsync it, close it. */
async function fsyncPath(p: string, flags: "r" | "r+"): Promise<void> {
  const fh = await fsp.open(p, flags);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

export function fsyncDir(dir: string): Promise<void> {
  return fsyncPath(dir, "r");
}

export function fsyncFile(p: string): Promise<void> {
  return fsyncPath(p, "r+");
}

/** Write, fsync, rename over p, fsync the directory. Readers see the old or the new file, never a part. */
export async function writeDurable(p: string, data: string | Uint8Array): Promise<void> {
  const tmp = tmpName(p);
  try {
    const fh = await fsp.open(tmp, "w");
    try {
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await fsp.rename(tmp, p);
  } catch (e) {
    await fsp.rm(tmp, { force: true });
    throw e;
  }
  await fsyncDir(path.dirname(p));
}

/** A fully written and fsynced temporary file moved to p (durably). */
export async function renameDurable(tmp: string, p: string): Promise<void> {
  await fsyncFile(tmp);
  await fsp.rename(tmp, p);
  await fsyncDir(path.dirname(p));
}

export async function readJsonOrNull<T>(p: string): Promise<T | null> {
  try {
    return JSON.parse(await fsp.readFile(p, "utf8")) as T;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw e;
  }
}
