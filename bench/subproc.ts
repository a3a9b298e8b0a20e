/**
 * Cases run in a child process: the framework-free loop of `node dist/main.js --benchmark N` (G8,
 * the user-facing path; its BENCH_JSON line is parsed) and the optional PyTorch anchor
 * (bench/anchors/torch_llama.py under /usr/bin/python3, when `import torch` works there).
 */
import { spawn, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { MODELS, tokensPerStep, type Shape } from "./shape";
import type { BenchRow } from "./steps";
import { r } from "./stats";

/** Repo root at run time: this file runs as dist/bench/subproc.js. */
export const REPO_ROOT = path.resolve(__dirname, "..", "..");

function run(
  cmd: string,
  args: string[],
  o: { cwd: string; timeoutMs: number; log: (s: string) => void; echo: RegExp | null; env?: NodeJS.ProcessEnv },
): Promise<{ code: number | null; out: string; err: string; ms: number }> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const ch = spawn(cmd, args, { cwd: o.cwd, stdio: ["ignore", "pipe", "pipe"], env: o.env ?? process.env });
    let out = "",
      err = "";
    ch.stdout.on("data", (b: Buffer) => {
      const s = b.toString();
      out += s;
      if (o.echo) for (const line of s.split("\n")) if (line && o.echo.test(line)) o.log(`  | ${line}`);
    });
    ch.stderr.on("data", (b: Buffer) => {
      err += b.toString();
    });
    const timer = setTimeout(() => {
      ch.kill("SIGKILL");
    }, o.timeoutMs);
    ch.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    ch.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, out, err, ms: performance.now() - t0 });
    });
  });
}

function lastJsonLine(out: string, prefix: string | null): Record<string, unknown> | null {
  const lines = out
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .reverse();
  for (const l of lines) {
    const body = prefix ? (l.startsWith(prefix) ? l.slice(prefix.length).trim() : null) : l;
    if (!body?.startsWith("{")) continue;
    try {
      return JSON.parse(body) as Record<string, unknown>;
    } catch {
      /* not JSON */
    }
  }
  return null;
}

/** The argv that makes `dist/main.js --benchmark` build this bench's model on this bench's data. */
export function benchmarkArgv(s: Shape, steps: number, outDir: string): string[] {
  const spec = MODELS[s.modelName];
  const a = [
    "--benchmark",
    String(steps),
    "--world",
    "1",
    "--seq-len",
    String(s.seqLen),
    "--micro-batch",
    String(s.microBatch),
    "--accum",
    String(s.accum),
    "--backend",
    s.backend,
    "--max-steps",
    String(steps + 2),
    "--out",
    outDir,
    "--hub-repo",
    "",
    "--seed",
    String(s.seed),
    "--data-seed",
    String(s.dataSeed),
    s.gradCkpt ? "--grad-ckpt" : "--no-grad-ckpt",
    // the same optimizer settings as the in-process cases: peak LR, and no decay inside the horizon
    // (warmup = max(100, ...) = 100 on both sides), so the losses at equal step indices agree
    "--lr",
    String(s.lr),
    "--decay-frac",
    "1",
  ];
  // The bench's model: its vocabulary (--vocab-size) and, for the variant shapes, layers and width.
  a.push("--root", s.root, "--val-tokens", String(s.seqLen));
  if (s.modelName !== "frozen")
    a.push("--vocab-size", String(s.model.vocabSize), "--layers", String(spec.layers), "--hidden", String(spec.hidden));
  return a;
}

