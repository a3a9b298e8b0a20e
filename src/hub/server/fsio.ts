/**
 * Durable file writes for the local Hub: every file is written under a temporary name, fsynced,
 * renamed into place, and its directory fsynced, so that once a commit is acknowledged it survives
 * a crash of the process or the machine, and a crash before that leaves the previous state.
 */
import * as fs from "node:fs";
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

/**
 * Why `dir` cannot be written, as its nearest existing ancestor says (EROFS, EACCES, …), or null. A recursive mkdir
 * under a read-only mount fails with ENOENT (node's report of the missing parent): this finds the EROFS behind it.
 */
export function unwritableCode(dir: string): string | null {
  let d = path.resolve(dir);
  for (;;) {
    try {
      fs.accessSync(d, fs.constants.W_OK);
      return null;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== "ENOENT") return code ?? null;
    }
    const up = path.dirname(d);
    if (up === d) return null;
    d = up;
  }
}

/** An fs error with `code` in place of what `e` said (the EROFS behind an ENOENT), keeping its syscall and path. */
function recoded(e: NodeJS.ErrnoException, code: string): NodeJS.ErrnoException {
  const x = new Error(`${code}: ${e.syscall ?? "access"} '${e.path ?? ""}'`) as NodeJS.ErrnoException;
  Object.assign(x, { code, syscall: e.syscall, path: e.path });
  return x;
}

/** The errno error `e`, or the one behind it when the folder `dir` cannot be written (an ENOENT on a read-only mount). */
export function realFsError(e: unknown, dir: string): unknown {
  const x = e as NodeJS.ErrnoException;
  if (typeof x !== "object" || x === null || (x.code !== "ENOENT" && x.code !== "EACCES")) return e;
  const why = unwritableCode(dir);
  return why && why !== x.code ? recoded(x, why) : e;
}

/**
 * L9: the store's folder made (when absent) and a 64 KiB file written, fsynced and removed in it: a folder on a
 * read-only or full filesystem fails here, before the server listens, with the error's own code (EROFS, ENOSPC …).
 */
export async function checkStoreWritable(dir: string): Promise<void> {
  const probe = path.join(dir, tmpName(".tstrain-hub-probe", "probe"));
  try {
    await fsp.mkdir(dir, { recursive: true });
    const fh = await fsp.open(probe, "wx");
    try {
      await fh.writeFile(Buffer.alloc(64 * 1024));
      await fh.sync();
    } finally {
      await fh.close();
    }
  } catch (e) {
    const x = e as NodeJS.ErrnoException;
    if (x && typeof x === "object" && x.code && !x.path) x.path = probe; // a write by descriptor names no path
    throw realFsError(e, dir);
  } finally {
    await fsp.rm(probe, { force: true }).catch(() => undefined); // best effort: a read-only folder holds no probe
  }
}
