/**
 * The run config: every flag of the seed with the seed's default (the frozen recipe, G10), plus the
 * flags this stack adds. The flags, their defaults and their help are one table, src/config-flags.json
 * (`--help` prints it); a row's `help` says which rule it serves. Parsed and validated once, at the edge,
 * then frozen; every checkpoint holds it (run_config.json, handed over by session/in-flight.ts).
 *
 * A seed flag with no meaning in this stack is either given its closest honest meaning or refused
 * with the reason: never silently ignored.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import { type Fix, type FixWay, type FlagChange, UserError } from "./errors";
import { shellWord } from "./cli-args";
import { argvWithChanges, type FlagValue, readFlagValues, specOf } from "./config-argv";
import { readConfigFile } from "./config-file";
import {
  canonicalHubUrl,
  DEFAULT_HUB_URL,
  endpointFromEnv,
  hubUrlFixed,
  hubUrlProblem,
  isRepoId,
  REPO_ID_RULE,
} from "./hub/address";
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
  /**
   * A13: --backend webgpu's GPUs, by index or PCI address, comma-separated (parseGpuChoice); rank r of the host's
   * ranks takes the r-th. "" = every GPU of the host, in PCI address order.
   */
  gpus: string;
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
  lines.push(
    "",
    "Environment: HF_TOKEN (Hub token; never printed or written); HF_ENDPOINT (the Hub's address when no --hub-url is given; --demo keeps its embedded Hub unless --hub-url is given).",
  );
  return lines.join("\n");
}

export interface ParsedArgs {
  config: RunConfig;
  help: boolean;
  /** Every flag given, on the command line or in the --config file. */
  explicit: ReadonlySet<string>;
  /** G12: where each flag given (or set by --demo) came from: "flag", the --config file's path, or "--demo". */
  origins: ReadonlyMap<string, string>;
  /** G12: the flags the --config file sets, also those the command line overrides (advice that drops one sets it). */
  fromFile: ReadonlySet<string>;
}

/**
 * Parse argv (without node and script). Unknown flags are an error, as in nanoGPT's configurator. The settings
 * are the table's defaults, then --demo's (when --demo is set), then the --config file's, then the flags'. A
 * refusal's advice is the command `node dist/main.js` with these arguments changed (withMainCommands).
 */
export function parseArgs(argv: readonly string[]): ParsedArgs {
  const fromFile = new Set<string>();
  try {
    return readArgs(argv, fromFile);
  } catch (e) {
    throw e instanceof UserError ? withMainCommands(e, ["node", "dist/main.js"], argv, fromFile) : e;
  }
}

/** parseArgs, its refusals' advice left as changes; `fromFile` gets the --config file's flags once it is read. */
function readArgs(argv: readonly string[], fromFile = new Set<string>()): ParsedArgs {
  const byFlag = new Map(FLAGS.map((f) => [f.flag, f]));
  const { values: given, help } = readFlagValues(argv, byFlag, (f, v) => RANGES[f]?.ok(v) ?? true);
  const file = given.get("config") as string | undefined;
  const inFile = file ? readConfigFile(file, FILE_TABLE) : new Map<string, FlagValue>();
  for (const k of inFile.keys()) fromFile.add(k);
  const values = file ? new Map([...inFile, ...given]) : given;
  const origins = new Map<string, string>();
  for (const k of values.keys()) origins.set(k, given.has(k) ? "flag" : file!);
  // G10: no --hub-url (flag or file): HF_ENDPOINT, as huggingface_hub reads it. --demo keeps its embedded Hub (B6:
  // it runs offline, and a mirror set for the real Hub is no place for a demo's repo); --hub-url sends it elsewhere.
  const endpoint = values.has("hub-url") || values.get("demo") === true ? null : endpointFromEnv("G10");
  if (endpoint !== null) {
    values.set("hub-url", endpoint);
    origins.set("hub-url", "HF_ENDPOINT");
  }
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
  return { config, help, explicit: new Set(values.keys()), origins, fromFile };
}