/** Case 3: `node dist/main.js --benchmark N` as a subprocess, same shape, world share 1. */
export async function runFrameworkFree(
  s: Shape,
  o: { steps: number; scratch: string; timeoutMs: number; log: (s: string) => void },
): Promise<BenchRow> {
  const main = path.join(REPO_ROOT, "dist", "main.js");
  if (!fs.existsSync(main)) throw new Error(`${main} is missing: run npm run build`);
  const outDir = fs.mkdtempSync(path.join(o.scratch, "ff-"));
  const argv = benchmarkArgv(s, o.steps, outDir);
  o.log(`  $ node dist/main.js ${argv.map((x) => (x === "" ? "''" : x)).join(" ")}`);
  const res = await run(process.execPath, [main, ...argv], {
    cwd: REPO_ROOT,
    timeoutMs: o.timeoutMs,
    log: o.log,
    echo: /^(benchmark mode|precision|BENCH_JSON|refused|error)/,
  });
  const j = lastJsonLine(res.out, "BENCH_JSON");
  if (res.code !== 0 || !j) {
    throw new Error(
      `dist/main.js --benchmark exited ${res.code}${j ? "" : " without a BENCH_JSON line"}: ${(res.err || res.out).trim().split("\n").slice(-5).join(" | ")}`,
    );
  }
  const med = Number(j.step_ms_median);
  const tps = tokensPerStep(s, 1);
  if (Number(j.params) !== s.params)
    throw new Error(`--benchmark built ${String(j.params)} params, the bench shape has ${s.params}: the shapes differ`);
  return {
    case: "framework-free",
    backend: String(j.backend),
    world: 1,
    params: Number(j.params),
    seq_len: Number(j.seq_len),
    micro_batch: Number(j.micro_batch),
    accum: Number(j.accum),
    tokens_per_step: tps,
    step_ms_median: r(med),
    tok_per_s: r((tps / med) * 1000),
    steps_timed: Number(j.benchmark_steps),
    loss_last: r(Number(j.loss), 4),
    model: s.modelName,
    grad_ckpt: Boolean(j.grad_ckpt),
    subprocess_wall_s: r(res.ms / 1000),
    source: "dist/main.js --benchmark (G8)",
    reported_tok_per_s: j.tok_per_s,
  };
}

/** "/usr/bin/python3 -c 'import torch'" works: the version; else null. */
export function torchVersion(python = "/usr/bin/python3"): string | null {
  if (!fs.existsSync(python)) return null;
  const p = spawnSync(python, ["-c", "import torch; print(torch.__version__)"], { encoding: "utf8", timeout: 60_000 });
  return p.status === 0 ? p.stdout.trim() : null;
}

/** The PyTorch anchor at the same model shape; one micro-batch (micro_batch sequences) per step, no accumulation. */
export async function runTorch(
  s: Shape,
  o: { steps: number; threads: number; timeoutMs: number; log: (s: string) => void; autocast?: boolean },
): Promise<BenchRow> {
  const script = path.join(REPO_ROOT, "bench", "anchors", "torch_llama.py");
  const c = s.model;
  const argv = [
    script,
    "--layers",
    String(c.numLayers),
    "--hidden",
    String(c.hiddenSize),
    "--heads",
    String(c.numHeads),
    "--kv",
    String(c.numKvHeads),
    "--ffn",
    String(c.intermediateSize),
    "--vocab",
    String(c.vocabSize),
    "--seq",
    String(s.seqLen),
    "--micro",
    String(s.microBatch),
    "--steps",
    String(o.steps),
    "--threads",
    String(o.threads),
    ...(o.autocast ? ["--autocast-bf16"] : []),
  ];
  // Some machines set OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) for old OpenBLAS builds; they pin a
  // slower kernel. The anchor is a speed reference, so it runs with both unset, in its own process only.
  const env = { ...process.env };
  delete env.OPENBLAS_CORETYPE;
  delete env.OPENBLAS_L2_SIZE;
  const res = await run("/usr/bin/python3", argv, {
    cwd: REPO_ROOT,
    timeoutMs: o.timeoutMs,
    log: o.log,
    echo: null,
    env,
  });
  const j = lastJsonLine(res.out, null);
  if (res.code !== 0 || !j)
    throw new Error(
      `torch_llama.py exited ${res.code}: ${(res.err || res.out).trim().split("\n").slice(-3).join(" | ")}`,
    );
  const med = Number(j.step_s_median) * 1000;
  const tps = s.microBatch * s.seqLen;
  if (Number(j.params) !== s.params)
    o.log(`  note: torch counted ${String(j.params)} params, the bench shape has ${s.params}`);
  return {
    case: `torch-${o.threads}thread${o.threads > 1 ? "s" : ""}${o.autocast ? "-autocast-bf16" : ""}`,
    backend: String(j.impl),
    world: null,
    params: Number(j.params),
    seq_len: s.seqLen,
    micro_batch: s.microBatch,
    accum: 1,
    tokens_per_step: tps,
    step_ms_median: r(med),
    tok_per_s: r((tps / med) * 1000),
    steps_timed: o.steps,
    threads: o.threads,
    loss_last: j.loss,
    model: s.modelName,
    source: "bench/anchors/torch_llama.py",
  };
}

