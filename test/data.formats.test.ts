import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import * as zlib from "node:zlib";
import { decompress as zstdDecompress } from "fzstd";
import { parquetWriteBuffer } from "hyparquet-writer";
import { readManifest } from "../src/data/manifest";
import { prepareMix } from "../src/data/prepare-mix";
import { pieceEnd } from "../src/data/inputs";
import { corpusDocs, corpusJsonl } from "./fixtures/corpus-docs";
import { readTree, writeTinyTokenizer } from "./fixtures/data-synth";
import { tmpDir as tempDir } from "./helpers/tmp";
import { assertAdviceRuns } from "./helpers/cli";

const PREPARE = path.join(__dirname, "..", "prepare.js");
const ZST = path.join(__dirname, "..", "..", "test", "fixtures", "corpus-docs.jsonl.zst");
const quiet = { progress: "none" as const, log: () => undefined };
// small read chunks and pieces, so every reader cuts inside characters, lines and documents
const small = { chunkBytes: 1024, pieceChars: 3000, valFraction: 0.05, shardTokens: 5000, ...quiet };

const work = tempDir("formats");
const docs = corpusDocs();
const tokenizer = writeTinyTokenizer(
  path.join(work, "tok"),
  docs.filter((d) => d.length > 0),
);
const EOS = "<|endoftext|>";

function write(name: string, data: string | Uint8Array): string {
  const p = path.join(work, "in", name);
  fs.mkdirSync(path.dirname(p), { recursive: true });
  fs.writeFileSync(p, data);
  return p;
}

/** Shards and their manifest entries (the provenance fields may differ by input format). */
function shardsOf(root: string): { files: Map<string, Buffer>; list: unknown } {
  const t = readTree(root);
  const files = new Map([...t].filter(([k]) => k.endsWith(".bin")));
  const m = readManifest(root);
  return {
    files,
    list: { shards: m.shards, val: m.val_shards, corpus: m.prepare?.corpus_sha256, documents: m.prepare?.documents },
  };
}

function assertSameShards(a: string, b: string, what: string): void {
  const x = shardsOf(a),
    y = shardsOf(b);
  assert.deepEqual([...y.files.keys()], [...x.files.keys()], `${what}: shard names`);
  for (const [k, v] of x.files) assert.ok(v.equals(y.files.get(k)!), `${what}: ${k} differs from the .jsonl build`);
  assert.deepEqual(y.list, x.list, `${what}: manifest shard lists`);
}

const jsonl = write("ref.jsonl", corpusJsonl());
const ref = path.join(work, "out-ref");
const refReady = prepareMix({ inputs: [jsonl], tokenizer, out: ref, workers: 1, ...small });

test("the committed .jsonl.zst fixture decompresses to the generated corpus (fixture sanity)", () => {
  assert.equal(Buffer.from(zstdDecompress(fs.readFileSync(ZST))).toString("utf8"), corpusJsonl());
});

test("the reference .jsonl build holds every non-empty document, several cut into pieces", async () => {
  await refReady;
  const m = readManifest(ref);
  assert.equal(m.prepare?.documents, docs.filter((d) => d.length > 0).length);
  assert.ok(m.shards.length >= 3 && m.val_shards.length >= 1);
  assert.ok(docs.filter((d) => d.length > 3000).length >= 5, "the corpus has documents longer than a piece");
});

test("a .jsonl.gz, a .jsonl.zst and a Parquet file prepare to the same shards as the .jsonl (D2)", async () => {
  await refReady;
  const gz = write("c.jsonl.gz", zlib.gzipSync(corpusJsonl()));
  const zst = write("c.jsonl.zst", fs.readFileSync(ZST));
  // Parquet: several row groups, a null cell and an empty string (both dropped like empty documents)
  const col = [...docs, null as unknown as string];
  const pq = write(
    "c.parquet",
    new Uint8Array(
      parquetWriteBuffer({
        columnData: [
          { name: "id", data: col.map((_, i) => i), type: "INT32" },
          { name: "text", data: col, type: "STRING", nullable: true },
        ],
        rowGroupSize: 50,
      }),
    ),
  );
  for (const [name, file, workers] of [
    ["gz", gz, 2],
    ["zst", zst, 1],
    ["parquet", pq, 2],
  ] as const) {
    const out = path.join(work, `out-${name}`);
    await prepareMix({ inputs: [file], tokenizer, out, workers, ...small });
    assertSameShards(ref, out, name);
  }
});

test("a plain-text file many chunks long, documents split at EOS lines, prepares to the same shards as the .jsonl (D2)", async () => {
  await refReady;
  const text = docs.join(`\n${EOS}\n`);
  assert.ok(Buffer.byteLength(text) > 100 * small.chunkBytes);
  const txt = write("c.txt", text);
  const out = path.join(work, "out-txt");
  await prepareMix({ inputs: [txt], tokenizer, out, workers: 2, ...small });
  assertSameShards(ref, out, "txt");
});

