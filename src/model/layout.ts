/**
 * THE flat parameter layout. Master weights, gradients and Adam moments are Float32Arrays in this
 * order; every other module (safetensors export, optimizer, shared memory) indexes through it.
 * Order: embed_tokens, then per layer input_layernorm, q, k, v, o, post_attention_layernorm,
 * gate, up, down; then model.norm. Shapes are HF's ([out, in] for projections). No lm_head (tied).
 * The model reads q, k, v (and gate, up) as separate matrices, one product each (llama.ts: fwd, run as one matmuls list).
 *
 * LAYER_TENSORS is the one place a decoder layer's tensors are named: its HF name, its shape, and the key
 * the model binds it under (weightBinder: views into a flat array, the weights or their gradients).
 */
import type { LlamaConfig } from "./llama-config";

export interface ParamEntry {
  name: string;
  shape: number[];
  offset: number;
  size: number;
  /** P3: decoupled weight decay applies to 2-D weights only (not the norm weights). */
  decay: boolean;
}

/** A decoder layer's tensors in layout order: the key the model uses, the HF name after `model.layers.<i>.`, the shape. */
const LAYER_TENSORS = [
  { key: "inputNorm", name: "input_layernorm.weight", shape: (c: LlamaConfig) => [c.hiddenSize] },
  { key: "wq", name: "self_attn.q_proj.weight", shape: (c: LlamaConfig) => [c.numHeads * c.headDim, c.hiddenSize] },
  { key: "wk", name: "self_attn.k_proj.weight", shape: (c: LlamaConfig) => [c.numKvHeads * c.headDim, c.hiddenSize] },
  { key: "wv", name: "self_attn.v_proj.weight", shape: (c: LlamaConfig) => [c.numKvHeads * c.headDim, c.hiddenSize] },
  { key: "wo", name: "self_attn.o_proj.weight", shape: (c: LlamaConfig) => [c.hiddenSize, c.numHeads * c.headDim] },
  { key: "postAttnNorm", name: "post_attention_layernorm.weight", shape: (c: LlamaConfig) => [c.hiddenSize] },
  { key: "wGate", name: "mlp.gate_proj.weight", shape: (c: LlamaConfig) => [c.intermediateSize, c.hiddenSize] },
  { key: "wUp", name: "mlp.up_proj.weight", shape: (c: LlamaConfig) => [c.intermediateSize, c.hiddenSize] },
  { key: "wDown", name: "mlp.down_proj.weight", shape: (c: LlamaConfig) => [c.hiddenSize, c.intermediateSize] },
] as const;

/** One layer's weights (or gradients): views into a flat array in this layout, keyed as LAYER_TENSORS names them. */
export type LayerWeights = Record<(typeof LAYER_TENSORS)[number]["key"], Float32Array>;

const EMBED = "model.embed_tokens.weight",
  NORM = "model.norm.weight";

export function paramLayout(c: LlamaConfig): { entries: ParamEntry[]; total: number } {
  const D = c.hiddenSize;
  const entries: ParamEntry[] = [];
  let offset = 0;
  const add = (name: string, shape: number[]): void => {
    const size = shape.reduce((a, b) => a * b, 1);
    entries.push({ name, shape, offset, size, decay: shape.length === 2 });
    offset += size;
  };
  add(EMBED, [c.vocabSize, D]);
  for (let i = 0; i < c.numLayers; i++) for (const t of LAYER_TENSORS) add(`model.layers.${i}.${t.name}`, t.shape(c));
  add(NORM, [D]);
  return { entries, total: offset };
}

/** Binds tensors by name: views into any flat array of this layout (the parameters, or a gradient buffer). */
export interface WeightBinder {
  /** Floats in the layout; a flat array passed to a binder must have exactly this many. */
  readonly total: number;
  embed(flat: Float32Array): Float32Array;
  finalNorm(flat: Float32Array): Float32Array;
  layer(flat: Float32Array, l: number): LayerWeights;
}

/** The binder of config c's layout: offsets computed once, views made per call (no copies). */
export function weightBinder(c: LlamaConfig): WeightBinder {
  const { entries, total } = paramLayout(c);
  const at = new Map(entries.map((e) => [e.name, e]));
  const view = (flat: Float32Array, name: string): Float32Array => {
    const e = at.get(name);
    if (!e) throw new RangeError(`weightBinder: no tensor ${name} in the layout`);
    return flat.subarray(e.offset, e.offset + e.size);
  };
  const layerNames = Array.from({ length: c.numLayers }, (_, l) =>
    LAYER_TENSORS.map((t) => [t.key, `model.layers.${l}.${t.name}`] as const),
  );
  return {
    total,
    embed: (flat) => view(flat, EMBED),
    finalNorm: (flat) => view(flat, NORM),
    layer(flat, l) {
      if (!Number.isInteger(l) || l < 0 || l >= c.numLayers)
        throw new RangeError(`weightBinder: layer ${l} is outside [0, ${c.numLayers})`);
      return Object.fromEntries(layerNames[l].map(([key, name]) => [key, view(flat, name)])) as LayerWeights;
    },
  };
}