/** The argv of a short training run (`dist/main.js`, not --benchmark) on this bench's model and data: a log line per step. */
function trainArgv(s: Shape, steps: number, outDir: string): string[] {
  const a = benchmarkArgv(s, steps, outDir);
  const i = a.indexOf("--benchmark");
  a.splice(i, 2); // a real session: the actors, the step loop, metrics.jsonl
  const j = a.indexOf("--max-steps");
  a[j + 1] = String(steps);
  a.splice(a.indexOf("--world"), 2);
  return [...a, "--log-every", "1", "--push-every-steps", String(steps), "--no-sample"];
}

/** Median step ms, tok/s and allreduce ms of one training run's metrics.jsonl, from step `from` on. */
function stepFigures(
  outDir: string,
  tokensPerStep: number,
  from: number,
): { stepMs: number; allreduceMs: number | null; n: number } {
  const es = fs
    .readFileSync(path.join(outDir, "metrics.jsonl"), "utf8")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as { step: number; tok_per_s: number; allreduce_ms?: number })
    .filter((e) => e.step > from && e.tok_per_s > 0);
  if (!es.length) throw new Error(`${outDir}/metrics.jsonl has no step after ${from}`);
  const med = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  const ar = es.filter((e) => typeof e.allreduce_ms === "number").map((e) => e.allreduce_ms!);
  return {
    stepMs: med(es.map((e) => (tokensPerStep / e.tok_per_s) * 1000)),
    allreduceMs: ar.length ? med(ar) : null,
    n: es.length,
  };
}

/**
 * Case `mpi`: the same training steps as `mpirun -np 2 ... --dist mpi --world 1` (two processes, the
 * gradient combined over MPI every step) and as one process at `--world 2`, one after the other; their tok/s, and
 * the per-step allreduce time and its share of the step. Needs Open MPI (mpirun, libmpi.so.40).
 */
export async function runMpiCase(
  s: Shape,
  o: { steps: number; warmup: number; scratch: string; timeoutMs: number; log: (s: string) => void },
): Promise<BenchRow[]> {
  const main = path.join(REPO_ROOT, "dist", "main.js");
  const total = o.warmup + o.steps;
  const tps = tokensPerStep(s, 2);
  const rows: BenchRow[] = [];
  const variants: Array<{ name: string; cmd: string; pre: string[]; args: string[] }> = [
    { name: "mpi-ref-w2", cmd: process.execPath, pre: [main], args: ["--world", "2"] },
    {
      name: "mpi-np2-w1",
      cmd: "mpirun",
      pre: [
        ...(process.getuid?.() === 0 ? ["--allow-run-as-root"] : []),
        "--oversubscribe",
        "-np",
        "2",
        process.execPath,
        main,
      ],
      args: ["--dist", "mpi", "--world", "1"],
    },
  ];
  for (const v of variants) {
    const outDir = fs.mkdtempSync(path.join(o.scratch, `${v.name}-`));
    const argv = [...v.pre, ...trainArgv(s, total, outDir), ...v.args];
    o.log(`  $ ${v.cmd === process.execPath ? "node" : v.cmd} ${argv.map((x) => (x === "" ? "''" : x)).join(" ")}`);
    const res = await run(v.cmd, argv, {
      cwd: REPO_ROOT,
      timeoutMs: o.timeoutMs,
      log: o.log,
      echo: /^(MPI:|refused|error|TRAIN DONE)/,
    });
    if (res.code !== 0)
      throw new Error(`${v.name} exited ${res.code}: ${(res.err || res.out).trim().split("\n").slice(-5).join(" | ")}`);
    const f = stepFigures(outDir, tps, o.warmup);
    rows.push({
      case: v.name,
      backend: s.backend,
      world: 2,
      params: s.params,
      seq_len: s.seqLen,
      micro_batch: s.microBatch,
      accum: s.accum,
      tokens_per_step: tps,
      step_ms_median: r(f.stepMs),
      tok_per_s: r((tps / f.stepMs) * 1000),
      steps_timed: f.n,
      allreduce_ms_median: f.allreduceMs === null ? null : r(f.allreduceMs),
      allreduce_share: f.allreduceMs === null ? null : r(f.allreduceMs / f.stepMs, 4),
      model: s.modelName,
      subprocess_wall_s: r(res.ms / 1000),
      source: `${v.cmd === "mpirun" ? "mpirun -np 2 " : ""}dist/main.js ${v.args.join(" ")} (metrics.jsonl, --log-every 1)`,
    });
    fs.rmSync(outDir, { recursive: true, force: true });
  }
  return rows;
}
