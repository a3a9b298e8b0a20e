import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { readManifest } from "../src/data/manifest";
import { isValDoc, prepareMix, valPpm } from "../src/data/prepare-mix";
import { PackedTokenStore } from "../src/data/token-store";
import { readTree, writeTinyTokenizer } from "./fixtures/data-synth";
import { tmpDir } from "./helpers/tmp";
import { corpusDocs, corpusJsonl } from "./fixtures/corpus-docs";

const PREPARE = path.join(__dirname, "..", "prepare.js");
const quiet = { progress: "none" as const, log: () => undefined };

// A small corpus: two text files, a nested directory, a .jsonl of 30 documents, one file to skip.
const work = tmpDir("prep");
const corpus = path.join(work, "corpus");
const docs: string[] = [];
function doc(i: number): string {
  return `Document ${i}: the quick brown fox jumps over the lazy dog ${i % 7} times. "Quotes", numbers ${i * 37}, café, naïve — ünïcode ✓.\nSecond line of ${i}.`;
}
fs.mkdirSync(path.join(corpus, "b-nested"), { recursive: true });
fs.writeFileSync(path.join(corpus, "a.txt"), doc(0));
docs[0] = doc(0);
const lines: string[] = [];
for (let i = 1; i <= 30; i++) {
  lines.push(JSON.stringify({ text: doc(i) }));
  docs[i] = doc(i);
}
fs.writeFileSync(path.join(corpus, "b-nested", "part.jsonl"), `${lines.join("\n")}\n\n`);
fs.writeFileSync(path.join(corpus, "c.md"), doc(31));
docs[31] = doc(31);
fs.writeFileSync(path.join(corpus, "z.bin"), Buffer.from([0, 1, 2, 255]));
const tokenizer = writeTinyTokenizer(path.join(work, "tok"), docs.concat(docs));

function loadTk(dir: string): Tokenizer {
  return new Tokenizer(
    JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
    JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
  );
}

/** All tokens of one split, as plain numbers. */
function streamOf(root: string, split: "train" | "val"): number[] {
  const m = readManifest(root);
  const st = PackedTokenStore.open(root, m, split);
  const out = new Int32Array(st.totalTokens);
  st.readTokens(0, st.totalTokens, out);
  st.close();
  return Array.from(out);
}

test("prepare writes byte-identical roots with --workers 1 (CLI) and --workers 2 (library) (D2)", async () => {
  const a = path.join(work, "out-w1");
  const b = path.join(work, "out-w2");
  const r = spawnSync(
    process.execPath,
    [
      PREPARE,
      "--input",
      corpus,
      "--tokenizer",
      tokenizer,
      "--out",
      a,
      "--val-fraction",
      "0.1",
      "--shard-tokens",
      "700",
      "--workers",
      "1",
    ],
    { encoding: "utf8" },
  );
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /skipped 1 non-text files/);
  await prepareMix({ inputs: [corpus], tokenizer, out: b, valFraction: 0.1, shardTokens: 700, workers: 2, ...quiet });
  const ta = readTree(a);
  const tb = readTree(b);
  assert.deepEqual([...ta.keys()], [...tb.keys()]);
  for (const [k, v] of ta) assert.ok(v.equals(tb.get(k)!), `${k} differs between --workers 1 and 2`);
  const m = readManifest(a);
  assert.ok(m.shards.length >= 3, "several shards");
  assert.ok(
    m.shards.slice(0, -1).every((s) => s.tokens === 700),
    "shards cut at exactly --shard-tokens",
  );
  assert.deepEqual(m.tokenizer_files, ["tokenizer.json", "tokenizer_config.json"]);
  assert.equal(m.dtype, "uint16");
  assert.equal(m.vocab_size, 300);
  assert.equal(m.eos_id, 0);
  assert.deepEqual(
    fs.readdirSync(work).filter((f) => f.includes(".partial-")),
    [],
    "no staging directory left",
  );
});

