/**
 * `--resume auto` (R2–R4): ask the Hub where the run stopped, prove that answer is the newest state,
 * and bring that checkpoint down. The rule throughout: a failed lookup is never "nothing there".
 * Only a repo that provably does not exist (404 RepoNotFound) — or exists and holds no checkpoint —
 * starts at step 0. Cursor validation (C3) is the caller's.
 */
import * as fs from "node:fs";
import * as fsp from "node:fs/promises";
import * as path from "node:path";
import { UserError } from "../errors";
import type { HubStore, Pointer, RemoteFile } from "./store";
import { describeHubError } from "./store";
import { checkSafetensorsFile } from "./safetensors-check";

export type AutoResume =
  | { kind: "fresh"; reason: string }
  | { kind: "checkpoint"; pointer: Pointer; dir: string; priorLoss: number | null }
  /** latest.json points at final/: the run is complete; nothing is downloaded. */
  | { kind: "complete"; pointer: Pointer };

export interface AutoResumeOptions {
  destDir: string;
  log: (line: string) => void;
  /** Wait before the one retry of the checkpoint enumeration (R3). Default 15 000. */
  retryDelayMs?: number;
  /** A download smaller than this is not real weights. Default 0 (the structural check still applies). */
  minBytes?: number;
}

const CKPT_RE = /^ckpt\/checkpoint-(\d+)\//;

function isRepoMissing(e: unknown): boolean {
  return typeof e === "object" && e !== null && (e as { name?: unknown }).name === "RepoMissingError";
}

/** The steps of every ckpt/checkpoint-N/ folder in a listing. */
export function checkpointSteps(files: RemoteFile[]): number[] {
  const s = new Set<number>();
  for (const f of files) {
    const m = CKPT_RE.exec(f.path);
    if (m) s.add(Number(m[1]));
  }
  return [...s].sort((a, b) => a - b);
}

/** The loss of the last log_history entry that has one (the seed's "prior loss"). */
export function priorLossOf(dir: string): number | null {
  const p = path.join(dir, "trainer_state.json");
  if (!fs.existsSync(p)) return null;
  try {
    const st = JSON.parse(fs.readFileSync(p, "utf8")) as { log_history?: { loss?: unknown }[] };
    const h = (st.log_history ?? []).filter((x) => typeof x?.loss === "number" && Number.isFinite(x.loss));
    return h.length ? (h[h.length - 1]!.loss as number) : null;
  } catch {
    return null;
  }
}

