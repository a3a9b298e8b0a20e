/**
 * A small, deterministic byte-level BPE trainer that writes a Hugging Face `tokenizer.json`
 * (model BPE, ByteLevel pre-tokenizer / post-processor / decoder, GPT-2 byte-to-unicode alphabet),
 * loadable by @huggingface/tokenizers and by transformers' AutoTokenizer (PreTrainedTokenizerFast).
 *
 * Vocabulary layout (vocabSize V):
 *   id 0            the EOS special token (e.g. "<|endoftext|>"), M1: eos_token_id = 0
 *   ids 1 .. 256    the 256 single-byte symbols, in byte order 0x00 .. 0xFF
 *   ids 257 .. V-2  one token per merge, in merge order
 *   id V-1          the pad special token, M1: pad_token_id = vocab - 1
 * Training: pre-tokenize with the GPT-2 ByteLevel regex (the one @huggingface/tokenizers applies),
 * count words, then repeatedly merge the most frequent adjacent pair; ties go to the pair with the
 * smaller (left id, right id). Stops when V-2 ids are used (or no pair occurs twice).
 */

/** The GPT-2 / ByteLevel pre-tokenizer split, identical to @huggingface/tokenizers' ByteLevel. */
export const BYTE_LEVEL_SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

/** GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 upward. */
export function bytesToUnicode(): string[] {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  }
  const out = new Array<string>(256);
  for (let i = 0; i < 256; i++) out[bs[i]] = String.fromCharCode(cs[i]);
  return out;
}

export interface BpeResult {
  /** id -> token string (ByteLevel alphabet), length vocabSize. */
  vocab: string[];
  merges: Array<[string, string]>;
  eosId: number;
  padId: number;
}

/** Max-heap of (count, key) with the total order: larger count first, then smaller key. */
class PairHeap {
  private c: number[] = [];
  private k: number[] = [];
  get size(): number {
    return this.c.length;
  }
  private before(i: number, j: number): boolean {
    return this.c[i] > this.c[j] || (this.c[i] === this.c[j] && this.k[i] < this.k[j]);
  }
  private swap(i: number, j: number): void {
    [this.c[i], this.c[j]] = [this.c[j], this.c[i]];
    [this.k[i], this.k[j]] = [this.k[j], this.k[i]];
  }
  push(count: number, key: number): void {
    this.c.push(count);
    this.k.push(key);
    let i = this.c.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.before(i, p)) break;
      this.swap(i, p);
      i = p;
    }
  }
  pop(): [number, number] {
    const top: [number, number] = [this.c[0], this.k[0]];
    const lc = this.c.pop()!;
    const lk = this.k.pop()!;
    if (this.c.length > 0) {
      this.c[0] = lc;
      this.k[0] = lk;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < this.c.length && this.before(l, m)) m = l;
        if (r < this.c.length && this.before(r, m)) m = r;
        if (m === i) break;
        this.swap(i, m);
        i = m;
      }
    }
    return top;
  }
}

/** Pre-tokens (BYTE_LEVEL_SPLIT) of all texts, sorted, with how often each occurs. */
function countWords(texts: Iterable<string>): { words: string[]; wordCounts: number[] } {
  const counts = new Map<string, number>();
  for (const text of texts) {
    for (const m of text.matchAll(BYTE_LEVEL_SPLIT)) counts.set(m[0], (counts.get(m[0]) ?? 0) + 1);
  }
  const words = [...counts.keys()].sort();
  return { words, wordCounts: words.map((w) => counts.get(w)!) };
}

/**
 * The words as symbol-id sequences, and for every adjacent pair of symbols (key a * V + b): its count over the
 * corpus, the words that hold it, and a max-heap of (count, pair) that merge() keeps up to date.
 */
class PairIndex {
  readonly pairCount = new Map<number, number>();
  private readonly where = new Map<number, Set<number>>();
  readonly heap = new PairHeap();

  constructor(
    private readonly syms: number[][],
    private readonly wordCounts: number[],
    private readonly V: number,
  ) {
    for (let w = 0; w < syms.length; w++) {
      const s = syms[w];
      for (let i = 0; i + 1 < s.length; i++) {
        const k = this.key(s[i], s[i + 1]);
        this.pairCount.set(k, (this.pairCount.get(k) ?? 0) + wordCounts[w]);
        this.holds(k, w);
      }
    }
    for (const [k, c] of this.pairCount) this.heap.push(c, k);
  }

  key(a: number, b: number): number {
    return a * this.V + b;
  }

  /** Pair k = (a, b) becomes symbol `merged` in every word that holds it; the changed pairs' counts go back on the heap. */
  merge(k: number, a: number, b: number, merged: number): void {
    const touched = new Set<number>();
    const affected = [...(this.where.get(k) ?? [])].sort((x, y) => x - y);
    for (const w of affected) {
      const s = this.syms[w];
      let has = false;
      for (let i = 0; i + 1 < s.length; i++)
        if (s[i] === a && s[i + 1] === b) {
          has = true;
          break;
        }
      if (!has) continue;
      for (let i = 0; i + 1 < s.length; i++) this.bump(this.key(s[i], s[i + 1]), -this.wordCounts[w], w, touched);
      const t: number[] = [];
      for (let i = 0; i < s.length; ) {
        if (i + 1 < s.length && s[i] === a && s[i + 1] === b) {
          t.push(merged);
          i += 2;
        } else {
          t.push(s[i]);
          i += 1;
        }
      }
      this.syms[w] = t;
      for (let i = 0; i + 1 < t.length; i++) this.bump(this.key(t[i], t[i + 1]), this.wordCounts[w], w, touched);
    }
    this.where.delete(k);
    this.pairCount.delete(k);
    touched.delete(k);
    for (const pk of [...touched].sort((x, y) => x - y)) {
      const pc = this.pairCount.get(pk)!;
      if (pc <= 0) this.pairCount.delete(pk);
      else this.heap.push(pc, pk);
    }
  }

