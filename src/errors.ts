/**
 * A change a refusal advises to the command the user ran: `[flag, value]` sets the flag (in place of any value
 * given), `[flag, true]` gives a switch (a flag with no value), `[flag, null]` drops the flag and its value, and
 * `[flag, false]` drops a switch.
 */
export type FlagChange = readonly [flag: string, value: string | boolean | null];

/** One way out of a refusal: the changes that make the command the user ran work, and what it then does. */
export interface FixWay {
  readonly changes: readonly FlagChange[];
  /** Said after the command, in parentheses: "its default", "to use it". */
  readonly why?: string;
}

/**
 * The advice of a refusal that is a change to its command line: the ways out, each written where it is printed as
 * the whole command that makes its changes (withCommands: the entry point knows the command it was started with),
 * joined by ", or ", after the message and before `after`. Without that command each is said as its changes.
 */
export interface Fix {
  readonly ways: readonly FixWay[];
  /** Text after the ways (the rest of the sentence, or a command's usage on the lines after). */
  readonly after?: string;
}

/** A way's changes in words, where no command is known: "the same command with --lr 0.003 and without --gpus". */
export function changesInWords(changes: readonly FlagChange[]): string {
  const set = changes
    .filter(([, v]) => typeof v === "string" || v === true)
    .map(([f, v]) => (v === true ? f : `${f} ${v}`));
  const drop = changes.filter(([, v]) => v === null || v === false).map(([f]) => f);
  const parts = [set.length ? `with ${set.join(" ")}` : "", drop.length ? `without ${drop.join(" ")}` : ""];
  return `the same command ${parts.filter(Boolean).join(" and ")}`;
}

/**
 * A refusal the user can act on: bad input, a failed guard, a plan that cannot run.
 * The message names the value, the rule (its id in docs/RULES.md) and what to do instead. `main` prints it
 * without a stack trace and exits 2; anything else is a bug (exit 1, its stack printed under TSTRAIN_DEBUG). The
 * rule closes the first line, also of a message that goes on with more (a command's usage): the line that says
 * what is wrong names its rule.
 * Advice that changes the command line is a `fix`: the message is then the text before it, and each entry point
 * prints its ways as the whole commands that make them (withCommands).
 */
export class UserError extends Error {
  readonly rule: string;
  /** The advice as changes to the command the user ran (withCommands writes them as commands). */
  readonly fix?: Fix;
  /** The message before the fix's ways. */
  readonly lead: string;
  constructor(
    rule: string,
    message: string,
    fix?: Fix,
    /** how a way is written: the command that makes its changes (default: its changes in words) */
    command: (changes: readonly FlagChange[]) => string = changesInWords,
  ) {
    const text = fix
      ? `${message}${fix.ways.map((w) => `${command(w.changes)}${w.why ? ` (${w.why})` : ""}`).join(", or ")}${fix.after ?? ""}`
      : message;
    const nl = text.indexOf("\n");
    super(nl < 0 ? `${text} [${rule}]` : `${text.slice(0, nl)} [${rule}]${text.slice(nl)}`);
    this.name = "UserError";
    this.rule = rule;
    this.lead = message;
    if (fix) this.fix = fix;
  }

  /** This refusal with each way of its fix written as `command` writes its changes (itself when it has no fix). */
  withCommands(command: (changes: readonly FlagChange[]) => string): UserError {
    return this.fix ? new UserError(this.rule, this.lead, this.fix, command) : this;
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
