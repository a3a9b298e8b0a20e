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

/** `bash -c` a command the server printed as advice, in the repository root, until it prints its URL; then stopped. */
async function adviceServes(cmd: string): Promise<void> {
  assert.match(cmd, /^node dist\/hub-server\.js /);
  const child = spawn("bash", ["-c", `exec ${process.execPath} ${cmd.slice("node ".length)}`], {
    cwd: path.join(__dirname, "..", ".."),
    stdio: ["ignore", "pipe", "pipe"],
  });
  try {
    await new Promise<void>((resolve, reject) => {
      let out = "";
      child.stdout.on("data", (c: Buffer) => {
        out += c.toString();
        if (/LocalHub listening on http:\/\//.test(out)) resolve();
      });
      child.stderr.on("data", (c: Buffer) => {
        out += c.toString();
      });
      child.once("exit", (code) => reject(new Error(`the advised ${cmd} exited ${code}: ${out}`)));
    });
  } finally {
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    await exited;
  }
}

/** hub-server refused: exit 2, one line `hub-server: … [L9]` matching `line`; returns the command it advises. */
function refused(args: string[], line: RegExp): string {
  const r = spawnSync(process.execPath, [launcher, ...args], { encoding: "utf8", timeout: 60_000 });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, line);
  assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
  assert.equal(r.stdout, "", "it never listened");
  return /as in (node dist\/hub-server\.js \S.*?)(?: \(|\s*\[)/.exec(r.stderr)?.[1] ?? "";
}

test("a --dir under a file and a --port in use are refused naming them, exit 2, with a command that serves (L9)", async () => {
  const parent = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-hubcli-l9-"));
  try {
    const file = path.join(parent, "a-file");
    fs.writeFileSync(file, "x");
    const under = refused(
      ["--dir", path.join(file, "hub"), "--port", "0"],
      /^hub-server: --dir \S+a-file\/hub cannot hold the Hub's files: a part of its path is a file, not a folder \(ENOTDIR\), at mkdir \S+: give it a writable folder with room, as in node dist\/hub-server\.js --port 0 --dir \S+ \[L9\]\n$/,
    );
    await adviceServes(under);
    const busy = net.createServer();
    await new Promise<void>((resolve) => busy.listen(0, "127.0.0.1", resolve));
    try {
      const port = (busy.address() as net.AddressInfo).port;
      const inUse = refused(
        ["--dir", path.join(parent, "hub"), "--port", String(port)],
        new RegExp(
          `^hub-server: --port ${port} is in use on 127\\.0\\.0\\.1 \\(EADDRINUSE\\): pick another, or a free one, as in node dist/hub-server\\.js --dir \\S+ --port 0 \\[L9\\]\\n$`,
        ),
      );
      await adviceServes(inUse);
    } finally {
      busy.close();
    }
    const badPort = refused(
      ["--dir", path.join(parent, "hub"), "--port", "80x"],
      /^hub-server: --port 80x is not a port number \(0-65535\): pass one, or 0 for a free one, as in node dist\/hub-server\.js --dir \S+ --port 0 \[L9\]\n$/,
    );
    await adviceServes(badPort);
    const noDir = refused(
      ["--port", "0"],
      /^hub-server: --dir is required: the folder the Hub stores its repos in, as in node dist\/hub-server\.js --port 0 --dir \S+ \[L9\]\n$/,
    );
    await adviceServes(noDir);
  } finally {
    fs.rmSync(parent, { recursive: true, force: true });
  }
});

test("a --host that is no address of this machine is refused naming it, exit 2, with a command that serves (L9)", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-hubcli-host-"));
  try {
    for (const [host, code] of [
      ["999.1.1.1", "ENOTFOUND: no such host"],
      ["8.8.8.8", "EADDRNOTAVAIL"],
    ]) {
      const cmd = refused(
        ["--dir", dir, "--host", host, "--port", "0"],
        new RegExp(
          `^hub-server: --host ${host.replace(/\./g, "\\.")} is not an address of this machine \\(${code}\\): name one of its addresses, as in node dist/hub-server\\.js --dir \\S+ --port 0 --host 127\\.0\\.0\\.1 \\(0\\.0\\.0\\.0: every interface\\) \\[L9\\]\\n$`,
        ),
      );
      await adviceServes(cmd);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("a --dir on a read-only or full filesystem is refused before listening, exit 2, naming EROFS or ENOSPC, with a command that serves (L9)", async (t) => {
  const mnt = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-hubcli-ro-"));
  const mount = (opts: string) => spawnSync("mount", ["-t", "tmpfs", "-o", opts, "tmpfs", mnt], { encoding: "utf8" });
  const m = mount("size=1m,ro");
  if (m.status !== 0) {
    const why = `mount -t tmpfs failed (${(m.stderr || m.error?.message || "").trim()}); uid ${process.getuid?.()}`;
    if (process.env.TSTRAIN_REQUIRE_TMPFS === "1") assert.fail(`TSTRAIN_REQUIRE_TMPFS=1 but ${why}`);
    t.diagnostic(`no tmpfs: ${why}; a read-only or full --dir needs a real filesystem and was not run`);
    t.skip(why);
    fs.rmSync(mnt, { recursive: true, force: true });
    return;
  }
  try {
    // the mount itself, and a folder under it that does not exist yet (mkdir says ENOENT there: EROFS is behind it)
    for (const dir of [mnt, path.join(mnt, "sub", "hub")]) {
      const cmd = refused(
        ["--dir", dir, "--port", "0"],
        /^hub-server: --dir \S+ cannot hold the Hub's files: it is on a read-only filesystem \(EROFS\), at \S+ \S+: give it a writable folder with room, as in node dist\/hub-server\.js --port 0 --dir \S+ \[L9\]\n$/,
      );
      await adviceServes(cmd);
    }
    assert.equal(spawnSync("umount", [mnt]).status, 0);
    assert.equal(mount("size=64k").status, 0);
    fs.writeFileSync(path.join(mnt, "filler"), Buffer.alloc(0));
    try {
      for (;;) fs.appendFileSync(path.join(mnt, "filler"), Buffer.alloc(4096));
    } catch (e) {
      assert.equal((e as NodeJS.ErrnoException).code, "ENOSPC");
    }
    const cmd = refused(
      ["--dir", path.join(mnt, "hub"), "--port", "0"],
      /^hub-server: --dir \S+ cannot hold the Hub's files: its disk is full \(ENOSPC\), at \S+ \S+: give it a writable folder with room, as in node dist\/hub-server\.js --port 0 --dir \S+ \[L9\]\n$/,
    );
    await adviceServes(cmd);
  } finally {
    spawnSync("umount", [mnt]);
    fs.rmSync(mnt, { recursive: true, force: true });
  }
});
