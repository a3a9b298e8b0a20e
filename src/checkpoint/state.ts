/**
 * What the JSON documents of a checkpoint mean, and the one parser of each: trainer_state.json (K2),
 * manifest.json (K7) and the Hub pointer latest.json (R2). cursor.json is the data layer's
 * (src/data/cursor.ts, C1). Pure functions: bytes in, a checked value or an error naming the file
 * and the field out.
 */
import { UserError } from "../errors";
import { DATA_FIELDS } from "../data/cursor";
import type { LrShape, ScalerState } from "../optim/optim";
import { LR_FIELDS, OPTIMIZER_FIELDS, SCALER_FIELDS } from "../optim/optim-state";
import { isObject, isWhole, type FieldRule, type Stateful } from "./stateful";
import { MANIFEST_FILE, TRAINER_STATE_FILE, CURSOR_FILE, HF_CONFIG_FILE, RUN_CONFIG_FILE } from "./names";

// ---------------------------------------------------------------- trainer_state.json (K2)

export type { LrShape, ScalerState };

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
  /** --backend webgpu: the mean MB per step that crossed to and from this process's devices, and dispatches per micro-batch. */
  h2d_mb?: number;
  d2h_mb?: number;
  dispatches_per_micro?: number;
  /** --backend webgpu: a rank thread's milliseconds on the host per micro-batch (recording, any host fold, readback copies). */
  host_ms_per_micro?: number;
}

export const TRAINER_STATE_FORMAT = "tstrain-trainer-state/1";

/** trainer_state.json: the checkpoint's own fields (format, step), then each part's (TRAINER_STATE_PARTS). */
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
  /**
   * The loss of the checkpoint's own step (the one its CKPT line prints), written last; a resume's prior loss.
   * Absent in checkpoints from before it was written, and when that loss was not finite.
   */
  loss?: number;
}

const HEAD_FIELDS: readonly FieldRule[] = [
  { field: "format", must: `must be "${TRAINER_STATE_FORMAT}"`, ok: (t) => t.format === TRAINER_STATE_FORMAT },
  { field: "step", must: "must be a whole number >= 0", ok: (t) => isWhole(t.step) },
];

export const LOG_FIELDS: readonly FieldRule[] = [
  {
    field: "log_history",
    must: "must be a list of objects",
    ok: (t) => Array.isArray(t.log_history) && t.log_history.every(isObject),
  },
];

/**
 * The parts of trainer_state.json after format and step, in the order they are written and checked; each
 * part's fields and their one validator live with the code that owns them.
 */
export const TRAINER_STATE_PARTS = ["optimizer", "loss scaler", "LR schedule", "data", "log"] as const;
const PART_FIELDS: Record<(typeof TRAINER_STATE_PARTS)[number], readonly FieldRule[]> = {
  optimizer: OPTIMIZER_FIELDS,
  "loss scaler": SCALER_FIELDS,
  "LR schedule": LR_FIELDS,
  data: DATA_FIELDS,
  log: LOG_FIELDS,
};
/** The checkpoint's own loss, after the parts' fields: optional (older checkpoints, a non-finite loss). */
const LOSS_FIELD: FieldRule = {
  field: "loss",
  must: "must be a finite number when present",
  ok: (t) => t.loss === undefined || (typeof t.loss === "number" && Number.isFinite(t.loss)),
};
const TRAINER_STATE_RULES: readonly FieldRule[] = [
  ...HEAD_FIELDS,
  ...TRAINER_STATE_PARTS.flatMap((p) => PART_FIELDS[p]),
  LOSS_FIELD,
];

/** The log of the run's steps (log_history), kept in the array the session appends to. */
export function logStateful(history: LogEntry[]): Stateful<{ log_history: LogEntry[] }> {
  return {
    name: "log",
    fields: LOG_FIELDS,
    stateDict: () => ({ log_history: history }),
    loadStateDict: (s) => {
      history.splice(0, history.length, ...s.log_history);
    },
  };
}

function damaged(where: string, what: string): UserError {
  return new UserError("K2", `${where} ${what}: the checkpoint is damaged; resume from an earlier verified checkpoint`);
}

/** The first rule of trainer_state.json that `v` breaks, as "field must-clause (got value)", else null. */
function brokenRule(v: Record<string, unknown>): string | null {
  for (const { field, must, ok } of TRAINER_STATE_RULES)
    if (!ok(v)) return `${field} ${must} (got ${JSON.stringify(v[field]) ?? "nothing"})`;
  return null;
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
  const broken = brokenRule(v);
  if (broken) throw damaged(where, `is not a tstrain trainer state: ${broken}`);
  return v as unknown as TrainerState;
}

/**
 * K2: the trainer state of the checkpoint of `step`, assembled in one place from the parts' states (in
 * TRAINER_STATE_PARTS order, which fixes the file's bytes) and checked with the rules a reader applies, so
 * a state the trainer writes is one it can resume. Throws on a missing or extra part, or a broken rule.
 */
export function assembleTrainerState(step: number, parts: readonly Stateful[], loss?: number): TrainerState {
  const names = parts.map((p) => p.name);
  if (names.join("|") !== TRAINER_STATE_PARTS.join("|"))
    throw new Error(`trainer state parts are [${names.join(", ")}], expected [${TRAINER_STATE_PARTS.join(", ")}]`);
  const t: Record<string, unknown> = { format: TRAINER_STATE_FORMAT, step };
  for (const p of parts) {
    const s = p.stateDict() as Record<string, unknown>;
    const want = PART_FIELDS[p.name as (typeof TRAINER_STATE_PARTS)[number]].map((f) => f.field);
    if (Object.keys(s).join("|") !== want.join("|"))
      throw new Error(`the ${p.name}'s state has fields [${Object.keys(s).join(", ")}], expected [${want.join(", ")}]`);
    Object.assign(t, s);
  }
  if (loss !== undefined && Number.isFinite(loss)) t.loss = loss;
  const broken = brokenRule(t);
  if (broken) throw new Error(`the trainer state of step ${step} is not one a resume accepts: ${broken}`);
  return t as unknown as TrainerState;
}

/**
 * Put a parsed trainer state back into the parts (the inverse of assembleTrainerState): every part checks its
 * state against this run first, and only then does any part take its state back.
 */
export function restoreTrainerState(state: TrainerState, parts: readonly Stateful[]): void {
  const t = state as unknown as Record<string, unknown>;
  const own = (p: Stateful) => Object.fromEntries(p.fields.map((f) => [f.field, t[f.field]]));
  for (const p of parts) p.check?.(own(p));
  for (const p of parts) p.loadStateDict(own(p));
}

/**
 * A resume's prior loss: the loss the checkpoint recorded of its own step, else (a checkpoint from before it was
 * recorded, or a non-finite one) the last finite loss logged.
 */
export function priorLoss(state: TrainerState): number | null {
  return state.loss ?? lastLoggedLoss(state);
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
