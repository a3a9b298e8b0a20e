/**
 * `npm run bench`: the bench harness (A5, G8, B3). In one run, on one model, data path and optimizer:
 *
 *   single         the whole step in this thread (SingleThreadTrainer): no workers, no shared memory
 *   actor          the actor runtime (Coordinator + rank workers) at world 1, 2, … (cores allowing)
 *   framework-free `node dist/main.js --benchmark N` as a subprocess (G8, the user-facing path)
 *   optim          gradient average + AdamW alone against parameter count, 1 thread vs split by slice
 *   upload         actor step time while checkpoints upload to an embedded LocalHub vs not (B3)
 *   torch          bench/anchors/torch_llama.py at the same shape, when /usr/bin/python3 has torch
 *
 * Every figure is the median of >= 5 timed steps after warm-up; `single` and `actor` take turns step by
 * step (interleaved) so drift on a shared machine hits them alike. Output: one `BENCH_JSON` line per
 * figure and per ratio on stdout (progress on stderr), and latest.{json,md} (plus kernels-frozen-step.{md,json}
 * when the frozen-step case ran) in the output folder: ./bench-out/ (git-ignored) unless --out names another; the
 * committed bench/results/ move only with an explicit --out bench/results/...
 *
 *   node dist/bench/bench.js [--model small|demo|frozen] [--seq N] [--micro-batch N] [--accum N]
 *     [--steps N] [--warmup N] [--backend auto|native|wasm|cpu|webgpu] [--cases single,actor,framework-free,optim,upload,torch,frozen-step,gemm,attention,mpi]
 *     [--worlds 1,2] [--upload-worlds 2,1] [--optim-sizes 1M,10M,50M,106M] [--sequential] [--no-grad-ckpt] [--out DIR]
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { BackendName } from "../src/model/backend";
import { buildShape, MODELS, scratchDir, tokensPerStep, type ModelName, type Shape } from "./shape";
import { actorRunner, localRunner, runSteps, runUploadCase, stepRow, type BenchRow, type Runner } from "./steps";
import { builtinGemmBf16, fmaPeak, supportedIsas } from "../src/model/engine/native";
import { parseCount, runOptimCase } from "./optim";
import { REPO_ROOT, runFrameworkFree, runMpiCase, runTorch, torchVersion } from "./subproc";
import { markdown, type Machine, type Ratio } from "./report";
import { median, r } from "./stats";
import { coresAvailable } from "./probe";
import { frozenStepBench } from "./model-frozen-step";
import { webgpuBench } from "./webgpu";
import { attentionBench, type BaseAttention, BUILD_BASE, loadBaseAttention } from "./attention";
import { kernelTableMarkdown, profileSummary, type KernelRow } from "./kernel-profile";
import { createHash } from "node:crypto";
import { activationBudget, type GemmChoice, type IsaChoice, type Precision } from "../src/config";
import { type FlagArgs, type FlagTable, parseFlags } from "../src/cli-args";
import { gemmShapesBench, gemmTableMarkdown, type GemmRow } from "./gemm-shapes";

/** A fingerprint of the compiled runtime (dist/src): rank workers and subprocesses load it when they
 *  start, so a rebuild in the middle of a run (a shared tree) would make cases run different code. */
function codeFingerprint(): string {
  const h = createHash("sha256");
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith(".js")) h.update(e.name).update(fs.readFileSync(p));
    }
  };
  try {
    walk(path.join(REPO_ROOT, "dist", "src"));
  } catch {
    return "?";
  }
  return h.digest("hex").slice(0, 12);
}

const ALL_CASES = [
  "single",
  "actor",
  "framework-free",
  "optim",
  "upload",
  "torch",
  "frozen-step",
  "gemm",
  "attention",
  "mpi",
  "webgpu",
] as const;
type CaseName = (typeof ALL_CASES)[number];
/** frozen-step (the MFU figure on the 106M model) takes minutes, so it runs only when asked. */
const DEFAULT_CASES: CaseName[] = ALL_CASES.filter((c) => c !== "frozen-step" && c !== "mpi" && c !== "webgpu");

interface Options {
  model: ModelName;
  seq: number;
  /** The sequence lengths the step cases (actor, single, torch, ...) run at, one after the other (`--seqs`). */
  seqs: number[];
  /** Thread counts of the PyTorch fp32 anchor (`--torch-threads`; default 1 and all cores). */
  torchThreads: number[];
  microBatch: number;
  accum: number;
  steps: number;
  warmup: number;
  backend: BackendName;
  cases: Set<CaseName>;
  worlds: number[];
  uploadWorlds: number[];
  optimSizes: number[];
  optimThreads: number;
  interleave: boolean;
  gradCkpt: boolean;
  /** M6: GB a rank's activations may take; 0 = half the machine's memory over the ranks (the trainer's default). */
  activationBudgetGb: number;
  out: string;
  ffRuns: number;
  uploadNice: boolean;
  waitQuiet: number;
  rewarm: number;
  /** The native engine's GEMMs the actor cases run on (each world once per GEMM, interleaved). */
  gemms: GemmChoice[];
  /** The products' precisions the actor cases run in (bf16 on the built-in GEMM only, P8). */
  precisions: Precision[];
  /** The built-in GEMM's kernels the actor and frozen-step cases run on, one after the other (`--isas`, as the
   *  trainer's --isa forces one); "auto" the trainer's choice. */
  isas: IsaChoice[];
  gemmRounds: number;
  gemmSeqs: number[];
  /** attention case: an older revision's own build beside this one (`--attention-base DIR`), loaded when parsed */
  attentionBase?: BaseAttention;
  /** webgpu case: an older revision's build (`--webgpu-base DIR`) whose engine runs the same step */
  webgpuBase?: { dir: string; rev: string };
}

const cores = os.availableParallelism();

function usage(): string {
  return [
    "usage: node dist/bench/bench.js [flags]   (npm run bench = build + this)",
    "  --model small|demo|frozen   small: 4 layers, width 216, vocab 4096 (~2.9M); demo: the --demo model (~1.4M); frozen: 106M (default small)",
    "  --seq N                     sequence length (default 128)",
    "  --micro-batch N             sequences per rank per micro-batch (default 4)",
    "  --accum N                   micro-batches per step (default 1)",
    "  --steps N                   timed steps per case, >= 5 (default 8)",
    "  --warmup N                  untimed warm-up steps per case (default 1)",
    "  --backend auto|native|wasm|cpu|webgpu  engine for every case (default auto, as the trainer: native when it loads, else tfjs); webgpu: the frozen-step and actor cases only",
    `  --cases a,b,c               of ${ALL_CASES.join(",")} (default all but frozen-step: the frozen 106M model's fwd+bwd, its MFU against the matMul rate, at --seq/--micro-batch)`,
    `  --worlds 1,2                actor world sizes (default 1..max(2, availableParallelism=${cores}))`,
    "  --upload-worlds 2,1         actor worlds for the upload-stall case (default 2,1: 2 = spec, 1 = a core left free)",
    "  --optim-sizes 1M,10M,...    parameter counts for the optim case (default 1M,10M,50M,106M)",
    "  --optim-threads N           threads for the split optim case (default 2)",
    "  --gemms builtin,openblas    the native engine's GEMMs the actor cases run on, each world once per GEMM (default builtin)",
    "  --precisions fp32,bf16      the products' precisions the actor cases run in (bf16: built-in GEMM only; default fp32)",
    "  --isas avx2,avx512          the actor and frozen-step cases once per built-in GEMM kernel, forced as --isa forces it (rows -avx2, ...; default auto)",
    "  --torch-threads 1,2          the PyTorch anchor's thread counts (default 1 and all cores; autocast bf16 runs at all cores)",
    "  --seqs 256,1024             run the step cases (single, actor, framework-free, torch) at each seq in turn; with more than one, case names get @seq",
    "  --gemm-rounds N             gemm case: rounds over every shape and kernel, best of rounds reported (default 5)",
    "  --gemm-seqs 256,1024        gemm and attention cases: the sequence lengths measured (default 256,1024)",
    "  --attention-base DIR        attention case: also time DIR's own build of an older revision (bench/native/build-base.sh 2babbe7 DIR)",
    "  --webgpu-base DIR           webgpu case: also run DIR's build of an older revision (bench/native/build-base.sh REV DIR builds its TypeScript too)",
    "  --ff-runs N                 framework-free subprocess runs, split before/after the interleaved cases (default 2)",
    "  --upload-nice               experiment: also run the upload case with the uploader thread reniced to 19 (Linux)",
    "  --wait-quiet S              before starting, wait up to S seconds for the spin probe to get >= 90% of the cores (default 0)",
    "  --rewarm N                  interleaved: untimed steps at the start of each turn (default 1; 0 = time the first step after a switch)",
    "  --sequential                run the step cases back to back instead of interleaved, one runtime alive at a time (less memory for --model frozen)",
    "  --no-grad-ckpt              gradient checkpointing off (the trainer's default is on)",
    "  --out DIR                   where latest.json / latest.md (and the kernel table) go (default ./bench-out, git-ignored;",
    "                              the committed results move only with an explicit --out bench/results/...)",
  ].join("\n");
}

