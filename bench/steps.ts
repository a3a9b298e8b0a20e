/**
 * Step-cost cases on one shape: the single-thread loop (SingleThreadTrainer in this thread), the actor
 * runtime (Coordinator + rank workers) at several world sizes, and the upload-stall case (actor
 * runtime while the uploader pushes checkpoints to an embedded LocalHub).
 *
 * Hygiene: every case gets its own warm-up steps (excluded); with `interleave` the cases take turns
 * one step at a time, so slow drifts of a shared, noisy machine hit every case alike; every actor
 * runtime is closed (workers terminated) in a finally.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { activationBudget, type GemmChoice, type IsaChoice, type Precision } from "../src/config";
import { SingleThreadTrainer } from "../src/single-thread";
import { Coordinator, type StepResult } from "../src/actors/coordinator";
import { fixedScaler, newScaler, type OptimizerPosition } from "../src/optim/optim";
import type { CheckpointOutcome, RankMemory } from "../src/actors/protocol";
import { initWeights } from "../src/model/init";
import { hfConfigJson } from "../src/model/llama-config";
import {
  CheckpointManager,
  checkpointDir,
  checkpointRepoPath,
  makePointer,
  trainerStateParts,
} from "../src/checkpoint";
import { makeCursor } from "../src/data/cursor";
import { LocalHub } from "../src/hub/server";
import { createHubClient } from "../src/hub/client";
import { permShaOf, tokensPerStep, type Shape } from "./shape";
import { median, r, summarize } from "./stats";

/** cpuMs: CPU time of this whole process (every thread: main + rank workers) during the step. */
export interface StepSample {
  ms: number;
  cpuMs: number;
  computeMs: number;
  reduceMs: number;
  updateMs: number;
  loss: number;
}

/** One case that can take a step: its label, its world and its backend as actually built. */
export interface Runner {
  name: string;
  world: number;
  backend: string;
  backendDetail: string;
  step(): Promise<StepSample>;
  /** Peak memory as the ranks report it (actor runtime only). */
  memory?(): Promise<Record<string, unknown>>;
  close(): Promise<void>;
}

/** Times one step: wall clock and the process's CPU time (user + system, all threads). */
async function timed(f: () => Promise<StepResult> | StepResult): Promise<StepSample> {
  const c0 = process.cpuUsage();
  const a = performance.now();
  const res = await f();
  const ms = performance.now() - a;
  const c = process.cpuUsage(c0);
  return {
    ms,
    cpuMs: (c.user + c.system) / 1000,
    computeMs: res.computeMs,
    reduceMs: res.reduceMs,
    updateMs: res.updateMs,
    loss: res.loss,
  };
}

/** Case 1: the whole step in this thread (no workers, no shared memory). */
export async function localRunner(s: Shape, world = 1): Promise<Runner> {
  const t = await SingleThreadTrainer.create({
    model: s.model,
    gradCkpt: s.gradCkpt,
    activationBudgetBytes: activationBudget({ activationBudgetGb: s.activationBudgetGb, world }).bytes,
    backend: s.backend,
    root: s.root,
    seqLen: s.seqLen,
    dataSeed: s.dataSeed,
    world,
    accum: s.accum,
    microBatch: s.microBatch,
    seed: s.seed,
  });
  const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
  let i = 0;
  return {
    name: "single-thread",
    world,
    backend: t.backend,
    backendDetail: `${t.backend} in the bench's main thread`,
    step: () => timed(() => t.step(i++, pos, s.lr, s.lrShape)),
    async close() {
      t.dispose();
    },
  };
}

async function spawnCoordinator(
  s: Shape,
  world: number,
  gemm: GemmChoice = "builtin",
  precision: Precision = "fp32",
  isa: IsaChoice = "auto",
): Promise<Coordinator> {
  const coord = Coordinator.create({
    world,
    model: s.model,
    gradCkpt: s.gradCkpt,
    activationBudgetBytes: activationBudget({ activationBudgetGb: s.activationBudgetGb, world }).bytes,
    backend: s.backend,
    native: { gemm, isa, precision },
    fault: null,
    data: { root: s.root, seqLen: s.seqLen, dataSeed: s.dataSeed, microBatch: s.microBatch, accum: s.accum, nVal: 0 },
  });
  initWeights(s.model, s.seed, coord.views.params);
  try {
    await coord.spawn();
  } catch (e) {
    await coord.close();
    throw e;
  }
  return coord;
}

