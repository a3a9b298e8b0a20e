/**
 * The identity of a tokenizer's ids (G11): sha256 over its vocabulary, every (token, id) in id order. Two
 * tokenizers with the same hash map every id to the same token, however their files are formatted; one whose
 * ids were shuffled (same size, same tokens) has another. The export records it (run_summary.json) and
 * `generate` compares the tokenizer it is given against it.
 */
import { createHash } from "node:crypto";

export function vocabSha256(vocab: Map<string, number> | Record<string, number>): string {
  const entries = (vocab instanceof Map ? [...vocab.entries()] : Object.entries(vocab)).sort(
    (a, b) => a[1] - b[1] || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0),
  );
  return createHash("sha256").update(JSON.stringify(entries)).digest("hex");
}