test("documents are EOS-separated, held out whole by the stated rule, and decode back to the corpus (D2)", () => {
  const root = path.join(work, "out-w1");
  const tk = loadTk(root);
  const ppm = valPpm(0.1);
  const split = (ids: number[]): number[][] => {
    const out: number[][] = [];
    let cur: number[] = [];
    for (const t of ids) {
      if (t === 0) {
        out.push(cur);
        cur = [];
      } else cur.push(t);
    }
    assert.equal(cur.length, 0, "the stream ends with EOS");
    return out;
  };
  const train = split(streamOf(root, "train")).map((ids) => tk.decode(ids));
  const val = split(streamOf(root, "val")).map((ids) => tk.decode(ids));
  assert.deepEqual(
    val,
    docs.filter((_, i) => isValDoc(i, ppm)),
  );
  assert.deepEqual(
    train,
    docs.filter((_, i) => !isValDoc(i, ppm)),
  );
  assert.equal(val.length, 3, "floor(32 * 0.1) documents held out");
  const m = readManifest(root);
  assert.equal((m.prepare as { val_documents: number }).val_documents, 3);
});

test("prepare refuses a corrupt tokenizer.json with exit code 2 and one clear line, no stack trace (D2)", () => {
  const bad = path.join(work, "bad-tok");
  fs.mkdirSync(bad, { recursive: true });
  fs.writeFileSync(path.join(bad, "tokenizer.json"), '{"model": {"type": "BPE", "vocab": {');
  const out = path.join(work, "out-bad");
  const r = spawnSync(
    process.execPath,
    [PREPARE, "--input", corpus, "--tokenizer", path.join(bad, "tokenizer.json"), "--out", out],
    { encoding: "utf8" },
  );
  assert.equal(r.status, 2);
  assert.match(
    r.stderr,
    /^prepare: --tokenizer .*tokenizer\.json is not valid JSON \(.*\): it must be a Hugging Face tokenizer\.json; re-download or regenerate it \[D2\]\n$/,
  );
  assert.doesNotMatch(r.stderr, /\n\s+at /, "no stack trace");
  assert.equal(fs.existsSync(out), false, "nothing written");
  // valid JSON that is not a tokenizer
  fs.writeFileSync(path.join(bad, "tokenizer.json"), JSON.stringify({ hello: "world" }));
  const r2 = spawnSync(
    process.execPath,
    [PREPARE, "--input", corpus, "--tokenizer", path.join(bad, "tokenizer.json"), "--out", out],
    { encoding: "utf8" },
  );
  assert.equal(r2.status, 2);
  assert.match(r2.stderr, /cannot be loaded by @huggingface\/tokenizers/);
  assert.doesNotMatch(r2.stderr, /\n\s+at /);
});

test("prepare refuses bad arguments and bad inputs with messages that say what to do (D2)", async () => {
  const r = spawnSync(
    process.execPath,
    [PREPARE, "--input", corpus, "--tokenizer", tokenizer, "--out", path.join(work, "x"), "--bogus"],
    { encoding: "utf8" },
  );
  assert.equal(r.status, 2);
  assert.match(r.stderr, /unknown argument "--bogus"/);
  await assert.rejects(
    prepareMix({ inputs: [path.join(work, "nope")], tokenizer, out: path.join(work, "x"), ...quiet }),
    /--input .*nope does not exist/,
  );
  await assert.rejects(
    prepareMix({ inputs: [corpus], tokenizer, out: path.join(work, "x"), valFraction: 0.9, ...quiet }),
    /--val-fraction 0.9 must be a number in \[0, 0.5\]/,
  );
  const badJsonl = path.join(work, "bad.jsonl");
  fs.writeFileSync(badJsonl, '{"text": "fine"}\n{"txt": "no text key"}\n');
  await assert.rejects(
    prepareMix({ inputs: [badJsonl], tokenizer, out: path.join(work, "x"), ...quiet }),
    (e: Error) => e.name === "UserError" && e.message.includes(`${badJsonl}:2 has no "text" string`),
  );
  const noEos = path.join(work, "noeos");
  fs.mkdirSync(noEos, { recursive: true });
  const tj = JSON.parse(fs.readFileSync(tokenizer, "utf8"));
  tj.added_tokens = [];
  delete tj.model.vocab["<|endoftext|>"];
  delete tj.model.vocab["<|pad|>"];
  fs.writeFileSync(path.join(noEos, "tokenizer.json"), JSON.stringify(tj));
  await assert.rejects(
    prepareMix({
      inputs: [corpus],
      tokenizer: path.join(noEos, "tokenizer.json"),
      out: path.join(work, "x"),
      ...quiet,
    }),
    /has no end-of-document token .* pass --eos-token NAME/,
  );
  assert.equal(fs.existsSync(path.join(work, "x")), false);
});

