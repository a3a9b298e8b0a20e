/**
 * The model's shape: the frozen recipe (M1), its variants (M2), the parameter count (M3) and the
 * Hugging Face `config.json` that goes with every export (M7).
 */
import { type Fix, type FixWay, UserError } from "../errors";

export interface LlamaConfig {
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  ropeTheta: number;
  rmsNormEps: number;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: true;
  padTokenId: number;
  eosTokenId: number;
}

/** M1: the frozen shape. Only --layers / --hidden (and the demo's vocabulary) ever differ from it. */
export const FROZEN = {
  hidden: 576,
  layers: 22,
  heads: 9,
  kvHeads: 3,
  ffn: 1536,
  vocab: 49152,
  ropeTheta: 10000,
  rmsEps: 1e-5,
} as const;

function positiveInt(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v) && v > 0;
}

/** M2: the ffn width of a model of width `h`: the frozen one's at the frozen width, else floor(round(8h/3)/64)*64. */
function ffnWidth(h: number): number {
  return h === FROZEN.hidden ? FROZEN.ffn : Math.floor(Math.round((8 * h) / 3) / 64) * 64;
}

/**
 * M2: why `h` is no model width, or null when it is one: a width splits into the 9 heads, each head's width is even
 * (RoPE rotates pairs), and the ffn width is positive. The widths are so the multiples of 18 from 36 on.
 */
function widthProblem(h: number): string | null {
  const heads = FROZEN.heads;
  if (h % heads !== 0)
    return `cannot be split into ${heads} attention heads: the width must be a multiple of ${heads} (heads are fixed at ${heads})`;
  if ((h / heads) % 2 !== 0)
    return `gives head_dim ${h / heads}, which is odd: RoPE rotates head_dim/2 pairs, so the width must be a multiple of ${2 * heads}`;
  if (ffnWidth(h) <= 0) return `gives an ffn width of ${ffnWidth(h)} (floor(round(8w/3)/64)*64)`;
  return null;
}

/** The widths nearest `h` below and above it that pass every rule of widthProblem, as the flags that give them. */
function nearWidths(h: number): Fix {
  const ok = (w: number) => w > 0 && widthProblem(w) === null;
  let lo = Math.floor(h);
  while (lo > 0 && !ok(lo)) lo--;
  let hi = Math.max(1, Math.ceil(h));
  while (!ok(hi)) hi++;
  const hidden = (w: number, why?: string): FixWay => ({ changes: [["--hidden", String(w)]], why });
  return { ways: lo > 0 ? [hidden(lo), hidden(hi)] : [hidden(hi, "the narrowest width there is")] };
}

/**
 * M2, exactly like the seed's `build_config`: the GQA ratio and ffn width belong to the frozen width,
 * so `--layers 20` keeps 9/3 heads and ffn 1536, while another width w takes
 * ffn = floor(round(8w/3)/64)*64 and kv = the largest divisor of 9 that is <= max(1, floor(w/64)).
 */
export function buildConfig(o: { seqLen: number; layers?: number; hidden?: number; vocabSize?: number }): LlamaConfig {
  if (!positiveInt(o.seqLen) || o.seqLen < 2) {
    throw new UserError(
      "M1",
      `seq_len ${o.seqLen} is not an integer >= 2: the causal-LM loss needs at least one predicted position; run `,
      { ways: [{ changes: [["--seq-len", "1024"]], why: "the frozen value; any integer >= 2 works" }] },
    );
  }
  const layers = o.layers ?? FROZEN.layers;
  const h = o.hidden ?? FROZEN.hidden;
  const vocab = o.vocabSize ?? FROZEN.vocab;
  if (!positiveInt(layers)) {
    throw new UserError("M2", `--layers ${layers} is not a positive integer; run `, {
      ways: [{ changes: [["--layers", String(FROZEN.layers)]], why: "frozen" }],
    });
  }
  if (!positiveInt(h)) {
    throw new UserError("M2", `--hidden ${h} is not a positive integer; run `, {
      ways: [{ changes: [["--hidden", String(FROZEN.hidden)]], why: "frozen" }],
    });
  }
  if (!positiveInt(vocab) || vocab < 2) {
    throw new UserError("M2", `vocab size ${vocab} is not an integer >= 2 (pad = vocab-1 and eos = 0 must differ)`);
  }
  const heads = FROZEN.heads;
  const why = widthProblem(h);
  if (why) throw new UserError("M2", `--hidden ${h} ${why}; run `, nearWidths(h));
  const headDim = h / heads;
  const frozenWidth = h === FROZEN.hidden;
  const inter = ffnWidth(h);
  let kv: number = FROZEN.kvHeads;
  if (!frozenWidth) {
    const cap = Math.min(Math.max(1, Math.floor(h / 64)), heads);
    kv = 1;
    for (let d = 1; d <= cap; d++) if (heads % d === 0) kv = d;
  }
  return {
    vocabSize: vocab,
    hiddenSize: h,
    intermediateSize: inter,
    numLayers: layers,
    numHeads: heads,
    numKvHeads: kv,
    headDim,
    ropeTheta: FROZEN.ropeTheta,
    rmsNormEps: FROZEN.rmsEps,
    maxPositionEmbeddings: o.seqLen,
    tieWordEmbeddings: true,
    padTokenId: vocab - 1,
    eosTokenId: 0,
  };
}

