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
import type { HubClient, Pointer, RemoteFile } from "./client";
import { describeHubError } from "./hub-errors";
import { checkSafetensorsFile } from "./safetensors-check";
import { withRetry } from "./retry";
import {
  MANIFEST_FILE,
  CURSOR_FILE,
  FINAL_DIR,
  MODEL_FILE,
  OPTIMIZER_FILE,
  checkpointRepoPath,
  listCheckpointFolders,
  parseManifest,
  priorLossOf,
  stepOfRepoFile,
} from "../checkpoint";
import { createHash } from "node:crypto";
import { parseCursor, type Cursor } from "../data/cursor";

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
  /** R6: folders whose <basename of the pointed path> may already hold that checkpoint (checked against the Hub, reused when equal). */
  localRoots?: string[];
  /** R3: resume from the pointer even when newer checkpoint folders without a manifest exist (--resume-ignore-unproven). */
  ignoreUnproven?: boolean;
}

type Proof = { ok: true; pointer: Pointer; files: number } | { ok: false; noManifest: boolean; reason: string };

/**
 * R5: does ckpt/checkpoint-N on the Hub prove complete against its own manifest (every listed file
 * present with the manifest's size and sha256, nothing else), with a cursor at step N that belongs
 * to this run (same fingerprint and seed, and the samples-per-step the pointer implies)?
 */
async function proveCheckpoint(store: HubClient, step: number, ref: Pointer | null): Promise<Proof> {
  const prefix = checkpointRepoPath(step);
  const raw = await store.download(`${prefix}/${MANIFEST_FILE}`);
  if (raw === null) return { ok: false, noManifest: true, reason: `it has no ${MANIFEST_FILE}` };
  let m: ReturnType<typeof parseManifest>;
  try {
    m = parseManifest(raw, `${prefix}/${MANIFEST_FILE}`);
  } catch (e) {
    return { ok: false, noManifest: false, reason: (e as Error).message };
  }
  if (m.step !== step) return { ok: false, noManifest: false, reason: `its manifest says step ${m.step}` };
  const remote = await store.list(prefix); // sha256 of every file, regular ones hashed from their bytes
  const byRel = new Map(remote.map((f) => [f.path.slice(prefix.length + 1), f]));
  byRel.delete(MANIFEST_FILE);
  const problems: string[] = [];
  for (const [rel, want] of Object.entries(m.files)) {
    const got = byRel.get(rel);
    byRel.delete(rel);
    if (!got) problems.push(`${rel} missing`);
    else if (got.size !== want.size) problems.push(`${rel} is ${got.size} bytes, the manifest says ${want.size}`);
    else if (got.sha256 !== want.sha256)
      problems.push(
        `${rel} has sha256 ${String(got.sha256).slice(0, 12)}…, the manifest says ${want.sha256.slice(0, 12)}…`,
      );
  }
  for (const rel of byRel.keys()) problems.push(`${rel} is not in the manifest`);
  if (problems.length)
    return {
      ok: false,
      noManifest: false,
      reason: `it does not match its manifest: ${problems.slice(0, 4).join("; ")}${problems.length > 4 ? ` (+${problems.length - 4} more)` : ""}`,
    };
  let c: Cursor;
  try {
    c = parseCursor(String(await store.download(`${prefix}/${CURSOR_FILE}`)), `${prefix}/${CURSOR_FILE}`);
  } catch (e) {
    if (!(e instanceof UserError)) throw e;
    return {
      ok: false,
      noManifest: false,
      reason: `its cursor.json is damaged (${e.message.split(/[:;] the checkpoint is damaged/)[0]})`,
    };
  }
  const samples = c.samples_consumed,
    seqLen = c.seq_len;
  if (c.step !== step) return { ok: false, noManifest: false, reason: `its cursor says step ${c.step}, not ${step}` };
  if (ref) {
    if (c.dataset_files_sha !== ref.fingerprint || c.shuffle_seed !== ref.seed)
      return {
        ok: false,
        noManifest: false,
        reason: "its cursor names another data fingerprint or seed than latest.json",
      };
    if (ref.step > 0 && samples * ref.step !== ref.samples_consumed * step)
      return {
        ok: false,
        noManifest: false,
        reason: `its cursor's ${samples} samples at step ${step} do not match latest.json's samples per step`,
      };
  }
  const pointer: Pointer = {
    path_in_repo: prefix,
    step,
    samples_consumed: samples,
    tokens_consumed: samples * seqLen,
    fingerprint: c.dataset_files_sha,
    seed: c.shuffle_seed,
  };
  return { ok: true, pointer, files: Object.keys(m.files).length + 1 };
}

