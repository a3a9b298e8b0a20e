import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import {
  CURSOR_FILE,
  type Cursor,
  loadCursor,
  makeCursor,
  samplesAt,
  saveCursor,
  validateResume,
} from "../src/data/cursor";
import { mixFingerprint, verifyShards } from "../src/data/fingerprint";
import { readManifest } from "../src/data/manifest";
import { mixTokenWarning, valWindowCount } from "../src/data/budget";
import { PackedTokenStore } from "../src/data/token-store";
import { editManifest, writePositionalMix } from "./helpers/mix";
import { tmpDir } from "./helpers/tmp";

/** assert.throws for a UserError whose message contains every fragment and cites the rule. */
function refuses(fn: () => unknown, rule: string, ...fragments: string[]): void {
  assert.throws(fn, (e: Error) => {
    assert.equal(e.name, "UserError", `expected a UserError, got ${e.name}: ${e.message}`);
    assert.ok(e.message.endsWith(`[${rule}]`), `rule ${rule} not cited in: ${e.message}`);
    for (const f of fragments) assert.ok(e.message.includes(f), `missing "${f}" in: ${e.message}`);
    return true;
  });
}

function freshMix(tag: string, val: number[] = [20]): string {
  const root = tmpDir(tag);
  writePositionalMix(root, [40, 24], val);
  return root;
}

// ---- D1: the manifest

test("a root without a manifest is refused with 'build the mix first' and the command to run (D1)", () => {
  const root = tmpDir("nomix");
  refuses(
    () => readManifest(root),
    "D1",
    `no manifest at ${path.join(root, "manifest.json")}: build the mix first (node dist/prepare.js`,
  );
});

test("a truncated shard is refused, naming its size and the size the manifest implies (D1)", () => {
  const root = freshMix("trunc");
  fs.truncateSync(path.join(root, "train-00001.bin"), 90);
  refuses(
    () => readManifest(root),
    "D1",
    "train-00001.bin is 90 bytes but the manifest says 24 tokens x 4 bytes = 96 bytes",
    "truncated",
  );
});

test("a manifest total that disagrees with its shards is refused, naming both numbers (D1)", () => {
  const root = freshMix("total");
  editManifest(root, (o) => {
    o.total_tokens = 65;
  });
  refuses(
    () => readManifest(root),
    "D1",
    "total_tokens 65 disagrees with the sum of its 2 training shards (64 tokens)",
  );
  const r2 = freshMix("vtotal");
  editManifest(r2, (o) => {
    o.val_total_tokens = 3;
  });
  refuses(() => readManifest(r2), "D1", "val_total_tokens 3 disagrees with the sum of its 1 val shards (20 tokens)");
});

test("an unknown dtype, an unknown format version, a missing shard and a non-JSON manifest are refused (D1)", () => {
  const a = freshMix("dtype");
  editManifest(a, (o) => {
    o.dtype = "int8";
  });
  refuses(() => readManifest(a), "D1", 'unknown dtype "int8"', '"uint16" or "uint32"');
  const b = freshMix("fmt");
  editManifest(b, (o) => {
    o.format_version = 2;
  });
  refuses(() => readManifest(b), "D1", "format_version 2, this reader knows 1");
  const c = freshMix("missing");
  fs.rmSync(path.join(c, "train-00000.bin"));
  refuses(() => readManifest(c), "D1", "train-00000.bin listed in shards is missing");
  const cv = freshMix("missingval");
  fs.rmSync(path.join(cv, "val-00000.bin"));
  refuses(() => readManifest(cv), "D1", "val-00000.bin listed in val_shards is missing");
  const d = freshMix("json");
  fs.writeFileSync(path.join(d, "manifest.json"), "{ not json");
  refuses(() => readManifest(d), "D1", "is not valid JSON");
  const e = freshMix("escape");
  editManifest(e, (o) => {
    (o.shards as Array<{ file: string }>)[0].file = "../etc/passwd";
  });
  refuses(() => readManifest(e), "D1", "must be a relative path inside the root");
  const f = freshMix("eos");
  editManifest(f, (o) => {
    o.eos_id = -1;
  });
  refuses(() => readManifest(f), "D1", "eos_id -1 is not an id");
});

test("a mix smaller than --tokens gives a warning naming both numbers, not a refusal (D1)", () => {
  assert.equal(mixTokenWarning(2_000_000, 1_000_000), null);
  assert.equal(
    mixTokenWarning(1_000_000, 2_000_000),
    "WARNING mix has 1,000,000 tokens < target 2,000,000 (--tokens) [D1]",
  );
});

// ---- D3: the fingerprint

test("the fingerprint covers every shard's bytes: a flipped byte is refused, naming the shard (D3)", () => {
  const root = freshMix("fp");
  const m = readManifest(root);
  const fp = mixFingerprint(root, m);
  assert.match(fp, /^[0-9a-f]{64}$/);
  assert.equal(mixFingerprint(root, m), fp, "stable");
  const f = path.join(root, "val-00000.bin");
  const buf = fs.readFileSync(f);
  buf[5] ^= 1;
  fs.writeFileSync(f, buf);
  refuses(() => verifyShards(root, m), "D3", "val-00000.bin has sha256", "the corpus bytes changed after prepare");
  refuses(() => mixFingerprint(root, m), "D3", "val-00000.bin");
  const other = freshMix("fp2", [21]);
  assert.notEqual(mixFingerprint(other, readManifest(other)), fp, "different val bytes, different fingerprint");
});

