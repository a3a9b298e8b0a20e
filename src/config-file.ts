/**
 * `--config FILE` (G12): the file's settings, by flag name. A `.json` file is read as JSON (a run's
 * run_config.json, its keys the settings' names), any other as TOML (smol-toml, its keys the flags' names). Each
 * key is matched to a row of the flag table config.ts passes in, and each value checked against that row's kind
 * and choices, as the command line's are; a key that is no flag is refused naming what to write. Whether a value
 * is in range is config.ts's to say (validate): there is one validated config, and this is not a second one.
 */
import * as fs from "node:fs";
import { parse } from "smol-toml";
import { fsRefusal, UserError } from "./errors";

/** A row of the flag table (config.ts's FlagSpec), as far as a file's reader needs it. */
export interface FileFlag {
  flag: string;
  key: string;
  kind: "string" | "int" | "float" | "bool";
  choices?: readonly string[];
  /** the flag accepts --no-<name> */
  negatable?: boolean;
}

/** The flag table as config.ts gives it: every row, the torch-only flags (refused when set) and the keys a
 *  run_config.json records that are no flag (skipped when read back). */
export interface FileFlagTable {
  flags: readonly FileFlag[];
  torchOnly: ReadonlySet<string>;
  recordedOnly: ReadonlySet<string>;
}

export type FileValue = string | number | boolean;

/** G12: the settings of the --config file, by flag name, each of its flag's kind (refused, naming the key, if not). */
export function readConfigFile(file: string, table: FileFlagTable): Map<string, FileValue> {
  return valuesFromFile(readConfigDoc(file), table);
}

interface ConfigFileDoc {
  /** The path as given to --config. */
  file: string;
  /** The file's text (a refusal of a table says whether it is a [header], a dotted key or an inline table). */
  text: string;
  format: "toml" | "json";
  entries: Array<[key: string, value: unknown]>;
}

function readConfigDoc(file: string): ConfigFileDoc {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    const r = fsRefusal(e, "G12");
    if (!r) throw e;
    throw new UserError("G12", `--config ${file}: ${r.message.replace(/ \[G12\]$/, "")}`);
  }
  const format = file.toLowerCase().endsWith(".json") ? "json" : "toml";
  const doc = format === "json" ? parseJson(file, text) : parseToml(file, text);
  return { file, text, format, entries: Object.entries(doc) };
}

function parseToml(file: string, text: string): Record<string, unknown> {
  try {
    // integers past 2^53 come back as BigInt, so that config.ts can refuse them instead of rounding them
    return parse(text, { integersAsBigInt: "asNeeded" }) as Record<string, unknown>;
  } catch (e) {
    const x = e as { line?: unknown; column?: unknown; message?: unknown };
    if (typeof x.line !== "number") throw e;
    const what = String(x.message)
      .split("\n")[0]
      .replace(/^Invalid TOML document: /, "");
    throw new UserError(
      "G12",
      `--config ${file} is not valid TOML: line ${x.line}, column ${x.column}: ${what}. Fix that line (a setting is one line: micro-batch = 4)`,
    );
  }
}

function parseJson(file: string, text: string): Record<string, unknown> {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    if (isToml(text)) {
      const toml = `${file.replace(/\.json$/i, "")}.toml`;
      throw new UserError(
        "G12",
        `--config ${file} holds TOML, not JSON (a .json file is read as JSON): rename it to ${toml}`,
      );
    }
    const msg = (e as Error).message.split("\n")[0];
    const pos = /at position (\d+)/.exec((e as Error).message);
    const at = pos ? `line ${text.slice(0, Number(pos[1])).split("\n").length}: ` : "";
    throw new UserError("G12", `--config ${file} is not valid JSON: ${at}${msg}. Fix the file`);
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc))
    throw new UserError("G12", `--config ${file} holds JSON that is not an object of settings: fix the file`);
  return doc as Record<string, unknown>;
}

/** True when the text is a TOML document (one that is not JSON: a .json file written as TOML). */
function isToml(text: string): boolean {
  try {
    parse(text);
    return true;
  } catch {
    return false;
  }
}

/**
 * G12: a --config file's settings, by flag name. A TOML file's keys are the flags' names (`micro-batch = 4`); a
 * JSON file is a run's run_config.json, its keys the settings' names (`"microBatch": 4`). An unknown key is
 * refused naming the closest one, and a value of the wrong type naming the key, the value and the type wanted.
 */