/**
 * A refusal of the trainer with each way of its fix written as the whole command `head argv` with the way's changes
 * made (mainArgvWith). Each way is checked by parsing the command it gives: a way refused there takes on the first
 * way of that refusal that changes other flags (one that only drops flags first; twice at most), so that the command
 * printed passes parseArgs; a way that still does not is printed as it is. `fromFile`: the --config file's flags
 * (ParsedArgs).
 */
export function withMainCommands(
  e: UserError,
  head: readonly string[],
  argv: readonly string[],
  fromFile: ReadonlySet<string>,
): UserError {
  if (!e.fix) return e;
  const ways = e.fix.ways.map((w) => parsedWay(w, argv, fromFile, 2) ?? w);
  return new UserError(e.rule, e.lead, { ...e.fix, ways }, (changes) =>
    [...head, ...mainArgvWith(argv, changes, fromFile)].map(shellWord).join(" "),
  );
}

/** `w` when the command it gives parses, else with the changes of a way of that refusal added (withMainCommands). */
function parsedWay(w: FixWay, argv: readonly string[], fromFile: ReadonlySet<string>, tries: number): FixWay | null {
  try {
    readArgs(mainArgvWith(argv, w.changes, fromFile));
    return w;
  } catch (x) {
    if (tries === 0 || !(x instanceof UserError) || !x.fix) return null;
    const mine = new Set(w.changes.map(([f]) => specOf(FLAGS, f)?.flag ?? f));
    // a way that only drops flags first: it keeps what this way is for (its `why`), where one that sets another may not
    const drops = (v: FixWay) => v.changes.every(([, value]) => value === null || value === false);
    for (const next of [...x.fix.ways.filter(drops), ...x.fix.ways.filter((v) => !drops(v))]) {
      if (next.changes.some(([f]) => mine.has(specOf(FLAGS, f)?.flag ?? f))) continue; // it would undo this way
      const r = parsedWay({ ...w, changes: [...w.changes, ...next.changes] }, argv, fromFile, tries - 1);
      if (r) return r;
    }
    return null;
  }
}

/**
 * The trainer's arguments with `changes` made (config-argv.ts argvWithChanges): a switch by its own words, and a
 * flag dropped that the --config file sets (`fromFile`) set to its default, since the file's value would apply.
 */
export function mainArgvWith(
  argv: readonly string[],
  changes: readonly FlagChange[],
  fromFile: ReadonlySet<string> = new Set(),
): string[] {
  return argvWithChanges(argv, changes, FLAGS, fromFile);
}

/** A range refusal of a setting the file gave says it came from the file: `--micro-batch: 0 (set in --config
 *  run.toml) must be ...`; the flag it advises, given on the command line, overrides the file. */
function namingTheFile(e: unknown, origins: ReadonlyMap<string, string>): unknown {
  if (!(e instanceof UserError)) return e;
  const m = /^--([a-z0-9-]+)/.exec(e.message);
  const from = m ? origins.get(m[1]) : undefined;
  if (!from || from === "flag" || from === "--demo") return e;
  const msg = e.fix ? e.lead : e.message.slice(0, -` [${e.rule}]`.length);
  const head = /^--[a-z0-9-]+:? \S+/.exec(msg)?.[0] ?? msg;
  return new UserError(e.rule, `${head} (set in --config ${from})${msg.slice(head.length)}`, e.fix);
}

/** The seed's torch switches: flags of the table that are refused when set, and read into no setting. */
const TORCH_ONLY: ReadonlySet<string> = new Set(["gc-nonreentrant", "torch-compile"]);
/** Keys a run_config.json records that are no flag: the MPI process count (set once MPI is up), the update's
 *  constants (P7 compares them at a resume) and the config file that run read. A config file sets none of them. */
