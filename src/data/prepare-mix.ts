/**
 * `prepare` (D2): corpus files + a tokenizer.json -> a mix root.
 *
 *   ROOT/manifest.json         written last (the build's "done" marker)
 *   ROOT/train-00000.bin …     little-endian uint16 tokens (uint32 when vocab_size > 65,535)
 *   ROOT/val-00000.bin …       held-out validation documents, same format
 *   ROOT/tokenizer.json (+ tokenizer_config.json, special_tokens_map.json when beside the source)
 *
 * Inputs and documents (streamed, memory flat in the input size): see src/data/inputs.ts for the
 * formats (.txt/.text/.md, .jsonl, .jsonl.gz, .jsonl.zst, .parquet), the plain-text document rule
 * and the long-document rule, and src/data/hub-input.ts for hf:// inputs and Hub tokenizers.
 * Empty documents are dropped before numbering.
 * Every document is followed by the EOS id; documents are packed back to back and shards are cut
 * at exactly --shard-tokens tokens (a document may continue in the next shard).
 *
 * Held-out rule (deterministic, exact): with ppm = round(val_fraction * 1e6), document i (0-based,
 * input order) goes to val iff floor((i+1)*ppm / 1e6) > floor(i*ppm / 1e6). That holds out exactly
 * floor(N * val_fraction) whole documents, spread evenly through the corpus.
 *
 * Tokenizing runs on a piscina pool (tokenize-pool.ts); results are written strictly in document order, so the
 * output is byte-identical for any --workers. The tokenizer is prepare-tokenizer.ts's, the shards' writer
 * token-store.ts's ShardWriter. The build happens in a sibling staging directory and is moved into place only when
 * complete; an existing root is never deleted (with --force it is moved aside).
 */
import { createHash, type Hash } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { Piscina } from "piscina";
import { UserError } from "../errors";
import { dtypeForVocab, type Manifest, MANIFEST_FILE, manifestBytes, type ShardInfo } from "./manifest";
import { type LoadedTokenizer, loadTokenizer } from "./prepare-tokenizer";
import { ShardWriter } from "./token-store";
import { TokenizeBatches, tokenizePool } from "./tokenize-pool";
import {
  DEFAULT_CHUNK_BYTES,
  DEFAULT_PIECE_CHARS,
  docsOf,
  type InputFile,
  listLocalInputs,
  type ParquetPlan,
  planParquet,
  type ReadOptions,
  SUPPORTED_FORMATS,
} from "./inputs";
import { removeStalePartials, stagingDirOf, trackScratch, untrackScratch } from "./prepare-scratch";
import { etaOf, ProgressRhythm } from "../progress";
import { hubEndpoint, isHfUrl } from "../hub/address";
import { fetchHubTokenizer, isHubTokenizer, resolveHubInput, type HubSource, type HubTokenizer } from "./hub-input";

