/**
 * The bench harness's flags (bench/bench.ts): the cases, the options with their defaults, usage() and the flag table
 * (parsed with the trainer's parser, src/cli-args.ts).
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { BackendName } from "../src/model/backend";
import type { GemmChoice, IsaChoice, Precision } from "../src/config";
import { type FlagArgs, type FlagTable, parseFlags } from "../src/cli-args";
import type { ModelName } from "./shape";
import { parseCount } from "./optim";
import { REPO_ROOT } from "./subproc";
import { type BaseAttention, BUILD_BASE, loadBaseAttention } from "./attention";
import { WEBGPU_ENGINE_FILES } from "./webgpu-step";

export const ALL_CASES = [
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
  "webgpu-attention",
] as const;
export type CaseName = (typeof ALL_CASES)[number];
/** frozen-step (the MFU figure on the 106M model) takes minutes, so it runs only when asked. */
const DEFAULT_CASES: CaseName[] = ALL_CASES.filter(
  (c) => c !== "frozen-step" && c !== "mpi" && c !== "webgpu" && c !== "webgpu-attention",
);

export interface Options {
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
  /** webgpu and webgpu-attention cases: an older revision's build (`--webgpu-base DIR`) whose engine runs the same calls */
  webgpuBase?: { dir: string; rev: string };
}

export const cores = os.availableParallelism();

export function usage(): string {
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
    "  --gemm-seqs 256,1024        gemm, attention and webgpu-attention cases: the sequence lengths measured (default 256,1024)",
    "  --attention-base DIR        attention case: also time DIR's own build of an older revision (bench/native/build-base.sh 2babbe7 DIR)",
    "  --webgpu-base DIR           webgpu and webgpu-attention cases: also run DIR's build of an older revision (bench/native/build-base.sh REV DIR builds its TypeScript too)",
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
    if (!WEBGPU_ENGINE_FILES.some((f) => fs.existsSync(path.join(dir, "dist", "src", "model", f))))
      throw new Error(
        `--webgpu-base ${d}: no built webgpu engine there (dist/src/model/${WEBGPU_ENGINE_FILES.join(" or ")}): ${BUILD_BASE}`,
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

export function parseOptions(argv: string[]): Options {
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
