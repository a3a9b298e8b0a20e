import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { spawn } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { parquetWriteBuffer } from "hyparquet-writer";
import { readManifest } from "../src/data/manifest";
import { mixFingerprint } from "../src/data/fingerprint";
import { prepareMix } from "../src/data/prepare-mix";
import { globRegExp, parseHubUrl } from "../src/data/hub-input";
import { startTestHub } from "./helpers/hub";
import { createRepo, listCommits } from "@huggingface/hub";
import { corpusDocs } from "./fixtures/corpus-docs";
import { readTree, writeTinyTokenizer } from "./fixtures/data-synth";
import { tmpDir as tempDir } from "./helpers/tmp";

const PREPARE = path.join(__dirname, "..", "prepare.js");
const quiet = { progress: "none" as const, log: () => undefined };
const opts = { valFraction: 0.05, shardTokens: 4000, pieceChars: 3000, ...quiet };
const TOKEN = "hf_localtesttoken0123456789";

const work = tempDir("hubin");
const docs = corpusDocs();
const tokDir = path.join(work, "tok");
const tokenizer = writeTinyTokenizer(
  tokDir,
  docs.filter((d) => d.length > 0),
);
// the dataset: two Parquet shards (a text column and an id), a README and a file of another type
const local = path.join(work, "dataset");
fs.mkdirSync(path.join(local, "data"), { recursive: true });
const halves = [docs.slice(0, 130), docs.slice(130)];
halves.forEach((h, i) => {
  const buf = parquetWriteBuffer({
    columnData: [
      { name: "id", data: h.map((_, j) => j), type: "INT32" },
      { name: "text", data: h, type: "STRING" },
    ],
    rowGroupSize: 40,
  });
  fs.writeFileSync(path.join(local, "data", `train-0000${i}-of-00002.parquet`), new Uint8Array(buf));
});
fs.writeFileSync(path.join(local, "data", "README.md"), "# not part of the glob\n");
fs.writeFileSync(path.join(local, "data", "stats.csv"), "a,b\n");
/** The CLI in a child process, awaited without blocking this process (the local Hub runs here). */
function prepareCli(args: string[], env: NodeJS.ProcessEnv): Promise<{ status: number | null; stderr: string }> {
  return new Promise((resolve) => {
    const c = spawn(process.execPath, [PREPARE, ...args], { env, stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    c.stderr.on("data", (d) => {
      stderr += d;
    });
    c.on("close", (status) => resolve({ status, stderr }));
  });
}
const sha = (f: string) => createHash("sha256").update(fs.readFileSync(f)).digest("hex");

function shardBytes(root: string): Map<string, Buffer> {
  return new Map([...readTree(root)].filter(([k]) => k.endsWith(".bin")));
}

test("a Parquet dataset on the local Hub prepares to the same shards as its local copy, recording the commit and every file's sha256 (D2, D3)", async () => {
  // shard 0 (31.9 kB) goes through LFS (sha256 from the listing), shard 1 (25.9 kB) is a regular file (hashed on download)
  const th = await startTestHub({ repo: "tester/corpus", repoType: "dataset", token: TOKEN, lfsThreshold: 30_000 });
  const prevToken = process.env.HF_TOKEN;
  process.env.HF_TOKEN = TOKEN;
  try {
    // a private dataset: reading it needs the token
    await createRepo({
      repo: { type: "dataset", name: "tester/corpus" },
      private: true,
      hubUrl: th.url,
      accessToken: TOKEN,
    });
    const ds = th.store({ token: TOKEN });
    await ds.uploadFolder(path.join(local, "data"), "data", "dataset");
    const tk = th.store({ repo: "tester/tok", repoType: "model", token: TOKEN });
    await tk.ensureRepo();
    await tk.uploadFolder(tokDir, "tok", "tokenizer");
    const head = async (): Promise<string> => {
      for await (const c of listCommits({
        repo: { type: "dataset", name: "tester/corpus" },
        hubUrl: th.url,
        accessToken: TOKEN,
        batchSize: 1,
      }))
        return c.oid;
      throw new Error("no commit");
    };
    const commit = await head();

    const fromLocal = path.join(work, "out-local");
    await prepareMix({
      inputs: [
        path.join(local, "data", "train-00000-of-00002.parquet"),
        path.join(local, "data", "train-00001-of-00002.parquet"),
      ],
      tokenizer,
      out: fromLocal,
      workers: 1,
      ...opts,
    });
    const fromHub = path.join(work, "out-hub");
    await prepareMix({
      inputs: ["hf://datasets/tester/corpus/data/*.parquet"],
      tokenizer: "hf://models/tester/tok/tok",
      hubUrl: th.url,
      out: fromHub,
      workers: 2,
      ...opts,
    });

    const a = shardBytes(fromLocal),
      b = shardBytes(fromHub);
    assert.deepEqual([...b.keys()], [...a.keys()]);
    for (const [k, v] of a) assert.ok(v.equals(b.get(k)!), `${k} differs between the Hub and the local copy`);
    const m = readManifest(fromHub);
    assert.deepEqual(m.shards, readManifest(fromLocal).shards);
    assert.equal(m.sources?.length, 1);
    const src = m.sources[0];
    assert.equal(src.repo, "tester/corpus");
    assert.equal(src.requested_revision, "main");
    assert.equal(src.revision, commit, "the branch was resolved to the commit it pointed at");
    assert.deepEqual(
      src.files.map((f) => f.path),
      ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"],
      "only the glob's files, in path order",
    );
    for (const f of src.files) assert.equal(f.sha256, sha(path.join(local, f.path)), `${f.path} sha256`);
    const listed = await ds.list("data", { hashRegular: false });
    assert.deepEqual(
      listed.filter((f) => f.path.endsWith(".parquet")).map((f) => f.lfs),
      [true, false],
      "one LFS file, one regular file",
    );
    assert.equal((m.prepare as { tokenizer_source?: { repo: string } }).tokenizer_source?.repo, "tester/tok");
    assert.ok(
      !fs.readFileSync(path.join(fromHub, "manifest.json"), "utf8").includes(TOKEN),
      "no token in the manifest",
    );

    // the fingerprint covers where the corpus came from: same shards, other provenance -> other fingerprint
    const fp = mixFingerprint(fromHub, m);
    assert.notEqual(fp, mixFingerprint(fromLocal, readManifest(fromLocal)));
    const other = { ...m, sources: [{ ...src, revision: "0".repeat(40) }] };
    assert.notEqual(mixFingerprint(fromHub, other), fp, "another revision, another fingerprint");
    const otherFile = {
      ...m,
      sources: [{ ...src, files: src.files.map((f, i) => (i ? f : { ...f, sha256: "1".repeat(64) })) }],
    };
    assert.notEqual(mixFingerprint(fromHub, otherFile), fp, "another file sha256, another fingerprint");

    // after the dataset moves on, the old commit still gives the same mix; main gives another
    const changed = path.join(work, "dataset-v2");
    fs.mkdirSync(changed);
    fs.writeFileSync(
      path.join(changed, "train-00000-of-00002.parquet"),
      new Uint8Array(parquetWriteBuffer({ columnData: [{ name: "text", data: docs.slice(0, 60) }] })),
    );
    await ds.uploadFolder(changed, "data", "v2");
    assert.notEqual(await head(), commit);
    const pinned = path.join(work, "out-pinned");
    await prepareMix({
      inputs: [`hf://datasets/tester/corpus@${commit}/data/*.parquet`],
      tokenizer,
      hubUrl: th.url,
      out: pinned,
      workers: 1,
      ...opts,
    });
    for (const [k, v] of a) assert.ok(v.equals(shardBytes(pinned).get(k)!), `pinned: ${k}`);
    assert.equal(readManifest(pinned).sources![0].revision, commit);
    const moved = path.join(work, "out-moved");
    await prepareMix({
      inputs: ["hf://datasets/tester/corpus/data/*.parquet"],
      tokenizer,
      hubUrl: th.url,
      out: moved,
      workers: 1,
      ...opts,
    });
    assert.equal(readManifest(moved).sources![0].revision, await head());
    assert.notDeepEqual(readManifest(moved).shards, m.shards);
    // a glob that matches nothing is refused before any work
    await assert.rejects(
      prepareMix({
        inputs: ["hf://datasets/tester/corpus/data/*.jsonl"],
        tokenizer,
        hubUrl: th.url,
        out: path.join(work, "out-none"),
        ...opts,
      }),
      (e: Error) =>
        e.name === "UserError" && /matches no .* file on tester\/corpus at main; check the path-glob/.test(e.message),
    );
    assert.equal(fs.existsSync(path.join(work, "out-none")), false);

    // without the token (private repo) or with a wrong one the Hub refuses; the message says HF_TOKEN (CLI: exit 2)
    const args = [
      "--input",
      "hf://datasets/tester/corpus/data/*.parquet",
      "--tokenizer",
      tokenizer,
      "--hub-url",
      th.url,
      "--out",
      path.join(work, "out-noauth"),
    ];
    const r = await prepareCli(args, { ...process.env, HF_TOKEN: "" });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /the Hub answered 401 .* set HF_TOKEN to a token that can read it \[D2\]/);
    assert.doesNotMatch(r.stderr, /\n\s+at /, "no stack trace");
    const wrong = await prepareCli(args, { ...process.env, HF_TOKEN: "hf_wrongwrongwrong" });
    assert.equal(wrong.status, 2, wrong.stderr);
    assert.match(wrong.stderr, /HF_TOKEN/);
    assert.ok(!wrong.stderr.includes("hf_wrongwrongwrong") && !wrong.stderr.includes(TOKEN), "no token in the error");
  } finally {
    if (prevToken === undefined) delete process.env.HF_TOKEN;
    else process.env.HF_TOKEN = prevToken;
    await th.close();
  }
});

test("hf:// URLs and globs parse by the Hub's convention", () => {
  assert.deepEqual(parseHubUrl("hf://datasets/o/n@refs%2Fconvert%2Fparquet/default/train/*.parquet", "--input"), {
    repoType: "dataset",
    repo: "o/n",
    revision: "refs/convert/parquet",
    glob: "default/train/*.parquet",
  });
  assert.deepEqual(parseHubUrl("hf://datasets/o/n", "--input"), {
    repoType: "dataset",
    repo: "o/n",
    revision: "main",
    glob: "",
  });
  assert.throws(
    () => parseHubUrl("hf://o/n/x", "--input"),
    /is not a Hub URL of the form hf:\/\/datasets\/owner\/name\[@revision\]\/path-glob/,
  );
  const re = globRegExp("data/**/*.parquet");
  assert.ok(
    re.test("data/a.parquet") &&
      re.test("data/x/y/a.parquet") &&
      !re.test("data/a.parquet.bak") &&
      !re.test("other/a.parquet"),
  );
  assert.ok(
    globRegExp("data/train-?.jsonl").test("data/train-1.jsonl") && !globRegExp("data/*.jsonl").test("data/x/a.jsonl"),
  );
});
