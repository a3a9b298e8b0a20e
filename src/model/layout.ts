/**
 * THE flat parameter layout. Master weights, gradients and Adam moments are Float32Arrays in this
 * order; every other module (safetensors export, optimizer, shared memory) indexes through it.
 * Order: embed_tokens, then per layer input_layernorm, q, k, v, o, post_attention_layernorm,
 * gate, up, down; then model.norm. Shapes are HF's ([out, in] for projections). No lm_head (tied).
 * q,k,v and gate,up are adjacent on purpose: the model reads them as one fused matrix each.
 */
import type { LlamaConfig } from "./config";

export interface ParamEntry {
  name: string;
  shape: number[];
  offset: number;
  size: number;
  /** P3: decoupled weight decay applies to 2-D weights only (not the norm weights). */
  decay: boolean;
}

export function paramLayout(c: LlamaConfig): { entries: ParamEntry[]; total: number } {
  const D = c.hiddenSize, qd = c.numHeads * c.headDim, kvd = c.numKvHeads * c.headDim, F = c.intermediateSize;
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
    add(L + "input_layernorm.weight", [D]);
    add(L + "self_attn.q_proj.weight", [qd, D]);
    add(L + "self_attn.k_proj.weight", [kvd, D]);
    add(L + "self_attn.v_proj.weight", [kvd, D]);
    add(L + "self_attn.o_proj.weight", [D, qd]);
    add(L + "post_attention_layernorm.weight", [D]);
    add(L + "mlp.gate_proj.weight", [F, D]);
    add(L + "mlp.up_proj.weight", [F, D]);
    add(L + "mlp.down_proj.weight", [D, F]);
  }
  add("model.norm.weight", [D]);
  return { entries, total: offset };
}

/**
 * The "transposed twin" of the flat layout: same offsets and sizes, but every 2-D entry [rows, cols]
 * is stored as its transpose [cols, rows] (1-D entries are copied as they are). The model's forward
 * products take W^T as their right operand, so a replica can be refreshed from the twin with plain
 * copies. transposeRange writes the twin's values for the flat indices [lo, hi) of `src`: each
 * source index is written to exactly one twin index, so threads that own disjoint [lo, hi) slices
 * can build one shared twin together without locks.
 */
export function transposeRange(entries: readonly ParamEntry[], src: Float32Array, dst: Float32Array, lo: number, hi: number): void {
  if (src.length !== dst.length) throw new RangeError(`transposeRange: src has ${src.length} floats, dst ${dst.length}`);
  if (!(Number.isInteger(lo) && Number.isInteger(hi) && 0 <= lo && lo <= hi && hi <= src.length)) {
    throw new RangeError(`transposeRange: [${lo}, ${hi}) is not a range inside [0, ${src.length})`);
  }
  for (const e of entries) {
    const a = Math.max(lo, e.offset), b = Math.min(hi, e.offset + e.size);
    if (a >= b) continue;
    if (e.shape.length !== 2) { dst.set(src.subarray(a, b), a); continue; }
    const [rows, cols] = e.shape as [number, number];
    const o = e.offset;
    let j = a - o;
    const end = b - o;
    // a partial first row, element by element
    for (; j < end && j % cols !== 0; j++) dst[o + (j % cols) * rows + Math.floor(j / cols)] = src[o + j];
    // whole rows [r0, r1), in 64 x 64 blocks
    const r0 = j / cols, r1 = Math.floor(end / cols);
    if (r1 > r0) {
      const BS = 64;
      for (let c0 = 0; c0 < cols; c0 += BS) {
        const c1 = Math.min(cols, c0 + BS);
        for (let rb = r0; rb < r1; rb += BS) {
          const rb1 = Math.min(r1, rb + BS);
          for (let c = c0; c < c1; c++) {
            const t = o + c * rows;
            for (let r = rb; r < rb1; r++) dst[t + r] = src[o + r * cols + c];
          }
        }
      }
      j = r1 * cols;
    }
    // a partial last row
    for (; j < end; j++) dst[o + (j % cols) * rows + Math.floor(j / cols)] = src[o + j];
  }
}
