// The local Hub as separate processes on one directory (L2, L5, L7): `dist/hub-server.js` servers,
// the real @huggingface/hub client, commits racing on a stale parent, a server SIGKILLed mid-commit.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { spawn, type ChildProcess } from "node:child_process";
import { commit, createRepo, downloadFile, listCommits, HubApiError } from "@huggingface/hub";

const launcher = [path.join(__dirname, "..", "hub-server.js"), path.join(__dirname, "..", "src", "hub-server.js")].find(
  (p) => fs.existsSync(p),
)!;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-hubproc-"));
const children = new Set<ChildProcess>();
after(() => {
  for (const c of children) c.kill("SIGKILL");
  fs.rmSync(tmp, { recursive: true, force: true });
});

interface Server {
  url: string;
  child: ChildProcess;
  events: Record<string, unknown>[];
  waitFor(pred: (e: Record<string, unknown>) => boolean): Promise<Record<string, unknown>>;
}

/** Starts `dist/hub-server.js --dir dir --port 0 [...extra]` and collects its event lines. */
async function startServer(dir: string, extra: string[] = []): Promise<Server> {
  const env = { ...process.env };
  delete env.HF_TOKEN;
  const child = spawn(process.execPath, [launcher, "--dir", dir, "--port", "0", ...extra], {
    env,
    stdio: ["ignore", "pipe", "inherit"],
  });
  children.add(child);
  child.once("exit", () => children.delete(child));
  const events: Record<string, unknown>[] = [];
  const waiters: { pred: (e: Record<string, unknown>) => boolean; resolve: (e: Record<string, unknown>) => void }[] =
    [];
  let buf = "";
  let resolveUrl: (u: string) => void;
  const url = new Promise<string>((resolve, reject) => {
    resolveUrl = resolve;
    child.once("exit", (code) => reject(new Error(`hub-server exited with ${code} before printing its URL`)));
  });
  child.stdout.on("data", (c: Buffer) => {
    buf += c.toString();
    for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      const m = /^LocalHub listening on (\S+)/.exec(line);
      if (m) resolveUrl(m[1]);
      const ev = /^LocalHub event: (.*)$/.exec(line);
      if (!ev) continue;
      const e = JSON.parse(ev[1]) as Record<string, unknown>;
      events.push(e);
      for (const w of waiters.splice(0)) w.pred(e) ? w.resolve(e) : waiters.push(w);
    }
  });
  const waitFor = (pred: (e: Record<string, unknown>) => boolean) =>
    new Promise<Record<string, unknown>>((resolve) => {
      const seen = events.find(pred);
      if (seen) resolve(seen);
      else waiters.push({ pred, resolve });
    });
  return { url: await url, child, events, waitFor };
}

async function stopServer(s: Server, signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
  if (s.child.exitCode !== null || s.child.signalCode !== null) return;
  const exited = new Promise((resolve) => s.child.once("exit", resolve));
  s.child.kill(signal);
  await exited;
}

/** Writes a faults file the way docs/hub.md says: a temporary file renamed over it. */
function writeFaults(file: string, faults: object): void {
  fs.writeFileSync(`${file}.tmp`, JSON.stringify(faults));
  fs.renameSync(`${file}.tmp`, file);
}

/** An open Hub (no tokens configured) takes any hf_ token; createRepo insists on one. */
const ANY = "hf_anyTokenTheOpenHubTakes";
const repo = (name: string) => ({ type: "dataset" as const, name });
const put = (p: string, text: string) => ({ operation: "addOrUpdate" as const, path: p, content: new Blob([text]) });
const headOf = async (url: string, name: string) =>
  (await listCommits({ repo: repo(name), hubUrl: url, batchSize: 1 }).next()).value!.oid as string;

describe("two hub-server processes on one --dir (L2)", () => {
  test("a commit whose parentCommit went stale while it waited for the other process's lock gets 412", {
    timeout: 60_000,
  }, async () => {
    const dir = path.join(tmp, "shared");
    const faults = path.join(tmp, "faults-a.json");
    writeFaults(faults, {});
    const a = await startServer(dir, ["--faults", faults]);
    const b = await startServer(dir);
    try {
      await createRepo({ repo: repo("race/r"), hubUrl: a.url, accessToken: ANY });
      const base = (await commit({
        repo: repo("race/r"),
        hubUrl: a.url,
        title: "base",
        operations: [put("x.txt", "0")],
      }))!.commit.oid;
      assert.equal(await headOf(b.url, "race/r"), base, "both servers see the same history");

      // A's commit stops holding the lock after its commit is durable and before main moves.
      writeFaults(faults, { pauseCommit: true });
      const first = commit({
        repo: repo("race/r"),
        hubUrl: a.url,
        title: "from a",
        parentCommit: base,
        operations: [put("x.txt", "a")],
      });
      first.catch(() => undefined);
      await a.waitFor((e) => e.type === "commit-paused");
      // B's commit on the same parent must wait for A's lock; without a lock shared across processes it
      // would see main still at base and be applied (the race the 412 exists for).
      const second = commit({
        repo: repo("race/r"),
        hubUrl: b.url,
        title: "from b",
        parentCommit: base,
        operations: [put("x.txt", "b")],
      });
      second.catch(() => undefined);
      const outcome = await Promise.race([
        b.waitFor((e) => e.type === "lock-wait").then(() => "waiting"),
        second.then(
          () => "applied",
          () => "failed",
        ),
      ]);
      assert.equal(outcome, "waiting", "B must wait for the lock A holds");
      writeFaults(faults, {});
      const done = (await first)!;
      await assert.rejects(second, (e: HubApiError) => {
        assert.ok(e instanceof HubApiError);
        assert.equal(e.statusCode, 412);
        assert.match(e.message, /A commit has happened since\. Please refresh and try again\./);
        return true;
      });
      assert.equal(await headOf(b.url, "race/r"), done.commit.oid);
      const text = await (await downloadFile({ repo: repo("race/r"), path: "x.txt", hubUrl: b.url }))!.text();
      assert.equal(text, "a");
      // The loser retries on the new parent and lands.
      const retry = (await commit({
        repo: repo("race/r"),
        hubUrl: b.url,
        title: "from b again",
        parentCommit: done.commit.oid,
        operations: [put("x.txt", "b")],
      }))!;
      assert.equal(await headOf(a.url, "race/r"), retry.commit.oid);
    } finally {
      await stopServer(a);
      await stopServer(b);
    }
  });
});

