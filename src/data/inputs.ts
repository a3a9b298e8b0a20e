/**
 * The corpus side of `prepare` (SPEC D2, D8): which files an --input names, and the documents in
 * each, read as a stream so that memory stays flat in the input size.
 *
 * Formats (by file name):
 *   .txt .text .md      plain UTF-8 text, read in chunks (`chunkBytes`, default 1 MiB). A file is cut
 *                       into documents at every line that holds exactly the EOS token's text (e.g.
 *                       `<|endoftext|>`, the convention of TinyStories' .txt files; a trailing "\r" is
 *                       allowed); that line and the newline before it belong to no document. A file
 *                       without such lines is one document, verbatim.
 *   .jsonl              one document per non-empty line: its `--text-field` string (default "text")
 *   .jsonl.gz           the same, gzip-compressed (node:zlib)
 *   .jsonl.zst          the same, Zstandard-compressed (fzstd, a pure-JS streaming decoder)
 *   .parquet            one document per row: the `--text-field` column (a UTF-8 string column), read
 *                       one row group at a time (hyparquet + hyparquet-compressors). Null cells are
 *                       empty documents.
 * Empty documents are dropped (before numbering) in every format.
 *
 * Long documents: any document longer than `pieceChars` (default 4 Mi UTF-16 units) is tokenized in
 * pieces: while more than pieceChars remain, the next piece ends after the last "\n" within the next
 * pieceChars characters, or at pieceChars (one less if that would split a surrogate pair) when there
 * is none. The pieces' tokens are concatenated with no EOS between them; the rule is the same for
 * every format, so the same documents give the same tokens whatever file they come in.
 *
 * An input is a local file or directory (directories are walked recursively in byte-sorted order,
 * dot-files skipped, files of other types counted as skipped) or a Hub dataset (hub-input.ts).
 */
import * as fs from "node:fs";
import * as path from "node:path";
import * as zlib from "node:zlib";
import { Decompress as ZstdDecompress } from "fzstd";
import { parquetMetadataAsync, parquetReadObjects, parquetSchema, type AsyncBuffer, type FileMetaData } from "hyparquet";
import { compressors } from "hyparquet-compressors";
import { UserError } from "../errors";

export type InputKind = "text" | "jsonl" | "jsonl.gz" | "jsonl.zst" | "parquet";

/** One corpus file, local or remote: sequential bytes for the streamed formats, random access for Parquet. */
export interface InputFile {
  /** What messages and the manifest call it: a local path, or hf://datasets/owner/name@rev/path. */
  name: string;
  kind: InputKind;
  bytes: number;
  stream(chunkBytes: number): AsyncIterable<Uint8Array>;
  random(): RandomAccess;
}

/** hyparquet's AsyncBuffer plus a close for what it holds open. */
export type RandomAccess = AsyncBuffer & { close(): Promise<void> };

export const DEFAULT_CHUNK_BYTES = 1 << 20;
export const DEFAULT_PIECE_CHARS = 4 << 20;
export const SUPPORTED_FORMATS = ".txt, .text, .md, .jsonl, .jsonl.gz, .jsonl.zst, .parquet";

/** The format of a file by its name, or null when prepare does not read it. */
export function kindOf(name: string): InputKind | null {
  const n = name.toLowerCase();
  if (n.endsWith(".jsonl.gz")) return "jsonl.gz";
  if (n.endsWith(".jsonl.zst") || n.endsWith(".jsonl.zstd")) return "jsonl.zst";
  if (n.endsWith(".jsonl")) return "jsonl";
  if (n.endsWith(".parquet")) return "parquet";
  if (n.endsWith(".txt") || n.endsWith(".text") || n.endsWith(".md")) return "text";
  return null;
}

// ---------------------------------------------------------------------------------------------
// local files

async function* fileChunks(file: string, chunkBytes: number): AsyncGenerator<Uint8Array> {
  const fh = await fs.promises.open(file, "r");
  try {
    const buf = Buffer.allocUnsafe(chunkBytes);
    let pos = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, 0, chunkBytes, pos);
      if (bytesRead === 0) return;
      pos += bytesRead;
      // a copy: the consumer may hold it while the next read fills buf
      yield Buffer.from(buf.subarray(0, bytesRead));
    }
  } finally {
    await fh.close();
  }
}

export function localInputFile(file: string, kind: InputKind, bytes: number): InputFile {
  return {
    name: file,
    kind,
    bytes,
    stream: (chunkBytes) => fileChunks(file, chunkBytes),
    random: () => {
      let fd: fs.promises.FileHandle | null = null;
      return {
        byteLength: bytes,
        async slice(start: number, end?: number): Promise<ArrayBuffer> {
          fd ??= await fs.promises.open(file, "r");
          const e = end ?? bytes;
          const out = new Uint8Array(e - start);
          let off = 0;
          while (off < out.length) {
            const { bytesRead } = await fd.read(out, off, out.length - off, start + off);
            if (bytesRead === 0) throw new Error(`${file} ended at byte ${start + off} while reading up to ${e}: it changed while prepare read it`);
            off += bytesRead;
          }
          return out.buffer;
        },
        async close(): Promise<void> {
          const h = fd;
          fd = null;
          await h?.close();
        },
      };
    },
  };
}

