/**
 * A training session, top to bottom: `runSession` checks the launch and, under --dist mpi, brings up the MPI job
 * (runMpi); `runHere` is the session itself: the embedded Hub (when asked), the run folder's lock, the plan
 * (session/setup.ts: data, model, resume point; every refusal happens there, before step 1), the actors,
 * the step loop (session/loop.ts) and its end (session/finish.ts: validation, export, RUN_JSON).
 */
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
import { checkEngineRequest } from "./model/backend";
import { builtinGemmBf16, fmaPeak } from "./model/engine/native";
import { initMpi, launchPrefix, refuseLaunchWithoutDist } from "./mpi/world";
import { dropUnreadOutput, sigkillWarning, unblockStdout } from "./mpi/output";
import { DistLink } from "./session/dist";
import { RunComplete, RunStopped, EXIT_STOPPED, sameCommand, setLauncher, stopRequested } from "./session/stop";
import { Coordinator } from "./actors/coordinator";
import { fixedScaler, newScaler, scalerModeOf, SCALER_DEFAULTS, type OptimizerPosition } from "./optim/optim";
import type { UploaderEvent } from "./actors/protocol";
import { faultFromEnv } from "./actors/injected-faults";
import type { LogEntry } from "./checkpoint";
import { checkpointManagerOf } from "./session/in-flight";
import { checkOutWritable, cleanOut, lockOut, prepareHubDir, removeIfEmpty, type OutLock } from "./outdir";
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
  refuseLaunchWithoutDist(cfg.dist); // A9: one of H processes of an MPI job without --dist mpi would race the others
  // K5: a malformed HF_TOKEN fails every Hub request; refused now, with what works for this Hub
  if (cfg.hubRepo !== "")
    refuseMalformedToken({
      embeddedWithout: cfg.hubUrl === EMBEDDED_HUB ? sameCommand(["env", "-u", "HF_TOKEN"]) : undefined,
    });
  // an explicit --backend native, --gemm openblas or --isa that cannot load is refused before any work (P1)
  checkEngineRequest(cfg.backend, nativeChoice(cfg));
  if (cfg.dist === "mpi") return runMpi(cfg, rep, origins);
  rep.say(configLine(cfg, origins));
  const cpus = cpuWarning(cfg.world);
  if (cpus) rep.say(cpus);
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
async function runMpi(cfg: RunConfig, rep: Reporter, origins: ReadonlyMap<string, string>): Promise<RunResult> {
  const mpi = initMpi();
  const link = new DistLink(mpi);
  const here = validate({ ...cfg, hosts: mpi.size });
  setLauncher(launchPrefix(mpi.size)); // the resume command relaunches the job, not one process
  if (mpi.rank === 0) unblockStdout(); // the others print little, and exit with process.exit (queued writes would be lost)
  const cpus = cpuWarning(here.world); // each host's own affinity: the followers say theirs on stderr
  if (cpus && mpi.rank !== 0) process.stderr.write(`process ${mpi.rank} of ${mpi.size}: ${cpus}\n`);
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
 * - VDPBF16PS (AVX512_BF16, it passed its self-check): its rate against this core's fp32 FMA, probed now (register
 *   loops of a few ms: `ratio`), and what a step gains from it. AMD Zen 4 and Zen 5 run it at twice the FMA's rate;
 *   some Intel cores at the FMA's own.
 * - Neither: the products are emulated on the fp32 kernel (AMX's order and bits, fused into its tile), each step
 *   about 1.1-1.2x fp32's (the demo's 300 steps at world 2 with --isa avx2 on a Zen 5: 28.4 s against 25.8 s; with
 *   --isa avx512: 23.7 s against 20.2 s): a warning, with why VDPBF16PS is not used where the CPU has it.
 * `k`: the CPU's bf16 kernels (builtinGemmBf16); `ratio`: VDPBF16PS's peak over the FMA's (probed when not given).
 */
