/**
 * Text generation for the Llama of llama.ts, on the same Kernels and the same flat weights (layout.ts).
 *
 * KvDecoder runs ONE position per call, llm.c style, with a key/value cache, so each new token costs one
 * position's work (plus attention over the cache), not a forward over the whole sequence:
 *   x = embed(id);  per layer:  h = rmsnorm(x); q,k,v = h @ Wq^T, Wk^T, Wv^T; rope(q, k) at position p;
 *   k, v -> cache[p];  o = attention of the one query over cache[0..p];  x += o @ Wo^T;
 *   h = rmsnorm(x);  x += (silu(h @ Wg^T) * (h @ Wu^T)) @ Wd^T;   then logits = rmsnorm(x) @ E^T (tied head).
 * The single-query attention mirrors the JS kernel's arithmetic (float32 scores, softmax in float64).
 *
 * Decoding (pickToken): greedy (temperature 0), or sampling with temperature, top-k and top-p from a seeded
 * PRNG (mulberry32), so a seed gives the same text on every machine.
 *
 * Shape legend: D hidden, H query heads, K kv heads, E head_dim, F ffn width, V vocab, S cache length.
 */
import { UserError } from "../errors";
import type { LlamaConfig } from "./llama-config";
import type { Kernels } from "./kernels";
import { paramLayout } from "./layout";
import { ropeTables } from "./llama";

interface LayerW {
  inputNorm: Float32Array;
  wq: Float32Array;
  wk: Float32Array;
  wv: Float32Array;
  wo: Float32Array;
  postAttnNorm: Float32Array;
  wGate: Float32Array;
  wUp: Float32Array;
  wDown: Float32Array;
}

export class KvDecoder {
  readonly cfg: LlamaConfig;
  /** Positions filled so far (the next token goes to position `pos`). */
  pos = 0;
  private readonly k: Kernels;
  private readonly maxLen: number;
  private readonly emb: Float32Array;
  private readonly normF: Float32Array;
  private readonly layers: LayerW[];
  private readonly kc: Float32Array[]; // per layer [S, K*E]
  private readonly vc: Float32Array[];
  private readonly cos: Float32Array;
  private readonly sin: Float32Array;
  // one position's scratch
  private readonly x: Float32Array;
  private readonly h: Float32Array;
  private readonly rstd = new Float32Array(1);
  private readonly q: Float32Array;
  private readonly o: Float32Array;
  private readonly gate: Float32Array;
  private readonly up: Float32Array;
  private readonly swiglu: Float32Array;
  private readonly scores: Float32Array;
  private readonly acc: Float64Array;
  private readonly ids = new Int32Array(1);
  readonly logits: Float32Array;

  constructor(cfg: LlamaConfig, kernels: Kernels, params: Float32Array, maxLen: number) {
    const { entries, total } = paramLayout(cfg);
    if (params.length !== total)
      throw new RangeError(`KvDecoder: params has ${params.length} floats, the layout needs ${total}`);
    if (!Number.isInteger(maxLen) || maxLen < 1)
      throw new RangeError(`KvDecoder: maxLen ${maxLen} must be a positive integer`);
    this.cfg = cfg;
    this.k = kernels;
    this.maxLen = maxLen;
    const at = new Map(entries.map((e) => [e.name, e]));
    const w = (n: string): Float32Array => {
      const e = at.get(n)!;
      return params.subarray(e.offset, e.offset + e.size);
    };
    this.emb = w("model.embed_tokens.weight");
    this.normF = w("model.norm.weight");
    this.layers = [];
    for (let l = 0; l < cfg.numLayers; l++) {
      const p = `model.layers.${l}.`;
      this.layers.push({
        inputNorm: w(`${p}input_layernorm.weight`),
        wq: w(`${p}self_attn.q_proj.weight`),
        wk: w(`${p}self_attn.k_proj.weight`),
        wv: w(`${p}self_attn.v_proj.weight`),
        wo: w(`${p}self_attn.o_proj.weight`),
        postAttnNorm: w(`${p}post_attention_layernorm.weight`),
        wGate: w(`${p}mlp.gate_proj.weight`),
        wUp: w(`${p}mlp.up_proj.weight`),
        wDown: w(`${p}mlp.down_proj.weight`),
      });
    }
    const D = cfg.hiddenSize,
      H = cfg.numHeads,
      K = cfg.numKvHeads,
      E = cfg.headDim,
      F = cfg.intermediateSize;
    this.kc = this.layers.map(() => new Float32Array(maxLen * K * E));
    this.vc = this.layers.map(() => new Float32Array(maxLen * K * E));
    ({ cos: this.cos, sin: this.sin } = ropeTables(maxLen, E, cfg.ropeTheta));
    this.x = new Float32Array(D);
    this.h = new Float32Array(D);
    this.q = new Float32Array(H * E);
    this.o = new Float32Array(H * E);
    this.gate = new Float32Array(F);
    this.up = new Float32Array(F);
    this.swiglu = new Float32Array(F);
    this.scores = new Float32Array(maxLen);
    this.acc = new Float64Array(E);
    this.logits = new Float32Array(cfg.vocabSize);
  }

  /** Forget the cache (a new sequence). */
  reset(): void {
    this.pos = 0;
  }

