/**
 * Reading a checkpoint folder back (K2, R1): its trainer state, its tensors into the caller's flat
 * arrays, and the list of checkpoint folders a run folder holds. Every file is checked as it is read;
 * a missing or damaged one is a UserError naming the file and the rule.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { type FixWay, isUserError, UserError } from "../errors";
import type { LlamaConfig } from "../model/llama-config";
import { decodeSafetensors } from "../model/safetensors";
import { createHash } from "node:crypto";
import {
  CKPT_FILES,
  HF_CONFIG_FILE,
  MANIFEST_FILE,
  RUN_CONFIG_FILE,
  TRAINER_STATE_FILE,
  stepOfCheckpointName,
} from "./names";
import { priorLoss, parseManifest, parseTrainerState, type TrainerState } from "./state";
import { TENSOR_PARTS } from "./tensor-parts";

export interface LoadedCheckpoint {
  state: TrainerState;
  runConfig: Record<string, unknown>;
  hfConfig: Record<string, unknown>;
}

function readFileOf(dir: string, name: string): Buffer {
  const p = path.join(dir, name);
  try {
    return fs.readFileSync(p);
  } catch {
    throw new UserError(
      "K2",
      `checkpoint ${name} is missing: ${p}. A checkpoint needs every file of K2 (${CKPT_FILES.join(", ")}); resume from an earlier verified checkpoint`,
    );
  }
}

function readJsonOf(dir: string, name: string): Record<string, unknown> {
  const p = path.join(dir, name);
  try {
    return JSON.parse(readFileOf(dir, name).toString("utf8")) as Record<string, unknown>;
  } catch (e) {
    if (e instanceof UserError) throw e;
    throw new UserError(
      "K2",
      `checkpoint ${name} at ${p} is not valid JSON (${(e as Error).message}); the checkpoint is damaged`,
    );
  }
}

/** `<dir>/config.json`, the HF LlamaConfig of a checkpoint or of final/; missing or damaged is a UserError (K2). */
export function readHfConfig(dir: string): Record<string, unknown> {
  return readJsonOf(dir, HF_CONFIG_FILE);
}

/** `<dir>/run_config.json` (the run config a checkpoint was trained with), or null where the folder has none. */
export function readRunConfigIfAny(dir: string): Record<string, unknown> | null {
  return fs.existsSync(path.join(dir, RUN_CONFIG_FILE)) ? readJsonOf(dir, RUN_CONFIG_FILE) : null;
}

/** K2: `<dir>/trainer_state.json`, checked; missing or damaged is a UserError naming the file. */
export function readTrainerState(dir: string): TrainerState {
  return parseTrainerState(readFileOf(dir, TRAINER_STATE_FILE), path.join(dir, TRAINER_STATE_FILE));
}

/**
 * The prior loss recorded in `<dir>/trainer_state.json` (the checkpoint's own step's, else the last logged): null
 * when the folder has none or none is recorded
 * (the folder's completeness, K2, is judged where it is read in full); a damaged file is refused (K2).
 */
export function priorLossOf(dir: string): number | null {
  if (!fs.existsSync(path.join(dir, TRAINER_STATE_FILE))) return null;
  return priorLoss(readTrainerState(dir));
}

/** Read a checkpoint folder into params/m/v (layout order) and return its documents. */
export function readCheckpointFolder(
  dir: string,
  cfg: LlamaConfig,
  params: Float32Array,
  m: Float32Array,
  v: Float32Array,
): LoadedCheckpoint {
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) {
    throw new UserError("R1", `--resume ${dir}: no such checkpoint folder`);
  }
  const state = readTrainerState(dir);
  const runConfig = readJsonOf(dir, RUN_CONFIG_FILE);
  const hfConfig = readHfConfig(dir);
  for (const part of TENSOR_PARTS)
    part.loadStateDict(cfg, decodeTensorFile(dir, part.file).tensors, { params, m, v }, dir);
  return { state, runConfig, hfConfig };
}

/** K2: a tensor file of a checkpoint, decoded; a damaged one (truncated, say) is refused naming its path. */
function decodeTensorFile(dir: string, name: string): ReturnType<typeof decodeSafetensors> {
  const buf = readFileOf(dir, name);
  try {
    return decodeSafetensors(buf);
  } catch (e) {
    if (!isUserError(e)) throw e;
    const what = e.message
      .replace(/^not a valid safetensors file: /, "")
      .replace(/; re-export or re-download the file \[M7\]$/, "");
    const other = otherCheckpointAdvice(dir);
    throw new UserError(
      "K2",
      `checkpoint ${name} at ${path.join(dir, name)} is not a valid safetensors file (${what}): the checkpoint is damaged. ${other.advice}`,
      other.ways.length ? { ways: other.ways } : undefined,
    );
  }
}

/**
 * What to use instead of a checkpoint folder that cannot be trusted: `advice`, a sentence that ends in ": run " when
 * there are `ways` (the commands that use another folder), else one that says where to look.
 */
export interface OtherFolders {
  advice: string;
  ways: readonly FixWay[];
}

