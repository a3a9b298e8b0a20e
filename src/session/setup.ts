/**
 * Everything fixed before step 1: the data identity, the model, the step plan, the resume point and
 * where this session ends. The plan's refusals happen here, before any work (the Hub's K5, K9; the data's D1,
 * D3, D4, D6, D7; the model's M2, M3; room under --out, O1; the resume point's C1, C3, K2, K7, P5, P7, R1-R4; the
 * segment's G1); nothing already saved is overwritten. The launch's own (A9, K5, P1) and --out's lock (O1, O2) come
 * before, in run.ts.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { type FixWay, type FlagChange, UserError } from "../errors";
import { EMBEDDED_HUB, planSteps, type RunConfig, type StepPlan } from "../config";
import { buildConfig, countParams, type LlamaConfig } from "../model/llama-config";
import { readManifest, type Manifest } from "../data/manifest";
import { PackedTokenStore } from "../data/token-store";
import { mixFingerprint, verifyShards, type TokenIdScan } from "../data/fingerprint";
import { permSha } from "../data/permutation";
import { type BatchGeometry, loadCursor, makeCursor, validateResume, type Cursor } from "../data/cursor";
import { checkNoWrap, fitToMix, mixTokenWarning, valWindowCount } from "../data/budget";
import { checkHorizon } from "../optim/optim-state";
import { demoMixRoot } from "../data/demo";
import {
  MANIFEST_FILE,
  readHfConfig,
  readRunConfigIfAny,
  verifyCheckpointFolder,
  checkpointRoot,
  estimateCheckpointBytes,
  priorLoss as priorLossOfState,
  listCheckpointFolders,
  makePointer,
  readTrainerState,
  type LrShape,
  type Pointer,
} from "../checkpoint";
import { checkOutRoom } from "../outdir";
import type { Reporter } from "../report";
import { createHubClient, type HubClient } from "../hub/client";
import { checkHubAtStart, HubAtStart, openRepo, type HubAdvice } from "../hub/start";
import { resolveAutoResume } from "../hub/resume";
import { resumeCommand, RunComplete, sameCommand, sameCommandWith } from "./stop";
import { checkConfigChanges, checkSeeds, describeChanges, precisionNote } from "./resume-config";
import type { DistLink } from "./dist";

/**
 * A session's plan, as setupSession fixed it before step 1: the config, then one part per question (what data,
 * what model, how many steps, where this session starts), the Hub repo and, under --dist mpi, the other processes.
 */
export interface Session {
  cfg: RunConfig;
  data: SessionData;
  model: ModelPlan;
  plan: SessionPlan;
  start: StartPoint;
  hub: HubClient | null;
  /** The repo as the plan's end found it (K5, K8): created by this session or not, and its head; null without a Hub
   *  and in a dry run or benchmark, which write nothing. */
  hubStart?: { created: boolean; head: string | null } | null;
  /** --dist mpi (A9): this process leads the job's other processes; null in a run of one process. */
  dist?: DistLink | null;
}

/** The mix and its identity (D1-D7). */
interface DataPlan {
  root: string;
  manifest: Manifest;
  nWindows: number;
  fingerprint: string;
  permSha: string;
  tokenIds: TokenIdScan;
  /** D4, D6, D7, P5: the flags that make a fresh run fit this mix when it does not (fitToMix); null otherwise. */
  fit: FlagChange[] | null;
}

/** The mix, and the held-out windows validated at the horizon (D7). */
export interface SessionData extends DataPlan {
  nVal: number;
}

/** The model and what one checkpoint of it takes (M1-M3, O1). */
export interface ModelPlan {
  config: LlamaConfig;
  params: { sum_numel: number; unique: number; trainable: number };
  /** Bytes one checkpoint takes (O1, K6). */
  checkpointBytes: number;
  roomFor: string;
}

/** The step plan (P5, P6, K1), the learning-rate schedule's shape it gives, and the step this session ends on (G1). */
export interface SessionPlan extends StepPlan {
  lrShape: LrShape;
  endStep: number;
}

/** Where this session starts (R1-R6, C3). */
export interface StartPoint {
  startStep: number;
  resumeDir: string | null;
  priorLoss: number | null;
  /** The resume folder is a local copy proven equal to the Hub's verified checkpoint (R6). */
  resumeVerifiedLocal: boolean;
}

