// The HubClient interface and the LocalHub protocol, through the real @huggingface/hub client (A6, B6).
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { fileDownloadInfo, pathsInfo } from "@huggingface/hub";
import { useTestHub, writeFakeCheckpoint, pointerOf, type TestHub } from "./helpers/hub";
import { createHubClient } from "../src/hub/client";

let th: TestHub;
let n = 0;
const sha = (b: Buffer | string) => createHash("sha256").update(b).digest("hex");

useTestHub({ pageSize: 3, lfsThreshold: 1024 }, (t) => (th = t));

function folder(files: Record<string, string | Buffer>): string {
  const dir = path.join(th.tmp, `local-${++n}`);
  for (const [rel, content] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
    fs.writeFileSync(path.join(dir, rel), content);
  }
  return dir;
}

describe("LocalHub", () => {
  test("binds loopback by default and returns a base URL without a trailing slash (B6)", () => {
    assert.match(th.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  });

  test("answers the client's size probe with 206, Content-Range and an ETag, and honours Range slices", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    const big = Buffer.alloc(5000, 7);
    await store.uploadFolder(folder({ "w.bin": big, "a.txt": "hello" }), "x", "two files");
    const info = await fileDownloadInfo({
      repo: { type: "dataset", name: store.repo },
      path: "x/w.bin",
      hubUrl: th.url,
    });
    assert.equal(info!.size, 5000);
    assert.equal(info!.etag, `"${sha(big)}"`);
    const res = await fetch(`${th.url}/datasets/${store.repo}/resolve/main/x/a.txt`, {
      headers: { Range: "bytes=1-3" },
    });
    assert.equal(res.status, 206);
    assert.equal(res.headers.get("content-range"), "bytes 1-3/5");
    assert.equal(await res.text(), "ell");
    const head = await fetch(`${th.url}/datasets/${store.repo}/resolve/main/x/nope.txt`, { method: "HEAD" });
    assert.equal(head.status, 404);
    assert.equal(head.headers.get("x-error-code"), "EntryNotFound");
    assert.notEqual(head.headers.get("content-type"), "application/json");
  });

  test("paths-info reports files with their LFS oid and leaves missing paths out", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    const big = Buffer.alloc(3000, 1);
    await store.uploadFolder(folder({ "w.bin": big }), "d", "one file");
    const info = await pathsInfo({
      repo: { type: "dataset", name: store.repo },
      paths: ["d/w.bin", "d/missing", "d"],
      hubUrl: th.url,
    });
    assert.deepEqual(
      info.map((i) => [i.path, i.type]),
      [
        ["d/w.bin", "file"],
        ["d", "directory"],
      ],
    );
    assert.equal(info[0].lfs!.oid, sha(big));
  });

  test("sends RepoNotFound, EntryNotFound and RevisionNotFound as X-Error-Code", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    const a = await fetch(`${th.url}/datasets/${store.repo}/resolve/main/latest.json`);
    assert.equal(a.headers.get("x-error-code"), "RepoNotFound");
    await store.ensureRepo();
    const b = await fetch(`${th.url}/datasets/${store.repo}/resolve/main/latest.json`);
    assert.equal(b.headers.get("x-error-code"), "EntryNotFound");
    const c = await fetch(`${th.url}/datasets/${store.repo}/resolve/nobranch/latest.json`);
    assert.equal(c.headers.get("x-error-code"), "RevisionNotFound");
  });

  test("rejects an LFS upload whose bytes do not hash to the announced oid", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    // The fetch option is the documented injection point: flip the bytes the client PUTs.
    const tamper: typeof fetch = async (input, init) => {
      if (init?.method === "PUT" && init.body instanceof Blob) {
        const b = Buffer.from(await init.body.arrayBuffer());
        b[0] ^= 0xff;
        return fetch(input, { ...init, body: b });
      }
      return fetch(input, init);
    };
    const bad = createHubClient({ hubUrl: th.url, repo: store.repo, repoType: "dataset", fetch: tamper });
    await assert.rejects(
      bad.uploadFolder(folder({ "m.safetensors": Buffer.alloc(2048, 3) }), "c", "tampered"),
      /Api error with status 400|hash to sha256/,
    );
    assert.deepEqual(await store.list("c"), []);
  });

  test("rejects a commit whose lfsFile was never uploaded", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    // Divert the PUT to an endpoint of the same server that answers 200 without storing anything:
    // the commit then references an oid the store never received.
    const skipPut: typeof fetch = async (input, init) =>
      init?.method === "PUT" ? fetch(`${th.url}/api/datasets/${store.repo}`) : fetch(input, init);
    const bad = createHubClient({ hubUrl: th.url, repo: store.repo, repoType: "dataset", fetch: skipPut });
    await assert.rejects(
      bad.uploadFolder(folder({ "m.safetensors": Buffer.alloc(2048, 4) }), "c", "no bytes"),
      /was never uploaded/,
    );
    assert.deepEqual(await store.list("c"), []);
  });

  test("stores an empty file and serves it back as zero bytes", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    await store.uploadFolder(folder({ "empty.txt": "" }), "e", "empty");
    const b = await store.download("e/empty.txt");
    assert.equal(b!.length, 0);
    assert.deepEqual(
      (await store.list("e")).map((f) => [f.size, f.sha256]),
      [[0, sha("")]],
    );
  });

  test("logs every request with its method, path and status", async () => {
    const before = th.hub.requests.length;
    await th.store({ repo: `tester/store-${++n}` }).repoExists();
    const last = th.hub.requests.slice(before);
    assert.deepEqual(last, [{ method: "GET", path: `/api/datasets/tester/store-${n}`, status: 404 }]);
  });
});

