/**
 * `prepare`'s tokenize pool (D2), beside its worker (tokenize-worker.ts): a piscina pool of `workers` threads, each
 * running the worker on a batch of pieces, and TokenizeBatches, which sends the pieces in order and writes the
 * results back in that order, so the shards are byte-identical for any --workers.
 */
import * as path from "node:path";
import { Piscina } from "piscina";
import { UserError } from "../errors";
import type { DocPiece } from "./inputs";
import type { LoadedTokenizer } from "./prepare-tokenizer";
import type { ShardWriter } from "./token-store";
import type { TokenizeTask } from "./tokenize-worker";

const BATCH_CHARS = 256 * 1024;
const BATCH_DOCS = 256;

/** The pool: `workers` threads running tokenize-worker.js (close it with destroy()). */
export function tokenizePool(workers: number): Piscina {
  return new Piscina({
    filename: path.join(__dirname, "tokenize-worker.js"),
    minThreads: workers,
    maxThreads: workers,
    idleTimeout: 1000,
  });
}

/** A batch: pieces in order, each with its document's index and whether it ends the document. */
interface Batch {
  docs: number[];
  last: boolean[];
  wheres: string[];
  bytesAfter: number;
  result: Promise<Uint32Array>;
}

/**
 * Pieces, in input order, to the tokenizer pool in batches (BATCH_CHARS / BATCH_DOCS), at most `maxInflight`
 * batches out; results are taken back strictly in order and written to the train or the val shards by their
 * document's index (`isVal`: the held-out rule), with EOS after each document's last piece; `written` hears of
 * each batch written (the input bytes it ends at, the tokens written so far).
 */
export class TokenizeBatches {
  private readonly inflight: Batch[] = [];
  private texts: string[] = [];
  private docs: number[] = [];
  private lasts: boolean[] = [];
  private wheres: string[] = [];
  private chars = 0;
  /** Documents written to val so far. */
  valDocs = 0;
  /** Tokens written so far (train and val, EOS included). */
  tokensDone = 0;

  constructor(
    private readonly pool: Piscina,
    private readonly tok: LoadedTokenizer,
    private readonly maxInflight: number,
    private readonly shards: { train: ShardWriter; val: ShardWriter },
    private readonly isVal: (doc: number) => boolean,
    private readonly written: (bytesAfter: number, tokens: number) => void,
  ) {}

  add(piece: DocPiece, docIndex: number): void {
    this.texts.push(piece.text);
    this.docs.push(docIndex);
    this.lasts.push(piece.last);
    this.wheres.push(piece.where);
    this.chars += piece.text.length;
  }

  get full(): boolean {
    return this.chars >= BATCH_CHARS || this.texts.length >= BATCH_DOCS;
  }

  /** Send the pieces gathered so far; wait for the oldest batches while too many are out. */
  async submit(bytesAfter: number): Promise<void> {
    if (this.texts.length === 0) return;
    const tok = this.tok;
    const task: TokenizeTask = {
      tokenizerPath: path.resolve(tok.path),
      configPath: tok.configPath ? path.resolve(tok.configPath) : null,
      vocabSize: tok.vocabSize,
      texts: this.texts,
      firstDoc: this.docs[0],
    };
    const result = this.pool.run(task) as Promise<Uint32Array>;
    result.catch(() => undefined); // observed in drainOne, in order
    this.inflight.push({ docs: this.docs, last: this.lasts, wheres: this.wheres, bytesAfter, result });
    this.texts = [];
    this.docs = [];
    this.lasts = [];
    this.wheres = [];
    this.chars = 0;
    while (this.inflight.length >= this.maxInflight) await this.drainOne();
  }

  async drainAll(): Promise<void> {
    while (this.inflight.length > 0) await this.drainOne();
  }

  private async drainOne(): Promise<void> {
    const b = this.inflight.shift()!;
    let res: Uint32Array;
    try {
      res = await b.result;
    } catch (e) {
      throw new UserError(
        "D2",
        `tokenizing ${b.wheres[0]}${b.wheres.length > 1 ? ` (and ${b.wheres.length - 1} more documents)` : ""} failed: ${(e as Error).message}`,
      );
    }
    const n = res[0];
    let p = 1 + n;
    for (let d = 0; d < n; d++) {
      const len = res[1 + d];
      const w = this.isVal(b.docs[d]) ? this.shards.val : this.shards.train;
      w.pushRange(res, p, p + len);
      p += len;
      this.tokensDone += len;
      if (b.last[d]) {
        if (w === this.shards.val) this.valDocs++;
        w.push(this.tok.eosId);
        this.tokensDone++;
      }
    }
    this.written(b.bytesAfter, this.tokensDone);
  }
}
