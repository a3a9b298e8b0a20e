/**
 * The run folder (`--out`), checked and claimed before step 1.
 *
 *   O1  --out is a folder that can be created and written, with room for at least one checkpoint
 *       (estimated from the parameter count). A file, a read-only place or a full disk is refused
 *       before any training, naming the path.
 *   O2  One live run per --out: a lock file (`.tstrain.lock`, holding pid and host) refuses a second
 *       run while the first lives; a lock whose pid is dead on this host is stale and taken over, saying so.
 *   O4  Leftovers of interrupted writes (`*.partial-*`) are removed at start; folders moved aside on an
 *       earlier resume (`*.superseded-*`) follow the checkpoint policy (K1): at most one is kept.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { UserError } from "./errors";
import { checkpointRoot, isPartialName } from "./checkpoint/names";

export const LOCK_FILE = ".tstrain.lock";

interface LockBody {
  pid: number;
  host: string;
  started: string;
  argv: string[];
}

function errno(e: unknown): string {
  return (e as NodeJS.ErrnoException)?.code ?? "";
}

function whyNot(e: unknown): string {
  const c = errno(e);
  if (c === "EROFS") return "it is on a read-only filesystem (EROFS)";
  if (c === "EACCES" || c === "EPERM") return `this user may not write there (${c})`;
  if (c === "ENOTDIR") return "a part of the path is a file, not a folder (ENOTDIR)";
  if (c === "ENOSPC") return "the disk is full (ENOSPC)";
  return `${c || (e as Error)?.name}: ${(e as Error)?.message ?? String(e)}`;
}

/** A recursive mkdir reports ENOENT for what is really EROFS or EACCES: ask the deepest existing folder. */
function realMkdirError(abs: string, e: unknown): unknown {
  if (errno(e) !== "ENOENT") return e;
  let q = abs;
  while (!fs.existsSync(path.dirname(q)) && path.dirname(q) !== q) q = path.dirname(q);
  try {
    fs.mkdirSync(q);
    fs.rmdirSync(q);
  } catch (e2) {
    return e2;
  }
  return e;
}

/** O1 (first half): --out exists or can be created, is a folder and can be written. */
export function checkOutWritable(out: string): void {
  const abs = path.resolve(out);
  let st: fs.Stats | null = null;
  try {
    st = fs.statSync(abs);
  } catch (e) {
    if (errno(e) !== "ENOENT")
      throw new UserError("O1", `--out ${abs} cannot be used: ${whyNot(e)}. Choose another --out`);
  }
  if (st && !st.isDirectory()) throw outIsAFile(abs);
  if (!st) {
    try {
      fs.mkdirSync(abs, { recursive: true });
    } catch (e) {
      throw new UserError(
        "O1",
        `--out ${abs} cannot be created: ${whyNot(realMkdirError(abs, e))}. Choose a writable place for --out`,
      );
    }
  }
  const probe = path.join(abs, `.tstrain-probe-${process.pid}`);
  try {
    fs.writeFileSync(probe, "probe\n");
    fs.rmSync(probe, { force: true });
  } catch (e) {
    fs.rmSync(probe, { force: true });
    throw new UserError("O1", `--out ${abs} cannot be written: ${whyNot(e)}. Choose a writable place for --out`);
  }
}

/** O1: --out names a file; the folder beside it (`<out>.run`) is advised where nothing but a folder is there. */
function outIsAFile(abs: string): UserError {
  const beside = `${abs}.run`;
  const what = `--out ${abs} is a file, not a folder; the run folder holds checkpoints, metrics and the export. Choose another --out`;
  let free = true;
  try {
    free = fs.statSync(beside).isDirectory() && fs.readdirSync(beside).length === 0;
  } catch {
    free = true; // nothing there yet
  }
  return free
    ? new UserError("O1", `${what}: run `, { ways: [{ changes: [["--out", beside]], why: "a folder beside it" }] })
    : new UserError("O1", what);
}

/** The path itself, or its nearest parent that exists: what holds it once it is created. */
function nearestExisting(abs: string): string {
  let q = abs;
  while (!fs.existsSync(q) && path.dirname(q) !== q) q = path.dirname(q);
  return q;
}

/**
 * O1 for --dry-run (G7), which writes nothing: --out is a folder, or can be created in the folder above it that
 * exists, and this user may write there (access(2) says so, EROFS included), all without writing a byte.
 */