/**
 * M3, as torch counts it: `model.parameters()` yields the tied embedding ONCE, so the numel sum and
 * the unique count agree (106,194,240 for the frozen shape) and every parameter is trainable.
 */
export function countParams(c: LlamaConfig): { sum_numel: number; unique: number; trainable: number } {
  const D = c.hiddenSize,
    qd = c.numHeads * c.headDim,
    kvd = c.numKvHeads * c.headDim,
    F = c.intermediateSize;
  const perLayer = 2 * D + D * qd + 2 * D * kvd + qd * D + 3 * D * F;
  const n = c.vocabSize * D + c.numLayers * perLayer + D;
  return { sum_numel: n, unique: n, trainable: n };
}

/** M7: the `config.json` of an HF model folder, loadable by `transformers` as a LlamaConfig. */
export function hfConfigJson(c: LlamaConfig): Record<string, unknown> {
  return {
    architectures: ["LlamaForCausalLM"],
    model_type: "llama",
    vocab_size: c.vocabSize,
    hidden_size: c.hiddenSize,
    intermediate_size: c.intermediateSize,
    num_hidden_layers: c.numLayers,
    num_attention_heads: c.numHeads,
    num_key_value_heads: c.numKvHeads,
    head_dim: c.headDim,
    hidden_act: "silu",
    max_position_embeddings: c.maxPositionEmbeddings,
    rms_norm_eps: c.rmsNormEps,
    rope_theta: c.ropeTheta,
    rope_scaling: null,
    tie_word_embeddings: true,
    attention_bias: false,
    mlp_bias: false,
    attention_dropout: 0.0,
    pad_token_id: c.padTokenId,
    eos_token_id: c.eosTokenId,
    torch_dtype: "float32",
  };
}

/**
 * Reads an HF Llama `config.json` back. Everything this implementation cannot compute (biases,
 * another activation, untied embeddings, rope scaling) is refused naming the key. pad/eos default to
 * the recipe's (vocab-1, 0) when the file does not carry them.
 */
export function configFromHf(j: Record<string, unknown>): LlamaConfig {
  const bad = (key: string, why: string): never => {
    throw new UserError(
      "M7",
      `config.json key "${key}" = ${JSON.stringify(j[key])}: ${why}; export the model with this trainer or fix the key`,
    );
  };
  const int = (key: string): number =>
    positiveInt(j[key]) ? (j[key] as number) : bad(key, "must be a positive integer");
  const num = (key: string): number =>
    typeof j[key] === "number" && Number.isFinite(j[key]) && (j[key] as number) > 0
      ? (j[key] as number)
      : bad(key, "must be a positive number");
  if (j.model_type !== undefined && j.model_type !== "llama") bad("model_type", 'must be "llama"');
  if (
    j.architectures !== undefined &&
    !(Array.isArray(j.architectures) && j.architectures.includes("LlamaForCausalLM"))
  ) {
    bad("architectures", 'must contain "LlamaForCausalLM"');
  }
  if (j.tie_word_embeddings !== true)
    bad("tie_word_embeddings", "must be true (this model ties input and output embeddings, M1)");
  if (j.hidden_act !== undefined && j.hidden_act !== "silu") bad("hidden_act", 'must be "silu" (SwiGLU, M1)');
  if (j.attention_bias !== undefined && j.attention_bias !== false)
    bad("attention_bias", "must be false (no biases, M1)");
  if (j.mlp_bias !== undefined && j.mlp_bias !== false) bad("mlp_bias", "must be false (no biases, M1)");
  if (j.rope_scaling !== undefined && j.rope_scaling !== null) bad("rope_scaling", "must be null (plain RoPE, M4)");
  if (j.attention_dropout !== undefined && j.attention_dropout !== 0) bad("attention_dropout", "must be 0 (M1)");
  const vocabSize = int("vocab_size"),
    hiddenSize = int("hidden_size"),
    numHeads = int("num_attention_heads");
  const numKvHeads = j.num_key_value_heads === undefined ? numHeads : int("num_key_value_heads");
  if (numHeads % numKvHeads !== 0) bad("num_key_value_heads", `must divide num_attention_heads (${numHeads})`);
  const headDim = j.head_dim === undefined || j.head_dim === null ? hiddenSize / numHeads : int("head_dim");
  if (!Number.isInteger(headDim) || headDim * numHeads !== hiddenSize)
    bad("head_dim", `head_dim * num_attention_heads must equal hidden_size ${hiddenSize}`);
  if (headDim % 2 !== 0) bad("head_dim", "must be even (RoPE rotates pairs)");
  const tokenId = (key: string, dflt: number): number => {
    const v = j[key];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v >= vocabSize)
      bad(key, `must be a token id in [0, ${vocabSize})`);
    return v as number;
  };
  return {
    vocabSize,
    hiddenSize,
    intermediateSize: int("intermediate_size"),
    numLayers: int("num_hidden_layers"),
    numHeads,
    numKvHeads,
    headDim,
    ropeTheta: num("rope_theta"),
    rmsNormEps: num("rms_norm_eps"),
    maxPositionEmbeddings: int("max_position_embeddings"),
    tieWordEmbeddings: true,
    padTokenId: tokenId("pad_token_id", vocabSize - 1),
    eosTokenId: tokenId("eos_token_id", 0),
  };
}