/** R5: move latest.json onto a checkpoint that proved complete (parent revision named, K8). */
async function rollForward(
  store: HubClient,
  from: Pointer | null,
  to: Pointer,
  files: number,
  log: (l: string) => void,
): Promise<void> {
  await store.followHead();
  await withRetry((attempt) => store.writePointer(to, { retry: attempt > 1 }), {
    what: `write of latest.json -> ${to.path_in_repo}`,
    log,
    giveUpMs: 120_000,
  });
  log(
    `resume auto: latest.json ${from ? `pointed at step ${from.step} (${from.path_in_repo})` : "was missing"}, but ${to.path_in_repo} proves complete against its manifest (${files} files, sizes and sha256 equal) with a consistent cursor: rolled forward, latest.json now points at step ${to.step} (R5)`,
  );
}

/** R6: the local folder equals the Hub's copy (every file, size and hash as the Hub lists it, nothing extra). */
async function sameAsHub(dir: string, remote: RemoteFile[], prefix: string): Promise<string | null> {
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) return "absent";
  const localNames = new Set<string>();
  const walk = (d: string, rel: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) walk(path.join(d, e.name), r);
      else localNames.add(r);
    }
  };
  walk(dir, "");
  for (const f of remote) {
    const rel = f.path.slice(prefix.length + 1);
    if (!localNames.delete(rel)) return `${rel} is missing locally`;
    const p = path.join(dir, ...rel.split("/"));
    const st = fs.statSync(p);
    if (st.size !== f.size) return `${rel} is ${st.size} bytes locally, ${f.size} on the Hub`;
    const sha = createHash("sha256");
    const git = createHash("sha1").update(`blob ${st.size}\0`);
    for await (const c of fs.createReadStream(p)) {
      sha.update(c as Buffer);
      git.update(c as Buffer);
    }
    const s256 = sha.digest("hex"),
      s1 = git.digest("hex");
    if (f.sha256 !== null ? s256 !== f.sha256 : !(f.gitOid && s1 === f.gitOid))
      return `${rel} differs from the Hub's copy`;
  }
  if (localNames.size) return `${[...localNames][0]} is not on the Hub`;
  return null;
}

function isRepoMissing(e: unknown): boolean {
  return typeof e === "object" && e !== null && (e as { name?: unknown }).name === "RepoMissingError";
}

/** The steps of every ckpt/checkpoint-N/ folder in a listing (a file under it names it). */
export function checkpointSteps(files: RemoteFile[]): number[] {
  const s = new Set<number>();
  for (const f of files) {
    const step = stepOfRepoFile(f.path);
    if (step !== null) s.add(step);
  }
  return [...s].sort((a, b) => a - b);
}

/** R2–R6, top to bottom: the pointer, the newest state, then the pointed checkpoint brought down. */
export async function resolveAutoResume(store: HubClient, o: AutoResumeOptions): Promise<AutoResume> {
  const ptr = await readPointerOrMissing(store);
  if (ptr === null) return resumeWithoutPointer(store, o);
  const listed = await listForNewest(store, ptr, o);
  if (ptr.path_in_repo !== FINAL_DIR && (await rolledOntoNewer(store, ptr, checkpointSteps(listed), o)))
    return resolveAutoResume(store, o);
  const pointed = listed.filter((f) => f.path.startsWith(`${ptr.path_in_repo}/`));
  if (pointed.length === 0) {
    throw new UserError(
      "R3",
      `latest.json on ${store.repo} points at ${ptr.path_in_repo} (step ${ptr.step}) but the repo holds no files there; refusing to resume from a pointer to nothing`,
    );
  }
  if (ptr.path_in_repo === FINAL_DIR) {
    o.log(`resume auto: latest.json points at final (step ${ptr.step}): the run is complete`);
    return { kind: "complete", pointer: ptr };
  }
  return bringDown(store, ptr, pointed, o);
}

/** R2: latest.json, or null when it (or the repo) is missing; any other failure refuses. */
async function readPointerOrMissing(store: HubClient): Promise<Pointer | null> {
  try {
    return await store.readPointer();
  } catch (e) {
    if (isRepoMissing(e)) return null; // confirmed by the listing of resumeWithoutPointer, never taken on its own
    throw new UserError(
      "R2",
      `--resume auto could not read latest.json on ${store.repo}: ${describeHubError(e)}. A failed lookup is never "nothing there", so this run refuses rather than start from step 0; fix the token, network or Hub and retry`,
    );
  }
}