/**
 * `hubUrl`: the Hub's address this session (the embedded Hub's, which cfg names "embedded"). `scratch` (--dry-run,
 * G7): a folder under the system's temp folder, removed by the caller, where what the plan must build or fetch (a
 * demo mix not built yet, a checkpoint --resume auto downloads) goes instead of --root or --out.
 */
export async function setupSession(
  cfg: RunConfig,
  rep: Reporter,
  hubUrl = cfg.hubUrl,
  scratch: string | null = null,
): Promise<Session> {
  // K6, K9: the Hub is asked about the repo first; every Hub call before step 1 is retried as the uploader retries
  const client = cfg.hubRepo
    ? createHubClient({
        hubUrl,
        repo: cfg.hubRepo,
        repoType: cfg.hubRepoType,
        timeoutMs: cfg.hubTimeoutSeconds * 1000,
      })
    : null;
  const hub = client ? new HubAtStart(client, { hubUrl, log: rep.say, giveUpMs: cfg.hubRetryMinutes * 60_000 }) : null;
  const advice: HubAdvice = {
    again: sameCommand(),
    embedded: cfg.resume === "" && cfg.hubUrl !== EMBEDDED_HUB ? sameCommandWith(["--hub-url", EMBEDDED_HUB]) : null,
  };
  if (hub) await checkHubAtStart(hub, hubUrl, advice);
  const data = await planData(cfg, rep, scratch);
  const m = planModel(cfg, data, rep);
  const plan = planSteps(cfg, data.fit);
  const lrShape: LrShape = { warmup: plan.warmup, decayStart: plan.decayStart, total: plan.stepsPlanned };
  rep.say(
    `mix: ${data.manifest.total_tokens.toLocaleString("en-US")} tokens in ${data.manifest.shards.length} shards fp=${data.fingerprint.slice(0, 16)} | ${plan.tokensPerStep.toLocaleString("en-US")} tok/step x ${plan.stepsPlanned} steps = ${(plan.tokensPerStep * plan.stepsPlanned).toLocaleString("en-US")} tokens`,
  );
  rep.say(`params: ${JSON.stringify(m.params)}`);
  const start = await planStart(cfg, hub, data, plan, m, rep, scratch);
  const nVal = valWindowCount(cfg.valTokens, data.manifest.val_total_tokens, cfg.seqLen, data.fit);
  const room = checkNoWrap(
    {
      nWindows: data.nWindows,
      startStep: start.startStep,
      stepsPlanned: plan.stepsPlanned,
      seqsPerStep: plan.seqsPerStep,
      seqLen: cfg.seqLen,
    },
    data.fit,
  );
  rep.say(
    `data: ${room.available.toLocaleString("en-US")} training windows available, ${room.needed.toLocaleString("en-US")} needed (${room.marginPct.toFixed(1)} % margin), ${nVal} held-out val windows`,
  );
  const endStep = planSegmentEnd(cfg, plan, start.startStep);
  // K5, K8, K9: the repo created (its storage refused if it fails) and its head read, the last thing before any work
  const hubStart = hub && !cfg.dryRun && !cfg.benchmark ? await openRepo(hub, cfg.hubPrivate, hubUrl, advice) : null;
  return { cfg, data: { ...data, nVal }, model: m, plan: { ...plan, lrShape, endStep }, start, hub: client, hubStart };
}