/** Case 2: the actor runtime, `world` rank workers, the step timed from the coordinator's side; `isa` forces the
 *  built-in GEMM's kernel as the trainer's --isa does (the row's name gets it: actor-w2-avx2-bf16). */
export async function actorRunner(
  s: Shape,
  world: number,
  gemm: GemmChoice = "builtin",
  precision: Precision = "fp32",
  isa: IsaChoice = "auto",
): Promise<Runner> {
  const coord = await spawnCoordinator(s, world, gemm, precision, isa);
  const scaler = precision === "bf16" ? fixedScaler() : newScaler(); // P8: bf16 holds the scale at 1
  const pos: OptimizerPosition = { optSteps: 0, scaler, skipped: 0 };
  let i = 0;
  return {
    name: `actor-w${world}${gemm === "openblas" ? "-openblas" : ""}${isa === "auto" ? "" : `-${isa}`}${precision === "bf16" ? "-bf16" : ""}`,
    world,
    backend: coord.backendInfo.backend,
    backendDetail: coord.backendInfo.detail,
    step: () => timed(() => coord.step(i++, pos, s.lr, s.lrShape)),
    memory: async () => memoryFields(await coord.memory()),
    close: () => coord.close(),
  };
}

function memoryFields(mem: RankMemory[]): Record<string, unknown> {
  const mb = (n: number) => Math.round(n / 1e6);
  return {
    rank_heap_peak_mb: mem.map((m) => mb(m.heapPeakBytes)),
    rank_tf_peak_mb: mem.map((m) => mb(m.tfPeakBytes)),
    rank_wasm_heap_mb: mem.map((m) => mb(m.wasmHeapBytes)),
    process_rss_mb: mb(process.memoryUsage().rss),
  };
}

/**
 * Runs every runner `warmup + steps` timed-or-warm-up steps. interleave: round-robin, one timed step
 * per runner per round, rotating the order each round, and each turn opens with `rewarm` untimed
 * steps: a turn starts on caches the other runners' replicas just evicted, which would tax every
 * interleaved case (and not the --benchmark subprocess, which runs alone). Otherwise each runner runs
 * back to back. Returns the timed samples.
 */
export async function runSteps(
  runners: Runner[],
  warmup: number,
  steps: number,
  interleave: boolean,
  log: (s: string) => void,
  rewarm = 1,
): Promise<Map<Runner, StepSample[]>> {
  const out = new Map<Runner, StepSample[]>(runners.map((x) => [x, []]));
  const one = async (x: Runner, label: string, keep: boolean) => {
    const smp = await x.step();
    if (keep) out.get(x)!.push(smp);
    log(
      `  ${x.name.padEnd(14)} ${label}: ${smp.ms.toFixed(0)} ms, ${(smp.cpuMs / smp.ms).toFixed(2)} cores busy (compute ${smp.computeMs.toFixed(0)}, reduce ${smp.reduceMs.toFixed(0)}, update ${smp.updateMs.toFixed(0)}) loss ${smp.loss.toFixed(4)}`,
    );
  };
  if (interleave) {
    for (let k = 0; k < warmup + steps; k++) {
      for (let j = 0; j < runners.length; j++) {
        const x = runners[(j + k) % runners.length];
        if (k >= warmup)
          for (let w = 0; w < rewarm; w++) await one(x, `re-warm before timed step ${k - warmup + 1}/${steps}`, false);
        await one(x, k < warmup ? `warm-up ${k + 1}/${warmup}` : `timed step ${k - warmup + 1}/${steps}`, k >= warmup);
      }
    }
  } else {
    for (const x of runners)
      for (let k = 0; k < warmup + steps; k++)
        await one(x, k < warmup ? `warm-up ${k + 1}/${warmup}` : `timed step ${k - warmup + 1}/${steps}`, k >= warmup);
  }
  return out;
}

export interface BenchRow {
  case: string;
  backend: string;
  world: number | null;
  params: number;
  seq_len: number | null;
  micro_batch: number | null;
  step_ms_median: number | null;
  tok_per_s: number | null;
  [k: string]: unknown;
}