export function checkOutUsable(out: string): void {
  const abs = path.resolve(out);
  const at = nearestExisting(abs);
  if (!fs.statSync(at).isDirectory())
    throw at === abs
      ? outIsAFile(abs)
      : new UserError(
          "O1",
          `--out ${abs} cannot be created: ${at} is a file, not a folder (ENOTDIR). Choose a writable place for --out`,
        );
  try {
    fs.accessSync(at, fs.constants.W_OK);
  } catch (e) {
    throw new UserError(
      "O1",
      `--out ${abs} cannot be ${at === abs ? "written" : "created"}: ${whyNot(e)}. Choose a writable place for --out`,
    );
  }
}

/** O1, L8 for --dry-run (G7): prepareHubDir's checks and refusals, made without writing (access(2), as checkOutUsable). */
export function checkHubDirUsable(dir: string, flag: string): void {
  const abs = path.resolve(dir);
  const at = nearestExisting(abs);
  const refuse = (what: string) =>
    new UserError(
      "O1",
      `${flag} ${abs} ${what}; the embedded local Hub stores its files there. Choose a writable folder for ${flag}`,
    );
  if (!fs.statSync(at).isDirectory())
    throw refuse(at === abs ? "is a file, not a folder" : `cannot be created: ${at} is a file, not a folder (ENOTDIR)`);
  try {
    fs.accessSync(at, fs.constants.W_OK);
  } catch (e) {
    throw refuse(`cannot be ${at === abs ? "written" : "created"}: ${whyNot(e)}`);
  }
}

/**
 * O1, L8: the embedded Hub's folder (`flag`: --hub-dir, or --out for its default `<out>/hub`) is a folder, or can be
 * made one, and can be written, before the Hub starts. Each missing folder is made one level at a time, so a
 * read-only filesystem says EROFS (a recursive mkdir says ENOENT there). Returns the topmost folder this call made,
 * for `removeIfEmpty` when the run ends, or null when the folder was there already.
 */
export function prepareHubDir(dir: string, flag: string): string | null {
  const abs = path.resolve(dir);
  const missing: string[] = [];
  let top = abs;
  while (!fs.existsSync(top) && path.dirname(top) !== top) {
    missing.unshift(top);
    top = path.dirname(top);
  }
  const refuse = (what: string) =>
    new UserError(
      "O1",
      `${flag} ${abs} ${what}; the embedded local Hub stores its files there. Choose a writable folder for ${flag}`,
    );
  if (!fs.statSync(top).isDirectory())
    throw refuse(
      top === abs ? "is a file, not a folder" : `cannot be created: ${top} is a file, not a folder (ENOTDIR)`,
    );
  let made: string | null = null;
  const probe = path.join(abs, `.tstrain-probe-${process.pid}`);
  try {
    for (const d of missing) {
      fs.mkdirSync(d);
      made ??= d;
    }
    fs.writeFileSync(probe, "probe\n");
    fs.rmSync(probe, { force: true });
  } catch (e) {
    fs.rmSync(probe, { force: true });
    if (made) fs.rmSync(made, { recursive: true, force: true }); // only what this call made, and it holds nothing
    throw refuse(`cannot be ${missing.length ? "created" : "written"}: ${whyNot(e)}`);
  }
  return made;
}

/** A folder this run made (prepareHubDir) and left without a file: removed, so a refused run leaves nothing. */
export function removeIfEmpty(dir: string | null): void {
  if (!dir || !fs.existsSync(dir)) return;
  const holdsFile = (d: string): boolean =>
    fs.readdirSync(d, { withFileTypes: true }).some((e) => !e.isDirectory() || holdsFile(path.join(d, e.name)));
  if (!holdsFile(dir)) fs.rmSync(dir, { recursive: true, force: true });
}

