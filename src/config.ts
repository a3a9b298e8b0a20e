/**
 * The run config: every flag of the seed with the seed's default (the frozen recipe, G10), plus the
 * flags this stack adds. The flags, their defaults and their help are one table, src/config-flags.json
 * (`--help` prints it); a row's `help` says which rule it serves. Parsed and validated once, at the edge,
 * then frozen; the coordinator saves it in every checkpoint (run_config.json).
 *
 * A seed flag with no meaning in this stack is either given its closest honest meaning or refused
 * with the reason: never silently ignored.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import { UserError } from "./errors";
import { readConfigFile, type ConfigFileDoc } from "./config-file";
import { isRepoId, REPO_ID_RULE } from "./hub/repo-id";
import flagTable from "./config-flags.json";

/** `--gemm`: the native engine's matrix products on the project's own GEMM, or on the system's OpenBLAS. */
export type GemmChoice = "builtin" | "openblas";
/** `--isa`: the built-in GEMM's micro-kernel; auto = the widest this CPU has (every one gives the same bits);
 *  amx = the AMX-BF16 kernel and avx512bf16 the VDPBF16PS one, for --precision bf16 only. */
export type IsaChoice = "auto" | "amx" | "avx512bf16" | "avx512" | "avx2" | "portable";
/** `--precision` (P8): the matrix products' operands, fp32 or bf16 (bf16 accumulates in fp32; masters stay fp32). */
export type Precision = "fp32" | "bf16";
/** `--webgpu-fold` (A10): where the webgpu engine adds each micro-batch's gradient into the rank's float64 slot. */
export type FoldPlace = "device" | "host";
/** `--backend`: the compute engine; auto = native when its addon loads, else the best tfjs backend that loads. */
export type BackendName = "auto" | "native" | "tensorflow" | "wasm" | "cpu" | "webgpu";

export interface RunConfig {
  /** G12: the --config file the settings were read from ('' = none); flags on the command line override it. */
  configFile: string;
  root: string;
  out: string;
  hubRepo: string;
  hubRepoType: "dataset" | "model";
  hubUrl: string;
  /** Folder of the embedded local Hub (--hub-url embedded); '' = <out>/hub (L8, B6). */
  hubDir: string;
  seqLen: number;
  attn: "eager";
  gradCkpt: boolean;
  /** M6: GB one rank's activations may take; 0 = half of this machine's memory over the process's ranks (activationBudget). */
  activationBudgetGb: number;
  layers: number;
  hidden: number;
  microBatch: number;
  accum: number;
  lr: number;
  optim: "adamw_torch" | "adamw_torch_fused" | "adamw_apex_fused";
  tokens: number;
  maxSteps: number;
  warmupFrac: number;
  decayFrac: number;
  seed: number;
  dataSeed: number;
  resume: string;
  valTokens: number;
  logEvery: number;
  pushEverySteps: number;
  stopAfterSteps: number;
  prune: boolean;
  minFreeGb: number;
  dryRun: boolean;
  benchmark: number;
  world: number;
  /** A9: "mpi" = one process of an MPI job (H processes x `world` rank threads); "none" = this process alone. */
  dist: "none" | "mpi";
  /**
   * Not a flag: the number of processes of the MPI job (A9), set once MPI is up; 1 otherwise. Every step is
   * split among hosts x world ranks.
   */
  hosts: number;
  backend: BackendName;
  /** The native engine's matrix products: the project's own GEMM or the system's OpenBLAS. */
  gemm: GemmChoice;
  /** The built-in GEMM's micro-kernel (auto = the widest the CPU has; every one gives the same bits). */
  isa: IsaChoice;
  /** P8: the matrix products' operands: fp32, or bf16 rounded (fp32 accumulation, fp32 masters, scale fixed at 1). */
  precision: Precision;
  /** A10, --backend webgpu: the micro-batch fold on the device (the slot read back once a step) or on the host. */
  webgpuFold: FoldPlace;
  demo: boolean;
  /** Variant vocabulary; 0 = the frozen 49,152 (M1), or under --demo the demo tokenizer's size. */
  vocabSize: number;
  /** K6: stop only after a checkpoint has failed to publish for this many minutes. */
  hubRetryMinutes: number;
  /** K6: one Hub request may wait this long for its answer (plus 1 s per MiB sent) before it counts as failed. */
  hubTimeoutSeconds: number;
  /** R3: --resume auto resumes from the pointer even when newer checkpoint folders without a manifest exist. */
  resumeIgnoreUnproven: boolean;
  /** K7: --resume DIR accepts a folder without manifest.json (a checkpoint from before manifests existed). */
  resumeWithoutManifest: boolean;
  /** K5: a checkpoint repo this run creates is private (--no-hub-private: public); an existing one is never changed. */
  hubPrivate: boolean;
  /** P7: a resume may change --lr, --warmup-frac, --decay-frac (and the update's constants); each change is listed. */
  allowConfigChange: boolean;
  /** Log a short greedy sample at every checkpoint and at the end (G11); --no-sample turns it off. */
  sample: boolean;
}