export function stepRow(
  s: Shape,
  caseName: string,
  world: number,
  backend: string,
  xs: StepSample[],
  extra: Record<string, unknown> = {},
): BenchRow {
  const ms = summarize(xs.map((x) => x.ms));
  const tps = tokensPerStep(s, world);
  return {
    case: caseName,
    backend,
    world,
    params: s.params,
    seq_len: s.seqLen,
    micro_batch: s.microBatch,
    accum: s.accum,
    tokens_per_step: tps,
    step_ms_median: r(ms.median),
    tok_per_s: r((tps / ms.median) * 1000),
    step_ms_p25: r(ms.p25),
    step_ms_p75: r(ms.p75),
    step_ms_min: r(ms.min),
    steps_timed: ms.n,
    compute_ms_median: r(median(xs.map((x) => x.computeMs))),
    reduce_ms_median: r(median(xs.map((x) => x.reduceMs))),
    update_ms_median: r(median(xs.map((x) => x.updateMs))),
    // how many cores the process kept busy during a step (world N ideally ~N; less = the machine was contended)
    cpu_util_median: r(median(xs.map((x) => x.cpuMs / x.ms)), 2),
    // tokens per CPU-second of this process: insensitive to how much wall time other load stole
    tok_per_cpu_s: r((tps * xs.length) / (xs.reduce((a, x) => a + x.cpuMs, 0) / 1000)),
    tok_per_s_best: r((tps / ms.min) * 1000),
    // what the step cost beyond the ranks' own compute/reduce/update: messages, barriers, scheduling
    overhead_ms_median: r(median(xs.map((x) => x.ms - x.computeMs - x.reduceMs - x.updateMs))),
    loss_last: xs.length ? r(xs[xs.length - 1].loss, 4) : null,
    model: s.modelName,
    grad_ckpt: s.gradCkpt,
    ...extra,
  };
}

// ------------------------------------------------------------------ case 5: upload stall

export interface UploadResult {
  quiet: StepSample[];
  overlap: StepSample[];
  stageMs: number[];
  uploads: { step: number; seconds: number; ok: boolean | null; pushVerifySeconds: number | null }[];
  backend: string;
  detail: string;
}

/** Linux: the thread ids of this process (/proc/self/task); empty elsewhere. */
function threadIds(): Set<number> {
  try {
    return new Set(fs.readdirSync("/proc/self/task").map(Number).filter(Number.isInteger));
  } catch {
    return new Set();
  }
}

/**
 * The actor runtime at `world` with the uploader pushing to an embedded LocalHub on loopback (the
 * same arrangement as run.ts with --hub-url embedded). Alternates: `quietRun` steps with no upload in
 * flight, then a checkpoint is staged at a step boundary and steps run until it settles (those steps
 * overlap the upload). Repeats until both kinds have `steps` samples. Staging (the params|m|v copy
 * into the staging buffer, in the coordinator's thread between two steps) is timed on its own.
 */