/** O1 (second half): room for at least one checkpoint of `bytes`. */
export function checkOutRoom(out: string, bytes: number, what: string): void {
  const abs = path.resolve(out);
  const s = fs.statfsSync(nearestExisting(abs)); // a dry run has not made --out: the disk it would be made on
  const free = s.bavail * s.bsize;
  if (free < bytes) {
    throw new UserError(
      "O1",
      `--out ${abs} has ${(free / 1e6).toFixed(1)} MB free but one checkpoint of ${what} takes about ${(bytes / 1e6).toFixed(1)} MB: the run could not save its first checkpoint. Free some space there or choose another --out`,
    );
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (e) {
    return errno(e) === "EPERM"; // exists, owned by someone else
  }
  return !zombie(pid);
}

/**
 * A process that has exited but is not yet reaped (Linux state Z) holds its pid but runs nothing: e.g. the process
 * 0 of an MPI job whose launcher was gone before its parent collected it. Elsewhere (no /proc) it counts as running.
 */
function zombie(pid: number): boolean {
  try {
    return /^\S+ \(.*\) Z /s.test(fs.readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

export interface OutLock {
  path: string;
  release(): void;
}

/** O2: claim --out for this process; returns the lock to release at exit. */
export function lockOut(out: string, say: (l: string) => void): OutLock {
  const p = path.join(path.resolve(out), LOCK_FILE);
  const body: LockBody = {
    pid: process.pid,
    host: os.hostname(),
    started: new Date().toISOString(),
    argv: process.argv.slice(2),
  };
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      fs.writeFileSync(p, `${JSON.stringify(body)}\n`, { flag: "wx" });
      let released = false;
      return {
        path: p,
        release() {
          if (released) return;
          released = true;
          try {
            const now = JSON.parse(fs.readFileSync(p, "utf8")) as LockBody;
            if (now.pid === process.pid && now.host === body.host) fs.rmSync(p, { force: true });
          } catch {
            /* gone already */
          }
        },
      };
    } catch (e) {
      if (errno(e) !== "EEXIST")
        throw new UserError("O1", `--out ${path.dirname(p)}: cannot create the lock file ${p}: ${whyNot(e)}`);
    }
    let held: LockBody | null = null;
    try {
      held = JSON.parse(fs.readFileSync(p, "utf8")) as LockBody;
    } catch {
      held = null; // half-written or unreadable: treat as stale
    }
    if (
      held &&
      Number.isSafeInteger(held.pid) &&
      held.host === os.hostname() &&
      held.pid !== process.pid &&
      pidAlive(held.pid)
    ) {
      throw new UserError(
        "O2",
        `--out ${path.dirname(p)} is in use by another run (pid ${held.pid} on ${held.host}, started ${held.started}); two runs in one folder would mix their checkpoints and metrics. Wait for it to end (or stop it: kill ${held.pid}), or choose another --out`,
      );
    }
    if (held && held.host !== os.hostname()) {
      throw new UserError(
        "O2",
        `--out ${path.dirname(p)} is locked by a run on another host (${held.host}, pid ${held.pid}, started ${held.started}) whose liveness this machine cannot check. If that run is over, remove the lock (rm ${p}) and run again; otherwise choose another --out`,
      );
    }
    say(
      `--out ${path.dirname(p)}: taking over a stale lock (${held ? `pid ${held.pid} on ${held.host} is not running, started ${held.started}` : "unreadable lock file"}) (O2)`,
    );
    fs.rmSync(p, { force: true });
  }
  throw new UserError(
    "O2",
    `--out ${path.dirname(p)}: could not take the lock ${p} (another run keeps claiming it); choose another --out`,
  );
}

/** O4: partial folders removed; superseded folders pruned to the newest one. Returns lines to say. */
export function cleanOut(out: string): string[] {
  const said: string[] = [];
  const abs = path.resolve(out);
  for (const dir of [abs, checkpointRoot(abs), path.join(abs, "resume")]) {
    if (!fs.existsSync(dir)) continue;
    const names = fs.readdirSync(dir);
    for (const n of names) {
      if (isPartialName(n) || /\.\w{8}\.part$/.test(n)) {
        fs.rmSync(path.join(dir, n), { recursive: true, force: true });
        said.push(`removed ${path.join(dir, n)}: left by an interrupted write (O4)`);
      }
    }
    const sup = names
      .filter((n) => /\.superseded-\d+$/.test(n))
      .sort((a, b) => Number(a.split("-").pop()) - Number(b.split("-").pop()));
    for (const n of sup.slice(0, Math.max(0, sup.length - 1))) {
      fs.rmSync(path.join(dir, n), { recursive: true, force: true });
      said.push(`removed ${path.join(dir, n)}: an older superseded folder; only the newest is kept (O4, K1)`);
    }
  }
  return said;
}
