// B6: `node dist/hub-server.js --dir D --port 0` is the same local Hub, on its own.
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { spawn, spawnSync } from "node:child_process";
import * as net from "node:net";
import { createHubClient } from "../src/hub/client";

// dist/test/hub.cli.test.js → dist/hub-server.js (the launcher), else dist/src/hub-server.js.
const launcher = [path.join(__dirname, "..", "hub-server.js"), path.join(__dirname, "..", "src", "hub-server.js")].find(
  (p) => fs.existsSync(p),
)!;

describe("hub-server CLI (B6)", () => {
  test("starts on --port 0, prints its URL, serves the client, and stops on SIGTERM", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-hubcli-"));
    const env = { ...process.env };
    delete env.HF_TOKEN;
    const child = spawn(process.execPath, [launcher, "--dir", dir, "--port", "0"], {
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    try {
      const url = await new Promise<string>((resolve, reject) => {
        let out = "";
        const timer = setTimeout(() => reject(new Error(`no URL line within 10 s; stdout so far: ${out}`)), 10_000);
        child.stdout.on("data", (c: Buffer) => {
          out += c.toString();
          const m = /LocalHub listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
          if (m) {
            clearTimeout(timer);
            resolve(m[1]);
          }
        });
        child.once("exit", (code) => reject(new Error(`hub-server exited with ${code} before printing its URL`)));
      });
      const store = createHubClient({ hubUrl: url, repo: "cli/check", repoType: "dataset", token: "" });
      assert.equal(await store.repoExists(), false);
      assert.deepEqual(await store.ensureRepo(), { created: true });
      assert.equal(await store.repoExists(), true);
      assert.ok(fs.existsSync(path.join(dir, "datasets", "cli", "check", "refs.json")), "repos are stored under --dir");
    } finally {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test("--help prints the usage and exits 0; a missing --dir exits 2 with a message", () => {
    const help = spawnSync(process.execPath, [launcher, "--help"], { encoding: "utf8" });
    assert.equal(help.status, 0);
    assert.match(help.stdout, /usage: node dist\/hub-server\.js --dir DIR/);
    const bad = spawnSync(process.execPath, [launcher, "--port", "0"], { encoding: "utf8" });
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /--dir is required/);
  });
});

test("a --dir under a file and a --port in use are refusals naming them, exit 2, not failures (O6)", async () => {
  const parent = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-hubcli-o6-"));
  try {
    const file = path.join(parent, "a-file");
    fs.writeFileSync(file, "x");
    const under = spawnSync(process.execPath, [launcher, "--dir", path.join(file, "hub"), "--port", "0"], {
      encoding: "utf8",
      timeout: 60_000,
    });
    assert.equal(under.status, 2, under.stderr);
    assert.match(
      under.stderr,
      /^hub-server: mkdir .*a-file\/hub failed: a part of the path is a file, not a folder \(ENOTDIR\): check the path \[O6\]\n$/,
    );
    const busy = net.createServer();
    await new Promise<void>((resolve) => busy.listen(0, "127.0.0.1", resolve));
    try {
      const port = (busy.address() as net.AddressInfo).port;
      const r = spawnSync(process.execPath, [launcher, "--dir", path.join(parent, "hub"), "--port", String(port)], {
        encoding: "utf8",
        timeout: 60_000,
      });
      assert.equal(r.status, 2, r.stderr);
      assert.match(
        r.stderr,
        /^hub-server: listen .*failed: the address is in use \(EADDRINUSE\): pick another --port, or --port 0 for a free one \[O6\]\n$/,
      );
    } finally {
      busy.close();
    }
  } finally {
    fs.rmSync(parent, { recursive: true, force: true });
  }
});
