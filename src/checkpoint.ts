/**
 * Local checkpoint folders (K2): everything an exact continuation needs.
 *
 *   ckpt/checkpoint-{step}/ model.safetensors      fp32 master weights, HF names (M7)
 *                           optimizer.safetensors  exp_avg.{name}, exp_avg_sq.{name} (fp32)
 *                           trainer_state.json     step, optimizer steps, scaler, LR shape, log history
 *                           cursor.json            the data position (C1)
 *                           config.json            HF LlamaConfig
 *                           run_config.json        the validated run config it was trained with
 *                           manifest.json          size + sha256 of every other file (K7), written last
 *
 * A folder is written under a temporary name and renamed into place last (llm.c's DONE marker): a
 * folder with the final name is complete, and a half-written one is never mistaken for a checkpoint.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { UserError } from "./errors";
import { MANIFEST_FILE, type CheckpointManifest } from "./hub/manifest";
export { MANIFEST_FILE };
import type { LlamaConfig } from "./model/config";
import { paramLayout } from "./model/layout";
import { encodeSafetensors, decodeSafetensors, flatToTensors, tensorsToFlat, type StTensor } from "./model/safetensors";
import type { ScalerState } from "./actors/optim";
import type { CheckpointDocs } from "./actors/protocol";

export interface LogEntry { step: number; loss: number; lr: number; grad_norm: number | null; loss_scale: number; skipped_steps: number; tok_per_s: number; elapsed_s: number }

export interface TrainerState {
  format: "tstrain-trainer-state/1";
  step: number;
  opt_steps: number;
  skipped_steps: number;
  scaler: ScalerState;
  lr_shape: { warmup: number; decayStart: number; total: number };
  seqs_per_step: number;
  log_history: LogEntry[];
}

export const CKPT_FILES = ["model.safetensors", "optimizer.safetensors", "trainer_state.json", "cursor.json", "config.json", "run_config.json"] as const;

/** Bytes one checkpoint folder takes for P parameters: weights + two moments in fp32, plus headers and documents. */
export function estimateCheckpointBytes(P: number, tensors = 64): number {
  return 12 * P + tensors * 3 * 200 + 256 * 1024;
}

/** A checkpoint folder could not be written (ENOSPC, EROFS, ...); no partial folder was left behind. */
export class CheckpointWriteError extends Error {
  readonly code: string | null;
  readonly dir: string;
  constructor(dir: string, cause: unknown) {
    const code = (cause as NodeJS.ErrnoException)?.code ?? null;
    const what = code === "ENOSPC" ? "the disk is full (ENOSPC)" : code === "EDQUOT" ? "the disk quota is used up (EDQUOT)" : `${code ?? ""} ${(cause as Error)?.message ?? String(cause)}`.trim();
    super(`writing checkpoint folder ${dir} failed: ${what}; the partial folder was removed`);
    this.name = "CheckpointWriteError";
    this.code = code;
    this.dir = dir;
  }
}

/** Removes leftovers of interrupted writes under ckptRoot (`*.partial-*`); returns what it removed. */
export function removePartialFolders(ckptRoot: string): string[] {
  if (!fs.existsSync(ckptRoot)) return [];
  const gone: string[] = [];
  for (const n of fs.readdirSync(ckptRoot)) {
    if (!/\.partial-\d+$/.test(n)) continue;
    fs.rmSync(path.join(ckptRoot, n), { recursive: true, force: true });
    gone.push(path.join(ckptRoot, n));
  }
  return gone;
}

export function checkpointName(step: number): string {
  return `checkpoint-${step}`;
}

function optimizerTensors(cfg: LlamaConfig, m: Float32Array, v: Float32Array): StTensor[] {
  const a = flatToTensors(cfg, m).map((t) => ({ ...t, name: `exp_avg.${t.name}` }));
  const b = flatToTensors(cfg, v).map((t) => ({ ...t, name: `exp_avg_sq.${t.name}` }));
  return [...a, ...b];
}

function writeJson(p: string, v: unknown): void {
  fs.writeFileSync(p, JSON.stringify(v, null, 1) + "\n");
}

