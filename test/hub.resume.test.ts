// R2–R4: --resume auto against a real LocalHub through the real @huggingface/hub client.
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { useTestHub, writeFakeCheckpoint, pointerOf, type TestHub } from "./helpers/hub";
import { publishCheckpoint } from "../src/hub/cycle";
import { resolveAutoResume } from "../src/hub/resume";
import { LocalHub } from "../src/hub/server";
import type { HubClient, Pointer } from "../src/hub/client";

let th: TestHub;
let n = 0;

useTestHub({}, (t) => (th = t));

async function publishSteps(store: HubClient, steps: number[], o: { modelValues?: number } = {}): Promise<Pointer[]> {
  await store.ensureRepo();
  const out: Pointer[] = [];
  for (const step of steps) {
    const ck = writeFakeCheckpoint(path.join(th.tmp, `res${n}`, `checkpoint-${step}`), {
      step,
      loss: 4 - step / 100,
      modelValues: o.modelValues,
    });
    await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: false,
      minFreeGb: 0,
      log: () => {},
    });
    out.push(pointerOf(ck));
  }
  return out;
}

function freshStore(): HubClient {
  return th.store({ repo: `tester/resume-${++n}` });
}

const dest = () => path.join(th.tmp, `dest-${n}`);

async function refusal(p: Promise<unknown>, rule: string, re: RegExp): Promise<void> {
  await assert.rejects(p, (e: Error & { rule?: string }) => {
    assert.equal(e.name, "UserError");
    assert.equal(e.rule, rule);
    assert.match(e.message, re);
    return true;
  });
}

async function assertPointer(store: HubClient, want: Pointer | null): Promise<void> {
  th.hub.clearFaults();
  assert.deepEqual(await store.readPointer(), want, "latest.json is unmoved");
}

describe("resolveAutoResume: the pointer is missing (R2)", () => {
  test("a repo that does not exist starts fresh and says so", async () => {
    const store = freshStore();
    const lines: string[] = [];
    const r = await resolveAutoResume(store, { destDir: dest(), log: (l) => lines.push(l), retryDelayMs: 10 });
    assert.deepEqual(r, { kind: "fresh", reason: `${store.repo} does not exist yet: nothing has ever been pushed` });
    assert.match(lines.join("\n"), /does not exist yet: nothing has ever been pushed -> starting from step 0/);
  });

  test("an existing repo without checkpoints starts fresh", async () => {
    const store = freshStore();
    await store.ensureRepo();
    const r = await resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 });
    assert.equal(r.kind, "fresh");
    assert.match((r as { reason: string }).reason, /no latest\.json and no checkpoints/);
  });

  test("checkpoints without a pointer are refused: the pointer is missing, not the run", async () => {
    const store = freshStore();
    await store.ensureRepo();
    // What a lost pointer commit leaves behind: a checkpoint on the Hub and no latest.json.
    const ck = writeFakeCheckpoint(path.join(th.tmp, `res${n}`, "checkpoint-10"), { step: 10 });
    await store.uploadFolder(ck.dir, ck.path_in_repo, "checkpoint step 10");
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R2",
      /found no latest\.json on tester\/resume-\d+, but the repo holds 1 checkpoint folder\(s\) \(ckpt\/checkpoint-10\)\. The pointer is missing, not the run/,
    );
    await assertPointer(store, null);
  });

  test("a failing listing while the pointer is missing is refused, never taken as an empty repo", async () => {
    const store = freshStore();
    await store.ensureRepo();
    th.hub.setFaults({ status: { list: 500 } });
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R2",
      /found no latest\.json .* listing the repo to confirm that nothing was pushed failed: HTTP 500.*Refusing to start from step 0/,
    );
    await assertPointer(store, null);
  });
});