export async function runUploadCase(
  s: Shape,
  world: number,
  o: {
    warmup: number;
    steps: number;
    scratch: string;
    quietRun?: number;
    maxUploads?: number;
    niceUploader?: boolean;
    log: (s: string) => void;
  },
): Promise<UploadResult> {
  const dir = fs.mkdtempSync(path.join(o.scratch, `upload-w${world}-`));
  const hub = new LocalHub({ dir: path.join(dir, "hub") });
  const url = await hub.start();
  const repo = `bench/upload-stall-w${world}`;
  let coord: Coordinator | null = null;
  const inFlight: Promise<unknown>[] = [];
  try {
    await createHubClient({ hubUrl: url, repo, repoType: "dataset" }).ensureRepo();
    coord = await spawnCoordinator(s, world);
    const runDir = path.join(dir, "run");
    const before = threadIds();
    await coord.startUploader({
      hub: { hubUrl: url, repo, repoType: "dataset" },
      prune: false,
      minFreeGb: 0,
      keepLocal: 1,
      runDir,
    });
    if (o.niceUploader) {
      // Experiment (--upload-nice): lower the uploader worker's OS priority. On Linux setpriority()
      // takes a thread id, so the threads that appeared with the uploader are niced, nothing else.
      const fresh = [...threadIds()].filter((t) => !before.has(t));
      for (const tid of fresh) {
        try {
          os.setPriority(tid, 19);
        } catch (e) {
          o.log(`  could not renice thread ${tid}: ${(e as Error).message}`);
        }
      }
      o.log(`  reniced the uploader's ${fresh.length} new thread(s) to 19: ${fresh.join(", ")}`);
    }
    const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
    const seqsPerStep = s.microBatch * world * s.accum;
    const pSha = permShaOf(s);
    const res: UploadResult = {
      quiet: [],
      overlap: [],
      stageMs: [],
      uploads: [],
      backend: coord.backendInfo.backend,
      detail: coord.backendInfo.detail,
    };
    let step = 0;
    const take = (): Promise<StepSample> => timed(() => coord!.step(step++, pos, s.lr, s.lrShape));
    for (let k = 0; k < o.warmup; k++) {
      const x = await take();
      o.log(`  upload-w${world}   warm-up step: ${x.ms.toFixed(0)} ms`);
    }
    const quietRun = o.quietRun ?? 1;
    const maxUploads = o.maxUploads ?? 4 * o.steps;
    while ((res.quiet.length < o.steps || res.overlap.length < o.steps) && res.uploads.length < maxUploads) {
      for (let q = 0; q < quietRun && res.quiet.length < o.steps; q++) {
        const x = await take();
        res.quiet.push(x);
        o.log(`  upload-w${world}   quiet   step ${step}: ${x.ms.toFixed(0)} ms`);
      }
      if (res.overlap.length >= o.steps) continue;
      // ---- stage a checkpoint at this step boundary, as the session does (src/session/in-flight.ts, stage)
      const done = step;
      const pathInRepo = checkpointRepoPath(done);
      const manager = new CheckpointManager(trainerStateParts({ pos, lrShape: s.lrShape, seqsPerStep, history: [] }), {
        cursorAt: (step) =>
          makeCursor({
            step,
            seqsPerStep,
            seqLen: s.seqLen,
            seed: s.dataSeed,
            fingerprint: s.fingerprint,
            permSha: pSha,
          }),
        hfConfig: hfConfigJson(s.model),
        runConfig: { bench: "upload-stall", world, model: s.modelName },
      });
      const pointer = makePointer({
        pathInRepo,
        step: done,
        seqsPerStep,
        seqLen: s.seqLen,
        fingerprint: s.fingerprint,
        seed: s.dataSeed,
      });
      const t0 = performance.now();
      const job = coord.stageCheckpoint({
        step: done,
        dir: checkpointDir(runDir, done),
        docs: manager.documents(done),
        publish: { pathInRepo, pointer, loss: null },
      });
      res.stageMs.push(performance.now() - t0);
      let settled = false;
      let outcome: CheckpointOutcome | null = null;
      let failure: unknown = null;
      const tracked = job
        .then(
          (v) => {
            outcome = v;
          },
          (e) => {
            failure = e;
          },
        )
        .finally(() => {
          settled = true;
        });
      inFlight.push(tracked);
      const upT0 = performance.now();
      let upSec = Number.NaN;
      void tracked.then(() => {
        upSec = (performance.now() - upT0) / 1000;
      });
      // every step that starts while the upload is in flight overlaps it
      // (bounded: past 4x the wanted samples, wait for the upload without stepping, so the step
      // counter stays within the windows the mix was sized for)
      while (!settled && res.overlap.length < 4 * o.steps) {
        const x = await take();
        res.overlap.push(x);
        o.log(`  upload-w${world}   OVERLAP step ${step}: ${x.ms.toFixed(0)} ms`);
      }
      await tracked;
      if (failure)
        throw new Error(`checkpoint upload at step ${done} failed: ${(failure as Error).message ?? String(failure)}`);
      const oc = outcome as CheckpointOutcome | null;
      res.uploads.push({
        step: done,
        seconds: upSec,
        ok: oc?.published?.ok ?? null,
        pushVerifySeconds: oc?.published?.pushVerifySeconds ?? null,
      });
      if (oc?.published && !oc.published.ok) throw new Error(`checkpoint ${done} did not verify on the local Hub`);
    }
    return res;
  } finally {
    await Promise.allSettled(inFlight);
    if (coord) await coord.close();
    await hub.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
