import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { DEMO_VOCAB, demoMixIsReusable, ensureDemoMix } from "../src/data/demo";
import { mixFingerprint } from "../src/data/fingerprint";
import { readManifest } from "../src/data/manifest";
import { PackedTokenStore } from "../src/data/token-store";
import { readTree } from "./fixtures/data-synth";
import { tmpDir } from "./helpers/tmp";
import { spawnSync } from "node:child_process";

const dirA = tmpDir("demoA");
const dirB = tmpDir("demoB");
let rootA = "";

test("the demo mix builds offline from the Brown corpus with train and val shards (D1, D2)", async () => {
  rootA = await ensureDemoMix(dirA);
  const m = readManifest(rootA);
  assert.equal(m.dtype, "uint16");
  assert.equal(m.vocab_size, DEMO_VOCAB);
  assert.equal(m.eos_id, 0);
  assert.ok(m.total_tokens > 1_000_000, `${m.total_tokens} train tokens`);
  assert.ok(m.val_shards.length > 0 && m.val_total_tokens > 50_000, `${m.val_total_tokens} val tokens`);
  assert.deepEqual(m.tokenizer_files, ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]);
  assert.equal((m.prepare as { val_documents: number }).val_documents, 25);
});

test("the demo tokenizer is a valid HF byte-level BPE tokenizer.json that round-trips text through @huggingface/tokenizers (D2, M1)", () => {
  const tj = JSON.parse(fs.readFileSync(path.join(rootA, "tokenizer.json"), "utf8"));
  assert.equal(tj.model.type, "BPE");
  assert.equal(tj.pre_tokenizer.type, "ByteLevel");
  assert.equal(tj.decoder.type, "ByteLevel");
  assert.equal(Object.keys(tj.model.vocab).length, DEMO_VOCAB);
  for (const m of tj.merges ?? tj.model.merges) {
    const [a, b] = (m as string).split(" ");
    assert.ok(
      a in tj.model.vocab && b in tj.model.vocab && a + b in tj.model.vocab,
      `merge ${m} closed over the vocab`,
    );
  }
  const cfg = JSON.parse(fs.readFileSync(path.join(rootA, "tokenizer_config.json"), "utf8"));
  assert.equal(cfg.tokenizer_class, "PreTrainedTokenizerFast");
  const tk = new Tokenizer(tj, cfg);
  assert.equal(tk.token_to_id("<|endoftext|>"), 0, "EOS id 0");
  assert.equal(tk.token_to_id("<|pad|>"), DEMO_VOCAB - 1, "pad = vocab - 1");
  for (const text of [
    "The Fulton County Grand Jury said Friday an investigation.",
    "Zürich — naïve café, 3.14159 ✓ 😀\n\n\tTabs  and  spaces ",
    "don't won't it's",
  ]) {
    const ids = tk.encode(text, { add_special_tokens: false }).ids;
    assert.ok(
      ids.every((i) => Number.isInteger(i) && i > 0 && i < DEMO_VOCAB - 1),
      "only ordinary ids",
    );
    assert.equal(tk.decode(ids), text);
  }
  assert.equal(tk.encode(" the", { add_special_tokens: false }).ids.length, 1, "common words are merged");
  assert.ok(tk.encode("the investigation of the election", { add_special_tokens: false }).ids.length <= 10);
  // the shards hold the corpus: the first document starts the train stream
  const store = PackedTokenStore.open(rootA, readManifest(rootA), "train");
  const w = new Int32Array(64);
  store.readWindow(0, 64, w);
  store.close();
  assert.match(tk.decode(Array.from(w)), /^The Fulton County Grand Jury said Friday/);
});

test("the demo mix is deterministic (a second build gives the same bytes) and is reused once built (D2, D3)", async () => {
  const written = readTree(rootA);
  const stamps = new Map([...written.keys()].map((k) => [k, fs.statSync(path.join(rootA, k)).mtimeMs]));
  assert.equal(await ensureDemoMix(dirA), rootA);
  for (const [k, v] of readTree(rootA)) {
    assert.ok(v.equals(written.get(k)!), `${k}: the same bytes`);
    assert.equal(fs.statSync(path.join(rootA, k)).mtimeMs, stamps.get(k), `${k} reused, not rewritten`);
  }
  const rootB = await ensureDemoMix(dirB, { workers: 2 });
  const a = readTree(rootA);
  const b = readTree(rootB);
  assert.deepEqual([...a.keys()], [...b.keys()]);
  for (const [k, v] of a) assert.ok(v.equals(b.get(k)!), `${k} differs`);
  assert.equal(mixFingerprint(rootA, readManifest(rootA)), mixFingerprint(rootB, readManifest(rootB)));
  // a damaged shard is never reused (ensureDemoMix would rebuild)
  assert.equal(demoMixIsReusable(dirB), true);
  const shard = path.join(rootB, "train-00001.bin");
  const bytes = fs.readFileSync(shard);
  bytes[100] ^= 0xff;
  fs.writeFileSync(shard, bytes);
  assert.equal(demoMixIsReusable(dirB), false);
});

test("building the demo data says what it does and shows progress: the tokenizer's share and ETA, the tokenizing's percentage (CLI, B5, D2)", {
  timeout: 300_000,
}, () => {
  const work = tmpDir("demo-cli");
  const r = spawnSync(
    process.execPath,
    [
      path.join(__dirname, "..", "main.js"),
      "--demo",
      "--root",
      path.join(work, "data"),
      "--out",
      path.join(work, "run"),
      "--dry-run",
    ],
    // the progress rhythm's lines at every chance (progress.ts), so a quick build shows them too
    { encoding: "utf8", timeout: 280_000, env: { ...process.env, TSTRAIN_PROGRESS_SECONDS: "0" } },
  );
  assert.equal(r.status, 0, r.stderr + r.stdout);
  assert.match(
    r.stdout,
    /^demo data: building the demo mix in \S+ from the bundled Brown corpus \(once; about 20-40 s on 2 cores, then reused\)$/m,
  );
  // a dry run writes nothing (G7): the demo mix is built in its scratch folder, and --root is not made
  assert.match(
    r.stdout,
    /^demo data: --dry-run writes nothing, so the demo mix is built in \S+ and removed after the plan$/m,
  );
  assert.ok(!fs.existsSync(path.join(work, "data")), "no --root made by a dry run");
  assert.match(r.stdout, /^demo data: training the demo tokenizer \(byte-level BPE, 4,096 ids\) on 500 documents$/m);
  assert.match(r.stdout, /^demo data: tokenizer trained in \d+\.\ds$/m);
  const bpeLines = r.stdout.split("\n").filter((x) => /^demo data: tokenizer [\d,]+\//.test(x));
  assert.ok(bpeLines.length >= 3, r.stdout.slice(0, 3000));
  const d = "(\\d+h\\d\\dm|(\\d+m)?\\d+s)"; // fmtDuration's
  for (const l of bpeLines)
    assert.match(l, new RegExp(`^demo data: tokenizer [\\d,]+/4,095 ids \\(\\d+%\\), ${d}, ETA ${d}$`));
  const pct = [...r.stderr.matchAll(/^prepare: +(\d+)% .* ETA \S+$/gm)].map((m) => Number(m[1]));
  assert.ok(pct.length >= 3 && pct[pct.length - 1] === 100, r.stderr);
  assert.match(r.stdout, /"dry_run":true/);
});