type Kind = "string" | "int" | "float" | "bool";
interface FlagSpec {
  flag: string;
  key: keyof RunConfig;
  kind: Kind;
  def: string | number | boolean;
  help: string;
  choices?: readonly string[];
  /** The flag accepts --no-<name> (argparse's BooleanOptionalAction). */
  negatable?: boolean;
}

/**
 * The table --help prints and the parser reads: src/config-flags.json, one row per flag (its setting, kind,
 * default, help, and choices or --no-<flag> where they apply). Defaults are the seed's (G10). The rows are data,
 * kept apart from the code that reads them, and checked once when this module loads (a bad row is a bug).
 */
export const FLAGS: readonly FlagSpec[] = checkFlagTable(flagTable);

export function checkFlagTable(rows: unknown): FlagSpec[] {
  const jsType: Record<Kind, string> = { string: "string", int: "number", float: "number", bool: "boolean" };
  if (!Array.isArray(rows)) throw new Error("config-flags.json: not an array of flags");
  const seen = new Set<string>();
  for (const r of rows as FlagSpec[]) {
    const where = `config-flags.json: flag ${JSON.stringify(r?.flag)}`;
    if (r === null || typeof r !== "object" || Array.isArray(r))
      throw new Error(`${where}: a row must be an object, got ${JSON.stringify(r)}`);
    if (typeof r.flag !== "string" || !/^[a-z][a-z0-9-]*$/.test(r.flag) || seen.has(r.flag))
      throw new Error(`${where}: not a new kebab-case flag name`);
    seen.add(r.flag);
    if (typeof r.key !== "string" || typeof r.help !== "string" || r.help.length === 0)
      throw new Error(`${where}: needs a key and a help text`);
    if (!(r.kind in jsType) || typeof r.def !== jsType[r.kind])
      throw new Error(`${where}: kind ${r.kind} with default ${JSON.stringify(r.def)}`);
    if (r.choices !== undefined && !(Array.isArray(r.choices) && r.choices.includes(r.def as string)))
      throw new Error(`${where}: its choices must include its default`);
    if (r.negatable !== undefined && !(r.negatable === true && r.kind === "bool"))
      throw new Error(`${where}: only a bool flag is negatable`);
  }
  return rows as FlagSpec[];
}

/** --hub-url value that starts the embedded local Hub (B6) in this process; --demo's default. */
export const EMBEDDED_HUB = "embedded";

/** What --demo sets, unless the same flag is given explicitly. */
export const DEMO_DEFAULTS: Partial<RunConfig> = {
  world: 2,
  seqLen: 64,
  layers: 4,
  hidden: 144,
  vocabSize: 0, // taken from the demo tokenizer's manifest
  microBatch: 4,
  accum: 1,
  lr: 3e-3,
  maxSteps: 300,
  tokens: 300 * 4 * 2 * 64,
  warmupFrac: 0.02,
  valTokens: 8192,
  logEvery: 25,
  root: "./.demo/data",
  out: "./.demo/run",
  hubRepo: "local/tstrain-demo",
  hubUrl: EMBEDDED_HUB,
};

export function usage(): string {
  const lines = [
    "usage: node dist/main.js [flags]",
    "",
    "Data-parallel Llama training with one worker thread per rank. Defaults are the frozen recipe.",
    "",
  ];
  for (const f of FLAGS) {
    const name =
      f.kind === "bool"
        ? `--${f.flag}${f.negatable ? ` / --no-${f.flag}` : ""}`
        : `--${f.flag} ${f.kind === "string" ? (f.choices ? f.choices.join("|") : "S") : "N"}`;
    const def = f.kind === "bool" ? (f.def ? "on" : "off") : JSON.stringify(f.def);
    lines.push(`  ${name.padEnd(40)} ${f.help} (default ${def})`);
  }
  lines.push("", "Environment: HF_TOKEN (Hub token; never printed or written).");
  return lines.join("\n");
}

