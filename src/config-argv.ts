/**
 * The trainer's command line as words (G10): each flag given read into its value, checked against its row of the
 * flag table (kind, choices) as config.ts hands it in, a flag given twice refused; and the other way, the words of
 * a refusal's advice: the arguments with the advice's changes made, a switch by its own words and a flag the
 * --config file sets reset to its default where the advice drops it. Whether a value is in range is config.ts's to
 * say (`inRange`): there is one validated config, and this is not a second one.
 */
import { argvWith, shellWord } from "./cli-args";
import { closestName } from "./config-file";
import { type Fix, type FlagChange, UserError } from "./errors";

/** A row of the flag table (config.ts's FlagSpec), as far as the command line's words need it. */
export interface ArgvFlag {
  flag: string;
  kind: "string" | "int" | "float" | "bool";
  def: string | number | boolean;
  choices?: readonly string[];
  /** the flag accepts --no-<name> */
  negatable?: boolean;
}

/** Whether a whole number is in a flag's range (config.ts's RANGES; true for a flag without one). */
export type InRange = (flag: string, v: number) => boolean;

export type FlagValue = string | number | boolean;

/**
 * Each flag given, by name, to its parsed value (checked against its kind and choices); and whether --help was.
 * A flag given twice (`--world 2 ... --world 1`, or `--prune --no-prune`) is refused naming both (G10): one of
 * them would be dropped without a word.
 */
export function readFlagValues(
  argv: readonly string[],
  byFlag: ReadonlyMap<string, ArgvFlag>,
  inRange: InRange,
): { values: Map<string, FlagValue>; help: boolean } {
  const values = new Map<string, FlagValue>();
  const given = new Map<string, Array<{ from: number; to: number }>>(); // where each flag's words are in argv
  let help = false;
  const set = (flag: string, v: FlagValue, from: number, to: number) => {
    given.set(flag, [...(given.get(flag) ?? []), { from, to }]);
    values.set(flag, v);
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const at = i;
    if (a === "--help" || a === "-h") {
      help = true;
      continue;
    }
    if (!a.startsWith("--"))
      throw new UserError("G10", `unexpected argument ${JSON.stringify(a)}: flags start with -- (see --help)`);
    let name = a.slice(2);
    let inline: string | undefined;
    const eq = name.indexOf("=");
    if (eq >= 0) {
      inline = name.slice(eq + 1);
      name = name.slice(0, eq);
    }
    const spec = byFlag.get(name);
    if (!spec && name.startsWith("no-")) {
      const base = byFlag.get(name.slice(3));
      if (base && base.kind === "bool" && base.negatable) {
        if (inline !== undefined)
          throw new UserError("G10", `--${name} takes no value: run `, { ways: [{ changes: [[`--${name}`, true]] }] });
        set(base.flag, false, at, at);
        continue;
      }
    }
    if (!spec)
      throw new UserError(
        "G10",
        `unknown flag --${name} (see --help for the flags this trainer takes); the closest is --${closestName(name, [...byFlag.keys()])}`,
      );
    if (spec.kind === "bool") {
      if (inline === undefined) {
        set(spec.flag, true, at, at);
        continue;
      }
      if (inline !== "true" && inline !== "false")
        throw new UserError("G10", `--${name}=${inline}: a switch is on or off: run `, {
          ways: [
            { changes: [[`--${name}`, "true"]], why: "on" },
            { changes: [[`--${name}`, "false"]], why: "off" },
          ],
        });
      set(spec.flag, inline === "true", at, at);
      continue;
    }
    const raw = inline ?? argv[++i];
    set(spec.flag, flagValue(spec, name, raw, inRange), at, i);
  }
  const twice = [...given.values()].filter((r) => r.length > 1);
  if (twice.length) throw repeatedFlag(argv, twice);
  return { values, help };
}

/** A string or number flag's value as given (undefined: none came), checked against its kind and choices. */
function flagValue(spec: ArgvFlag, name: string, raw: string | undefined, inRange: InRange): FlagValue {
  if (raw === undefined)
    throw new UserError("G10", `--${name} needs a value: run `, {
      ways: [{ changes: [[`--${name}`, String(spec.def)]], why: "its default" }],
    });
  if (spec.kind !== "string") return parseNumber(spec, raw, inRange);
  if (spec.choices && !spec.choices.includes(raw))
    throw new UserError("G10", `--${name} ${JSON.stringify(raw)} is not one of ${spec.choices.join(", ")}: run `, {
      ways: [{ changes: [[`--${name}`, String(spec.def)]], why: "its default; another of them works too" }],
    });
  return raw;
}

