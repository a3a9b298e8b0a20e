/**
 * Uploader actor (A3): rank 0's checkpoint writer and the only thing that talks to the Hub during
 * training. It works from the staging copy the coordinator snapshotted at a step boundary, so the
 * ranks keep training while it writes, uploads, verifies, moves the pointer and prunes (B3, K3).
 * Exposed over comlink: the coordinator awaits `checkpoint(job)` without blocking the step loop.
 */
import { parentPort } from "node:worker_threads";
import * as fs from "node:fs";
import * as os from "node:os";
import * as Comlink from "comlink";
import nodeEndpoint from "comlink/dist/umd/node-adapter";
import { stagingView, STAGE_M, STAGE_PARAMS, STAGE_V } from "./shm";
import { writeCheckpointFolder, listCheckpointFolders } from "../checkpoint";
import { createHubStore, type HubStore } from "../hub/store";
import { publishCheckpoint } from "../hub/cycle";
import type { CheckpointJob, CheckpointOutcome, UploaderApi, UploaderInit } from "./protocol";
import * as path from "node:path";

let opts: UploaderInit | null = null;
let store: HubStore | null = null;

function log(line: string): void {
  // One line per event, on the run's stdout (the coordinator's process).
  process.stdout.write(line + "\n");
}

/** K1: keep at most `keepLocal` checkpoint folders besides `current`, oldest removed first. */
function pruneOldLocal(runDir: string, current: string, keepLocal: number): void {
  const all = listCheckpointFolders(path.join(runDir, "ckpt")).filter((c) => c.dir !== current);
  const excess = all.length - keepLocal;
  for (let i = 0; i < excess; i++) fs.rmSync(all[i]!.dir, { recursive: true, force: true });
}

const api: UploaderApi = {
  async init(o: UploaderInit): Promise<void> {
    opts = o;
    // B3: the uploader's hashing, encoding and I/O must not take CPU from the ranks. On Linux a
    // thread is a task, and setpriority(PRIO_PROCESS, 0) applies to the calling thread only, so this
    // lowers this thread alone to nice 19; elsewhere it may apply to the process, so skip it there.
    if (process.platform === "linux") {
      try { os.setPriority(0, 19); } catch { /* not permitted: run at normal priority */ }
    }
    store = o.hub ? createHubStore({ hubUrl: o.hub.hubUrl, repo: o.hub.repo, repoType: o.hub.repoType }) : null;
  },

  async checkpoint(job: CheckpointJob): Promise<CheckpointOutcome> {
    if (!opts) throw new Error("uploader used before init");
    const t0 = performance.now();
    writeCheckpointFolder(
      job.dir, job.model,
      stagingView(job.staging, job.P, STAGE_PARAMS), stagingView(job.staging, job.P, STAGE_M), stagingView(job.staging, job.P, STAGE_V),
      job.docs,
    );
    const writeSeconds = (performance.now() - t0) / 1000;
    let published: CheckpointOutcome["published"] = null;
    if (job.publish && store) {
      published = await publishCheckpoint(store, {
        localDir: job.dir, pathInRepo: job.publish.pathInRepo, pointer: job.publish.pointer,
        prune: opts.prune, minFreeGb: opts.minFreeGb, log, loss: job.publish.loss,
      });
    } else {
      log(`CKPT ${job.step} local=${job.dir} write=${writeSeconds.toFixed(1)}s hub=none`);
    }
    // Older local copies go only after the new one is complete (and, with a Hub, verified).
    pruneOldLocal(opts.runDir, job.dir, opts.keepLocal);
    return { step: job.step, dir: job.dir, writeSeconds, published };
  },
};

Comlink.expose(api, nodeEndpoint(parentPort!));