describe("HubClient", () => {
  test("ensureRepo creates a missing repo once and then reports it exists (K5)", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    assert.equal(await store.repoExists(), false);
    assert.deepEqual(await store.ensureRepo(), { created: true });
    assert.deepEqual(await store.ensureRepo(), { created: false });
    assert.equal(await store.repoExists(), true);
  });

  test("works with model repos as well as dataset repos", async () => {
    const store = th.store({ repo: `tester/model-${++n}`, repoType: "model" });
    await store.ensureRepo();
    await store.uploadFolder(folder({ "a.json": "{}" }), "m", "model file");
    assert.deepEqual(
      (await store.list()).map((f) => f.path),
      [".gitattributes", "m/a.json"],
    );
    assert.ok(
      th.hub.requests.some((q) => q.path === `/${store.repo}/resolve/main/m/a.json`),
      "model repos resolve without a prefix",
    );
  });

  test("uploadFolder is one commit and list pages through a recursive tree with sha256 for every file", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    const files: Record<string, string | Buffer> = {
      "a.json": "{}",
      "b/c.json": '{"x":1}',
      "b/d/e.bin": Buffer.alloc(4096, 9),
      "w.safetensors": Buffer.alloc(100, 2),
    };
    const before = th.hub.requests.length;
    await store.uploadFolder(folder(files), "run/ckpt", "four files");
    const commits = th.hub.requests.slice(before).filter((q) => q.path.endsWith("/commit/main"));
    assert.equal(commits.length, 1);
    const listed = await store.list("run");
    assert.deepEqual(
      listed.map((f) => [f.path, f.size, f.sha256]),
      Object.entries(files)
        .map(([k, v]) => [`run/ckpt/${k}`, Buffer.from(v).length, sha(v)])
        .sort(),
    );
    assert.deepEqual(
      listed.map((f) => f.lfs),
      [false, false, true, true],
    );
    // pageSize is 3: the listing followed Link rel="next".
    assert.ok(th.hub.requests.filter((q) => q.path === `/api/datasets/${store.repo}/tree/main/run`).length >= 2);
  });

  test("list of a prefix that does not exist is empty, of a missing repo throws RepoMissingError (R2)", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await assert.rejects(store.list(), (e: Error) => e.name === "RepoMissingError" && /does not exist/.test(e.message));
    await store.ensureRepo();
    assert.deepEqual(await store.list("nothing/here"), []);
  });

  test("download returns null only for EntryNotFound; a missing repo and a 500 throw", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await assert.rejects(store.download("x.json"), { name: "RepoMissingError" });
    await store.ensureRepo();
    assert.equal(await store.download("x.json"), null);
    th.hub.setFaults({ status: { resolve: 500 } });
    await assert.rejects(store.download("x.json"), /injected fault: resolve answers 500/);
  });

  test("readPointer is null when latest.json is missing and throws when the lookup fails (R2)", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    assert.equal(await store.readPointer(), null);
    th.hub.setFaults({ status: { pointerRead: 503 } });
    await assert.rejects(store.readPointer(), /503/);
  });

  test("writePointer commits latest.json and reads it back (K3)", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    const p = {
      path_in_repo: "ckpt/checkpoint-5",
      step: 5,
      samples_consumed: 40,
      tokens_consumed: 640,
      fingerprint: "fp",
      seed: 1,
    };
    await store.writePointer(p);
    assert.deepEqual(await store.readPointer(), p);
  });

  test("writePointer throws when the pointer does not read back as written", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    th.hub.setFaults({ dropOnCommit: ["latest.json"] });
    await assert.rejects(
      store.writePointer({
        path_in_repo: "ckpt/checkpoint-5",
        step: 5,
        samples_consumed: 40,
        tokens_consumed: 640,
        fingerprint: "fp",
        seed: 1,
      }),
      /latest\.json on tester\/store-\d+ reads back as null after writing/,
    );
  });

  test("downloadFolder brings every file down and checks size and hash against the listing (R4)", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    const ck = writeFakeCheckpoint(path.join(th.tmp, `ck-${n}`), { step: 3 });
    await store.uploadFolder(ck.dir, pointerOf(ck).path_in_repo, "ckpt");
    const dest = path.join(th.tmp, `down-${n}`);
    const got = await store.downloadFolder("ckpt/checkpoint-3", dest);
    assert.equal(got.files, 5);
    for (const f of fs.readdirSync(ck.dir))
      assert.deepEqual(fs.readFileSync(path.join(dest, f)), fs.readFileSync(path.join(ck.dir, f)));
    assert.equal(
      got.bytes,
      fs.readdirSync(ck.dir).reduce((a, f) => a + fs.statSync(path.join(ck.dir, f)).size, 0),
    );
  });

  test("a hubUrl with a trailing slash works", async () => {
    const store = th.store({ repo: `tester/store-${++n}`, hubUrl: `${th.url}/` });
    assert.deepEqual(await store.ensureRepo(), { created: true });
  });

  test("a list that times out fails as a lookup failure, not as an empty repo", async () => {
    const repo = `tester/store-${++n}`;
    await th.store({ repo }).ensureRepo(); // set-up with the default timeout; only the request under test is short
    const store = th.store({ repo, timeoutMs: 200 });
    th.hub.setFaults({ delayMs: { list: 2000 } });
    await assert.rejects(
      store.list(),
      (e: Error) => e.name === "HubLookupError" && /timed out after 200 ms: GET .*\/tree\/main/.test(e.message),
    );
  });

  test("a delayed request whose client gave up does not spend a fault set after it arrived: faults are matched per request as written", async () => {
    const repo = `tester/store-${++n}`;
    const store = th.store({ repo });
    await store.ensureRepo();
    th.hub.setFaults({ delayMs: { list: 1500 }, failCount: 1 });
    await assert.rejects(th.store({ repo, timeoutMs: 200 }).list(), /timed out after 200 ms/);
    // The client gave up; the server still holds the listing. The next fault is set now, and the held
    // request is answered (in this process, its timer fires first) before the upload below starts.
    th.hub.setFaults({ dropOnCommit: ["b.txt"], failCount: 1 });
    await new Promise((r) => setTimeout(r, 1600));
    await store.uploadFolder(folder({ "a.txt": "a", "b.txt": "b" }), "one", "first");
    await store.uploadFolder(folder({ "a.txt": "a", "b.txt": "b" }), "two", "second");
    const paths = (await store.list())
      .map((f) => f.path)
      .filter((p) => p.endsWith(".txt"))
      .sort();
    assert.deepEqual(
      paths,
      ["one/a.txt", "two/a.txt", "two/b.txt"],
      "the drop fault hit the first commit only, the listing was not delayed again",
    );
  });

  test("failCount lets a fault apply N times and then clear", async () => {
    const store = th.store({ repo: `tester/store-${++n}` });
    await store.ensureRepo();
    th.hub.setFaults({ status: { list: 500 }, failCount: 2 });
    await assert.rejects(store.list());
    await assert.rejects(store.list());
    assert.equal((await store.list()).length, 1);
  });
});
