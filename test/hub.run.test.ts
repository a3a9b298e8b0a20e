// The checkpoint cycle inside real runs, against the local Hub through the real client:
// every checkpoint pushed and verified (K3), a failed verification stops the run (K4), a SIGKILL
// during an upload resumes with --resume auto bit-identically (R2-R4, B1), HF_TOKEN never leaks (K5).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawn } from "node:child_process";
import { LocalHub } from "../src/hub/server";
import type { HubEvent } from "../src/hub/server/context";
import { createHubClient } from "../src/hub/client";
import { repoExists as hubRepoExists } from "@huggingface/hub";
import { readSafetensors } from "../src/model/safetensors";
import { writeSyntheticMix } from "./helpers/mix";
import { runTiny, tinyConfig, tinyRun } from "./helpers/run";
import { tmpDir } from "./helpers/tmp";

const MAIN = path.join(__dirname, "..", "main.js");
/** A duration as the progress lines print it (fmtDuration, src/duration.ts): 5s, 2m05s, 1h02m. */
const DURATION = "(?:\\d+h\\d\\dm|(?:\\d+m)?\\d+s)";
const mix = writeSyntheticMix({ vocab: 64, trainTokens: 64 * 1024, valTokens: 1024 });

let hubRef: LocalHub | null = null;

async function withHubOn<T>(
  dir: string,
  fn: (url: string, hub: LocalHub) => Promise<T>,
  token?: string,
  onEvent?: (e: HubEvent) => void,
): Promise<T> {
  const hub = new LocalHub({ dir, token, onEvent });
  hubRef = hub;
  const url = await hub.start();
  try {
    return await fn(url, hub);
  } finally {
    await hub.stop();
  }
}

function withHub<T>(fn: (hub: LocalHub, url: string) => Promise<T>, token?: string): Promise<T> {
  return withHubOn(tmpDir("tstrain-hubdir-"), (url, hub) => fn(hub, url), token);
}

function cliArgs(out: string, url: string, repo: string, extra: string[] = []): string[] {
  return [
    MAIN,
    ...tinyRun(mix.root, out, [
      "--hub-url",
      url,
      "--hub-repo",
      repo,
      "--world",
      "2",
      "--max-steps",
      "12",
      "--backend",
      "wasm",
      ...extra,
    ]),
  ];
}

interface Child {
  code: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
}

/** A CLI run in a child process. `kill` SIGKILLs it; so does a watchdog after `limitMs`, so a hung run fails the test
 *  (by its exit, with the output so far) instead of keeping the test process alive. */
