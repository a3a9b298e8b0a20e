/**
 * Mix fingerprint (D3): identifies the corpus bytes, recorded in every cursor.
 *
 * Definition `tstrain-mix-fingerprint-v1`: SHA-256 (hex) of the UTF-8 text
 *   "tstrain-mix-fingerprint-v1\ndtype=<dtype>\n" then, for every train shard in manifest order and
 *   then every val shard, one line "<split>\t<file>\t<bytes>\t<sha256 of the file's bytes>\n".
 * A mix built from the Hub (manifest "sources") appends, per source in order, one line
 *   "source\t<repo_type>\t<repo>\t<revision sha>\n" and per file "file\t<path>\t<size>\t<sha256>\n",
 * so the fingerprint also names where the corpus came from; a local-only mix has none of these lines.
 * By default every shard is read and its sha256 computed and compared with the manifest, so the
 * fingerprint is of the bytes on disk, not of what the manifest claims (a mismatch refuses, D3).
 */
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";
import { UserError } from "../errors";
import { etaOf, ProgressRhythm } from "../progress";
import { bytesPerToken, type Manifest, type ShardInfo } from "./manifest";

const CHUNK = 4 << 20;

/** sha256 (hex) of a file, streamed in 4 MiB positioned reads; `onChunk` sees each piece as it is read. */
export function sha256File(file: string, onChunk?: (b: Buffer) => void): string {
  const h = createHash("sha256");
  const fd = fs.openSync(file, "r");
  try {
    const buf = Buffer.allocUnsafe(CHUNK);
    let pos = 0;
    for (;;) {
      const n = fs.readSync(fd, buf, 0, CHUNK, pos);
      if (n === 0) break;
      h.update(buf.subarray(0, n));
      onChunk?.(buf.subarray(0, n));
      pos += n;
    }
  } finally {
    fs.closeSync(fd);
  }
  return h.digest("hex");
}

/** The largest little-endian token id in a piece of a shard (`bpt` bytes a token; a piece is whole tokens). */
function maxIdOf(b: Buffer, bpt: 2 | 4): number {
  let max = 0;
  const n = Math.floor(b.length / bpt);
  if (bpt === 2)
    for (let i = 0; i < n; i++) {
      const t = b[2 * i] | (b[2 * i + 1] << 8);
      if (t > max) max = t;
    }
  else
    for (let i = 0; i < n; i++) {
      const t = b.readUInt32LE(4 * i);
      if (t > max) max = t;
    }
  return max;
}

/** The largest token id a verified mix holds, and the first shard that holds it (D1). */
export interface TokenIdScan {
  maxTokenId: number;
  file: string;
}

function allShards(m: Manifest): Array<{ split: "train" | "val"; s: ShardInfo }> {
  return [
    ...m.shards.map((s) => ({ split: "train" as const, s })),
    ...m.val_shards.map((s) => ({ split: "val" as const, s })),
  ];
}

/** Where the shard hashing's progress goes: a line at the progress rhythm (progress.ts) while it runs. */
export interface HashProgress {
  log: (line: string) => void;
}

/** A byte counter that logs share, rate and ETA at the progress rhythm (nothing for a quick hash). */
function hashTicker(total: number, p: HashProgress | undefined): (bytes: number) => void {
  const t0 = performance.now();
  const rhythm = new ProgressRhythm(undefined, t0);
  let done = 0;
  return (n) => {
    done += n;
    if (!p || done >= total || !rhythm.due()) return;
    const secs = (performance.now() - t0) / 1000,
      rate = done / Math.max(1e-9, secs);
    p.log(
      `data: verifying the mix: ${(done / 1e6).toFixed(0)}/${(total / 1e6).toFixed(0)} MB of shards hashed (${Math.floor((100 * done) / total)}%), ${(rate / 1e6).toFixed(0)} MB/s, ETA ${etaOf(total - done, rate)}`,
    );
  };
}

/**
 * Read every shard and compare its sha256 with the manifest; a mismatch is a UserError naming the file (D3).
 * The same pass finds the largest token id (D1: checked against the model's vocabulary before the ranks start).
 */
export function verifyShards(root: string, m: Manifest, progress?: HashProgress): TokenIdScan {
  const bpt = bytesPerToken(m.dtype);
  const scan: TokenIdScan = { maxTokenId: 0, file: "" };
  const tick = hashTicker(
    allShards(m).reduce((a, { s }) => a + s.tokens * bpt, 0),
    progress,
  );
  for (const { s } of allShards(m)) {
    const fp = path.join(root, s.file);
    let max = 0;
    const got = sha256File(fp, (b) => {
      max = Math.max(max, maxIdOf(b, bpt));
      tick(b.length);
    });
    if (got !== s.sha256) {
      throw new UserError(
        "D3",
        `shard ${fp} has sha256 ${got} but the manifest records ${s.sha256}: the corpus bytes changed after prepare; restore the shard or rebuild the mix`,
      );
    }
    if (!scan.file || max > scan.maxTokenId) Object.assign(scan, { maxTokenId: max, file: fp });
  }
  return scan;
}

/**
 * D3 fingerprint. `opts.verify` (default true) hashes every shard's bytes first; pass false only
 * when the shards were verified moments ago in this process.
 */
export function mixFingerprint(
  root: string,
  m: Manifest,
  opts: { verify?: boolean; progress?: HashProgress } = {},
): string {
  if (opts.verify ?? true) verifyShards(root, m, opts.progress);
  const bpt = bytesPerToken(m.dtype);
  const h = createHash("sha256");
  h.update(`tstrain-mix-fingerprint-v1\ndtype=${m.dtype}\n`, "utf8");
  for (const { split, s } of allShards(m)) h.update(`${split}\t${s.file}\t${s.tokens * bpt}\t${s.sha256}\n`, "utf8");
  for (const src of m.sources ?? []) {
    h.update(`source\t${src.repo_type}\t${src.repo}\t${src.revision}\n`, "utf8");
    for (const f of src.files) h.update(`file\t${f.path}\t${f.size}\t${f.sha256}\n`, "utf8");
  }
  return h.digest("hex");
}