function parseNumber(flag: string, raw: string, kind: "int" | "float"): number {
  const t = raw.trim().replace(/_/g, "");
  const v = Number(t);
  if (t === "" || !Number.isFinite(v)) throw new UserError("G10", `--${flag} ${JSON.stringify(raw)} is not a number`);
  if (kind === "int" && !Number.isSafeInteger(v)) throw new UserError("G10", `--${flag} ${raw} must be a whole number`);
  return v;
}

export interface ParsedArgs {
  config: RunConfig;
  help: boolean;
  /** Every flag given, on the command line or in the --config file. */
  explicit: ReadonlySet<string>;
  /** G12: where each flag given (or set by --demo) came from: "flag", the --config file's path, or "--demo". */
  origins: ReadonlyMap<string, string>;
}

type FlagValue = string | number | boolean;

/**
 * Parse argv (without node and script). Unknown flags are an error, as in nanoGPT's configurator. The settings
 * are the table's defaults, then --demo's (when --demo is set), then the --config file's, then the flags'.
 */
export function parseArgs(argv: readonly string[]): ParsedArgs {
  const byFlag = new Map(FLAGS.map((f) => [f.flag, f]));
  const { values: given, help } = readFlagValues(argv, byFlag);
  const file = given.get("config") as string | undefined;
  const values = file ? new Map([...valuesFromFile(readConfigFile(file), byFlag), ...given]) : given;
  const origins = new Map<string, string>();
  for (const k of values.keys()) origins.set(k, given.has(k) ? "flag" : file!);
  if (values.get("demo") === true)
    for (const k of Object.keys(DEMO_DEFAULTS)) {
      const f = FLAGS.find((r) => r.key === k)!.flag;
      if (!values.has(f)) origins.set(f, "--demo");
    }
  refuseTorchOnlyFlags(values);
  let config: RunConfig;
  try {
    config = validate(configFrom(values, byFlag) as unknown as RunConfig);
  } catch (e) {
    throw file ? namingTheFile(e, origins) : e;
  }
  return { config, help, explicit: new Set(values.keys()), origins };
}

/** A range refusal of a setting the file gave (`--micro-batch: 0 must be ...`) says it came from the file. */
function namingTheFile(e: unknown, origins: ReadonlyMap<string, string>): unknown {
  if (!(e instanceof UserError)) return e;
  const m = /^--([a-z0-9-]+)/.exec(e.message);
  const from = m ? origins.get(m[1]) : undefined;
  if (!from || from === "flag" || from === "--demo") return e;
  return new UserError(e.rule, `${e.message.slice(0, -` [${e.rule}]`.length)} (set in --config ${from})`);
}

/** The seed's torch switches: flags of the table that are refused when set, and read into no setting. */
const TORCH_ONLY: ReadonlySet<string> = new Set(["gc-nonreentrant", "torch-compile"]);
/** Keys a run_config.json records that are no flag: the MPI process count (set once MPI is up), the update's
 *  constants (P7 compares them at a resume) and the config file that run read. A config file sets none of them. */
const RECORDED_ONLY: ReadonlySet<string> = new Set(["hosts", "update", "configFile"]);

/**
 * G12: a --config file's settings, by flag name. A TOML file's keys are the flags' names (`micro-batch = 4`); a
 * JSON file is a run's run_config.json, its keys the settings' names (`"microBatch": 4`). An unknown key is
 * refused naming the closest one, and a value of the wrong type naming the key, the value and the type wanted.
 */
function valuesFromFile(doc: ConfigFileDoc, byFlag: ReadonlyMap<string, FlagSpec>): Map<string, FlagValue> {
  const json = doc.format === "json";
  const settable = FLAGS.filter((f) => f.flag !== "config" && !(json && TORCH_ONLY.has(f.flag)));
  const byKey = new Map(settable.map((f) => [f.key as string, f]));
  const values = new Map<string, FlagValue>();
  for (const [key, raw] of doc.entries) {
    if (json && RECORDED_ONLY.has(key)) continue;
    if (!json && key === "config")
      throw new UserError("G12", `--config ${doc.file}: a config file cannot name another one (config = ...): drop it`);
    const spec = json ? byKey.get(key) : byFlag.get(key);
    if (!spec) throw unknownKey(doc, key, raw, json ? [...byKey.keys()] : settable.map((f) => f.flag), byKey);
    values.set(spec.flag, fileValue(doc.file, key, spec, raw));
  }
  return values;
}