/** Local --input paths -> files in order, plus how many files of other types a walk skipped. */
export function listLocalInputs(inputs: string[]): { files: InputFile[]; skipped: number } {
  const files: InputFile[] = [];
  let skipped = 0;
  const walk = (dir: string): void => {
    const names = fs.readdirSync(dir).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    for (const name of names) {
      if (name.startsWith(".")) continue;
      const p = path.join(dir, name);
      const st = fs.statSync(p);
      const kind = kindOf(name);
      if (st.isDirectory()) walk(p);
      else if (st.isFile() && kind) files.push(localInputFile(p, kind, st.size));
      else skipped++;
    }
  };
  for (const inp of inputs) {
    let st: fs.Stats;
    try {
      st = fs.statSync(inp);
    } catch {
      throw new UserError("D2", `--input ${inp} does not exist: name corpus files or directories that exist, or a Hub dataset as hf://datasets/owner/name[@revision]/path-glob`);
    }
    if (st.isDirectory()) walk(inp);
    else if (st.isFile()) {
      // a file named explicitly: its type by name, else plain text (the old behaviour for any named file)
      files.push(localInputFile(inp, kindOf(inp) ?? "text", st.size));
    } else throw new UserError("D2", `--input ${inp} is neither a file nor a directory`);
  }
  return { files, skipped };
}

// ---------------------------------------------------------------------------------------------
// documents

/** A piece of a document: `last` is false when the document continues in the next piece. */
export interface DocPiece {
  text: string;
  last: boolean;
  /** Where it came from, for messages: file[:line] or file[:row]. */
  where: string;
  /** Bytes of this input consumed so far (compressed bytes for .gz/.zst, row-group bytes for Parquet). */
  bytesDone: number;
}

export interface ReadOptions {
  textField: string;
  eosText: string;
  chunkBytes: number;
  pieceChars: number;
}

/** Where the next piece of s (from `from`) ends, by the long-document rule in the module comment. */
export function pieceEnd(s: string, from: number, pieceChars: number): number {
  if (s.length - from <= pieceChars) return s.length;
  const nl = s.lastIndexOf("\n", from + pieceChars - 1);
  if (nl >= from) return nl + 1;
  let end = from + pieceChars;
  const c = s.charCodeAt(end - 1);
  if (c >= 0xd800 && c <= 0xdbff) end--; // keep a surrogate pair together
  return end;
}

/** One whole document as pieces (the same cuts the streaming text reader makes). */
function* piecesOf(text: string, where: string, bytesDone: number, pieceChars: number): Generator<DocPiece> {
  if (text.length === 0) return;
  let from = 0;
  while (from < text.length) {
    const end = pieceEnd(text, from, pieceChars);
    yield { text: text.slice(from, end), last: end === text.length, where, bytesDone };
    from = end;
  }
}

function utf8Error(where: string): UserError {
  return new UserError("D2", `${where} is not UTF-8 text: convert it to UTF-8 or leave it out of --input`);
}

