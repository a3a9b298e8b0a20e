/**
 * `prepare` (SPEC D2): corpus files + a tokenizer.json -> a mix root.
 *
 *   ROOT/manifest.json         written last (the build's "done" marker)
 *   ROOT/train-00000.bin …     little-endian uint16 tokens (uint32 when vocab_size > 65,535)
 *   ROOT/val-00000.bin …       held-out validation documents, same format
 *   ROOT/tokenizer.json (+ tokenizer_config.json, special_tokens_map.json when beside the source)
 *
 * Documents: a `.jsonl` file gives one document per non-empty line (its "text" string); any other
 * file is one document. Directories are walked recursively in byte-sorted order, taking .txt, .text,
 * .md and .jsonl files (dot-files skipped). Empty documents are dropped before numbering.
 * Every document is followed by the EOS id; documents are packed back to back and shards are cut
 * at exactly --shard-tokens tokens (a document may continue in the next shard).
 *
 * Held-out rule (deterministic, exact): with ppm = round(val_fraction * 1e6), document i (0-based,
 * input order) goes to val iff floor((i+1)*ppm / 1e6) > floor(i*ppm / 1e6). That holds out exactly
 * floor(N * val_fraction) whole documents, spread evenly through the corpus.
 *
 * Tokenizing runs on a piscina pool; results are written strictly in document order, so the output
 * is byte-identical for any --workers. The build happens in a sibling staging directory and is moved
 * into place only when complete; an existing root is never deleted (with --force it is moved aside).
 */
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { Piscina } from "piscina";
import { Tokenizer } from "@huggingface/tokenizers";
import { UserError } from "../errors";
import { dtypeForVocab, Manifest, MANIFEST_FILE, manifestBytes, ShardInfo } from "./manifest";
import type { TokenizeTask } from "./tokenize-worker";

export interface PrepareOptions {
  inputs: string[];
  tokenizer: string;
  out: string;
  valFraction?: number;
  shardTokens?: number;
  workers?: number;
  force?: boolean;
  eosToken?: string;
  /** "auto": a live bar on a TTY, plain lines otherwise. */
  progress?: "auto" | "lines" | "none";
  log?: (line: string) => void;
}

export interface PrepareResult {
  root: string;
  manifest: Manifest;
  seconds: number;
  tokensPerSec: number;
  documents: number;
  valDocuments: number;
  movedAside: string | null;
}

export const DEFAULT_VAL_FRACTION = 0.01;
export const DEFAULT_SHARD_TOKENS = 50_000_000;
const TEXT_EXTS = new Set([".txt", ".text", ".md", ".jsonl"]);
const TOKENIZER_SIDE_FILES = ["tokenizer_config.json", "special_tokens_map.json"];
const EOS_CANDIDATES = ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>"];
const BATCH_CHARS = 256 * 1024;
const BATCH_DOCS = 256;

export function valPpm(valFraction: number): number {
  return Math.round(valFraction * 1e6);
}

/** The held-out rule (see the module comment). */
export function isValDoc(i: number, ppm: number): boolean {
  return Math.floor(((i + 1) * ppm) / 1e6) > Math.floor((i * ppm) / 1e6);
}

// ---------------------------------------------------------------------------------------------
// inputs

interface Source { file: string; bytes: number }

function listInputs(inputs: string[]): { sources: Source[]; skipped: number } {
  if (inputs.length === 0) throw new UserError("D2", "prepare needs at least one --input FILE|DIR");
  const sources: Source[] = [];
  let skipped = 0;
  const walk = (dir: string): void => {
    const names = fs.readdirSync(dir).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    for (const name of names) {
      if (name.startsWith(".")) continue;
      const p = path.join(dir, name);
      const st = fs.statSync(p);
      if (st.isDirectory()) walk(p);
      else if (st.isFile() && TEXT_EXTS.has(path.extname(name).toLowerCase())) sources.push({ file: p, bytes: st.size });
      else skipped++;
    }
  };
  for (const inp of inputs) {
    let st: fs.Stats;
    try {
      st = fs.statSync(inp);
    } catch {
      throw new UserError("D2", `--input ${inp} does not exist: name corpus files or directories that exist`);
    }
    if (st.isDirectory()) walk(inp);
    else if (st.isFile()) sources.push({ file: inp, bytes: st.size });
    else throw new UserError("D2", `--input ${inp} is neither a file nor a directory`);
  }
  if (sources.length === 0) throw new UserError("D2", `--input ${inputs.join(" ")} holds no corpus files (.txt, .text, .md, .jsonl)`);
  return { sources, skipped };
}

