/**
 * What the JSON documents of a checkpoint mean, and the one parser of each: trainer_state.json (K2),
 * manifest.json (K7) and the Hub pointer latest.json (R2). cursor.json is the data layer's
 * (src/data/cursor.ts, C1). Pure functions: bytes in, a checked value or an error naming the file
 * and the field out.
 */
import { UserError } from "../errors";
import { MANIFEST_FILE, TRAINER_STATE_FILE, CURSOR_FILE, HF_CONFIG_FILE, RUN_CONFIG_FILE } from "./names";

// ---------------------------------------------------------------- trainer_state.json (K2)

/** torch.amp.GradScaler's state (P2); its update rule is the optimizer's (src/actors/optim.ts). */
export interface ScalerState {
  scale: number;
  growthTracker: number;
}

/** The trapezoid LR schedule's shape in optimizer steps (P5). */
export interface LrShape {
  warmup: number;
  decayStart: number;
  total: number;
}

export interface LogEntry {
  step: number;
  loss: number;
  lr: number;
  grad_norm: number | null;
  loss_scale: number;
  skipped_steps: number;
  tok_per_s: number;
  elapsed_s: number;
  /** --dist mpi (A9): the mean time per step of the gradient's combine across processes, in ms. */
  allreduce_ms?: number;
}

export const TRAINER_STATE_FORMAT = "tstrain-trainer-state/1";

export interface TrainerState {
  format: typeof TRAINER_STATE_FORMAT;
  step: number;
  /** Applied optimizer steps (AdamW's t - 1, the LR's k); steps skipped on inf/NaN are not counted. */
  opt_steps: number;
  skipped_steps: number;
  scaler: ScalerState;
  lr_shape: LrShape;
  seqs_per_step: number;
  log_history: LogEntry[];
}

const isWhole = (x: unknown): x is number => Number.isSafeInteger(x) && (x as number) >= 0;
const isObject = (x: unknown): x is Record<string, unknown> => typeof x === "object" && x !== null && !Array.isArray(x);

/** The fields of a trainer state, each with the rule it must satisfy (checked in order). */
const TRAINER_STATE_RULES: Array<[field: string, rule: string, ok: (t: Record<string, unknown>) => boolean]> = [
  ["format", `must be "${TRAINER_STATE_FORMAT}"`, (t) => t.format === TRAINER_STATE_FORMAT],
  ["step", "must be a whole number >= 0", (t) => isWhole(t.step)],
  [
    "opt_steps",
    "must be a whole number in [0, step]",
    (t) => isWhole(t.opt_steps) && (t.opt_steps as number) <= (t.step as number),
  ],
  ["skipped_steps", "must be a whole number >= 0", (t) => isWhole(t.skipped_steps)],
  [
    "scaler",
    "must be {scale > 0, growthTracker >= 0}",
    (t) =>
      isObject(t.scaler) &&
      Number.isFinite(t.scaler.scale) &&
      (t.scaler.scale as number) > 0 &&
      isWhole(t.scaler.growthTracker),
  ],
  [
    "lr_shape",
    "must be {warmup, decayStart, total} in whole steps",
    (t) =>
      isObject(t.lr_shape) && isWhole(t.lr_shape.warmup) && isWhole(t.lr_shape.decayStart) && isWhole(t.lr_shape.total),
  ],
  ["seqs_per_step", "must be a whole number > 0", (t) => isWhole(t.seqs_per_step) && (t.seqs_per_step as number) > 0],
  ["log_history", "must be a list of objects", (t) => Array.isArray(t.log_history) && t.log_history.every(isObject)],
];

function damaged(where: string, what: string): UserError {
  return new UserError("K2", `${where} ${what}: the checkpoint is damaged; resume from an earlier verified checkpoint`);
}

/** K2: trainer_state.json's bytes -> a checked TrainerState, or a UserError naming the file and the field. */
export function parseTrainerState(raw: string | Uint8Array, where: string): TrainerState {
  let v: unknown;
  try {
    v = JSON.parse(Buffer.from(raw).toString("utf8"));
  } catch (e) {
    throw damaged(where, `is not valid JSON (${(e as Error).message})`);
  }
  if (!isObject(v)) throw damaged(where, "is not a JSON object");
  for (const [field, rule, ok] of TRAINER_STATE_RULES) {
    if (!ok(v))
      throw damaged(
        where,
        `is not a tstrain trainer state: ${field} ${rule} (got ${JSON.stringify(v[field]) ?? "nothing"})`,
      );
  }
  return v as unknown as TrainerState;
}

/** The loss of the last log_history entry that has a finite one (the seed's "prior loss"), else null. */
export function lastLoggedLoss(state: TrainerState): number | null {
  const h = state.log_history.filter((x) => typeof x.loss === "number" && Number.isFinite(x.loss));
  return h.length ? h[h.length - 1].loss : null;
}

// ---------------------------------------------------------------- the JSON documents of a folder (K2)

