/**
 * The coordinator's side of the uploader (A3), one behaviour per test: what it hears of each checkpoint handed to
 * the uploader (a publication or the failure that stops publishing, passed to `onEvent` and to the checkpoint that
 * waits for it), a runtime started without `onEvent`, and the uploader after `close`. No rank is started (the
 * checkpoint capture reads the shared buffers, which need none); the Hub is the real local Hub.
 * The capture itself (weights and moments of the step it is taken at) is in train.coordinator.test.ts.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as path from "node:path";
import { Coordinator } from "../src/actors/coordinator";
import type { UploaderEvent } from "../src/actors/protocol";
import { checkpointDocs, checkpointRepoPath, type TrainerState } from "../src/checkpoint";
import { buildConfig } from "../src/model/llama-config";
import { writeSyntheticMix } from "./helpers/mix";
import { startTestHub } from "./helpers/hub";
import { tmpDir } from "./helpers/tmp";

const mix = writeSyntheticMix({ vocab: 64, trainTokens: 4 * 1024, valTokens: 256 });
const model = buildConfig({ seqLen: 16, layers: 1, hidden: 36, vocabSize: 64 });

function create(): Coordinator {
  return Coordinator.create({
    world: 1,
    model,
    gradCkpt: true,
    activationBudgetBytes: 0,
    backend: "wasm",
    fault: null,
    data: { root: mix.root, seqLen: 16, dataSeed: 3, microBatch: 2, accum: 1, nVal: 0 },
  });
}

function job(runDir: string, step: number, publish: boolean) {
  const trainerState: TrainerState = {
    format: "tstrain-trainer-state/1",
    step,
    opt_steps: step,
    skipped_steps: 0,
    scaler: { scale: 65536, growthTracker: 0 },
    lr_shape: { warmup: 0, decayStart: 0, total: 10 },
    seqs_per_step: 2,
    log_history: [],
  };
  return {
    step,
    dir: path.join(runDir, "ckpt", `checkpoint-${step}`),
    docs: checkpointDocs({ trainerState, cursor: { step }, hfConfig: { model_type: "llama" }, runConfig: {} }),
    publish: publish
      ? {
          pathInRepo: checkpointRepoPath(step),
          loss: 3,
          pointer: {
            path_in_repo: checkpointRepoPath(step),
            step,
            samples_consumed: 2 * step,
            tokens_consumed: 32 * step,
            fingerprint: "f".repeat(64),
            seed: 3,
          },
        }
      : null,
  };
}

const local = (runDir: string) => ({ hub: null, prune: false, minFreeGb: 0, keepLocal: 5, runDir });

test("a checkpoint staged with stageWrite, as the session loop stages them, is reported to onEvent once the uploader has it (A3, K6)", {
  timeout: 120_000,
}, async () => {
  const runDir = tmpDir("coord-upl-write");
  const c = create();
  try {
    const events: UploaderEvent[] = [];
    await c.startUploader(local(runDir), (e) => events.push(e));
    const w = await c.stageWrite(job(runDir, 3, false));
    assert.equal(w.step, 3);
    const d = await c.drainUploads();
    assert.deepEqual(
      d.outcomes.map((o) => o.step),
      [3],
    );
    assert.deepEqual(
      events.map((e) => (e.type === "published" ? e.outcome.step : e.type)),
      [3],
      "onEvent heard the checkpoint no stageCheckpoint waits for",
    );
    // And a checkpoint that is waited for still gets its outcome after that.
    const o = await c.stageCheckpoint(job(runDir, 4, false));
    assert.equal(o.step, 4);
    assert.deepEqual(
      events.map((e) => (e.type === "published" ? e.outcome.step : e.type)),
      [3, 4],
    );
  } finally {
    await c.close();
  }
});

test("an uploader started without onEvent still completes every checkpoint (A3)", { timeout: 120_000 }, async () => {
  const runDir = tmpDir("coord-upl-noevent");
  const c = create();
  try {
    await c.startUploader(local(runDir));
    for (const step of [1, 2]) assert.equal((await c.stageCheckpoint(job(runDir, step, false))).step, step);
    assert.deepEqual(
      (await c.drainUploads()).outcomes.map((o) => o.step),
      [1, 2],
    );
  } finally {
    await c.close();
  }
});

test("a publication that fails for good rejects the checkpoint waiting on it with the uploader's error (name, message, rule), and onEvent hears the failure (K3, K6, A3)", {
  timeout: 120_000,
}, async () => {
  const th = await startTestHub();
  const runDir = tmpDir("coord-upl-fail");
  const c = create();
  try {
    await th.store().ensureRepo();
    th.hub.setFaults({ status: { commit: 403 } }); // a permanent error: no retry (K6)
    const events: UploaderEvent[] = [];
    await c.startUploader(
      {
        ...local(runDir),
        hub: { hubUrl: th.url, repo: "tester/run", repoType: "dataset", timeoutMs: 10_000 },
        hubRetryMs: 60_000,
      },
      (e) => events.push(e),
    );
    const e = await c.stageCheckpoint(job(runDir, 1, true)).then(
      () => assert.fail("the checkpoint was published"),
      (x: unknown) => x as Error & { rule?: string },
    );
    assert.equal(events.length, 1);
    const ev = events[0];
    assert.ok(ev.type === "failed", `a failure event, not ${JSON.stringify(ev)}`);
    assert.equal(ev.step, 1);
    assert.match(ev.error.message, /HTTP 403/);
    assert.equal(ev.error.name, "CheckpointPublishError");
    assert.equal(ev.error.rule, "K3");
    assert.ok(e instanceof Error, `an Error, not ${String(e)}`);
    assert.equal(e.message, ev.error.message, "the waiting checkpoint gets the uploader's error");
    assert.equal(e.name, ev.error.name);
    assert.equal(e.rule, "K3");
    assert.equal((await c.drainUploads()).failure?.step, 1);
  } finally {
    await c.close();
    await th.close();
  }
});

test("after close the uploader can no longer be called: a drain fails at once instead of waiting on a thread that has ended (A3)", {
  timeout: 120_000,
}, async () => {
  const runDir = tmpDir("coord-upl-close");
  const c = create();
  await c.startUploader(local(runDir));
  await c.stageCheckpoint(job(runDir, 1, false));
  await c.close();
  await assert.rejects(c.drainUploads(), /released/);
});

test("closing the coordinator while a publication is being retried ends the uploader's thread: the Hub hears no more retries (A3, K6)", {
  timeout: 120_000,
}, async () => {
  const th = await startTestHub();
  const runDir = tmpDir("coord-upl-closing");
  const c = create();
  let closed = false;
  try {
    await th.store().ensureRepo();
    th.hub.setFaults({ status: { commit: 503 } }); // transient: retried with backoff for hubRetryMs (K6)
    const failedCommits = () => th.hub.requests.filter((r) => r.path.includes("/commit/") && r.status === 503).length;
    await c.startUploader({
      ...local(runDir),
      hub: { hubUrl: th.url, repo: "tester/run", repoType: "dataset", timeoutMs: 10_000 },
      hubRetryMs: 600_000,
      backoff: { baseMs: 10, capMs: 20 },
    });
    await c.stageWrite(job(runDir, 1, true));
    while (failedCommits() < 3) await new Promise((r) => setTimeout(r, 10)); // the uploader is retrying
    await c.close();
    closed = true;
    const n = failedCommits();
    // A live uploader would retry every 10-20 ms; give it a second. At most the request in flight at close is logged late.
    await new Promise((r) => setTimeout(r, 1000));
    assert.ok(failedCommits() <= n + 1, `${failedCommits() - n} commit attempts after close`);
  } finally {
    if (!closed) await c.close();
    await th.close();
  }
});