const RECORDED_ONLY: ReadonlySet<string> = new Set(["hosts", "update", "configFile"]);
/** The table as config-file.ts reads a --config file's keys against it. */
const FILE_TABLE = { flags: FLAGS, torchOnly: TORCH_ONLY, recordedOnly: RECORDED_ONLY };

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

/** Seed flags with no meaning here: refused when asked for, with the reason; then dropped from `values`. */
function refuseTorchOnlyFlags(values: Map<string, FlagValue>): void {
  const without = (flag: string, why: string): Fix => ({ ways: [{ changes: [[flag, null]], why }] });
  if (values.get("gc-nonreentrant") === true) {
    throw new UserError(
      "G10",
      "--gc-nonreentrant selects a torch autograd path; this trainer has one hand-written recompute path (M6), so the flag has no meaning here: run ",
      without("--gc-nonreentrant", "without it"),
    );
  }
  if (values.get("torch-compile") === true) {
    throw new UserError(
      "G10",
      "--torch-compile is torch.compile; no engine here (native C, tfjs, webgpu) has a graph compiler to turn on, so the flag has no meaning here: run ",
      without("--torch-compile", "without it"),
    );
  }
  const attn = values.get("attn");
  if (attn !== undefined && attn !== "eager") {
    throw new UserError(
      "G10",
      `--attn ${attn} is a CUDA attention kernel of torch; this stack computes attention one way (the eager math of HF Llama, M4): run `,
      without("--attn", "eager, the one way"),
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

/**
 * G10: each number flag's range: whether a value is in it, what a refused value is told it must be, and the value
 * the refusal advises (`near`: the nearest value in range, else the setting's default where it applies, the demo's
 * under --demo). Every advised value is in range, so the command it gives passes this check.
 */
interface Range {
  ok(v: number): boolean;
  says(v: number): string;
  near?(v: number): number;
}
const whole = (v: number) => Number.isSafeInteger(v);
const pos = (v: number) => whole(v) && v > 0;
const nonneg = (v: number) => whole(v) && v >= 0;
const clamp = (lo: number, hi: number) => (v: number) => Math.min(hi, Math.max(lo, v));
const RANGES: Readonly<Record<string, Range>> = {
  "seq-len": {
    ok: (v) => pos(v) && v >= 2,
    says: () => "must be a whole number >= 2 (a window predicts seq_len-1 tokens)",
  },
  "micro-batch": { ok: pos, says: () => "must be a positive whole number", near: () => 1 },
  accum: { ok: pos, says: () => "must be a positive whole number", near: () => 1 },
  world: {
    ok: (v) => pos(v) && v <= 64,
    says: (v) =>
      v > 64 ? "ranks is more than this trainer supports (64)" : "must be a positive whole number of ranks",
    near: (v) => (v > 64 ? 64 : 1),
  },
  layers: { ok: nonneg, says: () => "must be 0 (frozen) or a positive layer count", near: () => 0 },
  hidden: { ok: nonneg, says: () => "must be 0 (frozen) or a positive width", near: () => 0 },
  "vocab-size": {
    ok: (v) => nonneg(v) && (v === 0 || v >= 2),
    says: () => "must be 0 (frozen 49,152) or at least 2",
    near: () => 0,
  },
  lr: { ok: (v) => v > 0 && v < 1, says: () => "must be in (0, 1)" },
  tokens: { ok: pos, says: () => "must be a positive whole number" },
  "max-steps": { ok: nonneg, says: () => "must be >= 0", near: () => 0 },
  "warmup-frac": { ok: (v) => v >= 0 && v <= 1, says: () => "must be within [0, 1]", near: clamp(0, 1) },
  "decay-frac": { ok: (v) => v >= 0 && v <= 1, says: () => "must be within [0, 1]", near: clamp(0, 1) },
  seed: { ok: nonneg, says: () => "must be a whole number >= 0" },
  "data-seed": { ok: nonneg, says: () => "must be a whole number >= 0" },
  "val-tokens": { ok: pos, says: () => "must be a positive whole number" },
  "log-every": { ok: pos, says: () => "must be a positive whole number" },
  "push-every-steps": { ok: nonneg, says: () => "must be >= 0 (0 = steps // 10)", near: () => 0 },
  "stop-after-steps": { ok: nonneg, says: () => "must be >= 0 (0 = run to the horizon)", near: () => 0 },
  "min-free-gb": { ok: (v) => v >= 0, says: () => "must be >= 0", near: () => 0 },
  "activation-budget-gb": {
    ok: (v) => Number.isFinite(v) && v >= 0,
    says: () => "must be a number of GB >= 0 (0 = half this machine's memory over the ranks)",
    near: () => 0,
  },
  "hub-timeout-seconds": {
    ok: (v) => Number.isFinite(v) && v >= 0.1 && v <= 3600,
    says: () => "must be within [0.1, 3600]",
  },
  "hub-retry-minutes": {
    ok: (v) => Number.isFinite(v) && v > 0 && v <= 7 * 24 * 60,
    says: () => "must be > 0 and at most a week (10080)",
  },
  benchmark: { ok: nonneg, says: () => "must be >= 0", near: () => 0 },
};

/** The advice of a value refused by its range: the nearest value in range, else the default that applies. */
function rangeFix(spec: FlagSpec, v: number, demo: boolean): Fix {
  const r = RANGES[spec.flag];
  const flag = `--${spec.flag}`;
  const cands = Number.isFinite(v) && !Number.isInteger(v) && spec.kind === "int" ? [Math.floor(v), Math.ceil(v)] : [];
  const near = cands.filter((x) => r.ok(x));
  if (near.length) return { ways: near.map((x) => ({ changes: [[flag, String(x)]] })) };
  const n = r.near?.(v);
  if (n !== undefined && r.ok(n)) return { ways: [{ changes: [[flag, String(n)]], why: "the nearest allowed" }] };
  const demoDef = demo ? (DEMO_DEFAULTS as Record<string, unknown>)[spec.key] : undefined;
  return typeof demoDef === "number"
    ? { ways: [{ changes: [[flag, String(demoDef)]], why: "--demo's default" }] }
    : { ways: [{ changes: [[flag, String(spec.def)]], why: "its default" }] };
}

/** Range checks that need no data. Checks that need the mix or the plan live with them (D6, G1, K1). */
export function validate(c: RunConfig): RunConfig {
  for (const [flag, r] of Object.entries(RANGES)) {
    const spec = FLAGS.find((f) => f.flag === flag)!;
    const v = c[spec.key] as number;
    if (!r.ok(v)) throw new UserError("G10", `--${flag}: ${v} ${r.says(v)}; run `, rangeFix(spec, v, c.demo));
  }
  c = { ...c, hosts: c.hosts ?? 1 };
  if (!(Number.isSafeInteger(c.hosts) && c.hosts >= 1))
    throw new Error(`config: hosts ${c.hosts} must be a whole number >= 1 (set from the MPI world)`);
  if (c.resume === "auto") {
    if (!c.hubRepo && !c.demo)
      throw new UserError(
        "R2",
        "--resume auto asks the Hub where the run stopped, so it needs --hub-repo: pass --hub-repo OWNER/NAME (the repo the run publishes to), or --resume with a checkpoint folder (RUN/ckpt/checkpoint-N)",
      );
  }
  if (c.hubRepo && !isRepoId(c.hubRepo)) {
    throw new UserError(
      "K5",
      `--hub-repo ${JSON.stringify(c.hubRepo)} is not a Hub repo id (${REPO_ID_RULE}); pass e.g. --hub-repo my-user/my-run-ckpts`,
    );
  }
  if (c.hubUrl !== EMBEDDED_HUB) {
    const bad = hubUrlProblem(c.hubUrl);
    if (bad) {
      const fixed = hubUrlFixed(c.hubUrl);
      throw new UserError("G10", `--hub-url ${JSON.stringify(c.hubUrl)} ${bad}: run `, {
        ways: fixed
          ? [{ changes: [["--hub-url", fixed]] }]
          : [
              { changes: [["--hub-url", DEFAULT_HUB_URL]], why: "the Hugging Face Hub" },
              { changes: [["--hub-url", EMBEDDED_HUB]], why: "the local Hub" },
            ],
      });
    }
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
      `--hub-dir ${JSON.stringify(c.hubDir)} is the folder of the embedded local Hub, but --hub-url is ${c.hubUrl}; run `,
      {
        ways: [
          { changes: [["--hub-url", EMBEDDED_HUB]], why: "the embedded Hub, in --hub-dir" },
          { changes: [["--hub-dir", null]], why: `the Hub at ${c.hubUrl}` },
        ],
      },
    );
  }
  refuseEngineMismatch(c);
  const gpus = parseGpuChoice(c.gpus);
  if (typeof gpus === "string")
    throw new UserError("A13", `--gpus ${JSON.stringify(c.gpus)}: ${gpus} (as in --gpus 0,1); run `, {
      ways: [{ changes: [["--gpus", null]], why: "every GPU of the host" }],
    });
  if (gpus.length > 0 && c.backend !== "webgpu")
    throw new UserError("A13", `--gpus chooses the devices of --backend webgpu, and --backend is ${c.backend}: run `, {
      ways: [
        { changes: [["--backend", "webgpu"]], why: "to use them" },
        { changes: [["--gpus", null]], why: `without --gpus, on --backend ${c.backend}` },
      ],
    });
  if (c.dryRun && c.benchmark)
    throw new UserError("G7", "--dry-run and --benchmark exclude each other: pick one: run ", {
      ways: [
        { changes: [["--benchmark", null]], why: "--dry-run alone prints the plan" },
        { changes: [["--dry-run", false]], why: `--benchmark ${c.benchmark} alone times ${c.benchmark} steps` },
      ],
    });
  if (c.hubUrl !== EMBEDDED_HUB) c.hubUrl = canonicalHubUrl(c.hubUrl);
  return Object.freeze({ ...c });
}

/** A GPU named by --gpus: its index in the host's order, or its PCI address in full (0000:17:00.0), lowercase. */
export type GpuName = { index: number } | { pci: string };

/**
 * A13: --gpus's list (`0,1` or `0000:17:00.0,0000:2a:00.0`, an address also as lspci prints it: `17:00.0`), or
 * the reason it is none: an entry neither an index nor a PCI address, or one named twice. "" is the empty list.
 */
export function parseGpuChoice(s: string): GpuName[] | string {
  if (s.trim() === "") return [];
  const out: GpuName[] = [];
  for (const raw of s.split(",")) {
    const t = raw.trim().toLowerCase();
    const pci = /^(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$/.exec(t);
    let g: GpuName;
    if (/^\d+$/.test(t) && t.length < 6) g = { index: Number(t) };
    else if (pci) g = { pci: `${pci[1] ?? "0000"}:${pci[2]}:${pci[3]}.${pci[4]}` };
    else
      return `${JSON.stringify(raw.trim())} is neither a GPU index (0, 1, ...) nor a PCI address (0000:17:00.0, as \`lspci -D\` prints it)`;
    const key = JSON.stringify(g);
    if (out.some((o) => JSON.stringify(o) === key)) return `${JSON.stringify(raw.trim())} is named twice`;
    out.push(g);
  }
  return out;
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

/**
 * P8: bf16 products run on the native engine's own GEMM only. P1: --isa and --gemm choose the native engine's
 * matrix products; a --backend that is not that engine would drop them without a word. (An --isa that computes bf16
 * only, amx or avx512bf16, without --precision bf16 is refused by model/backend.ts, which knows what this CPU runs.)
 */
function refuseEngineMismatch(c: RunConfig): void {
  const tfjsOrGpu = c.backend !== "auto" && c.backend !== "native";
  const fp32 = { changes: [["--precision", null]], why: "fp32" } as const;
  if (c.precision === "bf16" && tfjsOrGpu)
    throw new UserError(
      "P8",
      `--precision bf16 runs on the native engine's own GEMM, and --backend ${c.backend} computes in fp32 only: run `,
      { ways: [{ changes: [["--backend", "native"]], why: "bf16 on the native engine" }, fp32] },
    );
  if (c.precision === "bf16" && c.gemm !== "builtin")
    throw new UserError("P8", `--precision bf16 runs on the built-in GEMM, not --gemm ${c.gemm}: run `, {
      ways: [
        { changes: [["--gemm", null]], why: "bf16 on the built-in GEMM" },
        { ...fp32, why: `fp32 on --gemm ${c.gemm}` },
      ],
    });
  if (c.gemm === "openblas" && c.isa !== "auto")
    throw new UserError(
      "P1",
      `--isa ${c.isa} chooses a kernel of the built-in GEMM, and --gemm openblas does not run it, so it would be ignored: run `,
      {
        ways: [
          { changes: [["--gemm", null]], why: `the built-in GEMM, to use --isa ${c.isa}` },
          { changes: [["--isa", null]], why: "OpenBLAS, without --isa" },
        ],
      },
    );
  if (c.webgpuFold !== "device" && c.backend !== "webgpu")
    throw new UserError(
      "A10",
      `--webgpu-fold ${c.webgpuFold} chooses where the webgpu engine folds each micro-batch's gradient, and --backend ${c.backend} always folds on the host, so it would be ignored: run `,
      {
        ways: [
          { changes: [["--backend", "webgpu"]], why: "to use it" },
          { changes: [["--webgpu-fold", null]], why: `without --webgpu-fold, on --backend ${c.backend}` },
        ],
      },
    );
  if (tfjsOrGpu && (c.isa !== "auto" || c.gemm !== "builtin")) {
    const flag = c.isa !== "auto" ? "--isa" : "--gemm";
    throw new UserError(
      "P1",
      `${flag} ${c.isa !== "auto" ? c.isa : c.gemm} chooses the native engine's matrix products, and --backend ${c.backend} does not run that engine, so it would be ignored: run `,
      {
        ways: [
          { changes: [["--backend", "native"]], why: "to use it" },
          { changes: [[flag, null]], why: `the default, for --backend ${c.backend}` },
        ],
      },
    );
  }
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

/** `fit`: the flags that make this run fit its mix (data/budget.ts fitToMix), for the P5 refusal's advice. */
export function planSteps(c: RunConfig, fit: readonly FlagChange[] | null = null): StepPlan {
  const seqsPerStep = c.microBatch * c.world * c.hosts * c.accum; // A9: every rank of every process
  const tokensPerStep = seqsPerStep * c.seqLen;
  const stepsPlanned = c.maxSteps || Math.floor(c.tokens / tokensPerStep);
  if (stepsPlanned < 1) {
    const geometry = fit?.some(([f]) => ["--seq-len", "--micro-batch", "--accum"].includes(f));
    throw new UserError(
      "P5",
      `--tokens ${c.tokens} is less than one step of ${tokensPerStep} tokens (micro ${c.microBatch} x world ${c.world}${c.hosts > 1 ? ` x ${c.hosts} processes` : ""} x accum ${c.accum} x seq ${c.seqLen}): run `,
      {
        ways: [
          fit && geometry
            ? { changes: fit, why: "what the mix holds" }
            : { changes: [["--tokens", String(tokensPerStep)]], why: "one step; more works too" },
        ],
      },
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
