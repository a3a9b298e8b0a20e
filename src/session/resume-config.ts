/**
 * P7: what a resume may not change in silence. The flags that change the update but not the data order
 * (--lr, --warmup-frac, --decay-frac) and the update's constants (the clip norm, AdamW's betas, eps and
 * weight decay) are saved in every checkpoint's run_config.json; a resume that differs from them is refused
 * naming old and new, unless --allow-config-change, which lists each change on the resume line. The flags
 * that change the data order or the horizon are the cursor's (C3) and the schedule's (P5) to refuse.
 */
import { UserError } from "../errors";
import type { RunConfig } from "../config";
import { ADAMW_DEFAULTS, MAX_GRAD_NORM } from "../optim/optim";

/** The update's constants, as run_config.json records them under `update`. */
export function updateConstants(): Record<string, number> {
  return {
    max_grad_norm: MAX_GRAD_NORM,
    beta1: ADAMW_DEFAULTS.beta1,
    beta2: ADAMW_DEFAULTS.beta2,
    eps: ADAMW_DEFAULTS.eps,
    weight_decay: ADAMW_DEFAULTS.weightDecay,
  };
}

/** run_config.json's document: the validated run config and the update's constants. */
export function runConfigDoc(cfg: RunConfig): Record<string, unknown> {
  return { ...cfg, update: updateConstants() };
}

/** The flags compared on resume, by their config key. */
const UPDATE_FLAGS: ReadonlyArray<[key: keyof RunConfig, flag: string]> = [
  ["lr", "--lr"],
  ["warmupFrac", "--warmup-frac"],
  ["decayFrac", "--decay-frac"],
];

export interface ConfigChange {
  what: string;
  old: number;
  now: number;
}

/** What this run changes against the checkpoint's run_config.json (a value the checkpoint does not record is not compared). */
export function configChanges(saved: Record<string, unknown> | null, cfg: RunConfig): ConfigChange[] {
  if (!saved) return [];
  const out: ConfigChange[] = [];
  for (const [key, flag] of UPDATE_FLAGS) {
    const old = saved[key];
    if (typeof old === "number" && old !== cfg[key]) out.push({ what: flag, old, now: cfg[key] as number });
  }
  const upd = saved.update as Record<string, unknown> | undefined;
  for (const [k, now] of Object.entries(updateConstants())) {
    const old = upd?.[k];
    if (typeof old === "number" && old !== now) out.push({ what: k, old, now });
  }
  return out;
}

/** One change as the messages say it: `--lr 0.003 -> 0.001`. */
export function describeChanges(ch: ConfigChange[]): string {
  return ch.map((c) => `${c.what} ${c.old} -> ${c.now}`).join(", ");
}

/** P7: refuses a resume that changes the update, unless --allow-config-change; returns the changes it allows. */
export function checkConfigChanges(dir: string, saved: Record<string, unknown> | null, cfg: RunConfig): ConfigChange[] {
  const ch = configChanges(saved, cfg);
  if (!ch.length || cfg.allowConfigChange) return ch;
  const flags = ch.filter((c) => c.what.startsWith("--"));
  const back = flags.length
    ? `Resume with the checkpoint's values (${flags.map((c) => `${c.what} ${c.old}`).join(" ")}), or pass`
    : "Pass";
  throw new UserError(
    "P7",
    `resume refused: this run changes the update ${dir} was trained with: ${describeChanges(ch)}. A resumed run must continue the run it resumes (B1). ${back} --allow-config-change to train on from there with the new values`,
  );
}

/** P8: how the products' precision compares with the checkpoint's (a change is allowed: masters are fp32 either way). */
export function precisionNote(saved: Record<string, unknown> | null, cfg: RunConfig): string {
  const old = saved?.precision ?? "fp32"; // a checkpoint from before --precision computed in fp32
  return old === cfg.precision
    ? ""
    : `; precision ${String(old)} -> ${cfg.precision} (allowed: master weights and moments are fp32 either way${cfg.precision === "bf16" ? ", the loss scale is held at 1" : ", the dynamic loss scaler starts from the checkpoint's scale"})`;
}
