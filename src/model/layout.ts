/**
 * THE flat parameter layout. Master weights, gradients and Adam moments are Float32Arrays in this
 * order; every other module (safetensors export, optimizer, shared memory) indexes through it.
 * Order: embed_tokens, then per layer input_layernorm, q, k, v, o, post_attention_layernorm,
 * gate, up, down; then model.norm. Shapes are HF's ([out, in] for projections). No lm_head (tied).
 * q,k,v and gate,up are adjacent on purpose: the model reads them as one fused matrix each.
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

export function paramLayout(c: LlamaConfig): { entries: ParamEntry[]; total: number } {
  const D = c.hiddenSize,
    qd = c.numHeads * c.headDim,
    kvd = c.numKvHeads * c.headDim,
    F = c.intermediateSize;
  const entries: ParamEntry[] = [];
  let offset = 0;
  const add = (name: string, shape: number[]): void => {
    const size = shape.reduce((a, b) => a * b, 1);
    entries.push({ name, shape, offset, size, decay: shape.length === 2 });
    offset += size;
  };
  add("model.embed_tokens.weight", [c.vocabSize, D]);
  for (let i = 0; i < c.numLayers; i++) {
    const L = `model.layers.${i}.`;
    add(`${L}input_layernorm.weight`, [D]);
    add(`${L}self_attn.q_proj.weight`, [qd, D]);
    add(`${L}self_attn.k_proj.weight`, [kvd, D]);
    add(`${L}self_attn.v_proj.weight`, [kvd, D]);
    add(`${L}self_attn.o_proj.weight`, [D, qd]);
    add(`${L}post_attention_layernorm.weight`, [D]);
    add(`${L}mlp.gate_proj.weight`, [F, D]);
    add(`${L}mlp.up_proj.weight`, [F, D]);
    add(`${L}mlp.down_proj.weight`, [D, F]);
  }
  add("model.norm.weight", [D]);
  return { entries, total: offset };
}
