/**
 * A synthetic mix (the format of data/manifest.ts) whose tokens follow a learnable pattern, for the benchmarks
 * (`npm run bench` measures on it when no prepared mix is given) and the tests (test/helpers/mix.ts).
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { createHash } from "node:crypto";

export interface SyntheticMix {
  root: string;
  vocab: number;
  trainTokens: number;
  valTokens: number;
}

/**
 * Tokens follow a learnable pattern (each token is a function of the previous one, with noise) so a
 * few steps visibly lower the loss; `vocab` ids, EOS 0. Written into `dir`.
 */
export function writeSyntheticMix(o: {
  vocab?: number;
  trainTokens?: number;
  valTokens?: number;
  shards?: number;
  seed?: number;
  dir: string;
}): SyntheticMix {
  const vocab = o.vocab ?? 64;
  const trainTokens = o.trainTokens ?? 64 * 1024;
  const valTokens = o.valTokens ?? 2048;
  const nShards = o.shards ?? 2;
  const root = o.dir;
  fs.mkdirSync(root, { recursive: true });
  let state = (o.seed ?? 7) >>> 0; // the linear congruential generator of test/helpers/numeric.ts (lcg)
  const rnd = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state;
  };
  const gen = (n: number) => {
    const a = new Uint16Array(n);
    let prev = 1;
    for (let i = 0; i < n; i++) {
      const r = rnd();
      prev = r % 8 === 0 ? 1 + ((r >>> 8) % (vocab - 1)) : 1 + ((prev * 7 + 3) % (vocab - 1));
      a[i] = prev;
    }
    return a;
  };
  const write = (file: string, a: Uint16Array) => {
    const buf = Buffer.from(a.buffer, a.byteOffset, a.byteLength);
    fs.writeFileSync(path.join(root, file), buf);
    return { file, tokens: a.length, sha256: createHash("sha256").update(buf).digest("hex") };
  };
  const shards = [];
  const per = Math.floor(trainTokens / nShards);
  for (let i = 0; i < nShards; i++)
    shards.push(
      write(
        `train_${String(i).padStart(5, "0")}.bin`,
        gen(i === nShards - 1 ? trainTokens - per * (nShards - 1) : per),
      ),
    );
  const val = [write("val_00000.bin", gen(valTokens))];
  const manifest = {
    format_version: 1,
    dtype: "uint16",
    total_tokens: trainTokens,
    shards,
    val_shards: val,
    val_total_tokens: valTokens,
    eos_id: 0,
    vocab_size: vocab,
    tokenizer_files: [],
  };
  fs.writeFileSync(path.join(root, "manifest.json"), JSON.stringify(manifest, null, 1));
  return { root, vocab, trainTokens, valTokens };
}