describe("a hub-server SIGKILLed mid-commit (L5)", () => {
  test("leaves the repo at the previous commit, and the next server commits on it", { timeout: 60_000 }, async () => {
    const dir = path.join(tmp, "killed");
    const faults = path.join(tmp, "faults-k.json");
    writeFaults(faults, {});
    const s1 = await startServer(dir, ["--faults", faults]);
    await createRepo({ repo: repo("kill/r"), hubUrl: s1.url, accessToken: ANY });
    const before = (await commit({
      repo: repo("kill/r"),
      hubUrl: s1.url,
      title: "good",
      operations: [put("w.txt", "good"), put("m.safetensors", "weights-1")],
    }))!.commit.oid;
    writeFaults(faults, { pauseCommit: true });
    const doomed = commit({
      repo: repo("kill/r"),
      hubUrl: s1.url,
      title: "doomed",
      operations: [put("w.txt", "doomed"), put("m.safetensors", "weights-2")],
    });
    doomed.catch(() => undefined);
    const paused = await s1.waitFor((e) => e.type === "commit-paused");
    await stopServer(s1, "SIGKILL");
    await assert.rejects(doomed);

    fs.rmSync(faults);
    const s2 = await startServer(dir);
    try {
      assert.equal(await headOf(s2.url, "kill/r"), before, "main is still at the last acknowledged commit");
      assert.notEqual(paused.commit, before);
      const w = await downloadFile({ repo: repo("kill/r"), path: "w.txt", hubUrl: s2.url });
      assert.equal(await w!.text(), "good");
      const m = await downloadFile({ repo: repo("kill/r"), path: "m.safetensors", hubUrl: s2.url });
      assert.equal(await m!.text(), "weights-1");
      // The dead server's lock is stale: the next commit takes it and lands on the previous commit.
      const next = (await commit({
        repo: repo("kill/r"),
        hubUrl: s2.url,
        title: "after",
        parentCommit: before,
        operations: [put("w.txt", "after")],
      }))!;
      assert.equal(await headOf(s2.url, "kill/r"), next.commit.oid);
    } finally {
      await stopServer(s2);
    }
  });
});

describe("hub-server --faults FILE (L7)", () => {
  test("switches faults while the server runs; a bad file is reported and leaves the faults in force", {
    timeout: 60_000,
  }, async () => {
    const dir = path.join(tmp, "faulty");
    const faults = path.join(tmp, "faults-f.json");
    const s = await startServer(dir, ["--faults", faults]);
    try {
      await createRepo({ repo: repo("f/r"), hubUrl: s.url, accessToken: ANY });
      writeFaults(faults, { status: { commit: 503 }, failCount: 1 });
      await assert.rejects(
        commit({ repo: repo("f/r"), hubUrl: s.url, title: "x", operations: [put("m.bin", "0123456789")] }),
        (e: HubApiError) => e.statusCode === 503,
      );
      await commit({ repo: repo("f/r"), hubUrl: s.url, title: "x", operations: [put("m.bin", "0123456789")] });
      writeFaults(faults, { truncateDownload: ["m.bin"], truncateMode: "short" });
      const read = async () => (await downloadFile({ repo: repo("f/r"), path: "m.bin", hubUrl: s.url }))!.text();
      assert.equal(await read(), "01234");
      writeFaults(faults, { status: { comit: 500 } });
      assert.equal(await read(), "01234", "a bad faults file leaves the faults in force");
      const warned = await s.waitFor(
        (e) => e.type === "faults" && /status\.comit is not an endpoint/.test(String(e.message)),
      );
      assert.match(String(warned.message), /keeping the faults in force/);
      fs.rmSync(faults);
      assert.equal(await read(), "0123456789");
      writeFaults(faults, { loseCommitAnswer: "m.bin" });
      assert.equal(await read(), "0123456789", "a request makes the server re-read the file");
      const bad = await s.waitFor(
        (e) => e.type === "faults" && /loseCommitAnswer must be an array of path suffixes/.test(String(e.message)),
      );
      assert.match(String(bad.message), /keeping the faults in force/);
      writeFaults(faults, { loseCommitAnswer: ["m.bin"], failCount: 1 });
      await assert.rejects(
        commit({ repo: repo("f/r"), hubUrl: s.url, title: "lost", operations: [put("m.bin", "landed")] }),
        (e: HubApiError) => e.statusCode === 500,
      );
      assert.equal(await read(), "landed", "the commit whose answer was lost landed");
      assert.equal((await listCommits({ repo: repo("f/r"), hubUrl: s.url, batchSize: 1 }).next()).value!.title, "lost");
    } finally {
      await stopServer(s);
    }
  });
});
