/**
 * The one command-line flag parser of the small commands (generate, prepare, hub-server) and of the bench: a table of
 * flags, each a function that reads its value (if any) and sets it in the options. Each command keeps its own words:
 * what a missing value and an unknown flag say (and which rule they cite) are its own functions. The trainer's flags
 * are config.ts's (a typed table, src/config-flags.json), not this.
 */
import type { FlagChange } from "./errors";

/** What a flag's function reads the command line through. */
export interface FlagArgs {
  /** the flag as written (before any `=value`) */
  readonly flag: string;
  /** the flag's value, through the command's check (CliSyntax.value): a string, or it throws */
  value(): string;
  /** the next argument as it is (undefined at the end), for a command that checks its values itself */
  next(): string | undefined;
  /** the arguments after the value up to the next `--flag`, taken (a flag of several values) */
  more(): string[];
}

/** The flags: each name's function (an alias is a second name for one function). */
export type FlagTable<O> = Record<string, (o: O, a: FlagArgs) => void>;

export interface CliSyntax {
  /** the value given after a flag (undefined: none), returned when it is one, else an error thrown */
  value(flag: string, v: string | undefined): string;
  /** the error for an argument that is no flag of the table */
  unknown(arg: string): Error;
  /** `--flag=value` is read as `--flag value` (default: no) */
  inline?: boolean;
  /**
   * The error for a flag given more than once (G10's rule, each command's words): `given`, its words each time;
   * `once`, the arguments with each flag once, its last value kept (advice to run). Unset: the last value wins.
   */
  repeated?(given: string[], once: string[]): Error;
  /** Flags that may be given more than once, their values adding up (prepare's --input). */
  repeatable?: readonly string[];
}

/** Sets the options from argv through the table, in order; null for --help or -h (the caller prints its help). A
 *  flag given twice is refused by `syntax.repeated` when the command has one (an alias is the same flag). */
export function parseFlags<O>(argv: readonly string[], o: O, table: FlagTable<O>, syntax: CliSyntax): O | null {
  const given = new Map<unknown, Array<{ from: number; to: number }>>(); // each flag's words, by its function
  for (let i = 0; i < argv.length; i++) {
    const from = i;
    const a = argv[i];
    const eq = syntax.inline ? a.indexOf("=") : -1;
    const flag = eq >= 0 ? a.slice(0, eq) : a;
    let inline: string | undefined = eq >= 0 ? a.slice(eq + 1) : undefined;
    if (flag === "--help" || flag === "-h") return null;
    if (!Object.hasOwn(table, flag)) throw syntax.unknown(a);
    const next = (): string | undefined => {
      if (inline !== undefined) {
        const v = inline;
        inline = undefined;
        return v;
      }
      return argv[++i];
    };
    table[flag](o, {
      flag,
      next,
      value: () => syntax.value(flag, next()),
      more: () => {
        const out: string[] = [];
        while (i + 1 < argv.length && !argv[i + 1].startsWith("--")) out.push(argv[++i]);
        return out;
      },
    });
    if (!syntax.repeatable?.includes(flag))
      given.set(table[flag], [...(given.get(table[flag]) ?? []), { from, to: i }]);
  }
  const twice = [...given.values()].filter((r) => r.length > 1);
  if (twice.length && syntax.repeated) {
    const dropped = twice.flatMap((r) => r.slice(0, -1));
    const once = argv.filter((_, i) => !dropped.some((r) => i >= r.from && i <= r.to));
    throw syntax.repeated(
      twice[0].map((r) => argv.slice(r.from, r.to + 1).join(" ")),
      once,
    );
  }
  return o;
}

/**
 * One word of a shell command, quoted when the shell would read it otherwise (every `;`, `(` and space is), or when
 * it ends in `,` (a printed command may be followed by ", or"); a line break or other control character is written
 * in bash's $'...' as a hex escape ($'\x0a'), so that a command stays on one line.
 */
export function shellWord(a: string): string {
  if (/^[\w@%+=:,./-]+$/.test(a) && !a.endsWith(",")) return a;
  const control = (c: string) => c.charCodeAt(0) < 0x20 || c.charCodeAt(0) === 0x7f;
  const chars = [...a];
  if (chars.some(control))
    return `$'${chars.map((c) => (control(c) ? `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}` : c === "\\" || c === "'" ? `\\${c}` : c)).join("")}'`;
  return `'${a.replace(/'/g, "'\\''")}'`;
}

/**
 * `argv` with each change of `changes` made (errors.ts FlagChange): every `--flag v`, `--flag=v` (or, for a switch,
 * `--flag`) given is dropped, then each flag set is added at the end, in order: `[flag, value]` as `flag value`,
 * `[flag, true]` as `flag`. A flag dropped (`null`, `false`) is only removed.
 */
export function argvWith(argv: readonly string[], changes: readonly FlagChange[]): string[] {
  let out = [...argv];
  for (const [flag, value] of changes) {
    const kept: string[] = [];
    for (let i = 0; i < out.length; i++) {
      if (out[i] === flag) {
        if (typeof value === "string" || value === null) i++; // its value goes with it
      } else if (!out[i].startsWith(`${flag}=`)) kept.push(out[i]);
    }
    out = kept;
  }
  for (const [flag, value] of changes) {
    if (typeof value === "string") out.push(flag, value);
    else if (value === true) out.push(flag);
  }
  return out;
}

/**
 * A command for advice that runs: `head` (e.g. `node dist/generate.js`), then `argv` with `changes` made (argvWith),
 * each word quoted for the shell.
 */
export function commandWith(head: readonly string[], argv: readonly string[], ...changes: FlagChange[]): string {
  return [...head, ...argvWith(argv, changes)].map(shellWord).join(" ");
}
