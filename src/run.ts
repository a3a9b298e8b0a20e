/**
 * A training session, top to bottom: `runSession` checks the launch (the refusals that need no plan: A9, K5, P1)
 * and, under --dist mpi, brings up the MPI job (runMpi); `runHere` is the session itself: the embedded Hub (when
 * asked), the run folder's checks and lock (O1, O2), the plan (session/setup.ts: data, model, resume point, and the
 * refusals they raise, before step 1), the actors, the step loop (session/loop.ts) and its end (session/finish.ts:
 * validation, export, RUN_JSON).
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { isUserError } from "./errors";
import {
  configLine,
  EMBEDDED_HUB,
  nativeChoice,
  validate,
  type IsaChoice,
  type Precision,
  type RunConfig,
  activationBudget,
} from "./config";
import { initWeights } from "./model/init";
import { activationPlan } from "./model/llama";
import { checkEngineRequest, webgpuRanks } from "./model/backend";
import { bf16Support } from "./model/engine/native";
import { BF16_EMULATION_SPEED, VDPBF16PS_RATES, type Vdpbf16Rate, vdpbf16Rate } from "./model/engine/bench-rates";
import { initMpi, launcherSize, launchPrefix, refuseLaunchWithoutDist } from "./mpi/world";
import { dropUnreadOutput, sigkillWarning, unblockStdout } from "./mpi/output";
import { DistLink } from "./session/dist";
import {
  RunComplete,
  RunStopped,
  EXIT_STOPPED,
  sameCommand,
  setLauncher,
  setPhase,
  stopRequested,
} from "./session/stop";
import { Coordinator } from "./actors/coordinator";
import { fixedScaler, newScaler, scalerModeOf, SCALER_DEFAULTS, type OptimizerPosition } from "./optim/optim";
import type { UploaderEvent } from "./actors/protocol";
import { faultFromEnv } from "./actors/injected-faults";
import type { LogEntry } from "./checkpoint";
import { checkpointManagerOf } from "./session/in-flight";
import {
  checkHubDirUsable,
  checkOutUsable,
  checkOutWritable,
  cleanOut,
  lockOut,
  prepareHubDir,
  removeIfEmpty,
  type OutLock,
} from "./outdir";
import { createReporter, type Reporter } from "./report";
import { LocalHub } from "./hub/server";
import { refuseMalformedToken } from "./hub/token";
import { runBenchmark } from "./single-thread";
import { setupSession, type Session } from "./session/setup";
import { trainLoop } from "./session/loop";
import type { RunResult } from "./session/finish";
import { recordSessionEnd, recordSessionStart } from "./session/record";

export type { RunResult } from "./session/finish";

/**
 * The whole session. Returns the RUN_JSON figures; throws UserError on refusals and RunComplete when
 * --resume auto finds nothing left to do. With --hub-url embedded (the demo's default) the local Hub
 * runs in this process on loopback for the session, its files in --hub-dir or <out>/hub (B6, L8).
 */
export async function runSession(
  cfg: RunConfig,
  // under mpirun a progress line per step would fill the pty mpirun stops reading when signalled (see unblockStdout)
  rep: Reporter = createReporter(cfg.out, process.stdout, cfg.dist === "mpi" || !process.stdout.isTTY),
  // G12: where each setting came from (parseArgs's origins), for the start line
  origins: ReadonlyMap<string, string> = new Map(),
): Promise<RunResult> {
  const job = launcherSize();
  if (job && cfg.dist !== "mpi") setLauncher(launchPrefix(job.size)); // A9's advice: the job, relaunched
  refuseLaunchWithoutDist(cfg.dist); // A9: one of H processes of an MPI job without --dist mpi would race the others
  // K5: a malformed HF_TOKEN fails every Hub request; refused now, with what works for this Hub
  if (cfg.hubRepo !== "")
    refuseMalformedToken({
      embeddedWithout: cfg.hubUrl === EMBEDDED_HUB ? sameCommand(["env", "-u", "HF_TOKEN"]) : undefined,
    });
  // an explicit engine that cannot load (--backend native, webgpu or tensorflow, --gemm openblas, --isa) is refused
  // before any work (P1, P8); so is --backend webgpu on a GPU that is not there (A13)
  const gpuNotes = checkEngineRequest(cfg.backend, nativeChoice(cfg), { world: cfg.world, choice: cfg.gpus });
  if (cfg.dist === "mpi") return runMpi(cfg, rep, origins, gpuNotes);
  rep.say(configLine(cfg, origins));
  const cpus = cpuWarning(cfg.world);
  if (cpus) rep.say(cpus);
  for (const n of gpuNotes) rep.say(n);
  const slow = bf16Warning(cfg.precision, cfg.isa);
  if (slow) rep.say(slow);
  return runHere(cfg, rep, null);
}