function unknownKey(
  doc: ConfigFileDoc,
  key: string,
  raw: unknown,
  names: string[],
  byKey: ReadonlyMap<string, FlagSpec>,
): UserError {
  const where = `--config ${doc.file}`;
  if (doc.format === "json") {
    const near = closestName(key, names);
    return new UserError(
      "G12",
      `${where}: ${JSON.stringify(key)} is not a setting (a .json config is a run_config.json, its keys the settings' names); the closest is ${JSON.stringify(near)} (--${byKey.get(near)!.flag}): rename it, or drop it`,
    );
  }
  const base = key.startsWith("no-") ? FLAGS.find((f) => f.flag === key.slice(3) && f.negatable) : undefined;
  if (base) return new UserError("G12", `${where}: ${key} is not a flag's name: write ${base.flag} = false instead`);
  const table = (v: unknown): v is Record<string, unknown> =>
    v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Date);
  const flat = "the file is flat: every key a flag's name at the top level, as on the command line without --";
  if (table(raw)) {
    // micro.batch = 2 is TOML's table micro holding batch: the flag it spells is micro-batch
    const sub = Object.keys(raw).find((k) => names.includes(`${key}-${k}`));
    const flag = sub === undefined ? undefined : `${key}-${sub}`;
    if (sub !== undefined && flag !== undefined)
      return new UserError(
        "G12",
        `${where}: ${key}.${flag.slice(key.length + 1)} (a TOML table: [${key}] or a dotted key) is not a flag, and ${flat}: write ${flag} = ${JSON.stringify(raw[sub])}`,
      );
    return new UserError(
      "G12",
      `${where}: [${key}] is a table, but ${flat}: move its settings to the top of the file and drop the [${key}] line`,
    );
  }
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
function fileValue(file: string, key: string, spec: FlagSpec, raw: unknown): FlagValue {
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

/**
 * G12: the start line: each setting that differs from its default, grouped by where it came from (the --config
 * file, --demo, the command line); `origins` from parseArgs. A setting no origin names was set by the caller.
 *   config: from recipe.toml: seq-len=16, lr=0.003; from --demo: world=2; from flags: max-steps=8; 38 others default
 */
export function configLine(c: RunConfig, origins: ReadonlyMap<string, string>): string {
  const groups = new Map<string, string[]>();
  let same = 0;
  for (const f of FLAGS) {
    if (TORCH_ONLY.has(f.flag) || f.flag === "config") continue;
    const v = c[f.key];
    if (v === f.def) {
      same += 1;
      continue;
    }
    const o = origins.get(f.flag);
    const from = o === undefined ? "the caller" : o === "flag" ? "flags" : o;
    if (!groups.has(from)) groups.set(from, []);
    groups.get(from)!.push(`${f.flag}=${typeof v === "string" ? JSON.stringify(v) : String(v)}`);
  }
  if (c.configFile && !groups.has(c.configFile)) groups.set(c.configFile, []); // the file is named even when it changes nothing
  const order = [...groups.keys()].sort((a, b) => rank(a) - rank(b));
  const parts = order.map((g) => `from ${g}: ${groups.get(g)!.join(", ") || "only defaults"}`);
  return `config: ${[...parts, `${same} others at their defaults (node dist/main.js --help lists them)`].join("; ")}`;
}

/** The start line's groups in the order they apply: the file, then --demo, then the flags (the caller's last). */
function rank(from: string): number {
  return from === "--demo" ? 1 : from === "flags" ? 2 : from === "the caller" ? 3 : 0;
}

/** Each flag given, by name, to its parsed value (checked against its kind and choices); and whether --help was. */
function readFlagValues(
  argv: readonly string[],
  byFlag: ReadonlyMap<string, FlagSpec>,
): { values: Map<string, FlagValue>; help: boolean } {
  const values = new Map<string, FlagValue>();
  let help = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
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
        if (inline !== undefined) throw new UserError("G10", `--${name} takes no value`);
        values.set(base.flag, false);
        continue;
      }
    }
    if (!spec) throw new UserError("G10", `unknown flag --${name} (see --help for the flags this trainer takes)`);
    if (spec.kind === "bool") {
      if (inline === undefined) {
        values.set(spec.flag, true);
        continue;
      }
      if (inline !== "true" && inline !== "false") throw new UserError("G10", `--${name}=${inline}: use true or false`);
      values.set(spec.flag, inline === "true");
      continue;
    }
    const raw = inline ?? argv[++i];
    if (raw === undefined) throw new UserError("G10", `--${name} needs a value`);
    if (spec.kind === "string") {
      if (spec.choices && !spec.choices.includes(raw)) {
        throw new UserError("G10", `--${name} ${JSON.stringify(raw)} is not one of ${spec.choices.join(", ")}`);
      }
      values.set(spec.flag, raw);
    } else {
      values.set(spec.flag, parseNumber(name, raw, spec.kind));
    }
  }
  return { values, help };
}

