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
 * This file is the run from start to end (the machine, the cases in order, the notes, the files written); its parts:
 * options.ts (the flags and usage), cases.ts (each case), ratios.ts (the figures derived from the rows: MFU, each
 * ratio and its target), bench-run.ts (the run's rows, notes and failures; log and emit).
 *
 *   node dist/bench/bench.js [--model small|demo|frozen] [--seq N] [--micro-batch N] [--accum N]
 *     [--steps N] [--warmup N] [--backend auto|native|wasm|cpu|webgpu] [--cases single,actor,framework-free,optim,upload,torch,frozen-step,gemm,attention,mpi,webgpu,webgpu-attention]
 *     [--worlds 1,2] [--upload-worlds 2,1] [--optim-sizes 1M,10M,50M,106M] [--sequential] [--no-grad-ckpt] [--out DIR]
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { buildShape, MODELS, scratchDir, tokensPerStep, type Shape } from "./shape";
import { REPO_ROOT } from "./subproc";
import { markdown, type Machine } from "./report";
import { r } from "./stats";
import { coresAvailable } from "./probe";
import { kernelTableMarkdown, profileSummary } from "./kernel-profile";
import { gemmTableMarkdown } from "./gemm-shapes";
import { BenchRun, log } from "./bench-run";
import { cores, type Options, parseOptions } from "./options";
import { runMpi, runOtherCases, runStepCases, runTorchCases, runUploadCases } from "./cases";
import { addTrainingMfu, computeRatios } from "./ratios";

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

/** /proc/cpuinfo's first processor: vendor, family, model and the flags that choose kernels; undefined off Linux. */
function cpuId(): Machine["cpu_id"] {
  let text: string;
  try {
    text = fs.readFileSync("/proc/cpuinfo", "utf8");
  } catch {
    return undefined;
  }
  const field = (k: string) => new RegExp(`^${k}\\s*:\\s*(.*)$`, "m").exec(text)?.[1]?.trim() ?? "";
  const flags = field("flags").split(/\s+/);
  const kernelFlags = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"].filter((f) =>
    flags.includes(f),
  );
  return {
    vendor: field("vendor_id"),
    family: Number(field("cpu family")),
    model: Number(field("model")),
    flags: kernelFlags,
  };
}

/** The machine this run measures (the report's header). */
function machine(): Machine {
  const cpus = os.cpus();
  return {
    cpu: cpus[0]?.model.trim() ?? "unknown",
    cpu_id: cpuId(),
    cores: cpus.length,
    available_parallelism: cores,
    total_mem_gb: r(os.totalmem() / 1e9, 1)!,
    node: process.version,
    platform: `${os.platform()} ${os.arch()}`,
    date: new Date().toISOString(),
    load_avg_1m_start: r(os.loadavg()[0], 2)!,
  };
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
    `bench: ${mach.cpu}${mach.cpu_id ? ` (family ${mach.cpu_id.family} model ${mach.cpu_id.model}; ${mach.cpu_id.flags.join(" ")})` : ""}, ${mach.cores} cores (${mach.cores_available_start} available to this process right now), node ${mach.node}, load ${mach.load_avg_1m_start}; model ${o.model} seq ${o.seq} micro ${o.microBatch} accum ${o.accum}, ${o.warmup} warm-up + ${o.steps} timed steps per case; cases ${[...o.cases].join(",")}`,
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