/** The exit code main gives `e` (0 done, 2 refused, 3 stopped by a signal, 1 failed): the leader ends the MPI job with it. */
function exitCodeOf(e: unknown): number {
  if (e instanceof RunStopped) return EXIT_STOPPED;
  if (e instanceof RunComplete) return 0;
  return isUserError(e) ? 2 : 1;
}

/**
 * --dist mpi (A9): MPI up (refused with the install command when no library loads), the agreement on the config
 * (A11), then process 0 runs the session and the others follow it (session/dist.ts). Every way out ends the job
 * on every process: the leader's end command, a round every process saw fail, or MPI_Abort mid-step.
 */
async function runMpi(
  cfg: RunConfig,
  rep: Reporter,
  origins: ReadonlyMap<string, string>,
  gpuNotes: string[],
): Promise<RunResult> {
  const mpi = initMpi();
  const link = new DistLink(mpi);
  const here = validate({ ...cfg, hosts: mpi.size });
  setLauncher(launchPrefix(mpi.size)); // the resume command relaunches the job, not one process
  if (mpi.rank === 0) unblockStdout(); // the others print little, and exit with process.exit (queued writes would be lost)
  const cpus = cpuWarning(here.world); // each host's own affinity: the followers say theirs on stderr
  if (mpi.rank !== 0)
    for (const n of cpus ? [cpus, ...gpuNotes] : gpuNotes)
      process.stderr.write(`process ${mpi.rank} of ${mpi.size}: ${n}\n`);
  try {
    await link.agreeOnConfig(here);
    if (!link.leader) {
      const code = await link.follow(here, here.backend);
      mpi.finalize();
      // mpirun does not report its processes' codes once it was signalled itself: each says its own
      if (code !== 0)
        process.stderr.write(
          `process ${mpi.rank} of ${mpi.size} exits ${code} (the code process 0 ended the job with)\n`,
        );
      process.exit(code);
    }
    rep.say(configLine(cfg, origins));
    rep.say(
      `MPI: ${mpi.size} processes x ${here.world} ranks = ${mpi.size * here.world} global ranks (${mpi.lib}); process 0 alone writes ${here.out} and talks to the Hub (A9)`,
    );
    const kill = sigkillWarning();
    if (kill) rep.say(kill);
    if (cpus) rep.say(cpus);
    const slow = bf16Warning(here.precision, here.isa);
    if (slow) rep.say(slow);
    for (const n of gpuNotes) rep.say(n);
    const r = await runHere(here, rep, link);
    await link.end(0);
    mpi.finalize();
    dropUnreadOutput();
    return r;
  } catch (e) {
    dropUnreadOutput();
    if (link.allKnow) {
      mpi.finalize();
      throw e;
    }
    if (link.inStep || !link.leader) {
      process.stderr.write(
        `error: process ${mpi.rank} of ${mpi.size}: ${e instanceof Error ? e.message : String(e)}; ending every process of the job\n`,
      );
      mpi.abort(1);
    }
    await link.end(exitCodeOf(e));
    mpi.finalize();
    throw e;
  }
}

/**
 * A1, A9: rank threads beyond the CPUs this process may run on (its affinity) share them, every step that much
 * longer, with nothing else to show for it. The usual cause is the launcher: Open MPI's mpirun binds each process
 * of a job of 2 or fewer to one core, and Slurm gives a task one CPU unless --cpus-per-task says more, so a host's
 * --world T rank threads would share one core. The warning names the count and the launch flag that frees them.
 */