function valuesFromFile(doc: ConfigFileDoc, table: FileFlagTable): Map<string, FileValue> {
  const json = doc.format === "json";
  const byFlag = new Map(table.flags.map((f) => [f.flag, f]));
  const settable = table.flags.filter((f) => f.flag !== "config" && !(json && table.torchOnly.has(f.flag)));
  const byKey = new Map(settable.map((f) => [f.key, f]));
  const values = new Map<string, FileValue>();
  for (const [key, raw] of doc.entries) {
    if (json && table.recordedOnly.has(key)) continue;
    if (!json && key === "config")
      throw new UserError("G12", `--config ${doc.file}: a config file cannot name another one (config = ...): drop it`);
    const spec = json ? byKey.get(key) : byFlag.get(key);
    if (!spec)
      throw unknownKey(doc, key, raw, json ? [...byKey.keys()] : settable.map((f) => f.flag), byKey, table.flags);
    values.set(spec.flag, fileValue(doc.file, key, spec, raw));
  }
  return values;
}

function unknownKey(
  doc: ConfigFileDoc,
  key: string,
  raw: unknown,
  names: string[],
  byKey: ReadonlyMap<string, FileFlag>,
  flags: readonly FileFlag[],
): UserError {
  const where = `--config ${doc.file}`;
  if (doc.format === "json") {
    const near = closestName(key, names);
    return new UserError(
      "G12",
      `${where}: ${JSON.stringify(key)} is not a setting (a .json config is a run_config.json, its keys the settings' names); the closest is ${JSON.stringify(near)} (--${byKey.get(near)!.flag}): rename it, or drop it`,
    );
  }
  const base = key.startsWith("no-") ? flags.find((f) => f.flag === key.slice(3) && f.negatable) : undefined;
  if (base) return new UserError("G12", `${where}: ${key} is not a flag's name: write ${base.flag} = false instead`);
  const table = (v: unknown): v is Record<string, unknown> =>
    v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Date);
  const flat = "the file is flat: every key a flag's name at the top level, as on the command line without --";
  if (table(raw)) return tableKey(doc, key, raw, names, flat);
  if (Array.isArray(raw) && raw.length > 0 && raw.every(table))
    return new UserError(
      "G12",
      `${where}: [[${key}]] is an array of tables, but ${flat}: drop it and write the settings at the top of the file`,
    );
  const near = closestName(key, names);
  return new UserError(
    "G12",
    `${where}: ${key} is not a flag (the keys are the flags' names as on the command line, without --; node dist/main.js --help lists them); the closest is ${near}: rename ${key} to ${near}`,
  );
}

/**
 * G12: a TOML table where the file is flat: `[train]` (a header line), `train.lr = 1e-3` or `hub.repo.type = "model"`
 * (dotted keys) or `hub = { repo-type = "model" }` (an inline table). Each of its settings is a flag when its
 * path, joined with '-', names one (micro.batch: micro-batch; hub.repo.type: hub-repo-type) or its last key does
 * (train.lr: lr); when every setting is one, the refusal says the lines to write, else where the names are listed.
 */
function tableKey(
  doc: ConfigFileDoc,
  key: string,
  raw: Record<string, unknown>,
  names: readonly string[],
  flat: string,
): UserError {
  const where = `--config ${doc.file}`;
  const leaves: Array<[path: string[], value: unknown]> = [];
  const walk = (path: string[], v: unknown) => {
    if (v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Date))
      for (const [k, x] of Object.entries(v)) walk([...path, k], x);
    else leaves.push([path, v]);
  };
  walk([key], raw);
  const flagOf = (path: string[]) =>
    [path.join("-"), path[path.length - 1]].find((n) => names.includes(n) && n !== "config");
  const lines = leaves.map(([path, v]) => ({ path, flag: flagOf(path), v: tomlValue(v) }));
  const all = lines.length > 0 && lines.every((l) => l.flag !== undefined);
  const write = lines.map((l) => `${l.flag} = ${l.v}`).join(" and ");
  const esc = key.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const header = new RegExp(`^[ \\t]*\\[[ \\t]*"?${esc}"?[ \\t]*[\\].]`, "m").test(doc.text);
  const dotted = !header && new RegExp(`^[ \\t]*"?${esc}"?[ \\t]*\\.`, "m").test(doc.text);
  if (header) {
    const same = all && lines.every((l) => l.path.length === 2 && l.flag === l.path[1]);
    const fix = same
      ? "move its settings to the top of the file"
      : all
        ? `write ${write} at the top of the file`
        : "write its settings at the top of the file by their flags' names (node dist/main.js --help lists them)";
    return new UserError("G12", `${where}: [${key}] is a table, but ${flat}: ${fix} and drop the [${key}] line`);
  }
  const many = dotted && lines.length > 1;
  const what = dotted
    ? `${lines.map((l) => l.path.join(".")).join(" and ")} (${many ? "dotted keys" : "a dotted key"})`
    : `${key} = { ... } (an inline table)`;
  return new UserError(
    "G12",
    `${where}: ${what} ${many ? "are not flags" : "is not a flag"}, and ${flat}: ${all ? `write ${write} instead` : "write each setting by its flag's name (node dist/main.js --help lists them)"}`,
  );
}