test("the CLI reads a Parquet column named by --text-field and refuses a missing column before any work (D2)", async () => {
  await refReady;
  const pq = write(
    "content.parquet",
    new Uint8Array(
      parquetWriteBuffer({ columnData: [{ name: "content", data: docs, type: "STRING" }], rowGroupSize: 64 }),
    ),
  );
  const bad = path.join(work, "out-cli-bad");
  const r = spawnSync(process.execPath, [PREPARE, "--input", pq, "--tokenizer", tokenizer, "--out", bad], {
    encoding: "utf8",
  });
  assert.equal(r.status, 2, r.stderr);
  assert.match(
    r.stderr,
    /content\.parquet has no column "text" \(its columns: content\): pick the text column: run node dist\/prepare\.js .* --text-field content \(its first string column\) \[D2\]/,
  );
  assert.equal(fs.existsSync(bad), false, "nothing written");
  const jb = write("content.jsonl", corpusJsonl("content"));
  // the advice, as printed, builds the mix; so does a .jsonl's, whose lines hold "content"
  assertAdviceRuns(r.stderr);
  assert.ok(fs.existsSync(path.join(bad, "manifest.json")));
  const jbad = path.join(work, "out-cli-jsonl-bad");
  const j = spawnSync(process.execPath, [PREPARE, "--input", jb, "--tokenizer", tokenizer, "--out", jbad], {
    encoding: "utf8",
  });
  assert.equal(j.status, 2, j.stderr);
  assert.match(
    j.stderr,
    /content\.jsonl:1 has no "text" string \(it has: id, content\): .*: run node dist\/prepare\.js .* --text-field content \(its first string field\) \[D2\]/,
  );
  assertAdviceRuns(j.stderr);
  assert.ok(fs.existsSync(path.join(jbad, "manifest.json")));
  const a = path.join(work, "out-cli-pq"),
    b = path.join(work, "out-cli-jsonl");
  for (const [inp, out] of [
    [pq, a],
    [jb, b],
  ]) {
    const ok = spawnSync(
      process.execPath,
      [
        PREPARE,
        "--input",
        inp,
        "--tokenizer",
        tokenizer,
        "--out",
        out,
        "--text-field",
        "content",
        "--workers",
        "2",
        "--val-fraction",
        "0.05",
        "--shard-tokens",
        "5000",
      ],
      { encoding: "utf8" },
    );
    assert.equal(ok.status, 0, ok.stderr);
  }
  assertSameShards(a, b, "--text-field content");
});

/** A Zstandard frame of raw (stored) blocks: what any decoder reads, written without a compressor. */
function zstdRawFrame(data: Buffer): Buffer {
  const parts: Buffer[] = [Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38])]; // magic; no checksum, no size; window 128 KiB
  for (let off = 0; off === 0 || off < data.length; off += 65536) {
    const block = data.subarray(off, off + 65536);
    const last = off + 65536 >= data.length ? 1 : 0;
    const h = (block.length << 3) | last; // block type 0: raw
    parts.push(Buffer.from([h & 0xff, (h >> 8) & 0xff, (h >> 16) & 0xff]), block);
  }
  return Buffer.concat(parts);
}

test("the last document of a .jsonl, .jsonl.gz and .jsonl.zst without a trailing newline is read like any other (CLI, D2)", async () => {
  const body = corpusJsonl().replace(/\n$/, "");
  assert.ok(
    !body.endsWith("\n") && JSON.parse(body.slice(body.lastIndexOf("\n") + 1)).text.length > 0,
    "the last line is a real document",
  );
  const cli = (input: string, out: string) => {
    const r = spawnSync(
      process.execPath,
      [
        PREPARE,
        "--input",
        input,
        "--tokenizer",
        tokenizer,
        "--out",
        out,
        "--workers",
        "1",
        "--val-fraction",
        "0.05",
        "--shard-tokens",
        "5000",
      ],
      { encoding: "utf8" },
    );
    assert.equal(r.status, 0, r.stderr);
  };
  const withNl = path.join(work, "out-cli-nl");
  cli(write("nl.jsonl", corpusJsonl()), withNl);
  assert.equal(
    zstdDecompress(zstdRawFrame(Buffer.from(body))).length,
    Buffer.byteLength(body),
    "the raw zstd frame decodes",
  );
  for (const [name, data] of [
    ["nonl.jsonl", body],
    ["nonl.jsonl.gz", zlib.gzipSync(body)],
    ["nonl.jsonl.zst", zstdRawFrame(Buffer.from(body))],
  ] as const) {
    const out = path.join(work, `out-cli-${name}`);
    cli(write(name, data), out);
    assert.equal(
      readManifest(out).prepare?.documents,
      docs.filter((d) => d.length > 0).length,
      `${name}: every document, the last one too`,
    );
    assertSameShards(withNl, out, name);
  }
});

test("the long-document rule cuts after the last newline within a piece, else at the size without splitting a surrogate pair", () => {
  assert.equal(pieceEnd("abcdef", 0, 10), 6);
  assert.equal(pieceEnd("ab\ncd\nefgh", 0, 8), 6);
  assert.equal(pieceEnd("abcdefghij", 2, 4), 6);
  assert.equal(pieceEnd("abc😀def", 0, 4), 3, "a cut at 4 would split the pair at 3..4");
});