/** The bench's defaults (a 2.9M-parameter model, seq 128, every case but frozen-step). */
function defaultOptions(): Options {
  return {
    model: "small",
    seq: 128,
    seqs: [128],
    torchThreads: [...new Set([1, os.availableParallelism()])],
    microBatch: 4,
    accum: 1,
    steps: 8,
    warmup: 1,
    backend: "auto",
    cases: new Set(DEFAULT_CASES),
    worlds: Array.from({ length: Math.max(2, cores) }, (_, i) => i + 1),
    uploadWorlds: [2, 1],
    optimSizes: ["1M", "10M", "50M", "106M"].map(parseCount),
    optimThreads: 2,
    interleave: true,
    gradCkpt: true,
    activationBudgetGb: 0,
    ffRuns: 2,
    uploadNice: false,
    waitQuiet: 0,
    rewarm: 1,
    out: path.join(REPO_ROOT, "bench-out"),
    gemms: ["builtin"],
    precisions: ["fp32"],
    isas: ["auto"],
    gemmRounds: 5,
    gemmSeqs: [256, 1024],
  };
}

/** A flag's value as a whole number >= min, or an error naming the flag. */
function int(flag: string, v: string | undefined, min: number): number {
  const n = Number(v);
  if (v === undefined || !Number.isSafeInteger(n) || n < min)
    throw new Error(`${flag} needs a whole number >= ${min}, got ${JSON.stringify(v)}`);
  return n;
}

/** A flag's comma-separated value, trimmed, empty items dropped. */
function list(flag: string, v: string | undefined): string[] {
  if (!v) throw new Error(`${flag} needs a comma-separated list`);
  return v
    .split(",")
    .map((x) => x.trim())
    .filter(Boolean);
}

/** A flag's list of whole numbers >= min. */
const ints = (a: FlagArgs, min: number) => list(a.flag, a.next()).map((x) => int(a.flag, x, min));

/** The bench's flags (usage() says what each does). */
const FLAGS: FlagTable<Options> = {
  "--model": (o, a) => {
    const m = a.next();
    if (m !== "small" && m !== "demo" && m !== "frozen")
      throw new Error(`--model ${JSON.stringify(m)}: use small, demo or frozen`);
    o.model = m;
  },
  "--seq": (o, a) => {
    o.seq = int(a.flag, a.next(), 2);
    o.seqs = [o.seq];
  },
  "--seqs": (o, a) => {
    o.seqs = ints(a, 2);
    o.seq = o.seqs[0];
  },
  "--torch-threads": (o, a) => {
    o.torchThreads = ints(a, 1);
  },
  "--micro-batch": (o, a) => {
    o.microBatch = int(a.flag, a.next(), 1);
  },
  "--accum": (o, a) => {
    o.accum = int(a.flag, a.next(), 1);
  },
  "--steps": (o, a) => {
    o.steps = int(a.flag, a.next(), 1);
  },
  "--warmup": (o, a) => {
    o.warmup = int(a.flag, a.next(), 0);
  },
  "--backend": (o, a) => {
    const b = a.next();
    if (b !== "auto" && b !== "native" && b !== "wasm" && b !== "cpu" && b !== "tensorflow" && b !== "webgpu")
      throw new Error(`--backend ${JSON.stringify(b)}: use auto, native, wasm, cpu, tensorflow or webgpu`);
    o.backend = b;
  },
  "--cases": (o, a) => {
    const cs = list(a.flag, a.next());
    for (const c of cs)
      if (!(ALL_CASES as readonly string[]).includes(c))
        throw new Error(`--cases: unknown case ${JSON.stringify(c)} (known: ${ALL_CASES.join(", ")})`);
    o.cases = new Set(cs as CaseName[]);
  },
  "--worlds": (o, a) => {
    o.worlds = ints(a, 1);
  },
  "--upload-worlds": (o, a) => {
    o.uploadWorlds = ints(a, 1);
  },
  "--optim-sizes": (o, a) => {
    o.optimSizes = list(a.flag, a.next()).map(parseCount);
  },
  "--optim-threads": (o, a) => {
    o.optimThreads = int(a.flag, a.next(), 1);
  },
  "--gemms": (o, a) => {
    o.gemms = list(a.flag, a.next()).map((x) => {
      if (x !== "builtin" && x !== "openblas")
        throw new Error(`--gemms ${JSON.stringify(x)}: use builtin and/or openblas`);
      return x;
    });
  },
  "--precisions": (o, a) => {
    o.precisions = list(a.flag, a.next()).map((x) => {
      if (x !== "fp32" && x !== "bf16") throw new Error(`--precisions ${JSON.stringify(x)}: use fp32 and/or bf16`);
      return x;
    });
  },
  "--isas": (o, a) => {
    const known = ["auto", "amx", "avx512bf16", "avx512", "avx2", "portable"];
    o.isas = list(a.flag, a.next()).map((x) => {
      if (!known.includes(x)) throw new Error(`--isas ${JSON.stringify(x)}: use ${known.join(", ")}`);
      return x as IsaChoice;
    });
  },
  "--gemm-rounds": (o, a) => {
    o.gemmRounds = int(a.flag, a.next(), 1);
  },
  "--gemm-seqs": (o, a) => {
    o.gemmSeqs = ints(a, 1);
  },
  "--attention-base": (o, a) => {
    const d = a.next();
    if (!d) throw new Error(`--attention-base needs a folder: ${BUILD_BASE}`);
    o.attentionBase = loadBaseAttention(d);
  },
  "--webgpu-base": (o, a) => {
    const d = a.next();
    if (!d) throw new Error(`--webgpu-base needs a folder: ${BUILD_BASE}`);
    const dir = path.resolve(d);
    if (!fs.existsSync(path.join(dir, "dist", "src", "model", "engine", "webgpu.js")))
      throw new Error(
        `--webgpu-base ${d}: no built webgpu engine there (dist/src/model/engine/webgpu.js): ${BUILD_BASE}`,
      );
    const rev = fs.existsSync(path.join(dir, ".base-rev"))
      ? fs.readFileSync(path.join(dir, ".base-rev"), "utf8").trim()
      : d;
    o.webgpuBase = { dir, rev };
  },
  "--sequential": (o) => {
    o.interleave = false;
  },
  "--ff-runs": (o, a) => {
    o.ffRuns = int(a.flag, a.next(), 1);
  },
  "--upload-nice": (o) => {
    o.uploadNice = true;
  },
  "--wait-quiet": (o, a) => {
    o.waitQuiet = int(a.flag, a.next(), 0);
  },
  "--rewarm": (o, a) => {
    o.rewarm = int(a.flag, a.next(), 0);
  },
  "--no-grad-ckpt": (o) => {
    o.gradCkpt = false;
  },
  "--grad-ckpt": (o) => {
    o.gradCkpt = true;
  },
  "--activation-budget-gb": (o, a) => {
    const g = Number(a.next());
    if (!(Number.isFinite(g) && g >= 0))
      throw new Error(`--activation-budget-gb ${g}: must be a number of GB >= 0 (0 = half this machine's memory)`);
    o.activationBudgetGb = g;
  },
  "--out": (o, a) => {
    o.out = path.resolve(a.next() ?? "");
  },
};
FLAGS["--seq-len"] = FLAGS["--seq"];