/**
 * R2, R5: a missing pointer is a fact only if nothing was ever pushed: list the repo before believing
 * it. The newest checkpoint that proves complete against its manifest restores the pointer.
 */
async function resumeWithoutPointer(store: HubClient, o: AutoResumeOptions): Promise<AutoResume> {
  const repo = store.repo;
  let listed: RemoteFile[];
  try {
    listed = await store.list(undefined, { hashRegular: false });
  } catch (e) {
    if (isRepoMissing(e)) return startFresh(`${repo} does not exist yet: nothing has ever been pushed`, o);
    throw new UserError(
      "R2",
      `--resume auto found no latest.json on ${repo}, and listing the repo to confirm that nothing was pushed failed: ${describeHubError(e)}. Refusing to start from step 0; retry when the Hub answers`,
    );
  }
  const steps = checkpointSteps(listed);
  const hasFinal = listed.some((f) => f.path.startsWith(`${FINAL_DIR}/`));
  for (const n of [...steps].reverse()) {
    const proof = await proveCheckpoint(store, n, null).catch((e) => ({
      ok: false as const,
      noManifest: false,
      reason: `checking it failed: ${describeHubError(e)}`,
    }));
    if (proof.ok) {
      await rollForward(store, null, proof.pointer, proof.files, o.log);
      return resolveAutoResume(store, o);
    }
    o.log(`resume auto: ${checkpointRepoPath(n)} cannot restore the missing pointer: ${proof.reason}`);
  }
  if (steps.length || hasFinal) {
    const found = [...steps.map(checkpointRepoPath), ...(hasFinal ? [FINAL_DIR] : [])];
    const local = o.localRoots?.length ? listCheckpointFolders(o.localRoots[0]) : [];
    const why = `--resume auto found no latest.json on ${repo}, but the repo holds ${found.length} checkpoint folder(s) (${found.slice(-3).join(", ")}). The pointer is missing, not the run, and none of them proves complete against a manifest: refusing to start from step 0. `;
    throw local.length
      ? new UserError("R2", `${why}Resume from the newest local copy: run `, {
          ways: [{ changes: [["--resume", local[local.length - 1].dir]] }],
          after: "; or start the run over in a new --hub-repo",
        })
      : new UserError(
          "R2",
          `${why}Resume from a local copy (--resume <folder>), or start the run over in a new --hub-repo`,
        );
  }
  return startFresh(`no latest.json and no checkpoints on ${repo}`, o);
}

function startFresh(reason: string, o: AutoResumeOptions): AutoResume {
  o.log(`resume auto: ${reason} -> starting from step 0`);
  return { kind: "fresh", reason };
}

/** R3: the whole repo's listing (retried once after retryDelayMs), without which the pointer cannot be proven newest. */
async function listForNewest(store: HubClient, ptr: Pointer, o: AutoResumeOptions): Promise<RemoteFile[]> {
  let lastErr: unknown = null;
  for (let attempt = 1; attempt <= 2; attempt++) {
    try {
      return await store.list(undefined, { hashRegular: false });
    } catch (e) {
      lastErr = e;
      o.log(`resume auto: checkpoint scan attempt ${attempt} failed: ${describeHubError(e).slice(0, 200)}`);
      if (attempt === 1) await new Promise((r) => setTimeout(r, o.retryDelayMs ?? 15_000));
    }
  }
  throw new UserError(
    "R3",
    `--resume auto could not enumerate ${store.repo} (${describeHubError(lastErr)}), so it cannot prove latest.json (step ${ptr.step}) is the newest state. Refusing; retry when the Hub answers`,
  );
}

/**
 * R5: a checkpoint newer than the pointer that proves complete against its manifest is rolled forward
 * onto (true); one that does not is reported and ignored (the run overwrites it when it commits that
 * step again); one without a manifest cannot be judged and is refused (R3) unless ignoreUnproven.
 */
