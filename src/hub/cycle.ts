/**
 * The K3 checkpoint cycle, as one library call the uploader actor makes from its worker thread:
 *
 *   upload (one commit) → verify against the Hub → write latest.json + read it back → prune
 *
 * Each stage runs only if the one before it succeeded. Whatever fails, the local copy is kept and the
 * pointer is not moved past unverified bytes (K4, B2): a pointer rolled onto bytes nobody checked,
 * with the local copy then deleted, is a run that cannot be resumed and does not know it.
 */
import * as fs from "node:fs";
import * as fsp from "node:fs/promises";
import * as path from "node:path";
import { createHash } from "node:crypto";
import type { HubClient, Pointer, RemoteFile } from "./client";
import { walkFiles } from "./client";
import { CheckpointPublishError, CheckpointVerifyError, describeHubError, type VerifyReport } from "./hub-errors";
import { isTransient, withRetry, RetryExhausted, type RetryOptions } from "./retry";

export interface PublishResult {
  step: number;
  pathInRepo: string;
  ok: boolean;
  verify: VerifyReport;
  pushVerifySeconds: number;
  /** Seconds spent in the upload stage and in verification (retries and waits included), for the report. */
  uploadSeconds: number;
  verifySeconds: number;
  /** Failed attempts that were retried, over every stage (K6). */
  retries: number;
  pruned: boolean;
  pruneReason: string | null;
  freeGb: number;
}

export interface PublishOptions {
  localDir: string;
  pathInRepo: string;
  pointer: Pointer;
  /** Delete the local copy once the Hub copy is verified and the pointer moved (--prune). */
  prune: boolean;
  /** Prune only if free disk (after the deletion) stays at or above this many GB. */
  minFreeGb: number;
  log: (line: string) => void;
  /** Last training loss, for the CKPT line. */
  loss?: number | null;
  /** Commit message; default "checkpoint step N". */
  message?: string;
  /** K6: transient Hub failures are retried until this stage has been failing this long. Default 30 min. */
  giveUpMs?: number;
  /** K6: the failure clock, shared across checkpoints by the uploader (null = not failing). */
  clock?: { failingSince: number | null };
  /** K6: asked between retries; a reason abandons this checkpoint (a newer one is waiting). */
  abandon?: () => string | null;
  /** Backoff base and cap in ms (tests shorten them). */
  backoff?: { baseMs: number; capMs: number };
  /** Free bytes on the filesystem holding a path; default freeBytes (tests pin the disk guard to the byte). */
  diskFree?: (p: string) => Promise<number>;
}

const GB = 1e9;

interface LocalFile {
  rel: string;
  size: number;
  sha256: string;
}

async function sha256File(p: string): Promise<string> {
  const h = createHash("sha256");
  for await (const c of fs.createReadStream(p)) h.update(c as Buffer);
  return h.digest("hex");
}

async function localInventory(dir: string): Promise<LocalFile[]> {
  const rels = await walkFiles(dir);
  const out: LocalFile[] = [];
  for (const rel of rels) {
    const p = path.join(dir, ...rel.split("/"));
    out.push({ rel, size: (await fsp.stat(p)).size, sha256: await sha256File(p) });
  }
  return out;
}

async function dirBytes(dir: string): Promise<number> {
  let n = 0;
  for (const rel of await walkFiles(dir)) n += (await fsp.stat(path.join(dir, ...rel.split("/")))).size;
  return n;
}

/** Free bytes on the filesystem holding p (or its nearest existing parent). */
export async function freeBytes(p: string): Promise<number> {
  let q = path.resolve(p);
  for (;;) {
    try {
      const s = await fsp.statfs(q);
      return s.bavail * s.bsize;
    } catch (e) {
      const parent = path.dirname(q);
      if (parent === q) throw e;
      q = parent;
    }
  }
}

const round1 = (x: number) => Math.round(x * 10) / 10;

/**
 * Compares the local folder with what the Hub lists under pathInRepo, and reads one file back.
 * The read-back file is cursor.json when present (the run's identity), else the smallest file.
 */
