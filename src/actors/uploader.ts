/**
 * Uploader actor (A3): rank 0's checkpoint writer and the only thing that talks to the Hub during
 * training. It works from the staging copy the coordinator snapshotted at a step boundary, so the
 * ranks keep training while it writes, uploads, verifies, moves the pointer and prunes (B3, K3).
 * Exposed over comlink.
 *
 * `write(job)` returns as soon as the folder is on disk (the staging copy is free again); the
 * publication runs behind it. While the Hub is healthy a write first waits for the publication in
 * flight, so every checkpoint is published. Transient Hub failures are retried with backoff while training goes
 * on (K6). When a newer checkpoint is written while an older one is still failing to publish, the
 * older one is abandoned (its local folder removed: the newer one holds everything it did) and the
 * newer one is published instead. Publishing stops for good only when a checkpoint has been failing
 * for `hubRetryMs`, when the Hub answers with a permanent error (401/403, 404, 412, a second
 * verification mismatch), or when the backlog of unpublished checkpoints would not fit on disk.
 */
import { parentPort } from "node:worker_threads";
import * as fs from "node:fs";
import * as Comlink from "comlink";
import nodeEndpoint from "comlink/dist/umd/node-adapter";
import { stagingView, STAGE_M, STAGE_PARAMS, STAGE_V } from "./shm";
import { checkpointRoot, listCheckpointFolders, saveCheckpoint } from "../checkpoint";
import { createHubClient, type HubClient } from "../hub/client";
import { freeBytes, publishCheckpoint } from "../hub/cycle";
import {
  toWireError,
  type CheckpointJob,
  type CheckpointOutcome,
  type UploaderApi,
  type UploaderEvent,
  type UploaderInit,
  type WriteOutcome,
  type DrainResult,
} from "./protocol";
import * as path from "node:path";

let opts: UploaderInit | null = null;
let store: HubClient | null = null;
let emit: (e: UploaderEvent) => void = () => undefined;

/** The newest written, not yet published checkpoint, and the one being published now. */
let pending: CheckpointJob | null = null;
let publishing: CheckpointJob | null = null;
let loop: Promise<void> | null = null;
let fatal: (Error & { rule?: string }) | null = null;
let failure: DrainResult["failure"] = null;
const outcomes: CheckpointOutcome[] = [];
/** Steps whose local copy is verified on the Hub. */
const published = new Set<number>();
const clock = { failingSince: null as number | null };

function log(line: string): void {
  // One line per event, on the run's stdout (the coordinator's process).
  process.stdout.write(`${line}\n`);
}

/**
 * K1: keep at most `keepLocal` checkpoint folders besides `current` and the ones still to publish (the pending one and
 * the one publishing), oldest removed first.
 */
function pruneOldLocal(runDir: string, current: string, keepLocal: number): void {
  const keep = new Set([current, pending?.dir, publishing?.dir].filter((x): x is string => !!x));
  const all = listCheckpointFolders(checkpointRoot(runDir)).filter((c) => !keep.has(c.dir));
  const excess = all.length - keepLocal;
  for (let i = 0; i < excess; i++) fs.rmSync(all[i].dir, { recursive: true, force: true });
}

async function publishLoop(): Promise<void> {
  while (pending && !fatal) {
    const job = pending;
    pending = null;
    publishing = job;
    try {
      const res = await publishCheckpoint(store!, {
        localDir: job.dir,
        pathInRepo: job.publish!.pathInRepo,
        pointer: job.publish!.pointer,
        prune: opts!.prune,
        minFreeGb: opts!.minFreeGb,
        log,
        loss: job.publish!.loss,
        giveUpMs: opts!.hubRetryMs ?? 30 * 60_000,
        clock,
        backoff: opts!.backoff,
        abandon: () => (pending ? `checkpoint ${pending.step} is written and supersedes it` : null),
      });
      published.add(job.step);
      publishing = null;
      pruneOldLocal(opts!.runDir, job.dir, opts!.keepLocal);
      const outcome: CheckpointOutcome = { step: job.step, dir: job.dir, writeSeconds: 0, published: res };
      outcomes.push(outcome);
      emit({ type: "published", outcome });
    } catch (e) {
      publishing = null;
      if ((e as Error)?.name === "RetryAbandoned") {
        log(
          `hub: checkpoint ${job.step} abandoned unpublished (${(e as Error).message}); its local copy ${job.dir} is removed (K6)`,
        );
        fs.rmSync(job.dir, { recursive: true, force: true });
        continue;
      }
      fatal = e as Error;
      failure = { step: job.step, error: toWireError(e) };
      emit({ type: "failed", ...failure });
    }
  }
}