/** A value as TOML writes it (a string in quotes, a number or a boolean as it is). */
function tomlValue(v: unknown): string {
  if (typeof v === "number" || typeof v === "bigint" || typeof v === "boolean") return String(v);
  if (v instanceof Date) return v.toISOString();
  return JSON.stringify(v);
}

/** The candidate nearest `name` by edit distance, case, '-' and '_' set aside (micro_batch, microBatch: micro-batch). */
export function closestName(name: string, candidates: readonly string[]): string {
  const norm = (s: string) => s.toLowerCase().replace(/[-_]/g, "");
  const a = norm(name);
  let best = candidates[0];
  let bestD = Number.POSITIVE_INFINITY;
  for (const c of candidates) {
    const d = editDistance(a, norm(c));
    if (d < bestD) [best, bestD] = [c, d];
  }
  return best;
}

function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++)
      cur[j] = Math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = cur;
  }
  return prev[b.length];
}

/** One file value checked against its flag's kind and choices, as the command line's are. */
function fileValue(file: string, key: string, spec: FileFlag, raw: unknown): FileValue {
  const name = key === spec.flag ? key : `${key} (--${spec.flag})`;
  const shown =
    typeof raw === "bigint" || typeof raw === "number"
      ? String(raw)
      : raw instanceof Date
        ? raw.toISOString()
        : JSON.stringify(raw);
  const refuse = (want: string, hint = "") =>
    new UserError(
      "G12",
      `--config ${file}: ${name} = ${shown} is ${kindOf(raw)}, but ${spec.flag} takes ${want}${hint}: fix its value`,
    );
  const numeric = typeof raw === "string" && raw.trim() !== "" && Number.isFinite(Number(raw));
  const unquote = numeric ? ` (write it without quotes: ${key} = ${raw})` : "";
  switch (spec.kind) {
    case "bool":
      if (typeof raw === "boolean") return raw;
      throw refuse(
        "true or false",
        raw === "true" || raw === "false" ? ` (write it without quotes: ${key} = ${raw})` : "",
      );
    case "int":
      if (typeof raw === "number" && Number.isSafeInteger(raw)) return raw;
      throw refuse(`a whole number of at most ${Number.MAX_SAFE_INTEGER}`, unquote);
    case "float":
      if (typeof raw === "number" && Number.isFinite(raw)) return raw;
      throw refuse("a number", unquote);
    case "string":
      if (typeof raw !== "string") throw refuse(`a string (in quotes: ${key} = "${String(shown)}")`);
      if (spec.choices && !spec.choices.includes(raw))
        throw new UserError(
          "G12",
          `--config ${file}: ${name} = ${shown} is not one of ${spec.choices.join(", ")}: pick one of them`,
        );
      return raw;
  }
}

function kindOf(v: unknown): string {
  if (typeof v === "string") return "a string";
  if (typeof v === "boolean") return "a boolean";
  if (typeof v === "bigint") return "a whole number too large to hold exactly";
  if (typeof v === "number")
    return Number.isNaN(v)
      ? "not a number (nan)"
      : !Number.isFinite(v)
        ? "infinite (inf, or a number too large for a double, as 1e400)"
        : Number.isInteger(v)
          ? "a whole number"
          : "a number with a fraction";
  if (Array.isArray(v)) return "an array";
  if (v instanceof Date) return "a date";
  return v === null ? "null" : "a table";
}