/** JSON documents written beside the tensors in a checkpoint folder (K2). */
export interface CheckpointDocs {
  [TRAINER_STATE_FILE]: TrainerState;
  [CURSOR_FILE]: unknown;
  [HF_CONFIG_FILE]: unknown;
  [RUN_CONFIG_FILE]: unknown;
}

/** The JSON documents of a checkpoint (K2), built in one place for the run, the bench and tests. */
export function checkpointDocs(o: {
  trainerState: TrainerState;
  cursor: unknown;
  hfConfig: unknown;
  runConfig: unknown;
}): CheckpointDocs {
  return {
    [TRAINER_STATE_FILE]: o.trainerState,
    [CURSOR_FILE]: o.cursor,
    [HF_CONFIG_FILE]: o.hfConfig,
    [RUN_CONFIG_FILE]: o.runConfig,
  };
}

// ---------------------------------------------------------------- manifest.json (K7)

export const MANIFEST_FORMAT = "tstrain-manifest/1";

/** K7: the size and sha256 of every other file of a checkpoint folder, in the same commit as they are. */
export interface CheckpointManifest {
  format: typeof MANIFEST_FORMAT;
  step: number;
  files: Record<string, { size: number; sha256: string }>;
}

/** Parses and checks a manifest; throws a plain Error saying what is wrong (resume turns it into a reason). */
export function parseManifest(raw: string | Uint8Array, where: string): CheckpointManifest {
  let v: unknown;
  try {
    v = JSON.parse(Buffer.from(raw).toString("utf8"));
  } catch {
    throw new Error(`${where} is not valid JSON`);
  }
  const m = v as CheckpointManifest;
  if (
    !m ||
    m.format !== MANIFEST_FORMAT ||
    !Number.isSafeInteger(m.step) ||
    typeof m.files !== "object" ||
    m.files === null
  ) {
    throw new Error(`${where} is not a tstrain manifest ({format: "${MANIFEST_FORMAT}", step, files})`);
  }
  for (const [k, f] of Object.entries(m.files)) {
    if (
      !f ||
      !Number.isSafeInteger(f.size) ||
      f.size < 0 ||
      typeof f.sha256 !== "string" ||
      !/^[0-9a-f]{64}$/.test(f.sha256) ||
      k === MANIFEST_FILE
    ) {
      throw new Error(`${where}: entry ${JSON.stringify(k)} is not {size, sha256}`);
    }
  }
  return m;
}

// ---------------------------------------------------------------- latest.json (R2)

/** latest.json: where the newest verified checkpoint (or final/) is, and the data position it holds. */
export interface Pointer {
  path_in_repo: string;
  step: number;
  samples_consumed: number;
  tokens_consumed: number;
  fingerprint: string;
  seed: number;
}

/** The pointer at a checkpoint of `step`, for a run reading `seqsPerStep` windows of `seqLen` tokens a step. */
export function makePointer(o: {
  pathInRepo: string;
  step: number;
  seqsPerStep: number;
  seqLen: number;
  fingerprint: string;
  seed: number;
}): Pointer {
  const samples = o.step * o.seqsPerStep;
  return {
    path_in_repo: o.pathInRepo,
    step: o.step,
    samples_consumed: samples,
    tokens_consumed: samples * o.seqLen,
    fingerprint: o.fingerprint,
    seed: o.seed,
  };
}

/** Checks a pointer value (read, or about to be written); returns it with only the known fields. */
export function validatePointer(v: unknown, where: string): Pointer {
  const o = v as Record<string, unknown>;
  const bad = (k: string) => {
    throw new Error(
      `${where}: field ${k} is missing or invalid (got ${JSON.stringify(o?.[k])}); expected {path_in_repo, step, samples_consumed, tokens_consumed, fingerprint, seed}`,
    );
  };
  if (!o || typeof o !== "object") throw new Error(`${where}: not a JSON object`);
  if (typeof o.path_in_repo !== "string" || o.path_in_repo === "") bad("path_in_repo");
  for (const k of ["step", "samples_consumed", "tokens_consumed", "seed"]) if (!isWhole(o[k])) bad(k);
  if (typeof o.fingerprint !== "string") bad("fingerprint");
  return {
    path_in_repo: o.path_in_repo as string,
    step: o.step as number,
    samples_consumed: o.samples_consumed as number,
    tokens_consumed: o.tokens_consumed as number,
    fingerprint: o.fingerprint as string,
    seed: o.seed as number,
  };
}

/** latest.json's bytes -> a checked Pointer; throws a plain Error naming `where`. */
export function parsePointer(raw: string | Uint8Array, where: string): Pointer {
  let v: unknown;
  try {
    v = JSON.parse(Buffer.from(raw).toString("utf8"));
  } catch {
    throw new Error(
      `${where} is not valid JSON (${Buffer.byteLength(typeof raw === "string" ? raw : Buffer.from(raw))} bytes)`,
    );
  }
  return validatePointer(v, where);
}

/** The bytes latest.json is written as. */
export function pointerBytes(p: Pointer): string {
  return `${JSON.stringify(p, null, 1)}\n`;
}
