/**
 * The run config: every flag of the seed with the seed's default (the frozen recipe, G10), plus the
 * flags this stack adds (--world, --backend, --demo, --hub-url, --min-free-gb). Parsed and validated
 * once, at the edge, then frozen; the coordinator saves it in every checkpoint (STYLE 4).
 *
 * A seed flag with no meaning in this stack is either given its closest honest meaning or refused
 * with the reason: never silently ignored.
 */
import { UserError } from "./errors";

export type BackendFlag = "auto" | "native" | "tensorflow" | "wasm" | "cpu";

export interface RunConfig {
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
  backend: BackendFlag;
  demo: boolean;
  /** Variant vocabulary; 0 = the frozen 49,152 (M1), or under --demo the demo tokenizer's size. */
  vocabSize: number;
  /** K6: stop only after a checkpoint has failed to publish for this many minutes. */
  hubRetryMinutes: number;
  /** K6: one Hub request may wait this long for its answer (plus 1 s per MiB sent) before it counts as failed. */
  hubTimeoutSeconds: number;
  /** R3: --resume auto resumes from the pointer even when newer checkpoint folders without a manifest exist. */
  resumeIgnoreUnproven: boolean;
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

/** The table --help prints and the parser reads. Defaults are the seed's (G10). */
export const FLAGS: readonly FlagSpec[] = [
  { flag: "root", key: "root", kind: "string", def: "./mix", help: "mix root (manifest.json + shards), built by dist/prepare.js (D1)" },
  { flag: "out", key: "out", kind: "string", def: "./run", help: "run folder: checkpoints, metrics.jsonl, loss curve, final/" },
  { flag: "hub-repo", key: "hubRepo", kind: "string", def: "", help: "Hub repo for checkpoints, owner/name; '' = no upload (K5)" },
  { flag: "hub-repo-type", key: "hubRepoType", kind: "string", def: "dataset", choices: ["dataset", "model"], help: "Hub repo type (K5)" },
  { flag: "hub-url", key: "hubUrl", kind: "string", def: "https://huggingface.co", help: "Hub endpoint; 'embedded' starts the local Hub in-process (--demo's default, B6)" },
  { flag: "hub-dir", key: "hubDir", kind: "string", def: "", help: "folder of the embedded local Hub (--hub-url embedded); '' = <out>/hub (L8, B6)" },
  { flag: "seq-len", key: "seqLen", kind: "int", def: 1024, help: "tokens per training window (D4)" },
  { flag: "attn", key: "attn", kind: "string", def: "eager", choices: ["eager", "sdpa", "flash_attention_2"], help: "attention kernel; this stack has one (eager math), the others are refused" },
  { flag: "grad-ckpt", key: "gradCkpt", kind: "bool", def: true, negatable: true, help: "recompute each block's activations in backward (M6); --no-grad-ckpt keeps them" },
  { flag: "layers", key: "layers", kind: "int", def: 0, help: "0 = frozen 22; a variant layer count at width 576 (M2)" },
  { flag: "hidden", key: "hidden", kind: "int", def: 0, help: "0 = frozen 576; a variant width, must divide by 9 heads (M2)" },
  { flag: "vocab-size", key: "vocabSize", kind: "int", def: 0, help: "0 = frozen 49,152 (--demo: the demo tokenizer's); a variant vocabulary, at least the mix's (M2)" },
  { flag: "micro-batch", key: "microBatch", kind: "int", def: 4, help: "sequences per rank per micro-batch (P6)" },
  { flag: "accum", key: "accum", kind: "int", def: 32, help: "micro-batches per optimizer step (P6)" },
  { flag: "lr", key: "lr", kind: "float", def: 6e-4, help: "peak learning rate (P3)" },
  { flag: "optim", key: "optim", kind: "string", def: "adamw_torch", choices: ["adamw_torch", "adamw_torch_fused", "adamw_apex_fused"], help: "AdamW with torch semantics; the fused names are the same update and run the same code here" },
  { flag: "gc-nonreentrant", key: "gradCkpt", kind: "bool", def: false, help: "torch autograd detail with no meaning here: refused when set" },
  { flag: "torch-compile", key: "gradCkpt", kind: "bool", def: false, help: "torch.compile has no meaning here: refused when set" },
  { flag: "tokens", key: "tokens", kind: "int", def: 1_000_000_000, help: "token budget; steps = int(tokens / tokens_per_step) unless --max-steps (P5)" },
  { flag: "max-steps", key: "maxSteps", kind: "int", def: 0, help: "0 = derive from --tokens; >0 is the horizon (P5)" },
  { flag: "warmup-frac", key: "warmupFrac", kind: "float", def: 0.02, help: "warmup = max(100, int(steps*frac)) (P5)" },
  { flag: "decay-frac", key: "decayFrac", kind: "float", def: 0.8, help: "linear decay to 0 starts at int(steps*frac) (P5)" },
  { flag: "seed", key: "seed", kind: "int", def: 20260919, help: "weight-init seed, identical on every rank (M5)" },
  { flag: "data-seed", key: "dataSeed", kind: "int", def: 20260919, help: "window permutation seed (D4)" },
  { flag: "resume", key: "resume", kind: "string", def: "", help: "checkpoint dir, 'auto' (ask the Hub), or '' = fresh start (R1)" },
  { flag: "val-tokens", key: "valTokens", kind: "int", def: 2_000_000, help: "validation tokens at the horizon (D7)" },
  { flag: "log-every", key: "logEvery", kind: "int", def: 10, help: "log every N steps (G9)" },
  { flag: "push-every-steps", key: "pushEverySteps", kind: "int", def: 0, help: "checkpoint interval; 0 = max(1, steps // 10) (K1)" },
  { flag: "stop-after-steps", key: "stopAfterSteps", kind: "int", def: 0, help: "end this session on the verified checkpoint at step S (G1)" },
  { flag: "hub-retry-minutes", key: "hubRetryMinutes", kind: "float", def: 30, help: "retry transient Hub failures (network, timeouts, 429, 5xx) while training goes on; stop once a checkpoint has failed to publish for this long (K6)" },
  { flag: "hub-timeout-seconds", key: "hubTimeoutSeconds", kind: "float", def: 60, help: "one Hub request may wait this long for its answer (plus 1 s per MiB sent); a timeout is retried (K6)" },
  { flag: "resume-ignore-unproven", key: "resumeIgnoreUnproven", kind: "bool", def: false, help: "--resume auto: resume from latest.json even when the repo holds newer checkpoint folders without a manifest; the run overwrites them (R3)" },
  { flag: "prune", key: "prune", kind: "bool", def: false, help: "delete the local checkpoint after it verified on the Hub (K3)" },
  { flag: "min-free-gb", key: "minFreeGb", kind: "float", def: 6, help: "prune only while free disk stays above this (K3)" },
  { flag: "sample", key: "sample", kind: "bool", def: true, negatable: true, help: "log a short greedy sample from the prompt \"The\" at every checkpoint and at the end, into samples.jsonl and report.html (G11); --no-sample turns it off" },
  { flag: "dry-run", key: "dryRun", kind: "bool", def: false, help: "build everything, train nothing, print one JSON (G7)" },
  { flag: "benchmark", key: "benchmark", kind: "int", def: 0, help: "N steps without the actor machinery; never checkpoints (G8)" },
  { flag: "world", key: "world", kind: "int", def: 1, help: "number of rank worker threads (A1); --demo defaults to 2" },
  { flag: "backend", key: "backend", kind: "string", def: "auto", choices: ["auto", "native", "tensorflow", "wasm", "cpu"], help: "compute engine: auto = native (C + OpenBLAS) when it loads, else tfjs-node-gpu, tfjs-node, wasm, cpu, first that loads" },
  { flag: "demo", key: "demo", kind: "bool", def: false, help: "small model on the bundled corpus, world 2, local Hub, in minutes" },
];

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
    const name = f.kind === "bool" ? `--${f.flag}${f.negatable ? " / --no-" + f.flag : ""}` : `--${f.flag} ${f.kind === "string" ? (f.choices ? f.choices.join("|") : "S") : "N"}`;
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

export interface ParsedArgs { config: RunConfig; help: boolean; explicit: ReadonlySet<string> }

/** Parse argv (without node and script). Unknown flags are an error, as in nanoGPT's configurator. */
export function parseArgs(argv: readonly string[]): ParsedArgs {
  const byFlag = new Map(FLAGS.map((f) => [f.flag, f]));
  const { values, help } = readFlagValues(argv, byFlag);
  refuseTorchOnlyFlags(values);
  const config = validate(configFrom(values, byFlag) as unknown as RunConfig);
  return { config, help, explicit: new Set(values.keys()) };
}

/** Each flag given, by name, to its parsed value (checked against its kind and choices); and whether --help was. */
function readFlagValues(argv: readonly string[], byFlag: ReadonlyMap<string, FlagSpec>): { values: Map<string, string | number | boolean>; help: boolean } {
  const values = new Map<string, string | number | boolean>();
  let help = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--help" || a === "-h") { help = true; continue; }
    if (!a.startsWith("--")) throw new UserError("G10", `unexpected argument ${JSON.stringify(a)}: flags start with -- (see --help)`);
    let name = a.slice(2);
    let inline: string | undefined;
    const eq = name.indexOf("=");
    if (eq >= 0) { inline = name.slice(eq + 1); name = name.slice(0, eq); }
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
      if (inline === undefined) { values.set(spec.flag, true); continue; }
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
function refuseTorchOnlyFlags(values: Map<string, string | number | boolean>): void {
  if (values.get("gc-nonreentrant") === true) {
    throw new UserError("G10", "--gc-nonreentrant selects a torch autograd path; this trainer has one hand-written recompute path (M6), so the flag has no meaning here. Drop it.");
  }
  if (values.get("torch-compile") === true) {
    throw new UserError("G10", "--torch-compile is torch.compile; tfjs has no graph compiler to turn on, so the flag has no meaning here. Drop it.");
  }
  const attn = values.get("attn");
  if (attn !== undefined && attn !== "eager") {
    throw new UserError("G10", `--attn ${attn} is a CUDA attention kernel of torch; this stack computes attention one way (the eager math of HF Llama, M4). Use --attn eager or leave it out.`);
  }
  values.delete("gc-nonreentrant");
  values.delete("torch-compile");
}

/** Defaults, then --demo's defaults when --demo is given, then the flags given: the unvalidated config. */
function configFrom(values: ReadonlyMap<string, string | number | boolean>, byFlag: ReadonlyMap<string, FlagSpec>): Record<string, unknown> {
  const cfg: Record<string, unknown> = {};
  for (const f of FLAGS) {
    if (f.flag === "gc-nonreentrant" || f.flag === "torch-compile") continue;
    cfg[f.key] = f.def;
  }
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
  must(pos(c.seqLen) && c.seqLen >= 2, "seq-len", `${c.seqLen} must be a whole number >= 2 (a window predicts seq_len-1 tokens)`);
  must(pos(c.microBatch), "micro-batch", `${c.microBatch} must be a positive whole number`);
  must(pos(c.accum), "accum", `${c.accum} must be a positive whole number`);
  must(pos(c.world), "world", `${c.world} must be a positive whole number of ranks`);
  must(c.world <= 64, "world", `${c.world} ranks is more than this trainer supports (64)`);
  must(nonneg(c.layers), "layers", `${c.layers} must be 0 (frozen) or a positive layer count`);
  must(nonneg(c.hidden), "hidden", `${c.hidden} must be 0 (frozen) or a positive width`);
  must(nonneg(c.vocabSize) && (c.vocabSize === 0 || c.vocabSize >= 2), "vocab-size", `${c.vocabSize} must be 0 (frozen 49,152) or at least 2`);
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
  must(Number.isFinite(c.hubTimeoutSeconds) && c.hubTimeoutSeconds >= 0.1 && c.hubTimeoutSeconds <= 3600, "hub-timeout-seconds", `${c.hubTimeoutSeconds} must be within [0.1, 3600]`);
  must(Number.isFinite(c.hubRetryMinutes) && c.hubRetryMinutes > 0 && c.hubRetryMinutes <= 7 * 24 * 60, "hub-retry-minutes", `${c.hubRetryMinutes} must be > 0 and at most a week (10080)`);
  must(nonneg(c.benchmark), "benchmark", `${c.benchmark} must be >= 0`);
  if (c.resume === "auto") {
    if (!c.hubRepo && !c.demo) throw new UserError("R2", "--resume auto asks the Hub where the run stopped, so it needs --hub-repo");
  }
  if (c.hubRepo && !/^[A-Za-z0-9][\w.-]*\/[\w.-]+$/.test(c.hubRepo)) {
    throw new UserError("K5", `--hub-repo ${JSON.stringify(c.hubRepo)} is not of the form owner/name`);
  }
  if (c.hubDir && c.hubUrl !== EMBEDDED_HUB) {
    throw new UserError("B6", `--hub-dir ${JSON.stringify(c.hubDir)} is the folder of the embedded local Hub, but --hub-url is ${c.hubUrl}; add --hub-url embedded or drop --hub-dir`);
  }
  if (c.dryRun && c.benchmark) throw new UserError("G7", "--dry-run and --benchmark exclude each other: pick one");
  c.hubUrl = c.hubUrl.replace(/\/+$/, "");
  return Object.freeze({ ...c });
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
  const seqsPerStep = c.microBatch * c.world * c.accum;
  const tokensPerStep = seqsPerStep * c.seqLen;
  const stepsPlanned = c.maxSteps || Math.floor(c.tokens / tokensPerStep);
  if (stepsPlanned < 1) {
    throw new UserError("P5", `--tokens ${c.tokens} is less than one step of ${tokensPerStep} tokens (micro ${c.microBatch} x world ${c.world} x accum ${c.accum} x seq ${c.seqLen}): raise --tokens or set --max-steps`);
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
