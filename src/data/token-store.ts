/**
 * The shards of a mix: their writer (ShardWriter, prepare's) and their reader.
 *
 * Packed token store (D4, D7, D8): the concatenation of one split's shards, read a window at a
 * time with positioned reads (fs.readSync at a byte offset). Nothing is loaded up front: memory is
 * one read buffer plus at most MAX_OPEN_FDS file descriptors, whatever the corpus size.
 *
 * Window w of length T covers stream tokens [w*T, (w+1)*T); windows are consecutive and never
 * overlap, and the tail (total % T tokens) is never read. A window may span a shard boundary.
 */
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { UserError } from "../errors";
import { bytesPerToken, type Manifest, type ShardInfo } from "./manifest";

const MAX_OPEN_FDS = 32;
const LITTLE_ENDIAN_HOST = os.endianness() === "LE";

export class PackedTokenStore {
  readonly root: string;
  readonly split: "train" | "val";
  readonly dtype: Manifest["dtype"];
  readonly totalTokens: number;
  readonly shards: readonly ShardInfo[];
  private readonly bpt: 2 | 4;
  /** starts[i] = first stream token of shard i; starts[shards.length] = totalTokens. */
  private readonly starts: number[];
  private readonly fds = new Map<number, number>(); // shard index -> fd, in least-recently-used order
  private buf: Buffer = Buffer.alloc(0);
  private closed = false;

  private constructor(root: string, m: Manifest, split: "train" | "val", shards: ShardInfo[]) {
    this.root = root;
    this.split = split;
    this.dtype = m.dtype;
    this.bpt = bytesPerToken(m.dtype);
    this.shards = shards;
    this.starts = [0];
    for (const s of shards) this.starts.push(this.starts[this.starts.length - 1] + s.tokens);
    this.totalTokens = this.starts[shards.length];
  }

  /** Open one split of a validated manifest. A val store over a manifest with no val shards refuses (D7). */
  static open(root: string, m: Manifest, split: "train" | "val"): PackedTokenStore {
    const shards = split === "train" ? m.shards : m.val_shards;
    if (split === "val" && shards.length === 0) {
      throw new UserError(
        "D7",
        `manifest in ${root} lists no val_shards: validation needs a held-out split; rebuild the mix with node dist/prepare.js --val-fraction F (F > 0)`,
      );
    }
    if (split === "train" && shards.length === 0) {
      throw new UserError(
        "D1",
        `manifest in ${root} lists no training shards; rebuild the mix from a non-empty corpus`,
      );
    }
    return new PackedTokenStore(root, m, split, shards);
  }

  numWindows(seqLen: number): number {
    if (!Number.isSafeInteger(seqLen) || seqLen < 1)
      throw new RangeError(`seqLen must be a positive integer, got ${seqLen}`);
    return Math.floor(this.totalTokens / seqLen);
  }

  private fd(i: number): number {
    const hit = this.fds.get(i);
    if (hit !== undefined) {
      this.fds.delete(i);
      this.fds.set(i, hit);
      return hit;
    }
    if (this.fds.size >= MAX_OPEN_FDS) {
      const [oldest, ofd] = this.fds.entries().next().value as [number, number];
      fs.closeSync(ofd);
      this.fds.delete(oldest);
    }
    const fd = fs.openSync(path.join(this.root, this.shards[i].file), "r");
    this.fds.set(i, fd);
    return fd;
  }

  /** Shard holding stream token t (binary search over shard starts; empty shards are skipped). */
  private shardOf(t: number): number {
    let lo = 0;
    let hi = this.shards.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.starts[mid] <= t) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  /** Read stream tokens [start, start+count) into out[outOffset ...]. */
  readTokens(start: number, count: number, out: Int32Array, outOffset = 0): void {
    if (this.closed) throw new Error(`PackedTokenStore(${this.root}, ${this.split}) is closed`);
    if (start < 0 || count < 0 || start + count > this.totalTokens) {
      throw new RangeError(
        `readTokens [${start}, ${start + count}) outside the ${this.split} stream of ${this.totalTokens} tokens`,
      );
    }
    if (outOffset < 0 || outOffset + count > out.length)
      throw new RangeError(`readTokens: out has ${out.length} slots, need ${outOffset + count}`);
    const need = count * this.bpt;
    if (this.buf.length < need) this.buf = Buffer.alloc(need); // fresh ArrayBuffer: offset 0, aligned
    let done = 0;
    let t = start;
    let s = this.shardOf(t);
    while (done < count) {
      while (this.starts[s + 1] <= t) s++;
      const inShard = Math.min(count - done, this.starts[s + 1] - t);
      const bytes = inShard * this.bpt;
      const pos = (t - this.starts[s]) * this.bpt;
      const fd = this.fd(s);
      let got = 0;
      while (got < bytes) {
        const n = fs.readSync(fd, this.buf, done * this.bpt + got, bytes - got, pos + got);
        if (n === 0)
          throw new UserError(
            "D1",
            `shard ${path.join(this.root, this.shards[s].file)} ended early at byte ${pos + got}: it changed after the manifest was checked; rebuild the mix`,
          );
        got += n;
      }
      done += inShard;
      t += inShard;
    }
    if (LITTLE_ENDIAN_HOST) {
      const view =
        this.bpt === 2
          ? new Uint16Array(this.buf.buffer, this.buf.byteOffset, count)
          : new Uint32Array(this.buf.buffer, this.buf.byteOffset, count);
      for (let i = 0; i < count; i++) out[outOffset + i] = view[i];
    } else {
      for (let i = 0; i < count; i++)
        out[outOffset + i] = this.bpt === 2 ? this.buf.readUInt16LE(2 * i) : this.buf.readUInt32LE(4 * i);
    }
  }