/** Sequential bytes -> the plain-text documents of one file, as pieces. */
async function* textDocs(f: InputFile, o: ReadOptions): AsyncGenerator<DocPiece> {
  const dec = new TextDecoder("utf-8", { fatal: true });
  let cur = ""; // the current document since its last emitted piece, without a pending final "\n"
  let nl = false; // a "\n" ends cur's last line; it joins the document only if another line follows
  let started = false; // cur belongs to a document that already emitted pieces or has content
  let partial = ""; // the current line so far (no "\n" seen yet)
  let longLine = false; // part of the current line already went into cur: it is no separator
  let lineNo = 1;
  let docLine = 1;
  let bytes = 0;
  const sep = o.eosText;
  const flushLong = function* (): Generator<DocPiece> {
    while (cur.length > o.pieceChars) {
      const end = pieceEnd(cur, 0, o.pieceChars);
      yield { text: cur.slice(0, end), last: false, where: `${f.name}:${docLine}`, bytesDone: bytes };
      cur = cur.slice(end);
      started = true;
    }
  };
  const addLine = (line: string): void => {
    cur += (nl ? "\n" : "") + line;
    nl = true;
  };
  const endDoc = function* (final: boolean): Generator<DocPiece> {
    const text = cur + (final && nl ? "\n" : "");
    if (text.length > 0 || started) {
      let from = 0;
      while (from < text.length) {
        const end = pieceEnd(text, from, o.pieceChars);
        yield { text: text.slice(from, end), last: end === text.length, where: `${f.name}:${docLine}`, bytesDone: bytes };
        from = end;
      }
      // the document's earlier pieces went out already: an empty last piece closes it
      if (text.length === 0) yield { text: "", last: true, where: `${f.name}:${docLine}`, bytesDone: bytes };
    }
    cur = "";
    nl = false;
    started = false;
  };
  for await (const chunk of f.stream(o.chunkBytes)) {
    bytes += chunk.length;
    let s: string;
    try {
      s = dec.decode(chunk, { stream: true });
    } catch {
      throw utf8Error(`${f.name} (near line ${lineNo})`);
    }
    let at = 0;
    for (;;) {
      const k = s.indexOf("\n", at);
      if (k < 0) break;
      const line = partial + s.slice(at, k);
      partial = "";
      at = k + 1;
      lineNo++;
      const isSep = !longLine && (line === sep || line === sep + "\r");
      longLine = false;
      if (isSep) {
        yield* endDoc(false);
        docLine = lineNo;
      } else {
        if (cur.length === 0 && !nl && !started) docLine = lineNo - 1;
        addLine(line);
        yield* flushLong();
      }
    }
    partial += s.slice(at);
    if (partial.length > o.pieceChars + sep.length + 1) {
      // a very long line cannot be a separator: move all but its last character into the document
      const keep = partial.charCodeAt(partial.length - 1) >= 0xdc00 && partial.charCodeAt(partial.length - 1) <= 0xdfff ? 2 : 1;
      cur += (nl ? "\n" : "") + partial.slice(0, partial.length - keep);
      nl = false;
      longLine = true;
      partial = partial.slice(partial.length - keep);
      yield* flushLong();
    }
  }
  try {
    partial += dec.decode();
  } catch {
    throw utf8Error(`${f.name} (at its end)`);
  }
  if (!longLine && (partial === sep || partial === sep + "\r")) {
    yield* endDoc(false);
  } else {
    if (partial.length > 0) {
      cur += (nl ? "\n" : "") + partial;
      nl = false;
    }
    yield* endDoc(true);
  }
}

/** Sequential bytes through a decompressor, counting the compressed bytes read. */
async function* decompressed(f: InputFile, o: ReadOptions, counter: { bytes: number }): AsyncGenerator<Uint8Array> {
  if (f.kind === "jsonl") {
    for await (const c of f.stream(o.chunkBytes)) {
      counter.bytes += c.length;
      yield c;
    }
    return;
  }
  if (f.kind === "jsonl.gz") {
    const gunzip = zlib.createGunzip({ chunkSize: 1 << 16 });
    const src = f.stream(o.chunkBytes);
    // feed the compressed stream in, read the plain one out, with backpressure both ways
    const feeder = (async () => {
      try {
        for await (const c of src) {
          counter.bytes += c.length;
          if (!gunzip.write(c)) await new Promise<void>((r) => gunzip.once("drain", r));
        }
        gunzip.end();
      } catch (e) {
        gunzip.destroy(e as Error);
      }
    })();
    try {
      for await (const out of gunzip) yield out as Buffer;
    } catch (e) {
      throw new UserError("D2", `${f.name} is not a valid gzip file (${(e as Error).message}): re-download it or leave it out of --input`);
    }
    await feeder;
    return;
  }
  // .jsonl.zst: fzstd's streaming decoder; its output callback collects the plain chunks
  const outs: Uint8Array[] = [];
  const z = new ZstdDecompress((chunk) => { outs.push(chunk); });
  let any = false;
  for await (const c of f.stream(o.chunkBytes)) {
    counter.bytes += c.length;
    any = true;
    try {
      z.push(c);
    } catch (e) {
      throw new UserError("D2", `${f.name} is not a valid Zstandard file (${(e as Error).message}): re-download it or leave it out of --input`);
    }
    while (outs.length) yield outs.shift()!;
  }
  try {
    z.push(new Uint8Array(0), true);
  } catch (e) {
    throw new UserError("D2", `${f.name} is not a valid Zstandard file (${(e as Error).message}): re-download it or leave it out of --input`);
  }
  if (!any) return;
  while (outs.length) yield outs.shift()!;
}