async function rolledOntoNewer(
  store: HubClient,
  ptr: Pointer,
  steps: number[],
  o: AutoResumeOptions,
): Promise<boolean> {
  const repo = store.repo;
  for (const n of steps.filter((x) => x > ptr.step).reverse()) {
    let proof: Proof;
    try {
      proof = await proveCheckpoint(store, n, ptr);
    } catch (e) {
      throw new UserError(
        "R3",
        `--resume auto could not check ${checkpointRepoPath(n)} on ${repo}, newer than latest.json (step ${ptr.step}): ${describeHubError(e)}. Refusing rather than guess; retry when the Hub answers`,
      );
    }
    if (proof.ok) {
      await rollForward(store, ptr, proof.pointer, proof.files, o.log);
      return true;
    }
    if (proof.noManifest && !o.ignoreUnproven) {
      throw new UserError(
        "R3",
        `latest.json on ${repo} points at step ${ptr.step} (${ptr.path_in_repo}) but the repo also holds ${checkpointRepoPath(n)}, which has no ${MANIFEST_FILE} to prove it complete: the pointer is behind the run, or that folder is not this run's. Refusing to guess. To resume from latest.json's step ${ptr.step} and let this run overwrite ${checkpointRepoPath(n)} when it gets there, run `,
        { ways: [{ changes: [["--resume-ignore-unproven", true]] }] },
      );
    }
    o.log(
      `resume auto: ignoring ${checkpointRepoPath(n)} (newer than latest.json's step ${ptr.step}): ${proof.reason}; resuming from the pointer, and the next commit of step ${n} overwrites that folder (R5)`,
    );
  }
  return false;
}

/** R6 then R4: reuse a local copy equal to the Hub's, else download the pointed folder; then check the weights. */
async function bringDown(
  store: HubClient,
  ptr: Pointer,
  pointed: RemoteFile[],
  o: AutoResumeOptions,
): Promise<AutoResume> {
  o.log(`auto-resume: hub says step ${ptr.step} at ${ptr.path_in_repo}`);
  const local = await equalLocalCopy(ptr, pointed, o);
  if (local !== null) return checkWeights(store, ptr, local, o.log);
  const dir = path.join(o.destDir, path.basename(ptr.path_in_repo));
  await fsp.rm(dir, { recursive: true, force: true });
  let got: { files: number; bytes: number; seconds: number };
  try {
    got = await store.downloadFolder(ptr.path_in_repo, dir, { progress: o.log });
  } catch (e) {
    throw new UserError(
      "R4",
      `--resume auto could not download ${ptr.path_in_repo} from ${store.repo}: ${describeHubError(e)}. Refusing to resume from a partial checkpoint; retry`,
    );
  }
  o.log(`downloaded ${got.files} files, ${(got.bytes / 1e6).toFixed(1)} MB in ${got.seconds.toFixed(1)}s`);
  if (got.bytes < (o.minBytes ?? 0)) {
    throw new UserError(
      "R4",
      `auto-resume downloaded ${got.bytes} bytes for ${ptr.path_in_repo}, under the ${o.minBytes} bytes a real checkpoint holds: not real weights. Refusing`,
    );
  }
  return checkWeights(store, ptr, dir, o.log);
}

/** R6: the first <local root>/<basename of the pointed path> that equals the Hub's copy, or null. */
async function equalLocalCopy(ptr: Pointer, pointed: RemoteFile[], o: AutoResumeOptions): Promise<string | null> {
  for (const cand of (o.localRoots ?? []).map((r) => path.join(r, path.basename(ptr.path_in_repo)))) {
    if (!fs.existsSync(cand)) continue;
    let why: string | null;
    try {
      why = await sameAsHub(cand, pointed, ptr.path_in_repo);
    } catch (e) {
      why = `reading it failed: ${(e as Error).message}`;
    }
    if (why === null) {
      o.log(
        `auto-resume: reusing the local copy ${cand}: its ${pointed.length} files match the Hub's sizes and hashes (sha256 for the weights), so nothing is downloaded (R6)`,
      );
      return cand;
    }
    o.log(`auto-resume: local ${cand} is not the Hub's copy (${why}); downloading instead`);
  }
  return null;
}

async function checkWeights(
  store: HubClient,
  ptr: Pointer,
  dir: string,
  log: (l: string) => void,
): Promise<AutoResume> {
  const repo = store.repo;
  for (const name of [MODEL_FILE, OPTIMIZER_FILE]) {
    const p = path.join(dir, name);
    if (!fs.existsSync(p)) {
      if (name === OPTIMIZER_FILE) continue; // K2 completeness is the caller's; weights are required here
      throw new UserError(
        "R4",
        `auto-resume downloaded ${ptr.path_in_repo} from ${repo} but it has no ${name}: not real weights. Refusing`,
      );
    }
    try {
      await checkSafetensorsFile(p);
    } catch (e) {
      throw new UserError(
        "R4",
        `auto-resume downloaded ${ptr.path_in_repo} from ${repo} but ${name} is not real weights: ${(e as Error).message}. Refusing`,
      );
    }
  }
  const priorLoss = priorLossOf(dir);
  log(`prior loss at resume: ${priorLoss ?? "unknown"} -- loss continuity is judged against this number`);
  return { kind: "checkpoint", pointer: ptr, dir, priorLoss };
}
