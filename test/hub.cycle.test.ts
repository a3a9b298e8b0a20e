// K3 / K4 / B2 / G4: the publish cycle against a real LocalHub through the real @huggingface/hub client.
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { useTestHub, writeFakeCheckpoint, pointerOf, type TestHub } from "./helpers/hub";
import { publishCheckpoint, publishFinal } from "../src/hub/cycle";
import { resolveAutoResume } from "../src/hub/resume";
import type { HubClient, Pointer } from "../src/hub/client";

let th: TestHub;
let n = 0;

useTestHub({ pageSize: 4 }, (t) => (th = t));

/** A fresh repo, one verified checkpoint at step 10 already published (the pointer's prior position). */
async function repoWithFirstCheckpoint(): Promise<{ store: HubClient; first: Pointer; lines: string[] }> {
  const store = th.store({ repo: `tester/cycle-${++n}` });
  await store.ensureRepo();
  const ck = writeFakeCheckpoint(path.join(th.tmp, `r${n}`, "checkpoint-10"), { step: 10 });
  const lines: string[] = [];
  await publishCheckpoint(store, {
    localDir: ck.dir,
    pathInRepo: ck.path_in_repo,
    pointer: pointerOf(ck),
    prune: false,
    minFreeGb: 0,
    log: (l) => lines.push(l),
  });
  return { store, first: pointerOf(ck), lines };
}

function nextCheckpoint(step = 20) {
  return writeFakeCheckpoint(path.join(th.tmp, `r${n}`, `checkpoint-${step}`), { step, loss: 2.5 });
}

async function assertKeptAndUnmoved(store: HubClient, dir: string, first: Pointer): Promise<void> {
  assert.ok(fs.existsSync(path.join(dir, "model.safetensors")), "the local copy must still exist");
  th.hub.clearFaults();
  assert.deepEqual(await store.readPointer(), first, "latest.json must still point at the previous checkpoint");
}

