// Runs survive what real runs meet: a Hub that goes away and comes back, transient errors, a
// corrupt newer checkpoint, a pointer write that failed, a second writer, SIGTERM. Every run here is
// the real CLI (real signals and exit codes) against the real local Hub through the real client;
// faults are injected in the server, and every action is triggered by a line the run prints.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { LocalHub } from "../src/hub/server";
import { createHubClient } from "../src/hub/client";
import { writeSyntheticMix } from "./helpers/mix";
import { tmpDir } from "./helpers/tmp";
import { tinyRun } from "./helpers/run";
import { MAIN, RestartableHub, adviceAfter, modelBytes, runCli, startCli, type Child } from "./helpers/survive";

const mix = writeSyntheticMix({ vocab: 64, trainTokens: 64 * 1024, valTokens: 1024 });

function args(out: string, url: string, repo: string, extra: string[] = []): string[] {
  return [
    MAIN,
    ...tinyRun(mix.root, out, [
      "--hub-url",
      url,
      "--hub-repo",
      repo,
      "--vocab-size",
      "64",
      "--max-steps",
      "12",
      "--backend",
      "wasm",
      ...extra,
    ]),
  ];
}

const show = (c: Child) =>
  `exit ${c.code} ${c.signal ?? ""}\n--- stdout\n${c.stdout.slice(-4000)}\n--- stderr\n${c.stderr.slice(-3000)}`;
