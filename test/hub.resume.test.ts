// R2–R4: --resume auto against a real LocalHub through the real @huggingface/hub client.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { test, describe } from "node:test";
import { useTestHub, writeFakeCheckpoint, pointerOf, publishNext, type TestHub } from "./helpers/hub";
import { resolveAutoResume, checkpointSteps, type AutoResume } from "../src/hub/resume";
import { LocalHub } from "../src/hub/server";
import type { HubClient, Pointer, RemoteFile } from "../src/hub/client";
import { createHash } from "node:crypto";
import { listCommits } from "@huggingface/hub";
import { priorLossOf } from "../src/checkpoint";

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
    await publishNext(store, ck);
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
    await publishNext(store, ck);
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
    await publishNext(store, ck);
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

// R3–R6, rule by rule: which checkpoint --resume auto continues from, one behaviour per test, against a real
// LocalHub through the real @huggingface/hub client (they also kill the mutants of src/hub/resume.ts, test/MUTATION.md).
describe("--resume auto, rule by rule (R3-R6)", () => {
  let th: TestHub;
  let n = 0;

  useTestHub({}, (t) => (th = t));

  type Ck = Pointer & { dir: string };

  /** K7: writes manifest.json (size + sha256 of every other file) into a checkpoint folder, as the trainer does. */
  function addManifest(
    dir: string,
    step: number,
    edit: (files: Record<string, { size: number; sha256: string }>) => void = () => {},
  ): void {
    const files: Record<string, { size: number; sha256: string }> = {};
    for (const name of fs.readdirSync(dir).sort()) {
      if (name === "manifest.json") continue;
      const b = fs.readFileSync(path.join(dir, name));
      files[name] = { size: b.length, sha256: createHash("sha256").update(b).digest("hex") };
    }
    edit(files);
    fs.writeFileSync(path.join(dir, "manifest.json"), JSON.stringify({ format: "tstrain-manifest/1", step, files }));
  }

  function freshStore(): HubClient {
    return th.store({ repo: `tester/rules-${++n}` });
  }

  /** A local checkpoint folder of this repo's run, with a manifest unless told otherwise. */
  function localCheckpoint(
    step: number,
    o: { manifest?: boolean; loss?: number; seqsPerStep?: number; fingerprint?: string; seed?: number } = {},
  ): Ck {
    const ck = writeFakeCheckpoint(path.join(th.tmp, `rules${n}`, `checkpoint-${step}`), {
      step,
      loss: o.loss ?? 4 - step / 100,
      seqsPerStep: o.seqsPerStep,
      fingerprint: o.fingerprint,
      seed: o.seed,
    });
    if (o.manifest !== false) addManifest(ck.dir, step);
    return ck;
  }

  /** Publishes checkpoints through the K3 cycle: each one moves latest.json. */
  async function published(store: HubClient, steps: number[]): Promise<Ck[]> {
    await store.ensureRepo();
    const out: Ck[] = [];
    for (const step of steps) {
      const ck = localCheckpoint(step);
      await publishNext(store, ck);
      out.push(ck);
    }
    return out;
  }

  /** A checkpoint folder committed without moving latest.json (what a lost pointer commit leaves). */
  async function committedOnly(store: HubClient, ck: Ck): Promise<void> {
    await store.ensureRepo();
    await store.uploadFolder(ck.dir, ck.path_in_repo, `checkpoint ${ck.step} without its pointer`);
  }

  const dest = () => path.join(th.tmp, `dest-${n}`);

  async function resume(
    store: HubClient,
    o: { ignoreUnproven?: boolean; localRoots?: string[]; minBytes?: number } = {},
  ): Promise<{ r: AutoResume; lines: string[] }> {
    const lines: string[] = [];
    const r = await resolveAutoResume(store, { destDir: dest(), log: (l) => lines.push(l), retryDelayMs: 10, ...o });
    return { r, lines };
  }

  async function refusal(p: Promise<unknown>, rule: string, re: RegExp): Promise<void> {
    await assert.rejects(p, (e: Error & { rule?: string }) => {
      assert.equal(e.name, "UserError");
      assert.equal(e.rule, rule);
      assert.match(e.message, re);
      return true;
    });
  }

  function resumedAt(r: AutoResume, want: Pointer): string {
    assert.equal(r.kind, "checkpoint");
    if (r.kind !== "checkpoint") throw new Error("unreachable");
    assert.deepEqual(r.pointer, pointerOf(want));
    return r.dir;
  }

  /** Each way a newer checkpoint folder can fail to prove itself complete (R5), and the reason logged. */
  const UNPROVEN: { name: string; make: (ck: Ck) => void; reason: RegExp }[] = [
    {
      name: "a manifest that is not JSON",
      make: (ck) => fs.writeFileSync(path.join(ck.dir, "manifest.json"), "{ not json"),
      reason: /ckpt\/checkpoint-20\/manifest\.json is not valid JSON/,
    },
    { name: "a manifest of another step", make: (ck) => addManifest(ck.dir, 19), reason: /its manifest says step 19$/ },
    {
      name: "a file the manifest lists but the Hub lacks",
      make: (ck) => addManifest(ck.dir, 20, (f) => (f["extra.bin"] = { size: 3, sha256: "a".repeat(64) })),
      reason: /it does not match its manifest: extra\.bin missing$/,
    },
    {
      name: "a file whose size differs from the manifest",
      make: (ck) => addManifest(ck.dir, 20, (f) => (f["config.json"].size += 1)),
      reason: /it does not match its manifest: config\.json is (\d+) bytes, the manifest says (\d+)$/,
    },
    {
      name: "a file whose sha256 differs from the manifest",
      make: (ck) => addManifest(ck.dir, 20, (f) => (f["model.safetensors"].sha256 = `0123456789ab${"c".repeat(52)}`)),
      reason:
        /it does not match its manifest: model\.safetensors has sha256 [0-9a-f]{12}…, the manifest says 0123456789ab…$/,
    },
    {
      name: "a file the manifest does not list",
      make: (ck) => {
        fs.writeFileSync(path.join(ck.dir, "stray.json"), "{}");
        addManifest(ck.dir, 20, (f) => delete f["stray.json"]);
      },
      reason: /it does not match its manifest: stray\.json is not in the manifest$/,
    },
    {
      name: "five problems at once (four named, the rest counted)",
      make: (ck) =>
        addManifest(ck.dir, 20, (f) => {
          for (const k of ["a", "b", "c", "d", "e"]) f[`${k}.bin`] = { size: 1, sha256: "b".repeat(64) };
        }),
      reason:
        /it does not match its manifest: a\.bin missing; b\.bin missing; c\.bin missing; d\.bin missing \(\+1 more\)$/,
    },
    {
      name: "exactly four files the Hub lacks (all named, no '+0 more')",
      make: (ck) =>
        addManifest(ck.dir, 20, (f) => {
          for (const k of ["a", "b", "c", "d"]) f[`${k}.bin`] = { size: 1, sha256: "b".repeat(64) };
        }),
      reason: /it does not match its manifest: a\.bin missing; b\.bin missing; c\.bin missing; d\.bin missing$/,
    },
    {
      name: "a cursor.json that is not JSON",
      make: (ck) => {
        fs.writeFileSync(path.join(ck.dir, "cursor.json"), "not json");
        addManifest(ck.dir, 20);
      },
      reason: /its cursor\.json is damaged \(ckpt\/checkpoint-20\/cursor\.json is not valid JSON \(.+\)\)$/,
    },
    {
      name: "a cursor of another step",
      make: (ck) => {
        editCursor(ck, (c) => (c.step = 7));
        addManifest(ck.dir, 20);
      },
      reason: /its cursor says step 7, not 20$/,
    },
    {
      name: "a cursor whose samples_consumed is not an integer",
      make: (ck) => {
        editCursor(ck, (c) => (c.samples_consumed = 1.5));
        addManifest(ck.dir, 20);
      },
      reason:
        /its cursor\.json is damaged \(ckpt\/checkpoint-20\/cursor\.json: cursor samples_consumed=1\.5 must be a whole number >= 0\)$/,
    },
    {
      name: "a cursor whose seq_len is not an integer",
      make: (ck) => {
        editCursor(ck, (c) => (c.seq_len = "16"));
        addManifest(ck.dir, 20);
      },
      reason:
        /its cursor\.json is damaged \(ckpt\/checkpoint-20\/cursor\.json: cursor seq_len="16" must be a positive whole number\)$/,
    },
    {
      name: "a cursor of another data fingerprint",
      make: (ck) => {
        editCursor(ck, (c) => (c.dataset_files_sha = "e".repeat(64)));
        addManifest(ck.dir, 20);
      },
      reason: /its cursor names another data fingerprint or seed than latest\.json$/,
    },
    {
      name: "a cursor of another shuffle seed",
      make: (ck) => {
        editCursor(ck, (c) => (c.shuffle_seed = 7));
        addManifest(ck.dir, 20);
      },
      reason: /its cursor names another data fingerprint or seed than latest\.json$/,
    },
    {
      name: "a cursor whose samples per step differ from latest.json's",
      make: (ck) => {
        editCursor(ck, (c) => (c.samples_consumed = 20 * 9));
        addManifest(ck.dir, 20);
      },
      reason: /its cursor's 180 samples at step 20 do not match latest\.json's samples per step$/,
    },
  ];

  function editCursor(ck: Ck, f: (c: Record<string, unknown>) => void): void {
    const p = path.join(ck.dir, "cursor.json");
    const c = JSON.parse(fs.readFileSync(p, "utf8")) as Record<string, unknown>;
    f(c);
    fs.writeFileSync(p, JSON.stringify(c));
  }

  describe("R5: a newer checkpoint that proves complete against its manifest moves the pointer forward", () => {
    test("a newer complete checkpoint with a consistent cursor is rolled forward onto, and the run resumes there (R5)", async () => {
      const store = freshStore();
      const [p10] = await published(store, [10]);
      const ck20 = localCheckpoint(20);
      await committedOnly(store, ck20);
      const { r, lines } = await resume(store);
      resumedAt(r, ck20);
      assert.deepEqual(await store.readPointer(), pointerOf(ck20), "latest.json was moved onto step 20");
      assert.ok(
        lines.includes(
          "resume auto: latest.json pointed at step 10 (ckpt/checkpoint-10), but ckpt/checkpoint-20 proves complete against its manifest (6 files, sizes and sha256 equal) with a consistent cursor: rolled forward, latest.json now points at step 20 (R5)",
        ),
        lines.join("\n"),
      );
      assert.ok(p10);
    });

    test("the newest complete checkpoint wins: an unproven newest one is skipped for an older complete one (R5)", async () => {
      const store = freshStore();
      await published(store, [10]);
      const ck20 = localCheckpoint(20);
      await committedOnly(store, ck20);
      const ck30 = localCheckpoint(30);
      addManifest(ck30.dir, 29);
      await committedOnly(store, ck30);
      const { r, lines } = await resume(store);
      resumedAt(r, ck20);
      assert.equal(
        lines.filter((l) =>
          /ignoring ckpt\/checkpoint-30 \(newer than latest\.json's step (10|20)\): its manifest says step 29/.test(l),
        ).length,
        2,
        lines.join("\n"),
      );
      assert.ok(
        lines.some((l) => /latest\.json pointed at step 10 .* ckpt\/checkpoint-20 proves complete/.test(l)),
        lines.join("\n"),
      );
    });

    test("at step 0 the pointer implies no samples per step, so any cursor count is consistent (R5)", async () => {
      const store = freshStore();
      await store.ensureRepo();
      const ck0 = writeFakeCheckpoint(path.join(th.tmp, `rules${n}`, "checkpoint-0"), { step: 0 });
      await publishNext(store, ck0);
      const ck20 = localCheckpoint(20, { seqsPerStep: 3 });
      await committedOnly(store, ck20);
      const { r } = await resume(store);
      resumedAt(r, ck20);
    });

    for (const u of UNPROVEN) {
      test(`a newer checkpoint with ${u.name} is ignored with its reason, and the run resumes from the pointer (R5)`, async () => {
        const store = freshStore();
        const [p10] = await published(store, [10]);
        const ck20 = localCheckpoint(20);
        u.make(ck20);
        await committedOnly(store, ck20);
        const { r, lines } = await resume(store);
        resumedAt(r, p10);
        const line = lines.find((l) =>
          l.startsWith("resume auto: ignoring ckpt/checkpoint-20 (newer than latest.json's step 10): "),
        );
        assert.ok(line, lines.join("\n"));
        const reason = line
          .slice("resume auto: ignoring ckpt/checkpoint-20 (newer than latest.json's step 10): ".length)
          .replace(/; resuming from the pointer, and the next commit of step 20 overwrites that folder \(R5\)$/, "");
        assert.match(reason, u.reason);
        if (u.name.includes("size differs")) {
          const [, got, want] = u.reason.exec(reason)!;
          assert.equal(Number(want), Number(got) + 1);
        }
        assert.deepEqual(await store.readPointer(), pointerOf(p10), "latest.json is unmoved");
      });
    }

    test("a newer checkpoint without a manifest is refused (R3) unless --resume-ignore-unproven, which resumes from the pointer", async () => {
      const store = freshStore();
      const [p10] = await published(store, [10]);
      await committedOnly(store, localCheckpoint(20, { manifest: false }));
      await refusal(
        resume(store),
        "R3",
        /points at step 10 \(ckpt\/checkpoint-10\) but the repo also holds ckpt\/checkpoint-20, which has no manifest\.json to prove it complete.*run the same command with --resume-ignore-unproven \[R3\]$/,
      );
      const { r, lines } = await resume(store, { ignoreUnproven: true });
      resumedAt(r, p10);
      assert.ok(
        lines.includes(
          "resume auto: ignoring ckpt/checkpoint-20 (newer than latest.json's step 10): it has no manifest.json; resuming from the pointer, and the next commit of step 20 overwrites that folder (R5)",
        ),
        lines.join("\n"),
      );
    });

    test("checkpoints older than the pointer are not judged (R5)", async () => {
      const store = freshStore();
      await store.ensureRepo();
      await committedOnly(store, localCheckpoint(5, { manifest: false }));
      const [p10] = await published(store, [10]);
      const { r, lines } = await resume(store);
      resumedAt(r, p10);
      assert.equal(lines.filter((l) => /checkpoint-5/.test(l)).length, 0, lines.join("\n"));
    });

    test("a newer checkpoint that cannot be checked (the Hub fails) is refused, never guessed (R3)", async () => {
      const store = freshStore();
      const [p10] = await published(store, [10]);
      await committedOnly(store, localCheckpoint(20));
      th.hub.setFaults({ status: { resolve: 403 } });
      await refusal(
        resume(store),
        "R3",
        /could not check ckpt\/checkpoint-20 on tester\/rules-\d+, newer than latest\.json \(step 10\): HTTP 403.*Refusing rather than guess/,
      );
      th.hub.clearFaults();
      assert.deepEqual(await store.readPointer(), pointerOf(p10));
    });

    test("a newer checkpoint whose cursor.json download fails is refused as unchecked, not ignored as a damaged cursor (R3)", async () => {
      const store = freshStore();
      const [p10] = await published(store, [10]);
      await committedOnly(store, localCheckpoint(20));
      // The listing (which reads cursor.json to hash it) succeeds; the Hub then fails the cursor check's own download.
      const s = Object.create(store) as HubClient;
      let reads = 0;
      s.download = async (p, ...rest) => {
        if (p.endsWith("checkpoint-20/cursor.json") && ++reads === 2) th.hub.setFaults({ status: { resolve: 503 } });
        try {
          return await store.download(p, ...rest);
        } finally {
          th.hub.clearFaults();
        }
      };
      await refusal(
        resume(s),
        "R3",
        /could not check ckpt\/checkpoint-20 on tester\/rules-\d+, newer than latest\.json \(step 10\): HTTP 503.*Refusing rather than guess/,
      );
      assert.equal(reads, 2, "the listing read cursor.json once, the cursor check once");
      th.hub.clearFaults();
      assert.deepEqual(await store.readPointer(), pointerOf(p10));
    });
  });

  describe("R5: a missing pointer is restored from the newest checkpoint that proves complete", () => {
    test("with no latest.json, the newest complete checkpoint restores the pointer and the run resumes there (R5)", async () => {
      const store = freshStore();
      const ck10 = localCheckpoint(10);
      const ck20 = localCheckpoint(20);
      await committedOnly(store, ck10);
      await committedOnly(store, ck20);
      assert.equal(await store.readPointer(), null);
      const { r, lines } = await resume(store);
      resumedAt(r, ck20);
      assert.deepEqual(await store.readPointer(), pointerOf(ck20));
      assert.ok(
        lines.some((l) =>
          l.startsWith(
            "resume auto: latest.json was missing, but ckpt/checkpoint-20 proves complete against its manifest (6 files",
          ),
        ),
        lines.join("\n"),
      );
    });

    test("a roll-forward whose pointer commit lands but loses its answer is retried as a retry and finds its own commit: one pointer commit (R5, K8)", async () => {
      const store = freshStore();
      const ck20 = localCheckpoint(20);
      await committedOnly(store, ck20);
      th.hub.setFaults({ loseCommitAnswer: ["latest.json"], failCount: 1 });
      const { r, lines } = await resume(store);
      resumedAt(r, ck20);
      assert.deepEqual(await store.readPointer(), pointerOf(ck20));
      assert.ok(
        lines.some((l) => /^hub: write of latest\.json -> ckpt\/checkpoint-20 failed \(attempt 1: HTTP 500/.test(l)),
        lines.join("\n"),
      );
      const titles: string[] = [];
      for await (const c of listCommits({ repo: { type: "dataset", name: store.repo }, hubUrl: th.url }))
        titles.push(c.title);
      assert.equal(titles.length, 3, `repo creation, the checkpoint, one pointer commit: ${titles.join(" | ")}`);
    });

    test("another writer's identical latest.json, committed after the roll-forward read the head, is another writer's: refused, not adopted (R5, K8)", async () => {
      const store = freshStore();
      const ck20 = localCheckpoint(20);
      await committedOnly(store, ck20);
      const other = th.store({ repo: store.repo });
      const s = Object.create(store) as HubClient; // the same real store; another writer commits right after its head read
      s.followHead = async (...a) => {
        const head = await store.followHead(...a);
        await other.writePointer(pointerOf(ck20));
        return head;
      };
      await assert.rejects(resolveAutoResume(s, { destDir: dest(), log: () => {}, retryDelayMs: 10 }), {
        name: "ConcurrentWriterError",
      });
      const titles: string[] = [];
      for await (const c of listCommits({ repo: { type: "dataset", name: store.repo }, hubUrl: th.url }))
        titles.push(c.title);
      assert.equal(titles.filter((t) => t.startsWith("latest.json -> ")).length, 1, titles.join(" | "));
    });

    test("with no latest.json, a newest checkpoint that does not prove complete is passed over for an older one that does (R5)", async () => {
      const store = freshStore();
      const ck10 = localCheckpoint(10);
      const ck20 = localCheckpoint(20);
      addManifest(ck20.dir, 20, (f) => (f["config.json"].size += 1));
      await committedOnly(store, ck10);
      await committedOnly(store, ck20);
      const { r, lines } = await resume(store);
      resumedAt(r, ck10);
      assert.ok(
        lines.some((l) =>
          /^resume auto: ckpt\/checkpoint-20 cannot restore the missing pointer: it does not match its manifest: config\.json is \d+ bytes/.test(
            l,
          ),
        ),
        lines.join("\n"),
      );
    });

    test("with no latest.json and no checkpoint that proves complete, the run is refused and each one's reason is logged (R2)", async () => {
      const store = freshStore();
      await committedOnly(store, localCheckpoint(10, { manifest: false }));
      const ck20 = localCheckpoint(20);
      fs.writeFileSync(path.join(ck20.dir, "cursor.json"), "not json");
      await committedOnly(store, ck20);
      const lines: string[] = [];
      await refusal(
        resolveAutoResume(store, { destDir: dest(), log: (l) => lines.push(l), retryDelayMs: 10 }),
        "R2",
        /holds 2 checkpoint folder\(s\) \(ckpt\/checkpoint-10, ckpt\/checkpoint-20\)\. The pointer is missing, not the run/,
      );
      assert.equal(lines.length, 2, lines.join("\n"));
      assert.match(
        lines[0],
        /^resume auto: ckpt\/checkpoint-20 cannot restore the missing pointer: it does not match its manifest: cursor\.json is 8 bytes/,
      );
      assert.equal(
        lines[1],
        "resume auto: ckpt/checkpoint-10 cannot restore the missing pointer: it has no manifest.json",
      );
      assert.equal(await store.readPointer(), null);
    });

    test("with no latest.json, the R2 refusal counts every folder and names the newest three (R2)", async () => {
      const store = freshStore();
      for (const step of [10, 20, 30, 40]) await committedOnly(store, localCheckpoint(step, { manifest: false }));
      const ck = writeFakeCheckpoint(path.join(th.tmp, `rules${n}`, "final"), { step: 50 });
      await store.uploadFolder(ck.dir, "final", "final export");
      const lines: string[] = [];
      await refusal(
        resolveAutoResume(store, { destDir: dest(), log: (l) => lines.push(l), retryDelayMs: 10 }),
        "R2",
        /holds 5 checkpoint folder\(s\) \(ckpt\/checkpoint-30, ckpt\/checkpoint-40, final\)\. The pointer is missing/,
      );
      assert.equal(lines.length, 4, lines.join("\n"));
    });

    test("with no latest.json, a final/ folder alone is refused: the pointer is missing, not the run (R2)", async () => {
      const store = freshStore();
      await store.ensureRepo();
      const ck = writeFakeCheckpoint(path.join(th.tmp, `rules${n}`, "final"), { step: 30 });
      await store.uploadFolder(ck.dir, "final", "final export");
      await refusal(resume(store), "R2", /holds 1 checkpoint folder\(s\) \(final\)\. The pointer is missing/);
    });

    test("with no latest.json, a checkpoint whose check fails (the Hub errs) is reported and not used (R2)", async () => {
      const store = freshStore();
      await committedOnly(store, localCheckpoint(10));
      th.hub.setFaults({ status: { resolve: 403 } });
      const lines: string[] = [];
      await refusal(
        resolveAutoResume(store, { destDir: dest(), log: (l) => lines.push(l), retryDelayMs: 10 }),
        "R2",
        /holds 1 checkpoint folder/,
      );
      assert.equal(lines.length, 1, lines.join("\n"));
      assert.match(
        lines[0],
        /^resume auto: ckpt\/checkpoint-10 cannot restore the missing pointer: checking it failed: HTTP 403/,
      );
    });
  });

  describe("R3: the pointed folder must hold files; a final pointer means the run is complete", () => {
    test("a pointer to a folder that holds nothing is refused, even when a longer folder name shares its prefix (R3)", async () => {
      const store = freshStore();
      await committedOnly(store, localCheckpoint(10, { manifest: false }));
      const p1 = pointerOf(localCheckpoint(1));
      await store.writePointer(p1);
      await refusal(
        resume(store, { ignoreUnproven: true }),
        "R3",
        /points at ckpt\/checkpoint-1 \(step 1\) but the repo holds no files there; refusing to resume from a pointer to nothing/,
      );
    });

    test("a pointer at final/ reports the run complete without judging checkpoint folders (R3, G4)", async () => {
      const store = freshStore();
      await published(store, [10]);
      await committedOnly(store, localCheckpoint(40, { manifest: false }));
      const ck = writeFakeCheckpoint(path.join(th.tmp, `rules${n}`, "final"), { step: 30 });
      await store.uploadFolder(ck.dir, "final", "final export");
      const pointer = { ...pointerOf(ck), path_in_repo: "final" };
      await store.writePointer(pointer);
      const { r, lines } = await resume(store);
      assert.deepEqual(r, { kind: "complete", pointer });
      assert.deepEqual(lines, ["resume auto: latest.json points at final (step 30): the run is complete"]);
      assert.equal(fs.existsSync(dest()), false, "nothing is downloaded");
    });
  });

  describe("R4: what is brought down must be real weights", () => {
    test("a download of exactly minBytes is accepted; one byte more required is refused (R4)", async () => {
      const store = freshStore();
      const [p10] = await published(store, [10]);
      const bytes = (await store.list("ckpt/checkpoint-10")).reduce((s, f) => s + f.size, 0);
      const { r, lines } = await resume(store, { minBytes: bytes });
      resumedAt(r, p10);
      assert.equal(lines[0], "auto-resume: hub says step 10 at ckpt/checkpoint-10");
      assert.match(lines[1], new RegExp(`^downloaded 6 files, ${(bytes / 1e6).toFixed(1)} MB in \\d+\\.\\ds$`));
      await refusal(
        resume(store, { minBytes: bytes + 1 }),
        "R4",
        new RegExp(
          `downloaded ${bytes} bytes for ckpt/checkpoint-10, under the ${bytes + 1} bytes a real checkpoint holds`,
        ),
      );
    });

    test("a stale folder at the download destination is replaced, not merged (R4)", async () => {
      const store = freshStore();
      await published(store, [10]);
      fs.mkdirSync(path.join(dest(), "checkpoint-10"), { recursive: true });
      fs.writeFileSync(path.join(dest(), "checkpoint-10", "stale.bin"), "old");
      const { r } = await resume(store);
      assert.equal(r.kind === "checkpoint" && r.dir, path.join(dest(), "checkpoint-10"));
      assert.equal(fs.existsSync(path.join(dest(), "checkpoint-10", "stale.bin")), false);
    });

    test("a checkpoint without optimizer.safetensors is brought down (completeness is the caller's), one whose optimizer is not real weights is refused (R4)", async () => {
      const store = freshStore();
      await store.ensureRepo();
      const ck = localCheckpoint(10, { manifest: false });
      fs.rmSync(path.join(ck.dir, "optimizer.safetensors"));
      await publishNext(store, ck);
      const { r } = await resume(store);
      resumedAt(r, ck);
      fs.writeFileSync(path.join(ck.dir, "optimizer.safetensors"), "not safetensors at all");
      await publishNext(store, ck);
      await refusal(resume(store), "R4", /but optimizer\.safetensors is not real weights: /);
    });

    test("the prior loss is the last finite loss of trainer_state's log history, or unknown (R4)", async () => {
      const store = freshStore();
      await store.ensureRepo();
      const ck = localCheckpoint(10, { manifest: false });
      fs.writeFileSync(
        path.join(ck.dir, "trainer_state.json"),
        JSON.stringify({
          format: "tstrain-trainer-state/1",
          step: 10,
          opt_steps: 10,
          skipped_steps: 0,
          scaler: { scale: 1, growthTracker: 0 },
          lr_shape: { warmup: 0, decayStart: 0, total: 10 },
          seqs_per_step: 8,
          log_history: [{ loss: 2.5 }, { loss: 2.25 }, { eval_loss: 1 }, { loss: "x" }],
        }),
      );
      await publishNext(store, ck);
      let got = await resume(store);
      assert.equal(got.r.kind === "checkpoint" && got.r.priorLoss, 2.25);
      assert.ok(
        got.lines.includes("prior loss at resume: 2.25 -- loss continuity is judged against this number"),
        got.lines.join("\n"),
      );
      fs.rmSync(path.join(ck.dir, "trainer_state.json"));
      await publishNext(store, ck);
      got = await resume(store);
      assert.equal(got.r.kind === "checkpoint" && got.r.priorLoss, null);
      assert.ok(
        got.lines.includes("prior loss at resume: unknown -- loss continuity is judged against this number"),
        got.lines.join("\n"),
      );
    });
  });

  describe("R6: a local copy equal to the Hub's is reused instead of downloaded", () => {
    /** The pointed checkpoint on the Hub, and a local root holding a copy of it under the same name. */
    async function withLocalCopy(
      edit: (dir: string) => void = () => {},
    ): Promise<{ store: HubClient; root: string; ck: Ck }> {
      const store = freshStore();
      const [ck] = await published(store, [10]);
      const root = path.join(th.tmp, `local-${n}`);
      fs.cpSync(ck.dir, path.join(root, "checkpoint-10"), { recursive: true });
      edit(path.join(root, "checkpoint-10"));
      return { store, root, ck: ck };
    }

    test("an equal local copy is used as is: nothing is downloaded (R6)", async () => {
      const { store, root, ck } = await withLocalCopy();
      const { r, lines } = await resume(store, { localRoots: [path.join(th.tmp, "nowhere"), root] });
      assert.equal(resumedAt(r, ck), path.join(root, "checkpoint-10"));
      assert.ok(
        lines.includes(
          `auto-resume: reusing the local copy ${path.join(root, "checkpoint-10")}: its 6 files match the Hub's sizes and hashes (sha256 for the weights), so nothing is downloaded (R6)`,
        ),
        lines.join("\n"),
      );
      assert.equal(fs.existsSync(dest()), false, "nothing was downloaded");
      assert.equal(
        lines.filter((l) => l.includes("is not the Hub's copy")).length,
        0,
        "a root without the folder is passed over silently",
      );
    });

    const DIFFERENT: { name: string; edit: (dir: string) => void; why: string }[] = [
      {
        name: "a file missing locally",
        edit: (d) => fs.rmSync(path.join(d, "config.json")),
        why: "config.json is missing locally",
      },
      {
        name: "a file the Hub does not have",
        edit: (d) => fs.writeFileSync(path.join(d, "notes.txt"), "x"),
        why: "notes.txt is not on the Hub",
      },
      {
        name: "a file in a subfolder the Hub does not have",
        edit: (d) => {
          fs.mkdirSync(path.join(d, "sub"));
          fs.writeFileSync(path.join(d, "sub", "x.bin"), "x");
        },
        why: "sub/x.bin is not on the Hub",
      },
      {
        name: "a file of another size",
        edit: (d) => fs.appendFileSync(path.join(d, "config.json"), " "),
        why: "config.json is ",
      },
      {
        name: "weights with one byte changed (sha256 differs)",
        edit: (d) => flipLastByte(path.join(d, "model.safetensors")),
        why: "model.safetensors differs from the Hub's copy",
      },
      {
        name: "a regular file with one byte changed (git blob id differs)",
        edit: (d) => flipLastByte(path.join(d, "trainer_state.json")),
        why: "trainer_state.json differs from the Hub's copy",
      },
    ];
    for (const c of DIFFERENT) {
      test(`a local copy with ${c.name} is not reused: the checkpoint is downloaded (R6)`, async () => {
        const { store, root, ck } = await withLocalCopy(c.edit);
        const { r, lines } = await resume(store, { localRoots: [root] });
        assert.equal(resumedAt(r, ck), path.join(dest(), "checkpoint-10"));
        const line = lines.find((l) =>
          l.startsWith(`auto-resume: local ${path.join(root, "checkpoint-10")} is not the Hub's copy (`),
        );
        assert.ok(line?.includes(`(${c.why}`) && line.endsWith("); downloading instead"), lines.join("\n"));
        if (c.name.includes("another size"))
          assert.match(line!, /config\.json is (\d+) bytes locally, (\d+) on the Hub/);
      });
    }

    test("a local copy that cannot be read (a dangling link in it) is not reused, with the reason: the checkpoint is downloaded (R6)", async () => {
      const { store, root, ck } = await withLocalCopy((d) => {
        fs.rmSync(path.join(d, "config.json"));
        fs.symlinkSync(path.join(d, "no-such-file"), path.join(d, "config.json"));
      });
      const { r, lines } = await resume(store, { localRoots: [root] });
      assert.equal(resumedAt(r, ck), path.join(dest(), "checkpoint-10"));
      assert.ok(
        lines.some((l) =>
          /is not the Hub's copy \(reading it failed: ENOENT: .*config\.json.*\); downloading instead$/.test(l),
        ),
        lines.join("\n"),
      );
    });

    test("a local root whose checkpoint name is a file, not a folder, is not reused (R6)", async () => {
      const { store, root, ck } = await withLocalCopy((d) => {
        fs.rmSync(d, { recursive: true });
        fs.writeFileSync(d, "a file");
      });
      const { r, lines } = await resume(store, { localRoots: [root] });
      assert.equal(resumedAt(r, ck), path.join(dest(), "checkpoint-10"));
      assert.ok(
        lines.some((l) => l.endsWith("is not the Hub's copy (absent); downloading instead")),
        lines.join("\n"),
      );
    });
  });

  function flipLastByte(p: string): void {
    const b = fs.readFileSync(p);
    b[b.length - 1] ^= 0x01;
    fs.writeFileSync(p, b);
  }

  describe("the checkpoint listing and the prior loss, read directly", () => {
    test("checkpointSteps: every ckpt/checkpoint-N folder once, in numeric order, nothing else (R3)", () => {
      const f = (p: string): RemoteFile => ({ path: p, size: 1, sha256: null });
      const files = [
        "ckpt/checkpoint-10/a",
        "ckpt/checkpoint-9/a",
        "ckpt/checkpoint-10/b",
        "ckpt/checkpoint-100/a",
        "ckpt/checkpoint-x/a",
        "x/ckpt/checkpoint-3/a",
        "ckpt/checkpoint-4",
        "final/a",
        "ckpt/checkpoint-7x/a",
      ].map(f);
      assert.deepEqual(checkpointSteps(files), [9, 10, 100]);
    });

    test("priorLossOf (src/checkpoint): the last finite loss; null without trainer_state.json or without a loss; a damaged one is refused naming it (R4, K2)", () => {
      const d = path.join(th.tmp, "prior");
      fs.mkdirSync(d, { recursive: true });
      const p = path.join(d, "trainer_state.json");
      const state = (log_history: unknown[]) =>
        JSON.stringify({
          format: "tstrain-trainer-state/1",
          step: 3,
          opt_steps: 3,
          skipped_steps: 0,
          scaler: { scale: 1, growthTracker: 0 },
          lr_shape: { warmup: 0, decayStart: 0, total: 3 },
          seqs_per_step: 1,
          log_history,
        });
      const k2 = (re: RegExp) => (e: Error) =>
        e.name === "UserError" && /\[K2\]$/.test(e.message) && e.message.includes(p) && re.test(e.message);
      assert.equal(priorLossOf(d), null);
      fs.writeFileSync(
        p,
        state([{ loss: 3 }, { loss: 2 }, { loss: null }, { loss: Infinity }]).replace(
          "null}]",
          'null},{"loss":1e999}]',
        ),
      );
      assert.equal(priorLossOf(d), 2);
      fs.writeFileSync(p, "{ not json");
      assert.throws(() => priorLossOf(d), k2(/is not valid JSON/));
      fs.writeFileSync(p, JSON.stringify({ step: 3 }));
      assert.throws(() => priorLossOf(d), k2(/is not a tstrain trainer state: format/));
      fs.writeFileSync(p, state([{ step: 1 }]));
      assert.equal(priorLossOf(d), null);
      fs.writeFileSync(p, state([{ loss: 5 }, { loss: 0 }]));
      assert.equal(priorLossOf(d), 0);
    });
  });
});