describe("publishCheckpoint (K3)", () => {
  /** K6 retries shortened: give up after 0.4 s of failures, backoff 20..50 ms. */
  const QUICK = { giveUpMs: 400, backoff: { baseMs: 20, capMs: 50 } };

  test("a normal publish pushes, verifies, writes the pointer and reads it back (K3, B2)", async () => {
    const { store, first, lines } = await repoWithFirstCheckpoint();
    assert.deepEqual(await store.readPointer(), first);
    const ck = nextCheckpoint();
    const out: string[] = [];
    const r = await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: false,
      minFreeGb: 0,
      log: (l) => out.push(l),
      loss: 2.5,
    });
    assert.equal(r.ok, true);
    assert.deepEqual(r.verify, { missing: [], mismatch: [], extra: [], readbackOk: true });
    assert.equal(r.step, 20);
    assert.equal(r.pruned, false);
    assert.match(r.pruneReason ?? "", /--prune not set/);
    assert.deepEqual(await store.readPointer(), pointerOf(ck));
    assert.equal(out.length, 1);
    assert.match(
      out[0],
      /^CKPT 20 samples=160 push\+verify=\d+\.\ds ok=true pruned=false free=\d+\.\dGB loss=2\.5 \(--prune not set\)$/,
    );
    assert.match(lines[0], /^CKPT 10 /);
    // The listing shows the files with sha256 — LFS oids and hashes of regular files alike.
    const files = await store.list("ckpt/checkpoint-20");
    assert.deepEqual(
      files.map((f) => f.path.split("/").pop()),
      ["config.json", "cursor.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"],
    );
    for (const f of files) assert.match(f.sha256 ?? "", /^[0-9a-f]{64}$/, `${f.path} has a sha256`);
    assert.equal(files.find((f) => f.path.endsWith("model.safetensors"))!.lfs, true);
    assert.equal(files.find((f) => f.path.endsWith("cursor.json"))!.lfs, false);
    // The LFS objects went through the batch API and the signed PUT.
    assert.ok(
      th.hub.requests.some((q) => q.method === "PUT" && q.path.startsWith("/__lfs/upload/") && q.status === 200),
    );
  });

  test("an upload that fails with 500 throws, keeps the local copy and does not move the pointer (K3)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ status: { upload: 500 } });
    const lines: string[] = [];
    await assert.rejects(
      publishCheckpoint(store, {
        localDir: ck.dir,
        pathInRepo: ck.path_in_repo,
        pointer: pointerOf(ck),
        prune: true,
        minFreeGb: 0,
        log: (l) => lines.push(l),
        ...QUICK,
      }),
      (e: Error) => {
        assert.equal(e.name, "CheckpointPublishError");
        assert.match(
          e.message,
          /checkpoint 20: upload to tester\/cycle-\d+\/ckpt\/checkpoint-20 failed: upload of ckpt\/checkpoint-20 \(step 20\) kept failing for .*--hub-retry-minutes.*last error: HTTP 500/,
        );
        assert.match(
          e.message,
          new RegExp(
            `local copy at ${ck.dir.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} is kept and latest.json was not moved`,
          ),
        );
        return true;
      },
    );
    // K6: the failed attempts were retried, one log line each, then the give-up. How many attempts fit in the
    // 400 ms limit depends on the machine's load (one, under heavy load), so only the first is required.
    const attempts = lines.filter((l) =>
      /^hub: upload of ckpt\/checkpoint-20 \(step 20\) failed \(attempt \d+: HTTP 500.*retrying in/.test(l),
    );
    assert.ok(attempts.length >= 1 && attempts.every((l, i) => l.includes(`(attempt ${i + 1}: `)), lines.join("\n"));
    assert.match(lines[lines.length - 1], /^CKPT 20 .* ok=false pruned=false/);
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("a commit that fails with 500 throws with the local copy kept and the pointer unmoved (K3)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ status: { commit: 500 } });
    await assert.rejects(
      publishCheckpoint(store, {
        localDir: ck.dir,
        pathInRepo: ck.path_in_repo,
        pointer: pointerOf(ck),
        prune: true,
        minFreeGb: 0,
        log: () => {},
        ...QUICK,
      }),
      /upload to .* failed: .*kept failing.*HTTP 500.*local copy .* is kept and latest\.json was not moved/,
    );
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("transient failures (500, 503, 429) for a few attempts are retried and the publish completes (K6)", async () => {
    const { store } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ status: { commit: 503, upload: 500, lfsBatch: 429 }, failCount: 3 });
    const lines: string[] = [];
    const r = await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: false,
      minFreeGb: 0,
      log: (l) => lines.push(l),
      ...QUICK,
      giveUpMs: 60_000,
    });
    assert.equal(r.ok, true);
    assert.equal((await store.readPointer())?.step, 20);
    assert.equal(
      lines.filter((l) => /^hub: upload of .* failed \(attempt \d: HTTP (500|503|429).*retrying in/.test(l)).length,
      3,
      lines.join("\n"),
    );
  });

  test("a permanent error (403) is not retried (K6)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ status: { commit: 403 } });
    const lines: string[] = [];
    await assert.rejects(
      publishCheckpoint(store, {
        localDir: ck.dir,
        pathInRepo: ck.path_in_repo,
        pointer: pointerOf(ck),
        prune: false,
        minFreeGb: 0,
        log: (l) => lines.push(l),
        ...QUICK,
        giveUpMs: 60_000,
      }),
      /upload to .* failed: HTTP 403/,
    );
    assert.equal(lines.filter((l) => /retrying in/.test(l)).length, 0, lines.join("\n"));
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("stored bytes corrupted by the Hub fail verification as a mismatch (K4)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ corruptOnCommit: ["checkpoint-20/model.safetensors"] });
    await assert.rejects(
      publishCheckpoint(store, {
        localDir: ck.dir,
        pathInRepo: ck.path_in_repo,
        pointer: pointerOf(ck),
        prune: true,
        minFreeGb: 0,
        log: () => {},
      }),
      (e: Error & { verify?: { mismatch: string[] } }) => {
        assert.equal(e.name, "CheckpointVerifyError");
        assert.match(
          e.message,
          /checkpoint 20 did not verify on the Hub .*missing 0, mismatched 1 \[ckpt\/checkpoint-20\/model\.safetensors\], extra 0/,
        );
        assert.match(e.message, /sha256 [0-9a-f]{64} on the Hub, [0-9a-f]{64} locally/);
        assert.match(e.message, /is kept and latest\.json was not moved\. \[K4\]$/);
        assert.deepEqual(e.verify!.mismatch, ["ckpt/checkpoint-20/model.safetensors"]);
        return true;
      },
    );
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("a corrupted regular file is caught too, by hashing what the Hub serves (K4)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ corruptOnCommit: ["checkpoint-20/cursor.json"] });
    await assert.rejects(
      publishCheckpoint(store, {
        localDir: ck.dir,
        pathInRepo: ck.path_in_repo,
        pointer: pointerOf(ck),
        prune: false,
        minFreeGb: 0,
        log: () => {},
      }),
      /mismatched 1 \[ckpt\/checkpoint-20\/cursor\.json\].*read-back FAILED/,
    );
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("a file silently dropped by the commit fails verification as missing (K4)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ dropOnCommit: ["checkpoint-20/optimizer.safetensors"] });
    await assert.rejects(
      publishCheckpoint(store, {
        localDir: ck.dir,
        pathInRepo: ck.path_in_repo,
        pointer: pointerOf(ck),
        prune: true,
        minFreeGb: 0,
        log: () => {},
      }),
      (e: Error) => {
        assert.equal(e.name, "CheckpointVerifyError");
        assert.match(
          e.message,
          /missing 1 \[ckpt\/checkpoint-20\/optimizer\.safetensors\], mismatched 0, extra 0, read-back ok/,
        );
        return true;
      },
    );
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("an extra file under the checkpoint path fails verification as extra (K4)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ extraOnCommit: [{ path: "ckpt/checkpoint-20/stray.bin", content: "not ours" }] });
    await assert.rejects(
      publishCheckpoint(store, {
        localDir: ck.dir,
        pathInRepo: ck.path_in_repo,
        pointer: pointerOf(ck),
        prune: true,
        minFreeGb: 0,
        log: () => {},
      }),
      /missing 0, mismatched 0, extra 1 \[ckpt\/checkpoint-20\/stray\.bin\], read-back ok.*local copy at .* is kept and latest\.json was not moved/,
    );
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("a failed pointer commit leaves the checkpoint verified, the pointer unmoved and the local copy kept (K3)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ failPointerWrite: true });
    await assert.rejects(
      publishCheckpoint(store, {
        localDir: ck.dir,
        pathInRepo: ck.path_in_repo,
        pointer: pointerOf(ck),
        prune: true,
        minFreeGb: 0,
        log: () => {},
        ...QUICK,
      }),
      (e: Error & { stage?: string }) => {
        assert.equal(e.name, "CheckpointPublishError");
        assert.equal(e.stage, "pointer");
        assert.match(
          e.message,
          /checkpoint 20 is verified on the Hub at .*ckpt\/checkpoint-20, but latest\.json could not be moved to it: .*kept failing.*HTTP 500/,
        );
        assert.match(e.message, /local copy at .* is kept/);
        return true;
      },
    );
    await assertKeptAndUnmoved(store, ck.dir, first);
    // The checkpoint itself is on the Hub and complete.
    assert.equal((await store.list("ckpt/checkpoint-20")).length, 5);
  });

  test("prune deletes the local copy when asked and the disk guard allows (K3)", async () => {
    const { store } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    const r = await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: true,
      minFreeGb: 0,
      log: () => {},
    });
    assert.equal(r.pruned, true);
    assert.equal(r.pruneReason, null);
    assert.equal(fs.existsSync(ck.dir), false);
    assert.deepEqual(await store.readPointer(), pointerOf(ck));
  });

  test("prune keeps the local copy and says why when free disk would fall below the guard (K3)", async () => {
    const { store } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    const lines: string[] = [];
    const r = await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: true,
      minFreeGb: 1e9,
      log: (l) => lines.push(l),
    });
    assert.equal(r.ok, true);
    assert.equal(r.pruned, false);
    assert.match(r.pruneReason!, /kept: free disk after pruning would be [\d.]+ GB, below the 1000000000 GB guard/);
    assert.ok(fs.existsSync(ck.dir));
    assert.match(lines[0], /pruned=false free=[\d.]+GB loss=n\/a \(kept: free disk/);
  });

  test("re-publishing a step replaces stale remote files in the same commit (K3)", async () => {
    const { store } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    fs.writeFileSync(path.join(ck.dir, "old-extra.json"), "{}");
    await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: false,
      minFreeGb: 0,
      log: () => {},
    });
    fs.rmSync(path.join(ck.dir, "old-extra.json"));
    const r = await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: false,
      minFreeGb: 0,
      log: () => {},
    });
    assert.equal(r.ok, true);
    assert.equal(
      (await store.list("ckpt/checkpoint-20")).some((f) => f.path.endsWith("old-extra.json")),
      false,
    );
  });
});

