/**
 * A refusal the user can act on: bad input, a failed guard, a plan that cannot run.
 * The message names the value, the rule (its id in docs/RULES.md) and what to do instead. `main` prints it
 * without a stack trace and exits 2; anything else is a bug and keeps its stack. The rule closes the first line,
 * also of a message that goes on with more (a command's usage): the line that says what is wrong names its rule.
 */
export class UserError extends Error {
  readonly rule: string;
  constructor(rule: string, message: string) {
    const nl = message.indexOf("\n");
    super(nl < 0 ? `${message} [${rule}]` : `${message.slice(0, nl)} [${rule}]${message.slice(nl)}`);
    this.name = "UserError";
    this.rule = rule;
  }
}

/** True for a UserError, also one that crossed a thread as a plain object (name survives). */
export function isUserError(e: unknown): e is { name: string; message: string; rule?: string } {
  return typeof e === "object" && e !== null && (e as { name?: unknown }).name === "UserError";
}

/** What each user-causable `fs` (or listen) error code means, said to the user (never "a bug"). */
const FS_MEANING: Record<string, string> = {
  ENOSPC: "the disk is full (ENOSPC): free space there, or write to another disk, then run the same command again",
  EDQUOT:
    "the disk quota is used up (EDQUOT): free space there, or write to another disk, then run the same command again",
  EACCES: "permission denied (EACCES): give yourself access to it (ls -ld; chmod/chown), or use another path",
  EPERM: "the operation is not permitted there (EPERM): use a path you own",
  EROFS: "the filesystem is read-only (EROFS): use a writable path",
  ENOENT: "no such file or folder (ENOENT): check the path",
  ENOTDIR: "a part of the path is a file, not a folder (ENOTDIR): check the path",
  EISDIR: "it is a folder where a file was expected (EISDIR): name the file",
  ENAMETOOLONG: "the path is too long (ENAMETOOLONG): use a shorter one",
  ELOOP: "the path has a symbolic-link loop (ELOOP): fix the link",
  EFBIG: "the file would exceed the filesystem's size limit (EFBIG): write to another filesystem",
  EMFILE: "too many open files (EMFILE): raise the limit (ulimit -n) and run the same command again",
  EADDRINUSE: "the address is in use (EADDRINUSE): pick another --port, or --port 0 for a free one",
};

/**
 * A refusal for an `fs` error the user can cause (a full disk, a permission, a read-only or missing path),
 * naming the path and what to do; null for anything else (a bug keeps its stack). Every entry point passes
 * what it catches through this before calling it a bug.
 */
export function fsRefusal(e: unknown, rule: string): UserError | null {
  const x = e as NodeJS.ErrnoException & { dest?: string };
  if (typeof x !== "object" || x === null || typeof x.code !== "string" || !(x.code in FS_MEANING)) return null;
  const where = x.path
    ? `${x.syscall ?? "access"} ${x.path}${x.dest ? ` -> ${x.dest}` : ""}`
    : (x.syscall ?? "a file operation");
  return new UserError(rule, `${where} failed: ${FS_MEANING[x.code]}`);
}
