// A run's start against its Hub (K6, K9): every Hub call before step 1 is retried as the uploader retries, the repo's
// creation included; an address that is no Hub, a host with no address, a Hub that never answers, or one whose storage
// fails is refused before any work, exit 2, with a command that works, which each test runs. Real CLI runs.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as http from "node:http";
import * as net from "node:net";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { spawn, spawnSync } from "node:child_process";
import { LocalHub } from "../src/hub/server";
import { createHubClient } from "../src/hub/client";
import { writeSyntheticMix } from "./helpers/mix";
import { tmpDir } from "./helpers/tmp";
import { tinyRun } from "./helpers/run";
import { DEMO_SHA256 } from "./helpers/demo";
import { MAIN, REPO_ROOT, adviceAfter, runCli, startCli, type Child } from "./helpers/survive";
import { advisedCommands, runAdvisedAsync } from "./helpers/cli";

const mix = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 512 });
const HUB_SERVER = path.join(REPO_ROOT, "dist", "hub-server.js");

const show = (c: Child) =>
  `exit ${c.code} ${c.signal ?? ""}\n--- stdout\n${c.stdout.slice(-4000)}\n--- stderr\n${c.stderr.slice(-3000)}`;

/** The tiny run against `url` and `repo`, as argv for runCli. */
function tiny(out: string, url: string, repo: string, extra: string[] = []): string[] {
  return [MAIN, ...tinyRun(mix.root, out, ["--hub-url", url, "--hub-repo", repo, "--backend", "wasm", ...extra])];
}

/** A refusal: exit 2 and one line on stderr matching `line`, with no stack. */
function assertRefused(r: Child, line: RegExp): void {
  assert.equal(r.code, 2, show(r));
  assert.match(r.stderr, line);
  assert.equal(r.stderr.trim().split("\n").length, 1, `one line:\n${r.stderr}`);
  assert.doesNotMatch(r.stderr, /\n\s+at |internal error/);
}

/** The session records of a run folder (none when it has no sessions.jsonl). */
function sessions(out: string): Array<{ event: string; ended?: string }> {
  const f = path.join(out, "sessions.jsonl");
  if (!fs.existsSync(f)) return [];
  return fs
    .readFileSync(f, "utf8")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
}

const retryLines = (c: Child, what: RegExp) =>
  c.stdout
    .split("\n")
    .filter((l) => /^hub: .* failed \(attempt \d+: .*\); retrying in .* \(K6\)$/.test(l) && what.test(l));

/** `node dist/hub-server.js args` until it prints its URL. */
async function startHubServer(args: string[]): Promise<{ url: string; stop: () => Promise<void> }> {
  const cp = spawn(process.execPath, [HUB_SERVER, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    cp.stdout.on("data", (d: Buffer) => {
      out += d;
      const m = /LocalHub listening on (http:\/\/\S+)/.exec(out);
      if (m) resolve(m[1]);
    });
    cp.once("exit", (code) => reject(new Error(`hub-server exited ${code} before its URL: ${out}`)));
  });
  return {
    url,
    stop: () =>
      new Promise<void>((resolve) => {
        cp.once("exit", () => resolve());
        cp.kill("SIGTERM");
      }),
  };
}

/** A free TCP port on loopback, closed again: connections to it are refused until someone listens there. */
async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