function parseOptions(argv: string[]): Options {
  const o = parseFlags(argv, defaultOptions(), FLAGS, {
    value(flag, v) {
      if (v === undefined) throw new Error(`${flag} needs a value`);
      return v;
    },
    unknown: (a) => new Error(`unknown flag ${a}\n${usage()}`),
  });
  if (o === null) {
    process.stdout.write(`${usage()}\n`);
    process.exit(0);
  }
  if (o.attentionBase && !o.cases.has("attention"))
    throw new Error(
      `--attention-base times the attention case, which this run leaves out: add attention to --cases (e.g. --cases attention)`,
    );
  if (o.steps < 5) process.stderr.write(`warning: --steps ${o.steps} < 5: medians of fewer than 5 steps are noisy\n`);
  if (o.backend === "webgpu") {
    // the webgpu engine is deferred (kernels.ts: settle): the cases that time the model's passes themselves await it
    const other = [...o.cases].filter((c) => c !== "frozen-step" && c !== "actor");
    if (other.length)
      throw new Error(
        `--backend webgpu runs the frozen-step and actor cases only, not ${other.join(", ")}: pass --cases frozen-step,actor`,
      );
  }
  return o;
}

function log(s: string): void {
  process.stderr.write(`${s}\n`);
}

function emit(x: object): void {
  process.stdout.write(`BENCH_JSON ${JSON.stringify(x)}\n`);
}

function machine(): Machine {
  const cpus = os.cpus();
  return {
    cpu: cpus[0]?.model.trim() ?? "unknown",
    cores: cpus.length,
    available_parallelism: cores,
    total_mem_gb: r(os.totalmem() / 1e9, 1)!,
    node: process.version,
    platform: `${os.platform()} ${os.arch()}`,
    date: new Date().toISOString(),
    load_avg_1m_start: r(os.loadavg()[0], 2)!,
  };
}

type RatioField = "tok_per_s" | "step_ms_median" | "tok_per_cpu_s";

/** One ratio of the run: the numerator case's field over the denominator case's, with its target (null: reported
 *  only). A row of ratioTable; params picks, among rows of one case, those of that parameter count (optim). */
interface RatioSpec {
  name: string;
  numerator: string;
  denominator: string;
  target: { op: ">=" | "<="; v: number } | null;
  field?: RatioField;
  note?: string;
  /** said after the denominator (the torch row chosen as the best) */
  denominatorNote?: string;
  params?: number;
}

/** A RatioSpec's value from the rows (null when either case is missing or the denominator is 0), with the same ratio
 *  from each case's fastest step beside it. */
function ratio(rows: BenchRow[], s: RatioSpec): Ratio | null {
  const field = s.field ?? "tok_per_s";
  const find = (c: string) => rows.find((x) => x.case === c && (s.params === undefined || x.params === s.params));
  const a = find(s.numerator),
    b = find(s.denominator);
  const av = a?.[field],
    bv = b?.[field];
  if (typeof av !== "number" || typeof bv !== "number" || bv === 0) return null;
  const value = r(av / bv, 3);
  const t = s.target;
  const met = t === null || value === null ? null : t.op === ">=" ? value >= t.v : value <= t.v;
  // the same ratio from each case's fastest step: what the code can do when the machine leaves it alone
  const bestField = field === "tok_per_s" ? "tok_per_s_best" : field === "step_ms_median" ? "step_ms_min" : null;
  const ab = bestField ? a?.[bestField] : null,
    bb = bestField ? b?.[bestField] : null;
  const best = typeof ab === "number" && typeof bb === "number" && bb !== 0 ? r(ab / bb, 3) : null;
  return {
    ratio: s.name,
    value,
    target: t ? `${t.op} ${t.v}` : null,
    met,
    num: `${s.numerator} ${field}`,
    den: `${s.denominator} ${field}${s.denominatorNote ? ` ${s.denominatorNote}` : ""}`,
    value_best_steps: best,
    ...(s.note ? { note: s.note } : {}),
  };
}

/** One bench run's results so far: the rows, the notes, the failed cases, the frozen step's kernel profile. */
class BenchRun {
  readonly rows: BenchRow[] = [];
  gemm: { rows: GemmRow[]; peaks: Record<string, number> } | null = null;
  readonly notes: string[] = [];
  failed = 0;
  /** the frozen-step case's profiled step, one per precision */
  profiled: { rows: KernelRow[]; stepMs: number; engine: string; precision: string }[] = [];

  /** Appended to every case name recorded while set ("@1024" with --seqs), so rows of two shapes stay apart. */
  suffix = "";

  record(row: BenchRow): void {
    if (this.suffix) row.case = `${row.case}${this.suffix}`;
    this.rows.push(row);
    emit(row);
  }

  /** Runs one case; a failure is counted, noted and printed as BENCH_ERROR, and the other cases go on. */
  async guard(what: string, f: () => Promise<void>): Promise<void> {
    try {
      await f();
    } catch (e) {
      this.failed++;
      const msg = `${what} failed: ${(e as Error).message ?? String(e)}`;
      this.notes.push(msg);
      log(`!! ${msg}`);
      process.stdout.write(`BENCH_ERROR ${JSON.stringify({ case: what, error: (e as Error).message ?? String(e) })}\n`);
    }
  }
}

/** Case `mpi`: two MPI processes x world 1 against one process at world 2, same steps. */
async function runMpi(run: BenchRun, o: Options, shape: Shape, scratch: string): Promise<void> {
  await run.guard("mpi", async () => {
    log(
      `mpi: mpirun -np 2 --dist mpi --world 1 against one process at --world 2, ${o.warmup} warm-up + ${o.steps} timed steps each`,
    );
    for (const row of await runMpiCase(shape, {
      steps: o.steps,
      warmup: o.warmup,
      scratch,
      timeoutMs: 3_600_000,
      log,
    })) {
      run.record(row);
      log(
        `  ${row.case}: ${row.step_ms_median} ms/step, ${row.tok_per_s} tok/s${row.allreduce_ms_median === null ? "" : `, allreduce ${String(row.allreduce_ms_median)} ms (${(100 * Number(row.allreduce_share)).toFixed(1)} % of the step)`}`,
      );
    }
  });
}

/** Probes the free cores; waits (up to --wait-quiet seconds) while fewer than 90% are free. */
async function waitForQuietMachine(mach: Machine, o: Options): Promise<void> {
  mach.cores_available_start = await coresAvailable(cores);
  const waitUntil = performance.now() + o.waitQuiet * 1000;
  while (mach.cores_available_start < 0.9 * cores && performance.now() < waitUntil) {
    log(
      `waiting for a quiet machine: the spin probe got ${mach.cores_available_start} of ${cores} cores (--wait-quiet ${o.waitQuiet})`,
    );
    await new Promise((res) => setTimeout(res, 10_000));
    mach.cores_available_start = await coresAvailable(cores);
  }
}