/** G10: a flag given more than once, named each time, with the command that gives each flag once: its last value,
 *  the one a shell script's override means. */
function repeatedFlag(argv: readonly string[], twice: Array<Array<{ from: number; to: number }>>): UserError {
  const words = (r: { from: number; to: number }) => argv.slice(r.from, r.to + 1).join(" ");
  const list = (rs: Array<{ from: number; to: number }>) =>
    `${rs.slice(0, -1).map(words).join(", ")} and ${words(rs[rs.length - 1])}`;
  const dropped = twice.flatMap((rs) => rs.slice(0, -1));
  const kept = argv.filter((_, i) => !dropped.some((r) => i >= r.from && i <= r.to));
  return new UserError(
    "G10",
    `${list(twice[0])} set the same flag${twice.length > 1 ? ` (and ${twice.length - 1} more flag${twice.length > 2 ? "s" : ""} given twice)` : ""}: a flag is read once, and all but one would be dropped without a word. Give each once, as in node dist/main.js ${kept.map(shellWord).join(" ")}`,
  );
}

/** A number flag's value as written (`_` and spaces allowed), refused naming the value and a value that works. */
function parseNumber(spec: ArgvFlag, raw: string, inRange: InRange): number {
  const t = raw.trim().replace(/_/g, "");
  const v = Number(t);
  const dflt: Fix = { ways: [{ changes: [[`--${spec.flag}`, String(spec.def)]], why: "its default" }] };
  if (t === "" || !Number.isFinite(v))
    throw new UserError("G10", `--${spec.flag} ${JSON.stringify(raw)} is not a number: run `, dflt);
  if (spec.kind === "int" && !Number.isInteger(v)) {
    const near = [Math.floor(v), Math.ceil(v)].filter((x) => inRange(spec.flag, x));
    const fix = near.length ? { ways: near.map((x) => ({ changes: [[`--${spec.flag}`, String(x)] as const] })) } : dflt;
    throw new UserError("G10", `--${spec.flag} ${raw} must be a whole number: run `, fix);
  }
  if (spec.kind === "int" && !Number.isSafeInteger(v))
    throw new UserError(
      "G10",
      `--${spec.flag} ${raw} is too large: a whole number is counted exactly up to ${Number.MAX_SAFE_INTEGER} (2^53 - 1); run `,
      dflt,
    );
  return v;
}

/** The flag table's row a flag names (`--no-X` names X's, `--X=v` X's), or undefined. */
export function specOf<F extends ArgvFlag>(flags: readonly F[], flag: string): F | undefined {
  const name = flag.replace(/^--/, "").replace(/=.*$/, "");
  return flags.find((f) => f.flag === name || (f.negatable && `no-${f.flag}` === name));
}

/**
 * The trainer's arguments with `changes` made (cli-args.ts argvWith): a switch (a bool flag) is set by its words
 * (`--X`, `--no-X`, or `--X=false` where it has no --no-X) and every word naming it goes first; a flag dropped that
 * the --config file sets is set to its default instead, since the file's value would apply without it.
 */
export function argvWithChanges(
  argv: readonly string[],
  changes: readonly FlagChange[],
  flags: readonly ArgvFlag[],
  fromFile: ReadonlySet<string>,
): string[] {
  const out: FlagChange[] = [];
  for (const [flag, v] of changes) {
    const spec = specOf(flags, flag);
    const dropped = v === null || v === false;
    if (!spec) out.push([flag, v]);
    else if (spec.kind !== "bool")
      out.push([`--${spec.flag}`, dropped && fromFile.has(spec.flag) ? String(spec.def) : v]);
    else {
      out.push([`--${spec.flag}`, false]);
      if (spec.negatable) out.push([`--no-${spec.flag}`, false]);
      const on = dropped
        ? fromFile.has(spec.flag)
          ? (spec.def as boolean)
          : null
        : flag.startsWith("--no-")
          ? false
          : v !== "false";
      if (on !== null)
        out.push(on ? [`--${spec.flag}`, true] : [spec.negatable ? `--no-${spec.flag}` : `--${spec.flag}=false`, true]);
    }
  }
  return argvWith(argv, out);
}