interface Doc { text: string; where: string }

const utf8 = new TextDecoder("utf-8", { fatal: true });

function decodeUtf8(buf: Uint8Array, where: string): string {
  try {
    return utf8.decode(buf);
  } catch {
    throw new UserError("D2", `${where} is not UTF-8 text: convert it to UTF-8 or leave it out of --input`);
  }
}

/** Documents of one file, in order. A .jsonl file is read in chunks, line by line. */
function* docsOf(src: Source): Generator<Doc> {
  if (path.extname(src.file).toLowerCase() !== ".jsonl") {
    const text = decodeUtf8(fs.readFileSync(src.file), src.file);
    if (text.length > 0) yield { text, where: src.file };
    return;
  }
  const fd = fs.openSync(src.file, "r");
  try {
    const chunk = Buffer.allocUnsafe(4 << 20);
    let carry = Buffer.alloc(0);
    let pos = 0;
    let lineNo = 0;
    const parse = function* (line: Buffer): Generator<Doc> {
      lineNo++;
      const where = `${src.file}:${lineNo}`;
      const s = decodeUtf8(line, where).trim();
      if (s.length === 0) return;
      let o: unknown;
      try {
        o = JSON.parse(s);
      } catch (e) {
        throw new UserError("D2", `${where} is not a JSON line (${(e as Error).message}): each .jsonl line must be {"text": "..."}`);
      }
      const text = (o as { text?: unknown } | null)?.text;
      if (typeof text !== "string") throw new UserError("D2", `${where} has no "text" string: each .jsonl line must be {"text": "..."}`);
      if (text.length > 0) yield { text, where };
    };
    for (;;) {
      const n = fs.readSync(fd, chunk, 0, chunk.length, pos);
      if (n === 0) break;
      pos += n;
      let buf = Buffer.concat([carry, chunk.subarray(0, n)]);
      let nl: number;
      while ((nl = buf.indexOf(10)) >= 0) {
        yield* parse(buf.subarray(0, nl));
        buf = buf.subarray(nl + 1);
      }
      carry = Buffer.from(buf);
    }
    if (carry.length > 0) yield* parse(carry);
  } finally {
    fs.closeSync(fd);
  }
}

// ---------------------------------------------------------------------------------------------
// tokenizer

interface LoadedTokenizer { path: string; configPath: string | null; vocabSize: number; eosId: number; eosToken: string; files: string[]; sha256: string }

function loadTokenizer(file: string, eosFlag: string | undefined): LoadedTokenizer {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    throw new UserError("D2", `cannot read --tokenizer ${file} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}): pass the path of a Hugging Face tokenizer.json`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new UserError("D2", `--tokenizer ${file} is not valid JSON (${(e as Error).message}): it must be a Hugging Face tokenizer.json; re-download or regenerate it`);
  }
  const dir = path.dirname(file);
  const cfgPath = path.join(dir, "tokenizer_config.json");
  let cfg: Record<string, unknown> = {};
  let configPath: string | null = null;
  if (fs.existsSync(cfgPath)) {
    try {
      cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
      configPath = cfgPath;
    } catch (e) {
      throw new UserError("D2", `${cfgPath} beside the tokenizer is not valid JSON (${(e as Error).message}): fix or remove it`);
    }
  }
  let tk: Tokenizer;
  try {
    tk = new Tokenizer(json as object, cfg);
    tk.encode("prepare self-check: Hello, world! 123", { add_special_tokens: false });
  } catch (e) {
    throw new UserError("D2", `--tokenizer ${file} cannot be loaded by @huggingface/tokenizers (${(e as Error).message}): it must be a complete Hugging Face tokenizer.json (model, pre_tokenizer, decoder, added_tokens)`);
  }
  let vocabSize = 0;
  for (const id of tk.get_vocab(true).values()) if (Number.isInteger(id) && id + 1 > vocabSize) vocabSize = id + 1;
  if (vocabSize < 1) throw new UserError("D2", `--tokenizer ${file} has an empty vocabulary`);
  const cfgEos = typeof cfg.eos_token === "string" ? cfg.eos_token : (cfg.eos_token as { content?: unknown } | undefined)?.content;
  const tried = eosFlag !== undefined ? [eosFlag] : typeof cfgEos === "string" ? [cfgEos] : EOS_CANDIDATES;
  let eosToken = "";
  let eosId: number | undefined;
  for (const t of tried) {
    eosId = tk.token_to_id(t);
    if (eosId !== undefined) { eosToken = t; break; }
  }
  if (eosId === undefined) {
    throw new UserError("D2", `--tokenizer ${file} has no end-of-document token (looked for ${tried.join(", ")}): pass --eos-token NAME with a token from its vocabulary`);
  }
  const files = ["tokenizer.json", ...TOKENIZER_SIDE_FILES.filter((f) => fs.existsSync(path.join(dir, f)))];
  return { path: file, configPath, vocabSize, eosId, eosToken, files, sha256: createHash("sha256").update(text).digest("hex") };
}