export async function verifyRemote(
  store: HubClient,
  local: LocalFile[],
  pathInRepo: string,
): Promise<VerifyReport & { detail: string[] }> {
  const remote: RemoteFile[] = await store.list(pathInRepo);
  const byPath = new Map(remote.map((f) => [f.path, f]));
  const missing: string[] = [];
  const mismatch: string[] = [];
  const detail: string[] = [];
  for (const f of local) {
    const rp = `${pathInRepo}/${f.rel}`;
    const r = byPath.get(rp);
    if (!r) {
      missing.push(rp);
      continue;
    }
    byPath.delete(rp);
    if (r.size !== f.size) {
      mismatch.push(rp);
      detail.push(`${rp}: ${r.size} bytes on the Hub, ${f.size} locally`);
    } else if (r.sha256 !== f.sha256) {
      mismatch.push(rp);
      detail.push(`${rp}: sha256 ${r.sha256 ?? "unknown"} on the Hub, ${f.sha256} locally`);
    }
  }
  const extra = [...byPath.keys()].sort();
  let readbackOk = false;
  const pick = local.find((f) => f.rel === "cursor.json") ?? [...local].sort((a, b) => a.size - b.size)[0];
  if (pick) {
    const rp = `${pathInRepo}/${pick.rel}`;
    try {
      const b = await store.download(rp);
      if (b === null) detail.push(`read-back of ${rp}: not found`);
      else {
        const got = createHash("sha256").update(b).digest("hex");
        readbackOk = got === pick.sha256 && b.length === pick.size;
        if (!readbackOk)
          detail.push(
            `read-back of ${rp}: ${b.length} bytes, sha256 ${got}; local has ${pick.size} bytes, sha256 ${pick.sha256}`,
          );
      }
    } catch (e) {
      if (isTransient(e)) throw e; // a network failure proves nothing about the bytes: retried (K6)
      detail.push(`read-back of ${rp} failed: ${describeHubError(e)}`);
    }
  }
  return { missing, mismatch, extra, readbackOk, detail };
}

function ckptLine(kind: string, r: PublishResult, pointer: Pointer, loss: number | null | undefined): string {
  return (
    `${kind} ${r.step} samples=${pointer.samples_consumed.toLocaleString("en-US")} push+verify=${r.pushVerifySeconds.toFixed(1)}s ` +
    `ok=${r.ok} pruned=${r.pruned} free=${r.freeGb.toFixed(1)}GB loss=${loss ?? "n/a"}${r.pruneReason ? ` (${r.pruneReason})` : ""}`
  );
}

/** One publish in progress: its options, the result it fills in, and how a stage retries and fails. */
interface Publishing {
  store: HubClient;
  o: PublishOptions;
  kind: "CKPT" | "FINAL";
  step: number;
  /** repo/pathInRepo, for messages. */
  where: string;
  /** What every refusal says about the local copy and the pointer. */
  kept: string;
  t0: number;
  result: PublishResult;
  clock: { failingSince: number | null };
  /** o.diskFree, or freeBytes. */
  diskFree: (p: string) => Promise<number>;
  retry(what: string): RetryOptions;
  /** Logs the failed CKPT/FINAL line and throws e. */
  fail(e: Error): Promise<never>;
}

function startPublishing(store: HubClient, o: PublishOptions, kind: "CKPT" | "FINAL"): Publishing {
  if (o.pointer.path_in_repo !== o.pathInRepo) {
    throw new TypeError(
      `publish: pointer.path_in_repo ${JSON.stringify(o.pointer.path_in_repo)} differs from pathInRepo ${JSON.stringify(o.pathInRepo)}`,
    );
  }
  if (!(o.minFreeGb >= 0)) throw new TypeError(`publish: minFreeGb must be >= 0, got ${o.minFreeGb}`);
  const step = o.pointer.step;
  const t0 = performance.now();
  const result: PublishResult = {
    step,
    pathInRepo: o.pathInRepo,
    ok: false,
    verify: { missing: [], mismatch: [], extra: [], readbackOk: false },
    pushVerifySeconds: 0,
    uploadSeconds: 0,
    verifySeconds: 0,
    retries: 0,
    pruned: false,
    pruneReason: null,
    freeGb: 0,
  };
  const clock = o.clock ?? { failingSince: null };
  const diskFree = o.diskFree ?? freeBytes;
  return {
    store,
    o,
    kind,
    step,
    t0,
    result,
    clock,
    diskFree,
    where: `${store.repo}/${o.pathInRepo}`,
    kept: `The local copy at ${o.localDir} is kept and latest.json was not moved.`,
    retry: (what) => ({
      what,
      log: (line) => {
        result.retries++;
        o.log(line);
      },
      giveUpMs: o.giveUpMs ?? 30 * 60_000,
      abandon: o.abandon,
      since: () => clock.failingSince,
      onFirstFailure: (t) => {
        if (clock.failingSince === null) clock.failingSince = t;
      },
      baseMs: o.backoff?.baseMs,
      capMs: o.backoff?.capMs,
    }),
    fail: async (e) => {
      result.pushVerifySeconds = (performance.now() - t0) / 1000;
      result.pruneReason = "not pruned: the checkpoint was not published";
      result.freeGb = round1((await diskFree(o.localDir).catch(() => 0)) / GB);
      o.log(ckptLine(kind, result, o.pointer, o.loss));
      throw e;
    },
  };
}