async function planData(cfg: RunConfig, rep: Reporter, scratch: string | null): Promise<DataPlan> {
  const root = cfg.demo
    ? await demoMixRoot(cfg.root, { log: rep.say, scratch: scratch && path.join(scratch, "demo") })
    : cfg.root;
  const manifest = readManifest(root);
  const short = mixTokenWarning(manifest.total_tokens, cfg.tokens);
  if (short) rep.say(short);
  // a fresh run that does not fit the mix is told the flags that make it fit (a resume keeps its plan: C3, P5)
  const fit =
    cfg.resume === ""
      ? fitToMix({
          trainTokens: manifest.total_tokens,
          valTokens: manifest.val_total_tokens,
          seqLen: cfg.seqLen,
          microBatch: cfg.microBatch,
          accum: cfg.accum,
          ranks: cfg.world * cfg.hosts,
          tokens: cfg.tokens,
          maxSteps: cfg.maxSteps,
        })
      : null;
  const store = PackedTokenStore.open(root, manifest, "train");
  const nWindows = store.numWindows(cfg.seqLen);
  store.close();
  if (nWindows === 0) {
    const why = `the mix's training split holds ${manifest.total_tokens.toLocaleString("en-US")} tokens, no full window of seq_len ${cfg.seqLen}: `;
    throw fit
      ? new UserError("D4", `${why}run `, { ways: [{ changes: fit, why: "what the mix holds" }] })
      : new UserError("D4", `${why}build a larger mix`);
  }
  // D3 with progress while the user waits, and the largest token id in the same pass (D1)
  const tokenIds = verifyShards(root, manifest, { log: rep.say });
  const fingerprint = mixFingerprint(root, manifest, { verify: false });
  return { root, manifest, nWindows, fingerprint, permSha: permSha(nWindows, cfg.dataSeed), tokenIds, fit };
}

/** The mix tokenizer's id count rounded up to a multiple of 64: the padded vocabulary a variant defaults to (M2). */
export function paddedVocab(tokenizerIds: number): number {
  return Math.ceil(tokenizerIds / VOCAB_PAD) * VOCAB_PAD;
}
const VOCAB_PAD = 64;

/**
 * M2: the model's vocabulary. --vocab-size when given; --demo takes the mix's; a --layers/--hidden variant
 * takes the mix tokenizer's rounded up to 64; only the frozen shape keeps 49,152 (M1), with a warning line
 * when the mix's tokenizer is smaller than that by more than the padding (the vocabulary trap).
 */
function modelFor(cfg: RunConfig, manifest: Manifest, rep: Reporter): LlamaConfig {
  const shape = { seqLen: cfg.seqLen, layers: cfg.layers || undefined, hidden: cfg.hidden || undefined };
  const vocab =
    cfg.vocabSize ||
    (cfg.demo ? manifest.vocab_size : cfg.layers > 0 || cfg.hidden > 0 ? paddedVocab(manifest.vocab_size) : 0);
  const model = buildConfig({ ...shape, vocabSize: vocab || undefined });
  const padded = paddedVocab(manifest.vocab_size);
  if (!cfg.vocabSize && model.vocabSize > padded) {
    const small = countParams(buildConfig({ ...shape, vocabSize: padded })).sum_numel;
    const ln = (n: number) => Math.log(n).toFixed(2);
    const f = (n: number) => n.toLocaleString("en-US");
    rep.say(
      `WARNING the mix's tokenizer has ${f(manifest.vocab_size)} ids but the model's vocabulary is ${f(model.vocabSize)} (the frozen default): ${f(model.vocabSize - manifest.vocab_size)} embedding rows never see a token, the loss starts near ln(${f(model.vocabSize)}) = ${ln(model.vocabSize)} instead of ln(${f(manifest.vocab_size)}) = ${ln(manifest.vocab_size)}, and the LM head does ${(model.vocabSize / padded).toFixed(0)}x the work. --vocab-size ${padded} trains a ${f(small)}-parameter model on the same mix (M2)`,
    );
  }
  return model;
}