export async function resolveAutoResume(store: HubStore, o: AutoResumeOptions): Promise<AutoResume> {
  const repo = store.repo;
  const retryDelayMs = o.retryDelayMs ?? 15_000;

  // ---- R2: the pointer
  let ptr: Pointer | null;
  try {
    ptr = await store.readPointer();
  } catch (e) {
    if (isRepoMissing(e)) ptr = null; // confirmed by the listing below, never taken on its own
    else {
      throw new UserError("R2", `--resume auto could not read latest.json on ${repo}: ${describeHubError(e)}. A failed lookup is never "nothing there", so this run refuses rather than start from step 0; fix the token, network or Hub and retry`);
    }
  }

  if (ptr === null) {
    // A missing pointer is a fact only if nothing was ever pushed: list the repo before believing it.
    let listed: RemoteFile[];
    try {
      listed = await store.list(undefined, { hashRegular: false });
    } catch (e) {
      if (isRepoMissing(e)) {
        const reason = `${repo} does not exist yet: nothing has ever been pushed`;
        o.log(`resume auto: ${reason} -> starting from step 0`);
        return { kind: "fresh", reason };
      }
      throw new UserError("R2", `--resume auto found no latest.json on ${repo}, and listing the repo to confirm that nothing was pushed failed: ${describeHubError(e)}. Refusing to start from step 0; retry when the Hub answers`);
    }
    const steps = checkpointSteps(listed);
    const hasFinal = listed.some((f) => f.path.startsWith("final/"));
    if (steps.length || hasFinal) {
      const found = [...steps.map((s) => `ckpt/checkpoint-${s}`), ...(hasFinal ? ["final"] : [])];
      throw new UserError("R2", `--resume auto found no latest.json on ${repo}, but the repo holds ${found.length} checkpoint folder(s) (${found.slice(-3).join(", ")}). The pointer is missing, not the run: refusing to start from step 0. Restore latest.json (point it at the newest verified checkpoint) or pass --resume with a local copy`);
    }
    const reason = `no latest.json and no checkpoints on ${repo}`;
    o.log(`resume auto: ${reason} -> starting from step 0`);
    return { kind: "fresh", reason };
  }

  // ---- R3: the pointer must be the newest state
  let listed: RemoteFile[] | null = null;
  let lastErr: unknown = null;
  for (let attempt = 1; attempt <= 2 && listed === null; attempt++) {
    try {
      listed = await store.list(undefined, { hashRegular: false });
    } catch (e) {
      lastErr = e;
      o.log(`resume auto: checkpoint scan attempt ${attempt} failed: ${describeHubError(e).slice(0, 200)}`);
      if (attempt === 1) await new Promise((r) => setTimeout(r, retryDelayMs));
    }
  }
  if (listed === null) {
    throw new UserError("R3", `--resume auto could not enumerate ${repo} (${describeHubError(lastErr)}), so it cannot prove latest.json (step ${ptr.step}) is the newest state. Refusing; retry when the Hub answers`);
  }
  const steps = checkpointSteps(listed);
  const newest = steps.length ? steps[steps.length - 1]! : null;
  if (newest !== null && newest > ptr.step) {
    throw new UserError("R3", `latest.json on ${repo} points at step ${ptr.step} (${ptr.path_in_repo}) but the repo also holds ckpt/checkpoint-${newest}: the pointer is behind the run. Resuming here would re-train that interval, so refusing; point latest.json at the newest verified checkpoint`);
  }
  const pointed = listed.filter((f) => f.path.startsWith(ptr!.path_in_repo + "/"));
  if (pointed.length === 0) {
    throw new UserError("R3", `latest.json on ${repo} points at ${ptr.path_in_repo} (step ${ptr.step}) but the repo holds no files there; refusing to resume from a pointer to nothing`);
  }
  if (ptr.path_in_repo === "final") {
    o.log(`resume auto: latest.json points at final (step ${ptr.step}): the run is complete`);
    return { kind: "complete", pointer: ptr };
  }

  // ---- R4: download, and check that it is real weights
  const dir = path.join(o.destDir, path.basename(ptr.path_in_repo));
  o.log(`auto-resume: hub says step ${ptr.step} at ${ptr.path_in_repo}`);
  await fsp.rm(dir, { recursive: true, force: true });
  let got: { files: number; bytes: number; seconds: number };
  try {
    got = await store.downloadFolder(ptr.path_in_repo, dir);
  } catch (e) {
    throw new UserError("R4", `--resume auto could not download ${ptr.path_in_repo} from ${repo}: ${describeHubError(e)}. Refusing to resume from a partial checkpoint; retry`);
  }
  o.log(`downloaded ${got.files} files, ${(got.bytes / 1e6).toFixed(1)} MB in ${got.seconds.toFixed(1)}s`);
  if (got.bytes < (o.minBytes ?? 0)) {
    throw new UserError("R4", `auto-resume downloaded ${got.bytes} bytes for ${ptr.path_in_repo}, under the ${o.minBytes} bytes a real checkpoint holds: not real weights. Refusing`);
  }
  for (const name of ["model.safetensors", "optimizer.safetensors"]) {
    const p = path.join(dir, name);
    if (!fs.existsSync(p)) {
      if (name === "optimizer.safetensors") continue; // K2 completeness is the caller's; weights are required here
      throw new UserError("R4", `auto-resume downloaded ${ptr.path_in_repo} from ${repo} but it has no ${name}: not real weights. Refusing`);
    }
    try {
      await checkSafetensorsFile(p);
    } catch (e) {
      throw new UserError("R4", `auto-resume downloaded ${ptr.path_in_repo} from ${repo} but ${name} is not real weights: ${(e as Error).message}. Refusing`);
    }
  }
  const priorLoss = priorLossOf(dir);
  o.log(`prior loss at resume: ${priorLoss ?? "unknown"} -- loss continuity is judged against this number`);
  return { kind: "checkpoint", pointer: ptr, dir, priorLoss };
}