/** .jsonl (plain or compressed): one document per non-empty line. */
async function* jsonlDocs(f: InputFile, o: ReadOptions): AsyncGenerator<DocPiece> {
  const counter = { bytes: 0 };
  const dec = new TextDecoder("utf-8", { fatal: true });
  let lineNo = 0;
  let carry: Buffer = Buffer.alloc(0);
  const parse = function* (line: Buffer): Generator<DocPiece> {
    lineNo++;
    const where = `${f.name}:${lineNo}`;
    let s: string;
    try {
      s = dec.decode(line).trim();
    } catch {
      throw utf8Error(where);
    }
    if (s.length === 0) return;
    let obj: unknown;
    try {
      obj = JSON.parse(s);
    } catch (e) {
      throw new UserError("D2", `${where} is not a JSON line (${(e as Error).message}): each .jsonl line must be {"${o.textField}": "..."}`);
    }
    const text = (obj as Record<string, unknown> | null)?.[o.textField];
    if (typeof text !== "string") {
      const keys = obj && typeof obj === "object" ? Object.keys(obj).slice(0, 8).join(", ") : typeof obj;
      throw new UserError("D2", `${where} has no "${o.textField}" string (it has: ${keys}): each .jsonl line must be {"${o.textField}": "..."}; pick the field with --text-field NAME`);
    }
    yield* piecesOf(text, where, counter.bytes, o.pieceChars);
  };
  for await (const c of decompressed(f, o, counter)) {
    let buf = carry.length ? Buffer.concat([carry, c]) : Buffer.from(c.buffer, c.byteOffset, c.byteLength);
    let nl: number;
    while ((nl = buf.indexOf(10)) >= 0) {
      yield* parse(buf.subarray(0, nl));
      buf = buf.subarray(nl + 1);
    }
    carry = Buffer.from(buf);
  }
  if (carry.length > 0) yield* parse(carry);
}

// ---------------------------------------------------------------------------------------------
// Parquet

export interface ParquetPlan { metadata: FileMetaData; rows: number }

/** Reads a Parquet footer and checks the text column before any tokenizing (D2). */
export async function planParquet(f: InputFile, textField: string): Promise<ParquetPlan> {
  let metadata: FileMetaData;
  const file = f.random();
  try {
    metadata = await parquetMetadataAsync(file);
  } catch (e) {
    throw new UserError("D2", `${f.name} is not a readable Parquet file (${(e as Error).message}): re-download it or leave it out of --input`);
  } finally {
    await file.close();
  }
  const top = parquetSchema(metadata).children;
  const col = top.find((c) => c.element.name === textField);
  if (!col) {
    throw new UserError("D2", `${f.name} has no column "${textField}" (its columns: ${top.map((c) => c.element.name).join(", ")}): pick the text column with --text-field NAME`);
  }
  const el = col.element;
  const isString = col.children.length === 0 && el.type === "BYTE_ARRAY" && (el.converted_type === "UTF8" || el.logical_type?.type === "STRING" || el.converted_type === undefined);
  if (!isString) {
    throw new UserError("D2", `${f.name} column "${textField}" is ${el.type ?? "a nested group"}${el.converted_type ? ` (${el.converted_type})` : ""}, not a string column: pick the text column with --text-field NAME`);
  }
  return { metadata, rows: Number(metadata.num_rows) };
}

async function* parquetDocs(f: InputFile, o: ReadOptions, plan: ParquetPlan): AsyncGenerator<DocPiece> {
  const file = f.random();
  try {
    yield* parquetRows(f, o, plan, file);
  } finally {
    await file.close();
  }
}

async function* parquetRows(f: InputFile, o: ReadOptions, plan: ParquetPlan, file: AsyncBuffer): AsyncGenerator<DocPiece> {
  let row = 0;
  let bytes = 0;
  for (const rg of plan.metadata.row_groups) {
    const n = Number(rg.num_rows);
    const rows = await parquetReadObjects({ file, metadata: plan.metadata, columns: [o.textField], rowStart: row, rowEnd: row + n, compressors, utf8: true });
    bytes += rg.columns.reduce((a, c) => a + Number(c.meta_data?.total_compressed_size ?? 0), 0);
    const done = Math.min(f.bytes, bytes);
    for (let i = 0; i < rows.length; i++) {
      const v = rows[i]![o.textField];
      const where = `${f.name}:row ${row + i}`;
      if (v === null || v === undefined) continue;
      if (typeof v !== "string") throw new UserError("D2", `${where}: "${o.textField}" is ${typeof v}, not a string: pick the text column with --text-field NAME`);
      yield* piecesOf(v, where, done, o.pieceChars);
    }
    row += n;
  }
}

/** The documents of one input file, in order, as pieces (see the module comment). */
export function docsOf(f: InputFile, o: ReadOptions, plan?: ParquetPlan): AsyncGenerator<DocPiece> {
  switch (f.kind) {
    case "text":
      return textDocs(f, o);
    case "jsonl":
    case "jsonl.gz":
    case "jsonl.zst":
      return jsonlDocs(f, o);
    case "parquet":
      if (!plan) throw new Error(`docsOf(${f.name}): a Parquet input needs its plan (planParquet) first`);
      return parquetDocs(f, o, plan);
  }
}
