/**
 * P7: what a resume may not change in silence. The flags that change the update but not the data order
 * (--lr, --warmup-frac, --decay-frac) and the update's constants (the clip norm, AdamW's betas, eps and
 * weight decay) are saved in every checkpoint's run_config.json; a resume that differs from them is refused
 * naming old and new, unless --allow-config-change, which lists each change on the resume line. The seeds
 * (--seed, the weights' init; --data-seed, the window order) are refused whatever the flags: a resumed run continues
 * the weights and the order they made, so a new seed would change nothing but what run_config.json records. The
 * flags that change the batch or the horizon are the cursor's (C3) and the schedule's (P5) to refuse.
 */
import { UserError } from "../errors";
import type { RunConfig } from "../config";
import { ADAMW_DEFAULTS, MAX_GRAD_NORM } from "../optim/optim";
import { sameCommand, sameCommandWith } from "./stop";

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
    ? `Resume with the checkpoint's values: ${sameCommandWith(...flags.map((c) => [c.what, String(c.old)] as const))}; or add --allow-config-change to train on from there with the new values: ${sameCommand()} --allow-config-change`
    : `Add --allow-config-change to train on from there with the new values: ${sameCommand()} --allow-config-change`;
  throw new UserError(
    "P7",
    `resume refused: this run changes the update ${dir} was trained with: ${describeChanges(ch)}. A resumed run must continue the run it resumes (B1). ${back}`,
  );
}

/** The seeds a resume may never change, by their config key (P7). */
const SEED_FLAGS: ReadonlyArray<[key: "seed" | "dataSeed", flag: string, what: string]> = [
  ["seed", "--seed", "its weights were initialised with"],
  ["dataSeed", "--data-seed", "its window order was drawn with"],
];

/**
 * P7: refuses a resume whose --seed or --data-seed differs from the checkpoint's (run_config.json; a value it does
 * not record is not compared), naming the checkpoint's value: run_config.json never records a seed the weights
 * did not come from. --allow-config-change does not allow it.
 */
export function checkSeeds(dir: string, saved: Record<string, unknown> | null, cfg: RunConfig): void {
  const ch = SEED_FLAGS.filter(([k]) => typeof saved?.[k] === "number" && saved[k] !== cfg[k]);
  if (!ch.length || !saved) return;
  const back = sameCommandWith(...ch.map(([k, flag]) => [flag, String(saved[k])] as const));
  throw new UserError(
    "P7",
    `resume refused: this run changes the seeds of ${dir}: ${ch.map(([k, flag, what]) => `${flag} ${String(saved[k])} -> ${cfg[k]} (${what} ${String(saved[k])})`).join(", ")}. A resumed run continues those weights and that order, so a new seed would change nothing but what run_config.json records (--allow-config-change does not allow it). Resume with the checkpoint's ${ch.length > 1 ? "seeds" : "seed"}: ${back}; or start a new run with another --out`,
  );
}

/** P8: how the products' precision compares with the checkpoint's (a change is allowed: masters are fp32 either way). */
export function precisionNote(saved: Record<string, unknown> | null, cfg: RunConfig): string {
  const old = saved?.precision ?? "fp32"; // a checkpoint from before --precision computed in fp32
  return old === cfg.precision
    ? ""
    : `; precision ${String(old)} -> ${cfg.precision} (allowed: master weights and moments are fp32 either way${cfg.precision === "bf16" ? ", the loss scale is held at 1" : ", the dynamic loss scaler starts from the checkpoint's scale"})`;
}
