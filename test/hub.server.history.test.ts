// The local Hub's history, branches, PR refs, listings and storage, through the real
// @huggingface/hub client (L1, L3, L6): what a user of the real Hub can do with a checkpoint repo.
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import {
  commit,
  countCommits,
  createBranch,
  createRepo,
  datasetInfo,
  deleteBranch,
  deleteRepo,
  downloadFile,
  fileExists,
  listCommits,
  listFiles,
  modelInfo,
  pathsInfo,
  repoExists,
  whoAmI,
  type HubApiError,
} from "@huggingface/hub";
import { useTestHub, type TestHub } from "./helpers/hub";

let th: TestHub;
let n = 0;
const ANY = "hf_anyTokenTheOpenHubTakes";

useTestHub({ pageSize: 2 }, (t) => (th = t));

const ds = (name: string) => ({ type: "dataset" as const, name });
const put = (p: string, content: string | Uint8Array) => ({
  operation: "addOrUpdate" as const,
  path: p,
  content: new Blob([content]),
});
const del = (p: string) => ({ operation: "delete" as const, path: p });
async function newRepo(): Promise<{ type: "dataset"; name: string }> {
  const r = ds(`hist/r${++n}`);
  await createRepo({ repo: r, hubUrl: th.url, accessToken: ANY });
  return r;
}
async function commitOn(
  r: { type: "dataset"; name: string },
  title: string,
  ops: ReturnType<typeof put | typeof del>[],
  extra: object = {},
) {
  return (await commit({ repo: r, hubUrl: th.url, title, operations: ops, ...extra }))!;
}
async function all<T>(it: AsyncGenerator<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}
const text = async (b: Blob | null) => (b ? await b.text() : null);
const objectsDir = (name: string) => path.join(th.tmp, "hub", "datasets", ...name.split("/"), "objects");
const dirBytes = (d: string) => fs.readdirSync(d).reduce((a, f) => a + fs.statSync(path.join(d, f)).size, 0);