test("prepare never overwrites a root that holds a mix unless --force, and --force keeps the old root (D2)", async () => {
  const root = path.join(work, "out-keep");
  await prepareMix({ inputs: [corpus], tokenizer, out: root, valFraction: 0.1, ...quiet });
  const before = readTree(root);
  await assert.rejects(
    prepareMix({ inputs: [corpus], tokenizer, out: root, ...quiet }),
    (e: Error) =>
      e.name === "UserError" && /already holds a mix .* run the same command with --force \(/.test(e.message),
  );
  assert.deepEqual([...readTree(root).keys()], [...before.keys()], "untouched");
  const res = await prepareMix({ inputs: [corpus], tokenizer, out: root, valFraction: 0.2, force: true, ...quiet });
  assert.ok(
    res.movedAside && fs.existsSync(path.join(res.movedAside, "manifest.json")),
    "the old root is moved aside, not deleted",
  );
  assert.ok(readTree(res.movedAside).get("manifest.json")!.equals(before.get("manifest.json")!));
  const other = path.join(work, "not-a-mix");
  fs.mkdirSync(other);
  fs.writeFileSync(path.join(other, "notes.txt"), "mine");
  await assert.rejects(
    prepareMix({ inputs: [corpus], tokenizer, out: other, ...quiet }),
    /is not empty \(1 entries\) and holds no manifest\.json/,
  );
  assert.equal(fs.readFileSync(path.join(other, "notes.txt"), "utf8"), "mine");
});

test("a vocabulary beyond 65,535 ids is stored as little-endian uint32 with the same ids (D2)", async () => {
  const big = path.join(work, "bigvocab");
  fs.mkdirSync(big, { recursive: true });
  const tj = JSON.parse(fs.readFileSync(tokenizer, "utf8"));
  for (let i = 300; i < 70_000; i++) tj.model.vocab[`<extra_${i}>`] = i;
  delete tj.model.vocab["<|pad|>"];
  tj.model.vocab["<|pad|>"] = 69_999;
  delete tj.model.vocab["<extra_69999>"];
  tj.added_tokens[1].id = 69_999;
  fs.writeFileSync(path.join(big, "tokenizer.json"), JSON.stringify(tj));
  fs.copyFileSync(path.join(path.dirname(tokenizer), "tokenizer_config.json"), path.join(big, "tokenizer_config.json"));
  const root = path.join(work, "out-u32");
  await prepareMix({
    inputs: [corpus],
    tokenizer: path.join(big, "tokenizer.json"),
    out: root,
    valFraction: 0.1,
    ...quiet,
  });
  const m = readManifest(root);
  assert.equal(m.dtype, "uint32");
  assert.equal(m.vocab_size, 70_000);
  const first = fs.readFileSync(path.join(root, m.shards[0].file));
  assert.equal(first.length, m.shards[0].tokens * 4);
  assert.deepEqual(
    streamOf(root, "train"),
    streamOf(path.join(work, "out-w1"), "train"),
    "same ids as the uint16 build",
  );
});

test("a named --input of an unknown format (.json, .csv, no extension) is refused with the accepted formats, never read as text (D2)", () => {
  const dir = tmpDir("prep-unknown");
  const cases: Array<[string, string, RegExp]> = [
    ["docs.json", JSON.stringify(["first document", "second document"]), /jq -c/],
    ["docs.csv", "id,text\n1,first document\n2,second document\n", /--text-field NAME/],
    ["README", "plain words", /read when named \.txt/],
  ];
  for (const [name, body, hint] of cases) {
    const f = path.join(dir, name);
    fs.writeFileSync(f, body);
    const out = path.join(dir, `out-${name}`);
    const r = spawnSync(process.execPath, [PREPARE, "--input", f, "--tokenizer", tokenizer, "--out", out], {
      encoding: "utf8",
    });
    assert.equal(r.status, 2, `${name}: ${r.stdout}${r.stderr}`);
    assert.match(
      r.stderr,
      new RegExp(
        `^prepare: --input ${f.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}: prepare does not read ${name.includes(".") ? name.slice(name.indexOf(".")).replace(".", "\\.") : "\\(no extension\\)"} files\\. Accepted formats: \\.txt, \\.text, \\.md, \\.jsonl, \\.jsonl\\.gz, \\.jsonl\\.zst, \\.parquet`,
      ),
    );
    assert.match(r.stderr, hint);
    assert.ok(!fs.existsSync(out), `${name}: no mix was written`);
  }
});

test("prepare onto a full disk (a 64 KiB tmpfs) is refused, exit 2, naming the path, and leaves no partial folder (O6)", (t) => {
  const mnt = tmpDir("prep-full");
  const m = spawnSync("mount", ["-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt], { encoding: "utf8" });
  if (m.status !== 0) {
    const why = `mount -t tmpfs failed (${(m.stderr || "").trim() || m.error?.message || `exit ${m.status}`}); uid ${process.getuid?.()}`;
    if (process.env.TSTRAIN_REQUIRE_TMPFS === "1") assert.fail(`TSTRAIN_REQUIRE_TMPFS=1 but ${why}`);
    t.diagnostic(`no tmpfs: ${why}; the full-disk case needs a real small filesystem and was not run`);
    t.skip(`no tmpfs could be mounted: ${why}`);
    return;
  }
  try {
    const big = path.join(tmpDir("prep-full-src"), "big.jsonl");
    const rows: string[] = [];
    for (let i = 0; i < 3000; i++) rows.push(JSON.stringify({ text: docs[i % docs.length] }));
    fs.writeFileSync(big, `${rows.join("\n")}\n`); // ~500 KB of text: far more tokens than 64 KiB holds
    const out = path.join(mnt, "mix");
    const r = spawnSync(
      process.execPath,
      [PREPARE, "--input", big, "--tokenizer", tokenizer, "--out", out, "--workers", "1", "--shard-tokens", "4096"],
      { encoding: "utf8" },
    );
    assert.equal(r.status, 2, r.stdout + r.stderr);
    assert.match(
      r.stderr,
      new RegExp(
        `^prepare: write ${mnt.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}/mix\\.partial-\\d+/\\S+ failed: the disk is full \\(ENOSPC\\): free space there, or write to another disk, then run the same command again \\[O6\\]\\n$`,
        "m",
      ),
    );
    assert.doesNotMatch(r.stderr, /internal error|\n\s+at /);
    assert.deepEqual(fs.readdirSync(mnt), [], "neither the mix nor its partial folder is left");
  } finally {
    spawnSync("umount", [mnt]);
  }
});

/** A .jsonl of about `mb` MB (the corpus fixture repeated) and a tokenizer for it. */
function bigInput(mb: number): { input: string; tok: string } {
  const dir = tmpDir("prep-big");
  const tok = writeTinyTokenizer(
    path.join(dir, "tok"),
    corpusDocs().filter((d) => d.length > 0),
  );
  const one = corpusJsonl();
  const input = path.join(dir, "big.jsonl");
  fs.writeFileSync(input, one.repeat(Math.ceil((mb * 1e6) / one.length)));
  return { input, tok };
}

test("an interrupted prepare (SIGINT) removes its partial folder and says what it removed and what it left, exit 130 (D2)", {
  timeout: 120_000,
}, async () => {
  const { input, tok } = bigInput(8);
  const out = path.join(tmpDir("prep-int"), "mix");
  const cp = spawn(process.execPath, [PREPARE, "--input", input, "--tokenizer", tok, "--out", out, "--workers", "1"], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, TSTRAIN_PROGRESS_SECONDS: "0" }, // a progress line at every chance: one comes early
  });
  let stderr = "",
    stdout = "",
    sent = false;
  cp.stdout.on("data", (d: Buffer) => {
    stdout += d;
  });
  cp.stderr.on("data", (d: Buffer) => {
    stderr += d;
    // The first progress line: the build is under way in its partial folder.
    if (!sent && /prepare: +\d+%/.test(stderr)) {
      sent = true;
      cp.kill("SIGINT");
    }
  });
  const code = await new Promise<number | null>((resolve) => cp.on("close", (c) => resolve(c)));
  assert.ok(sent, `no progress line came: ${stderr}`);
  assert.equal(code, 130, stderr + stdout);
  const partial = `${out}.partial-${cp.pid}`;
  assert.ok(
    stderr.includes(
      `prepare: SIGINT: stopped; removed ${partial} (the partial build); nothing was written at ${out}. Run the same command again to build the mix from the start.`,
    ),
    stderr,
  );
  assert.deepEqual(fs.readdirSync(path.dirname(out)), [], "no partial folder left, no mix");
});

test("a prepare removes the partial folders of interrupted prepares whose process is gone, and leaves a running one's alone (D2)", () => {
  const out = path.join(tmpDir("prep-stale"), "mix");
  const dead = Number(
    spawnSync(process.execPath, ["-e", "process.stdout.write(String(process.pid))"], { encoding: "utf8" }).stdout,
  );
  for (const pid of [dead, process.pid]) {
    fs.mkdirSync(`${out}.partial-${pid}`, { recursive: true });
    fs.writeFileSync(`${out}.partial-${pid}/train-00000.bin`, "half");
  }
  const r = spawnSync(
    process.execPath,
    [PREPARE, "--input", corpus, "--tokenizer", tokenizer, "--out", out, "--workers", "1"],
    { encoding: "utf8" },
  );
  assert.equal(r.status, 0, r.stderr);
  assert.ok(
    r.stdout.includes(
      `prepare: removed ${out}.partial-${dead}, the partial build of an interrupted prepare (pid ${dead} is not running)`,
    ),
    r.stdout,
  );
  assert.ok(
    r.stdout.includes(`prepare: leaving ${out}.partial-${process.pid} alone: pid ${process.pid} is still running`),
    r.stdout,
  );
  assert.deepEqual(fs.readdirSync(path.dirname(out)).sort(), ["mix", `mix.partial-${process.pid}`]);
});

test("prepare's progress lines (to a file) give the share of the work done, not of the bytes read ahead, with rate and ETA (D2, B5)", {
  timeout: 120_000,
}, () => {
  const { input, tok } = bigInput(8);
  const out = path.join(tmpDir("prep-progress"), "mix");
  const r = spawnSync(
    process.execPath,
    [PREPARE, "--input", input, "--tokenizer", tok, "--out", out, "--workers", "1"],
    { encoding: "utf8", env: { ...process.env, TSTRAIN_PROGRESS_SECONDS: "0" } }, // a line at every chance
  );
  assert.equal(r.status, 0, r.stderr);
  const lines = [
    ...r.stderr.matchAll(
      /^prepare: +(\d+)% ([\d.]+)\/([\d.]+) MB, ([\d,]+) tokens, [\d,]+ tok\/s, [\d.]+ MB\/s, ETA (\S+)$/gm,
    ),
  ];
  const total = Number(lines[lines.length - 1][4].replace(/,/g, ""));
  const tokensPct = (m: RegExpMatchArray) => (100 * Number(m[4].replace(/,/g, ""))) / total;
  // Inside the first chunk read, before a bytes-per-character figure exists, the work done counts as 0 bytes
  // (WorkMeter): those lines show 0% and no ETA; they must end early.
  const first = lines.findIndex((m) => Number(m[2]) > 0);
  assert.ok(first >= 0, r.stderr);
  for (const m of lines.slice(0, first)) assert.ok(tokensPct(m) <= 10, `"${m[0]}": 0 bytes shown for too long`);
  const measured = lines.slice(first);
  assert.ok(measured.length >= 8, r.stderr);
  for (const m of measured) {
    const done = tokensPct(m);
    assert.ok(
      Math.abs(Number(m[1]) - done) <= 6,
      `"${m[0]}": ${m[1]}% shown with ${done.toFixed(1)}% of the tokens written`,
    );
  }
  assert.ok(
    measured.every((m) => /^(\d+h\d\dm|(\d+m)?\d+s)$/.test(m[5])),
    "an ETA on every line once a rate is known",
  );
});