export function bf16Warning(
  precision: Precision,
  isa: IsaChoice,
  k?: { hw: boolean; dp: boolean; check: string },
  ratio?: number,
): string | null {
  if (precision !== "bf16" || isa !== "auto") return null;
  const kk = k ?? builtinGemmBf16() ?? { hw: false, dp: false, check: "" };
  if (kk.hw) return null;
  if (kk.dp) {
    const r = ratio ?? (fmaPeak("avx512bf16", 300_000) ?? 0) / Math.max(1e-9, fmaPeak("avx512", 600_000) ?? 0);
    return r >= 1.5
      ? `bf16 products on VDPBF16PS (AVX512_BF16; AMX's order, the same bits): ${r.toFixed(1)}x this core's fp32 FMA rate, probed now; expect steps about 1.6-1.9x as fast as --precision fp32 (P8)`
      : `bf16 products on VDPBF16PS (AVX512_BF16; AMX's order, the same bits): ${r.toFixed(1)}x this core's fp32 FMA rate, probed now: this core runs it at about the FMA's rate, so expect steps about as fast as --precision fp32 (P8)`;
  }
  const why = kk.check && kk.check !== "the CPU has no AVX512_BF16" ? ` (${kk.check})` : "";
  return `WARNING --precision bf16 on a CPU without AMX or a usable VDPBF16PS${why}: its bf16 products are emulated on fp32 FMAs (AMX's order, the same bits), each step about 1.1-1.2x as long as in --precision fp32: train in fp32 here (drop --precision bf16), and keep bf16 to resume or check a bf16 run (P8)`;
}

/**
 * This process's session, top to bottom (process 0's under --dist mpi, `link` its tie to the other processes):
 * the embedded Hub when asked, the run folder's lock, the plan, the actors and the step loop. Each thing started
 * is stopped by its own `finally`, the last started first. A benchmark writes nothing in the run folder (no
 * checkpoint, no metrics), so it claims no lock.
 */
async function runHere(cfg: RunConfig, rep: Reporter, link: DistLink | null): Promise<RunResult> {
  const t0 = performance.now();
  if (!cfg.benchmark) checkOutWritable(cfg.out); // O1 before anything is written there (the embedded Hub's <out>/hub)
  // 1. The embedded local Hub (B6), its files under the run's own folder unless --hub-dir (L8).
  const embedded = cfg.hubUrl === EMBEDDED_HUB && cfg.hubRepo !== "";
  const hubDir = path.resolve(cfg.hubDir || path.join(cfg.out, "hub"));
  // O1: its folder checked before it starts; one this run made is removed at the end if nothing was stored in it
  const madeHubDir = embedded ? prepareHubDir(hubDir, "--hub-dir") : null;
  const hub = embedded ? new LocalHub({ dir: hubDir }) : null;
  try {
    // the Hub's address this session; cfg (and so run_config.json) keeps "embedded", which a later run can reuse
    const hubUrl = hub ? await hub.start() : cfg.hubUrl;
    if (hub) rep.say(`embedded local Hub at ${hubUrl} storing ${hubDir} (B6)`);
    // 2. The run folder, claimed and cleaned before anything else happens there (O1, O2, O4).
    const lock: OutLock | null = cfg.benchmark ? null : lockOut(cfg.out, rep.say);
    try {
      if (lock) for (const l of cleanOut(cfg.out)) rep.say(l);
      // 3. The plan: every refusal happens here, before step 1.
      const s: Session = { ...(await setupSession(cfg, rep, hubUrl)), dist: link };
      if (cfg.dryRun) return dryRun(s, rep);
      if (cfg.benchmark) return { runJson: await runBenchmark(s, cfg.benchmark, rep), exported: null };
      recordSessionStart(s);
      // 4. The coordinator and its ranks, then the step loop and the session's end.
      const coord = Coordinator.create({
        world: cfg.world,
        model: s.model.config,
        gradCkpt: cfg.gradCkpt,
        activationBudgetBytes: activationBudget(cfg).bytes,
        backend: cfg.backend,
        native: nativeChoice(cfg),
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

/**
 * The session's start, after its start record (B5): the starting state (a resumed checkpoint's, K2), the other MPI
 * processes' copy of it (A9), the ranks and the uploader. A refusal here ends the session's record with an end
 * line, as the loop's own ends do, before it propagates.
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
    // a crash keeps no end line: the report says "killed or crashed", as it is
    if (isUserError(e))
      recordSessionEnd(s, {
        ended: "refused",
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
  const slow = bf16Warning(cfg.precision, cfg.isa);
  if (slow) rep.say(slow);
  let head: string | null = null;
  if (s.hub) {
    const r = await s.hub.ensureRepo({ private: cfg.hubPrivate }); // K5: created private unless --no-hub-private
    head = await s.hub.followHead(); // K8: every commit from here on names its parent
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