export function cpuWarning(
  world: number,
  cpus: number = os.availableParallelism(),
  env: NodeJS.ProcessEnv = process.env,
): string | null {
  if (world <= cpus) return null;
  const mpi = env.OMPI_COMM_WORLD_SIZE !== undefined || env.SLURM_STEP_ID !== undefined;
  const fix = !mpi
    ? `give the process ${world} CPUs (taskset -c, a cgroup's cpuset), or run --world ${cpus}`
    : launchPrefix(1, env)[0] === "srun"
      ? `launch with srun --cpus-per-task ${world} ...`
      : `launch with mpirun --bind-to none ... (mpirun binds each process of a job of 2 or fewer to one core)`;
  return `WARNING --world ${world} starts ${world} rank threads, but this process may run on ${cpus} CPU${cpus === 1 ? "" : "s"} (its CPU affinity): they share ${cpus === 1 ? "it" : "them"}, each step about ${(world / cpus).toFixed(1)}x as long: ${fix} (A1, A9)`;
}

/**
 * P8: what --precision bf16 will cost here, said at start (a forced --isa is a choice made knowingly: nothing said).
 * - AMX: nothing to say.
 * - VDPBF16PS (AVX512_BF16, it passed its self-check): its rate against this core's fp32 FMA as the bench measured it
 *   on this CPU (model/engine/bench-rates.ts: VDPBF16PS_RATES; nothing is timed here), and what a step gains from
 *   it; where the bench has no figure for this CPU, the command that measures it. AMD Zen 5 runs it at twice the FMA's rate;
 *   some Intel cores at the FMA's own.
 * - Neither: the products are emulated on the fp32 kernel (AMX's order and bits, fused into its tile), at
 *   BF16_EMULATION_SPEED times fp32's tokens
 *   per second: a warning that names --precision fp32 as the faster choice, with why VDPBF16PS is not
 *   used where the CPU has it.
 * `k`: the CPU's bf16 kernels (bf16Support); `rate`: the bench's figure for this CPU (looked up when not given).
 */
export function bf16Warning(
  precision: Precision,
  isa: IsaChoice,
  k?: { hw: boolean; dp: boolean; check: string },
  rate?: Vdpbf16Rate | null,
): string | null {
  if (precision !== "bf16" || isa !== "auto") return null;
  const kk = k ?? bf16Support() ?? { hw: false, dp: false, check: "" };
  if (kk.hw) return null;
  if (kk.dp) {
    const what = "bf16 products on VDPBF16PS (AVX512_BF16; AMX's order, the same bits)";
    const rr = rate === undefined ? vdpbf16Rate() : rate;
    if (!rr)
      return `${what}: the bench has no figure for this CPU's rate (it has: ${VDPBF16PS_RATES.map((x) => x.cpu).join(", ")}); some cores run it at twice the fp32 FMA's rate, steps then about 1.6-1.9x as fast as --precision fp32, some at the FMA's own, steps then about as fast: \`node dist/bench/bench.js --cases gemm --gemm-seqs 256 --gemm-rounds 1\` measures it (fma-peak-avx512bf16 over fma-peak-avx512) (P8)`;
    const r = rr.ratio;
    const said = `${r.toFixed(1)}x this core's fp32 FMA rate, as the bench measured it on ${rr.cpu}`;
    return r >= 1.5
      ? `${what}: ${said}; expect steps about 1.6-1.9x as fast as --precision fp32 (P8)`
      : `${what}: ${said}: this core runs it at about the FMA's rate, so expect steps about as fast as --precision fp32 (P8)`;
  }
  const why = kk.check && kk.check !== "the CPU has no AVX512_BF16" ? ` (${kk.check})` : "";
  const s = BF16_EMULATION_SPEED;
  return `WARNING --precision bf16 on a CPU without AMX or a usable VDPBF16PS${why}: its bf16 products are emulated on fp32 FMAs (AMX's order, the same bits), and the bench trains at ${s}x the tokens per second of --precision fp32 that way (each step ${(1 / s).toFixed(1)}x as long): --precision fp32 is the faster choice here; keep bf16 to resume or check a bf16 run (P8)`;
}

/**
 * This process's session, top to bottom (process 0's under --dist mpi, `link` its tie to the other processes):
 * the embedded Hub when asked, the run folder's lock, the plan, the actors and the step loop. Each thing started
 * is stopped by its own `finally`, the last started first. A benchmark writes nothing in the run folder (no
 * checkpoint, no metrics), so it claims no lock.
 */