const retryReason = (e: unknown): string => (e instanceof RetryExhausted ? e.message : describeHubError(e));

/** A stage failed: another writer (K8) or an abandoned checkpoint (K6) passes through as it is; anything else becomes wrap(). */
async function stageFailed(p: Publishing, e: unknown, wrap: () => Error): Promise<never> {
  const name = (e as { name?: string } | null)?.name;
  if (name === "ConcurrentWriterError" || name === "RetryAbandoned") {
    await p.fail(e as Error).catch(() => undefined);
    throw e;
  }
  return p.fail(wrap());
}

async function readLocalCopy(p: Publishing): Promise<LocalFile[]> {
  const { o } = p;
  try {
    const local = await localInventory(o.localDir);
    if (local.length === 0) throw new Error(`${o.localDir} holds no files`);
    return local;
  } catch (e) {
    return p.fail(
      new CheckpointPublishError(
        `checkpoint ${p.step}: reading the local copy at ${o.localDir} failed: ${describeHubError(e)}. ${p.kept}`,
        "upload",
        o.pathInRepo,
        o.localDir,
      ),
    );
  }
}

/**
 * 1. upload: one commit for the whole folder; 2. verify against the Hub (every file present, sizes and
 * sha256 equal, nothing extra, one read back). Transient failures of either are retried (K6); a
 * verification mismatch is uploaded once more, and a second mismatch stops the run (K4).
 */
async function uploadAndVerify(p: Publishing, local: LocalFile[]): Promise<void> {
  const { store, o, step, kind } = p;
  for (const round of [1, 2]) {
    const tUp = performance.now();
    try {
      await withRetry(
        // K8: only a second attempt may find its own earlier attempt landed. Round 2's first attempt names the
        // head round 1's (answered) commit made, so a 412 there is another writer's, identical bytes or not.
        (attempt) =>
          store.uploadFolder(
            o.localDir,
            o.pathInRepo,
            o.message ?? (kind === "FINAL" ? `final export (step ${step})` : `checkpoint step ${step}`),
            { retry: attempt > 1, progress: o.log },
          ),
        p.retry(`upload of ${o.pathInRepo} (step ${step})`),
      );
    } catch (e) {
      await stageFailed(
        p,
        e,
        () =>
          new CheckpointPublishError(
            `checkpoint ${step}: upload to ${p.where} failed: ${retryReason(e)}. ${p.kept}`,
            "upload",
            o.pathInRepo,
            o.localDir,
          ),
      );
    }
    const tVerify = performance.now();
    p.result.uploadSeconds += (tVerify - tUp) / 1000;
    let v: Awaited<ReturnType<typeof verifyRemote>>;
    try {
      v = await withRetry(
        () => verifyRemote(store, local, o.pathInRepo),
        p.retry(`verification of ${o.pathInRepo} (step ${step})`),
      );
      p.result.verifySeconds += (performance.now() - tVerify) / 1000;
    } catch (e) {
      return stageFailed(
        p,
        e,
        () =>
          new CheckpointVerifyError(
            `checkpoint ${step}: could not verify ${p.where}: listing it failed (${retryReason(e)}). ${p.kept}`,
            o.pathInRepo,
            o.localDir,
            p.result.verify,
          ),
      );
    }
    p.result.verify = { missing: v.missing, mismatch: v.mismatch, extra: v.extra, readbackOk: v.readbackOk };
    if (!(v.missing.length || v.mismatch.length || v.extra.length || !v.readbackOk)) return;
    const what = verifyFindings(v);
    if (round === 1) {
      o.log(
        `hub: checkpoint ${step} did not verify at ${p.where}: ${what}; uploading it once more (K4 stops only on a second mismatch)`,
      );
      continue;
    }
    return p.fail(
      new CheckpointVerifyError(
        `checkpoint ${step} did not verify on the Hub at ${p.where}, also after one re-upload: ${what}. ${p.kept}`,
        o.pathInRepo,
        o.localDir,
        p.result.verify,
      ),
    );
  }
}