function planModel(cfg: RunConfig, data: DataPlan, rep: Reporter): ModelPlan {
  const manifest = data.manifest;
  const variant = cfg.layers > 0 || cfg.hidden > 0 || cfg.vocabSize > 0 || cfg.demo;
  const model = modelFor(cfg, manifest, rep);
  if (manifest.vocab_size > model.vocabSize) {
    throw new UserError(
      "D1",
      `the mix's tokenizer has ${manifest.vocab_size} ids but the model's vocabulary is ${model.vocabSize}${cfg.vocabSize ? ` (--vocab-size ${cfg.vocabSize})` : " (the frozen default)"}: tokens would fall outside the embedding. Run `,
      {
        ways: [
          {
            changes: [["--vocab-size", String(paddedVocab(manifest.vocab_size))]],
            why: "the tokenizer's ids rounded up to a multiple of 64",
          },
        ],
        after: `, or rebuild the mix with a tokenizer of at most ${model.vocabSize} ids`,
      },
    );
  }
  if (data.tokenIds.maxTokenId >= model.vocabSize) {
    throw new UserError(
      "D1",
      `shard ${data.tokenIds.file} holds token id ${data.tokenIds.maxTokenId}, outside the model's vocabulary [0, ${model.vocabSize}) (the manifest says its tokenizer has ${manifest.vocab_size} ids): the shards were not written by this mix's tokenizer. Rebuild the mix with node dist/prepare.js, or run `,
      {
        ways: [
          {
            changes: [["--vocab-size", String(data.tokenIds.maxTokenId + 1)]],
            why: "if the ids are meant; a larger one works too",
          },
        ],
      },
    );
  }
  const params = countParams(model);
  const checkpointBytes = estimateCheckpointBytes(params.sum_numel);
  const roomFor = `${params.sum_numel.toLocaleString("en-US")} parameters (weights and two AdamW moments in fp32)`;
  // O1 before any download: a fresh run must fit one checkpoint now.
  if (!cfg.benchmark && cfg.resume === "") checkOutRoom(cfg.out, checkpointBytes, roomFor);
  if (!variant && (params.sum_numel < 90_000_000 || params.sum_numel > 110_000_000)) {
    throw new UserError(
      "M3",
      `parameter count ${params.sum_numel.toLocaleString("en-US")} is outside the 90M-110M budget`,
    );
  }
  return { config: model, params, checkpointBytes, roomFor };
}

/** The resume point: the checkpoint to start from (or none), checked against this plan, and room for the next one. */
async function planStart(
  cfg: RunConfig,
  hub: HubClient | null,
  data: DataPlan,
  plan: StepPlan,
  m: ModelPlan,
  rep: Reporter,
  scratch: string | null,
): Promise<StartPoint> {
  const start = await findResumeDir(cfg, hub, rep, scratch);
  if (!start.resumeDir) await refuseFreshOverExistingRun(cfg, hub);
  if (start.resumeDir) {
    const dir = start.resumeDir;
    const savedConfig = readRunConfigIfAny(dir);
    checkSeeds(dir, savedConfig, cfg); // P7: the seeds the weights and the window order came from, before the cursor's C3
    const cur = loadCursor(dir);
    ({ startStep: start.startStep } = validateResume(
      cur,
      {
        seqLen: cfg.seqLen,
        seed: cfg.dataSeed,
        permSha: data.permSha,
        fingerprint: data.fingerprint,
        seqsPerStep: plan.seqsPerStep,
        geometry: { now: cfg, was: recordedGeometry(savedConfig) },
      },
      dir,
    ));
    start.priorLoss = checkTrainerState(dir, start.startStep, plan, start.priorLoss);
    checkModelShape(dir, m.config);
    const changed = checkConfigChanges(dir, savedConfig, cfg); // refuses a silent change of the LR shape or the update's constants (P7)
    const allowed = changed.length ? `; changed on purpose (--allow-config-change): ${describeChanges(changed)}` : "";
    rep.say(
      `resume from ${dir}: step ${start.startStep}, prior loss ${start.priorLoss ?? "unknown"} (loss continuity is judged against this number)${allowed}${precisionNote(savedConfig, cfg)}`,
    );
    moveAsideLaterLocalCheckpoints(cfg.out, start.startStep, rep, cfg.dryRun);
  }
  // O1 for a resume: a local copy proven equal to the Hub's verified checkpoint counts as room when
  // --prune lets the run remove it before its next checkpoint.
  if (!cfg.benchmark && cfg.resume !== "") {
    const reclaim =
      cfg.prune && hub && start.resumeVerifiedLocal && start.resumeDir ? dirBytesSync(start.resumeDir) : 0;
    checkOutRoom(cfg.out, m.checkpointBytes - reclaim, m.roomFor);
  }
  if (start.startStep > plan.stepsPlanned) {
    throw new UserError(
      "P5",
      `resume point step ${start.startStep} is past the horizon ${plan.stepsPlanned}: the checkpoint belongs to a longer run. Resume with the run's own --max-steps (or --tokens)`,
    );
  }
  if (start.startStep === plan.stepsPlanned) {
    // A checkpoint at the horizon whose session stopped before validating and exporting (R5 can roll onto it).
    rep.say(
      `resume point step ${start.startStep} is the horizon: nothing left to train; validating and exporting final/`,
    );
  }
  return start;
}