async function runHere(cfg: RunConfig, rep: Reporter, link: DistLink | null): Promise<RunResult> {
  const t0 = performance.now();
  // G7: a dry run writes nothing: --out checked without a write, and what the plan must build or fetch (a demo
  // mix, a checkpoint from the Hub, an embedded Hub with no folder yet) goes to a scratch folder removed at the end
  setPhase(cfg.dryRun || cfg.benchmark ? "saves-nothing" : "setup"); // what a signal does from here (O3)
  const scratch = cfg.dryRun ? fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-dry-run-")) : null;
  try {
    if (cfg.dryRun) checkOutUsable(cfg.out);
    else if (!cfg.benchmark) checkOutWritable(cfg.out); // O1 before anything is written there (the embedded Hub's <out>/hub)
    return await runWithHub(cfg, rep, link, t0, scratch);
  } finally {
    if (scratch) fs.rmSync(scratch, { recursive: true, force: true });
  }
}

/** The session with its embedded Hub, when asked (B6): started first, stopped last. */
async function runWithHub(
  cfg: RunConfig,
  rep: Reporter,
  link: DistLink | null,
  t0: number,
  scratch: string | null,
): Promise<RunResult> {
  // 1. The embedded local Hub (B6), its files under the run's own folder unless --hub-dir (L8); a dry run reads the
  // folder when there is one, else serves an empty Hub from its scratch folder
  const embedded = cfg.hubUrl === EMBEDDED_HUB && cfg.hubRepo !== "";
  const runHubDir = path.resolve(cfg.hubDir || path.join(cfg.out, "hub"));
  const hubDir = scratch && !fs.existsSync(runHubDir) ? path.join(scratch, "hub") : runHubDir;
  // O1: its folder checked before it starts; one this run made is removed at the end if nothing was stored in it
  if (embedded && scratch) checkHubDirUsable(runHubDir, "--hub-dir");
  const madeHubDir = embedded && !scratch ? prepareHubDir(hubDir, "--hub-dir") : null;
  const hub = embedded ? new LocalHub({ dir: hubDir }) : null;
  try {
    // the Hub's address this session; cfg (and so run_config.json) keeps "embedded", which a later run can reuse
    const hubUrl = hub ? await hub.start() : cfg.hubUrl;
    if (hub) rep.say(`embedded local Hub at ${hubUrl} storing ${hubDir} (B6)`);
    if (hub && cfg.demo && process.env.HF_ENDPOINT)
      rep.say("HF_ENDPOINT is set, and --demo keeps its embedded Hub (B6): pass --hub-url URL to send the demo there");
    // 2. The run folder, claimed and cleaned before anything else happens there (O1, O2, O4); not by a dry run or
    // a benchmark, which write nothing there
    const lock: OutLock | null = cfg.benchmark || cfg.dryRun ? null : lockOut(cfg.out, rep.say);
    try {
      if (lock) for (const l of cleanOut(cfg.out)) rep.say(l);
      // 3. The plan, and its refusals (data, model, resume point, Hub), before step 1.
      const s: Session = { ...(await setupSession(cfg, rep, hubUrl, scratch)), dist: link };
      if (cfg.dryRun) return dryRun(s, rep);
      if (cfg.benchmark) return { runJson: await runBenchmark(s, cfg.benchmark, rep), exported: null };
      recordSessionStart(s);
      // 4. The coordinator and its ranks, then the step loop and the session's end.
      const coord = coordinatorFor(s, link);
      try {
        const { pos, history, events } = await startTraining(s, coord, rep, hubUrl, link, t0);
        return await trainLoop(s, coord, pos, history, rep, t0, events);
      } finally {
        await coord.close();
      }
    } finally {
      lock?.release();
    }
  } finally {
    await hub?.stop();
    removeIfEmpty(madeHubDir);
  }
}

/** The coordinator of this session's ranks (A1, A2): the plan's model and data, the engine the flags chose. */
function coordinatorFor(s: Session, link: DistLink | null): Coordinator {
  const { cfg } = s;
  return Coordinator.create({
    world: cfg.world,
    model: s.model.config,
    gradCkpt: cfg.gradCkpt,
    activationBudgetBytes: activationBudget(cfg).bytes,
    backend: cfg.backend,
    native: nativeChoice(cfg),
    gpus: webgpuRanks(cfg.backend, cfg.world, cfg.gpus),
    fold: cfg.webgpuFold,
    fault: faultFromEnv(),
    mpi: link?.mpi,
    stopAsked: () => stopRequested() !== null,
    data: {
      root: s.data.root,
      seqLen: cfg.seqLen,
      dataSeed: cfg.dataSeed,
      microBatch: cfg.microBatch,
      accum: cfg.accum,
      nVal: s.data.nVal,
    },
  });
}