/** Seed flags with no meaning here: refused when asked for, with the reason; then dropped from `values`. */
function refuseTorchOnlyFlags(values: Map<string, FlagValue>): void {
  if (values.get("gc-nonreentrant") === true) {
    throw new UserError(
      "G10",
      "--gc-nonreentrant selects a torch autograd path; this trainer has one hand-written recompute path (M6), so the flag has no meaning here. Drop it.",
    );
  }
  if (values.get("torch-compile") === true) {
    throw new UserError(
      "G10",
      "--torch-compile is torch.compile; tfjs has no graph compiler to turn on, so the flag has no meaning here. Drop it.",
    );
  }
  const attn = values.get("attn");
  if (attn !== undefined && attn !== "eager") {
    throw new UserError(
      "G10",
      `--attn ${attn} is a CUDA attention kernel of torch; this stack computes attention one way (the eager math of HF Llama, M4). Use --attn eager or leave it out.`,
    );
  }
  for (const f of TORCH_ONLY) values.delete(f);
}

/** Defaults, then --demo's defaults when --demo is given, then the flags given: the unvalidated config. */
function configFrom(
  values: ReadonlyMap<string, FlagValue>,
  byFlag: ReadonlyMap<string, FlagSpec>,
): Record<string, unknown> {
  const cfg: Record<string, unknown> = {};
  for (const f of FLAGS) {
    if (TORCH_ONLY.has(f.flag)) continue;
    cfg[f.key] = f.def;
  }
  cfg.hosts = 1;
  const demo = values.get("demo") === true;
  if (demo) for (const [k, v] of Object.entries(DEMO_DEFAULTS)) cfg[k] = v;
  for (const [flag, v] of values) cfg[byFlag.get(flag)!.key] = v;
  return cfg;
}

function must(cond: boolean, flag: string, msg: string): void {
  if (!cond) throw new UserError("G10", `--${flag}: ${msg}`);
}