describe("history (L1)", () => {
  test("every commit has an id; files read at an old commit id are that commit's, after later commits changed and deleted them", async () => {
    const r = await newRepo();
    const c1 = await commitOn(r, "ckpt 1", [put("ckpt/checkpoint-1/model.safetensors", "w1"), put("latest.json", "1")]);
    const c2 = await commitOn(r, "ckpt 2", [
      put("ckpt/checkpoint-2/model.safetensors", "w2"),
      put("latest.json", "2"),
      del("ckpt/checkpoint-1/model.safetensors"),
    ]);
    assert.notEqual(c1.commit.oid, c2.commit.oid);
    const at = (revision: string, p: string) => downloadFile({ repo: r, path: p, revision, hubUrl: th.url }).then(text);
    assert.equal(await at(c1.commit.oid, "latest.json"), "1");
    assert.equal(await at(c1.commit.oid, "ckpt/checkpoint-1/model.safetensors"), "w1");
    assert.equal(await at("main", "latest.json"), "2");
    assert.equal(await at("main", "ckpt/checkpoint-1/model.safetensors"), null);
    assert.deepEqual(
      (await all(listFiles({ repo: r, revision: c1.commit.oid, recursive: true, hubUrl: th.url })))
        .filter((f) => f.type === "file")
        .map((f) => f.path),
      [".gitattributes", "ckpt/checkpoint-1/model.safetensors", "latest.json"],
    );
    const info = await pathsInfo({
      repo: r,
      paths: ["ckpt/checkpoint-1", "ckpt/checkpoint-2"],
      revision: c1.commit.oid,
      hubUrl: th.url,
    });
    assert.deepEqual(
      info.map((i) => i.path),
      ["ckpt/checkpoint-1"],
    );
    assert.equal(
      await fileExists({
        repo: r,
        path: "ckpt/checkpoint-1/model.safetensors",
        revision: c1.commit.oid,
        hubUrl: th.url,
      }),
      true,
    );
    await assert.rejects(at("0".repeat(40), "latest.json"), (e: HubApiError) => e.statusCode === 404);
  });

  test("loseCommitAnswer: a commit touching a listed path lands (on main, readable) but is answered 500; failCount clears the fault (K8)", async () => {
    const r = await newRepo();
    th.hub.setFaults({ loseCommitAnswer: ["latest.json"], failCount: 1 });
    const other = await commitOn(r, "weights only", [put("ckpt/checkpoint-1/model.safetensors", "w1")]);
    await assert.rejects(commitOn(r, "pointer", [put("latest.json", "1")]), (e: HubApiError) => {
      assert.equal(e.statusCode, 500);
      assert.match(e.message, /the commit landed but its answer was lost/);
      return true;
    });
    const commits = await all(listCommits({ repo: r, hubUrl: th.url }));
    assert.equal(commits[0].title, "pointer", "the commit whose answer was lost is main's head");
    assert.equal(commits[1].oid, other.commit.oid);
    assert.equal(await downloadFile({ repo: r, path: "latest.json", hubUrl: th.url }).then(text), "1");
    const next = await commitOn(r, "pointer again", [put("latest.json", "2")]);
    assert.equal(
      next.commit.oid,
      (await all(listCommits({ repo: r, hubUrl: th.url })))[0].oid,
      "failCount 1: the next commit is answered",
    );
  });

  test("listCommits pages newest first back to the repo's creation, and countCommits counts them", async () => {
    const r = await newRepo();
    const ids = [];
    for (let i = 1; i <= 4; i++) ids.push((await commitOn(r, `step ${i}`, [put("latest.json", String(i))])).commit.oid);
    const listed = await all(listCommits({ repo: r, hubUrl: th.url, batchSize: 2 }));
    assert.deepEqual(
      listed.map((c) => c.title),
      ["step 4", "step 3", "step 2", "step 1", "initial commit"],
    );
    assert.deepEqual(
      listed.slice(0, 4).map((c) => c.oid),
      ids.reverse(),
    );
    assert.ok(listed.every((c) => c.date instanceof Date && !Number.isNaN(c.date.getTime())));
    assert.equal(await countCommits({ repo: r, hubUrl: th.url }), 5);
    assert.equal(await countCommits({ repo: r, revision: listed[2].oid, hubUrl: th.url }), 3);
  });

  test("modelInfo / datasetInfo answer at revision HEAD and at an old commit, with the commit's sha", async () => {
    const r = await newRepo();
    const c1 = await commitOn(r, "one", [put("a.txt", "1")]);
    const c2 = await commitOn(r, "two", [put("a.txt", "2")]);
    const head = await datasetInfo({ name: r.name, hubUrl: th.url, additionalFields: ["sha"] });
    assert.equal(head.sha, c2.commit.oid);
    assert.equal(
      (await datasetInfo({ name: r.name, revision: c1.commit.oid, hubUrl: th.url, additionalFields: ["sha"] })).sha,
      c1.commit.oid,
    );
    await createRepo({ repo: "hist/model-info", hubUrl: th.url, accessToken: ANY });
    const m = await modelInfo({ name: "hist/model-info", hubUrl: th.url });
    assert.equal(m.name, "hist/model-info");
    assert.equal(m.private, false);
  });
});

describe("branches and pull requests (L1)", () => {
  test("createBranch starts a branch at main; its commits leave main alone; deleteBranch removes it", async () => {
    const r = await newRepo();
    const base = await commitOn(r, "base", [put("a.txt", "main")]);
    await createBranch({ repo: r, branch: "exp", hubUrl: th.url, accessToken: ANY });
    await commitOn(r, "on exp", [put("a.txt", "exp")], { branch: "exp" });
    assert.equal(await text(await downloadFile({ repo: r, path: "a.txt", revision: "exp", hubUrl: th.url })), "exp");
    assert.deepEqual(
      (await all(listFiles({ repo: r, revision: "refs/heads/exp", hubUrl: th.url }))).map((f) => f.path),
      [".gitattributes", "a.txt"],
    );
    assert.equal(await text(await downloadFile({ repo: r, path: "a.txt", hubUrl: th.url })), "main");
    assert.equal((await all(listCommits({ repo: r, hubUrl: th.url })))[0].oid, base.commit.oid);
    await assert.rejects(
      createBranch({ repo: r, branch: "exp", hubUrl: th.url, accessToken: ANY }),
      (e: HubApiError) => e.statusCode === 409,
    );
    await deleteBranch({ repo: r, branch: "exp", hubUrl: th.url, accessToken: ANY });
    await assert.rejects(
      downloadFile({ repo: r, path: "a.txt", revision: "exp", hubUrl: th.url }),
      (e: HubApiError) => e.statusCode === 404,
    );
  });

  test("a commit with isPullRequest opens refs/pr/N and never lands on main", async () => {
    const r = await newRepo();
    const base = await commitOn(r, "base", [put("a.txt", "main")]);
    const pr = await commitOn(r, "proposal", [put("a.txt", "pr")], { isPullRequest: true });
    assert.match(pr.pullRequestUrl ?? "", /\/datasets\/hist\/r\d+\/discussions\/1$/);
    assert.equal(await text(await downloadFile({ repo: r, path: "a.txt", hubUrl: th.url })), "main");
    assert.equal((await all(listCommits({ repo: r, hubUrl: th.url })))[0].oid, base.commit.oid);
    assert.equal(
      await text(await downloadFile({ repo: r, path: "a.txt", revision: "refs/pr/1", hubUrl: th.url })),
      "pr",
    );
    assert.deepEqual(
      (await all(listFiles({ repo: r, revision: "refs/pr/1", hubUrl: th.url }))).map((f) => f.path),
      [".gitattributes", "a.txt"],
    );
    const second = await commitOn(r, "another", [put("b.txt", "x")], { isPullRequest: true });
    assert.match(second.pullRequestUrl ?? "", /\/discussions\/2$/);
  });
});

