/**
 * A training session, top to bottom: config -> data -> model -> plan -> resume point -> actors ->
 * step loop with checkpoints -> validation -> export -> RUN_JSON. Every refusal happens before
 * step 1 (C3, D6, G1, M3, R2-R4); nothing already saved is overwritten.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { UserError } from "./errors";
import { EMBEDDED_HUB, planSteps, type RunConfig, type StepPlan } from "./config";
import { buildConfig, countParams, hfConfigJson, type LlamaConfig } from "./model/config";
import { initWeights } from "./model/init";
import { writeSafetensors, flatToTensors } from "./model/safetensors";
import { readManifest, type Manifest } from "./data/manifest";
import { PackedTokenStore } from "./data/store";
import { mixFingerprint } from "./data/fingerprint";
import { permSha } from "./data/permutation";
import { loadCursor, makeCursor, saveCursor, validateResume, type Cursor } from "./data/cursor";
import { checkNoWrap, valWindowCount } from "./data/plan";
import { ensureDemoMix } from "./data/demo";
import { Coordinator, checkpointDocs, type StepResult } from "./actors/coordinator";
import { newScaler, ADAMW_DEFAULTS, MAX_GRAD_NORM, SCALER_DEFAULTS, type LrShape, type OptimizerPosition } from "./actors/optim";
import type { CheckpointOutcome, RankFault, RankMemory, UploaderEvent, WriteOutcome } from "./actors/protocol";
import { checkpointName, estimateCheckpointBytes, listCheckpointFolders, readCheckpointFolder, type LogEntry, type TrainerState } from "./checkpoint";
import { checkOutRoom, checkOutWritable, cleanOut, lockOut, type OutLock } from "./outdir";
import { createReporter, fmtDuration, writeRunReport, type Reporter } from "./report";
import { sampleAtCheckpoint } from "./generate";
import { createHubStore, type HubStore, type Pointer } from "./hub/store";
import { resolveAutoResume } from "./hub/resume";
import { publishFinal } from "./hub/cycle";
import { LocalHub } from "./hub/server";
import { runBenchmark } from "./single-thread";
import { checkEngineRequest } from "./model/backend";

export const TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"] as const;

/** Everything fixed before step 1: the data identity, the model, the plan and the start point. */
export interface SessionPlan {
  cfg: RunConfig;
  root: string;
  manifest: Manifest;
  fingerprint: string;
  permSha: string;
  nWindows: number;
  nVal: number;
  model: LlamaConfig;
  params: { sum_numel: number; unique: number; trainable: number };
  plan: StepPlan;
  lrShape: LrShape;
  startStep: number;
  endStep: number;
  resumeDir: string | null;
  priorLoss: number | null;
  hub: HubStore | null;
  /** The resume folder is a local copy proven equal to the Hub's verified checkpoint (R6). */
  resumeVerifiedLocal: boolean;
  /** Bytes one checkpoint takes (O1, K6). */
  checkpointBytes: number;
}

// ---- the command line, for advice that must be a command that works ------------------------------

let commandLine: string[] | null = null;

/** main.ts records the arguments it was started with, so advice can repeat them. */
export function setCommandLine(argv: readonly string[]): void {
  commandLine = [...argv];
}

