/**
 * The optimizer's state in a checkpoint (K2), defined here beside the step math that owns it: each part says
 * what it writes, the one rule each saved field must satisfy, and how a saved state is put back
 * (checkpoint/stateful.ts; the checkpoint manager composes the parts).
 *
 *   moments    optimizer.safetensors      AdamW's exp_avg.{name}, exp_avg_sq.{name} (fp32)
 *   optimizer  opt_steps, skipped_steps   applied steps (AdamW's t - 1, the LR's k) and the inf/NaN skips
 *   scaler     scaler                     the loss scaler (P2), checked by validScaler, the one scaler check
 *   lr         lr_shape                   the schedule's shape (P5); the LR's position is opt_steps
 */
import { UserError } from "../errors";
import { paramLayout } from "../model/layout";
import { flatToTensors, tensorsToFlat, type StTensor } from "../model/safetensors";
import { OPTIMIZER_FILE } from "../checkpoint/names";
import { isObject, isWhole, type FieldRule, type Stateful, type TensorPart } from "../checkpoint/stateful";
import { SCALER_RULE, validScaler, type LrShape, type OptimizerPosition, type ScalerState } from "./optim";

/** AdamW's moments: optimizer.safetensors holds exp_avg.{name} then exp_avg_sq.{name} for every parameter. */
export const MOMENTS_PART: TensorPart = {
  file: OPTIMIZER_FILE,
  stateDict: (cfg, t) => [
    ...flatToTensors(cfg, t.m).map((x) => ({ ...x, name: `exp_avg.${x.name}` })),
    ...flatToTensors(cfg, t.v).map((x) => ({ ...x, name: `exp_avg_sq.${x.name}` })),
  ],
  loadStateDict: (cfg, saved, into, dir) => {
    const pick = (prefix: string) => {
      const out = new Map<string, StTensor>();
      for (const e of paramLayout(cfg).entries) {
        const t = saved.get(`${prefix}.${e.name}`);
        if (!t)
          throw new UserError(
            "K2",
            `${OPTIMIZER_FILE} in ${dir} lacks ${prefix}.${e.name}: the optimizer state is incomplete`,
          );
        out.set(e.name, { ...t, name: e.name });
      }
      return out;
    };
    tensorsToFlat(cfg, pick("exp_avg"), into.m);
    tensorsToFlat(cfg, pick("exp_avg_sq"), into.v);
  },
};

export const OPTIMIZER_FIELDS: readonly FieldRule[] = [
  {
    field: "opt_steps",
    must: "must be a whole number in [0, step]",
    ok: (t) => isWhole(t.opt_steps) && (t.opt_steps as number) <= (t.step as number),
  },
  { field: "skipped_steps", must: "must be a whole number >= 0", ok: (t) => isWhole(t.skipped_steps) },
];

export const SCALER_FIELDS: readonly FieldRule[] = [
  { field: "scaler", must: SCALER_RULE, ok: (t) => validScaler(t.scaler) },
];

export const LR_FIELDS: readonly FieldRule[] = [
  {
    field: "lr_shape",
    must: "must be {warmup, decayStart, total} in whole steps",
    ok: (t) =>
      isObject(t.lr_shape) && isWhole(t.lr_shape.warmup) && isWhole(t.lr_shape.decayStart) && isWhole(t.lr_shape.total),
  },
];

/** The optimizer's step count and skips, read from and put back into the run's position `pos`. */
export function optimizerStateful(pos: OptimizerPosition): Stateful<{ opt_steps: number; skipped_steps: number }> {
  return {
    name: "optimizer",
    fields: OPTIMIZER_FIELDS,
    stateDict: () => ({ opt_steps: pos.optSteps, skipped_steps: pos.skipped }),
    loadStateDict: (s) => {
      pos.optSteps = s.opt_steps;
      pos.skipped = s.skipped_steps;
    },
  };
}

/** The loss scaler (P2) of the run's position `pos`. */
export function scalerStateful(pos: OptimizerPosition): Stateful<{ scaler: ScalerState }> {
  return {
    name: "loss scaler",
    fields: SCALER_FIELDS,
    stateDict: () => ({ scaler: pos.scaler }),
    loadStateDict: (s) => {
      pos.scaler = s.scaler;
    },
  };
}

/**
 * P5: a resumed run keeps the schedule's horizon. The one check of a saved
 * lr_shape against the plan: the session's setup runs it before any work, and the LR part on restore.
 */
export function checkHorizon(saved: LrShape, planned: number): void {
  if (saved.total !== planned)
    throw new UserError(
      "P5",
      `resume refused: the checkpoint's horizon is ${saved.total} steps but this plan has ${planned}; the schedule's horizon never changes on resume: run `,
      { ways: [{ changes: [["--max-steps", String(saved.total)]], why: "the checkpoint's horizon" }] },
    );
}

/**
 * The LR schedule (P5): its shape is the plan's, written as lr_shape, and a saved one must have the plan's
 * horizon; its position is the optimizer part's opt_steps (the LR of optimizer step k), so restoring the
 * optimizer restores it and there is nothing else to put back.
 */
export function lrStateful(shape: LrShape): Stateful<{ lr_shape: LrShape }> {
  return {
    name: "LR schedule",
    fields: LR_FIELDS,
    stateDict: () => ({ lr_shape: shape }),
    check: (s) => checkHorizon(s.lr_shape, shape.total),
    loadStateDict: () => undefined,
  };
}