  /** Window `index` of length seqLen (tokens [index*seqLen, (index+1)*seqLen)) into out[outOffset ...]. */
  readWindow(index: number, seqLen: number, out: Int32Array, outOffset = 0): void {
    const n = this.numWindows(seqLen);
    if (!Number.isSafeInteger(index) || index < 0 || index >= n) {
      throw new RangeError(`window ${index} outside [0, ${n}) of the ${this.split} split at seq_len ${seqLen}`);
    }
    this.readTokens(index * seqLen, seqLen, out, outOffset);
  }

  close(): void {
    for (const fd of this.fds.values()) fs.closeSync(fd);
    this.fds.clear();
    this.buf = Buffer.alloc(0);
    this.closed = true;
  }
}

/**
 * The writer of one split's shards (prepare, D2): tokens appended in order, little-endian `dtype`, cut at exactly
 * `shardTokens` tokens into `<prefix>-00000.bin`, ... (created, never overwritten), each fsynced and hashed as it
 * closes: what PackedTokenStore reads back.
 */
export class ShardWriter {
  readonly shards: ShardInfo[] = [];
  private fd = -1;
  private hash = createHash("sha256");
  private inShard = 0;
  private readonly buf: Uint16Array | Uint32Array;
  private fill = 0;
  private name = "";

  constructor(
    private readonly dir: string,
    private readonly prefix: "train" | "val",
    dtype: Manifest["dtype"],
    private readonly shardTokens: number,
  ) {
    this.buf = dtype === "uint16" ? new Uint16Array(1 << 20) : new Uint32Array(1 << 20);
  }

  private flush(): void {
    if (this.fill === 0) return;
    let bytes = Buffer.from(this.buf.buffer, 0, this.fill * this.buf.BYTES_PER_ELEMENT);
    if (os.endianness() !== "LE") {
      bytes = Buffer.from(bytes);
      if (this.buf.BYTES_PER_ELEMENT === 2) bytes.swap16();
      else bytes.swap32();
    }
    this.hash.update(bytes);
    let off = 0;
    try {
      while (off < bytes.length) off += fs.writeSync(this.fd, bytes, off, bytes.length - off);
    } catch (e) {
      (e as NodeJS.ErrnoException).path ??= path.join(this.dir, this.name); // a write by fd names no file: name it (O6)
      throw e;
    }
    this.fill = 0;
  }

  private closeShard(): void {
    this.flush();
    try {
      fs.fsyncSync(this.fd);
    } catch (e) {
      (e as NodeJS.ErrnoException).path ??= path.join(this.dir, this.name);
      throw e;
    }
    fs.closeSync(this.fd);
    this.shards.push({ file: this.name, tokens: this.inShard, sha256: this.hash.digest("hex") });
    this.fd = -1;
  }

  private openShard(): void {
    this.name = `${this.prefix}-${String(this.shards.length).padStart(5, "0")}.bin`;
    this.fd = fs.openSync(path.join(this.dir, this.name), "wx");
    this.hash = createHash("sha256");
    this.inShard = 0;
  }

  /** Append src[start, end) (ids already checked < vocab_size, so they fit the dtype). */
  pushRange(src: Uint32Array, start: number, end: number): void {
    while (start < end) {
      if (this.fd < 0) this.openShard();
      const k = Math.min(end - start, this.buf.length - this.fill, this.shardTokens - this.inShard);
      this.buf.set(src.subarray(start, start + k), this.fill);
      this.fill += k;
      this.inShard += k;
      start += k;
      if (this.fill === this.buf.length) this.flush();
      if (this.inShard === this.shardTokens) this.closeShard();
    }
  }

  push(v: number): void {
    this.pushRange(Uint32Array.of(v), 0, 1);
  }

  finish(): ShardInfo[] {
    if (this.fd >= 0) this.closeShard();
    return this.shards;
  }

  get tokens(): number {
    return this.shards.reduce((a, s) => a + s.tokens, 0) + (this.fd >= 0 ? this.inShard : 0);
  }
}