  private holds(k: number, w: number): void {
    let set = this.where.get(k);
    if (!set) this.where.set(k, (set = new Set()));
    set.add(w);
  }

  private bump(pk: number, d: number, w: number, touched: Set<number>): void {
    this.pairCount.set(pk, (this.pairCount.get(pk) ?? 0) + d);
    touched.add(pk);
    if (d > 0) this.holds(pk, w);
  }
}

export function trainByteLevelBpe(
  texts: Iterable<string>,
  vocabSize: number,
  eos = "<|endoftext|>",
  pad = "<|pad|>",
  onProgress?: (ids: number, of: number) => void,
): BpeResult {
  if (!Number.isSafeInteger(vocabSize) || vocabSize < 258 || vocabSize > 1 << 20)
    throw new RangeError(`vocabSize ${vocabSize} must be in [258, 2^20]`);
  const b2u = bytesToUnicode();
  const enc = new TextEncoder();
  // 1. word counts over pre-tokens
  const { words, wordCounts } = countWords(texts);
  const syms: number[][] = words.map((w) => Array.from(enc.encode(w), (b) => b + 1));
  // 2. vocab: eos, bytes, (merges), pad
  const vocab: string[] = [eos, ...b2u];
  const ids = new Map<string, number>(vocab.map((t, i) => [t, i]));
  const V = vocabSize;
  const pairs = new PairIndex(syms, wordCounts, V);
  const merges: Array<[string, string]> = [];
  const limit = V - 1; // ids [0, V-1) for eos, bytes and merges; V-1 is pad
  while (vocab.length < limit && pairs.heap.size > 0) {
    const [c, k] = pairs.heap.pop();
    if (pairs.pairCount.get(k) !== c) continue; // stale heap entry
    if (c < 2) break;
    const a = Math.floor(k / V);
    const b = k - a * V;
    const str = vocab[a] + vocab[b];
    let nid = ids.get(str);
    if (nid === undefined) {
      nid = vocab.length;
      vocab.push(str);
      ids.set(str, nid);
    }
    merges.push([vocab[a], vocab[b]]);
    pairs.merge(k, a, b, nid);
    if (onProgress && merges.length % 64 === 0) onProgress(vocab.length, limit);
  }
  if (vocab.length < limit)
    throw new Error(
      `BPE training ran out of pairs at ${vocab.length} ids; the corpus is too small for vocab ${vocabSize}`,
    );
  vocab.push(pad);
  return { vocab, merges, eosId: 0, padId: V - 1 };
}

const BYTE_LEVEL = (addPrefix: boolean, trim: boolean): string =>
  `{"type":"ByteLevel","add_prefix_space":${addPrefix},"trim_offsets":${trim},"use_regex":true}`;

function addedToken(id: number, content: string): string {
  return `{"id":${id},"content":${JSON.stringify(content)},"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}`;
}

/** The HF tokenizer.json text (deterministic: vocab keys in id order, merges in merge order). */
export function tokenizerJson(r: BpeResult): string {
  const vocab = r.vocab.map((t, i) => `    ${JSON.stringify(t)}: ${i}`).join(",\n");
  const merges = r.merges.map(([a, b]) => `    ${JSON.stringify(`${a} ${b}`)}`).join(",\n");
  return [
    "{",
    `  "version": "1.0",`,
    `  "truncation": null,`,
    `  "padding": null,`,
    `  "added_tokens": [\n    ${addedToken(r.eosId, r.vocab[r.eosId])},\n    ${addedToken(r.padId, r.vocab[r.padId])}\n  ],`,
    `  "normalizer": null,`,
    `  "pre_tokenizer": ${BYTE_LEVEL(false, true)},`,
    `  "post_processor": ${BYTE_LEVEL(true, false)},`,
    `  "decoder": ${BYTE_LEVEL(true, true)},`,
    `  "model": {`,
    `    "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,`,
    `    "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,`,
    `    "vocab": {\n${vocab}\n    },`,
    `    "merges": [\n${merges}\n    ]`,
    `  }`,
    "}",
    "",
  ].join("\n");
}

/** tokenizer_config.json for transformers' AutoTokenizer and for @huggingface/tokenizers' second argument. */
export function tokenizerConfigJson(r: BpeResult, modelMaxLength = 2048): string {
  const eos = r.vocab[r.eosId];
  const pad = r.vocab[r.padId];
  return `${JSON.stringify(
    {
      tokenizer_class: "PreTrainedTokenizerFast",
      bos_token: eos,
      eos_token: eos,
      unk_token: eos,
      pad_token: pad,
      add_prefix_space: false,
      clean_up_tokenization_spaces: false,
      model_max_length: modelMaxLength,
      added_tokens_decoder: {
        [String(r.eosId)]: {
          content: eos,
          lstrip: false,
          normalized: false,
          rstrip: false,
          single_word: false,
          special: true,
        },
        [String(r.padId)]: {
          content: pad,
          lstrip: false,
          normalized: false,
          rstrip: false,
          single_word: false,
          special: true,
        },
      },
    },
    null,
    2,
  )}\n`;
}

export function specialTokensMapJson(r: BpeResult): string {
  const eos = r.vocab[r.eosId];
  return `${JSON.stringify({ bos_token: eos, eos_token: eos, unk_token: eos, pad_token: r.vocab[r.padId] }, null, 2)}\n`;
}