/** Write a complete checkpoint folder at `dir` (temp folder + rename). Existing `dir` is never overwritten. */
export function writeCheckpointFolder(dir: string, cfg: LlamaConfig, params: Float32Array, m: Float32Array, v: Float32Array, docs: CheckpointDocs): void {
  if (fs.existsSync(dir)) {
    throw new UserError("K2", `checkpoint folder ${dir} already exists; refusing to overwrite it. Move it away or choose another --out.`);
  }
  const tmp = `${dir}.partial-${process.pid}`;
  try {
    fs.mkdirSync(path.dirname(dir), { recursive: true });
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.mkdirSync(tmp);
    const files: CheckpointManifest["files"] = {};
    const put = (name: string, b: Uint8Array) => {
      fs.writeFileSync(path.join(tmp, name), b);
      files[name] = { size: b.byteLength, sha256: createHash("sha256").update(b).digest("hex") };
    };
    put("model.safetensors", encodeSafetensors(flatToTensors(cfg, params), { format: "pt" }));
    put("optimizer.safetensors", encodeSafetensors(optimizerTensors(cfg, m, v), { format: "pt" }));
    for (const [name, doc] of Object.entries(docs)) put(name, Buffer.from(JSON.stringify(doc, null, 1) + "\n"));
    const step = (docs["cursor.json"] as { step?: unknown })?.step;
    const manifest: CheckpointManifest = { format: "tstrain-manifest/1", step: typeof step === "number" ? step : -1, files };
    writeJson(path.join(tmp, MANIFEST_FILE), manifest);
    fs.renameSync(tmp, dir);
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });
    throw new CheckpointWriteError(dir, e);
  }
}

export interface LoadedCheckpoint {
  state: TrainerState;
  runConfig: Record<string, unknown>;
  hfConfig: Record<string, unknown>;
}

function readJson(p: string, what: string): Record<string, unknown> {
  let raw: string;
  try {
    raw = fs.readFileSync(p, "utf8");
  } catch {
    throw new UserError("K2", `checkpoint ${what} is missing: ${p}. A checkpoint needs every file of K2 (${CKPT_FILES.join(", ")}).`);
  }
  try {
    return JSON.parse(raw) as Record<string, unknown>;
  } catch (e) {
    throw new UserError("K2", `checkpoint ${what} at ${p} is not valid JSON (${(e as Error).message}); the checkpoint is damaged.`);
  }
}

function validTrainerState(s: Record<string, unknown>, p: string): TrainerState {
  const t = s as unknown as TrainerState;
  const ok = t.format === "tstrain-trainer-state/1" && Number.isSafeInteger(t.step) && t.step >= 0 &&
    Number.isSafeInteger(t.opt_steps) && t.opt_steps >= 0 && t.opt_steps <= t.step &&
    Number.isSafeInteger(t.skipped_steps) && typeof t.scaler === "object" && t.scaler !== null &&
    Number.isFinite(t.scaler.scale) && t.scaler.scale > 0 && Number.isSafeInteger(t.scaler.growthTracker) &&
    typeof t.lr_shape === "object" && Array.isArray(t.log_history);
  if (!ok) throw new UserError("K2", `trainer_state.json at ${p} is not a tstrain trainer state (step, opt_steps, scaler, lr_shape, log_history)`);
  return t;
}

/** Read a checkpoint folder into params/m/v (layout order) and return its documents. */
export function readCheckpointFolder(dir: string, cfg: LlamaConfig, params: Float32Array, m: Float32Array, v: Float32Array): LoadedCheckpoint {
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) {
    throw new UserError("R1", `--resume ${dir}: no such checkpoint folder`);
  }
  const state = validTrainerState(readJson(path.join(dir, "trainer_state.json"), "trainer_state.json"), dir);
  const runConfig = readJson(path.join(dir, "run_config.json"), "run_config.json");
  const hfConfig = readJson(path.join(dir, "config.json"), "config.json");
  const readSt = (name: string) => {
    const p = path.join(dir, name);
    if (!fs.existsSync(p)) throw new UserError("K2", `checkpoint ${name} is missing in ${dir}`);
    return decodeSafetensors(fs.readFileSync(p)).tensors;
  };
  tensorsToFlat(cfg, readSt("model.safetensors"), params);
  const opt = readSt("optimizer.safetensors");
  const pick = (prefix: string) => {
    const out = new Map<string, StTensor>();
    for (const e of paramLayout(cfg).entries) {
      const t = opt.get(`${prefix}.${e.name}`);
      if (!t) throw new UserError("K2", `optimizer.safetensors in ${dir} lacks ${prefix}.${e.name}: the optimizer state is incomplete`);
      out.set(e.name, { ...t, name: e.name });
    }
    return out;
  };
  tensorsToFlat(cfg, pick("exp_avg"), m);
  tensorsToFlat(cfg, pick("exp_avg_sq"), v);
  return { state, runConfig, hfConfig };
}

/** Checkpoint folders under `ckptRoot`, oldest first. */
export function listCheckpointFolders(ckptRoot: string): { step: number; dir: string }[] {
  if (!fs.existsSync(ckptRoot)) return [];
  return fs.readdirSync(ckptRoot)
    .map((n) => /^checkpoint-(\d+)$/.exec(n))
    .filter((x): x is RegExpExecArray => x !== null)
    .map((x) => ({ step: Number(x[1]), dir: path.join(ckptRoot, x[0]) }))
    .sort((a, b) => a.step - b.step);
}
