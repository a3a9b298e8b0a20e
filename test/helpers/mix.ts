// Synthetic mix roots (the format of src/data/manifest.ts), one module for every test:
// - writeSyntheticMix: a learnable token stream for training tests (uint16, small vocab);
// - writePositionalMix: every token equals its position in its split's stream, so "which window
//   did we read" becomes arithmetic (the data tests, STYLE 9);
// - editManifest: a raw edit of manifest.json for the refusal tests.
import * as fs from "node:fs";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { manifestBytes, type Manifest, type ShardInfo } from "../../src/data/manifest";
import { lcg } from "./numeric";
import { tmpDir } from "./tmp";

export interface SyntheticMix { root: string; vocab: number; trainTokens: number; valTokens: number }

/**
 * Tokens follow a learnable pattern (each token is a function of the previous one, with noise) so a
 * few steps visibly lower the loss; `vocab` ids, EOS 0. A fresh temp dir unless `dir` is given.
 */
export function writeSyntheticMix(o: { vocab?: number; trainTokens?: number; valTokens?: number; shards?: number; seed?: number; dir?: string } = {}): SyntheticMix {
  const vocab = o.vocab ?? 64;
  const trainTokens = o.trainTokens ?? 64 * 1024;
  const valTokens = o.valTokens ?? 2048;
  const nShards = o.shards ?? 2;
  const root = o.dir ?? tmpDir("mix");
  fs.mkdirSync(root, { recursive: true });
  const rnd = lcg(o.seed ?? 7);
  const gen = (n: number) => {
    const a = new Uint16Array(n);
    let prev = 1;
    for (let i = 0; i < n; i++) {
      const r = rnd();
      prev = (r % 8 === 0) ? 1 + (r >>> 8) % (vocab - 1) : 1 + ((prev * 7 + 3) % (vocab - 1));
      a[i] = prev;
    }
    return a;
  };
  const write = (file: string, a: Uint16Array) => {
    const buf = Buffer.from(a.buffer, a.byteOffset, a.byteLength);
    fs.writeFileSync(path.join(root, file), buf);
    return { file, tokens: a.length, sha256: createHash("sha256").update(buf).digest("hex") };
  };
  const shards = [];
  const per = Math.floor(trainTokens / nShards);
  for (let i = 0; i < nShards; i++) shards.push(write(`train_${String(i).padStart(5, "0")}.bin`, gen(i === nShards - 1 ? trainTokens - per * (nShards - 1) : per)));
  const val = [write("val_00000.bin", gen(valTokens))];
  const manifest = {
    format_version: 1, dtype: "uint16", total_tokens: trainTokens, shards, val_shards: val, val_total_tokens: valTokens,
    eos_id: 0, vocab_size: vocab, tokenizer_files: [],
  };
  fs.writeFileSync(path.join(root, "manifest.json"), JSON.stringify(manifest, null, 1));
  return { root, vocab, trainTokens, valTokens };
}

function writeShards(root: string, prefix: string, sizes: number[], dtype: "uint16" | "uint32"): ShardInfo[] {
  let pos = 0;
  return sizes.map((n, i) => {
    const arr = dtype === "uint32" ? new Uint32Array(n) : new Uint16Array(n);
    for (let j = 0; j < n; j++) arr[j] = dtype === "uint32" ? pos + j : (pos + j) % 65536;
    pos += n;
    const buf = Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength);
    const file = `${prefix}-${String(i).padStart(5, "0")}.bin`;
    fs.writeFileSync(path.join(root, file), buf);
    return { file, tokens: n, sha256: createHash("sha256").update(buf).digest("hex") };
  });
}

/** A mix root whose train (and val) tokens equal their stream position (shard sizes given). Returns the manifest written. */
export function writePositionalMix(root: string, train: number[], val: number[], dtype: "uint16" | "uint32" = "uint32"): Manifest {
  fs.mkdirSync(root, { recursive: true });
  const shards = writeShards(root, "train", train, dtype);
  const valShards = writeShards(root, "val", val, dtype);
  const m: Manifest = {
    format_version: 1,
    dtype,
    total_tokens: shards.reduce((a, s) => a + s.tokens, 0),
    shards,
    val_shards: valShards,
    val_total_tokens: valShards.reduce((a, s) => a + s.tokens, 0),
    eos_id: 0,
    vocab_size: dtype === "uint32" ? 2 ** 31 : 65536,
    tokenizer_files: [],
  };
  fs.writeFileSync(path.join(root, "manifest.json"), manifestBytes(m));
  return m;
}

/** Rewrite manifest.json with a raw edit (for the refusal tests). */
export function editManifest(root: string, edit: (o: Record<string, unknown>) => void): void {
  const p = path.join(root, "manifest.json");
  const o = JSON.parse(fs.readFileSync(p, "utf8"));
  edit(o);
  fs.writeFileSync(p, JSON.stringify(o, null, 2));
}