/** Cases 1-3: the framework-free loop's runs around single-thread and the actor runtime (interleaved). */
async function runStepCases(run: BenchRun, o: Options, s: Shape, scratch: string): Promise<void> {
  // ---- 3 (first half): the framework-free loop of --benchmark, as the user runs it. It cannot take
  // turns step by step with the in-process cases (one process per run), so its runs sandwich them:
  // half before, half after, and the row reports the mean of the runs' medians.
  const ffRuns: BenchRow[] = [];
  const frameworkFree = async (k: number) => {
    await run.guard("framework-free", async () => {
      log(
        `framework-free run ${k + 1}/${o.ffRuns}: dist/main.js --benchmark ${o.steps} (its first step is its warm-up)`,
      );
      const row = await runFrameworkFree(s, { steps: o.steps, scratch, timeoutMs: 8 * 60_000, log });
      log(`  framework-free: ${row.step_ms_median} ms/step, ${row.tok_per_s} tok/s`);
      ffRuns.push(row);
    });
  };
  const ffBefore = o.cases.has("framework-free") ? Math.floor(o.ffRuns / 2) : 0;
  for (let k = 0; k < ffBefore; k++) await frameworkFree(k);

  // ---- 1 + 2: single-thread and the actor runtime, interleaved step by step; with --isas, one group of runtimes per
  // kernel in turn (two frozen runtimes at world 2 hold about 12 GB); --sequential: one runtime alive at a time
  if (o.cases.has("single") || o.cases.has("actor")) {
    const groups: Array<{ isa: IsaChoice; spawn: Array<() => Promise<Runner>> }> = [];
    for (const [g, isa] of o.isas.entries()) {
      const spawn: Array<() => Promise<Runner>> = [];
      if (o.cases.has("single") && g === 0) spawn.push(() => localRunner(s, 1));
      if (o.cases.has("actor"))
        for (const w of o.worlds)
          for (const gemm of o.gemms)
            for (const precision of o.precisions) {
              if (precision === "bf16" && gemm !== "builtin") continue; // P8: bf16 is the built-in GEMM's
              if (isa !== "auto" && gemm !== "builtin") continue; // --isa picks a built-in kernel
              spawn.push(() => {
                log(`spawning actor runtime world ${w}, --gemm ${gemm} --precision ${precision} --isa ${isa}`);
                return actorRunner(s, w, gemm, precision, isa);
              });
            }
      if (o.interleave) groups.push({ isa, spawn });
      else for (const f of spawn) groups.push({ isa, spawn: [f] });
    }
    for (const { isa, spawn } of groups)
      await run.guard(`single/actor${isa === "auto" ? "" : ` --isa ${isa}`}`, async () => {
        const runners: Runner[] = [];
        // the peaks before any rank exists (a rank's thread, idle or not, shares the core's FMA units with the probe
        // on an SMT sibling), and again after the steps: the higher of the two
        const peaksBefore = stepPeaks(o.precisions.includes("bf16") ? ["-bf16"] : [], isa);
        try {
          for (const f of spawn) runners.push(await f());
          log(`${o.interleave ? "interleaved" : "back to back"}: ${runners.map((x) => x.name).join(", ")}`);
          const got = await runSteps(runners, o.warmup, o.steps, o.interleave, log, o.rewarm);
          const after = stepPeaks(
            runners.map((x) => x.name),
            isa,
          );
          const higher = (a?: { isa: string; gflops: number }, b?: { isa: string; gflops: number }) =>
            a && b ? (a.gflops >= b.gflops ? a : b) : (a ?? b);
          const peaks = { fp32: higher(peaksBefore.fp32, after.fp32), bf16: higher(peaksBefore.bf16, after.bf16) };
          for (const x of runners) {
            const mem = x.memory ? await x.memory() : {};
            const row = stepRow(s, x.name, x.world, x.backend, got.get(x)!, {
              backend_detail: x.backendDetail,
              interleaved: o.interleave,
              rewarm_steps_per_turn: o.interleave ? o.rewarm : 0,
              ...(isa === "auto" ? {} : { isa }),
              ...mem,
            });
            Object.assign(row, peakMfu(s, row, x.name.endsWith("-bf16") ? peaks.bf16 : peaks.fp32));
            run.record(row);
          }
        } finally {
          for (const x of runners) await x.close();
        }
      });
  }

  // ---- 3 (second half)
  if (o.cases.has("framework-free")) {
    for (let k = ffBefore; k < o.ffRuns; k++) await frameworkFree(k);
    if (ffRuns.length) {
      const meds = ffRuns.map((x) => Number(x.step_ms_median));
      const med = meds.reduce((a, b) => a + b, 0) / meds.length;
      const tps = Number(ffRuns[0].tokens_per_step);
      run.record({
        ...ffRuns[0],
        step_ms_median: r(med),
        tok_per_s: r((tps / med) * 1000),
        steps_timed: ffRuns.reduce((a, x) => a + Number(x.steps_timed), 0),
        step_ms_min: null,
        runs: ffRuns.map((x) => ({
          step_ms_median: x.step_ms_median,
          tok_per_s: x.tok_per_s,
          wall_s: x.subprocess_wall_s,
        })),
        combine:
          ffRuns.length > 1 ? "mean of the runs' medians (runs before and after the interleaved cases)" : "one run",
      });
    }
  }
}

/** Case 5: the upload stall (B3), per world, optionally with the uploader reniced. */
async function runUploadCases(run: BenchRun, o: Options, s: Shape, scratch: string): Promise<void> {
  // ---- 5: upload stall (B3)
  if (o.cases.has("upload")) {
    const variants: Array<{ w: number; nice: boolean }> = [];
    for (const w of o.uploadWorlds) {
      variants.push({ w, nice: false });
      if (o.uploadNice) variants.push({ w, nice: true });
    }
    for (const { w, nice } of variants) {
      const tag = `upload-w${w}${nice ? "-nice" : ""}`;
      await run.guard(tag, async () => {
        log(
          `upload stall: actor world ${w}, embedded LocalHub on loopback${nice ? ", uploader thread reniced to 19" : ""}`,
        );
        const u = await runUploadCase(s, w, { warmup: o.warmup, steps: o.steps, scratch, niceUploader: nice, log });
        const up = {
          uploads: u.uploads.length,
          upload_s_median: r(median(u.uploads.map((x) => x.seconds)), 2),
          push_verify_s_median: r(median(u.uploads.map((x) => x.pushVerifySeconds ?? Number.NaN)), 2),
          stage_ms_median: r(median(u.stageMs)),
          uploader_niced: nice,
          backend_detail: u.detail,
        };
        run.record(stepRow(s, `${tag}-quiet`, w, u.backend, u.quiet, up));
        run.record(stepRow(s, `${tag}-overlap`, w, u.backend, u.overlap, up));
      });
    }
  }
}