/** "missing 0, mismatched 1 [path], extra 0, read-back ok (details)". */
function verifyFindings(v: Awaited<ReturnType<typeof verifyRemote>>): string {
  const parts = [
    `missing ${v.missing.length}${v.missing.length ? ` [${v.missing.join(", ")}]` : ""}`,
    `mismatched ${v.mismatch.length}${v.mismatch.length ? ` [${v.mismatch.join(", ")}]` : ""}`,
    `extra ${v.extra.length}${v.extra.length ? ` [${v.extra.join(", ")}]` : ""}`,
    `read-back ${v.readbackOk ? "ok" : "FAILED"}`,
  ];
  return `${parts.join(", ")}${v.detail.length ? ` (${v.detail.join("; ")})` : ""}`;
}

/** 3. the pointer, read back by writePointer itself. */
async function movePointer(p: Publishing): Promise<void> {
  const { store, o, step } = p;
  try {
    await withRetry(
      (attempt) => store.writePointer(o.pointer, { retry: attempt > 1 }),
      p.retry(`write of latest.json -> ${o.pathInRepo}`),
    );
  } catch (e) {
    await stageFailed(
      p,
      e,
      () =>
        new CheckpointPublishError(
          `checkpoint ${step} is verified on the Hub at ${p.where}, but latest.json could not be moved to it: ${retryReason(e)}. ` +
            `The local copy at ${o.localDir} is kept; latest.json still points at the previous checkpoint (or could not be confirmed). ` +
            `--resume auto rolls the pointer forward onto this checkpoint, which proves complete against its manifest (R5)`,
          "pointer",
          o.pathInRepo,
          o.localDir,
        ),
    );
  }
}

/** 4. prune, only if asked and the disk guard allows (K3). */
async function pruneIfAllowed(p: Publishing): Promise<void> {
  const { o, result, diskFree } = p;
  const free = await diskFree(o.localDir);
  if (!o.prune) {
    result.pruneReason = "--prune not set";
    result.freeGb = round1(free / GB);
    return;
  }
  const after = free + (await dirBytes(o.localDir));
  if (after / GB < o.minFreeGb) {
    result.pruneReason = `kept: free disk after pruning would be ${(after / GB).toFixed(1)} GB, below the ${o.minFreeGb} GB guard (K3)`;
    result.freeGb = round1(free / GB);
    return;
  }
  await fsp.rm(o.localDir, { recursive: true, force: true });
  result.pruned = true;
  result.freeGb = round1((await diskFree(path.dirname(path.resolve(o.localDir)))) / GB);
}

/** K3: upload → verify → pointer → prune; each stage runs only if the one before it succeeded. */
async function publish(store: HubClient, o: PublishOptions, kind: "CKPT" | "FINAL"): Promise<PublishResult> {
  const p = startPublishing(store, o, kind);
  const local = await readLocalCopy(p);
  await uploadAndVerify(p, local);
  await movePointer(p);
  p.clock.failingSince = null;
  p.result.ok = true;
  p.result.pushVerifySeconds = (performance.now() - p.t0) / 1000;
  await pruneIfAllowed(p);
  o.log(ckptLine(kind, p.result, o.pointer, o.loss));
  return p.result;
}

/** K3 for ckpt/checkpoint-N: upload → verify → pointer → prune. Throws CheckpointVerifyError (K4) or
 *  CheckpointPublishError (K3); in both cases the local copy exists and the pointer was not moved. */
export function publishCheckpoint(store: HubClient, o: PublishOptions): Promise<PublishResult> {
  return publish(store, o, "CKPT");
}

/** G4: push final/ with the same verification, then roll latest.json to it. */
export function publishFinal(
  store: HubClient,
  o: Omit<PublishOptions, "prune" | "minFreeGb" | "pathInRepo"> & {
    pathInRepo?: string;
    prune?: boolean;
    minFreeGb?: number;
  },
): Promise<PublishResult> {
  const pathInRepo = o.pathInRepo ?? "final";
  return publish(store, { ...o, pathInRepo, prune: o.prune ?? false, minFreeGb: o.minFreeGb ?? 6 }, "FINAL");
}