/** The command that continues this run: the same flags, with --resume replaced (and `extra` added). */
export function resumeCommand(resume: string, extra: string[] = []): string {
  const q = (a: string) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`);
  if (!commandLine) return `node dist/main.js <the same flags> --resume ${resume}${extra.length ? " " + extra.join(" ") : ""}`;
  const out: string[] = [];
  for (let i = 0; i < commandLine.length; i++) {
    const a = commandLine[i]!;
    if (a === "--resume") { i++; continue; }
    if (a.startsWith("--resume=")) continue;
    if (extra.includes(a)) continue;
    out.push(a);
  }
  return ["node", "dist/main.js", ...out, "--resume", resume, ...extra].map(q).join(" ");
}

// ---- signals (O3) --------------------------------------------------------------------------------

let stopSignal: string | null = null;

/** O3: the first SIGINT/SIGTERM asks the run to finish its step, save and publish, and exit. */
export function requestStop(signal: string): void {
  stopSignal = stopSignal ?? signal;
}

/** O3: exit code of a run stopped by a signal after it saved (and published) its checkpoint. */
export const EXIT_STOPPED = 3;

/** Thrown when a signal stopped the run cleanly; main prints the message and exits EXIT_STOPPED. */
export class RunStopped extends Error {
  constructor(message: string, readonly step: number) {
    super(message);
    this.name = "RunStopped";
  }
}

/** Test-only fault injection (TSTRAIN_FAULT="rank:step:throw|exit|nan|diverge|val"); never set in a real run. */
export function faultFromEnv(v = process.env.TSTRAIN_FAULT): RankFault | null {
  if (!v) return null;
  const m = /^(\d+):(\d+):(throw|exit|nan|diverge|val)$/.exec(v);
  if (!m) throw new UserError("G10", `TSTRAIN_FAULT=${JSON.stringify(v)} is not rank:step:throw|exit|nan|diverge|val`);
  return { rank: Number(m[1]), step: Number(m[2]), kind: m[3] as RankFault["kind"] };
}

export async function planSession(cfg: RunConfig, rep: Reporter): Promise<SessionPlan> {
  // ---- data (D1-D7)
  const root = cfg.demo ? await ensureDemoMix(cfg.root) : cfg.root;
  const manifest = readManifest(root);
  if (manifest.total_tokens < cfg.tokens) {
    rep.say(`WARNING mix has ${manifest.total_tokens.toLocaleString("en-US")} tokens < target ${cfg.tokens.toLocaleString("en-US")} (D1)`);
  }
  const store = PackedTokenStore.open(root, manifest, "train");
  const nWindows = store.numWindows(cfg.seqLen);
  store.close();
  const fingerprint = mixFingerprint(root, manifest);
  const pSha = permSha(nWindows, cfg.dataSeed);

  // ---- model (M1-M3)
  const variant = cfg.layers > 0 || cfg.hidden > 0 || cfg.vocabSize > 0 || cfg.demo;
  const vocab = cfg.vocabSize || (cfg.demo ? manifest.vocab_size : 0);
  const model = buildConfig({ seqLen: cfg.seqLen, layers: cfg.layers || undefined, hidden: cfg.hidden || undefined, vocabSize: vocab || undefined });
  if (manifest.vocab_size > model.vocabSize) {
    throw new UserError("D1", `the mix's tokenizer has ${manifest.vocab_size} ids but the model's vocabulary is ${model.vocabSize}: tokens would fall outside the embedding. Rebuild the mix with a tokenizer of at most ${model.vocabSize} ids.`);
  }
  const params = countParams(model);
  const checkpointBytes = estimateCheckpointBytes(params.sum_numel);
  const roomFor = `${params.sum_numel.toLocaleString("en-US")} parameters (weights and two AdamW moments in fp32)`;
  // O1 before any download: a fresh run must fit one checkpoint now.
  if (!cfg.benchmark && cfg.resume === "") checkOutRoom(cfg.out, checkpointBytes, roomFor);
  if (!variant && (params.sum_numel < 90_000_000 || params.sum_numel > 110_000_000)) {
    throw new UserError("M3", `parameter count ${params.sum_numel.toLocaleString("en-US")} is outside the 90M-110M budget`);
  }
  const plan = planSteps(cfg);
  const lrShape: LrShape = { warmup: plan.warmup, decayStart: plan.decayStart, total: plan.stepsPlanned };
  rep.say(`mix: ${manifest.total_tokens.toLocaleString("en-US")} tokens in ${manifest.shards.length} shards fp=${fingerprint.slice(0, 16)} | ${plan.tokensPerStep.toLocaleString("en-US")} tok/step x ${plan.stepsPlanned} steps = ${(plan.tokensPerStep * plan.stepsPlanned).toLocaleString("en-US")} tokens`);
  rep.say(`params: ${JSON.stringify(params)}`);

  // ---- resume point (R1-R4, C3)
  const hub = cfg.hubRepo ? createHubStore({ hubUrl: cfg.hubUrl, repo: cfg.hubRepo, repoType: cfg.hubRepoType, timeoutMs: cfg.hubTimeoutSeconds * 1000 }) : null;
  let resumeDir: string | null = null;
  let priorLoss: number | null = null;
  let resumeVerifiedLocal = false;
  if (cfg.resume === "auto") {
    if (!hub) throw new UserError("R2", "--resume auto needs --hub-repo");
    const got = await resolveAutoResume(hub, {
      destDir: path.join(cfg.out, "resume"), log: rep.say, ignoreUnproven: cfg.resumeIgnoreUnproven,
      localRoots: [path.join(cfg.out, "ckpt"), path.join(cfg.out, "resume")],
    });
    if (got.kind === "fresh") {
      // resolveAutoResume has said why (R2); nothing to add.
    } else if (got.kind === "complete") {
      throw new RunComplete(`resume auto: ${cfg.hubRepo} says the run is complete (latest.json points at ${got.pointer.path_in_repo}, step ${got.pointer.step}); nothing to train. A new run needs a new --hub-repo.`);
    } else {
      resumeDir = got.dir;
      priorLoss = got.priorLoss;
      resumeVerifiedLocal = path.resolve(path.dirname(got.dir)) === path.resolve(cfg.out, "ckpt");
      rep.say(`auto-resume: hub says step ${got.pointer.step} at ${got.pointer.path_in_repo}; resuming from ${got.dir}`);
    }
  } else if (cfg.resume) {
    resumeDir = cfg.resume;
  }
  let startStep = 0;
  if (!resumeDir) await refuseFreshOverExistingRun(cfg, hub);
  if (resumeDir) {
    const cur = loadCursor(resumeDir);
    ({ startStep } = validateResume(cur, { seqLen: cfg.seqLen, seed: cfg.dataSeed, permSha: pSha, fingerprint, seqsPerStep: plan.seqsPerStep }, resumeDir));
    const statePath = path.join(resumeDir, "trainer_state.json");
    if (fs.existsSync(statePath)) {
      const st = JSON.parse(fs.readFileSync(statePath, "utf8")) as TrainerState;
      if (st.step !== startStep) throw new UserError("C3", `resume refused: trainer_state step=${st.step} but cursor step=${startStep} in ${resumeDir}; the checkpoint is inconsistent`);
      if (st.lr_shape && st.lr_shape.total !== plan.stepsPlanned) {
        throw new UserError("P5", `resume refused: the checkpoint's horizon is ${st.lr_shape.total} steps but this plan has ${plan.stepsPlanned}; the schedule's horizon never changes on resume. Use the original --tokens/--max-steps.`);
      }
      const hist = (st.log_history ?? []).filter((h) => Number.isFinite(h.loss));
      if (priorLoss === null && hist.length) priorLoss = hist[hist.length - 1]!.loss;
    }
    rep.say(`resume from ${resumeDir}: step ${startStep}, prior loss ${priorLoss ?? "unknown"} (loss continuity is judged against this number)`);
  }
  if (resumeDir) moveAsideLaterLocalCheckpoints(cfg.out, startStep, rep);
  // O1 for a resume: a local copy proven equal to the Hub's verified checkpoint counts as room when
  // --prune lets the run remove it before its next checkpoint.
  if (!cfg.benchmark && cfg.resume !== "") {
    const reclaim = cfg.prune && hub && resumeVerifiedLocal && resumeDir ? dirBytesSync(resumeDir) : 0;
    checkOutRoom(cfg.out, checkpointBytes - reclaim, roomFor);
  }
  if (startStep > plan.stepsPlanned) {
    throw new UserError("P5", `resume point step ${startStep} is past the horizon ${plan.stepsPlanned}: the checkpoint belongs to a longer run. Use the original --tokens/--max-steps`);
  }
  if (startStep === plan.stepsPlanned) {
    // A checkpoint at the horizon whose session stopped before validating and exporting (R5 can roll onto it).
    rep.say(`resume point step ${startStep} is the horizon: nothing left to train; validating and exporting final/`);
  }
  const room = checkNoWrap({ nWindows, startStep, stepsPlanned: plan.stepsPlanned, seqsPerStep: plan.seqsPerStep, seqLen: cfg.seqLen });
  const nVal = valWindowCount(cfg.valTokens, manifest.val_total_tokens, cfg.seqLen);
  rep.say(`data: ${room.available.toLocaleString("en-US")} training windows available, ${room.needed.toLocaleString("en-US")} needed (${room.marginPct.toFixed(1)} % margin), ${nVal} held-out val windows`);

  // ---- segment end (G1)
  let endStep = plan.stepsPlanned;
  if (cfg.stopAfterSteps) {
    const S = cfg.stopAfterSteps;
    if (S % plan.ckptEvery) throw new UserError("G1", `--stop-after-steps ${S} is not a whole multiple of the checkpoint interval ${plan.ckptEvery}: the session would end between two checkpoints`);
    if (S <= startStep) throw new UserError("G1", `--stop-after-steps ${S} is not beyond the resume point step ${startStep}: this session would train nothing`);
    if (S > plan.stepsPlanned) throw new UserError("G1", `--stop-after-steps ${S} exceeds the horizon ${plan.stepsPlanned}; use 0 to run to the end`);
    endStep = S;
  }
  return { cfg, root, manifest, fingerprint, permSha: pSha, nWindows, nVal, model, params, plan, lrShape, startStep, endStep, resumeDir, priorLoss, hub, resumeVerifiedLocal, checkpointBytes };
}

/** Thrown when --resume auto finds the run already complete: not an error, nothing to do. */
export class RunComplete extends Error {
  constructor(message: string) {
    super(message);
    this.name = "RunComplete";
  }
}

/**
 * A fresh start (no --resume) must not write over an earlier run: local checkpoint folders in
 * --out, or a Hub repo whose latest.json already points somewhere, are refused with what to do.
 */
async function refuseFreshOverExistingRun(cfg: RunConfig, hub: HubStore | null): Promise<void> {
  const local = listCheckpointFolders(path.join(cfg.out, "ckpt"));
  if (local.length) {
    throw new UserError("R1", `${path.join(cfg.out, "ckpt")} already holds ${local.map((c) => path.basename(c.dir)).join(", ")} from an earlier run; a fresh start would mix two runs in one folder. Resume it (--resume ${local[local.length - 1]!.dir}${cfg.hubRepo ? " or --resume auto" : ""}) or choose another --out.`);
  }
  if (!hub) return;
  let ptr: Pointer | null;
  try {
    if (!(await hub.repoExists())) return;
    ptr = await hub.readPointer();
  } catch (e) {
    throw new UserError("R2", `could not read latest.json on ${cfg.hubRepo} before a fresh start (${(e as Error).message}); a failed lookup is never "nothing there". Retry, or pass --resume auto.`);
  }
  if (ptr) {
    throw new UserError("R1", `${cfg.hubRepo} already holds a run (latest.json points at ${ptr.path_in_repo}, step ${ptr.step}); a fresh start would move its pointer. Continue it with --resume auto, or use a new --hub-repo.`);
  }
}

/**
 * On resume, local checkpoint folders beyond the resume point are leftovers of a session that went
 * further than what is being resumed (killed before its pointer moved, say). They are renamed, never
 * deleted or overwritten, so the resumed run can write its own checkpoints under those names.
 */
function moveAsideLaterLocalCheckpoints(out: string, startStep: number, rep: Reporter): void {
  for (const c of listCheckpointFolders(path.join(out, "ckpt"))) {
    if (c.step <= startStep) continue;
    const aside = `${c.dir}.superseded-${Date.now()}`;
    fs.renameSync(c.dir, aside);
    rep.say(`local ${path.basename(c.dir)} is beyond the resume point (step ${startStep}): moved aside to ${aside}`);
  }
}

function dirBytesSync(d: string): number {
  let n = 0;
  for (const e of fs.readdirSync(d, { withFileTypes: true })) n += e.isDirectory() ? dirBytesSync(path.join(d, e.name)) : fs.statSync(path.join(d, e.name)).size;
  return n;
}

function cursorAt(s: SessionPlan, step: number): Cursor {
  return makeCursor({ step, seqsPerStep: s.plan.seqsPerStep, seqLen: s.cfg.seqLen, seed: s.cfg.dataSeed, fingerprint: s.fingerprint, permSha: s.permSha });
}

function pointerAt(s: SessionPlan, step: number, pathInRepo: string): Pointer {
  const samples = step * s.plan.seqsPerStep;
  return { path_in_repo: pathInRepo, step, samples_consumed: samples, tokens_consumed: samples * s.cfg.seqLen, fingerprint: s.fingerprint, seed: s.cfg.dataSeed };
}

function mb(n: number): number {
  return Math.round(n / 1e6);
}

export interface RunResult { runJson: Record<string, unknown>; exported: string | null }

/**
 * The whole session. Returns the RUN_JSON figures; throws UserError on refusals and RunComplete when
 * --resume auto finds nothing left to do. With --hub-url embedded (the demo's default) the local Hub
 * runs in this process on loopback for the session, its files in --hub-dir or <out>/hub (B6, L8).
 */
export async function runSession(cfg: RunConfig, rep: Reporter = createReporter(cfg.out)): Promise<RunResult> {
  checkEngineRequest(cfg.backend); // an explicit --backend native that cannot load is refused before any work (P1)
  if (cfg.hubUrl !== EMBEDDED_HUB || !cfg.hubRepo) return runSessionOn(cfg, rep);
  if (!cfg.benchmark && !cfg.hubDir) checkOutWritable(cfg.out); // O1 before the embedded Hub makes <out>/hub
  const dir = path.resolve(cfg.hubDir || path.join(cfg.out, "hub")); // under the run's own folder (L8)
  const hub = new LocalHub({ dir });
  const url = await hub.start();
  rep.say(`embedded local Hub at ${url} storing ${dir} (B6)`);
  try {
    return await runSessionOn({ ...cfg, hubUrl: url }, rep);
  } finally {
    await hub.stop();
  }
}

async function runSessionOn(cfg: RunConfig, rep: Reporter): Promise<RunResult> {
  if (cfg.benchmark) return runSessionLocked(cfg, rep);
  // O1, O2, O4: the run folder is checked, claimed and cleaned before anything else happens.
  checkOutWritable(cfg.out);
  const lock: OutLock = lockOut(cfg.out, rep.say);
  try {
    for (const l of cleanOut(cfg.out)) rep.say(l);
    return await runSessionLocked(cfg, rep);
  } finally {
    lock.release();
  }
}

async function runSessionLocked(cfg: RunConfig, rep: Reporter): Promise<RunResult> {
  const t0 = performance.now();
  const s = await planSession(cfg, rep);
  const { plan, model } = s;

  if (cfg.dryRun) {
    const j = {
      dry_run: true, train_samples: s.nWindows, val_samples: s.nVal, steps_planned: plan.stepsPlanned, start_step: s.startStep,
      ckpt_every: plan.ckptEvery, params: s.params, fingerprint: s.fingerprint, shuffle_perm_sha: s.permSha,
      scaler: "dynamic (GradScaler semantics)", world: cfg.world, seqs_per_step: plan.seqsPerStep, tokens_per_step: plan.tokensPerStep,
    };
    rep.say(JSON.stringify(j));
    return { runJson: j, exported: null };
  }
  if (cfg.benchmark) {
    const j = await runBenchmark(s, cfg.benchmark, rep);
    return { runJson: j, exported: null };
  }

  // ---- actors
  const coord = Coordinator.create({
    world: cfg.world, model, gradCkpt: cfg.gradCkpt, backend: cfg.backend, fault: faultFromEnv(),
    data: { root: s.root, seqLen: cfg.seqLen, dataSeed: cfg.dataSeed, microBatch: cfg.microBatch, accum: cfg.accum, nVal: s.nVal },
  });
  const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
  let history: LogEntry[] = [];
  if (s.resumeDir) {
    const ck = readCheckpointFolder(s.resumeDir, model, coord.views.params, coord.views.m, coord.views.v);
    pos.optSteps = ck.state.opt_steps;
    pos.scaler = ck.state.scaler;
    pos.skipped = ck.state.skipped_steps;
    history = ck.state.log_history;
  } else {
    initWeights(model, cfg.seed, coord.views.params);
  }
  if (!(coord.views.params instanceof Float32Array)) throw new Error("master weights are not fp32 (P1)");

  let failure: unknown = null;
  let result: RunResult | null = null;
  try {
    await coord.spawn();
    rep.say(`precision: master=fp32 (asserted) compute=float32 backend=${coord.backendInfo.backend} loss_scaler=dynamic(init ${pos.scaler.scale}, x${SCALER_DEFAULTS.growthFactor}/${SCALER_DEFAULTS.growthInterval} clean, x${SCALER_DEFAULTS.backoffFactor} on inf/NaN) grad_ckpt=${cfg.gradCkpt}`);
    rep.say(`backend: ${coord.backendInfo.detail}`);
    let head: string | null = null;
    if (s.hub) {
      const r = await s.hub.ensureRepo();
      head = await s.hub.followHead(); // K8: every commit from here on names its parent
      rep.say(`checkpoint hub target ${cfg.hubRepo} (${cfg.hubRepoType}, ${r.created ? "created" : "exists"}; prune=${cfg.prune}, every ${plan.ckptEvery} steps)`);
    }
    const events: UploaderEvent[] = [];
    await coord.startUploader({
      hub: cfg.hubRepo ? { hubUrl: cfg.hubUrl, repo: cfg.hubRepo, repoType: cfg.hubRepoType, timeoutMs: cfg.hubTimeoutSeconds * 1000 } : null,
      prune: cfg.prune, minFreeGb: cfg.minFreeGb, keepLocal: 1, runDir: cfg.out,
      hubRetryMs: cfg.hubRetryMinutes * 60_000, head, checkpointBytes: s.checkpointBytes,
      verifiedLocal: s.resumeVerifiedLocal ? [s.startStep] : [],
    }, (e) => events.push(e));
    result = await trainLoop(s, coord, pos, history, rep, t0, events);
  } catch (e) {
    failure = e;
  } finally {
    await coord.close();
  }
  if (failure) throw failure;
  return result!;
}

async function trainLoop(s: SessionPlan, coord: Coordinator, pos: OptimizerPosition, history: LogEntry[], rep: Reporter, t0: number, events: UploaderEvent[]): Promise<RunResult> {
  const { cfg, plan } = s;
  const tokensPerStep = plan.tokensPerStep;
  let writing: Promise<WriteOutcome> | null = null;
  let writeError: unknown = null;
  let uploadError: unknown = null;
  let failedStep = -1;
  const outcomes: CheckpointOutcome[] = [];
  const published = new Set<number>();
  const staged = new Set<number>();
  let winLoss = 0, winSteps = 0, winT0 = performance.now(), winTokens = 0;
  const trainT0 = performance.now();
  let lastLoss = Number.NaN;
  let lastSample = "";

  /** Take what the uploader reported since the last look (K6: publishing runs behind training). */
  const absorb = () => {
    for (const e of events.splice(0)) {
      if (e.type === "published") { outcomes.push(e.outcome); if (e.outcome.published?.ok || !s.hub) published.add(e.outcome.step); }
      else if (!uploadError) { uploadError = Object.assign(new Error(e.error.message), e.error); failedStep = e.step; }
    }
  };
  const waitWrite = async () => {
    if (!writing) return;
    await writing.catch(() => undefined);
    writing = null;
  };
  const stage = (done: number) => {
    const trainerState: TrainerState = {
      format: "tstrain-trainer-state/1", step: done, opt_steps: pos.optSteps, skipped_steps: pos.skipped, scaler: pos.scaler,
      lr_shape: s.lrShape, seqs_per_step: plan.seqsPerStep, log_history: history,
    };
    const pathInRepo = `ckpt/${checkpointName(done)}`;
    staged.add(done);
    const w: Promise<WriteOutcome> = coord.stageWrite({
      step: done,
      dir: path.join(cfg.out, "ckpt", checkpointName(done)),
      docs: checkpointDocs({ trainerState, cursor: cursorAt(s, done), hfConfig: hfConfigJson(s.model), runConfig: cfg }),
      publish: s.hub ? { pathInRepo, pointer: pointerAt(s, done, pathInRepo), loss: lastLoss } : null,
    });
    w.catch((e) => {
      // A failed write (ENOSPC ...) is this step's; any other rejection repeats the publishing failure the drain reports.
      if ((e as Error)?.name === "CheckpointWriteError") { writeError = writeError ?? e; failedStep = done; }
      else if (!uploadError) { uploadError = e; failedStep = done; }
    });
    writing = w;
  };
  /** Everything handed to the uploader is written and published (or publishing failed for good). */
  const drain = async (why: string) => {
    await waitWrite();
    rep.say(`waiting for the checkpoint uploads to finish (${why})`);
    const d = await coord.drainUploads();
    absorb();
    // The drain's account is authoritative (events travel on their own channel and may lag).
    for (const o of d.outcomes) if (!outcomes.some((x) => x.step === o.step)) { outcomes.push(o); if (o.published?.ok || !s.hub) published.add(o.step); }
    outcomes.sort((a, b) => a.step - b.step);
    if (d.failure) { uploadError = Object.assign(new Error(d.failure.error.message), d.failure.error); failedStep = d.failure.step; }
    if (s.hub && d.head) await s.hub.followHead(d.head); // K8: the uploader's commits are this run's own
  };

  let stoppedAt = -1;
  for (let step = s.startStep; step < s.endStep; step++) {
    absorb();
    if (uploadError || writeError) break;
    if (stopSignal) {
      // O3: the step in progress has finished; save it and publish it, then stop.
      stoppedAt = step;
      rep.say(`${stopSignal}: stopping after step ${step}; writing${s.hub ? " and publishing" : ""} a checkpoint at step ${step} first (a second signal exits at once)`);
      if (step > s.startStep && !staged.has(step)) {
        await waitWrite();
        stage(step);
      }
      break;
    }
    let r: StepResult;
    try {
      r = await coord.step(step, pos, cfg.lr, s.lrShape);
    } catch (e) {
      // a rank failed: the checkpoints handed over hold the last good steps, so let them land before stopping
      await drain(`step ${step + 1} failed: ${e instanceof Error ? e.message : String(e)}`);
      throw e;
    }
    const done = step + 1;
    lastLoss = r.loss;
    if (!r.applied) rep.say(`step ${done}: non-finite gradient -> step skipped (P2), ${pos.skipped} skipped so far, loss scale now ${pos.scaler.scale}`);
    winLoss += r.loss; winSteps++; winTokens += tokensPerStep;
    const elapsedTrain = (performance.now() - trainT0) / 1000;
    const tokS = ((done - s.startStep) * tokensPerStep) / Math.max(1e-9, elapsedTrain);
    rep.progress(`step ${done}/${plan.stepsPlanned} loss ${r.loss.toFixed(4)} lr ${r.lr.toExponential(2)} scale ${pos.scaler.scale} | ${tokS.toFixed(0)} tok/s | ETA ${fmtDuration((s.endStep - done) * tokensPerStep / Math.max(1e-9, tokS))}`);
    if (done % cfg.logEvery === 0 || done === s.endStep) {
      const winSec = (performance.now() - winT0) / 1000;
      const e: LogEntry = {
        step: done, loss: winLoss / winSteps, lr: r.lr, grad_norm: r.gradNorm, loss_scale: pos.scaler.scale,
        skipped_steps: pos.skipped, tok_per_s: Math.round(winTokens / Math.max(1e-9, winSec)), elapsed_s: Math.round(elapsedTrain * 10) / 10,
      };
      history.push(e);
      rep.metric(e);
      rep.curve(history);
      rep.say(`step ${done}/${plan.stepsPlanned} loss=${e.loss.toFixed(4)} lr=${e.lr.toExponential(3)} grad_norm=${e.grad_norm?.toFixed(4) ?? "skipped"} scale=${e.loss_scale} skipped=${e.skipped_steps} tok/s=${e.tok_per_s}`);
      winLoss = 0; winSteps = 0; winTokens = 0; winT0 = performance.now();
    }
    if (done % plan.ckptEvery === 0) {
      if (writing) {
        rep.say(`waiting for checkpoint ${[...staged].pop()} to be written (the staging copy is single)`);
        await waitWrite();
      }
      absorb();
      if (uploadError || writeError) break;
      stage(done);
      if (cfg.sample) rep.say(lastSample = await sampleNow(s, coord, done));
    }
  }
  await drain("end of the session");
  if (writeError) {
    const e = writeError as Error & { code?: string };
    // The error crossed a thread: only its name and message survive, so read the code from the message.
    e.code = e.code ?? /\((ENOSPC|EDQUOT|EROFS|EACCES)\)/.exec(e.message)?.[1];
    const last = [...published].sort((a, b) => a - b).pop();
    const where = last === undefined ? "no checkpoint of this session is saved yet" :
      s.hub ? `checkpoint ${last} is verified on the Hub (latest.json points at it)` : `checkpoint ${last} is saved in ${path.join(cfg.out, "ckpt")}`;
    const next = s.hub ? resumeCommand("auto", e.code === "ENOSPC" || e.code === "EDQUOT" ? ["--prune"] : []) :
      last !== undefined ? resumeCommand(path.join(cfg.out, "ckpt", checkpointName(last))) : null;
    throw new UserError("O5", `${e.message}. Training stopped at step ${failedStep}; ${where}. ` +
      (e.code === "ENOSPC" || e.code === "EDQUOT" ? `Free space under ${path.resolve(cfg.out)}${s.hub ? ", or let the run make room by removing local copies already verified on the Hub (--prune)" : ""}` : "Fix the folder") +
      (next ? `, then continue with: ${next}` : ", then run the same command again"));
  }
  if (uploadError) {
    const e = uploadError as Error;
    const msg = e.message.replace(/ \[(K\d|R\d)\]$/, "").replace(/\.$/, "");
    const ruleOf = (e as { rule?: string }).rule ?? (/\[(K\d)\]$/.exec(e.message)?.[1] ?? "K4");
    const advice = e.name === "ConcurrentWriterError" ? "" :
      ` Continue with: ${resumeCommand("auto")}${e.name === "CheckpointVerifyError" ? " (it resumes from the last verified checkpoint; the failed folder is ignored and overwritten)" : ""}`;
    throw new UserError(ruleOf, `checkpoint ${failedStep} failed: ${msg}. Training stopped at the next step boundary; the local copy is kept and latest.json was not moved past verified bytes.${advice}`);
  }
  if (stoppedAt >= 0) {
    const saved = stoppedAt > s.startStep;
    const cmd = saved ? (s.hub ? resumeCommand("auto") : resumeCommand(path.join(cfg.out, "ckpt", checkpointName(stoppedAt)))) : null;
    throw new RunStopped(saved
      ? `stopped by ${stopSignal} at step ${stoppedAt}: checkpoint ${stoppedAt} is ${s.hub ? "published and verified on the Hub" : `saved in ${path.join(cfg.out, "ckpt")}`}. Resume with: ${cmd}`
      : `stopped by ${stopSignal} before any step of this session finished: nothing new to save. Run the same command again to start.`, stoppedAt);
  }
  const step = s.endStep;
  const sessionSec = (performance.now() - t0) / 1000;
  const trainSec = (performance.now() - trainT0) / 1000;
  const tokThisRun = (step - s.startStep) * tokensPerStep;
  const finalLoss = history.length ? history[history.length - 1]!.loss : lastLoss;
  const segment = step < plan.stepsPlanned;
  // G1: did this segment really end on a checkpoint (verified on the Hub when there is one)?
  if (segment && s.hub && !published.has(step)) {
    throw new UserError("G1", `segment ended at step ${step} but no checkpoint was pushed and verified for it (pushed: ${[...published].sort((a, b) => a - b).join(", ") || "none"}); the next session would re-read this interval`);
  }
  if (segment && !s.hub && !outcomes.some((o) => o.step === step)) {
    throw new UserError("G1", `segment ended at step ${step} but no local checkpoint was written for it; the next session could not resume there`);
  }
  rep.say(`TRAIN DONE step=${step}/${plan.stepsPlanned} elapsed=${fmtDuration(trainSec)} tokens_this_run=${tokThisRun.toLocaleString("en-US")} last_loss=${finalLoss}`);
  if (!Number.isFinite(finalLoss)) throw new UserError("G3", `final loss is not finite (${finalLoss}): not exporting anything`);

  let valLoss: number | null = null, ppl: number | null = null, valError: string | null = null;
  if (segment) {
    rep.say(`validation skipped: segment ended at step ${step} of ${plan.stepsPlanned} (G1)`);
  } else {
    try {
      valLoss = await coord.evaluate(s.nVal);
      if (!Number.isFinite(valLoss)) throw new Error(`validation loss is ${valLoss}`);
      ppl = Math.exp(Math.min(20, valLoss));
      rep.say(`validation loss=${valLoss.toFixed(4)} ppl=${ppl.toFixed(2)} over ${s.nVal} held-out windows`);
    } catch (e) {
      valError = `${(e as Error).name}: ${String((e as Error).message).slice(0, 300)}`;
      valLoss = null; ppl = null;
      rep.say(`validation failed: ${valError}`);
    }
  }
  const mem: RankMemory[] = await coord.memory();
  const rss = process.memoryUsage().rss;
  const memJson = {
    per_rank: mem.map((m) => ({ rank: m.rank, heap_mb: mb(m.heapPeakBytes), tf_tensors_mb: mb(m.tfPeakBytes), wasm_heap_mb: mb(m.wasmHeapBytes), arena_mb: mb(m.arenaBytes) })),
    max_rank_mb: Math.max(...mem.map((m) => mb(m.heapPeakBytes + m.arenaBytes + Math.max(m.tfPeakBytes, m.wasmHeapBytes)))),
    process_rss_mb: mb(rss),
  };
  rep.say(`memory: ${JSON.stringify(memJson)}`);

  let exported: string | null = null;
  if (!segment) {
    exported = exportFinal(s, coord, {
      step, start_step: s.startStep, tokens_consumed: step * tokensPerStep, tokens_this_run: tokThisRun, session_seconds: Math.round(sessionSec * 10) / 10,
      tok_per_s: Math.round(tokThisRun / Math.max(1e-9, trainSec)), final_loss: finalLoss, prior_loss: s.priorLoss, val_loss: valLoss, val_ppl: ppl,
      val_error: valError, val_windows: s.nVal, memory: memJson,
    }, rep);
    if (s.hub) {
      const r = await publishFinal(s.hub, { localDir: exported, pathInRepo: "final", pointer: pointerAt(s, step, "final"), log: rep.say, giveUpMs: cfg.hubRetryMinutes * 60_000 });
      if (!r.ok) throw new UserError("K4", `final/ did not verify on the Hub: ${JSON.stringify(r.verify)}; the local export is kept at ${exported}`);
      rep.say(`latest.json rolled to the completed run: final at step ${step}`);
    }
  } else {
    rep.say(`segment boundary reached at step ${step} of ${plan.stepsPlanned}: the verified checkpoint is the resume point, so no separate final push`);
  }
  const runJson = {
    final_step: step, steps_planned: plan.stepsPlanned, start_step: s.startStep, segment_stop: segment, final_loss: finalLoss, prior_loss: s.priorLoss,
    val_loss: valLoss, val_ppl: ppl, val_error: valError, val_skipped: segment, val_windows: s.nVal,
    tokens_consumed: step * tokensPerStep, tok_per_s: Math.round(tokThisRun / Math.max(1e-9, trainSec)), session_seconds: Math.round(sessionSec * 10) / 10,
    world: cfg.world, micro_batch: cfg.microBatch, accum: cfg.accum, seq_len: cfg.seqLen, params: s.params.sum_numel,
    backend: coord.backendInfo.backend, grad_ckpt: cfg.gradCkpt, skipped_steps: pos.skipped, loss_scale: pos.scaler.scale,
    checkpoints: outcomes.map((o) => o.step), memory: memJson, exported,
  };
  if (cfg.sample) rep.say(`final ${lastSample.startsWith(`sample @ step ${step}:`) ? lastSample : await sampleNow(s, coord, step)}`);
  rep.say("RUN_JSON " + JSON.stringify(runJson));
  rep.say(`report: file://${path.resolve(writeRunReport(cfg.out, runJson))} (chart: ${path.resolve(cfg.out, "loss.svg")})`);
  return { runJson, exported };
}