// ---------------------------------------------------------------------------------------------
// shard writer

class ShardWriter {
  readonly shards: ShardInfo[] = [];
  private fd = -1;
  private hash = createHash("sha256");
  private inShard = 0;
  private readonly buf: Uint16Array | Uint32Array;
  private fill = 0;
  private name = "";

  constructor(private readonly dir: string, private readonly prefix: "train" | "val", dtype: Manifest["dtype"], private readonly shardTokens: number) {
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
    while (off < bytes.length) off += fs.writeSync(this.fd, bytes, off, bytes.length - off);
    this.fill = 0;
  }

  private closeShard(): void {
    this.flush();
    fs.fsyncSync(this.fd);
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

// ---------------------------------------------------------------------------------------------
// progress

class Progress {
  private last = 0;
  private lastPct = -1;
  constructor(private readonly mode: "bar" | "lines" | "none", private readonly totalBytes: number, private readonly t0: number) {}
  update(bytes: number, tokens: number, final = false): void {
    if (this.mode === "none") return;
    const now = Date.now();
    const pct = this.totalBytes > 0 ? Math.min(100, Math.floor((100 * bytes) / this.totalBytes)) : 100;
    const secs = Math.max(1e-3, (now - this.t0) / 1000);
    const line = `prepare: ${String(pct).padStart(3)}% ${(bytes / 1e6).toFixed(1)}/${(this.totalBytes / 1e6).toFixed(1)} MB, ${tokens.toLocaleString("en-US")} tokens, ${Math.round(tokens / secs).toLocaleString("en-US")} tok/s`;
    if (this.mode === "bar") {
      if (!final && now - this.last < 100) return;
      this.last = now;
      const w = 30;
      const filled = Math.round((w * pct) / 100);
      process.stderr.write(`\r[${"#".repeat(filled)}${".".repeat(w - filled)}] ${line}${final ? "\n" : ""}`);
    } else {
      const decile = Math.floor(pct / 10);
      if (!final && decile === this.lastPct) return;
      this.lastPct = decile;
      process.stderr.write(line + "\n");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// the build

function checkOptions(o: PrepareOptions): { valFraction: number; shardTokens: number; workers: number } {
  const valFraction = o.valFraction ?? DEFAULT_VAL_FRACTION;
  if (!(typeof valFraction === "number" && valFraction >= 0 && valFraction <= 0.5)) throw new UserError("D2", `--val-fraction ${valFraction} must be a number in [0, 0.5]`);
  const shardTokens = o.shardTokens ?? DEFAULT_SHARD_TOKENS;
  if (!Number.isSafeInteger(shardTokens) || shardTokens < 1) throw new UserError("D2", `--shard-tokens ${shardTokens} must be a positive whole number`);
  const workers = o.workers ?? Math.max(1, Math.min(8, os.availableParallelism()));
  if (!Number.isSafeInteger(workers) || workers < 1 || workers > 256) throw new UserError("D2", `--workers ${workers} must be a whole number in [1, 256]`);
  if (!o.out) throw new UserError("D2", "prepare needs --out ROOT");
  if (!o.tokenizer) throw new UserError("D2", "prepare needs --tokenizer tokenizer.json");
  return { valFraction, shardTokens, workers };
}

/** Refuse to replace what is at ROOT unless forced; returns whether ROOT exists and is non-empty. */
function checkOut(out: string, force: boolean): boolean {
  if (!fs.existsSync(out)) return false;
  const st = fs.statSync(out);
  if (!st.isDirectory()) throw new UserError("D2", `--out ${out} exists and is not a directory: choose another --out`);
  const entries = fs.readdirSync(out);
  if (entries.length === 0) return false;
  if (force) return true;
  if (entries.includes(MANIFEST_FILE)) {
    throw new UserError("D2", `--out ${out} already holds a mix (${MANIFEST_FILE} and ${entries.length - 1} other entries): refusing to overwrite it. Choose a new --out, or pass --force to build a replacement (the old root is moved aside, never deleted)`);
  }
  throw new UserError("D2", `--out ${out} is not empty (${entries.length} entries) and holds no ${MANIFEST_FILE}: refusing to write into it. Choose an empty or new directory, or pass --force (its contents are moved aside, never deleted)`);
}

export async function prepareMix(o: PrepareOptions): Promise<PrepareResult> {
  const t0 = Date.now();
  const { valFraction, shardTokens, workers } = checkOptions(o);
  const log = o.log ?? ((s: string) => process.stdout.write(s + "\n"));
  const out = path.resolve(o.out);
  const outExists = checkOut(out, o.force ?? false);
  const tok = loadTokenizer(o.tokenizer, o.eosToken);
  const { sources, skipped } = listInputs(o.inputs);
  const totalBytes = sources.reduce((a, s) => a + s.bytes, 0);
  const dtype = dtypeForVocab(tok.vocabSize);
  const ppm = valPpm(valFraction);

  fs.mkdirSync(path.dirname(out), { recursive: true });
  const staging = `${out}.partial-${process.pid}`;
  fs.rmSync(staging, { recursive: true, force: true });
  fs.mkdirSync(staging);
  const pool = new Piscina({ filename: path.join(__dirname, "tokenize-worker.js"), minThreads: workers, maxThreads: workers, idleTimeout: 1000 });
  const mode = o.progress === "none" ? "none" : o.progress === "lines" ? "lines" : process.stderr.isTTY ? "bar" : "lines";
  const progress = new Progress(mode, totalBytes, t0);
  try {
    const train = new ShardWriter(staging, "train", dtype, shardTokens);
    const val = new ShardWriter(staging, "val", dtype, shardTokens);
    const corpusHash = createHash("sha256");
    let docIndex = 0;
    let valDocs = 0;
    let bytesDone = 0;
    let tokensDone = 0;

    type Batch = { firstDoc: number; wheres: string[]; bytesAfter: number; result: Promise<Uint32Array> };
    const inflight: Batch[] = [];
    const maxInflight = workers * 3;
    const drainOne = async (): Promise<void> => {
      const b = inflight.shift()!;
      let res: Uint32Array;
      try {
        res = await b.result;
      } catch (e) {
        throw new UserError("D2", `tokenizing ${b.wheres[0]}${b.wheres.length > 1 ? ` (and ${b.wheres.length - 1} more documents)` : ""} failed: ${(e as Error).message}`);
      }
      const n = res[0];
      let p = 1 + n;
      for (let d = 0; d < n; d++) {
        const len = res[1 + d];
        const w = isValDoc(b.firstDoc + d, ppm) ? val : train;
        if (w === val) valDocs++;
        w.pushRange(res, p, p + len);
        w.push(tok.eosId);
        p += len;
        tokensDone += len + 1;
      }
      bytesDone = b.bytesAfter;
      progress.update(bytesDone, tokensDone);
    };
    let texts: string[] = [];
    let wheres: string[] = [];
    let chars = 0;
    let batchFirst = 0;
    const submit = async (bytesAfter: number): Promise<void> => {
      if (texts.length === 0) return;
      const task: TokenizeTask = { tokenizerPath: path.resolve(tok.path), configPath: tok.configPath ? path.resolve(tok.configPath) : null, vocabSize: tok.vocabSize, texts, firstDoc: batchFirst };
      const result = pool.run(task) as Promise<Uint32Array>;
      result.catch(() => undefined); // observed in drainOne, in order
      inflight.push({ firstDoc: batchFirst, wheres, bytesAfter, result });
      texts = [];
      wheres = [];
      chars = 0;
      batchFirst = docIndex;
      while (inflight.length >= maxInflight) await drainOne();
    };
    let bytesRead = 0;
    for (const src of sources) {
      let inFile = 0; // progress within a file: the documents' UTF-8 size (approximates a .jsonl's bytes)
      for (const doc of docsOf(src)) {
        corpusHash.update(`${doc.text.length}:`).update(doc.text);
        texts.push(doc.text);
        wheres.push(doc.where);
        chars += doc.text.length;
        inFile += Buffer.byteLength(doc.text);
        docIndex++;
        if (chars >= BATCH_CHARS || texts.length >= BATCH_DOCS) await submit(bytesRead + Math.min(inFile, src.bytes));
      }
      bytesRead += src.bytes;
      await submit(bytesRead);
    }
    while (inflight.length > 0) await drainOne();
    progress.update(totalBytes, tokensDone, true);

    const trainShards = train.finish();
    const valShards = val.finish();
    if (trainShards.length === 0) {
      throw new UserError("D2", `the inputs hold ${docIndex} non-empty documents and none went to training (val fraction ${valFraction}): give prepare more text`);
    }
    if (valFraction > 0 && valShards.length === 0) {
      log(`prepare: WARNING no document was held out: ${docIndex} documents x val fraction ${valFraction} < 1; validation (D7) will refuse this mix. Use more documents or a larger --val-fraction`);
    }
    const srcDir = path.dirname(tok.path);
    for (const f of tok.files) fs.copyFileSync(f === "tokenizer.json" ? tok.path : path.join(srcDir, f), path.join(staging, f));
    const manifest: Manifest = {
      format_version: 1,
      dtype,
      total_tokens: trainShards.reduce((a, s) => a + s.tokens, 0),
      shards: trainShards,
      val_shards: valShards,
      val_total_tokens: valShards.reduce((a, s) => a + s.tokens, 0),
      eos_id: tok.eosId,
      vocab_size: tok.vocabSize,
      tokenizer_files: tok.files,
      prepare: {
        documents: docIndex,
        val_documents: valDocs,
        val_fraction: valFraction,
        val_rule: "doc i (0-based, input order) is val iff floor((i+1)*ppm/1e6) > floor(i*ppm/1e6), ppm = round(val_fraction*1e6)",
        shard_tokens: shardTokens,
        eos_token: tok.eosToken,
        tokenizer_sha256: tok.sha256,
        corpus_sha256: corpusHash.digest("hex"),
        separator: "EOS after every document",
      },
    };
    const mfd = fs.openSync(path.join(staging, MANIFEST_FILE), "wx");
    try {
      fs.writeSync(mfd, manifestBytes(manifest));
      fs.fsyncSync(mfd);
    } finally {
      fs.closeSync(mfd);
    }

    let movedAside: string | null = null;
    if (outExists) {
      movedAside = `${out}.replaced-${new Date().toISOString().replace(/[:.]/g, "-")}`;
      fs.renameSync(out, movedAside);
      log(`prepare: the previous contents of ${out} were moved to ${movedAside} (delete it yourself once the new mix is checked)`);
    } else if (fs.existsSync(out)) {
      fs.rmdirSync(out); // empty directory
    }
    fs.renameSync(staging, out);
    const seconds = (Date.now() - t0) / 1000;
    const allTokens = manifest.total_tokens + manifest.val_total_tokens;
    const result: PrepareResult = { root: out, manifest, seconds, tokensPerSec: allTokens / Math.max(1e-3, seconds), documents: docIndex, valDocuments: valDocs, movedAside };
    log(`prepare: ${out}: ${manifest.total_tokens.toLocaleString("en-US")} train tokens in ${trainShards.length} shards, ${manifest.val_total_tokens.toLocaleString("en-US")} val tokens in ${valShards.length} shards (${valDocs} of ${docIndex} documents held out), ${dtype}, vocab ${tok.vocabSize}, eos ${tok.eosId}; ${seconds.toFixed(1)} s, ${Math.round(result.tokensPerSec).toLocaleString("en-US")} tok/s with ${workers} workers${skipped ? `; skipped ${skipped} non-text files` : ""}`);
    return result;
  } catch (e) {
    fs.rmSync(staging, { recursive: true, force: true });
    throw e;
  } finally {
    await pool.destroy();
  }
}