/** Range checks that need no data. Checks that need the mix or the plan live with them (D6, G1, K1). */
export function validate(c: RunConfig): RunConfig {
  const pos = (v: number) => Number.isSafeInteger(v) && v > 0;
  const nonneg = (v: number) => Number.isSafeInteger(v) && v >= 0;
  must(
    pos(c.seqLen) && c.seqLen >= 2,
    "seq-len",
    `${c.seqLen} must be a whole number >= 2 (a window predicts seq_len-1 tokens)`,
  );
  must(pos(c.microBatch), "micro-batch", `${c.microBatch} must be a positive whole number`);
  must(pos(c.accum), "accum", `${c.accum} must be a positive whole number`);
  must(pos(c.world), "world", `${c.world} must be a positive whole number of ranks`);
  must(c.world <= 64, "world", `${c.world} ranks is more than this trainer supports (64)`);
  c = { ...c, hosts: c.hosts ?? 1 };
  if (!(Number.isSafeInteger(c.hosts) && c.hosts >= 1))
    throw new Error(`config: hosts ${c.hosts} must be a whole number >= 1 (set from the MPI world)`);
  must(nonneg(c.layers), "layers", `${c.layers} must be 0 (frozen) or a positive layer count`);
  must(nonneg(c.hidden), "hidden", `${c.hidden} must be 0 (frozen) or a positive width`);
  must(
    nonneg(c.vocabSize) && (c.vocabSize === 0 || c.vocabSize >= 2),
    "vocab-size",
    `${c.vocabSize} must be 0 (frozen 49,152) or at least 2`,
  );
  must(c.lr > 0 && c.lr < 1, "lr", `${c.lr} must be in (0, 1)`);
  must(pos(c.tokens), "tokens", `${c.tokens} must be a positive whole number`);
  must(nonneg(c.maxSteps), "max-steps", `${c.maxSteps} must be >= 0`);
  must(c.warmupFrac >= 0 && c.warmupFrac <= 1, "warmup-frac", `${c.warmupFrac} must be within [0, 1]`);
  must(c.decayFrac >= 0 && c.decayFrac <= 1, "decay-frac", `${c.decayFrac} must be within [0, 1]`);
  must(nonneg(c.seed), "seed", `${c.seed} must be a whole number >= 0`);
  must(nonneg(c.dataSeed), "data-seed", `${c.dataSeed} must be a whole number >= 0`);
  must(pos(c.valTokens), "val-tokens", `${c.valTokens} must be a positive whole number`);
  must(pos(c.logEvery), "log-every", `${c.logEvery} must be a positive whole number`);
  must(nonneg(c.pushEverySteps), "push-every-steps", `${c.pushEverySteps} must be >= 0 (0 = steps // 10)`);
  must(nonneg(c.stopAfterSteps), "stop-after-steps", `${c.stopAfterSteps} must be >= 0 (0 = run to the horizon)`);
  must(c.minFreeGb >= 0, "min-free-gb", `${c.minFreeGb} must be >= 0`);
  must(
    Number.isFinite(c.activationBudgetGb) && c.activationBudgetGb >= 0,
    "activation-budget-gb",
    `${c.activationBudgetGb} must be a number of GB >= 0 (0 = half this machine's memory over the ranks)`,
  );
  must(
    Number.isFinite(c.hubTimeoutSeconds) && c.hubTimeoutSeconds >= 0.1 && c.hubTimeoutSeconds <= 3600,
    "hub-timeout-seconds",
    `${c.hubTimeoutSeconds} must be within [0.1, 3600]`,
  );
  must(
    Number.isFinite(c.hubRetryMinutes) && c.hubRetryMinutes > 0 && c.hubRetryMinutes <= 7 * 24 * 60,
    "hub-retry-minutes",
    `${c.hubRetryMinutes} must be > 0 and at most a week (10080)`,
  );
  must(nonneg(c.benchmark), "benchmark", `${c.benchmark} must be >= 0`);
  if (c.resume === "auto") {
    if (!c.hubRepo && !c.demo)
      throw new UserError("R2", "--resume auto asks the Hub where the run stopped, so it needs --hub-repo");
  }
  if (c.hubRepo && !isRepoId(c.hubRepo)) {
    throw new UserError(
      "K5",
      `--hub-repo ${JSON.stringify(c.hubRepo)} is not a Hub repo id (${REPO_ID_RULE}); pass e.g. --hub-repo my-user/my-run-ckpts`,
    );
  }
  if (c.hubUrl !== EMBEDDED_HUB) {
    const bad = hubUrlProblem(c.hubUrl);
    if (bad)
      throw new UserError("G10", `--hub-url ${JSON.stringify(c.hubUrl)} ${bad}, or ${EMBEDDED_HUB} for the local Hub`);
  }
  if (isFile(c.root)) {
    throw new UserError(
      "D1",
      `--root ${JSON.stringify(c.root)} is a file, not a folder: ${c.demo ? "--demo builds its mix in a folder there" : "a mix root is the folder prepare wrote"}; name a folder${c.demo ? " (or a path that does not exist yet)" : ""}`,
    );
  }
  if (c.hubDir && c.hubUrl !== EMBEDDED_HUB) {
    throw new UserError(
      "B6",
      `--hub-dir ${JSON.stringify(c.hubDir)} is the folder of the embedded local Hub, but --hub-url is ${c.hubUrl}; add --hub-url embedded or drop --hub-dir`,
    );
  }
  refuseBf16Mismatch(c);
  if (c.dryRun && c.benchmark) throw new UserError("G7", "--dry-run and --benchmark exclude each other: pick one");
  c.hubUrl = c.hubUrl.replace(/\/+$/, "");
  return Object.freeze({ ...c });
}

/** True when something other than a folder is at the path (a folder, or nothing yet, is false). */
function isFile(p: string): boolean {
  try {
    return !fs.statSync(p).isDirectory();
  } catch {
    return false;
  }
}

