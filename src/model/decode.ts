/**
 * Text generation for the Llama of llama.ts, on the same Kernels and the same flat weights (layout.ts).
 *
 * KvDecoder feeds ONE position per call through the model's own forward with a key/value cache
 * (Llama.forwardCached: the training forward's ops for the new position; attention over the cache through the
 * kernels' attentionCachedForward), so each new token costs one position's work plus attention over the cache,
 * not a forward over the whole sequence.
 *
 * Decoding (pickToken): greedy (temperature 0), or sampling with temperature, top-k and top-p from a seeded
 * PRNG (mulberry32), so a seed gives the same text on every machine.
 */
import { UserError } from "../errors";
import type { LlamaConfig } from "./llama-config";
import type { Kernels } from "./kernels";
import { KvCache, Llama } from "./llama";

export class KvDecoder {
  readonly cfg: LlamaConfig;
  private readonly model: Llama;
  private readonly cache: KvCache;
  private readonly ids = new Int32Array(1);

  constructor(cfg: LlamaConfig, kernels: Kernels, params: Float32Array, maxLen: number) {
    if (!Number.isInteger(maxLen) || maxLen < 1)
      throw new RangeError(`KvDecoder: maxLen ${maxLen} must be a positive integer`);
    this.cfg = cfg;
    this.model = new Llama(cfg, kernels, { gradCkpt: false });
    this.model.bindParams(params);
    this.cache = new KvCache(cfg, maxLen);
  }

  /** Positions filled so far (the next token goes to position `pos`). */
  get pos(): number {
    return this.cache.length;
  }

  /** Forget the cache (a new sequence). */
  reset(): void {
    this.cache.reset();
  }

  /** Feeds the token at position `pos`; returns the logits [V] for the next token. */
  step(id: number): Float32Array {
    const V = this.cfg.vocabSize;
    if (!Number.isInteger(id) || id < 0 || id >= V)
      throw new UserError("M4", `token id ${id} is outside the vocabulary [0, ${V})`);
    this.ids[0] = id;
    return this.model.forwardCached(this.ids, this.cache);
  }
}

// ---------------------------------------------------------------------------------------------
// decoding

export interface SamplingOptions {
  /** 0 = greedy (argmax). */
  temperature: number;
  /** 0 = no top-k cut. */
  topK: number;
  /** 1 = no nucleus cut. */
  topP: number;
  seed: number;
}

export const GREEDY: SamplingOptions = { temperature: 0, topK: 0, topP: 1, seed: 0 };

/** mulberry32: a small seeded PRNG with a fixed definition, uniform in [0, 1). */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** G11: the sampling options in range, each refusal with the value that works (the option's "off" or default). */
export function checkSampling(o: SamplingOptions): void {
  if (!(Number.isFinite(o.temperature) && o.temperature >= 0))
    throw new UserError("G11", `--temperature ${o.temperature} must be a number >= 0 (0 = greedy): run `, {
      ways: [
        { changes: [["--temperature", "0"]], why: "greedy" },
        { changes: [["--temperature", "0.8"]], why: "to sample" },
      ],
    });
  if (!(Number.isInteger(o.topK) && o.topK >= 0))
    throw new UserError("G11", `--top-k ${o.topK} must be a whole number >= 0 (0 = off): run `, {
      ways: [{ changes: [["--top-k", String(Number.isFinite(o.topK) && o.topK > 0 ? Math.floor(o.topK) : 0)]] }],
    });
  if (!(Number.isFinite(o.topP) && o.topP > 0 && o.topP <= 1))
    throw new UserError("G11", `--top-p ${o.topP} must be in (0, 1] (1 = off): run `, {
      ways: [
        { changes: [["--top-p", "1"]], why: "off" },
        { changes: [["--top-p", "0.9"]], why: "the 90% most likely" },
      ],
    });
  if (!Number.isSafeInteger(o.seed))
    throw new UserError("G11", `--seed ${o.seed} must be a whole number: run `, {
      ways: [
        {
          changes: [["--seed", String(Number.isFinite(o.seed) && Math.abs(o.seed) < 2 ** 53 ? Math.floor(o.seed) : 0)]],
        },
      ],
    });
}

/** The next token from logits [V]: argmax when temperature is 0 (lowest id on ties), else a seeded draw. */
export function pickToken(logits: Float32Array, o: SamplingOptions, rand: () => number): number {
  const V = logits.length;
  if (o.temperature === 0) {
    let best = 0;
    for (let i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
    return best;
  }
  // candidates by descending logit (ties: lower id first), cut by top-k
  let idx = Array.from({ length: V }, (_, i) => i).sort((a, b) => logits[b] - logits[a] || a - b);
  if (o.topK > 0 && o.topK < V) idx = idx.slice(0, o.topK);
  const mx = logits[idx[0]];
  const w = idx.map((i) => Math.exp((logits[i] - mx) / o.temperature));
  let total = w.reduce((a, b) => a + b, 0);
  if (o.topP < 1) {
    // nucleus: the smallest prefix whose probability reaches top_p
    let cum = 0,
      n = 0;
    while (n < w.length) {
      cum += w[n] / total;
      n++;
      if (cum >= o.topP) break;
    }
    idx = idx.slice(0, n);
    w.length = n;
    total = w.reduce((a, b) => a + b, 0);
  }
  let r = rand() * total;
  for (let i = 0; i < idx.length; i++) {
    r -= w[i];
    if (r < 0) return idx[i];
  }
  return idx[idx.length - 1];
}

export interface GenerateOptions extends SamplingOptions {
  maxNewTokens: number;
  /** Stop after this id (not emitted); null = never. */
  eosId: number | null;
  /** Called with each new token as it is chosen. */
  onToken?: (id: number) => void;
}

/** The next-token logits of a whole prefix: the KV decoder, or any full forward (the no-cache path). */
export type LogitsFn = (ids: number[]) => Float32Array;

/** Generates with a KV cache: the prompt is fed once, then one position per new token. */
export function generateWithCache(dec: KvDecoder, prompt: number[], o: GenerateOptions): number[] {
  if (prompt.length === 0) throw new UserError("G11", "the prompt is empty: give at least one token");
  dec.reset();
  let logits: Float32Array = new Float32Array(0);
  for (const id of prompt) logits = dec.step(id);
  return decodeLoop(o, logits, (id) => dec.step(id));
}

/** Generates without a cache: every new token runs the full forward over the whole sequence (reference). */
export function generateNoCache(full: LogitsFn, prompt: number[], o: GenerateOptions): number[] {
  if (prompt.length === 0) throw new UserError("G11", "the prompt is empty: give at least one token");
  const seq = [...prompt];
  return decodeLoop(o, full(seq), (id) => {
    seq.push(id);
    return full(seq);
  });
}

function decodeLoop(o: GenerateOptions, first: Float32Array, next: (id: number) => Float32Array): number[] {
  checkSampling(o);
  const rand = seededRandom(o.seed);
  const out: number[] = [];
  let logits = first;
  for (let i = 0; i < o.maxNewTokens; i++) {
    const id = pickToken(logits, o, rand);
    if (o.eosId !== null && id === o.eosId) break;
    out.push(id);
    o.onToken?.(id);
    if (i + 1 < o.maxNewTokens) logits = next(id);
  }
  return out;
}