/** --resume auto asks the Hub (R2-R4); --resume DIR names the folder; '' starts fresh. */
async function findResumeDir(
  cfg: RunConfig,
  hub: HubClient | null,
  rep: Reporter,
  scratch: string | null,
): Promise<StartPoint> {
  const start: StartPoint = { startStep: 0, resumeDir: null, priorLoss: null, resumeVerifiedLocal: false };
  if (cfg.resume !== "auto") {
    if (!cfg.resume) return start;
    const dir = existingResumeDir(cfg);
    verifyLocalResume(cfg, hub, rep);
    return { ...start, resumeDir: dir };
  }
  if (!hub) throw new UserError("R2", "--resume auto needs --hub-repo");
  const got = await resolveAutoResume(hub, {
    destDir: path.join(scratch ?? cfg.out, "resume"),
    log: rep.say,
    ignoreUnproven: cfg.resumeIgnoreUnproven,
    localRoots: [checkpointRoot(cfg.out), path.join(cfg.out, "resume")],
  });
  if (got.kind === "fresh") return start; // resolveAutoResume has said why (R2); nothing to add.
  if (got.kind === "complete") {
    throw new RunComplete(
      `resume auto: ${cfg.hubRepo} says the run is complete (latest.json points at ${got.pointer.path_in_repo}, step ${got.pointer.step}); nothing to train. A new run needs a new --hub-repo.`,
    );
  }
  rep.say(`auto-resume: hub says step ${got.pointer.step} at ${got.pointer.path_in_repo}; resuming from ${got.dir}`);
  return {
    ...start,
    resumeDir: got.dir,
    priorLoss: got.priorLoss,
    resumeVerifiedLocal: path.resolve(path.dirname(got.dir)) === path.resolve(checkpointRoot(cfg.out)),
  };
}

/** K7: a --resume DIR folder proves itself against its manifest before anything in it is read. */
function verifyLocalResume(cfg: RunConfig, hub: HubClient | null, rep: Reporter): void {
  const dir = cfg.resume;
  const others = listCheckpointFolders(path.dirname(path.resolve(dir))).filter(
    (c) => path.resolve(c.dir) !== path.resolve(dir),
  );
  const ways: FixWay[] = [
    ...(others.length
      ? [{ changes: [["--resume", others[others.length - 1].dir]] as const, why: "the newest other one" }]
      : []),
    ...(hub ? [{ changes: [["--resume", "auto"]] as const, why: "the Hub's last verified checkpoint" }] : []),
  ];
  const advice = ways.length
    ? { advice: "Resume from another checkpoint: run ", ways }
    : { advice: "Resume from another checkpoint folder, or start fresh with another --out", ways };
  const verified = verifyCheckpointFolder(dir, { allowNoManifest: cfg.resumeWithoutManifest, advice });
  rep.say(
    verified
      ? `resume: ${dir} matches its ${MANIFEST_FILE} (size and sha256 of every file, K7)`
      : `resume: ${dir} has no ${MANIFEST_FILE}; reading it unchecked as --resume-without-manifest asks (K7)`,
  );
}

/**
 * M2: the checkpoint's model (its config.json) has this run's shape. A variant without --vocab-size used to
 * default to 49,152 ids and now takes the mix's, so a checkpoint from before says which flags rebuild its shape.
 */
function checkModelShape(dir: string, model: LlamaConfig): void {
  const hf = readHfConfig(dir);
  const want: Array<[string, string, number]> = [
    ["num_hidden_layers", "--layers", model.numLayers],
    ["hidden_size", "--hidden", model.hiddenSize],
    ["vocab_size", "--vocab-size", model.vocabSize],
  ];
  const diff = want.filter(([k, , v]) => hf[k] !== v);
  if (!diff.length) return;
  throw new UserError(
    "M2",
    `resume refused: the checkpoint ${dir} holds a model with ${diff.map(([k]) => `${k} ${String(hf[k])}`).join(", ")} but this run builds ${diff.map(([k, , v]) => `${k} ${v}`).join(", ")}. Resume with the shape it was trained with: run `,
    { ways: [{ changes: want.map(([k, flag]) => [flag, String(hf[k])] as const) }] },
  );
}

