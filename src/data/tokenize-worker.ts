/**
 * Piscina task for `prepare`: encode a batch of documents with @huggingface/tokenizers.
 * Input: TokenizeTask. Output: one transferred Uint32Array laid out as
 *   [nDocs, len_0, …, len_{nDocs-1}, ids of doc 0 …, ids of doc 1 …, …]   (no EOS: the writer adds it).
 * The tokenizer is built once per worker thread and reused for every task.
 */
import * as fs from "node:fs";
import { move } from "piscina";
import { Tokenizer } from "@huggingface/tokenizers";

export interface TokenizeTask {
  tokenizerPath: string;
  configPath: string | null;
  vocabSize: number;
  texts: string[];
  firstDoc: number;
}

let cached: { key: string; tk: Tokenizer } | null = null;

function load(t: TokenizeTask): Tokenizer {
  const key = `${t.tokenizerPath}\0${t.configPath ?? ""}`;
  if (cached && cached.key === key) return cached.tk;
  const json = JSON.parse(fs.readFileSync(t.tokenizerPath, "utf8"));
  const cfg = t.configPath ? JSON.parse(fs.readFileSync(t.configPath, "utf8")) : {};
  const tk = new Tokenizer(json, cfg);
  cached = { key, tk };
  return tk;
}

export default function tokenize(t: TokenizeTask): Uint32Array {
  const tk = load(t);
  const per: number[][] = [];
  let total = 0;
  for (let d = 0; d < t.texts.length; d++) {
    const ids = tk.encode(t.texts[d], { add_special_tokens: false }).ids;
    for (let i = 0; i < ids.length; i++) {
      const v = ids[i];
      if (!Number.isInteger(v) || v < 0 || v >= t.vocabSize) {
        throw new Error(
          `document #${t.firstDoc + d}: the tokenizer produced id ${String(v)} outside [0, ${t.vocabSize}) (token ${JSON.stringify(tk.encode(t.texts[d], { add_special_tokens: false }).tokens[i])}); the tokenizer has no unk token for it`,
        );
      }
    }
    per.push(ids);
    total += ids.length;
  }
  const n = per.length;
  const out = new Uint32Array(1 + n + total);
  out[0] = n;
  let o = 1 + n;
  for (let d = 0; d < n; d++) {
    out[1 + d] = per[d].length;
    out.set(per[d], o);
    o += per[d].length;
  }
  return move(out) as Uint32Array;
}