/** What to resume from instead of the checkpoint `dir`: the newest other one beside it, else a fresh start. */
export function otherCheckpointAdvice(dir: string): OtherFolders {
  const others = listCheckpointFolders(path.dirname(path.resolve(dir))).filter(
    (c) => path.resolve(c.dir) !== path.resolve(dir),
  );
  return others.length
    ? {
        advice: "Resume from another checkpoint: run ",
        ways: [{ changes: [["--resume", others[others.length - 1].dir]], why: "the newest other one" }],
      }
    : { advice: "Resume from another checkpoint folder, or start fresh with another --out", ways: [] };
}

/** sha256 of a file, read in 8 MiB pieces (a checkpoint's weights may not fit one Buffer). */
function sha256OfFile(p: string): string {
  const h = createHash("sha256");
  const buf = Buffer.allocUnsafe(8 << 20);
  const fd = fs.openSync(p, "r");
  try {
    for (let n: number; (n = fs.readSync(fd, buf, 0, buf.length, null)) > 0; ) h.update(buf.subarray(0, n));
  } finally {
    fs.closeSync(fd);
  }
  return h.digest("hex");
}

/** Every file under `dir`, as paths relative to it with `/` separators. */
function filesUnder(dir: string, rel = ""): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...filesUnder(dir, r));
    else out.push(r);
  }
  return out;
}

/**
 * K7: a local checkpoint folder proves itself against its manifest.json before a resume trusts it: every
 * listed file present with the manifest's size and sha256, every K2 file listed, nothing unlisted. A
 * mismatch is a UserError naming the file. A folder without a manifest is refused too, unless
 * `allowNoManifest` (a checkpoint written before tstrain wrote manifests); then it returns false.
 */
export function verifyCheckpointFolder(
  dir: string,
  o: {
    allowNoManifest: boolean;
    /** what to use instead (otherCheckpointAdvice's form) */
    advice: OtherFolders;
    /** The flag that named the folder (generate's --model); --resume by default. */
    flag?: string;
    /** Files the folder may hold beside the listed ones (generate's tokenizer copied in). */
    unlisted?: readonly string[];
  },
): boolean {
  const flag = o.flag ?? "--resume";
  const other = o.advice;
  const refuse = (what: string) =>
    new UserError(
      "K7",
      `${flag} ${dir}: ${what}; the checkpoint cannot be trusted. ${other.advice}`,
      other.ways.length ? { ways: other.ways } : undefined,
    );
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory())
    throw new UserError("R1", `${flag} ${dir}: no such checkpoint folder`);
  const mp = path.join(dir, MANIFEST_FILE);
  if (!fs.existsSync(mp)) {
    if (o.allowNoManifest) return false;
    throw new UserError(
      "K7",
      `${flag} ${dir}: the folder has no ${MANIFEST_FILE}, so its files cannot be checked (every tstrain checkpoint carries one): run `,
      {
        ways: [
          {
            changes: [["--resume-without-manifest", true]],
            why: "if a tstrain from before manifests existed wrote it",
          },
          ...other.ways,
        ],
        after: other.ways.length ? "" : `; otherwise ${other.advice.charAt(0).toLowerCase()}${other.advice.slice(1)}`,
      },
    );
  }
  let m: ReturnType<typeof parseManifest>;
  try {
    m = parseManifest(fs.readFileSync(mp), mp);
  } catch (e) {
    throw refuse((e as Error).message);
  }
  const present = new Set(filesUnder(dir));
  present.delete(MANIFEST_FILE);
  for (const name of o.unlisted ?? []) if (!(name in m.files)) present.delete(name);
  for (const name of CKPT_FILES) if (!(name in m.files)) throw refuse(`${MANIFEST_FILE} does not list ${name}`);
  for (const [rel, want] of Object.entries(m.files)) {
    const p = path.join(dir, ...rel.split("/"));
    if (!present.delete(rel)) throw refuse(`${rel} is missing (${MANIFEST_FILE} lists it)`);
    const size = fs.statSync(p).size;
    if (size !== want.size) throw refuse(`${rel} is ${size} bytes, ${MANIFEST_FILE} says ${want.size}`);
    const sha = sha256OfFile(p);
    if (sha !== want.sha256)
      throw refuse(
        `${rel} has sha256 ${sha.slice(0, 12)}…, ${MANIFEST_FILE} says ${want.sha256.slice(0, 12)}… (its bytes changed after it was written)`,
      );
  }
  if (present.size) throw refuse(`${[...present][0]} is not listed in ${MANIFEST_FILE}`);
  return true;
}

/** Checkpoint folders under `ckptRoot` (`checkpoint-{step}`), oldest first. */
export function listCheckpointFolders(ckptRoot: string): { step: number; dir: string }[] {
  if (!fs.existsSync(ckptRoot)) return [];
  const out: { step: number; dir: string }[] = [];
  for (const n of fs.readdirSync(ckptRoot)) {
    const step = stepOfCheckpointName(n);
    if (step !== null) out.push({ step, dir: path.join(ckptRoot, n) });
  }
  return out.sort((a, b) => a.step - b.step);
}