/** C3: --resume DIR names a folder that is there; if not, say so and name the checkpoints that are. */
function existingResumeDir(cfg: RunConfig): string {
  const dir = cfg.resume;
  let isDir: boolean | null = null;
  try {
    isDir = fs.statSync(dir).isDirectory();
  } catch {
    isDir = null;
  }
  if (isDir) return dir;
  const local = listCheckpointFolders(checkpointRoot(cfg.out));
  const there = local.length
    ? ` ${checkpointRoot(cfg.out)} holds ${local.map((c) => path.basename(c.dir)).join(", ")}: resume the newest: run `
    : ` ${checkpointRoot(cfg.out)} holds no checkpoint; name a checkpoint folder (RUN/ckpt/checkpoint-N), or run `;
  const ways: FixWay[] = local.length
    ? [{ changes: [["--resume", local[local.length - 1].dir]] }]
    : [
        ...(cfg.hubRepo ? [{ changes: [["--resume", "auto"]] as const, why: "to continue from the Hub" }] : []),
        { changes: [["--resume", null]], why: "a fresh start" },
      ];
  throw new UserError(
    "C3",
    `resume refused: --resume ${dir} ${isDir === false ? "is a file, not a checkpoint folder" : "does not exist"}.${there}`,
    { ways },
  );
}

/** K2, C3, P5: the trainer state is whole and agrees with the cursor and the horizon; returns the prior loss (the Hub's, else the state's last). */
function checkTrainerState(
  resumeDir: string,
  startStep: number,
  plan: StepPlan,
  priorLoss: number | null,
): number | null {
  const st = readTrainerState(resumeDir);
  if (st.step !== startStep)
    throw new UserError(
      "C3",
      `resume refused: trainer_state step=${st.step} but cursor step=${startStep} in ${resumeDir}; the checkpoint is inconsistent`,
    );
  checkHorizon(st.lr_shape, plan.stepsPlanned);
  return priorLoss ?? priorLossOfState(st);
}

/**
 * G1: where this session ends: the horizon, or --stop-after-steps on a checkpoint beyond the resume point. A value
 * that is none is refused with the ones that are: the checkpoint steps beyond the resume point nearest it, or 0.
 */
function planSegmentEnd(cfg: RunConfig, plan: StepPlan, startStep: number): number {
  if (!cfg.stopAfterSteps) return plan.stepsPlanned;
  const S = cfg.stopAfterSteps;
  const every = plan.ckptEvery;
  const first = (Math.floor(startStep / every) + 1) * every; // the first checkpoint step beyond the resume point
  const ok = (n: number) => n >= first && n <= plan.stepsPlanned && n % every === 0;
  const near = [Math.floor(S / every) * every, Math.ceil(S / every) * every, first].filter(ok);
  const fix = {
    ways: [
      ...[...new Set(near.slice(0, 2))].map((n) => ({ changes: [["--stop-after-steps", String(n)]] as const })),
      { changes: [["--stop-after-steps", null]], why: "run to the horizon" } as const,
    ],
  };
  if (S % every)
    throw new UserError(
      "G1",
      `--stop-after-steps ${S} is not a whole multiple of the checkpoint interval ${every}: the session would end between two checkpoints; run `,
      fix,
    );
  if (S <= startStep)
    throw new UserError(
      "G1",
      `--stop-after-steps ${S} is not beyond the resume point step ${startStep}: this session would train nothing; run `,
      fix,
    );
  if (S > plan.stepsPlanned)
    throw new UserError("G1", `--stop-after-steps ${S} exceeds the horizon ${plan.stepsPlanned}; run `, fix);
  return S;
}

/**
 * A fresh start (no --resume, or --resume auto that found nothing on the Hub) must not write over an earlier run: a
 * Hub repo whose latest.json already points somewhere, or local checkpoint folders in --out, are refused with the
 * command that continues it, one that works where it is given (R1): --resume auto only where the Hub holds the run.
 */