/** G11: a short greedy sample from the current weights (read between steps), logged and kept for the report. */
function sampleNow(s: SessionPlan, coord: Coordinator, step: number): Promise<string> {
  return sampleAtCheckpoint({ out: s.cfg.out, root: s.root, cfg: s.model, params: coord.views.params, step, backend: s.cfg.backend });
}

/** G4: final/ = HF model folder + tokenizer files + cursor + run_summary.json. Never overwrites. */
function exportFinal(s: SessionPlan, coord: Coordinator, figures: Record<string, unknown>, rep: Reporter): string {
  const { cfg } = s;
  const exp = path.join(cfg.out, "final");
  if (fs.existsSync(exp)) {
    const old = `${exp}.previous-${Date.now()}`;
    fs.renameSync(exp, old);
    rep.say(`an earlier final/ was moved to ${old} (nothing is overwritten)`);
  }
  const tmp = `${exp}.partial-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  fs.mkdirSync(tmp, { recursive: true });
  writeSafetensors(path.join(tmp, "model.safetensors"), flatToTensors(s.model, coord.views.params), { format: "pt" });
  fs.writeFileSync(path.join(tmp, "config.json"), JSON.stringify(hfConfigJson(s.model), null, 1) + "\n");
  const shipped: string[] = [];
  for (const fn of TOKENIZER_FILES) {
    const src = path.join(s.root, fn);
    if (fs.existsSync(src)) { fs.copyFileSync(src, path.join(tmp, fn)); shipped.push(fn); }
  }
  rep.say(`tokenizer files shipped with the export: ${shipped.length ? shipped.join(", ") : "NONE: the mix root has no tokenizer files"}`);
  saveCursor(tmp, cursorAt(s, s.endStep));
  const summary = {
    ...figures, params: s.params, params_total: s.params.sum_numel, fingerprint: s.fingerprint, shuffle_perm_sha: s.permSha,
    samples_consumed: s.endStep * s.plan.seqsPerStep, steps_planned: s.plan.stepsPlanned, seq_len: cfg.seqLen, micro_batch: cfg.microBatch,
    accum: cfg.accum, world: cfg.world, tokens_per_step: s.plan.tokensPerStep, backend: coord.backendInfo.backend, grad_ckpt: cfg.gradCkpt,
    optim: cfg.optim, lr: cfg.lr, betas: [ADAMW_DEFAULTS.beta1, ADAMW_DEFAULTS.beta2], eps: ADAMW_DEFAULTS.eps,
    weight_decay: ADAMW_DEFAULTS.weightDecay, max_grad_norm: MAX_GRAD_NORM, warmup_frac: cfg.warmupFrac,
    decay_frac: cfg.decayFrac, warmup_steps: s.lrShape.warmup, decay_start: s.lrShape.decayStart, seed: cfg.seed, data_seed: cfg.dataSeed,
    tokenizer_files: shipped,
  };
  fs.writeFileSync(path.join(tmp, "run_summary.json"), JSON.stringify(summary, null, 1) + "\n");
  fs.renameSync(tmp, exp);
  rep.say(`exported ${exp}`);
  return exp;
}