// ---- D7: validation data

test("a mix with no val shards, or val shards shorter than one window, is refused for validation (D7)", () => {
  const root = freshMix("noval", []);
  const m = readManifest(root);
  refuses(() => PackedTokenStore.open(root, m, "val"), "D7", "lists no val_shards", "--val-fraction");
  refuses(() => valWindowCount(2_000_000, 0, 128), "D7", "no val tokens (val_total_tokens=0)");
  refuses(
    () => valWindowCount(2_000_000, 100, 128),
    "D7",
    "the val shards hold 100 tokens, less than one window of seq_len 128",
  );
  assert.equal(valWindowCount(2_000_000, 10_000_000, 256), 7812);
  assert.equal(valWindowCount(2_000_000, 100_000, 256), 390);
  assert.equal(valWindowCount(0, 100_000, 256), 1);
});

// ---- C1-C3: the cursor

const FP = "a".repeat(64);
const PS = "b".repeat(64);
const EXPECT = { seqLen: 256, seed: 7, permSha: PS, fingerprint: FP, seqsPerStep: 32 };

function cursor(over: Partial<Cursor> = {}): Cursor {
  return { ...makeCursor({ step: 10, seqsPerStep: 32, seqLen: 256, seed: 7, fingerprint: FP, permSha: PS }), ...over };
}

test("samples_consumed is a pure function of the absolute step (C2)", () => {
  assert.equal(samplesAt(0, 128), 0);
  assert.equal(samplesAt(37, 128), 4736);
  const c = cursor();
  assert.deepEqual(c, {
    seq_len: 256,
    samples_consumed: 320,
    shuffle_seed: 7,
    dataset_files_sha: FP,
    shuffle_perm_sha: PS,
    step: 10,
  });
});

test("the cursor round-trips through cursor.json, written atomically with no temp file left (C1)", () => {
  const dir = tmpDir("cur");
  assert.equal(loadCursor(dir), null);
  saveCursor(dir, cursor());
  saveCursor(dir, cursor({ step: 11, samples_consumed: 352 }));
  assert.deepEqual(loadCursor(dir), cursor({ step: 11, samples_consumed: 352 }));
  assert.deepEqual(fs.readdirSync(dir), [CURSOR_FILE]);
});

test("a malformed cursor.json is refused, never guessed (C1)", () => {
  const dir = tmpDir("badcur");
  fs.writeFileSync(path.join(dir, CURSOR_FILE), "{");
  refuses(() => loadCursor(dir), "C1", "is not valid JSON");
  fs.writeFileSync(path.join(dir, CURSOR_FILE), JSON.stringify({ ...cursor(), step: "10" }));
  refuses(() => loadCursor(dir), "C1", 'cursor step="10" must be a whole number >= 0');
  const { shuffle_perm_sha: _drop, ...rest } = cursor();
  void _drop;
  fs.writeFileSync(path.join(dir, CURSOR_FILE), JSON.stringify(rest));
  refuses(() => loadCursor(dir), "C1", 'cursor has no "shuffle_perm_sha"');
});

test("resume is refused without a cursor (C3)", () => {
  refuses(
    () => validateResume(null, EXPECT, "run/ckpt/checkpoint-40"),
    "C3",
    "resume refused: run/ckpt/checkpoint-40 has no cursor.json",
    "cannot be resumed, only restarted",
  );
});

test("resume is refused when seq_len, seed, perm sha or fingerprint differ, naming both values (C3)", () => {
  refuses(() => validateResume(cursor({ seq_len: 128 }), EXPECT, "ck"), "C3", "cursor seq_len=128 != current 256");
  refuses(() => validateResume(cursor({ shuffle_seed: 8 }), EXPECT, "ck"), "C3", "cursor shuffle_seed=8 != current 7");
  refuses(
    () => validateResume(cursor({ shuffle_perm_sha: "c".repeat(64) }), EXPECT, "ck"),
    "C3",
    `cursor shuffle_perm_sha="${"c".repeat(64)}" != current "${PS}"`,
  );
  refuses(
    () => validateResume(cursor({ dataset_files_sha: "d".repeat(64) }), EXPECT, "ck"),
    "C3",
    `cursor dataset_files_sha="${"d".repeat(64)}" != current "${FP}"`,
    "point --root at the original mix",
  );
});

test("resume is refused when samples_consumed is not a whole number of steps (C3)", () => {
  refuses(
    () => validateResume(cursor(), { ...EXPECT, seqsPerStep: 48 }, "ck"),
    "C3",
    "samples_consumed=320 is not a whole number of steps at seqs_per_step=48",
    "batch geometry changed",
  );
});

test("resume is refused when step * seqs_per_step != samples_consumed (C3)", () => {
  refuses(
    () => validateResume(cursor({ step: 5 }), EXPECT, "ck"),
    "C3",
    "cursor step=5 and samples_consumed=320 disagree at seqs_per_step=32 (5 x 32 = 160)",
  );
  refuses(
    () => validateResume(cursor(), { ...EXPECT, seqsPerStep: 16 }, "ck"),
    "C3",
    "cursor step=10 and samples_consumed=320 disagree at seqs_per_step=16",
  );
});

test("a matching cursor resumes at its step and sample (C3, D5)", () => {
  assert.deepEqual(validateResume(cursor(), EXPECT, "ck"), { startStep: 10, startSample: 320 });
});