/**
 * The session's start, after its start record (B5): the starting state (a resumed checkpoint's, K2), the other MPI
 * processes' copy of it (A9), the ranks and the uploader. Any failure here ends the session's record with an end
 * line ("refused" or "failed"), as the loop's own ends do, before it propagates.
 */
async function startTraining(
  s: Session,
  coord: Coordinator,
  rep: Reporter,
  hubUrl: string,
  link: DistLink | null,
  t0: number,
): Promise<{ pos: OptimizerPosition; history: LogEntry[]; events: UploaderEvent[] }> {
  try {
    const { pos, history } = startingPoint(s, coord);
    // A9: the followers get the plan's figures and this starting state (resumed or initialised) from process 0.
    await link?.start(
      {
        model: s.model.config,
        root: s.data.root,
        fingerprint: s.data.fingerprint,
        lrShape: s.plan.lrShape,
        startStep: s.start.startStep,
        pos,
      },
      coord,
    );
    const events = await startActors(s, coord, pos, rep, hubUrl);
    return { pos, history, events };
  } catch (e) {
    // the session's record ends however its start failed: refused (exit 2), or failed (exit 1)
    recordSessionEnd(s, {
      ended: isUserError(e) ? "refused" : "failed",
      finalStep: s.start.startStep,
      seconds: (performance.now() - t0) / 1000,
      outcomes: [],
    });
    throw e;
  }
}

/** M6: the policy a rank runs for the run's (micro-batch, seq) under the activation budget, and its size. */
export function activationReport(s: Pick<Session, "cfg" | "model">): { line: string; json: Record<string, unknown> } {
  const { cfg } = s,
    budget = activationBudget(cfg),
    p = activationPlan(s.model.config, cfg.microBatch, cfg.seqLen, cfg.gradCkpt, budget.bytes),
    gib = (b: number) => `${(b / 2 ** 30).toFixed(2)} GiB`;
  const what =
    p.recompute === "none"
      ? "nothing recomputed (every activation kept)"
      : p.recompute === "kept"
        ? "norms and SwiGLU recomputed (matmul outputs kept)"
        : p.attnKept
          ? "whole blocks recomputed but attention"
          : "whole blocks recomputed";
  const of = budget.auto
    ? `half of this machine's ${gib(budget.totalBytes)} over its ${budget.ranksHere} rank${budget.ranksHere > 1 ? "s" : ""}`
    : "--activation-budget-gb";
  const over = p.fits
    ? ""
    : cfg.gradCkpt
      ? "; OVER the budget even so: lower --micro-batch or --seq-len, or raise --activation-budget-gb"
      : "; OVER the budget: drop --no-grad-ckpt to recompute within it";
  return {
    line: `activations: ${what}${cfg.gradCkpt ? "" : " by --no-grad-ckpt"}, ${gib(p.bytes)} a rank at micro-batch ${cfg.microBatch} x seq ${cfg.seqLen}; budget ${gib(budget.bytes)} (${of})${over}`,
    json: { recompute: p.recompute, attn_kept: p.attnKept, bytes: p.bytes, budget_bytes: budget.bytes, fits: p.fits },
  };
}

/** G7: everything built and checked, nothing trained; one JSON line. */
function dryRun(s: Session, rep: Reporter): RunResult {
  const { cfg, plan } = s;
  const act = activationReport(s);
  const j = {
    dry_run: true,
    train_samples: s.data.nWindows,
    val_samples: s.data.nVal,
    steps_planned: plan.stepsPlanned,
    start_step: s.start.startStep,
    ckpt_every: plan.ckptEvery,
    params: s.model.params,
    fingerprint: s.data.fingerprint,
    shuffle_perm_sha: s.data.permSha,
    precision: cfg.precision,
    scaler: cfg.precision === "bf16" ? "fixed at 1 (bf16 products, P8)" : "dynamic (GradScaler semantics)",
    world: cfg.world,
    seqs_per_step: plan.seqsPerStep,
    tokens_per_step: plan.tokensPerStep,
    activations: act.json,
  };
  rep.say(act.line);
  rep.say(JSON.stringify(j));
  return { runJson: j, exported: null };
}