  /** Feeds the token at position `pos`; returns the logits [V] for the next token (a view, valid until the next call). */
  step(id: number): Float32Array {
    const c = this.cfg,
      k = this.k,
      D = c.hiddenSize,
      H = c.numHeads,
      K = c.numKvHeads,
      E = c.headDim,
      F = c.intermediateSize,
      V = c.vocabSize;
    if (!Number.isInteger(id) || id < 0 || id >= V)
      throw new UserError("M4", `token id ${id} is outside the vocabulary [0, ${V})`);
    const p = this.pos;
    if (p >= this.maxLen)
      throw new UserError(
        "M1",
        `the sequence reached the model's ${this.maxLen} positions (max_position_embeddings); ask for fewer new tokens`,
      );
    const half = E / 2,
      cos = this.cos.subarray(p * half, (p + 1) * half),
      sin = this.sin.subarray(p * half, (p + 1) * half);
    this.ids[0] = id;
    k.embeddingForward(this.x, this.ids, this.emb, 1, D);
    for (let l = 0; l < c.numLayers; l++) {
      const W = this.layers[l];
      const kp = this.kc[l].subarray(p * K * E, (p + 1) * K * E),
        vp = this.vc[l].subarray(p * K * E, (p + 1) * K * E);
      // ---- attention: x += o_proj(attn(rope(qkv(norm1(x)))))
      k.rmsnormForward(this.h, this.rstd, this.x, W.inputNorm, 1, D, c.rmsNormEps);
      k.matmul(false, true, 1, H * E, D, 1, this.h, W.wq, 0, this.q);
      k.matmul(false, true, 1, K * E, D, 1, this.h, W.wk, 0, kp);
      k.matmul(false, true, 1, K * E, D, 1, this.h, W.wv, 0, vp);
      k.ropeForward(this.q, cos, sin, 1, 1, H, E);
      k.ropeForward(kp, cos, sin, 1, 1, K, E);
      this.attendOne(this.kc[l], this.vc[l], p);
      k.matmul(false, true, 1, D, H * E, 1, this.o, W.wo, 1, this.x);
      // ---- MLP: x += down(silu(gate(h)) * up(h)), h = norm2(x)
      k.rmsnormForward(this.h, this.rstd, this.x, W.postAttnNorm, 1, D, c.rmsNormEps);
      k.matmul(false, true, 1, F, D, 1, this.h, W.wGate, 0, this.gate);
      k.matmul(false, true, 1, F, D, 1, this.h, W.wUp, 0, this.up);
      k.swigluForward(this.swiglu, this.gate, this.up, F);
      k.matmul(false, true, 1, D, F, 1, this.swiglu, W.wDown, 1, this.x);
    }
    k.rmsnormForward(this.h, this.rstd, this.x, this.normF, 1, D, c.rmsNormEps);
    k.matmul(false, true, 1, V, D, 1, this.h, this.emb, 0, this.logits);
    this.pos = p + 1;
    return this.logits;
  }

  /** o[h] = softmax(q[h] . cache_k[0..p] / sqrt(E)) @ cache_v[0..p], kv head j = floor(h*K/H). */
  private attendOne(kc: Float32Array, vc: Float32Array, p: number): void {
    const c = this.cfg,
      H = c.numHeads,
      K = c.numKvHeads,
      E = c.headDim,
      scale = 1 / Math.sqrt(E),
      sc = this.scores,
      acc = this.acc;
    for (let h = 0; h < H; h++) {
      const j = Math.floor((h * K) / H),
        qo = h * E;
      let mx = -Infinity;
      for (let u = 0; u <= p; u++) {
        const ko = (u * K + j) * E;
        let s = 0;
        for (let e = 0; e < E; e++) s += this.q[qo + e] * kc[ko + e];
        s *= scale;
        sc[u] = s;
        if (sc[u] > mx) mx = sc[u];
      }
      let sum = 0;
      for (let u = 0; u <= p; u++) sum += Math.exp(sc[u] - mx);
      for (let u = 0; u <= p; u++) sc[u] = Math.exp(sc[u] - mx) / sum;
      acc.fill(0);
      for (let u = 0; u <= p; u++) {
        const pr = sc[u],
          vo = (u * K + j) * E;
        for (let e = 0; e < E; e++) acc[e] += pr * vc[vo + e];
      }
      for (let e = 0; e < E; e++) this.o[qo + e] = acc[e];
    }
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

export function checkSampling(o: SamplingOptions): void {
  if (!(Number.isFinite(o.temperature) && o.temperature >= 0))
    throw new UserError("G11", `--temperature ${o.temperature} must be a number >= 0 (0 = greedy)`);
  if (!(Number.isInteger(o.topK) && o.topK >= 0))
    throw new UserError("G11", `--top-k ${o.topK} must be a whole number >= 0 (0 = off)`);
  if (!(Number.isFinite(o.topP) && o.topP > 0 && o.topP <= 1))
    throw new UserError("G11", `--top-p ${o.topP} must be in (0, 1] (1 = off)`);
  if (!Number.isSafeInteger(o.seed)) throw new UserError("G11", `--seed ${o.seed} must be a whole number`);
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