async function refuseFreshOverExistingRun(cfg: RunConfig, hub: HubClient | null): Promise<void> {
  const ptr = hub && cfg.resume === "" ? await pointerBeforeFreshStart(cfg, hub) : null;
  if (ptr) {
    throw new UserError(
      "R1",
      `${cfg.hubRepo} already holds a run (latest.json points at ${ptr.path_in_repo}, step ${ptr.step}); a fresh start would move its pointer. Continue it with --resume auto (${resumeCommand("auto")}), or use a new --hub-repo.`,
    );
  }
  const local = listCheckpointFolders(checkpointRoot(cfg.out));
  if (local.length) {
    const root = checkpointRoot(cfg.out);
    const names = local.map((c) => path.basename(c.dir)).join(", ");
    const why =
      cfg.resume === "auto"
        ? `--resume auto found no checkpoint on ${cfg.hubRepo} (the Hub lost what this run pushed there, or never got it: a second signal before the first publish, or the Hub's folder gone), but ${root} holds ${names}`
        : `${root} already holds ${names} from an earlier run; a fresh start would mix two runs in one folder`;
    throw new UserError(
      "R1",
      `${why}. Resume from the newest local one: ${resumeCommand(local[local.length - 1].dir)}; or choose another --out.`,
    );
  }
}

/** R2: the Hub's latest.json before a fresh start, null when there is none; a failed lookup is never "nothing there". */
async function pointerBeforeFreshStart(cfg: RunConfig, hub: HubClient): Promise<Pointer | null> {
  try {
    if (!(await hub.repoExists())) return null;
    return await hub.readPointer();
  } catch (e) {
    const status =
      (e as { status?: unknown; statusCode?: unknown }).status ?? (e as { statusCode?: unknown }).statusCode;
    const advice =
      status === 401 || status === 403
        ? "Fix the token as said, then run the same command again."
        : `Run the same command again once the Hub answers: ${sameCommand()}`;
    throw new UserError(
      "R2",
      `could not read latest.json on ${cfg.hubRepo} before a fresh start (${(e as Error).message}); a failed lookup is never "nothing there". ${advice}`,
    );
  }
}

/**
 * On resume, local checkpoint folders beyond the resume point are leftovers of a session that went
 * further than what is being resumed (killed before its pointer moved, say). They are renamed, never
 * deleted or overwritten, so the resumed run can write its own checkpoints under those names.
 */
function moveAsideLaterLocalCheckpoints(out: string, startStep: number, rep: Reporter, dryRun: boolean): void {
  for (const c of listCheckpointFolders(checkpointRoot(out))) {
    if (c.step <= startStep) continue;
    if (dryRun) {
      rep.say(
        `local ${path.basename(c.dir)} is beyond the resume point (step ${startStep}): a run would move it aside`,
      );
      continue;
    }
    const aside = `${c.dir}.superseded-${Date.now()}`;
    fs.renameSync(c.dir, aside);
    rep.say(`local ${path.basename(c.dir)} is beyond the resume point (step ${startStep}): moved aside to ${aside}`);
  }
}

function dirBytesSync(d: string): number {
  let n = 0;
  for (const e of fs.readdirSync(d, { withFileTypes: true }))
    n += e.isDirectory() ? dirBytesSync(path.join(d, e.name)) : fs.statSync(path.join(d, e.name)).size;
  return n;
}

/** The data position after `step` steps (C1, C2). */
export function cursorAt(s: Session, step: number): Cursor {
  return makeCursor({
    step,
    seqsPerStep: s.plan.seqsPerStep,
    seqLen: s.cfg.seqLen,
    seed: s.cfg.dataSeed,
    fingerprint: s.data.fingerprint,
    permSha: s.data.permSha,
  });
}

/** The latest.json pointer for the checkpoint of `step` at `pathInRepo`. */
export function pointerAt(s: Session, step: number, pathInRepo: string): Pointer {
  return makePointer({
    pathInRepo,
    step,
    seqsPerStep: s.plan.seqsPerStep,
    seqLen: s.cfg.seqLen,
    fingerprint: s.data.fingerprint,
    seed: s.cfg.dataSeed,
  });
}

/** C3: the batch geometry a checkpoint's run_config.json records; null when it records none (an older one). */
function recordedGeometry(saved: Record<string, unknown> | null): BatchGeometry | null {
  if (!saved) return null;
  const n = (k: string, def?: number): number | null => {
    const v = saved[k] ?? def;
    return typeof v === "number" && Number.isSafeInteger(v) && v >= 1 ? v : null;
  };
  const [microBatch, world, hosts, accum] = [n("microBatch"), n("world"), n("hosts", 1), n("accum")];
  if (microBatch === null || world === null || hosts === null || accum === null) return null;
  return { microBatch, world, hosts, accum };
}