const api: UploaderApi = {
  async init(o: UploaderInit, onEvent: (e: UploaderEvent) => void): Promise<void> {
    opts = o;
    emit = onEvent;
    for (const st of o.verifiedLocal ?? []) published.add(st);
    // The uploader runs at the process's own priority. It used to renice itself to 19 so its hashing
    // could not take CPU from the ranks; on a loaded machine that starved it (an upload took 55 s
    // instead of 4 s, and requests timed out), and its CPU use is small next to a training step.
    store = o.hub
      ? createHubClient({
          hubUrl: o.hub.hubUrl,
          repo: o.hub.repo,
          repoType: o.hub.repoType,
          timeoutMs: o.hub.timeoutMs,
        })
      : null;
    if (store) await store.followHead(o.head);
  },

  async write(job: CheckpointJob): Promise<WriteOutcome> {
    if (!opts) throw new Error("uploader used before init");
    if (fatal) throw fatal;
    // While the Hub is healthy every checkpoint is published (K1): the next one waits for the one in
    // flight, as before. Only while publishing is failing (K6) does the newer one go ahead and supersede it.
    while (publishing && clock.failingSince === null && !fatal) {
      await Promise.race([loop, new Promise((r) => setTimeout(r, 200))]);
    }
    if (fatal) throw fatal;
    const backlog = [publishing, pending].filter((j): j is CheckpointJob => j !== null);
    const free = await freeBytes(job.dir).catch(() => Infinity);
    if (free < (opts.checkpointBytes ?? 0)) {
      if (backlog.length && store) {
        // K6: the unpublished backlog would not fit: stop rather than fill the disk.
        const e = Object.assign(
          new Error(
            `checkpoint ${job.step} needs about ${((opts.checkpointBytes ?? 0) / 1e6).toFixed(1)} MB under ${path.dirname(job.dir)} but ${(free / 1e6).toFixed(1)} MB are free, ` +
              `and checkpoint ${backlog.map((j) => j.step).join(", ")} is not published yet (the Hub has been failing): the backlog of unpublished checkpoints would exceed the disk [K6]`,
          ),
          { name: "UserError", rule: "K6" },
        );
        fatal = e;
        failure = { step: job.step, error: toWireError(e) };
        throw e;
      }
      if (opts.prune) {
        // --prune: local copies already verified on the Hub can be fetched again; make room with them first.
        for (const c of listCheckpointFolders(checkpointRoot(opts.runDir))) {
          if (c.dir === job.dir || !published.has(c.step)) continue;
          fs.rmSync(c.dir, { recursive: true, force: true });
          log(
            `disk: removed local ${path.basename(c.dir)} (verified on the Hub) to make room for checkpoint ${job.step} (--prune)`,
          );
        }
      }
    }
    const t0 = performance.now();
    saveCheckpoint(
      job.dir,
      job.model,
      {
        params: stagingView(job.staging, job.P, STAGE_PARAMS),
        m: stagingView(job.staging, job.P, STAGE_M),
        v: stagingView(job.staging, job.P, STAGE_V),
      },
      job.docs,
    );
    const writeSeconds = (performance.now() - t0) / 1000;
    if (job.publish && store) {
      if (pending) {
        log(
          `hub: checkpoint ${pending.step} was never published and checkpoint ${job.step} supersedes it; its local copy is removed (K6)`,
        );
        fs.rmSync(pending.dir, { recursive: true, force: true });
      }
      pending = job;
      if (!publishing) loop = publishLoop();
    } else {
      log(`CKPT ${job.step} local=${job.dir} write=${writeSeconds.toFixed(1)}s hub=none`);
      pruneOldLocal(opts.runDir, job.dir, opts.keepLocal);
      const outcome: CheckpointOutcome = { step: job.step, dir: job.dir, writeSeconds, published: null };
      outcomes.push(outcome);
      emit({ type: "published", outcome });
    }
    return { step: job.step, dir: job.dir, writeSeconds };
  },

  async drain(): Promise<DrainResult> {
    while (loop) {
      const l = loop;
      await l;
      if (loop === l) loop = null;
    }
    return { head: store?.knownHead ?? null, outcomes: [...outcomes], failure };
  },
};

Comlink.expose(api, nodeEndpoint(parentPort!));