describe("publishFinal (G4)", () => {
  test("final/ is pushed, verified, and latest.json rolls to it; auto-resume then reports the run complete", async () => {
    const { store } = await repoWithFirstCheckpoint();
    const dir = path.join(th.tmp, `r${n}`, "final");
    const ck = writeFakeCheckpoint(dir, { step: 30 });
    fs.rmSync(path.join(dir, "optimizer.safetensors"));
    fs.writeFileSync(path.join(dir, "run_summary.json"), JSON.stringify({ step: 30 }));
    fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify({ model: {} }));
    const pointer = { ...pointerOf(ck), path_in_repo: "final" };
    const lines: string[] = [];
    const r = await publishFinal(store, { localDir: dir, pointer, log: (l) => lines.push(l) });
    assert.equal(r.ok, true);
    assert.equal(r.pathInRepo, "final");
    assert.match(lines[0], /^FINAL 30 .* ok=true/);
    assert.deepEqual(await store.readPointer(), pointer);
    const got = await resolveAutoResume(store, {
      destDir: path.join(th.tmp, "resume-final"),
      log: () => {},
      retryDelayMs: 10,
    });
    assert.equal(got.kind, "complete");
  });

  test("a final/ that fails verification leaves the pointer on the last checkpoint (G4, K4)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const dir = path.join(th.tmp, `r${n}`, "final");
    const ck = writeFakeCheckpoint(dir, { step: 30 });
    th.hub.setFaults({ dropOnCommit: ["final/config.json"] });
    await assert.rejects(
      publishFinal(store, { localDir: dir, pointer: { ...pointerOf(ck), path_in_repo: "final" }, log: () => {} }),
      /missing 1 \[final\/config\.json\]/,
    );
    await assertKeptAndUnmoved(store, dir, first);
  });
});
