// Synthetic mix roots (the format of src/data/manifest.ts), one module for every test:
// - writeSyntheticMix: a learnable token stream for training tests (uint16, small vocab);
// - writePositionalMix: every token equals its position in its split's stream, so "which window
//   did we read" becomes arithmetic (the data tests);
// - editManifest: a raw edit of manifest.json for the refusal tests.
import * as fs from "node:fs";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { manifestBytes, type Manifest, type ShardInfo } from "../../src/data/manifest";
import { writeSyntheticMix as writeSynthetic, type SyntheticMix } from "../../src/data/synthetic";
import { tmpDir } from "./tmp";

export type { SyntheticMix };

/** data/synthetic.ts's mix, in a fresh temp dir unless `dir` is given. */
export function writeSyntheticMix(
  o: { vocab?: number; trainTokens?: number; valTokens?: number; shards?: number; seed?: number; dir?: string } = {},
): SyntheticMix {
  return writeSynthetic({ ...o, dir: o.dir ?? tmpDir("mix") });
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
export function writePositionalMix(
  root: string,
  train: number[],
  val: number[],
  dtype: "uint16" | "uint32" = "uint32",
): Manifest {
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