describe("resolveAutoResume: the pointer lookup fails (R2)", () => {
  test("a 401 on the pointer read is refused: a failed lookup is never 'nothing there'", async () => {
    const store = freshStore();
    const [p] = await publishSteps(store, [10]);
    th.hub.setFaults({ status: { pointerRead: 401 } });
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R2",
      /could not read latest\.json on tester\/resume-\d+: HTTP 401.*A failed lookup is never "nothing there"/,
    );
    await assertPointer(store, p);
  });

  test("a pointer read that times out is refused", async () => {
    // The set-up (create, upload, pointer) runs with the default timeout: only the request under test
    // gets the short one, so a busy machine cannot fail the set-up.
    const store = freshStore();
    const [p] = await publishSteps(store, [10]);
    const impatient = th.store({ repo: store.repo, timeoutMs: 300 });
    th.hub.setFaults({ delayMs: { pointerRead: 3000 } });
    // The message is the client-side timeout's (the server's delayed answer would have been a success).
    await refusal(
      resolveAutoResume(impatient, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R2",
      /could not read latest\.json .*timed out after 300 ms.*A failed lookup is never "nothing there"/,
    );
    await assertPointer(store, p);
  });

  test("a 500 on the pointer read is refused", async () => {
    const store = freshStore();
    await publishSteps(store, [10]);
    th.hub.setFaults({ status: { pointerRead: 500 } });
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R2",
      /could not read latest\.json .*HTTP 500/,
    );
  });

  test("an unreachable Hub is refused as a network failure", async () => {
    const gone = new LocalHub({ dir: path.join(th.tmp, "gone") });
    const url = await gone.start();
    await gone.stop(); // nothing listens on this port any more
    const dead = th.store({ hubUrl: url, repo: "tester/nowhere" });
    await refusal(
      resolveAutoResume(dead, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R2",
      /could not read latest\.json .*network error: ECONNREFUSED/,
    );
  });
});