export interface PrepareOptions {
  inputs: string[];
  tokenizer: string;
  out: string;
  valFraction?: number;
  shardTokens?: number;
  workers?: number;
  force?: boolean;
  eosToken?: string;
  /** The JSON field / Parquet column holding the text (default "text"). */
  textField?: string;
  /** Hub endpoint for hf:// inputs and Hub tokenizers (default $HF_ENDPOINT, else the Hugging Face Hub: hub/address.ts). */
  hubUrl?: string;
  /** Read size for streamed inputs (default 1 MiB) and the long-document piece size (default 4 Mi chars). */
  chunkBytes?: number;
  pieceChars?: number;
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

export function valPpm(valFraction: number): number {
  return Math.round(valFraction * 1e6);
}

/** The held-out rule (see the module comment). */
export function isValDoc(i: number, ppm: number): boolean {
  return Math.floor(((i + 1) * ppm) / 1e6) > Math.floor((i * ppm) / 1e6);
}

// ---------------------------------------------------------------------------------------------
// inputs

interface Inputs {
  files: InputFile[];
  skipped: number;
  sources: HubSource[];
}

async function listInputs(inputs: string[], hubUrl: string): Promise<Inputs> {
  if (inputs.length === 0)
    throw new UserError("D2", "prepare needs at least one --input FILE|DIR|hf://datasets/owner/name/glob");
  const files: InputFile[] = [];
  const sources: HubSource[] = [];
  let skipped = 0;
  for (const inp of inputs) {
    if (isHfUrl(inp)) {
      const r = await resolveHubInput(inp, hubUrl);
      files.push(...r.files);
      sources.push(r.source);
    } else {
      const r = listLocalInputs([inp]);
      files.push(...r.files);
      skipped += r.skipped;
    }
  }
  if (files.length === 0)
    throw new UserError("D2", `--input ${inputs.join(" ")} holds no corpus files (${SUPPORTED_FORMATS})`);
  return { files, skipped, sources };
}

// ---------------------------------------------------------------------------------------------
// progress

class Progress {
  private last = 0;
  private readonly rhythm = new ProgressRhythm();
  constructor(
    private readonly mode: "bar" | "lines" | "none",
    private readonly totalBytes: number,
    private readonly t0: number,
  ) {}
  /** The progress line: bytes read, tokens written, rates and the ETA from the byte rate. */
  static line(bytes: number, total: number, tokens: number, secs: number): string {
    const pct = total > 0 ? Math.min(100, Math.floor((100 * bytes) / total)) : 100;
    const bRate = bytes / secs;
    const eta = total > bytes ? etaOf(total - bytes, bRate) : "0s";
    return `prepare: ${String(pct).padStart(3)}% ${(bytes / 1e6).toFixed(1)}/${(total / 1e6).toFixed(1)} MB, ${tokens.toLocaleString("en-US")} tokens, ${Math.round(tokens / secs).toLocaleString("en-US")} tok/s, ${(bRate / 1e6).toFixed(2)} MB/s, ETA ${eta}`;
  }
  update(bytes: number, tokens: number, final = false): void {
    if (this.mode === "none") return;
    const now = Date.now();
    const pct = this.totalBytes > 0 ? Math.min(100, Math.floor((100 * bytes) / this.totalBytes)) : 100;
    const secs = Math.max(1e-3, (now - this.t0) / 1000);
    const line = Progress.line(bytes, this.totalBytes, tokens, secs);
    if (this.mode === "bar") {
      if (!final && now - this.last < 100) return;
      this.last = now;
      const w = 30;
      const filled = Math.round((w * pct) / 100);
      process.stderr.write(`\r[${"#".repeat(filled)}${".".repeat(w - filled)}] ${line}${final ? "\n" : ""}`);
    } else {
      // plain lines (a file, a pipe): at the progress rhythm (progress.ts), and the last one
      if (!this.rhythm.due() && !final) return;
      process.stderr.write(`${line}\n`);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// the build

interface CheckedOptions {
  valFraction: number;
  shardTokens: number;
  workers: number;
  textField: string;
  chunkBytes: number;
  pieceChars: number;
  hubUrl: string;
  log: (s: string) => void;
}

function checkOptions(o: PrepareOptions): CheckedOptions {
  const valFraction = o.valFraction ?? DEFAULT_VAL_FRACTION;
  if (!(typeof valFraction === "number" && valFraction >= 0 && valFraction <= 0.5))
    throw new UserError("D2", `--val-fraction ${valFraction} must be a number in [0, 0.5]: run `, {
      ways: [
        {
          changes: [["--val-fraction", String(valFraction > 0.5 ? 0.5 : valFraction < 0 ? 0 : DEFAULT_VAL_FRACTION)]],
        },
      ],
    });
  const shardTokens = o.shardTokens ?? DEFAULT_SHARD_TOKENS;
  if (!Number.isSafeInteger(shardTokens) || shardTokens < 1)
    throw new UserError("D2", `--shard-tokens ${shardTokens} must be a positive whole number: run `, {
      ways: [
        { changes: [["--shard-tokens", String(shardTokens > 1 ? Math.floor(shardTokens) : DEFAULT_SHARD_TOKENS)]] },
      ],
    });
  const workers = o.workers ?? Math.max(1, Math.min(8, os.availableParallelism()));
  if (!Number.isSafeInteger(workers) || workers < 1 || workers > 256)
    throw new UserError("D2", `--workers ${workers} must be a whole number in [1, 256]: run `, {
      ways: [{ changes: [["--workers", String(Math.min(256, Math.max(1, Math.round(workers) || 1)))]] }],
    });
  if (!o.out) throw new UserError("D2", "prepare needs --out ROOT");
  if (!o.tokenizer) throw new UserError("D2", "prepare needs --tokenizer tokenizer.json");
  const textField = o.textField ?? "text";
  if (typeof textField !== "string" || textField === "")
    throw new UserError("D2", `--text-field ${JSON.stringify(textField)} must name a field`);
  const chunkBytes = o.chunkBytes ?? DEFAULT_CHUNK_BYTES;
  const pieceChars = o.pieceChars ?? DEFAULT_PIECE_CHARS;
  if (!Number.isSafeInteger(chunkBytes) || chunkBytes < 16 || !Number.isSafeInteger(pieceChars) || pieceChars < 16)
    throw new UserError("D2", `chunkBytes ${chunkBytes} and pieceChars ${pieceChars} must be whole numbers >= 16`);
  const hubUrl = hubEndpoint(o.hubUrl, "D2").url; // --hub-url, then HF_ENDPOINT, then the Hugging Face Hub
  const log = o.log ?? ((s: string) => process.stdout.write(`${s}\n`));
  return { valFraction, shardTokens, workers, textField, chunkBytes, pieceChars, hubUrl, log };
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
    throw new UserError(
      "D2",
      `--out ${out} already holds a mix (${MANIFEST_FILE} and ${entries.length - 1} other entries): refusing to overwrite it. Choose a new --out, or run `,
      { ways: [{ changes: [["--force", true]], why: "a replacement; the old root is moved aside, never deleted" }] },
    );
  }
  throw new UserError(
    "D2",
    `--out ${out} is not empty (${entries.length} entries) and holds no ${MANIFEST_FILE}: refusing to write into it. Choose an empty or new directory, or run `,
    { ways: [{ changes: [["--force", true]], why: "its contents are moved aside, never deleted" }] },
  );
}

/**
 * Where in its file a piece ends, in input bytes, for the progress line. Readers report the bytes read so far,
 * which run a whole chunk ahead of the pieces cut from it (a compressed chunk holds many times its size in
 * text), so a piece's place inside the current chunk is interpolated by characters at the bytes-per-character
 * of the chunk before it; within the first chunk, before any such figure exists, it counts as the chunk's start.
 */
export class WorkMeter {
  private chunkStart = 0;
  private chunkEnd = 0;
  private charsAtChunkStart = 0;
  private chars = 0;
  private bytesPerChar = 0;

  at(bytesRead: number, pieceChars: number): number {
    if (bytesRead > this.chunkEnd) {
      if (this.chars > this.charsAtChunkStart)
        this.bytesPerChar = (this.chunkEnd - this.chunkStart) / (this.chars - this.charsAtChunkStart);
      this.chunkStart = this.chunkEnd;
      this.chunkEnd = bytesRead;
      this.charsAtChunkStart = this.chars;
    }
    this.chars += pieceChars;
    const est = this.chunkStart + (this.chars - this.charsAtChunkStart) * this.bytesPerChar;
    return Math.min(this.chunkEnd, est);
  }
}

/** Every input's pieces through `batches`, hashing the corpus on the way; returns the number of documents. */
async function tokenizeInputs(
  files: InputFile[],
  plans: Map<InputFile, ParquetPlan>,
  rd: ReadOptions,
  batches: TokenizeBatches,
  corpusHash: Hash,
): Promise<number> {
  let docIndex = 0; // documents started so far (the index of the next new document)
  let bytesBefore = 0;
  for (const f of files) {
    let open = false; // a document has pieces out and is not closed yet
    const meter = new WorkMeter();
    for await (const piece of docsOf(f, rd, plans.get(f))) {
      // corpus_sha256: "<len>:" + text per whole document (a last piece), "<len>+" + text per earlier piece
      corpusHash.update(`${piece.text.length}${piece.last ? ":" : "+"}`).update(piece.text);
      batches.add(piece, docIndex);
      open = !piece.last;
      if (piece.last) docIndex++;
      const at = meter.at(piece.bytesDone, piece.text.length);
      if (batches.full) await batches.submit(bytesBefore + Math.min(at, f.bytes));
    }
    if (open) throw new Error(`${f.name}: a document was left open at the end of the file (a reader bug)`);
    bytesBefore += f.bytes;
    await batches.submit(bytesBefore);
  }
  await batches.drainAll();
  return docIndex;
}

interface BuildFacts {
  dtype: Manifest["dtype"];
  trainShards: ShardInfo[];
  valShards: ShardInfo[];
  sources: HubSource[];
  documents: number;
  valDocuments: number;
  corpusSha256: string;
  hubTok: HubTokenizer | null;
}

/** The mix's manifest.json contents (D1). */
function buildManifest(o: CheckedOptions, tok: LoadedTokenizer, f: BuildFacts): Manifest {
  return {
    format_version: 1,
    dtype: f.dtype,
    total_tokens: f.trainShards.reduce((a, s) => a + s.tokens, 0),
    shards: f.trainShards,
    val_shards: f.valShards,
    val_total_tokens: f.valShards.reduce((a, s) => a + s.tokens, 0),
    eos_id: tok.eosId,
    vocab_size: tok.vocabSize,
    tokenizer_files: tok.files,
    ...(f.sources.length ? { sources: f.sources } : {}),
    prepare: {
      documents: f.documents,
      val_documents: f.valDocuments,
      val_fraction: o.valFraction,
      val_rule:
        "doc i (0-based, input order) is val iff floor((i+1)*ppm/1e6) > floor(i*ppm/1e6), ppm = round(val_fraction*1e6)",
      shard_tokens: o.shardTokens,
      eos_token: tok.eosToken,
      tokenizer_sha256: tok.sha256,
      corpus_sha256: f.corpusSha256,
      separator: "EOS after every document",
      text_field: o.textField,
      piece_chars: o.pieceChars,
      ...(f.hubTok ? { tokenizer_source: f.hubTok.source } : {}),
    },
  };
}

/** The tokenizer files beside the shards, then manifest.json (created, fsynced: the build's "done" marker). */
function writeTokenizerAndManifest(staging: string, tok: LoadedTokenizer, manifest: Manifest): void {
  const srcDir = path.dirname(tok.path);
  for (const f of tok.files)
    fs.copyFileSync(f === "tokenizer.json" ? tok.path : path.join(srcDir, f), path.join(staging, f));
  const mfd = fs.openSync(path.join(staging, MANIFEST_FILE), "wx");
  try {
    fs.writeSync(mfd, manifestBytes(manifest));
    fs.fsyncSync(mfd);
  } catch (e) {
    (e as NodeJS.ErrnoException).path ??= path.join(staging, MANIFEST_FILE); // name the file (O6)
    throw e;
  } finally {
    fs.closeSync(mfd);
  }
}

/** The sibling folder the build happens in (`<out>.partial-<pid>`), created empty, after removing stale ones. */
function freshStaging(out: string, log: (s: string) => void): string {
  fs.mkdirSync(path.dirname(out), { recursive: true });
  removeStalePartials(out, log);
  const staging = stagingDirOf(out);
  trackScratch(staging);
  fs.rmSync(staging, { recursive: true, force: true });
  fs.mkdirSync(staging);
  return staging;
}

/** Move the finished staging folder to `out`; what was at `out` is moved aside (never deleted). Returns where. */
function moveIntoPlace(staging: string, out: string, outExists: boolean, log: (s: string) => void): string | null {
  let movedAside: string | null = null;
  if (outExists) {
    movedAside = `${out}.replaced-${new Date().toISOString().replace(/[:.]/g, "-")}`;
    fs.renameSync(out, movedAside);
    log(
      `prepare: the previous contents of ${out} were moved to ${movedAside} (delete it yourself once the new mix is checked)`,
    );
  } else if (fs.existsSync(out)) {
    fs.rmdirSync(out); // empty directory
  }
  fs.renameSync(staging, out);
  untrackScratch(staging);
  return movedAside;
}

/** A `--tokenizer owner/name` fetched from the Hub into a scratch folder (removed on a signal), or null for a file. */
async function hubTokenizerOf(
  tokenizer: string,
  hubUrl: string,
  log: (m: string) => void,
): Promise<HubTokenizer | null> {
  if (!isHubTokenizer(tokenizer)) return null;
  const hubTok = await fetchHubTokenizer(tokenizer, hubUrl);
  trackScratch(hubTok.dir);
  log(`prepare: tokenizer ${hubTok.source.repo}@${hubTok.source.revision.slice(0, 12)} from the Hub`);
  return hubTok;
}

export async function prepareMix(o: PrepareOptions): Promise<PrepareResult> {
  const t0 = Date.now();
  const opts = checkOptions(o);
  const { valFraction, workers, log } = opts;
  const out = path.resolve(o.out);
  const outExists = checkOut(out, o.force ?? false);
  // ---- everything that can be refused is checked before any tokenizing (D2)
  const hubTok = await hubTokenizerOf(o.tokenizer, opts.hubUrl, log);
  let pool: Piscina | null = null;
  let staging: string | null = null;
  try {
    const tok = loadTokenizer(hubTok ? hubTok.file : o.tokenizer, o.eosToken, o.tokenizer);
    const { files, skipped, sources } = await listInputs(o.inputs, opts.hubUrl);
    const plans = new Map<InputFile, ParquetPlan>();
    for (const f of files) if (f.kind === "parquet") plans.set(f, await planParquet(f, opts.textField));
    const totalBytes = files.reduce((a, f) => a + f.bytes, 0);
    const dtype = dtypeForVocab(tok.vocabSize);

    staging = freshStaging(out, log);
    pool = tokenizePool(workers);
    const mode =
      o.progress === "none" ? "none" : o.progress === "lines" ? "lines" : process.stderr.isTTY ? "bar" : "lines";
    const progress = new Progress(mode, totalBytes, t0);
    const shards = {
      train: new ShardWriter(staging, "train", dtype, opts.shardTokens),
      val: new ShardWriter(staging, "val", dtype, opts.shardTokens),
    };
    const ppm = valPpm(valFraction);
    const batches = new TokenizeBatches(
      pool,
      tok,
      workers * 3,
      shards,
      (doc) => isValDoc(doc, ppm),
      (bytes, tokens) => progress.update(bytes, tokens),
    );
    const corpusHash = createHash("sha256");
    const rd: ReadOptions = {
      textField: opts.textField,
      eosText: tok.eosToken,
      chunkBytes: opts.chunkBytes,
      pieceChars: opts.pieceChars,
    };
    const documents = await tokenizeInputs(files, plans, rd, batches, corpusHash);
    progress.update(totalBytes, batches.tokensDone, true);

    const trainShards = shards.train.finish();
    const valShards = shards.val.finish();
    if (trainShards.length === 0) {
      throw new UserError(
        "D2",
        `the inputs hold ${documents} non-empty documents and none went to training (val fraction ${valFraction}): give prepare more text`,
      );
    }
    if (valFraction > 0 && valShards.length === 0) {
      log(
        `prepare: WARNING no document was held out: ${documents} documents x val fraction ${valFraction} < 1; validation (D7) will refuse this mix. Use more documents or a larger --val-fraction`,
      );
    }
    const valDocs = batches.valDocs;
    const manifest = buildManifest(opts, tok, {
      dtype,
      trainShards,
      valShards,
      sources,
      documents,
      valDocuments: valDocs,
      corpusSha256: corpusHash.digest("hex"),
      hubTok,
    });
    writeTokenizerAndManifest(staging, tok, manifest);
    const movedAside = moveIntoPlace(staging, out, outExists, log);
    const seconds = (Date.now() - t0) / 1000;
    const allTokens = manifest.total_tokens + manifest.val_total_tokens;
    const result: PrepareResult = {
      root: out,
      manifest,
      seconds,
      tokensPerSec: allTokens / Math.max(1e-3, seconds),
      documents,
      valDocuments: valDocs,
      movedAside,
    };
    log(
      `prepare: ${out}: ${manifest.total_tokens.toLocaleString("en-US")} train tokens in ${trainShards.length} shards, ${manifest.val_total_tokens.toLocaleString("en-US")} val tokens in ${valShards.length} shards (${valDocs} of ${documents} documents held out), ${dtype}, vocab ${tok.vocabSize}, eos ${tok.eosId}; ${seconds.toFixed(1)} s, ${Math.round(result.tokensPerSec).toLocaleString("en-US")} tok/s with ${workers} workers${skipped ? `; skipped ${skipped} non-text files` : ""}`,
    );
    return result;
  } catch (e) {
    if (staging) {
      fs.rmSync(staging, { recursive: true, force: true });
      untrackScratch(staging);
    }
    throw e;
  } finally {
    if (pool) await pool.destroy();
    if (hubTok) fs.rmSync(hubTok.dir, { recursive: true, force: true });
  }
}