/** Cases 4, 7 and 8: the optimizer alone, the frozen model's step, the GEMM on the model's shapes (none needs a data shape). */
async function runOtherCases(run: BenchRun, o: Options): Promise<void> {
  // ---- 4: gradient averaging + AdamW alone
  if (o.cases.has("optim")) {
    await run.guard("optim", async () => {
      log(
        `optim: fold, reduce over 2 slots and AdamW against a bandwidth probe, P = ${o.optimSizes.map((p) => `${(p / 1e6).toFixed(0)}M`).join(", ")}, 1 thread vs ${o.optimThreads} threads`,
      );
      for (const row of await runOptimCase({
        sizes: o.optimSizes,
        world: 2,
        threads: o.optimThreads,
        warmup: Math.max(1, o.warmup),
        steps: o.steps,
        log,
      }))
        run.record(row);
    });
  }

  // ---- 8: the built-in GEMM on the frozen model's shapes against the core's FMA peak, and OpenBLAS beside it
  if (o.cases.has("gemm")) {
    await run.guard("gemm", async () => {
      log(
        `gemm: the frozen model's products at seq ${o.gemmSeqs.join(", ")}, one thread, ${o.gemmRounds} rounds, against the FMA peak of the same run`,
      );
      run.gemm = gemmShapesBench({ seqs: o.gemmSeqs, rounds: o.gemmRounds, log });
      for (const x of run.gemm.rows) emit({ case: "gemm", ...x });
      for (const [isa, v] of Object.entries(run.gemm.peaks))
        run.record({
          case: `fma-peak-${isa}`,
          gflops: r(v, 1),
          what: "one core, 12 independent register-only FMA chains",
        } as unknown as BenchRow);
      for (const k of [...new Set(run.gemm.rows.map((x) => x.kernel))].filter((k) => k.startsWith("builtin"))) {
        const mine = run.gemm.rows.filter((x) => x.kernel === k && x.of_peak !== null);
        const linear = mine.filter((x) => x.seq === 1024 && !x.what.startsWith("attn"));
        run.record({
          case: `gemm-${k.replaceAll(" ", "-")}`,
          min_of_peak: Math.min(...mine.map((x) => x.of_peak!)),
          ...(linear.length ? { min_linear_1024_of_peak: Math.min(...linear.map((x) => x.of_peak!)) } : {}),
          median_of_peak: r(median(mine.map((x) => x.of_peak!)), 3),
          shapes: mine.length,
        } as unknown as BenchRow);
      }
    });
  }

  // ---- 9: the fused attention kernel at the frozen shape (with --attention-base, against an older revision's build)
  if (o.cases.has("attention")) {
    await run.guard("attention", async () => {
      log(
        `attention: fused${o.attentionBase ? ` vs ${o.attentionBase.rev}'s build` : ""} at the frozen shape (9/3 heads of 64), T ${o.gemmSeqs.join(", ")}, ${o.precisions.join(", ")}, one thread, ${Math.max(5, o.gemmRounds)} rounds`,
      );
      for (const x of attentionBench({
        seqs: o.gemmSeqs,
        rounds: Math.max(5, o.gemmRounds),
        precisions: o.precisions,
        base: o.attentionBase,
        log,
      }))
        run.record({ case: `attention-T${x.seq}-${x.precision}`, ...x } as unknown as BenchRow);
    });
  }

  // ---- 10: the frozen model on the webgpu engine (with --webgpu-base, against an older revision's build)
  if (o.cases.has("webgpu")) {
    await run.guard("webgpu", async () => {
      log(
        `webgpu: the frozen model, seq ${o.seq}, micro ${o.microBatch}, ${Math.max(1, o.steps)} warm call(s)${o.webgpuBase ? ` vs ${o.webgpuBase.rev}'s build` : ""}; the peak probe, the device profile and the frozen step's counts`,
      );
      const x = await webgpuBench({
        seq: o.seq,
        microBatch: o.microBatch,
        calls: Math.max(1, o.steps),
        base: o.webgpuBase,
        log,
      });
      run.record(x as unknown as BenchRow);
    });
  }

  // ---- 7: the frozen 106M model's forward+backward and its MFU, whatever --model says
  if (o.cases.has("frozen-step")) {
    for (const isa of o.isas)
      for (const precision of o.precisions)
        await run.guard(`frozen-step-${precision}${isa === "auto" ? "" : `-${isa}`}`, async () => {
          log(
            `frozen-step: the 106M model, seq ${o.seq}, micro ${o.microBatch}, grad-ckpt ${o.gradCkpt}, ${precision}, --isa ${isa}, ${Math.max(3, o.steps)} warm calls`,
          );
          const { kernel_profile: kp, ...j } = await frozenStepBench({
            seq: o.seq,
            microBatch: o.microBatch,
            gradCkpt: o.gradCkpt,
            // the policy a rank of the widest world runs (one call stands for one rank's forward+backward)
            activationBudgetBytes: activationBudget({
              activationBudgetGb: o.activationBudgetGb,
              world: Math.max(...o.worlds),
            }).bytes,
            calls: Math.max(3, o.steps),
            backend: o.backend,
            precision,
            isa,
            log,
          });
          run.profiled.push({ rows: kp, stepMs: j.profile_step_ms, engine: String(j.kernels_name), precision });
          const name = `frozen-step${isa === "auto" ? "" : `-${isa}`}${precision === "bf16" ? "-bf16" : ""}`;
          run.record({ ...j, case: name } as unknown as BenchRow);
        });
  }
}

/** Case 6: the PyTorch anchor at this shape (fp32 at 1 and all threads; with --precisions bf16 also under
 *  torch.autocast("cpu", bfloat16) at all threads). */
async function runTorchCases(run: BenchRun, o: Options, s: Shape): Promise<void> {
  const tv = torchVersion();
  if (!tv) {
    run.notes.push("torch: not installed (/usr/bin/python3 -c 'import torch' fails); no PyTorch column");
    log("torch: not installed");
    return;
  }
  const variants: Array<{ th: number; autocast: boolean }> = o.torchThreads.map((th) => ({ th, autocast: false }));
  if (o.precisions.includes("bf16")) variants.push({ th: cores, autocast: true });
  for (const { th, autocast } of variants)
    await run.guard(`torch-${th}${autocast ? "-autocast" : ""}`, async () => {
      log(
        `torch ${tv}: bench/anchors/torch_llama.py, ${th} thread(s)${autocast ? ", autocast bf16" : ""}, seq ${s.seqLen}`,
      );
      run.record(
        await runTorch(s, { steps: Math.max(o.steps, 3), threads: th, timeoutMs: 12 * 60_000, log, autocast }),
      );
    });
}

/** One core's register-only FMA peak for the instructions the built-in GEMM's steps use, measured now (best of 3):
 *  fp32 on the widest kernel, bf16 on AMX TDPBF16PS, else VDPBF16PS, else the fp32 kernel that emulates them; with a
 *  kernel forced (`isa`, as --isa forces it), that kernel's (avx2, avx512: fp32 and the bf16 emulation on its FMA).
 *  Empty on OpenBLAS-only runs. */
function stepPeaks(
  names: string[],
  isa: IsaChoice = "auto",
): {
  fp32?: { isa: string; gflops: number };
  bf16?: { isa: string; gflops: number };
} {
  const best = supportedIsas()[0];
  if (!best) return {};
  const peak = (isa: Parameters<typeof fmaPeak>[0]) => Math.max(...[0, 1, 2].map(() => fmaPeak(isa, 500_000) ?? 0));
  const fp32 = isa === "avx2" || isa === "portable" ? { isa, gflops: peak(isa) } : { isa: best, gflops: peak(best) };
  if (!names.some((n) => n.endsWith("-bf16"))) return { fp32 };
  if (isa !== "auto") return { fp32, bf16: isa === "amx" || isa === "avx512bf16" ? { isa, gflops: peak(isa) } : fp32 };
  const g = builtinGemmBf16();
  return {
    fp32,
    bf16: g?.hw
      ? { isa: "amx", gflops: peak("amx") }
      : g?.dp
        ? { isa: "avx512bf16", gflops: peak("avx512bf16") }
        : fp32,
  };
}

/** A training row's MFU against one core's peak for its instructions (per rank: model FLOPs x tok/s / world). */
function peakMfu(s: Shape, row: BenchRow, peak: { isa: string; gflops: number } | undefined): Record<string, unknown> {
  if (!peak?.gflops || typeof row.tok_per_s !== "number" || row.backend !== "native") return {};
  const flopsPerTok = 6 * s.params + 12 * s.model.numLayers * s.seqLen * s.model.hiddenSize;
  const perRank = (flopsPerTok * row.tok_per_s) / Math.max(1, row.world ?? 1);
  return {
    peak_isa: peak.isa,
    peak_gflops: r(peak.gflops, 1),
    mfu_of_peak: r(perRank / (peak.gflops * 1e9), 3),
    mfu_of_peak_note:
      "per rank: model FLOPs (6N + 12 L T d) x tok/s / world, over one core's register-only FMA peak for the instructions of this row's products, measured in this run",
  };
}

/** Adds the training rows' MFU where the frozen-step case measured the matMul rate. */
function addTrainingMfu(rows: BenchRow[]): void {
  // ---- MFU of the training steps too, where this run measured the matMul rate (frozen-step case):
  // per rank, (model FLOPs per token x tok/s / world) / matMul rate, for rows of the same model and seq; a bf16
  // row (the trainer's -bf16 rows, PyTorch's autocast) against the bf16 products' rate (frozen-step-bf16)
  for (const fz of rows.filter((x) => x.case === "frozen-step" || x.case === "frozen-step-bf16")) {
    if (typeof fz.matmul_gflops !== "number" || typeof fz.model_flops_per_token !== "number") continue;
    const bf16 = fz.case === "frozen-step-bf16";
    for (const x of rows) {
      if (x === fz || x.params !== fz.params || x.seq_len !== fz.seq_len || typeof x.tok_per_s !== "number") continue;
      if (String(x.case).startsWith("frozen-step")) continue;
      if (/-bf16(@|$)/.test(String(x.case)) !== bf16) continue;
      const per = String(x.case).startsWith("torch") ? 1 : Math.max(1, x.world ?? 1);
      x.mfu = r((fz.model_flops_per_token * x.tok_per_s) / per / (fz.matmul_gflops * 1e9), 3);
      x.mfu_note = `per rank, against the single-thread matmul rate of the frozen-step case's engine (${String(fz.backend)}) in this run`;
      // the case's own line was printed before the rate was known: one more line with the training step's MFU
      emit({
        case: x.case,
        mfu: x.mfu,
        world: x.world,
        backend: x.backend,
        params: x.params,
        seq_len: x.seq_len,
        micro_batch: x.micro_batch,
        tok_per_s: x.tok_per_s,
        matmul_gflops: fz.matmul_gflops,
        model_flops_per_token: fz.model_flops_per_token,
        what: String(x.case).startsWith("torch")
          ? "PyTorch's training step (forward, backward, clip, AdamW)"
          : "the whole training step (forward, backward, reduce, AdamW, weight refresh) per rank",
      });
    }
  }
}

/** This run's bf16 peak over its fp32 one, as the world-w actor rows measured them (0 where either is missing). */
function bf16PeakRatio(rows: BenchRow[], w: number, sfx: string): number {
  const f = rows.find((x) => x.case === `actor-w${w}${sfx}`)?.peak_gflops,
    b = rows.find((x) => x.case === `actor-w${w}-bf16${sfx}`)?.peak_gflops;
  return typeof f === "number" && typeof b === "number" && f > 0 ? b / f : 0;
}

/** Every ratio the run can give, in the report's order: a new one is a row here. */
function ratioTable(rows: BenchRow[], o: Options): RatioSpec[] {
  const ge = (v: number) => ({ op: ">=", v }) as const,
    le = (v: number) => ({ op: "<=", v }) as const;
  const worlds = o.worlds.filter((w) => w > 1),
    wMax = Math.max(...o.worlds);
  // PyTorch's best in fp32 (its autocast bf16 rows are set against the trainer's bf16 rows below)
  const torchRows = rows.filter(
    (x) =>
      String(x.case).startsWith("torch-") && !String(x.case).includes("autocast") && typeof x.tok_per_s === "number",
  );
  const torchBest = torchRows.length
    ? torchRows.reduce((a, b) => (Number(b.tok_per_s) > Number(a.tok_per_s) ? b : a))
    : null;
  const t: RatioSpec[] = [];
  for (const w of worlds)
    t.push({
      name: `world${w}/world1 tok/s`,
      numerator: `actor-w${w}`,
      denominator: "actor-w1",
      target: w === 2 ? ge(1.85) : null,
    });
  // the targets against PyTorch on the same machine, same shape, same run
  if (torchBest)
    t.push({
      name: "world2_over_torch_best",
      numerator: "actor-w2",
      denominator: String(torchBest.case),
      denominatorNote: `(PyTorch's best of ${torchRows.map((x) => x.case).join(", ")})`,
      target: ge(2),
    });
  t.push({ name: "world1_over_torch_1thread", numerator: "actor-w1", denominator: "torch-1thread", target: ge(1) });
  for (const w of o.worlds)
    t.push({
      name: `world ${w}: built-in GEMM / OpenBLAS tok/s`,
      numerator: `actor-w${w}`,
      denominator: `actor-w${w}-openblas`,
      target: w === 2 ? ge(1.6) : null,
    });
  for (const sfx of o.seqs.length > 1 ? o.seqs.map((q) => `@${q}`) : [""])
    for (const w of o.worlds) {
      t.push({
        name: `world ${w}${sfx}: bf16 / fp32 products tok/s (built-in GEMM, P8)`,
        numerator: `actor-w${w}-bf16${sfx}`,
        denominator: `actor-w${w}${sfx}`,
        // 1.6 where this run's bf16 peak is at least 1.8x its FMA peak (AMD Zen 4, Zen 5); else at least fp32's
        target: w === 2 ? ge(bf16PeakRatio(rows, w, sfx) >= 1.8 ? 1.6 : 1) : null,
      });
      // a forced fp32 kernel (--isas): bf16 on its emulation, at least 0.85 of its fp32 (issue 61)
      for (const isa of o.isas.filter((x) => x === "avx2" || x === "avx512"))
        t.push({
          name: `world ${w}${sfx} --isa ${isa}: bf16 (emulated) / fp32 products tok/s (P8)`,
          numerator: `actor-w${w}-${isa}-bf16${sfx}`,
          denominator: `actor-w${w}-${isa}${sfx}`,
          target: w === 2 ? ge(0.85) : null,
        });
      for (const prec of ["", "-bf16"])
        for (const d of [`torch-${cores}threads${sfx}`, `torch-${cores}threads-autocast-bf16${sfx}`])
          t.push({
            name: `world ${w}${prec}${sfx} / ${d} tok/s`,
            numerator: `actor-w${w}${prec}${sfx}`,
            denominator: d,
            target: null,
          });
    }
  for (const w of worlds)
    t.push({
      name: `world${w}/world1 tok per CPU-second (parallel efficiency, load-insensitive)`,
      numerator: `actor-w${w}`,
      denominator: "actor-w1",
      target: null,
      field: "tok_per_cpu_s",
      note: "1.0 = world 2 spends no more CPU per token than world 1",
    });
  t.push(
    {
      name: "mpi: 2 processes x world 1 / one process x world 2, tok/s",
      numerator: "mpi-np2-w1",
      denominator: "mpi-ref-w2",
      target: ge(0.9),
    },
    {
      name: "actor/single-thread tok/s (world 1, same work)",
      numerator: "actor-w1",
      denominator: "single-thread",
      target: null,
    },
  );
  if (wMax > 1)
    t.push({
      name: `actor world ${wMax}/single-thread tok/s (speed-up)`,
      numerator: `actor-w${wMax}`,
      denominator: "single-thread",
      target: null,
    });
  t.push({
    name: "actor/framework-free tok/s (world 1, same work)",
    numerator: "actor-w1",
    denominator: "framework-free",
    target: ge(0.95),
  });
  if (wMax > 1)
    t.push({
      name: `actor world ${wMax}/framework-free tok/s (speed-up)`,
      numerator: `actor-w${wMax}`,
      denominator: "framework-free",
      target: null,
    });
  t.push({
    name: "single-thread (in-process)/framework-free (subprocess) tok/s",
    numerator: "single-thread",
    denominator: "framework-free",
    target: null,
    note: "same loop, two processes: a consistency check",
  });
  for (const w of o.uploadWorlds) {
    t.push({
      name: `upload stall world ${w} (step ms overlapping an upload / not)`,
      numerator: `upload-w${w}-overlap`,
      denominator: `upload-w${w}-quiet`,
      target: w === 2 ? le(1.05) : null,
      field: "step_ms_median",
      note: w === 2 ? "B3" : "control: a core is free for the uploader",
    });
    if (o.uploadNice)
      t.push({
        name: `upload stall world ${w}, uploader niced (experiment)`,
        numerator: `upload-w${w}-nice-overlap`,
        denominator: `upload-w${w}-nice-quiet`,
        target: null,
        field: "step_ms_median",
        note: "uploader thread at nice 19",
      });
  }
  for (const p of o.optimSizes)
    t.push({
      name: `optim ${(p / 1e6).toFixed(0)}M: 1 thread / ${o.optimThreads} threads step ms (speed-up)`,
      numerator: "optim-1thread",
      denominator: `optim-${o.optimThreads}threads`,
      target: null,
      field: "step_ms_median",
      params: p,
    });
  t.push(
    {
      name: "single-thread/torch 1 thread tok/s",
      numerator: "single-thread",
      denominator: "torch-1thread",
      target: null,
    },
    {
      name: "frozen-step (fwd+bwd)/torch 1 thread (fwd+bwd+clip+AdamW) tok/s",
      numerator: "frozen-step",
      denominator: "torch-1thread",
      target: null,
      note: "same shape only with --model frozen",
    },
  );
  if (cores > 1)
    t.push({
      name: `actor world ${wMax}/torch ${cores} threads tok/s`,
      numerator: `actor-w${wMax}`,
      denominator: `torch-${cores}threads`,
      target: null,
    });
  return t;
}

/** The figures that are one row's own ratio, against a target: each row's MFU, each GEMM kernel's worst fraction of
 *  its FMA peak. */
function rowFigures(rows: BenchRow[]): Ratio[] {
  const out: Ratio[] = [];
  // world 2's MFU against the two cores' limit for the instructions its products ran on (fp32: FMA; bf16: VDPBF16PS
  // or AMX), each peak probed in the same run
  // (--isas: the forced kernels' rows too; fp32 on AVX2 at 0.80 or more, issue 61)
  for (const x of rows)
    if (/^actor-w2(-avx2|-avx512)?(-bf16)?$/.test(String(x.case)) && typeof x.mfu_of_peak === "number") {
      const want = x.case === "actor-w2-avx2" ? 0.8 : 0.7;
      out.push({
        ratio: `mfu_of_peak ${x.case} (per rank, against one core's ${String(x.peak_isa)} peak)`,
        value: x.mfu_of_peak,
        target: `>= ${want}`,
        met: x.mfu_of_peak >= want,
        num: `${x.case} tok_per_s`,
        den: `${String(x.peak_isa)} peak GFLOP/s`,
      });
    }
  for (const x of rows)
    if (typeof x.mfu === "number")
      out.push({
        ratio: `mfu ${x.case} (model FLOPs x tok/s per rank / matMul rate)`,
        value: x.mfu,
        target: x.case === "actor-w1" ? ">= 0.6" : null,
        met: x.case === "actor-w1" ? x.mfu >= 0.6 : null,
        num: `${x.case} tok_per_s`,
        den: "frozen-step matmul_gflops",
      });
  // bf16 on VDPBF16PS: every linear product at seq 1024 at 0.80 or more of its own peak
  const dp = rows.find((x) => x.case === "gemm-builtin-avx512bf16");
  if (dp && typeof dp.min_linear_1024_of_peak === "number")
    out.push({
      ratio: "gemm builtin-avx512bf16: lowest fraction of the VDPBF16PS peak over the linear products at seq 1024",
      value: dp.min_linear_1024_of_peak,
      target: ">= 0.8",
      met: dp.min_linear_1024_of_peak >= 0.8,
      num: "gemm builtin-avx512bf16 GFLOP/s (worst linear shape)",
      den: "fma-peak-avx512bf16 GFLOP/s",
    });
  // the AVX2 kernel in fp32 and its bf16 emulation: every linear product at seq 1024 at 0.80 or more of the AVX2
  // peak (issue 61)
  for (const k of ["builtin-avx2", "builtin-avx2-bf16"]) {
    const g = rows.find((x) => x.case === `gemm-${k}`);
    if (g && typeof g.min_linear_1024_of_peak === "number")
      out.push({
        ratio: `gemm ${k}: lowest fraction of the AVX2 FMA peak over the linear products at seq 1024`,
        value: g.min_linear_1024_of_peak,
        target: ">= 0.8",
        met: g.min_linear_1024_of_peak >= 0.8,
        num: `gemm ${k} GFLOP/s (worst linear shape)`,
        den: "fma-peak-avx2 GFLOP/s",
      });
  }
  for (const k of ["builtin-avx512", "builtin-avx2"]) {
    const g = rows.find((x) => x.case === `gemm-${k}`);
    if (g && typeof g.min_of_peak === "number")
      out.push({
        ratio: `gemm ${k}: lowest fraction of its FMA peak over the model's shapes`,
        value: g.min_of_peak,
        target: ">= 0.85",
        met: g.min_of_peak >= 0.85,
        num: `gemm ${k} GFLOP/s (worst shape)`,
        den: `fma-peak-${k.split("-")[1]} GFLOP/s`,
      });
  }
  return out;
}

/** The ratios of this run (each printed as it is found): the rows' own figures, then ratioTable's. */
function computeRatios(rows: BenchRow[], o: Options): Ratio[] {
  const ratios = [...rowFigures(rows)];
  for (const s of ratioTable(rows, o)) {
    const x = ratio(rows, s);
    if (x) ratios.push(x);
  }
  for (const x of ratios) emit(x);
  return ratios;
}

/** Notes that make the numbers readable: load, backends, tokens per step, data, torch rows, losses. */
function addReadingNotes(run: BenchRun, o: Options, shape: Shape | null): Set<unknown> {
  const rows = run.rows;
  for (const x of rows) {
    if (
      typeof x.cpu_util_median === "number" &&
      typeof x.world === "number" &&
      !String(x.case).startsWith("upload") &&
      x.cpu_util_median < 0.75 * x.world
    ) {
      run.notes.push(
        `${x.case}: the process kept only ${x.cpu_util_median} cores busy per step at world ${x.world} (median): other load on the machine held it back, so its tok/s measures the machine as much as the runtime`,
      );
    }
  }
  const backends = new Set(
    rows.filter((x) => x.backend && x.backend !== "js" && !String(x.case).startsWith("torch")).map((x) => x.backend),
  );
  if (backends.size > 1)
    run.notes.push(
      `cases ran on different tf backends: ${[...backends].join(", ")}; ratios across them compare backends, not runtimes`,
    );
  if (shape) {
    run.notes.push(
      `tokens per step = micro_batch × world × accum × seq = ${o.microBatch} × world × ${o.accum} × ${o.seq}: world 1 ${tokensPerStep(shape, 1)}, world 2 ${tokensPerStep(shape, 2)}; compare tok/s across worlds, not step ms`,
    );
    run.notes.push(
      `data: ${shape.dataKind === "demo" ? "the demo mix (ensureDemoMix, Brown + BPE 4096)" : "a synthetic mix (src/data/synthetic.ts) with the model's vocabulary"}, ${shape.nWindows} windows of ${o.seq}; seeds ${shape.seed}/${shape.dataSeed}; every case reads the same windows from step 0`,
    );
  }
  if (o.cases.has("torch") && rows.some((x) => String(x.case).startsWith("torch")))
    run.notes.push(
      "torch rows: one micro-batch (micro_batch sequences) per step, no accumulation, no loss scaling; same model shape and AdamW/clip settings",
    );
  const lossSingle = rows.find((x) => x.case === "single-thread")?.loss_last,
    lossActor = rows.find((x) => x.case === "actor-w1")?.loss_last;
  const lossFf = rows.find((x) => x.case === "framework-free")?.loss_last;
  if (lossSingle !== undefined && lossActor !== undefined) {
    const idx = o.warmup + o.steps * (o.interleave ? 1 + o.rewarm : 1) - 1;
    run.notes.push(
      `last timed loss (step index ${idx}): single-thread ${String(lossSingle)}, actor world 1 ${String(lossActor)}${lossFf !== undefined ? `; framework-free at step index ${o.steps}: ${String(lossFf)}${idx === o.steps ? "" : " (a different step: compare only single vs actor)"}` : ""} (same windows, init and LR: equal when the runtimes agree)`,
    );
  }
  run.notes.push(
    `load average (1 min) at the end: ${r(os.loadavg()[0], 2)} on ${cores} cores (a shared machine: other load inflates every case alike when interleaved)`,
  );
  return backends;
}

/** The shape block of latest.json / latest.md. */
function shapeInfoOf(o: Options, shape: Shape | null, backends: Set<unknown>): Record<string, unknown> {
  return shape
    ? {
        model: `${o.model}: ${MODELS[o.model].note}`,
        params: shape.params,
        layers: shape.model.numLayers,
        hidden: shape.model.hiddenSize,
        heads: `${shape.model.numHeads}/${shape.model.numKvHeads}`,
        ffn: shape.model.intermediateSize,
        vocab: shape.model.vocabSize,
        seq_len: o.seq,
        micro_batch: o.microBatch,
        accum: o.accum,
        grad_ckpt: o.gradCkpt,
        backend_requested: o.backend,
        backend_used: [...backends].join(", ") || "–",
        warmup_steps: o.warmup,
        timed_steps: o.steps,
        interleaved: o.interleave,
        rewarm_steps_per_turn: o.interleave ? o.rewarm : 0,
      }
    : { backend_requested: o.backend, timed_steps: o.steps };
}

async function main(): Promise<number> {
  const t0 = performance.now();
  const o = parseOptions(process.argv.slice(2));
  const mach = machine();
  const scratch = scratchDir();
  const run = new BenchRun();
  await waitForQuietMachine(mach, o);
  const codeStart = codeFingerprint();
  log(
    `bench: ${mach.cpu}, ${mach.cores} cores (${mach.cores_available_start} available to this process right now), node ${mach.node}, load ${mach.load_avg_1m_start}; model ${o.model} seq ${o.seq} micro ${o.microBatch} accum ${o.accum}, ${o.warmup} warm-up + ${o.steps} timed steps per case; cases ${[...o.cases].join(",")}`,
  );

  const stepCases =
    o.cases.has("single") ||
    o.cases.has("actor") ||
    o.cases.has("framework-free") ||
    o.cases.has("upload") ||
    o.cases.has("torch") ||
    o.cases.has("mpi");
  const maxWorld = Math.max(
    1,
    ...(o.cases.has("actor") ? o.worlds : []),
    ...(o.cases.has("upload") ? o.uploadWorlds : []),
    o.cases.has("mpi") ? 2 : 1,
  );
  // enough windows for the longest step counter: the upload case runs the most steps
  const windowsNeeded = (o.warmup + Math.max(8, 1 + o.rewarm) * o.steps + 8) * o.microBatch * maxWorld * o.accum;
  let shape: Shape | null = null;
  try {
    if (stepCases) {
      // each seq in turn (the first one's shape is the run's for the other cases); with several, names get @seq
      for (const [i, seq] of o.seqs.entries()) {
        const os: Options = { ...o, seq };
        const sh = await buildShape({
          model: o.model,
          seqLen: seq,
          microBatch: o.microBatch,
          accum: o.accum,
          backend: o.backend,
          gradCkpt: o.gradCkpt,
          activationBudgetGb: o.activationBudgetGb,
          scratch,
          windowsNeeded,
          log,
        });
        if (i === 0) shape = sh;
        log(
          `shape: ${MODELS[o.model].note}; seq ${seq}; ${sh.params.toLocaleString("en-US")} params; ${sh.dataKind} mix ${sh.root} (${sh.nWindows} windows)`,
        );
        run.suffix = o.seqs.length > 1 ? `@${seq}` : "";
        // PyTorch first: its fp32 step at seq 1024 holds about 17 GB, and the step cases' buffers (about 6 GB a
        // runtime, shared with the main thread) are freed only when this process collects them, which nothing
        // forces before the next case: after an fp32 and a bf16 runtime, PyTorch's fp32 run met the OOM killer
        if (o.cases.has("torch")) await runTorchCases(run, os, sh);
        await runStepCases(run, os, sh, scratch);
        run.suffix = "";
      }
      if (shape) {
        await runUploadCases(run, o, shape, scratch);
        if (o.cases.has("mpi")) await runMpi(run, o, shape, scratch);
      }
    }
    await runOtherCases(run, o);
  } finally {
    fs.rmSync(scratch, { recursive: true, force: true });
  }
  const { rows, notes } = run;
  addTrainingMfu(rows);
  const ratios = computeRatios(rows, o);

  mach.cores_available_end = await coresAvailable(cores);
  const codeEnd = codeFingerprint();
  if (codeEnd !== codeStart)
    notes.unshift(
      `CODE CHANGED DURING THE RUN: dist/src was rebuilt (fingerprint ${codeStart} -> ${codeEnd}); workers and subprocesses started after the rebuild ran other code than this process. Rerun.`,
    );
  const avail = Math.min(mach.cores_available_start ?? cores, mach.cores_available_end);
  if (avail < 0.85 * cores) {
    notes.unshift(
      `SHARED MACHINE: a ${cores}-thread spin probe got only ${mach.cores_available_start} cores at the start and ${mach.cores_available_end} at the end of this run: world-scaling, upload-stall and 2-thread ratios measure the neighbours' load as much as the runtime. Rerun on a quiet machine before judging targets.`,
    );
  }
  const backends = addReadingNotes(run, o, shape);
  const wallS = (performance.now() - t0) / 1000;
  const shapeInfo = shapeInfoOf(o, shape, backends);
  const failed = run.failed;
  const command = `node dist/bench/bench.js ${process.argv.slice(2).join(" ")}`.trim();
  fs.mkdirSync(o.out, { recursive: true });
  const result = {
    bench: "tstrain-bench/1",
    command,
    machine: mach,
    code_fingerprint: { start: codeStart, end: codeEnd },
    shape: shapeInfo,
    rows,
    ratios,
    notes,
    wall_s: r(wallS),
    failed_cases: failed,
  };
  fs.writeFileSync(path.join(o.out, "latest.json"), `${JSON.stringify(result, null, 1)}\n`);
  const md = markdown({ machine: mach, shape: shapeInfo, rows, ratios, notes, wallS, command });
  fs.writeFileSync(path.join(o.out, "latest.md"), md);
  if (run.gemm) {
    const mdGemm = gemmTableMarkdown(
      run.gemm.rows,
      run.gemm.peaks,
      `${mach.cpu}, ${mach.cores} cores, load ${mach.load_avg_1m_start} at the start, ${mach.date}`,
    );
    fs.writeFileSync(path.join(o.out, "gemm-shapes.md"), mdGemm);
    fs.writeFileSync(
      path.join(o.out, "gemm-shapes.json"),
      `${JSON.stringify({ command, machine: mach, peaks: run.gemm.peaks, rows: run.gemm.rows }, null, 1)}\n`,
    );
  }
  if (run.profiled.length) {
    const when = `Machine: ${mach.cpu}, ${mach.cores} cores, load ${mach.load_avg_1m_start} at the start; command: \`${command}\`; ${mach.date}.`;
    fs.writeFileSync(
      path.join(o.out, "kernels-frozen-step.md"),
      `${run.profiled
        .map((p) =>
          kernelTableMarkdown(
            `Per-kernel share of one frozen training step (forward + backward), ${p.precision}, ${p.engine}`,
            p.rows,
            p.stepMs,
          ),
        )
        .join("\n")}\n${when}\n`,
    );
    fs.writeFileSync(
      path.join(o.out, "kernels-frozen-step.json"),
      `${JSON.stringify(
        {
          command,
          machine: mach,
          profiles: run.profiled.map((p) => ({
            precision: p.precision,
            engine: p.engine,
            step_ms: p.stepMs,
            summary: profileSummary(p.rows, p.stepMs),
            rows: p.rows,
          })),
        },
        null,
        1,
      )}\n`,
    );
  }
  process.stdout.write(`\n${md}\n`);
  log(
    `wrote ${path.join(o.out, "latest.json")} and latest.md in ${wallS.toFixed(0)} s${failed ? `; ${failed} case(s) FAILED` : ""}`,
  );
  return failed ? 1 : 0;
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    process.stderr.write(`bench failed: ${(e as Error)?.stack ?? String(e)}\n`);
    process.exitCode = 1;
  },
);