test("the repo's creation answering 503 twice (hub-server.js's fault file) is retried at start (K6), and the demo ends exit 0 with the clean run's weights and a whole session record (K6, K9)", {
  timeout: 900_000,
}, async () => {
  const work = tmpDir("tstrain-create-503-");
  const faults = path.join(work, "faults.json");
  fs.writeFileSync(faults, JSON.stringify({ status: { createRepo: 503 }, failCount: 2 }));
  const hs = await startHubServer(["--dir", path.join(work, "hub"), "--port", "0", "--faults", faults]);
  try {
    const out = path.join(work, "run");
    const r = await runCli([MAIN, "--demo", "--hub-url", hs.url, "--out", out]);
    assert.equal(r.code, 0, show(r));
    assert.equal(retryLines(r, /the repo's creation \(local\/tstrain-demo on /).length, 2, show(r));
    const sha = createHash("sha256")
      .update(fs.readFileSync(path.join(out, "final", "model.safetensors")))
      .digest("hex");
    assert.equal(sha, DEMO_SHA256, "the same final weights as a clean demo");
    assert.deepEqual(
      sessions(out).map((e) => e.ended ?? e.event),
      ["start", "complete"],
    );
  } finally {
    await hs.stop();
  }
});

test("an address that is a web server, not a Hub, is refused before any work, exit 2, naming what answered (K9); the command it gives trains", {
  timeout: 300_000,
}, async () => {
  // a static file server (404 and 501 as HTML pages), and a single-page app (every path is its index.html)
  const servers: Array<[string, http.RequestListener]> = [
    [
      "404 \\(text/html\\)",
      (req, res) => {
        res.writeHead(req.method === "GET" || req.method === "HEAD" ? 404 : 501, { "Content-Type": "text/html" });
        res.end("<html><body>File not found</body></html>");
      },
    ],
    [
      "200 \\(text/html\\)",
      (_req, res) => {
        res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
        res.end("<!doctype html><title>app</title>");
      },
    ],
  ];
  for (const [said, handler] of servers) {
    const web = http.createServer(handler);
    await new Promise<void>((resolve) => web.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(web.address() as net.AddressInfo).port}`;
    try {
      const out = tmpDir("tstrain-not-a-hub-");
      const bad = await runCli(tiny(out, url, "me/not-a-hub", ["--hub-retry-minutes", "0.1"]));
      assertRefused(
        bad,
        new RegExp(
          `^refused: the Hub address ${url.replace(/[.]/g, "\\.")} is not a Hub: GET ${url.replace(/[.]/g, "\\.")}/api/datasets/me/not-a-hub answered ${said}, as a web server does, not as a Hub.*; or train against the local Hub in this process: node dist/main\\.js .* --hub-url embedded \\[K9\\]$`,
          "m",
        ),
      );
      assert.deepEqual(sessions(out), [], "no session started: nothing to end");
      assert.ok(!fs.existsSync(path.join(out, "ckpt")), "nothing trained");
      const ok = await runCli(adviceAfter(bad.stderr, /in this process:/));
      assert.equal(ok.code, 0, show(ok));
      assert.match(ok.stdout, /embedded local Hub at /);
    } finally {
      web.close();
    }
  }
});

test("a host with no address is refused at once, naming ENOTFOUND (K9); the command it gives runs", {
  timeout: 300_000,
}, async () => {
  const out = tmpDir("tstrain-no-host-");
  // --hub-retry-minutes: were ENOTFOUND retried, the run would wait that long, then say "did not answer"
  const bad = await runCli(
    tiny(out, "http://no-such-host.invalid", "me/nohost", ["--dry-run", "--hub-retry-minutes", "0.1"]),
  );
  assertRefused(
    bad,
    /^refused: the Hub address http:\/\/no-such-host\.invalid names a host that has no address \(ENOTFOUND: network error: ENOTFOUND\)\. Check the host name .*; or train against the local Hub in this process: node dist\/main\.js .* --hub-url embedded \[K9\]$/m,
  );
  assert.equal(retryLines(bad, /./).length, 0, "not retried: a typo stays a typo");
  const ok = await runCli(adviceAfter(bad.stderr, /in this process:/));
  assert.equal(ok.code, 0, show(ok));
  assert.match(ok.stdout, /"dry_run":true/);
});

test("a Hub that does not answer at start is retried (K6): one that comes up meanwhile serves the run; one that never does is refused after --hub-retry-minutes, and the command it gives runs once it answers (K6, K9)", {
  timeout: 600_000,
}, async () => {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const dir = tmpDir("tstrain-late-hub-");
  // never up: refused once the budget (3 s) is spent
  const out = tmpDir("tstrain-hub-down-");
  const down = await runCli(tiny(out, url, "me/late", ["--hub-retry-minutes", "0.05"]));
  assert.equal(down.code, 2, show(down));
  assert.ok(retryLines(down, /the repo lookup \(me\/late on .*ECONNREFUSED/).length >= 1, show(down));
  assert.match(
    down.stderr,
    /^refused: the Hub at http:\/\/127\.0\.0\.1:\d+ did not answer: .* kept failing .* Check that it runs and that --hub-url \(or HF_ENDPOINT\) names it, then run the same command again: node dist\/main\.js .*; or train against the local Hub in this process: .* \[K9\]$/m,
  );
  assert.deepEqual(sessions(out), [], "no session started");
  const hub = new LocalHub({ dir, port });
  await hub.start();
  try {
    const again = await runCli(adviceAfter(down.stderr, /run the same command again:/));
    assert.equal(again.code, 0, show(again));
  } finally {
    await hub.stop();
  }
  // comes up while the run retries: the run goes on as if it had been there
  const late = new LocalHub({ dir, port });
  let started = false;
  const live = startCli(tiny(tmpDir("tstrain-hub-late-"), url, "me/late2", ["--hub-retry-minutes", "2"]), {
    onLine: (l) => {
      if (!started && /^hub: the repo lookup .* retrying in/.test(l)) {
        started = true;
        void late.start();
      }
    },
  });
  try {
    const r = await live.done;
    assert.ok(started, show(r));
    assert.equal(r.code, 0, show(r));
    assert.equal(
      (await createHubClient({ hubUrl: url, repo: "me/late2", repoType: "dataset" }).readPointer())?.path_in_repo,
      "final",
    );
  } finally {
    await late.stop();
  }
});

test("listings that fail with 500 during --resume auto are retried (K6), and the run resumes", {
  timeout: 300_000,
}, async () => {
  const hub = new LocalHub({ dir: tmpDir("tstrain-list-500-hub-") });
  const url = await hub.start();
  try {
    const out = tmpDir("tstrain-list-500-");
    const first = await runCli(tiny(out, url, "me/list500", ["--stop-after-steps", "4"]));
    assert.equal(first.code, 0, show(first));
    hub.setFaults({ status: { list: 500 }, failCount: 3 });
    const r = await runCli(tiny(out, url, "me/list500", ["--resume", "auto"]));
    assert.equal(r.code, 0, show(r));
    assert.ok(retryLines(r, /the listing of .* HTTP 500/).length >= 1, show(r));
    assert.match(r.stdout, /resume from \S+checkpoint-4: step 4/);
  } finally {
    await hub.stop();
  }
});

/** A tmpfs of `size` at a new folder, or why none could be mounted (a failure under TSTRAIN_REQUIRE_TMPFS=1). */
function mountTmpfs(size: string): { dir: string; why: string | null } {
  const dir = tmpDir("tstrain-hub-tmpfs-");
  const m = spawnSync("mount", ["-t", "tmpfs", "-o", `size=${size}`, "tmpfs", dir], { encoding: "utf8" });
  if (m.status === 0) return { dir, why: null };
  const why = `mount -t tmpfs failed (${(m.stderr || m.error?.message || "").trim()}); uid ${process.getuid?.()}`;
  if (process.env.TSTRAIN_REQUIRE_TMPFS === "1") assert.fail(`TSTRAIN_REQUIRE_TMPFS=1 but ${why}`);
  return { dir, why };
}

test("a Hub whose disk is full or read-only is refused at start, exit 2, naming ENOSPC or EROFS (K9); once it has room, the command it gives trains", {
  timeout: 300_000,
}, async (t) => {
  const { dir, why } = mountTmpfs("2m");
  if (why) {
    t.diagnostic(`no tmpfs: ${why}; a Hub with a full disk needs a real small filesystem and was not run`);
    t.skip(why);
    return;
  }
  const hub = new LocalHub({ dir: path.join(dir, "hub") });
  try {
    const url = await hub.start();
    const filler = path.join(dir, "filler");
    const fd = fs.openSync(filler, "w");
    try {
      for (;;) fs.writeSync(fd, Buffer.alloc(64 * 1024));
    } catch (e) {
      assert.equal((e as NodeJS.ErrnoException).code, "ENOSPC");
    } finally {
      fs.closeSync(fd);
    }
    const out = tmpDir("tstrain-hub-full-");
    const full = await runCli(tiny(out, url, "me/full", ["--hub-retry-minutes", "0.1"])); // were 507 retried: 6 s
    assertRefused(
      full,
      /^refused: the Hub at http:\/\/127\.0\.0\.1:\d+ cannot store files: HTTP 507: the Hub's storage failed: ENOSPC .*Check the Hub's disk: free space there, or restart node dist\/hub-server\.js on a writable --dir, then run the same command again: node dist\/main\.js .*; or train against the local Hub in this process: .* \[K9\]$/m,
    );
    assert.deepEqual(sessions(out), [], "no session started");
    fs.rmSync(filler);
    const again = await runCli(adviceAfter(full.stderr, /run the same command again:/));
    assert.equal(again.code, 0, show(again));
    // read-only: the folder it would create a repo in cannot be made (ENOENT, behind which is EROFS)
    assert.equal(spawnSync("mount", ["-o", "remount,ro", dir]).status, 0);
    const ro = await runCli(tiny(tmpDir("tstrain-hub-ro-"), url, "me/ro", ["--hub-retry-minutes", "0.1"]));
    assertRefused(
      ro,
      /^refused: the Hub at \S+ cannot store files: HTTP 507: the Hub's storage failed: EROFS .* \[K9\]$/m,
    );
  } finally {
    await hub.stop();
    spawnSync("umount", [dir]);
  }
});

test("an https:// address of a plain-HTTP Hub, a port fetch will not use, a path after the Hub's host and a read token are each refused before any work, exit 2, naming what is wrong (K5, K9); the commands they give run", {
  timeout: 300_000,
}, async () => {
  const READ = "hf_readREADread0123456789";
  const WRITE = "hf_writeWRITEwrite0123456789";
  const hub = new LocalHub({
    dir: tmpDir("tstrain-start-refusals-hub-"),
    tokens: [
      { token: READ, role: "read" },
      { token: WRITE, role: "write" },
    ],
  });
  const url = await hub.start();
  try {
    const env = { HF_TOKEN: WRITE };
    const cases: Array<[string, RegExp]> = [
      [
        url.replace("http:", "https:"),
        /^refused: the Hub address https:\S+ fails its TLS handshake \(ERR_SSL_WRONG_VERSION_NUMBER\): the server there speaks plain HTTP: run node dist\/main\.js .* --hub-url http:\/\/127\.0\.0\.1:\d+ \(the address with http:\/\/\); or train against the local Hub in this process: node dist\/main\.js .* --hub-url embedded \[K9\]$/m,
      ],
      [
        "http://127.0.0.1:6000",
        /^refused: the Hub address http:\/\/127\.0\.0\.1:6000 names port 6000, one that fetch will not connect to .*; or train against the local Hub in this process: node dist\/main\.js .* \[K9\]$/m,
      ],
      [
        `${url}/prefix`,
        /^refused: the Hub at http:\S+\/prefix has no route to create me\/refused-\d \(HTTP 404: .*\): --hub-url \(or HF_ENDPOINT\) names the Hub's root, .* with no path after the host: run node dist\/main\.js .* --hub-url http:\/\/127\.0\.0\.1:\d+ \(the Hub's root\); or train against the local Hub in this process: node dist\/main\.js .* \[K9\]$/m,
      ],
    ];
    for (const [i, [address, line]] of cases.entries()) {
      const out = tmpDir("tstrain-start-refused-");
      const bad = await runCli(tiny(out, address, `me/refused-${i}`, ["--hub-retry-minutes", "0.1"]), { env });
      assertRefused(bad, line);
      assert.equal(retryLines(bad, /./).length, 0, `refused at once, not retried:\n${bad.stdout}`);
      assert.deepEqual(sessions(out), [], "no session started");
      // every command it gives, as printed, in the state refused: the address mended (where it can be), the local Hub
      const cmds = advisedCommands(bad.stderr).filter((c) => c.startsWith("node dist/main.js"));
      assert.equal(cmds.length, address.endsWith(":6000") ? 1 : 2, bad.stderr);
      for (const cmd of cmds) {
        fs.rmSync(out, { recursive: true, force: true });
        const ok = await runAdvisedAsync(cmd, { ...process.env, ...env });
        assert.equal(ok.status, 0, `${cmd}\n${ok.stderr}`);
      }
    }
    // a read token cannot create the repo: K5, and the same command with a write token trains
    const out = tmpDir("tstrain-start-read-token-");
    const bad = await runCli(tiny(out, url, "me/by-reader", ["--hub-retry-minutes", "0.1"]), {
      env: { HF_TOKEN: READ },
    });
    assertRefused(
      bad,
      /^refused: the Hub at \S+ refused to create me\/by-reader \(HTTP 403: .*\): HF_TOKEN has no right to create it .*, then run the same command again: node dist\/main\.js .* \[K5\]$/m,
    );
    assert.ok(!bad.stderr.includes(READ), "the token is not shown");
    assert.deepEqual(sessions(out), [], "no session started");
    const again = await runCli(adviceAfter(bad.stderr, /run the same command again:/), { env });
    assert.equal(again.code, 0, show(again));
  } finally {
    await hub.stop();
  }
});
