// K3 / K4 / B2 / G4: the publish cycle against a real LocalHub through the real @huggingface/hub client.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import * as os from "node:os";
import { test, describe } from "node:test";
import { useTestHub, writeFakeCheckpoint, pointerOf, publishNext, type FakeCk, type TestHub } from "./helpers/hub";
import { publishFinal, freeBytes } from "../src/hub/cycle";
import { resolveAutoResume } from "../src/hub/resume";
import type { HubClient, Pointer } from "../src/hub/client";
import { deleteFile, listCommits } from "@huggingface/hub";

let th: TestHub;
let n = 0;

useTestHub({ pageSize: 4 }, (t) => (th = t));

/** A fresh repo, one verified checkpoint at step 10 already published (the pointer's prior position). */
async function repoWithFirstCheckpoint(): Promise<{ store: HubClient; first: Pointer; lines: string[] }> {
  const store = th.store({ repo: `tester/cycle-${++n}` });
  await store.ensureRepo();
  const ck = writeFakeCheckpoint(path.join(th.tmp, `r${n}`, "checkpoint-10"), { step: 10 });
  const lines: string[] = [];
  await publishNext(store, ck, lines);
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
    const r = await publishNext(store, ck, out, { loss: 2.5 });
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
    await assert.rejects(publishNext(store, ck, lines, { prune: true, ...QUICK }), (e: Error) => {
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
    });
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
      publishNext(store, ck, [], { prune: true, ...QUICK }),
      /upload to .* failed: .*kept failing.*HTTP 500.*local copy .* is kept and latest\.json was not moved/,
    );
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("transient failures (500, 503, 429) for a few attempts are retried and the publish completes (K6)", async () => {
    const { store } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ status: { commit: 503, upload: 500, lfsBatch: 429 }, failCount: 3 });
    const lines: string[] = [];
    const r = await publishNext(store, ck, lines, { ...QUICK, giveUpMs: 60_000 });
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
      publishNext(store, ck, lines, { ...QUICK, giveUpMs: 60_000 }),
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
      publishNext(store, ck, [], { prune: true }),
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
      publishNext(store, ck),
      /mismatched 1 \[ckpt\/checkpoint-20\/cursor\.json\].*read-back FAILED/,
    );
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("a file silently dropped by the commit fails verification as missing (K4)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ dropOnCommit: ["checkpoint-20/optimizer.safetensors"] });
    await assert.rejects(publishNext(store, ck, [], { prune: true }), (e: Error) => {
      assert.equal(e.name, "CheckpointVerifyError");
      assert.match(
        e.message,
        /missing 1 \[ckpt\/checkpoint-20\/optimizer\.safetensors\], mismatched 0, extra 0, read-back ok/,
      );
      return true;
    });
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("an extra file under the checkpoint path fails verification as extra (K4)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ extraOnCommit: [{ path: "ckpt/checkpoint-20/stray.bin", content: "not ours" }] });
    await assert.rejects(
      publishNext(store, ck, [], { prune: true }),
      /missing 0, mismatched 0, extra 1 \[ckpt\/checkpoint-20\/stray\.bin\], read-back ok.*local copy at .* is kept and latest\.json was not moved/,
    );
    await assertKeptAndUnmoved(store, ck.dir, first);
  });

  test("a failed pointer commit leaves the checkpoint verified, the pointer unmoved and the local copy kept (K3)", async () => {
    const { store, first } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    th.hub.setFaults({ failPointerWrite: true });
    await assert.rejects(publishNext(store, ck, [], { prune: true, ...QUICK }), (e: Error & { stage?: string }) => {
      assert.equal(e.name, "CheckpointPublishError");
      assert.equal(e.stage, "pointer");
      assert.match(
        e.message,
        /checkpoint 20 is verified on the Hub at .*ckpt\/checkpoint-20, but latest\.json could not be moved to it: .*kept failing.*HTTP 500/,
      );
      assert.match(e.message, /local copy at .* is kept/);
      return true;
    });
    await assertKeptAndUnmoved(store, ck.dir, first);
    // The checkpoint itself is on the Hub and complete.
    assert.equal((await store.list("ckpt/checkpoint-20")).length, 5);
  });

  test("prune deletes the local copy when asked and the disk guard allows (K3)", async () => {
    const { store } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    const r = await publishNext(store, ck, [], { prune: true });
    assert.equal(r.pruned, true);
    assert.equal(r.pruneReason, null);
    assert.equal(fs.existsSync(ck.dir), false);
    assert.deepEqual(await store.readPointer(), pointerOf(ck));
  });

  test("prune keeps the local copy and says why when free disk would fall below the guard (K3)", async () => {
    const { store } = await repoWithFirstCheckpoint();
    const ck = nextCheckpoint();
    const lines: string[] = [];
    const r = await publishNext(store, ck, lines, { prune: true, minFreeGb: 1e9 });
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
    await publishNext(store, ck);
    fs.rmSync(path.join(ck.dir, "old-extra.json"));
    const r = await publishNext(store, ck);
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

// K3 / K4 / K6 / K8 / G4, rule by rule: the publish cycle's finer points, one behaviour per test, against a real
// LocalHub through the real @huggingface/hub client (they also kill the mutants of src/hub/cycle.ts, test/MUTATION.md).
describe("the publish cycle, rule by rule (K3, K4, K6, K8, G4)", () => {
  let th: TestHub;
  let n = 0;

  useTestHub({}, (t) => (th = t));

  /** K6 retries shortened: give up after 0.4 s of failures, backoff 20..50 ms. */
  const QUICK = { giveUpMs: 400, backoff: { baseMs: 20, capMs: 50 } };

  async function freshRepo(): Promise<HubClient> {
    const store = th.store({ repo: `tester/cycle-rules-${++n}` });
    await store.ensureRepo();
    return store;
  }

  function checkpoint(step = 20, o: { seqsPerStep?: number } = {}): FakeCk {
    return writeFakeCheckpoint(path.join(th.tmp, `c${n}`, `checkpoint-${step}`), { step, loss: 2.5, ...o });
  }

  /** Publishes ck with `file` corrupted by the Hub at commit time: a K4 refusal with this read-back verdict; check reads its message. */
  async function publishCorrupted(
    store: HubClient,
    ck: FakeCk,
    file: string,
    readbackOk: boolean,
    check: (message: string) => void,
  ): Promise<void> {
    th.hub.setFaults({ corruptOnCommit: [`checkpoint-20/${file}`] });
    await assert.rejects(publishNext(store, ck, []), (e: Error & { verify?: { readbackOk: boolean } }) => {
      assert.equal(e.verify!.readbackOk, readbackOk);
      check(e.message);
      return true;
    });
  }

  /** What the repo holds besides the .gitattributes every new repo starts with. */
  async function pushed(store: HubClient): Promise<string[]> {
    return (await store.list()).map((f) => f.path).filter((p) => p !== ".gitattributes");
  }

  /** The same real store, with a Hub fault switched on the moment its upload (the commit) has landed. */
  function faultAfterUpload(store: HubClient, faults: Parameters<TestHub["hub"]["setFaults"]>[0]): HubClient {
    const s = Object.create(store) as HubClient;
    s.uploadFolder = async (...a) => {
      const r = await store.uploadFolder(...a);
      th.hub.setFaults(faults);
      return r;
    };
    return s;
  }

  async function commitTitles(store: HubClient): Promise<string[]> {
    const out: string[] = [];
    for await (const c of listCommits({ repo: { type: store.repoType, name: store.repo }, hubUrl: th.url }))
      out.push(c.title);
    return out;
  }

  describe("publish refuses inconsistent options before any work (K3)", () => {
    test("a pointer that names another folder than pathInRepo is a TypeError, and nothing is pushed", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      const lines: string[] = [];
      await assert.rejects(publishNext(store, ck, lines, { pathInRepo: "ckpt/checkpoint-21" }), {
        name: "TypeError",
        message: 'publish: pointer.path_in_repo "ckpt/checkpoint-20" differs from pathInRepo "ckpt/checkpoint-21"',
      });
      assert.deepEqual(await pushed(store), []);
      assert.deepEqual(lines, []);
    });

    for (const bad of [-1, Number.NaN]) {
      test(`a disk guard of ${bad} GB is a TypeError, and nothing is pushed`, async () => {
        const store = await freshRepo();
        const ck = checkpoint();
        await assert.rejects(publishNext(store, ck, [], { minFreeGb: bad }), {
          name: "TypeError",
          message: `publish: minFreeGb must be >= 0, got ${bad}`,
        });
        assert.deepEqual(await pushed(store), []);
      });
    }

    test("an empty local folder is refused as unreadable (K3): nothing is pushed and the failure is logged", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      for (const f of fs.readdirSync(ck.dir)) fs.rmSync(path.join(ck.dir, f));
      const lines: string[] = [];
      const t0 = performance.now();
      await assert.rejects(publishNext(store, ck, lines), (e: Error & { stage?: string }) => {
        assert.equal(e.name, "CheckpointPublishError");
        assert.equal(e.stage, "upload");
        assert.ok(
          e.message.startsWith(
            `checkpoint 20: reading the local copy at ${ck.dir} failed: ${ck.dir} holds no files. The local copy at ${ck.dir} is kept and latest.json was not moved.`,
          ),
          e.message,
        );
        return true;
      });
      const callSeconds = (performance.now() - t0) / 1000;
      assert.equal(lines.length, 1);
      assert.match(
        lines[0],
        /^CKPT 20 samples=160 push\+verify=\d+\.\ds ok=false pruned=false free=\d+\.\dGB loss=n\/a \(not pruned: the checkpoint was not published\)$/,
      );
      assert.doesNotMatch(lines[0], / free=0\.0GB/, "free disk is measured on the failure line too");
      const [, secs, free] = /push\+verify=([\d.]+)s .* free=([\d.]+)GB/.exec(lines[0])!;
      assert.ok(Number(secs) <= callSeconds + 0.05, `push+verify ${secs} s is measured within the call`);
      assert.ok(Math.abs(Number(free) - (await freeBytes(th.tmp)) / 1e9) < 2, `free=${free} GB is the free disk in GB`);
      assert.deepEqual(await pushed(store), []);
    });

    test("a local folder that does not exist is refused as unreadable (K3)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      fs.rmSync(ck.dir, { recursive: true });
      await assert.rejects(publishNext(store, ck, []), (e: Error) => {
        assert.equal(e.name, "CheckpointPublishError");
        assert.match(e.message, /^checkpoint 20: reading the local copy at .* failed: .*ENOENT/);
        return true;
      });
    });
  });

  describe("the commit (K3, G4)", () => {
    test("a checkpoint is committed as 'checkpoint step N', final/ as 'final export (step N)', or with the message given", async () => {
      const store = await freshRepo();
      await publishNext(store, checkpoint(20), []);
      await publishNext(store, checkpoint(30), [], { message: "my message" });
      const dir = path.join(th.tmp, `c${n}`, "final");
      const fin = writeFakeCheckpoint(dir, { step: 40 });
      const r = await publishFinal(store, {
        localDir: dir,
        pointer: { ...pointerOf(fin), path_in_repo: "final" },
        log: () => {},
      });
      assert.equal(r.pathInRepo, "final");
      assert.equal(r.pruned, false);
      assert.equal(r.pruneReason, "--prune not set", "publishFinal does not prune unless asked");
      assert.ok(fs.existsSync(dir));
      const titles = await commitTitles(store);
      for (const t of ["checkpoint step 20", "my message", "final export (step 40)"])
        assert.ok(titles.includes(t), `${t} in ${JSON.stringify(titles)}`);
    });

    test("files in subfolders are pushed under their relative path and verified (K3)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      fs.mkdirSync(path.join(ck.dir, "extra", "deep"), { recursive: true });
      fs.writeFileSync(path.join(ck.dir, "extra", "deep", "notes.txt"), "sub-folder file");
      const r = await publishNext(store, ck, []);
      assert.equal(r.ok, true);
      assert.ok(
        (await store.list("ckpt/checkpoint-20")).some((f) => f.path === "ckpt/checkpoint-20/extra/deep/notes.txt"),
      );
    });

    test("the CKPT line groups the sample count and reports a measured push+verify time and free disk (K3)", async () => {
      const store = await freshRepo();
      const ck = checkpoint(200);
      const lines: string[] = [];
      const t0 = performance.now();
      const r = await publishNext(store, ck, lines, { loss: 1.25 });
      const callSeconds = (performance.now() - t0) / 1000;
      assert.ok(
        r.pushVerifySeconds > 0 && r.pushVerifySeconds <= callSeconds,
        `push+verify ${r.pushVerifySeconds} s is measured within the call (${callSeconds} s)`,
      );
      assert.ok(
        Math.abs(r.freeGb - (await freeBytes(ck.dir)) / 1e9) < 2,
        `free=${r.freeGb} GB is the free disk in GB, to 0.1`,
      );
      assert.equal(r.freeGb, Math.round(r.freeGb * 10) / 10);
      assert.equal(lines.length, 1);
      assert.equal(
        lines[0],
        `CKPT 200 samples=1,600 push+verify=${r.pushVerifySeconds.toFixed(1)}s ok=true pruned=false free=${r.freeGb.toFixed(1)}GB loss=1.25 (--prune not set)`,
      );
    });
  });

  describe("verification against the Hub (K4)", () => {
    test("a first mismatch is uploaded once more, and a clean second upload publishes (K4 stops only on a second mismatch)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      th.hub.setFaults({ corruptOnCommit: ["checkpoint-20/model.safetensors"], failCount: 1 });
      const lines: string[] = [];
      const r = await publishNext(store, ck, lines);
      assert.equal(r.ok, true);
      assert.deepEqual(r.verify, { missing: [], mismatch: [], extra: [], readbackOk: true });
      assert.match(
        lines[0],
        /^hub: checkpoint 20 did not verify at tester\/cycle-rules-\d+\/ckpt\/checkpoint-20: missing 0, mismatched 1 \[ckpt\/checkpoint-20\/model\.safetensors\], extra 0, read-back ok \(ckpt\/checkpoint-20\/model\.safetensors: sha256 [0-9a-f]{64} on the Hub, [0-9a-f]{64} locally\); uploading it once more \(K4 stops only on a second mismatch\)$/,
      );
      assert.match(lines[1], /^CKPT 20 .* ok=true/);
      assert.deepEqual(await store.readPointer(), pointerOf(ck));
    });

    test("a file of another size on the Hub is a mismatch that names both sizes (K4)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      const size = fs.statSync(path.join(ck.dir, "config.json")).size;
      th.hub.setFaults({ extraOnCommit: [{ path: "ckpt/checkpoint-20/config.json", content: "{}" }] });
      await assert.rejects(
        publishNext(store, ck, []),
        (e: Error & { verify?: { mismatch: string[]; extra: string[] } }) => {
          assert.equal(e.name, "CheckpointVerifyError");
          assert.ok(
            e.message.includes(`ckpt/checkpoint-20/config.json: 2 bytes on the Hub, ${size} locally`),
            e.message,
          );
          assert.deepEqual(e.verify!.mismatch, ["ckpt/checkpoint-20/config.json"]);
          assert.deepEqual(e.verify!.extra, []);
          return true;
        },
      );
    });

    test("extra files are reported sorted, and every finding is listed with its paths (K4)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      th.hub.setFaults({
        extraOnCommit: [
          { path: "ckpt/checkpoint-20/z.bin", content: "z" },
          { path: "ckpt/checkpoint-20/a.bin", content: "a" },
        ],
        dropOnCommit: ["checkpoint-20/config.json"],
      });
      await assert.rejects(publishNext(store, ck, []), (e: Error & { verify?: { extra: string[] } }) => {
        assert.ok(
          e.message.includes(
            "missing 1 [ckpt/checkpoint-20/config.json], mismatched 0, extra 2 [ckpt/checkpoint-20/a.bin, ckpt/checkpoint-20/z.bin], read-back ok. ",
          ),
          e.message,
        );
        assert.deepEqual(e.verify!.extra, ["ckpt/checkpoint-20/a.bin", "ckpt/checkpoint-20/z.bin"]);
        return true;
      });
    });

    test("several findings of one kind are listed comma-separated, their details semicolon-separated (K4)", async () => {
      const store = await freshRepo();
      th.hub.setFaults({
        dropOnCommit: ["checkpoint-20/config.json", "checkpoint-20/trainer_state.json"],
        corruptOnCommit: ["checkpoint-20/model.safetensors", "checkpoint-20/optimizer.safetensors"],
      });
      await assert.rejects(publishNext(store, checkpoint(), []), (e: Error) => {
        assert.ok(
          e.message.includes(
            "missing 2 [ckpt/checkpoint-20/config.json, ckpt/checkpoint-20/trainer_state.json], mismatched 2 [ckpt/checkpoint-20/model.safetensors, ckpt/checkpoint-20/optimizer.safetensors], extra 0, read-back ok (ckpt/checkpoint-20/model.safetensors: sha256 ",
          ),
          e.message,
        );
        assert.match(e.message, /locally; ckpt\/checkpoint-20\/optimizer\.safetensors: sha256 /);
        return true;
      });
    });

    test("the read-back reads cursor.json when the folder has one: a corrupted weights file leaves the read-back ok (K4)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      await publishCorrupted(store, ck, "model.safetensors", true, (m) =>
        assert.ok(m.includes("mismatched 1 [ckpt/checkpoint-20/model.safetensors], extra 0, read-back ok ("), m),
      );
    });

    test("without cursor.json the read-back reads the smallest file, and a corrupted one fails it with both hashes (K4)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      fs.rmSync(path.join(ck.dir, "cursor.json"));
      const sizes = fs
        .readdirSync(ck.dir)
        .map((f) => ({ f, size: fs.statSync(path.join(ck.dir, f)).size }))
        .sort((a, b) => a.size - b.size);
      const smallest = sizes[0].f;
      assert.ok(sizes[0].size < sizes[1].size, "one file is the smallest");
      await publishCorrupted(store, ck, smallest, false, (m) =>
        assert.match(
          m,
          new RegExp(
            `read-back FAILED \\(.*read-back of ckpt/checkpoint-20/${smallest.replace(".", "\\.")}: ${sizes[0].size} bytes, sha256 [0-9a-f]{64}; local has ${sizes[0].size} bytes, sha256 [0-9a-f]{64}\\)`,
          ),
        ),
      );
    });

    test("the read-back prefers cursor.json to the smallest file: a corrupted config.json (the smallest) leaves it ok (K4)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      const size = (f: string) => fs.statSync(path.join(ck.dir, f)).size;
      assert.ok(
        fs.readdirSync(ck.dir).every((f) => f === "config.json" || size(f) > size("config.json")),
        "config.json is the smallest file",
      );
      await publishCorrupted(store, ck, "config.json", true, (m) =>
        assert.ok(m.includes("mismatched 1 [ckpt/checkpoint-20/config.json], extra 0, read-back ok ("), m),
      );
    });

    test("without cursor.json the read-back reads the smallest file by size, not the first by name nor the largest (K4)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      fs.rmSync(path.join(ck.dir, "cursor.json"));
      fs.writeFileSync(path.join(ck.dir, "a-large.bin"), Buffer.alloc(4096, 7));
      fs.writeFileSync(path.join(ck.dir, "m-small.txt"), "abc");
      const names = fs.readdirSync(ck.dir).sort();
      assert.equal(names[0], "a-large.bin");
      assert.notEqual(names[names.length - 1], "m-small.txt");
      await publishCorrupted(store, ck, "m-small.txt", false, (m) =>
        assert.match(
          m,
          /read-back FAILED \(.*read-back of ckpt\/checkpoint-20\/m-small\.txt: 3 bytes, sha256 [0-9a-f]{64}; local has 3 bytes, sha256 [0-9a-f]{64}\)/,
        ),
      );
    });

    test("a read-back file gone from the Hub after the listing is 'not found', a failed read-back, and the re-upload publishes (K4)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      const s = Object.create(store) as HubClient;
      let done = false;
      s.list = async (...a) => {
        const r = await store.list(...a);
        if (!done && a[1] === undefined) {
          done = true;
          await deleteFile({
            repo: { type: store.repoType, name: store.repo },
            path: `${ck.path_in_repo}/cursor.json`,
            hubUrl: th.url,
            accessToken: "hf_anyTokenTheOpenHubTakes",
          });
        }
        return r;
      };
      const lines: string[] = [];
      const r = await publishNext(s, ck, lines);
      assert.equal(r.ok, true);
      const retried = lines.filter((l) => /did not verify/.test(l));
      assert.equal(retried.length, 1, lines.join("\n"));
      assert.ok(
        retried[0].includes(
          "missing 0, mismatched 0, extra 0, read-back FAILED (read-back of ckpt/checkpoint-20/cursor.json: not found)",
        ),
        retried[0],
      );
    });

    /** A folder of LFS files only: listing it downloads nothing, so the one download is the read-back. */
    function weightsOnly(): FakeCk {
      const ck = checkpoint();
      for (const f of fs.readdirSync(ck.dir)) if (!f.endsWith(".safetensors")) fs.rmSync(path.join(ck.dir, f));
      return ck;
    }

    test("a read-back the Hub refuses is a failed read-back that names the error, not a pass (K4)", async () => {
      const store = await freshRepo();
      const ck = weightsOnly();
      await assert.rejects(
        publishNext(faultAfterUpload(store, { status: { resolve: 403 } }), ck, [], QUICK),
        (e: Error & { verify?: { readbackOk: boolean } }) => {
          assert.equal(e.name, "CheckpointVerifyError");
          assert.equal(e.verify!.readbackOk, false);
          assert.ok(
            e.message.includes(
              "missing 0, mismatched 0, extra 0, read-back FAILED (read-back of ckpt/checkpoint-20/model.safetensors failed: HTTP 403",
            ),
            e.message,
          );
          return true;
        },
      );
    });

    test("a read-back that fails transiently is retried, not counted as a mismatch (K4, K6)", async () => {
      const store = await freshRepo();
      const ck = weightsOnly();
      const lines: string[] = [];
      const r = await publishNext(
        faultAfterUpload(store, { status: { resolve: 503 }, failCount: 1 }),
        ck,
        lines,
        QUICK,
      );
      assert.equal(r.ok, true);
      assert.ok(
        lines.some((l) => /^hub: verification of ckpt\/checkpoint-20 \(step 20\) failed \(attempt 1: HTTP 503/.test(l)),
        lines.join("\n"),
      );
      assert.equal(lines.filter((l) => /did not verify/.test(l)).length, 0, lines.join("\n"));
    });

    test("a verification whose listing keeps failing is refused as unverifiable, the pointer unmoved (K4, K6)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      await assert.rejects(
        publishNext(faultAfterUpload(store, { status: { list: 503 } }), ck, [], { ...QUICK }),
        (e: Error) => {
          assert.equal(e.name, "CheckpointVerifyError");
          assert.match(
            e.message,
            /^checkpoint 20: could not verify tester\/cycle-rules-\d+\/ckpt\/checkpoint-20: listing it failed \(verification of ckpt\/checkpoint-20 \(step 20\) kept failing for .*HTTP 503.*\)\. The local copy at .* is kept and latest\.json was not moved\./,
          );
          return true;
        },
      );
      th.hub.clearFaults();
      assert.equal(await store.readPointer(), null);
    });

    test("the unverifiable refusal carries an empty verification report (nothing was compared) (K4)", async () => {
      const store = await freshRepo();
      await assert.rejects(
        publishNext(faultAfterUpload(store, { status: { list: 503 } }), checkpoint(), [], QUICK),
        (e: Error & { verify?: unknown }) => {
          assert.deepEqual(e.verify, { missing: [], mismatch: [], extra: [], readbackOk: false });
          return true;
        },
      );
    });

    test("an abandoned verification passes its RetryAbandoned through, the pointer unmoved (K6)", async () => {
      const store = await freshRepo();
      const lines: string[] = [];
      await assert.rejects(
        publishNext(faultAfterUpload(store, { status: { list: 503 } }), checkpoint(), lines, {
          giveUpMs: 60_000,
          backoff: { baseMs: 20, capMs: 50 },
          abandon: () => "newer",
        }),
        { name: "RetryAbandoned" },
      );
      assert.match(lines[lines.length - 1], /^CKPT 20 .* ok=false/);
      th.hub.clearFaults();
      assert.equal(await store.readPointer(), null);
    });
  });

  describe("retries and the failure clock (K6)", () => {
    test("by default a transient failure is retried (the default give-up is long), and the publish completes", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      th.hub.setFaults({ status: { commit: 503 }, failCount: 1 });
      const lines: string[] = [];
      const r = await publishNext(store, ck, lines, { backoff: { baseMs: 20, capMs: 50 } });
      assert.equal(r.ok, true);
      assert.equal(
        lines.filter((l) =>
          /^hub: upload of ckpt\/checkpoint-20 \(step 20\) failed \(attempt 1: HTTP 503.* of at most 1800s \(K6\)$/.test(
            l,
          ),
        ).length,
        1,
        lines.join("\n"),
      );
    });

    test("the failure clock starts at the first failure, survives a give-up, and is cleared by a publish that succeeds", async () => {
      const store = await freshRepo();
      const clock: { failingSince: number | null } = { failingSince: null };
      th.hub.setFaults({ status: { commit: 503 } });
      const before = performance.now();
      await assert.rejects(publishNext(store, checkpoint(20), [], { ...QUICK, clock }), /kept failing/);
      assert.ok(clock.failingSince !== null && clock.failingSince >= before, "the clock holds the first failure");
      const first = clock.failingSince;
      await assert.rejects(
        publishNext(store, checkpoint(30), [], { ...QUICK, giveUpMs: 60_000, abandon: () => "stop", clock }),
        { name: "RetryAbandoned" },
      );
      assert.equal(clock.failingSince, first, "a later failure does not restart the clock");
      th.hub.clearFaults();
      const r = await publishNext(store, checkpoint(40), [], { ...QUICK, clock });
      assert.equal(r.ok, true);
      assert.equal(clock.failingSince, null, "success clears the clock");
    });

    test("a clock that has been failing longer than the limit gives up at the next failure, without a retry", async () => {
      const store = await freshRepo();
      const clock = { failingSince: performance.now() - 10 * 60_000 };
      th.hub.setFaults({ status: { commit: 503 } });
      const lines: string[] = [];
      await assert.rejects(
        publishNext(store, checkpoint(), lines, { giveUpMs: 60_000, backoff: { baseMs: 20, capMs: 50 }, clock }),
        /upload of ckpt\/checkpoint-20 \(step 20\) kept failing for \d+\.\d min/,
      );
      assert.equal(lines.filter((l) => /retrying in/.test(l)).length, 0, lines.join("\n"));
    });

    test("without a clock given, the give-up counts from the publish's first failure, also in a later stage (K6)", async () => {
      const store = await freshRepo();
      th.hub.setFaults({ status: { commit: 503 }, failCount: 1 });
      const s = Object.create(store) as HubClient;
      let calls = 0;
      s.uploadFolder = async (...a) => {
        // The retry of the failed commit starts 600 ms after that failure (a lower bound, whatever the load),
        // past the 400 ms limit; once it lands, the listing fails.
        if (++calls === 2) await new Promise((r) => setTimeout(r, 600));
        const r = await store.uploadFolder(...a);
        th.hub.setFaults({ status: { list: 503 } });
        return r;
      };
      const lines: string[] = [];
      await assert.rejects(publishNext(s, checkpoint(), lines, QUICK), (e: Error) => {
        assert.equal(e.name, "CheckpointVerifyError");
        assert.match(e.message, /verification of ckpt\/checkpoint-20 \(step 20\) kept failing for/);
        return true;
      });
      assert.equal(calls, 2);
      assert.equal(lines.filter((l) => /^hub: verification of .*retrying in/.test(l)).length, 0, lines.join("\n"));
    });

    test("an abandoned checkpoint passes its RetryAbandoned through, logged as not published, the pointer unmoved", async () => {
      const store = await freshRepo();
      th.hub.setFaults({ status: { commit: 503 } });
      const lines: string[] = [];
      await assert.rejects(
        publishNext(store, checkpoint(), lines, {
          giveUpMs: 60_000,
          backoff: { baseMs: 20, capMs: 50 },
          abandon: () => "a newer checkpoint is waiting",
        }),
        (e: Error) => {
          assert.equal(e.name, "RetryAbandoned");
          assert.equal(e.message, "a newer checkpoint is waiting");
          return true;
        },
      );
      assert.match(
        lines[lines.length - 1],
        /^CKPT 20 .* ok=false pruned=false .*\(not pruned: the checkpoint was not published\)$/,
      );
      th.hub.clearFaults();
      assert.equal(await store.readPointer(), null);
    });

    test("a pointer that cannot be moved is refused with the advice that --resume auto rolls it forward (K3, R5)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      th.hub.setFaults({ failPointerWrite: true });
      const lines: string[] = [];
      await assert.rejects(publishNext(store, ck, lines, QUICK), (e: Error & { stage?: string }) => {
        assert.equal(e.stage, "pointer");
        assert.ok(
          e.message.includes(
            `The local copy at ${ck.dir} is kept; latest.json still points at the previous checkpoint (or could not be confirmed). --resume auto rolls the pointer forward onto this checkpoint, which proves complete against its manifest (R5)`,
          ),
          e.message,
        );
        return true;
      });
      assert.ok(
        lines.some((l) => l.startsWith("hub: write of latest.json -> ckpt/checkpoint-20 failed (attempt 1: ")),
        lines.join("\n"),
      );
    });

    test("an abandoned pointer write passes through too, the checkpoint kept (K6)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      th.hub.setFaults({ failPointerWrite: true });
      await assert.rejects(
        publishNext(store, ck, [], { giveUpMs: 60_000, backoff: { baseMs: 20, capMs: 50 }, abandon: () => "newer" }),
        { name: "RetryAbandoned" },
      );
      assert.ok(fs.existsSync(ck.dir));
    });

    test("another writer's commit passes through as ConcurrentWriterError, not as a publish error (K8)", async () => {
      const store = await freshRepo();
      await store.followHead();
      const other = th.store({ repo: store.repo });
      const theirs = checkpoint(5);
      await other.uploadFolder(theirs.dir, "elsewhere", "someone else's commit");
      const lines: string[] = [];
      const ck = checkpoint();
      await assert.rejects(publishNext(store, ck, lines, QUICK), { name: "ConcurrentWriterError" });
      assert.match(lines[lines.length - 1], /^CKPT 20 .* ok=false/);
      assert.ok(fs.existsSync(ck.dir));
    });
  });

  describe("a commit whose answer was lost, and another writer's identical commit (K8)", () => {
    /** Retries that do not give up under load. */
    const PATIENT = { giveUpMs: 60_000, backoff: { baseMs: 20, capMs: 50 } };

    /** The same real store; before its nth uploadFolder call, `before` runs (another writer's commit). */
    function beforeUpload(store: HubClient, nth: number, before: () => Promise<unknown>): HubClient {
      const s = Object.create(store) as HubClient;
      let calls = 0;
      s.uploadFolder = async (...a) => {
        if (++calls === nth) await before();
        return store.uploadFolder(...a);
      };
      return s;
    }

    test("an upload commit that landed but whose answer was lost is found by the retry as this run's own: published, one commit (K8)", async () => {
      const store = await freshRepo();
      await store.followHead();
      const ck = checkpoint();
      th.hub.setFaults({ loseCommitAnswer: ["checkpoint-20/config.json"], failCount: 1 });
      const lines: string[] = [];
      const r = await publishNext(store, ck, lines, PATIENT);
      assert.equal(r.ok, true);
      assert.ok(
        lines.some((l) => /^hub: upload of ckpt\/checkpoint-20 \(step 20\) failed \(attempt 1: HTTP 500/.test(l)),
        lines.join("\n"),
      );
      assert.equal((await commitTitles(store)).filter((t) => t === "checkpoint step 20").length, 1);
      assert.deepEqual(await store.readPointer(), pointerOf(ck));
    });

    test("a pointer commit that landed but whose answer was lost is found by the retry as this run's own: published, one pointer commit (K8)", async () => {
      const store = await freshRepo();
      await store.followHead();
      const ck = checkpoint();
      th.hub.setFaults({ loseCommitAnswer: ["latest.json"], failCount: 1 });
      const lines: string[] = [];
      const r = await publishNext(store, ck, lines, PATIENT);
      assert.equal(r.ok, true);
      assert.ok(
        lines.some((l) => /^hub: write of latest\.json -> ckpt\/checkpoint-20 failed \(attempt 1: HTTP 500/.test(l)),
        lines.join("\n"),
      );
      const titles = await commitTitles(store);
      assert.equal(
        titles.filter((t) => t.startsWith("latest.json -> ckpt/checkpoint-20")).length,
        1,
        titles.join(" | "),
      );
      assert.equal(titles.filter((t) => t === "checkpoint step 20").length, 1, titles.join(" | "));
      assert.deepEqual(await store.readPointer(), pointerOf(ck));
    });

    test("another writer's commit of the very same folder before the first upload attempt is another writer's, not adopted (K8)", async () => {
      const store = await freshRepo();
      await store.followHead();
      const ck = checkpoint();
      const other = th.store({ repo: store.repo });
      const s = beforeUpload(store, 1, () =>
        other.uploadFolder(ck.dir, ck.path_in_repo, "the same folder, by someone else"),
      );
      await assert.rejects(publishNext(s, ck, [], PATIENT), { name: "ConcurrentWriterError" });
      assert.equal(await store.readPointer(), null);
      assert.ok(fs.existsSync(ck.dir));
    });

    test("another writer's commit of the very same folder between a mismatch and the re-upload is another writer's, not adopted (K4, K8)", async () => {
      const store = await freshRepo();
      await store.followHead();
      const ck = checkpoint();
      th.hub.setFaults({ corruptOnCommit: ["checkpoint-20/model.safetensors"], failCount: 1 });
      const other = th.store({ repo: store.repo });
      const s = beforeUpload(store, 2, () =>
        other.uploadFolder(ck.dir, ck.path_in_repo, "the same folder, by someone else"),
      );
      const lines: string[] = [];
      await assert.rejects(publishNext(s, ck, lines, PATIENT), { name: "ConcurrentWriterError" });
      assert.equal(lines.filter((l) => /did not verify .* uploading it once more/.test(l)).length, 1, lines.join("\n"));
      assert.equal(await store.readPointer(), null);
    });

    test("another writer's identical latest.json before this run's pointer write is another writer's, not adopted (K8)", async () => {
      const store = await freshRepo();
      await store.followHead();
      const ck = checkpoint();
      const other = th.store({ repo: store.repo });
      const s = Object.create(store) as HubClient;
      s.uploadFolder = async (...a) => {
        const r = await store.uploadFolder(...a);
        await other.writePointer(pointerOf(ck));
        return r;
      };
      await assert.rejects(publishNext(s, ck, [], PATIENT), { name: "ConcurrentWriterError" });
      const titles = await commitTitles(store);
      assert.equal(titles.filter((t) => t.startsWith("latest.json -> ")).length, 1, titles.join(" | "));
    });
  });

  describe("prune and the disk guard (K3)", () => {
    test("a kept copy names the free disk after pruning and the guard, with the rule (K3)", async () => {
      const store = await freshRepo();
      const r = await publishNext(store, checkpoint(), [], { prune: true, minFreeGb: 1e9 });
      assert.match(
        r.pruneReason!,
        /^kept: free disk after pruning would be \d+\.\d GB, below the 1000000000 GB guard \(K3\)$/,
      );
      const after = Number(/would be (\d+\.\d) GB/.exec(r.pruneReason!)![1]);
      assert.ok(
        Math.abs(after - r.freeGb) < 1,
        "free disk after pruning is about the free disk now (the folder is tiny)",
      );
      assert.ok(r.freeGb > 0);
    });

    test("a pruned copy reports the free disk of its parent folder (K3)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      const lines: string[] = [];
      const r = await publishNext(store, ck, lines, { prune: true, minFreeGb: 0 });
      assert.equal(r.pruned, true);
      assert.match(lines[0], /^CKPT 20 .* ok=true pruned=true free=\d+\.\dGB loss=n\/a$/);
      assert.ok(
        Math.abs(r.freeGb - (await freeBytes(path.dirname(ck.dir))) / 1e9) < 2,
        `free=${r.freeGb} GB is the free disk in GB`,
      );
      assert.equal(fs.existsSync(ck.dir), false);
      assert.ok(fs.existsSync(path.dirname(ck.dir)), "only the checkpoint folder is removed");
    });

    test("publishFinal guards the disk at 6 GB by default when asked to prune (G4)", async () => {
      const store = await freshRepo();
      const dir = path.join(th.tmp, `c${n}`, "final");
      const fin = writeFakeCheckpoint(dir, { step: 40 });
      const r = await publishFinal(store, {
        localDir: dir,
        pointer: { ...pointerOf(fin), path_in_repo: "final" },
        log: () => {},
        prune: true,
      });
      const freeGb = (await freeBytes(os.tmpdir())) / 1e9;
      if (freeGb >= 7) assert.equal(r.pruned, true, r.pruneReason ?? "");
      else if (freeGb < 5) assert.match(r.pruneReason ?? "", /below the 6 GB guard/);
      assert.equal(r.ok, true);
    });

    /** The bytes of a checkpoint folder, counted here independently of cycle.ts. */
    const folderBytes = (dir: string) =>
      fs.readdirSync(dir).reduce((a, f) => a + fs.statSync(path.join(dir, f)).size, 0);

    test("the disk guard counts the folder's bytes as freed: free + folder exactly at the guard prunes (K3)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      const size = folderBytes(ck.dir);
      const asked: string[] = [];
      const diskFree = async (p: string) => (asked.push(p), p === ck.dir ? 2e9 - size : 5.04e9);
      const lines: string[] = [];
      const r = await publishNext(store, ck, lines, { prune: true, minFreeGb: 2, diskFree });
      assert.equal(r.pruned, true, r.pruneReason ?? "");
      assert.equal(r.freeGb, 5, "after pruning, the free disk of the parent folder");
      assert.deepEqual(asked, [ck.dir, path.dirname(ck.dir)]);
      assert.match(lines[0], / ok=true pruned=true free=5\.0GB loss=n\/a$/);
      assert.equal(fs.existsSync(ck.dir), false);
    });

    test("the disk guard keeps the copy when free + folder is one byte under the guard, and says by how much (K3)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      const size = folderBytes(ck.dir);
      const r = await publishNext(store, ck, [], { prune: true, minFreeGb: 2, diskFree: async () => 2e9 - size - 1 });
      assert.equal(r.pruned, false);
      assert.equal(r.pruneReason, "kept: free disk after pruning would be 2.0 GB, below the 2 GB guard (K3)");
      assert.equal(r.freeGb, 2);
      assert.ok(fs.existsSync(ck.dir));
      const r2 = await publishNext(store, checkpoint(30), [], {
        prune: true,
        minFreeGb: 2,
        diskFree: async () => 1.2e9,
      });
      assert.equal(r2.pruneReason, "kept: free disk after pruning would be 1.2 GB, below the 2 GB guard (K3)");
      assert.equal(r2.freeGb, 1.2);
    });

    test("without --prune the free disk is reported in GB rounded to 0.1, and nothing is deleted (K3)", async () => {
      const store = await freshRepo();
      const ck = checkpoint();
      const r = await publishNext(store, ck, [], { prune: false, minFreeGb: 0, diskFree: async () => 3.26e9 });
      assert.equal(r.pruneReason, "--prune not set");
      assert.equal(r.freeGb, 3.3);
      assert.ok(fs.existsSync(ck.dir));
    });

    test("a failed publish reports the free disk too, and 0.0 GB when it cannot be measured, rethrowing the publish error (K3)", async () => {
      const store = await freshRepo();
      th.hub.setFaults({ status: { commit: 403 } });
      const lines: string[] = [];
      await assert.rejects(publishNext(store, checkpoint(20), lines, { ...QUICK, diskFree: async () => 7.77e9 }), {
        name: "CheckpointPublishError",
        stage: "upload",
      });
      assert.match(lines[lines.length - 1], /^CKPT 20 .* ok=false pruned=false free=7\.8GB /);
      const lines2: string[] = [];
      await assert.rejects(
        publishNext(store, checkpoint(30), lines2, {
          ...QUICK,
          diskFree: async () => {
            throw new Error("statfs failed");
          },
        }),
        { name: "CheckpointPublishError" },
      );
      assert.match(lines2[lines2.length - 1], /^CKPT 30 .* ok=false pruned=false free=0\.0GB /);
    });

    test("freeBytes of a path that does not exist yet measures its nearest existing parent", async () => {
      const free = await freeBytes(path.join(th.tmp, "not", "there", "yet"));
      assert.ok(free > 0);
      assert.ok(Number.isSafeInteger(free));
    });
  });
});