describe("resolveAutoResume: the pointer is found (R3, R4)", () => {
  test("the pointed checkpoint is downloaded, checked and returned with the prior loss", async () => {
    const store = freshStore();
    const [, p20] = await publishSteps(store, [10, 20]);
    const lines: string[] = [];
    const r = await resolveAutoResume(store, { destDir: dest(), log: (l) => lines.push(l), retryDelayMs: 10 });
    assert.equal(r.kind, "checkpoint");
    if (r.kind !== "checkpoint") return;
    assert.deepEqual(r.pointer, p20);
    assert.equal(r.dir, path.join(dest(), "checkpoint-20"));
    assert.deepEqual(fs.readdirSync(r.dir).sort(), [
      "config.json",
      "cursor.json",
      "model.safetensors",
      "optimizer.safetensors",
      "trainer_state.json",
    ]);
    assert.equal(r.priorLoss, 3.8);
    assert.match(lines.join("\n"), /prior loss at resume: 3\.8/);
  });

  test("a checkpoint newer than the pointer is refused: the pointer is behind the run", async () => {
    const store = freshStore();
    const [p10] = await publishSteps(store, [10]);
    const ck = writeFakeCheckpoint(path.join(th.tmp, `res${n}`, "checkpoint-20"), { step: 20 });
    await store.uploadFolder(ck.dir, ck.path_in_repo, "checkpoint 20 whose pointer write never happened");
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R3",
      /latest\.json on tester\/resume-\d+ points at step 10 .* also holds ckpt\/checkpoint-20, which has no manifest\.json to prove it complete: the pointer is behind the run.*--resume-ignore-unproven/,
    );
    await assertPointer(store, p10);
  });

  test("a listing that fails once is retried once and then succeeds", async () => {
    const store = freshStore();
    await publishSteps(store, [10]);
    th.hub.setFaults({ status: { list: 503 }, failCount: 1 });
    const lines: string[] = [];
    const r = await resolveAutoResume(store, { destDir: dest(), log: (l) => lines.push(l), retryDelayMs: 10 });
    assert.equal(r.kind, "checkpoint");
    assert.match(lines.join("\n"), /checkpoint scan attempt 1 failed: HTTP 503/);
  });

  test("a failed scan's log line cuts the Hub's error to 200 characters; the refusal gives it whole (R3)", async () => {
    // A long owner and repo name make the client's error (it quotes the URL) longer than 200 characters.
    const store = th.store({ repo: `${"o".repeat(30)}/${"x".repeat(80)}-${++n}` });
    await publishSteps(store, [10]);
    th.hub.setFaults({ status: { list: 500 } });
    const lines: string[] = [];
    let full = "";
    await assert.rejects(
      resolveAutoResume(store, { destDir: dest(), log: (l) => lines.push(l), retryDelayMs: 10 }),
      (e: Error) => {
        full = /could not enumerate \S+ \((HTTP 500: .*)\), so it cannot prove/.exec(e.message)?.[1] ?? "";
        return e.name === "UserError";
      },
    );
    assert.ok(
      full.length > 200,
      `the Hub's error should be over 200 characters for this test, got ${full.length}: ${full}`,
    );
    const logged = lines.filter((l) => l.startsWith("resume auto: checkpoint scan attempt "));
    assert.deepEqual(
      logged,
      [1, 2].map((a) => `resume auto: checkpoint scan attempt ${a} failed: ${full.slice(0, 200)}`),
    );
  });

  test("a listing that keeps failing is refused: the pointer cannot be proven newest", async () => {
    const store = freshStore();
    const [p] = await publishSteps(store, [10]);
    th.hub.setFaults({ status: { list: 500 } });
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R3",
      /could not enumerate tester\/resume-\d+ \(HTTP 500.*cannot prove latest\.json \(step 10\) is the newest state/,
    );
    await assertPointer(store, p);
  });

  test("a download cut short mid-body is refused", async () => {
    const store = freshStore();
    const [p] = await publishSteps(store, [10], { modelValues: 4096 });
    th.hub.setFaults({ truncateDownload: ["model.safetensors"], truncateMode: "cut" });
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R4",
      /could not download ckpt\/checkpoint-10 from tester\/resume-\d+: .*Refusing to resume from a partial checkpoint/,
    );
    await assertPointer(store, p);
  });

  test("a download whose content is short but self-consistent is refused", async () => {
    const store = freshStore();
    const [p] = await publishSteps(store, [10], { modelValues: 4096 });
    th.hub.setFaults({ truncateDownload: ["model.safetensors"], truncateMode: "short" });
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R4",
      /could not download .*model\.safetensors .* is not what the Hub lists: \d+ bytes where the listing says 16\d{3}/,
    );
    await assertPointer(store, p);
  });

  test("a checkpoint whose model.safetensors is not real weights is refused", async () => {
    const store = freshStore();
    await store.ensureRepo();
    const ck = writeFakeCheckpoint(path.join(th.tmp, `res${n}`, "checkpoint-10"), { step: 10 });
    const f = path.join(ck.dir, "model.safetensors");
    fs.writeFileSync(f, fs.readFileSync(f).subarray(0, fs.statSync(f).size - 16)); // truncated at the source
    await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: false,
      minFreeGb: 0,
      log: () => {},
    });
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R4",
      /model\.safetensors is not real weights: .*tensors cover 256 bytes but the file holds 240 bytes/,
    );
  });

  test("a checkpoint without model.safetensors is refused", async () => {
    const store = freshStore();
    await store.ensureRepo();
    const ck = writeFakeCheckpoint(path.join(th.tmp, `res${n}`, "checkpoint-10"), { step: 10 });
    fs.rmSync(path.join(ck.dir, "model.safetensors"));
    await publishCheckpoint(store, {
      localDir: ck.dir,
      pathInRepo: ck.path_in_repo,
      pointer: pointerOf(ck),
      prune: false,
      minFreeGb: 0,
      log: () => {},
    });
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10 }),
      "R4",
      /has no model\.safetensors: not real weights/,
    );
  });

  test("a download under minBytes is refused as not real weights", async () => {
    const store = freshStore();
    await publishSteps(store, [10]);
    await refusal(
      resolveAutoResume(store, { destDir: dest(), log: () => {}, retryDelayMs: 10, minBytes: 1_000_000 }),
      "R4",
      /under the 1000000 bytes a real checkpoint holds: not real weights/,
    );
  });
});