describe("repos (L3)", () => {
  test("deleteRepo removes the repo and its files; the name can be created again", async () => {
    const r = await newRepo();
    await commitOn(r, "data", [put("m.safetensors", new Uint8Array(4096).fill(3))]);
    assert.ok(fs.existsSync(objectsDir(r.name)));
    await deleteRepo({ repo: r, hubUrl: th.url, accessToken: ANY });
    assert.equal(await repoExists({ repo: r, hubUrl: th.url }), false);
    assert.ok(!fs.existsSync(path.dirname(objectsDir(r.name))), "the repo's folder is gone");
    await assert.rejects(
      deleteRepo({ repo: r, hubUrl: th.url, accessToken: ANY }),
      (e: HubApiError) => e.statusCode === 404,
    );
    await createRepo({ repo: r, hubUrl: th.url, accessToken: ANY });
    assert.equal(await countCommits({ repo: r, hubUrl: th.url }), 1);
  });

  test("createRepo stores its files in the first commit and records license and visibility", async () => {
    const r = ds(`hist/created-${++n}`);
    await createRepo({
      repo: r,
      hubUrl: th.url,
      accessToken: ANY,
      license: "mit",
      private: true,
      files: [{ path: "README.md", content: new Blob(["# hi"]) }],
    });
    assert.equal(await text(await downloadFile({ repo: r, path: "README.md", hubUrl: th.url })), "# hi");
    const info = await datasetInfo({ name: r.name, hubUrl: th.url, additionalFields: ["cardData"] });
    assert.equal(info.private, true);
    assert.deepEqual(info.cardData, { license: "mit" });
  });

  test("createRepo with a license and no README.md writes the card the real Hub writes: the license in its front matter", async () => {
    const r = ds(`hist/licensed-${++n}`);
    await createRepo({ repo: r, hubUrl: th.url, accessToken: ANY, license: "apache-2.0" });
    assert.equal(
      await text(await downloadFile({ repo: r, path: "README.md", hubUrl: th.url })),
      "---\nlicense: apache-2.0\n---\n",
    );
    const bare = ds(`hist/unlicensed-${++n}`);
    await createRepo({ repo: bare, hubUrl: th.url, accessToken: ANY });
    assert.equal(await fileExists({ repo: bare, path: "README.md", hubUrl: th.url }), false, "no license, no card");
  });

  test("whoAmI names the caller and its token's role", async () => {
    const me = await whoAmI({ hubUrl: th.url, accessToken: ANY });
    assert.equal(me.type, "user");
    assert.equal(me.auth.accessToken?.role, "write");
  });
});

describe("expand (L3)", () => {
  test("listFiles and pathsInfo with expand give each path the last commit that changed it", async () => {
    const r = await newRepo();
    const c1 = await commitOn(r, "first", [put("d/a.txt", "1"), put("d/b.txt", "1")]);
    const c2 = await commitOn(r, "second", [put("d/b.txt", "2")]);
    await commitOn(r, "third", [put("other.txt", "x")]);
    const files = await all(listFiles({ repo: r, path: "d", expand: true, hubUrl: th.url }));
    assert.deepEqual(
      files.map((f) => [f.path, f.lastCommit?.id, f.lastCommit?.title]),
      [
        ["d/a.txt", c1.commit.oid, "first"],
        ["d/b.txt", c2.commit.oid, "second"],
      ],
    );
    const info = await pathsInfo({ repo: r, paths: ["d", "d/a.txt"], expand: true, hubUrl: th.url });
    assert.deepEqual(
      info.map((i) => [i.path, i.lastCommit?.id]),
      [
        ["d", c2.commit.oid],
        ["d/a.txt", c1.commit.oid],
      ],
    );
    assert.ok(info[1].lastCommit.date instanceof Date);
  });
});

