/**
 * The checkpoint layout's names (K2): one folder per checkpoint, the same path locally (under the run
 * folder) and on the Hub (under the repo root), and the pointer beside it.
 *
 *   <run>/ckpt/checkpoint-{step}/   <repo>/ckpt/checkpoint-{step}/   <repo>/latest.json   <repo>/final/
 *
 * Pure functions only: no file is touched here.
 */
import * as path from "node:path";
import { CURSOR_FILE } from "../data/cursor";

export const MODEL_FILE = "model.safetensors";
export const OPTIMIZER_FILE = "optimizer.safetensors";
export const TRAINER_STATE_FILE = "trainer_state.json";
export { CURSOR_FILE };
export const HF_CONFIG_FILE = "config.json";
export const RUN_CONFIG_FILE = "run_config.json";
/** K7: lists every other file's size and sha256; written last. */
export const MANIFEST_FILE = "manifest.json";
/** R2: the Hub pointer at the newest verified checkpoint (or final/). */
export const POINTER_FILE = "latest.json";

/** Every file of a checkpoint folder besides the manifest (K2). */
export const CKPT_FILES = [
  MODEL_FILE,
  OPTIMIZER_FILE,
  TRAINER_STATE_FILE,
  CURSOR_FILE,
  HF_CONFIG_FILE,
  RUN_CONFIG_FILE,
] as const;

/** The folder of checkpoints, in the run folder and in the Hub repo. */
export const CKPT_DIR = "ckpt";
/** The exported model (G4), in the run folder and in the Hub repo. */
export const FINAL_DIR = "final";

const NAME_RE = /^checkpoint-(0|[1-9]\d*)$/;
const REPO_FILE_RE = /^ckpt\/checkpoint-(0|[1-9]\d*)\//;
const PARTIAL_RE = /\.partial-\d+$/;

/** `checkpoint-{step}` for a whole step >= 0. */
export function checkpointName(step: number): string {
  if (!Number.isSafeInteger(step) || step < 0)
    throw new Error(`checkpoint step must be a whole number >= 0, got ${step}`);
  return `checkpoint-${step}`;
}

/** The step of a folder named `checkpoint-{step}` (canonical digits only), else null. */
export function stepOfCheckpointName(name: string): number | null {
  const m = NAME_RE.exec(name);
  return m ? Number(m[1]) : null;
}

/** `ckpt/checkpoint-{step}`: the checkpoint's path in the Hub repo. */
export function checkpointRepoPath(step: number): string {
  return `${CKPT_DIR}/${checkpointName(step)}`;
}

/** The step of a repo file under `ckpt/checkpoint-{step}/`, else null. */
export function stepOfRepoFile(p: string): number | null {
  const m = REPO_FILE_RE.exec(p);
  return m ? Number(m[1]) : null;
}

/** `<runDir>/ckpt`: where a run keeps its local checkpoint folders. */
export function checkpointRoot(runDir: string): string {
  return path.join(runDir, CKPT_DIR);
}

/** `<runDir>/ckpt/checkpoint-{step}`. */
export function checkpointDir(runDir: string, step: number): string {
  return path.join(checkpointRoot(runDir), checkpointName(step));
}

/** The temporary name a folder is written under before it is renamed into place. */
export function partialDirOf(dir: string, pid: number): string {
  return `${dir}.partial-${pid}`;
}

/** True for the name of an interrupted write's leftover (`*.partial-{pid}`). */
export function isPartialName(name: string): boolean {
  return PARTIAL_RE.test(name);
}
