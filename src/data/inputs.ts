/**
 * The corpus side of `prepare` (D2, D8): which files an --input names, and the documents in
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
import {
  parquetMetadataAsync,
  parquetReadObjects,
  parquetSchema,
  type AsyncBuffer,
  type FileMetaData,
} from "hyparquet";
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
            if (bytesRead === 0)
              throw new Error(
                `${file} ended at byte ${start + off} while reading up to ${e}: it changed while prepare read it`,
              );
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

/** D2: a named input of no known format, refused with the accepted list (a .json array or a .csv read as text would be one document of syntax). */
function unknownFormat(inp: string): UserError {
  const ext = /(\.[^./\\]+)$/.exec(path.basename(inp))?.[1] ?? "(no extension)";
  const hint =
    ext === ".json"
      ? "; a JSON array of documents becomes .jsonl with one {\"text\": ...} object per line (e.g. jq -c '.[] | {text: .}' in.json > in.jsonl)"
      : ext === ".csv" || ext === ".tsv"
        ? "; a table becomes .parquet or .jsonl with the text in one column / field (--text-field NAME)"
        : "; a plain-text file is read when named .txt";
  return new UserError(
    "D2",
    `--input ${inp}: prepare does not read ${ext} files. Accepted formats: ${SUPPORTED_FORMATS}${hint}`,
  );
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
      throw new UserError(
        "D2",
        `--input ${inp} does not exist: name corpus files or directories that exist, or a Hub dataset as hf://datasets/owner/name[@revision]/path-glob`,
      );
    }
    if (st.isDirectory()) walk(inp);
    else if (st.isFile()) {
      // a file named explicitly is read by its type; one of no known type is refused, never guessed as text (D2)
      const kind = kindOf(inp);
      if (!kind) throw unknownFormat(inp);
      files.push(localInputFile(inp, kind, st.size));
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

/**
 * The plain-text document rule (module comment) over one file's text, fed chunk by chunk: the state between
 * lines, and the pieces each line, chunk or the file's end completes.
 */
class PlainTextDocs {
  /** The current document since its last emitted piece, without a pending final "\n". */
  private cur = "";
  /** A "\n" ends cur's last line; it joins the document only if another line follows. */
  private nl = false;
  /** cur belongs to a document that already emitted pieces or has content. */
  private started = false;
  /** The current line so far (no "\n" seen yet). */
  private partial = "";
  /** Part of the current line already went into cur: it is no separator. */
  private longLine = false;
  /** The 1-based line the next line of input is; the line the current document started on. */
  lineNo = 1;
  private docLine = 1;
  /** Bytes of the file read so far (the pieces' bytesDone). */
  bytes = 0;

  constructor(
    private readonly name: string,
    private readonly sep: string,
    private readonly pieceChars: number,
  ) {}

  /** The pieces the complete lines of `s` (one decoded chunk) finish; a very long unfinished line goes in too. */
  *text(s: string): Generator<DocPiece> {
    let at = 0;
    for (;;) {
      const k = s.indexOf("\n", at);
      if (k < 0) break;
      const line = this.partial + s.slice(at, k);
      this.partial = "";
      at = k + 1;
      yield* this.line(line);
    }
    this.partial += s.slice(at);
    if (this.partial.length > this.pieceChars + this.sep.length + 1) {
      // a very long line cannot be a separator: move all but its last character into the document
      const p = this.partial;
      const keep = p.charCodeAt(p.length - 1) >= 0xdc00 && p.charCodeAt(p.length - 1) <= 0xdfff ? 2 : 1;
      this.cur += (this.nl ? "\n" : "") + p.slice(0, p.length - keep);
      this.nl = false;
      this.longLine = true;
      this.partial = p.slice(p.length - keep);
      yield* this.flushLong();
    }
  }

  /** The last pieces, once `tail` (the decoder's last characters) is added: the file's end closes its document. */
  *finish(tail: string): Generator<DocPiece> {
    this.partial += tail;
    if (this.isSeparator(this.partial)) {
      yield* this.endDoc(false);
    } else {
      if (this.partial.length > 0) {
        this.cur += (this.nl ? "\n" : "") + this.partial;
        this.nl = false;
      }
      yield* this.endDoc(true);
    }
  }

  private isSeparator(line: string): boolean {
    return !this.longLine && (line === this.sep || line === `${this.sep}\r`);
  }

  /** One complete line: a separator ends the document, any other line joins it. */
  private *line(line: string): Generator<DocPiece> {
    this.lineNo++;
    const isSep = this.isSeparator(line);
    this.longLine = false;
    if (isSep) {
      yield* this.endDoc(false);
      this.docLine = this.lineNo;
    } else {
      if (this.cur.length === 0 && !this.nl && !this.started) this.docLine = this.lineNo - 1;
      this.cur += (this.nl ? "\n" : "") + line;
      this.nl = true;
      yield* this.flushLong();
    }
  }

  private piece(text: string, last: boolean): DocPiece {
    return { text, last, where: `${this.name}:${this.docLine}`, bytesDone: this.bytes };
  }

  /** Pieces of a document that is longer than pieceChars and goes on. */
  private *flushLong(): Generator<DocPiece> {
    while (this.cur.length > this.pieceChars) {
      const end = pieceEnd(this.cur, 0, this.pieceChars);
      yield this.piece(this.cur.slice(0, end), false);
      this.cur = this.cur.slice(end);
      this.started = true;
    }
  }

  /** The rest of the current document, its last piece marked; `final` keeps a trailing "\n" (the file's end). */
  private *endDoc(final: boolean): Generator<DocPiece> {
    const text = this.cur + (final && this.nl ? "\n" : "");
    if (text.length > 0 || this.started) {
      let from = 0;
      while (from < text.length) {
        const end = pieceEnd(text, from, this.pieceChars);
        yield this.piece(text.slice(from, end), end === text.length);
        from = end;
      }
      // the document's earlier pieces went out already: an empty last piece closes it
      if (text.length === 0) yield this.piece("", true);
    }
    this.cur = "";
    this.nl = false;
    this.started = false;
  }
}

/** Sequential bytes -> the plain-text documents of one file, as pieces. */
async function* textDocs(f: InputFile, o: ReadOptions): AsyncGenerator<DocPiece> {
  const dec = new TextDecoder("utf-8", { fatal: true });
  const docs = new PlainTextDocs(f.name, o.eosText, o.pieceChars);
  for await (const chunk of f.stream(o.chunkBytes)) {
    docs.bytes += chunk.length;
    let s: string;
    try {
      s = dec.decode(chunk, { stream: true });
    } catch {
      throw utf8Error(`${f.name} (near line ${docs.lineNo})`);
    }
    yield* docs.text(s);
  }
  let tail: string;
  try {
    tail = dec.decode();
  } catch {
    throw utf8Error(`${f.name} (at its end)`);
  }
  yield* docs.finish(tail);
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
      throw new UserError(
        "D2",
        `${f.name} is not a valid gzip file (${(e as Error).message}): re-download it or leave it out of --input`,
      );
    }
    await feeder;
    return;
  }
  // .jsonl.zst: fzstd's streaming decoder; its output callback collects the plain chunks
  const outs: Uint8Array[] = [];
  const z = new ZstdDecompress((chunk) => {
    outs.push(chunk);
  });
  let any = false;
  for await (const c of f.stream(o.chunkBytes)) {
    counter.bytes += c.length;
    any = true;
    try {
      z.push(c);
    } catch (e) {
      throw new UserError(
        "D2",
        `${f.name} is not a valid Zstandard file (${(e as Error).message}): re-download it or leave it out of --input`,
      );
    }
    while (outs.length) yield outs.shift()!;
  }
  try {
    z.push(new Uint8Array(0), true);
  } catch (e) {
    throw new UserError(
      "D2",
      `${f.name} is not a valid Zstandard file (${(e as Error).message}): re-download it or leave it out of --input`,
    );
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
      throw new UserError(
        "D2",
        `${where} is not a JSON line (${(e as Error).message}): each .jsonl line must be {"${o.textField}": "..."}`,
      );
    }
    const text = (obj as Record<string, unknown> | null)?.[o.textField];
    if (typeof text !== "string") {
      const fields = obj && typeof obj === "object" && !Array.isArray(obj) ? Object.entries(obj) : [];
      const keys = fields.length
        ? fields
            .slice(0, 8)
            .map(([k]) => k)
            .join(", ")
        : typeof obj;
      const str = fields.find(([, v]) => typeof v === "string")?.[0];
      const what = `${where} has no "${o.textField}" string (it has: ${keys}): each .jsonl line must be {"${o.textField}": "..."}; `;
      throw str === undefined
        ? new UserError("D2", `${what}pick the field with --text-field NAME`)
        : new UserError("D2", `${what}pick the field: run `, {
            ways: [{ changes: [["--text-field", str]], why: "its first string field" }],
          });
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

export interface ParquetPlan {
  metadata: FileMetaData;
  rows: number;
}

/** Reads a Parquet footer and checks the text column before any tokenizing (D2). */
export async function planParquet(f: InputFile, textField: string): Promise<ParquetPlan> {
  let metadata: FileMetaData;
  const file = f.random();
  try {
    metadata = await parquetMetadataAsync(file);
  } catch (e) {
    throw new UserError(
      "D2",
      `${f.name} is not a readable Parquet file (${(e as Error).message}): re-download it or leave it out of --input`,
    );
  } finally {
    await file.close();
  }
  const top = parquetSchema(metadata).children;
  const col = top.find((c) => c.element.name === textField);
  const isString = (c: (typeof top)[number]) =>
    c.children.length === 0 &&
    c.element.type === "BYTE_ARRAY" &&
    (c.element.converted_type === "UTF8" ||
      c.element.logical_type?.type === "STRING" ||
      c.element.converted_type === undefined);
  // the advice: the file's first string column, as the command that reads it
  const pick = (what: string) => {
    const other = top.find((c) => c !== col && isString(c))?.element.name;
    return other === undefined
      ? new UserError("D2", `${what}: pick the text column with --text-field NAME`)
      : new UserError("D2", `${what}: pick the text column: run `, {
          ways: [{ changes: [["--text-field", other]], why: "its first string column" }],
        });
  };
  if (!col)
    throw pick(`${f.name} has no column "${textField}" (its columns: ${top.map((c) => c.element.name).join(", ")})`);
  const el = col.element;
  if (!isString(col))
    throw pick(
      `${f.name} column "${textField}" is ${el.type ?? "a nested group"}${el.converted_type ? ` (${el.converted_type})` : ""}, not a string column`,
    );
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

async function* parquetRows(
  f: InputFile,
  o: ReadOptions,
  plan: ParquetPlan,
  file: AsyncBuffer,
): AsyncGenerator<DocPiece> {
  let row = 0;
  let bytes = 0;
  for (const rg of plan.metadata.row_groups) {
    const n = Number(rg.num_rows);
    const rows = await parquetReadObjects({
      file,
      metadata: plan.metadata,
      columns: [o.textField],
      rowStart: row,
      rowEnd: row + n,
      compressors,
      utf8: true,
    });
    bytes += rg.columns.reduce((a, c) => a + Number(c.meta_data?.total_compressed_size ?? 0), 0);
    const done = Math.min(f.bytes, bytes);
    for (let i = 0; i < rows.length; i++) {
      const v = rows[i][o.textField];
      const where = `${f.name}:row ${row + i}`;
      if (v === null || v === undefined) continue;
      if (typeof v !== "string")
        throw new UserError(
          "D2",
          `${where}: "${o.textField}" is ${typeof v}, not a string: pick the text column with --text-field NAME`,
        );
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