describe("storage (L6)", () => {
  test("a super-squash frees the bytes of checkpoints deleted from main, keeps main's files, and forgets old commits", async () => {
    const r = await newRepo();
    const big = (k: number) => new Uint8Array(200_000).fill(k);
    const old = await commitOn(r, "ckpt 1", [put("ckpt/checkpoint-1/model.safetensors", big(1))]);
    await commitOn(r, "ckpt 2", [put("ckpt/checkpoint-2/model.safetensors", big(2))]);
    await commitOn(r, "prune ckpt 1", [del("ckpt/checkpoint-1/model.safetensors")]);
    const before = dirBytes(objectsDir(r.name));
    assert.ok(before >= 400_000, "history keeps the pruned checkpoint's bytes");
    const res = await fetch(`${th.url}/api/datasets/${r.name}/super-squash/main`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${ANY}` },
      body: JSON.stringify({ message: "squash" }),
    });
    assert.equal(res.status, 200);
    const after = dirBytes(objectsDir(r.name));
    assert.ok(before - after >= 200_000, `squash freed ${before - after} bytes`);
    assert.ok(after >= 200_000, "main's checkpoint is still stored");
    const head = await downloadFile({ repo: r, path: "ckpt/checkpoint-2/model.safetensors", hubUrl: th.url });
    assert.deepEqual(new Uint8Array(await head!.arrayBuffer()), big(2));
    assert.deepEqual(
      (await all(listCommits({ repo: r, hubUrl: th.url }))).map((c) => c.title),
      ["squash"],
    );
    await assert.rejects(
      downloadFile({ repo: r, path: "ckpt/checkpoint-1/model.safetensors", revision: old.commit.oid, hubUrl: th.url }),
      (e: HubApiError) => e.statusCode === 404,
    );
  });

  test("an uploaded object whose commit has not come yet survives a collection", async () => {
    const r = await newRepo();
    await commitOn(r, "a", [put("a.bin", new Uint8Array(100_000).fill(7))]);
    await commitOn(r, "drop a", [del("a.bin")]);
    const stray = path.join(objectsDir(r.name), "f".repeat(64));
    fs.writeFileSync(stray, "an upload in flight");
    const got = await th.hub.collectGarbage({
      type: "dataset",
      owner: r.name.split("/")[0],
      name: r.name.split("/")[1],
    });
    assert.deepEqual(
      got,
      { commits: 0, objects: 0, bytes: 0 },
      "history still reaches a.bin; the fresh upload is not garbage",
    );
    assert.ok(fs.existsSync(stray));
  });
});

describe("upgrade (L1)", () => {
  test("a repo stored by the history-less server (one main.json) reads as one commit with its old id and takes new commits", async () => {
    const dir = path.join(th.tmp, "hub", "datasets", "old", "layout");
    const bytes = Buffer.from("from before");
    const { createHash } = await import("node:crypto");
    const sha = createHash("sha256").update(bytes).digest("hex");
    const gitOid = createHash("sha1").update(`blob ${bytes.length}\0`).update(bytes).digest("hex");
    const oldId = "ab".repeat(20);
    fs.mkdirSync(path.join(dir, "objects"), { recursive: true });
    fs.writeFileSync(path.join(dir, "objects", sha), bytes);
    fs.writeFileSync(
      path.join(dir, "main.json"),
      JSON.stringify({ commit: oldId, files: { "a.txt": { sha256: sha, size: bytes.length, lfs: false, gitOid } } }),
    );
    const r = ds("old/layout");
    assert.equal(await text(await downloadFile({ repo: r, path: "a.txt", hubUrl: th.url })), "from before");
    assert.deepEqual(
      (await all(listCommits({ repo: r, hubUrl: th.url }))).map((c) => c.oid),
      [oldId],
    );
    const next = await commitOn(r, "new", [put("b.txt", "new")], { parentCommit: oldId });
    assert.deepEqual(
      (await all(listCommits({ repo: r, hubUrl: th.url }))).map((c) => c.oid),
      [next.commit.oid, oldId],
    );
    assert.ok(!fs.existsSync(path.join(dir, "main.json")));
  });
});