const retries = (c: Child, re: RegExp) =>
  c.stdout.split("\n").filter((l) => /^hub: .* failed \(attempt \d+: .*retrying in/.test(l) && re.test(l)).length;

let hub: LocalHub;
let url: string;
let straight: Buffer;
let straight24: Buffer | null = null;
/** The uninterrupted 24-step run, computed once when a test needs it. */
async function straightOf24(): Promise<Buffer> {
  if (!straight24) {
    const out = tmpDir("tstrain-straight24-");
    const r = await runCli(args(out, url, "me/straight24", ["--max-steps", "24"]));
    assert.equal(r.code, 0, show(r));
    straight24 = modelBytes(path.join(out, "final"));
  }
  return straight24;
}

before(async () => {
  hub = new LocalHub({ dir: tmpDir("tstrain-survive-hub-") });
  url = await hub.start();
  const out = tmpDir("tstrain-straight-");
  const r = await runCli(args(out, url, "me/straight"));
  assert.equal(r.code, 0, show(r));
  straight = modelBytes(path.join(out, "final"));
});

after(async () => {
  await hub.stop();
});

/** Polls (every 20 ms) until an LFS PUT to `h` is in flight, then runs fn once. */
function whenUploadInFlight(h: LocalHub, fn: () => void): void {
  const from = h.requests.length;
  const poll = setInterval(() => {
    if (h.requests.slice(from).some((q) => q.method === "PUT" && q.status === 0)) {
      clearInterval(poll);
      fn();
    }
  }, 20);
  poll.unref();
}

test("the Hub killed and restarted mid-upload: the run retries, completes, and ends bit-identical (K6)", {
  timeout: 240_000,
}, async () => {
  const rh = new RestartableHub();
  const u = await rh.start();
  const out = tmpDir("tstrain-restart-");
  let phase = 0;
  const r = await runCli(args(out, u, "me/restart"), {
    onLine: (l) => {
      if (phase === 0 && /^CKPT 4 .*ok=true/.test(l)) {
        phase = 1;
        rh.hub.setFaults({ delayMs: { upload: 60_000 } }); // checkpoint 8's upload hangs ...
        whenUploadInFlight(rh.hub, () => {
          phase = 2;
          void rh.stop();
        }); // ... and the Hub dies under it
      } else if (phase === 2 && /^hub: .* failed \(attempt \d+: network error/.test(l)) {
        phase = 3;
        void rh.start(); // the same files, the same port, no faults
      }
    },
  });
  try {
    assert.equal(phase, 3, `the Hub was killed mid-upload and restarted after a retry\n${show(r)}`);
    assert.equal(r.code, 0, show(r));
    assert.ok(retries(r, /network error/) >= 1, show(r));
    assert.ok(modelBytes(path.join(out, "final")).equals(straight), "bit-identical to the uninterrupted run");
    const ptr = await createHubClient({ hubUrl: u, repo: "me/restart", repoType: "dataset" }).readPointer();
    assert.equal(ptr?.path_in_repo, "final");
  } finally {
    await rh.stop();
  }
});

test("500s, a timeout and dropped connections for a few attempts are retried, one line each, and the run completes bit-identical (K6)", {
  timeout: 240_000,
}, async () => {
  // The final publication meets them in turn, each fault set when the run reports the one before:
  // two 503s on the commit, then a connection cut mid-download during verification, then a timeout.
  // The run's request limit (5 s) is far above what any set-up request needs on a loaded machine, so only
  // the delayed request times out and the attempt numbers the phases wait for are the faults' own.
  const out = tmpDir("tstrain-flaky-");
  let phase = 0;
  const r = await runCli(args(out, url, "me/flaky", ["--hub-timeout-seconds", "5"]), {
    onLine: (l) => {
      if (phase === 0 && /^CKPT 12 .*ok=true/.test(l)) {
        phase = 1;
        hub.setFaults({ status: { commit: 503 }, failCount: 2 });
      } else if (phase === 1 && /^hub: .* failed \(attempt 2: HTTP 503/.test(l)) {
        phase = 2;
        hub.setFaults({ truncateDownload: ["cursor.json"], truncateMode: "cut", failCount: 1 });
      } else if (phase === 2 && /^hub: verification of final .* failed \(attempt 1: /.test(l)) {
        phase = 3;
        hub.setFaults({ delayMs: { preupload: 20_000 }, failCount: 1 });
      }
    },
  });
  hub.clearFaults();
  assert.equal(r.code, 0, show(r));
  assert.equal(phase, 3, show(r));
  assert.equal(retries(r, /HTTP 503/), 2, show(r));
  assert.ok(retries(r, /^hub: verification of final .*(network error|terminated|closed)/) >= 1, show(r));
  assert.ok(retries(r, /timed out/) >= 1, show(r));
  assert.ok(modelBytes(path.join(out, "final")).equals(straight), "bit-identical");
  const ptr = await createHubClient({ hubUrl: url, repo: "me/flaky", repoType: "dataset" }).readPointer();
  assert.equal(ptr?.path_in_repo, "final");
});

test("a corrupt newer checkpoint on the Hub: the run stops (K4), and the advised --resume auto resumes from the pointer, ignoring it, bit-identical (R5)", {
  timeout: 240_000,
}, async () => {
  const out = tmpDir("tstrain-corrupt-");
  hub.setFaults({ corruptOnCommit: ["checkpoint-8/optimizer.safetensors"] });
  const r = await runCli(args(out, url, "me/corrupt"));
  hub.clearFaults();
  assert.equal(r.code, 2, show(r));
  assert.match(
    r.stderr,
    /checkpoint 8 failed: checkpoint 8 did not verify .*also after one re-upload.*mismatched 1 \[ckpt\/checkpoint-8\/optimizer\.safetensors\]/,
  );
  assert.match(r.stdout, /checkpoint 8 did not verify .*uploading it once more/);
  assert.equal(
    (await createHubClient({ hubUrl: url, repo: "me/corrupt", repoType: "dataset" }).readPointer())?.step,
    4,
  );
  const again = await runCli(adviceAfter(r.stderr, /Continue with:/));
  assert.equal(again.code, 0, show(again));
  assert.match(
    again.stdout,
    /ignoring ckpt\/checkpoint-8 \(newer than latest\.json's step 4\): it does not match its manifest: optimizer\.safetensors has sha256/,
  );
  assert.match(again.stdout, /auto-resume: hub says step 4/);
  assert.ok(modelBytes(path.join(out, "final")).equals(straight), "bit-identical");
});

test("a pointer write that failed after a verified upload: --resume auto rolls forward onto the complete checkpoint, bit-identical (R5)", {
  timeout: 240_000,
}, async () => {
  const out = tmpDir("tstrain-lag-");
  const r = await runCli(args(out, url, "me/lag", ["--hub-retry-minutes", "0.03"]), {
    onLine: (l) => {
      if (/^CKPT 4 .*ok=true/.test(l)) hub.setFaults({ failPointerWrite: true });
    },
  });
  hub.clearFaults();
  assert.equal(r.code, 2, show(r));
  // The first failing pointer write is checkpoint 8's; while it retries, training goes on, and a newer
  // checkpoint may supersede it (K6): the one that gave up is named.
  const m = /checkpoint (\d+) is verified on the Hub .* but latest\.json could not be moved to it: .*kept failing/.exec(
    r.stderr,
  );
  assert.ok(m, show(r));
  const lagged = Number(m[1]);
  assert.equal((await createHubClient({ hubUrl: url, repo: "me/lag", repoType: "dataset" }).readPointer())?.step, 4);
  // A new machine (empty --out): the checkpoint comes from the Hub, not from a local copy.
  const argv = adviceAfter(r.stderr, /Continue with:/);
  argv[argv.indexOf("--out") + 1] = tmpDir("tstrain-lag-b-");
  const again = await runCli(argv);
  assert.equal(again.code, 0, show(again));
  assert.match(
    again.stdout,
    new RegExp(
      `latest\\.json pointed at step 4 .* but ckpt/checkpoint-${lagged} proves complete against its manifest \\(7 files, sizes and sha256 equal\\) with a consistent cursor: rolled forward, latest\\.json now points at step ${lagged} \\(R5\\)`,
    ),
  );
  assert.match(again.stdout, new RegExp(`auto-resume: hub says step ${lagged}`));
  assert.ok(modelBytes(path.join(argv[argv.indexOf("--out") + 1], "final")).equals(straight), "bit-identical");
});

test("two runs on one repo: one stops naming the other writer's commit (K8), the other completes; the pointer never names an unverified checkpoint", {
  timeout: 240_000,
}, async () => {
  const store = createHubClient({ hubUrl: url, repo: "me/two", repoType: "dataset" });
  const bad: string[] = [];
  const checks: Promise<void>[] = [];
  // After every checkpoint either run reports, the folder latest.json names must verify against its manifest.
  const check = async () => {
    const ptr = await store.readPointer().catch(() => null);
    if (!ptr || ptr.path_in_repo === "final") return;
    const raw = await store.download(`${ptr.path_in_repo}/manifest.json`);
    if (!raw) {
      bad.push(`${ptr.path_in_repo} has no manifest`);
      return;
    }
    const m = JSON.parse(raw.toString()) as { files: Record<string, { size: number; sha256: string }> };
    const listed = new Map(
      (await store.list(ptr.path_in_repo)).map((f) => [f.path.slice(ptr.path_in_repo.length + 1), f]),
    );
    for (const [rel, f] of Object.entries(m.files)) {
      const g = listed.get(rel);
      if (!g || g.size !== f.size || g.sha256 !== f.sha256)
        bad.push(`${ptr.path_in_repo}/${rel} does not match its manifest`);
    }
  };
  const onLine = (l: string) => {
    if (/^CKPT \d+ .*ok=true/.test(l)) checks.push(check());
  };
  const [a, b] = await Promise.all([
    startCli(args(tmpDir("tstrain-two-a-"), url, "me/two"), { onLine }).done,
    startCli(args(tmpDir("tstrain-two-b-"), url, "me/two"), { onLine }).done,
  ]);
  await Promise.all(checks);
  await check();
  const codes = [a.code, b.code].sort();
  assert.deepEqual(codes, [0, 2], `${show(a)}\n=====\n${show(b)}`);
  const loser = a.code === 2 ? a : b;
  assert.match(
    loser.stderr,
    /another writer committed to me\/two while this run was using it: .* named parent commit [0-9a-f]{12} but the repo's head is now [0-9a-f]{12} \(HTTP 412\).*\[K8\]/,
  );
  assert.deepEqual(bad, []);
  const ptr = await store.readPointer();
  assert.equal(ptr?.path_in_repo, "final");
  assert.equal(ptr?.step, 12);
});

test("SIGTERM while the Hub is down: the refusal resumes from the local checkpoint the stop just kept, not from the Hub's older one, and ends bit-identical (O3, K6)", {
  timeout: 240_000,
}, async () => {
  const out = tmpDir("tstrain-term-down-");
  const down = Object.fromEntries(
    [
      "repoInfo",
      "revisionInfo",
      "preupload",
      "lfsBatch",
      "upload",
      "commit",
      "commits",
      "list",
      "pathsInfo",
      "resolve",
      "raw",
      "pointerRead",
    ].map((e) => [e, 503]),
  );
  let sent = false;
  const live = startCli(args(out, url, "me/term-down", ["--hub-retry-minutes", "0.05"]), {
    onLine: (l, c) => {
      if (/^CKPT 4 .*ok=true/.test(l)) hub.setFaults({ status: down });
      if (!sent && /^step 6\/12 loss=/.test(l)) {
        sent = true;
        c.kill("SIGTERM");
      }
    },
  });
  const r = await live.done;
  hub.clearFaults();
  assert.ok(sent, show(r));
  assert.equal(r.code, 2, show(r));
  const m =
    /checkpoint (\d+) failed: .*Continue from the local copy of checkpoint \1 with: node dist\/main\.js .* --resume (\S+\/ckpt\/checkpoint-\1) \(--resume auto would restart from the Hub's last verified checkpoint/.exec(
      r.stderr,
    );
  assert.ok(m, show(r));
  const k = Number(m[1]);
  assert.ok(k >= 6 && k < 12, `stopped at ${k}`);
  assert.equal(
    (await createHubClient({ hubUrl: url, repo: "me/term-down", repoType: "dataset" }).readPointer())?.step,
    4,
    "the Hub holds checkpoint 4 only",
  );
  const again = await runCli(adviceAfter(r.stderr, /with:/));
  assert.equal(again.code, 0, show(again));
  assert.match(again.stdout, new RegExp(`resume from \\S+checkpoint-${k}: step ${k}`));
  assert.ok(modelBytes(path.join(out, "final")).equals(straight), "bit-identical");
});

for (const when of ["training", "an upload"] as const) {
  test(`SIGTERM during ${when}: a published checkpoint at the current step, exit 3, and the printed command resumes bit-identically (O3)`, {
    timeout: 240_000,
  }, async () => {
    const out = tmpDir("tstrain-term-");
    const repo = when === "training" ? "me/term-train" : "me/term-upload";
    // Uploads are slower than these tiny steps: 24 steps keep training going while checkpoint 8 uploads.
    const steps = when === "training" ? 12 : 24;
    const ref = steps === 12 ? straight : await straightOf24();
    let sent = false;
    const live = startCli(args(out, url, repo, ["--max-steps", String(steps)]), {
      onLine: (l, c) => {
        if (sent) return;
        if (when === "training" && /^step 6\/12 loss=/.test(l)) {
          sent = true;
          c.kill("SIGTERM");
        }
        if (when === "an upload" && /^CKPT 4 .*ok=true/.test(l)) {
          sent = true;
          hub.setFaults({ delayMs: { upload: 2_000 } });
          whenUploadInFlight(hub, () => c.kill("SIGTERM"));
        }
      },
    });
    const r = await live.done;
    hub.clearFaults();
    assert.ok(sent);
    assert.equal(r.code, 3, show(r));
    const m =
      /stopped by SIGTERM at step (\d+): checkpoint \1 is published and verified on the Hub\. Resume with: node dist\/main\.js .* --resume auto$/m.exec(
        r.stdout,
      );
    if (when === "an upload")
      assert.match(r.stdout, /^CKPT 8 .*ok=true/m, "checkpoint 8, in flight at the signal, was published too");
    assert.ok(m, show(r));
    const k = Number(m[1]);
    assert.ok(k >= (when === "training" ? 6 : 8) && k < steps, `stopped at ${k}`);
    const ptr = await createHubClient({ hubUrl: url, repo, repoType: "dataset" }).readPointer();
    assert.equal(ptr?.step, k, "the pointer names the checkpoint at the step the run stopped");
    assert.ok(!fs.existsSync(path.join(out, ".tstrain.lock")), "the lock is released");
    const again = await runCli(adviceAfter(r.stdout, /Resume with:/));
    assert.equal(again.code, 0, show(again));
    assert.match(again.stdout, new RegExp(`auto-resume: hub says step ${k}`));
    assert.ok(modelBytes(path.join(out, "final")).equals(ref), "bit-identical");
  });
}