function runCli(
  args: string[],
  env: Record<string, string> = {},
  onStart?: (kill: () => void) => void,
  limitMs = 200_000,
): Promise<Child> {
  return new Promise((resolve) => {
    const cp = spawn(process.execPath, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    const kill = () => {
      cp.kill("SIGKILL");
    };
    const watchdog = setTimeout(() => {
      stderr += `\n[test watchdog: no exit within ${limitMs} ms, killed]`;
      kill();
    }, limitMs);
    let stdout = "",
      stderr = "";
    cp.stdout.on("data", (d: Buffer) => {
      stdout += d;
    });
    cp.stderr.on("data", (d: Buffer) => {
      stderr += d;
    });
    cp.on("close", (code, signal) => {
      clearTimeout(watchdog);
      resolve({ code, signal, stdout, stderr });
    });
    onStart?.(kill);
  });
}

function modelBytes(dir: string): Buffer {
  const t = readSafetensors(path.join(dir, "model.safetensors")).tensors;
  return Buffer.concat(
    [...t.keys()].sort().map((k) => {
      const d = t.get(k)!.data;
      return Buffer.from(d.buffer, d.byteOffset, d.byteLength);
    }),
  );
}

test("a run with a Hub pushes every checkpoint verified, reads the pointer back, and rolls it to final (K3, G4)", {
  timeout: 120_000,
}, async () => {
  await withHub(async (_hub, url) => {
    const out = tmpDir("tstrain-hubrun-");
    const r = await runTiny({ ...tinyConfig(mix.root, out, ["--world", "2"]), hubUrl: url, hubRepo: "me/run" });
    assert.deepEqual(r.runJson.checkpoints, [4, 8]);
    const store = createHubClient({ hubUrl: url, repo: "me/run", repoType: "dataset" });
    const files = (await store.list()).map((f) => f.path);
    for (const s of [4, 8])
      for (const f of [
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
        "cursor.json",
        "config.json",
      ]) {
        assert.ok(files.includes(`ckpt/checkpoint-${s}/${f}`), `ckpt/checkpoint-${s}/${f} on the Hub`);
      }
    for (const f of ["final/model.safetensors", "final/config.json", "final/cursor.json", "final/run_summary.json"])
      assert.ok(files.includes(f), f);
    const ptr = await store.readPointer();
    assert.equal(ptr?.path_in_repo, "final");
    assert.equal(ptr?.step, 8);
    assert.equal(ptr?.samples_consumed, 8 * 4);
  });
});

test("a checkpoint that fails verification stops the run, keeps the local copy and never moves the pointer (K4)", {
  timeout: 120_000,
}, async () => {
  await withHub(async (hub, url) => {
    const out = tmpDir("tstrain-k4-");
    hub.setFaults({ dropOnCommit: ["checkpoint-8/optimizer.safetensors"] });
    await assert.rejects(
      runTiny({ ...tinyConfig(mix.root, out, ["--max-steps", "16"]), hubUrl: url, hubRepo: "me/k4" }),
      /checkpoint 8 failed: .*missing.*optimizer\.safetensors.*\[K4\]/s,
    );
    assert.ok(fs.existsSync(path.join(out, "ckpt", "checkpoint-8", "optimizer.safetensors")), "local copy kept");
    const ptr = await createHubClient({ hubUrl: url, repo: "me/k4", repoType: "dataset" }).readPointer();
    assert.equal(ptr?.path_in_repo, "ckpt/checkpoint-4", "pointer unmoved");
    assert.ok(!fs.existsSync(path.join(out, "final")));
  });
});

test("a fresh start refuses a Hub repo that already holds a run (R1)", { timeout: 120_000 }, async () => {
  await withHub(async (_hub, url) => {
    const cfg = (out: string) => ({
      ...tinyConfig(mix.root, out, ["--max-steps", "4", "--push-every-steps", "4"]),
      hubUrl: url,
      hubRepo: "me/again",
    });
    await runTiny(cfg(tmpDir("tstrain-r1a-")));
    await assert.rejects(
      runTiny(cfg(tmpDir("tstrain-r1b-"))),
      /already holds a run \(latest.json points at final, step 4\).*--resume auto/,
    );
  });
});

test("a run killed with SIGKILL during an upload continues with --resume auto from the last verified checkpoint and ends bit-identical (R2-R4, B1)", {
  timeout: 240_000,
}, async () => {
  // The kill lands on events, not after a delay. The run's commits to its repo are, in order: checkpoint-4's files,
  // then latest.json -> checkpoint 4 (K3: upload, verify, pointer). When the Hub reports the second one ("commit"
  // event), it is told to hold LFS uploads (a 10-minute delay); the next upload is checkpoint 8's, and the run is
  // killed the moment the Hub logs that PUT arriving, before it is served. Under any load the kill therefore falls
  // inside checkpoint 8's upload, after checkpoint 4 is verified and pointed at, and before any of 8 is committed.
  let kill: (() => void) | null = null;
  let commits = 0;
  let killedAtCommits = -1;
  await withHubOn(
    tmpDir("tstrain-hubdir-"),
    async (url, hub) => {
      const straight = await runCli(cliArgs(tmpDir("tstrain-straight-"), url, "me/straight"));
      assert.equal(straight.code, 0, straight.stderr);
      const straightFinal = path.join(straight.stdout.match(/exported (\S+)/)![1]);

      const log = hub.requests;
      const push = log.push.bind(log);
      log.push = (...entries) => {
        const n = push(...entries);
        if (commits >= 2 && kill && entries.some((e) => e.method === "PUT" && e.path.startsWith("/__lfs/upload/"))) {
          killedAtCommits = commits;
          kill();
          kill = null;
        }
        return n;
      };
      const killed = await runCli(cliArgs(tmpDir("tstrain-killed-"), url, "me/killed"), {}, (k) => {
        kill = k;
      });
      kill = null;
      assert.equal(
        killed.signal,
        "SIGKILL",
        `the run was killed (stdout: ${killed.stdout.slice(-2000)} stderr: ${killed.stderr.slice(-2000)})`,
      );
      assert.equal(killedAtCommits, 2, "killed on the first upload after checkpoint 4's pointer moved");
      assert.match(killed.stdout, /CKPT 4 .*ok=true/);
      assert.doesNotMatch(killed.stdout, /CKPT 8 /, "checkpoint 8 never finished");
      hub.clearFaults();
      const store = createHubClient({ hubUrl: url, repo: "me/killed", repoType: "dataset" });
      assert.equal((await store.readPointer())?.step, 4, "the pointer still names the last verified checkpoint");

      // A new machine: empty disk, --resume auto.
      const resumedOut = tmpDir("tstrain-resumed-");
      const resumed = await runCli(cliArgs(resumedOut, url, "me/killed", ["--resume", "auto"]));
      assert.equal(resumed.code, 0, resumed.stderr);
      assert.match(resumed.stdout, /auto-resume: hub says step 4 at ckpt\/checkpoint-4/);
      assert.match(resumed.stdout, /prior loss \d/);
      assert.ok(
        modelBytes(path.join(resumedOut, "final")).equals(modelBytes(straightFinal)),
        "bit-identical to the uninterrupted run",
      );

      // Once complete, --resume auto says so and trains nothing.
      const again = await runCli(cliArgs(tmpDir("tstrain-again-"), url, "me/killed", ["--resume", "auto"]));
      assert.equal(again.code, 0, again.stderr);
      assert.match(again.stdout, /the run is complete/);
    },
    undefined,
    (e) => {
      if (e.type === "commit" && e.repo === "me/killed" && ++commits === 2)
        hubRef!.setFaults({ delayMs: { upload: 600_000 } });
    },
  );
});

test("HF_TOKEN appears in no output, log or file of a run, also when the Hub rejects it (K5)", {
  timeout: 120_000,
}, async () => {
  const token = "hf_SECRETsecret0123456789abcdef";
  await withHub(async (_hub, url) => {
    const out = tmpDir("tstrain-token-");
    const ok = await runCli(cliArgs(out, url, "me/tok", ["--max-steps", "4"]), { HF_TOKEN: token });
    assert.equal(ok.code, 0, ok.stderr);
    const bad = await runCli(cliArgs(tmpDir("tstrain-token-bad-"), url, "me/tok2", ["--max-steps", "4"]), {
      HF_TOKEN: "hf_WRONGwrong0123456789abcdef",
    });
    assert.notEqual(bad.code, 0);
    assert.match(bad.stderr, /401|unauthori[sz]ed|rejected/i);
    for (const text of [ok.stdout, ok.stderr, bad.stdout, bad.stderr]) {
      assert.ok(!text.includes(token) && !text.includes("hf_WRONGwrong"), "token in output");
    }
    const walk = (d: string): string[] =>
      fs
        .readdirSync(d, { withFileTypes: true })
        .flatMap((e) => (e.isDirectory() ? walk(path.join(d, e.name)) : [path.join(d, e.name)]));
    for (const f of walk(out)) assert.ok(!fs.readFileSync(f).includes(token), `token in ${f}`);
  }, token);
});

test("the checkpoint repo is created private by default, public with --no-hub-private, and an existing repo's visibility is never changed (K5)", {
  timeout: 300_000,
}, async () => {
  const token = "hf_private_test_token_0001";
  await withHub(async (_hub, url) => {
    // what anyone without the token sees, through the real client: a private repo does not exist for them
    const seenByAnyone = (name: string) => hubRepoExists({ repo: { type: "dataset", name }, hubUrl: url });
    const owner = (repo: string) => createHubClient({ hubUrl: url, repo, repoType: "dataset", token });
    const env = { HF_TOKEN: token };
    const small = ["--max-steps", "4", "--world", "1", "--vocab-size", "64", "--no-sample"];

    const priv = await runCli(cliArgs(tmpDir("tstrain-priv-"), url, "me/private-run", small), env);
    assert.equal(priv.code, 0, priv.stderr);
    assert.match(priv.stdout, /^checkpoint hub target me\/private-run \(dataset, created private \(--hub-private\); /m);
    assert.equal(await owner("me/private-run").isPrivate(), true);
    assert.equal(
      await seenByAnyone("me/private-run"),
      false,
      "an anonymous caller cannot see a private repo (401 RepoNotFound, as on the Hub)",
    );

    const pub = await runCli(
      cliArgs(tmpDir("tstrain-pub-"), url, "me/public-run", [...small, "--no-hub-private"]),
      env,
    );
    assert.equal(pub.code, 0, pub.stderr);
    assert.match(pub.stdout, /^checkpoint hub target me\/public-run \(dataset, created public \(--no-hub-private\); /m);
    assert.equal(await owner("me/public-run").isPrivate(), false);
    assert.equal(await seenByAnyone("me/public-run"), true);

    // A repo made public by its owner beforehand stays public: the default never flips it, and the line says so.
    await owner("me/existing").ensureRepo({ private: false });
    const kept = await runCli(cliArgs(tmpDir("tstrain-kept-"), url, "me/existing", small), env);
    assert.equal(kept.code, 0, kept.stderr);
    assert.match(
      kept.stdout,
      /^checkpoint hub target me\/existing \(dataset, exists, public: left as it is \(an existing repo's visibility is never changed; --hub-private applies to a repo this run creates\); /m,
    );
    assert.equal(await owner("me/existing").isPrivate(), false);
    assert.equal(await seenByAnyone("me/existing"), true);
  }, token);
});

test("without HF_TOKEN, a Hub that wants a token is refused saying HF_TOKEN is not set and how to set it, not that a token was rejected (K5)", {
  timeout: 120_000,
}, async () => {
  const token = "hf_NEEDEDneeded0123456789abcdef";
  await withHub(async (_hub, url) => {
    for (const extra of [[], ["--resume", "auto"]]) {
      const r = await runCli(
        cliArgs(tmpDir("tstrain-notoken-"), url, "me/needs-token", ["--max-steps", "4", ...extra]),
        { HF_TOKEN: "" },
      );
      assert.equal(r.code, 2, r.stderr);
      assert.match(
        r.stderr,
        /HF_TOKEN is not set, so no token was sent, and this Hub wants one: export HF_TOKEN=<a token with write access to me\/needs-token> and run again/,
        extra.join(" "),
      );
      assert.doesNotMatch(r.stderr, /rejected the token/);
      if (!extra.length) assert.match(r.stderr, /Fix the token as said, then run the same command again\. \[R2\]/);
    }
  }, token);
});

test("a slow checkpoint upload and a slow resume download print progress lines (done/total MB, share, rate, ETA) every TSTRAIN_PROGRESS_SECONDS (K3, R4, B5)", {
  timeout: 180_000,
}, async () => {
  await withHub(async (hub, url) => {
    const out = tmpDir("tstrain-transfer-");
    const env = { TSTRAIN_PROGRESS_SECONDS: "0.2" };
    const line = (verb: string, folder: string) =>
      new RegExp(
        `^hub: ${verb} ${folder}/ \\(\\d+ files\\): (\\d+\\.\\d)/(\\d+\\.\\d) MB \\((\\d+)%\\), \\d+\\.\\d\\d MB/s, ${DURATION} so far, ETA (\\?|${DURATION})$`,
        "gm",
      );
    hub.setFaults({ delayMs: { upload: 1500 } }); // every LFS upload of this session waits 1.5 s
    const first = await runCli(cliArgs(out, url, "me/transfer", ["--max-steps", "8", "--stop-after-steps", "4"]), env);
    hub.clearFaults();
    assert.equal(first.code, 0, first.stderr);
    const up = [...first.stdout.matchAll(line("uploading", "ckpt/checkpoint-4"))];
    assert.ok(up.length >= 2, first.stdout);
    const total = Number(up[0][2]);
    assert.ok(total > 0 && up.every((m) => Number(m[2]) === total), "one total");
    // An upload's bytes count once its request (a file, or one part of it) has gone through: never backwards.
    for (let i = 1; i < up.length; i++) assert.ok(Number(up[i][1]) >= Number(up[i - 1][1]), "never backwards");
    fs.rmSync(path.join(out, "ckpt", "checkpoint-4"), { recursive: true, force: true }); // the resume must download it
    hub.setFaults({ delayMs: { resolve: 700 } });
    const second = await runCli(cliArgs(out, url, "me/transfer", ["--max-steps", "8", "--resume", "auto"]), env);
    hub.clearFaults();
    assert.equal(second.code, 0, second.stderr);
    const down = [...second.stdout.matchAll(line("downloading", "ckpt/checkpoint-4"))];
    assert.ok(down.length >= 2, second.stdout);
    assert.ok(
      down.some((m) => Number(m[1]) > 0 && Number(m[1]) < Number(m[2])),
      "a download counts its bytes as they arrive",
    );
    for (let i = 1; i < down.length; i++) assert.ok(Number(down[i][1]) >= Number(down[i - 1][1]), "never backwards");
    assert.match(second.stdout, /^downloaded \d+ files, [\d.]+ MB in [\d.]+s$/m);
  });
});