/** The weights, moments and optimizer position to start from: the resume checkpoint's, or a fresh init (M5). */
function startingPoint(s: Session, coord: Coordinator): { pos: OptimizerPosition; history: LogEntry[] } {
  const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
  const history: LogEntry[] = [];
  if (s.start.resumeDir) {
    checkpointManagerOf(s, pos, history).restore(s.start.resumeDir, s.model.config, coord.views); // every part puts its state back
  } else {
    initWeights(s.model.config, s.cfg.seed, coord.views.params);
  }
  // P8: bf16 products hold the scale at 1 (a resumed fp32 checkpoint's dynamic scale is set aside; a bf16
  // checkpoint resumed in fp32 starts the dynamic scaler from 1)
  if (scalerModeOf(s.cfg.precision) === "fixed") pos.scaler = fixedScaler();
  if (!(coord.views.params instanceof Float32Array)) throw new Error("master weights are not fp32 (P1)");
  return { pos, history };
}

/** K5: what the start line says of the repo's visibility: chosen when created, found (and never changed) when it existed. */
async function visibilityNote(
  hub: NonNullable<Session["hub"]>,
  created: boolean,
  wantPrivate: boolean,
): Promise<string> {
  const flag = wantPrivate ? "--hub-private" : "--no-hub-private";
  if (created) return `created ${wantPrivate ? "private" : "public"} (${flag})`;
  let priv: boolean | null;
  try {
    priv = await hub.isPrivate();
  } catch (e) {
    return `exists (its visibility could not be read: ${(e as Error).message}; it is left as it is)`; // only a line: never stop a run for it
  }
  const is = priv === null ? "of unknown visibility" : priv ? "private" : "public";
  return priv === wantPrivate
    ? `exists, ${is}`
    : `exists, ${is}: left as it is (an existing repo's visibility is never changed; ${flag} applies to a repo this run creates)`;
}

/** The ranks, the Hub repo and the uploader; returns where the uploader's reports will arrive (K6). */
async function startActors(
  s: Session,
  coord: Coordinator,
  pos: OptimizerPosition,
  rep: Reporter,
  hubUrl: string,
): Promise<UploaderEvent[]> {
  const { cfg, plan } = s;
  await coord.spawn();
  const scaler =
    cfg.precision === "bf16"
      ? "fixed(1: bf16 keeps fp32's exponent range, the scale never moves; a non-finite step is still skipped)"
      : `dynamic(init ${pos.scaler.scale}, x${SCALER_DEFAULTS.growthFactor}/${SCALER_DEFAULTS.growthInterval} clean, x${SCALER_DEFAULTS.backoffFactor} on inf/NaN)`;
  const compute = cfg.precision === "bf16" ? "bf16 products, fp32 accumulation and elsewhere" : "float32";
  rep.say(
    `precision: master=fp32 (asserted) compute=${compute} backend=${coord.backendInfo.backend} loss_scaler=${scaler} grad_ckpt=${cfg.gradCkpt}`,
  );
  rep.say(`backend: ${coord.backendInfo.detail}`);
  rep.say(activationReport(s).line);
  let head: string | null = null;
  if (s.hub) {
    // K5, K8: the plan's end created the repo (private unless --no-hub-private) and read its head (K9)
    const r = s.hubStart ?? { created: false, head: await s.hub.followHead() };
    head = r.head; // K8: every commit from here on names its parent
    rep.say(
      `checkpoint hub target ${cfg.hubRepo} (${cfg.hubRepoType}, ${await visibilityNote(s.hub, r.created, cfg.hubPrivate)}; prune=${cfg.prune}, every ${plan.ckptEvery} steps)`,
    );
  }
  const events: UploaderEvent[] = [];
  await coord.startUploader(
    {
      hub: cfg.hubRepo
        ? { hubUrl, repo: cfg.hubRepo, repoType: cfg.hubRepoType, timeoutMs: cfg.hubTimeoutSeconds * 1000 }
        : null,
      prune: cfg.prune,
      minFreeGb: cfg.minFreeGb,
      keepLocal: 1,
      runDir: cfg.out,
      hubRetryMs: cfg.hubRetryMinutes * 60_000,
      head,
      checkpointBytes: s.model.checkpointBytes,
      verifiedLocal: s.start.resumeVerifiedLocal ? [s.start.startStep] : [],
    },
    (e) => events.push(e),
  );
  return events;
}