/**
 * G10, G11: why a Hub endpoint is not one (an http(s) URL with a host), e.g. "is not an http(s) URL such as
 * https://huggingface.co"; null when it is one. Every command that takes --hub-url checks it before any work.
 */
export function hubUrlProblem(url: string): string | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    u = new URL("none:");
  }
  return u.protocol === "http:" || u.protocol === "https:"
    ? null
    : "is not an http(s) URL such as https://huggingface.co";
}

/**
 * M6: the bytes one rank's training arena may take: --activation-budget-gb, or (0) half of this machine's memory
 * shared by every rank thread on it: the process's, times the processes the MPI launcher started on this host
 * (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE; 1 without one). `auto` says which;
 * `ranksHere` is the divisor, `totalBytes` the machine's memory.
 */
export function activationBudget(
  c: Pick<RunConfig, "activationBudgetGb" | "world">,
  totalBytes: number = os.totalmem(),
  env: NodeJS.ProcessEnv = process.env,
): { bytes: number; auto: boolean; totalBytes: number; ranksHere: number } {
  const local = [env.OMPI_COMM_WORLD_LOCAL_SIZE, env.MPI_LOCALNRANKS, env.SLURM_NTASKS_PER_NODE]
    .map((v) => Number.parseInt(v ?? "", 10))
    .find((n) => Number.isSafeInteger(n) && n >= 1);
  const ranksHere = c.world * (local ?? 1);
  if (c.activationBudgetGb > 0)
    return { bytes: Math.floor(c.activationBudgetGb * 2 ** 30), auto: false, totalBytes, ranksHere };
  return { bytes: Math.floor(totalBytes / 2 / ranksHere), auto: true, totalBytes, ranksHere };
}

/** The native engine's choices of a run (--gemm, --isa, --precision), as every rank loads them. */
export function nativeChoice(c: RunConfig): { gemm: GemmChoice; isa: IsaChoice; precision: Precision } {
  return { gemm: c.gemm, isa: c.isa, precision: c.precision };
}

/** P8: bf16 products run on the native engine's own GEMM only; the AMX and VDPBF16PS kernels only compute bf16. */
function refuseBf16Mismatch(c: RunConfig): void {
  if (c.precision !== "bf16") {
    if (c.isa === "amx" || c.isa === "avx512bf16")
      throw new UserError(
        "P8",
        `--isa ${c.isa} is a bf16 kernel (${c.isa === "amx" ? "AMX-BF16" : "AVX512_BF16"}): add --precision bf16, or pass --isa avx512 for fp32 products`,
      );
    return;
  }
  if (c.backend !== "auto" && c.backend !== "native")
    throw new UserError(
      "P8",
      `--precision bf16 runs on the native engine's own GEMM, and --backend ${c.backend} computes in fp32 only: pass --backend native, or drop --precision bf16`,
    );
  if (c.gemm !== "builtin")
    throw new UserError(
      "P8",
      `--precision bf16 runs on the built-in GEMM, not --gemm ${c.gemm}: pass --gemm builtin, or drop --precision bf16`,
    );
}

/** The plan numbers every part agrees on (P5, P6, K1), from the config and the model's steps. */
export interface StepPlan {
  seqsPerStep: number;
  tokensPerStep: number;
  stepsPlanned: number;
  ckptEvery: number;
  warmup: number;
  decayStart: number;
}

export function planSteps(c: RunConfig): StepPlan {
  const seqsPerStep = c.microBatch * c.world * c.hosts * c.accum; // A9: every rank of every process
  const tokensPerStep = seqsPerStep * c.seqLen;
  const stepsPlanned = c.maxSteps || Math.floor(c.tokens / tokensPerStep);
  if (stepsPlanned < 1) {
    throw new UserError(
      "P5",
      `--tokens ${c.tokens} is less than one step of ${tokensPerStep} tokens (micro ${c.microBatch} x world ${c.world}${c.hosts > 1 ? ` x ${c.hosts} processes` : ""} x accum ${c.accum} x seq ${c.seqLen}): raise --tokens or set --max-steps`,
    );
  }
  const ckptEvery = c.pushEverySteps || Math.max(1, Math.floor(stepsPlanned / 10));
  return {
    seqsPerStep,
    tokensPerStep,
    stepsPlanned,
    ckptEvery,
    warmup: Math.max(100, Math.floor(stepsPlanned * c.warmupFrac)),
    decayStart: Math.floor(stepsPlanned * c.decayFrac),
  };
}
