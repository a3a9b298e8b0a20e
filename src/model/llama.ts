/**
 * Llama (HF LlamaForCausalLM math, M4) on tfjs-core ops, with a HAND-WRITTEN backward pass.
 *
 * Shape legend:  B batch, T sequence, N = B*T tokens, D hidden, H query heads, K kv heads,
 *                R = H/K query heads per kv head, E head_dim, F ffn width, V vocab,
 *                G = B*K attention groups (one kv head and its R query heads, in one sequence).
 *
 * Layout rules, measured on tfjs-wasm (XNNPACK, SIMD, one thread) in Node 20 on the 2-core dev box:
 *  - matMul is fast ONLY for plain 2-D operands (~23-27 GFLOP/s): transposeA is ~18x slower,
 *    transposeB ~8x slower, and a BatchMatMul with batch > 1 up to ~70x slower. So a block's weights are
 *    held as W^T [in,out] only: the forward is x @ W^T, and the backward transposes dy once (explicitly)
 *    for both of its products, dW = dy^T @ x and dx^T = W^T @ dy^T (then dx = transpose of that);
 *    attention loops over the G groups with 2-D matMuls.
 *  - XNNPACK packs a matMul's RIGHT operand (~2.7 ns/float) and tfjs-wasm caches the packed copy per tensor
 *    id: a weight as right operand costs a repack after every optimizer step. In dx^T = W^T @ dy^T the weight is
 *    the left operand (read as is) and the packed dy^T [out, N] is smaller than W [out, in] at N = 256, and no
 *    second orientation W [out,in] is uploaded, packed or held (~0.6 GB less wasm heap for the frozen model).
 *    Weights are refreshed in place only through wasmOverwrite, which drops the packed copy.
 *  - tf.slice / split / unstack on wasm first copy their WHOLE input to JS (~25 ns/float): q, k, v and
 *    gate, up are separate matMuls, RoPE's rotate_half is a matMul with a signed permutation (exact), and
 *    the per-group split (splitFirst) copies each part once from a heap view (unstack: ~1 s per step).
 *  - Pure data movement on wasm (2-D transposes, the split, the LM head's scaling/transposes) runs in JS on
 *    heap views into uninitialised outputs (emptyF32): tfjs-wasm's Transpose is ~3x slower and every
 *    fresh tf op output of the [len, V] head tensors costs a 50 MB pass.
 *  - XNNPACK streams the whole packed right operand once per few rows of the left one: with E [V, D]
 *    (113 MB) as the right operand of dh = dl @ E that is ~1.7x slower, so dh sums over 2048-row blocks of E
 *    (held as separate tensors on wasm, embRows).
 *  - dataSync copies at ~10 ns/float on wasm; gradients are read through a view on the wasm heap.
 *  - The LM head and the cross-entropy run in token chunks (at most ~2^24 logits at a time), so
 *    [N, V] logits never exist at once; the softmax is tfjs's, the "- one-hot" is done in JS at the
 *    label positions only (in place on wasm).
 *  - Big intermediates live in nested tidy scopes (per attention group, the MLP backward), so the
 *    peak stays one block's activations.
 *  - Gradient checkpointing (M6) keeps each block's input and recomputes the block right before its
 *    backward, with the very same ops: gradients are bit-identical to the non-checkpointed run. Selective
 *    recomputation: while all blocks' matMul outputs (Kept: q,k,v after RoPE, the attention output, x1, gate,
 *    up; 5.2k floats per token per layer) fit in ckptKeepBytes (default 512 MB: seq 1024 x micro 1 does), the
 *    forward keeps them too and the recomputation redoes only the norms, the attention softmax and the SwiGLU
 *    elementwise; otherwise whole blocks (minus the unused down projection). Step at seq 256: ~30% less work.
 */
import * as tf from "@tensorflow/tfjs-core";
import { UserError } from "../errors";
import type { LlamaConfig } from "./config";
import { paramLayout } from "./layout";

type T1 = tf.Tensor1D;
type T2 = tf.Tensor2D;
type T4 = tf.Tensor4D;

/** A block's weights, each matrix as the transpose W^T [in, out] of its HF weight W [out, in]. */
interface LayerWeights {
  wqT: T2;             // [D, HE]
  wkT: T2;             // [D, KE]
  wvT: T2;             // [D, KE]
  woT: T2;             // [HE, D]
  wgT: T2;             // [D, F]
  wuT: T2;             // [D, F]
  wdT: T2;             // [F, D]
  n1: T1; n2: T1;      // [D]
}

/** Flat-layout offsets of one layer's (fused) parameters. */
interface LayerOffsets { n1: number; q: number; k: number; v: number; o: number; n2: number; g: number; u: number; d: number }

/** Everything a block's backward reads: the block's saved activations. */
interface Saved {
  xhat1: T2; r1: T2; h1: T2;  // input norm: x*rsqrt [N,D], rsqrt [N,1], output [N,D]
  qr: T4; kr: T4; v: T4;      // after RoPE: [B,T,H,E], [B,T,K,E]; v [B,T,K,E]
  p: T2[];                    // per group: softmax probabilities [R*T, T]
  o: T2;                      // attention output before o_proj [N, HE]
  x1: T2;                     // block input + attention [N, D]
  xhat2: T2; r2: T2; h2: T2;  // post-attention norm
  g: T2; u: T2; sg: T2; a: T2; m: T2; // gate, up, sigmoid(gate), silu(gate), silu(gate)*up: [N,F]
}

/**
 * What M6's checkpointed forward keeps per block besides its input when the budget allows (selective
 * recomputation): the matMul outputs. The recomputation then redoes the norms, the attention scores/softmax
 * and the SwiGLU elementwise only, with the very same ops on the very same values: bit-identical gradients.
 */
interface Kept { qr: T4; kr: T4; v: T4; o: T2; x1: T2; g: T2; u: T2 }

interface BlockGrads { dx: T2; dwq: T2; dwk: T2; dwv: T2; dwo: T2; dn1: T1; dn2: T1; dwg: T2; dwu: T2; dwd: T2 }

/** Position tables for one sequence length. */
interface SeqTables {
  cos: tf.Tensor3D;  // [T,1,E]
  sin: tf.Tensor3D;  // [T,1,E]
  mask: T2;          // [R*T, T] additive causal mask: row i*T+t masks columns s > t
}

export class Llama {
  readonly cfg: LlamaConfig;
  readonly gradCkpt: boolean;
  private readonly total: number;
  private readonly embedOffset: number;
  private readonly normOffset: number;
  private readonly offs: LayerOffsets[] = [];
  private emb: T2 | null = null;   // [V, D]
  /** wasm only: emb in row blocks of HEAD_K_CHUNK rows, the right operands of the LM head's dh product (see there). */
  private embRows: T2[] = [];
  private embT: T2 | null = null;  // [D, V]
  private layers: LayerWeights[] = [];
  private norm: T1 | null = null;
  private readonly tables = new Map<number, SeqTables>();
  private readonly scale: number;
  private rot: T2 | null = null;   // [E, E] signed permutation: x @ rot = rotate_half(x)
  private rotT: T2 | null = null;

  private readonly headChunkTokens: number;
  private readonly ckptKeepBytes: number;
  /** setWeights' transpose buffer (the largest matrix, V*D floats), kept: fresh big allocations page-fault. */
  private scratch = new Float32Array(0);

  /**
   * gradCkpt: M6 recomputation. headChunkTokens: tokens per LM-head/cross-entropy chunk (default: as many
   * as keep ~2^24 logits, 64 MB, alive at once); results do not depend on it beyond float rounding.
   */
  constructor(c: LlamaConfig, o: { gradCkpt: boolean; headChunkTokens?: number; ckptKeepBytes?: number }) {
    if (c.numHeads % c.numKvHeads !== 0) throw new UserError("M2", `num_key_value_heads ${c.numKvHeads} must divide num_attention_heads ${c.numHeads}`);
    if (c.headDim % 2 !== 0) throw new UserError("M2", `head_dim ${c.headDim} must be even (RoPE)`);
    this.cfg = c;
    this.gradCkpt = o.gradCkpt;
    const { entries, total } = paramLayout(c);
    this.total = total;
    const at = new Map(entries.map((e) => [e.name, e.offset]));
    const off = (n: string): number => at.get(n) as number;
    this.embedOffset = off("model.embed_tokens.weight");
    this.normOffset = off("model.norm.weight");
    for (let i = 0; i < c.numLayers; i++) {
      const L = `model.layers.${i}.`;
      this.offs.push({
        n1: off(L + "input_layernorm.weight"), q: off(L + "self_attn.q_proj.weight"), k: off(L + "self_attn.k_proj.weight"),
        v: off(L + "self_attn.v_proj.weight"), o: off(L + "self_attn.o_proj.weight"), n2: off(L + "post_attention_layernorm.weight"),
        g: off(L + "mlp.gate_proj.weight"), u: off(L + "mlp.up_proj.weight"), d: off(L + "mlp.down_proj.weight"),
      });
    }
    this.scale = 1 / Math.sqrt(c.headDim);
    const hc = o.headChunkTokens ?? Math.floor((1 << 24) / c.vocabSize);
    if (!Number.isInteger(hc) || hc < 1) throw new RangeError(`Llama: headChunkTokens ${o.headChunkTokens} must be a positive integer`);
    this.headChunkTokens = hc;
    // M6 selective recomputation: keep every block's matMul outputs (Kept, ~5.2k floats per token per layer for the
    // frozen shape) when they fit in this many bytes in all, else recompute whole blocks. 0: always whole blocks.
    const kb = o.ckptKeepBytes ?? 512 * 1024 * 1024;
    if (!Number.isFinite(kb) || kb < 0) throw new RangeError(`Llama: ckptKeepBytes ${o.ckptKeepBytes} must be a finite number >= 0`);
    this.ckptKeepBytes = kb;
  }

  // ---------------------------------------------------------------- weights

  /**
   * Copies the flat layout (it may be a view on a SharedArrayBuffer) into the replica's tensors. `flatT`, when
   * given, is its transposed twin (layout.ts transposeRange): the W^T tensors are then plain copies of it.
   * Otherwise the transposes run here, in JS (~1.5-3 ns/float; tf.transpose on wasm is ~10).
   *
   * On wasm a refresh writes the new values into the existing tensors' heap memory: no tensor churn, no
   * second copy. tfjs-wasm caches XNNPACK's packed copy of a matMul's right operand by tensor id, so each
   * overwritten tensor's id is unregistered and registered again on the C++ side first (wasmOverwrite):
   * that drops the cached operators, and the next product packs the new values. A test pins it: a refreshed
   * replica gives bit-identical gradients to a freshly built one.
   */
  setWeights(flat: Float32Array, flatT?: Float32Array): void {
    if (flat.length !== this.total) throw new RangeError(`setWeights: flat has ${flat.length} floats, the layout needs ${this.total}`);
    if (flatT && flatT.length !== this.total) throw new RangeError(`setWeights: flatT has ${flatT.length} floats, the layout needs ${this.total}`);
    const wasm = tf.getBackend() === "wasm";
    if (wasm && this.emb) { this.refreshWasm(flat, flatT); return; }
    this.disposeWeights();
    const c = this.cfg, D = c.hiddenSize, F = c.intermediateSize, V = c.vocabSize;
    const qd = c.numHeads * c.headDim, kvd = c.numKvHeads * c.headDim;
    // The embedding in both orientations (and E's row blocks on wasm, for the LM head), every block matrix as W^T
    // (see the layout rules above). The transposes run in JS into one reused scratch buffer (fresh JS allocations
    // cost ~11 ns/float in page faults).
    // wasm copies on upload; other backends may keep a reference to the array they get, so they get copies.
    const copies = !wasm;
    const tr = (offset: number, rows: number, cols: number): T2 => {
      let t: Float32Array;
      if (flatT) {
        t = flatT.subarray(offset, offset + rows * cols);
      } else {
        const src = flat.subarray(offset, offset + rows * cols);
        if (this.scratch.length < src.length) this.scratch = new Float32Array(src.length);
        t = transposeJs(src, rows, cols, this.scratch.subarray(0, src.length));
      }
      return tf.tensor2d(copies ? t.slice() : t, [cols, rows]);
    };
    const e = flat.subarray(this.embedOffset, this.embedOffset + V * D);
    this.emb = tf.tensor2d(copies ? e.slice() : e, [V, D]);
    this.embT = tr(this.embedOffset, V, D);
    if (wasm) {
      for (let r0 = 0; r0 < V; r0 += HEAD_K_CHUNK) {
        const r1 = Math.min(V, r0 + HEAD_K_CHUNK);
        this.embRows.push(tf.tensor2d(flat.subarray(this.embedOffset + r0 * D, this.embedOffset + r1 * D), [r1 - r0, D]));
      }
    }
    for (const o of this.offs) {
      this.layers.push({
        wqT: tr(o.q, qd, D), wkT: tr(o.k, kvd, D), wvT: tr(o.v, kvd, D), woT: tr(o.o, D, qd),
        wgT: tr(o.g, F, D), wuT: tr(o.u, F, D), wdT: tr(o.d, D, F),
        n1: tf.tensor1d(flat.slice(o.n1, o.n1 + D)), n2: tf.tensor1d(flat.slice(o.n2, o.n2 + D)),
      });
    }
    this.norm = tf.tensor1d(flat.slice(this.normOffset, this.normOffset + D));
  }

  /** The wasm refresh: every weight tensor overwritten in place (see setWeights). */
  private refreshWasm(flat: Float32Array, flatT: Float32Array | undefined): void {
    const put = (t: tf.Tensor, off: number): void => wasmOverwrite(t, (h) => h.set(flat.subarray(off, off + t.size)));
    const putT = (t: tf.Tensor, off: number): void => {
      const [cols, rows] = t.shape as [number, number]; // t is the [cols, rows] transpose of the entry at `off`
      if (flatT) wasmOverwrite(t, (h) => h.set(flatT.subarray(off, off + t.size)));
      else wasmOverwrite(t, (h) => transposeJs(flat.subarray(off, off + t.size), rows, cols, h));
    };
    put(this.emb as T2, this.embedOffset);
    putT(this.embT as T2, this.embedOffset);
    let off = this.embedOffset;
    for (const e of this.embRows) { put(e, off); off += e.size; }
    this.offs.forEach((o, i) => {
      const w = this.layers[i];
      put(w.n1, o.n1); put(w.n2, o.n2);
      putT(w.wqT, o.q); putT(w.wkT, o.k); putT(w.wvT, o.v); putT(w.woT, o.o);
      putT(w.wgT, o.g); putT(w.wuT, o.u); putT(w.wdT, o.d);
    });
    put(this.norm as T1, this.normOffset);
  }

  private disposeWeights(): void {
    const ts: tf.Tensor[] = [];
    if (this.emb) ts.push(this.emb);
    if (this.embT) ts.push(this.embT);
    if (this.norm) ts.push(this.norm);
    for (const l of this.layers) ts.push(l.wqT, l.wkT, l.wvT, l.woT, l.wgT, l.wuT, l.wdT, l.n1, l.n2);
    tf.dispose(ts);
    tf.dispose(this.embRows);
    this.embRows = [];
    this.emb = this.embT = this.norm = null;
    this.layers = [];
  }

  dispose(): void {
    this.disposeWeights();
    for (const t of this.tables.values()) tf.dispose([t.cos, t.sin, t.mask]);
    this.tables.clear();
    if (this.rot) this.rot.dispose();
    if (this.rotT) this.rotT.dispose();
    this.rot = this.rotT = null;
    this.scratch = new Float32Array(0);
  }

  // ---------------------------------------------------------------- public passes

  /**
   * HF causal-LM loss (positions 0..T-2 predict 1..T-1, mean over B*(T-1)) and its gradient:
   * ADDS d(loss * gradScale)/dθ into gradOut (flat layout, += so micro-batches accumulate).
   * Returns the unscaled loss.
   */
  lossAndGrads(ids: Int32Array, batch: number, seqLen: number, gradScale: number, gradOut: Float32Array): number {
    this.check(ids, batch, seqLen);
    if (gradOut.length !== this.total) throw new RangeError(`lossAndGrads: gradOut has ${gradOut.length} floats, the layout needs ${this.total}`);
    if (!Number.isFinite(gradScale) || gradScale <= 0) throw new RangeError(`lossAndGrads: gradScale ${gradScale} must be a positive finite number`);
    const c = this.cfg, L = c.numLayers, D = c.hiddenSize;
    const tab = this.seqTables(seqLen);
    const live: tf.Tensor[] = [];
    try {
      // ---- forward: xs[l] is block l's input; saved[l] its activations when not checkpointing
      const xs: T2[] = [this.embed(ids)];
      live.push(xs[0]);
      const saved: (Saved | null)[] = [];
      const kept: (Kept | null)[] = [];
      const N = batch * seqLen, F = c.intermediateSize, qd = c.numHeads * c.headDim, kvd = c.numKvHeads * c.headDim;
      const keep = this.gradCkpt && L * N * (2 * qd + 2 * kvd + D + 2 * F) * 4 <= this.ckptKeepBytes;
      for (let l = 0; l < L; l++) {
        const r = tidy(() => {
          const f = this.blockForward(l, xs[l], batch, seqLen, tab);
          if (!this.gradCkpt) return f;
          const s = f.saved;
          return keep ? { out: f.out, kept: { qr: s.qr, kr: s.kr, v: s.v, o: s.o, x1: s.x1, g: s.g, u: s.u } } : { out: f.out };
        });
        xs.push(r.out);
        live.push(r.out);
        const s = "saved" in r ? (r.saved as Saved) : null;
        if (s) live.push(...savedTensors(s));
        saved.push(s);
        const k = "kept" in r ? (r.kept as Kept) : null;
        if (k) live.push(...keptTensors(k));
        kept.push(k);
      }
      const fn = tidy(() => rmsForward(xs[L], this.norm as T1, c.rmsNormEps));
      live.push(fn.xhat, fn.r, fn.h);

      // ---- LM head + cross-entropy, chunked over tokens; dE accumulates the head's share of the embedding gradient
      const head = this.headLossAndGrad(fn.h, ids, batch, seqLen, gradScale);
      const headDh = head.dh as T2, headDE = head.dE as T2;
      live.push(headDh, headDE);
      // the embedding's LM-head share of its gradient; readHost: the numbers go to gradOut
      addInto(gradOut, this.embedOffset, readHost(headDE));

      // ---- backward through the final norm, then the blocks in reverse
      const nb = tidy(() => rmsBackward(headDh, fn.xhat, fn.r, this.norm as T1));
      live.push(nb.dx, nb.dw);
      addInto(gradOut, this.normOffset, readHost(nb.dw)); // numbers needed: the gradient out
      let dx = nb.dx;
      for (let l = L - 1; l >= 0; l--) {
        let sv = saved[l];
        if (sv === null) { // M6: recompute this block's activations from its input, with the forward's own ops
          const k = kept[l] ?? undefined;
          sv = tidy(() => this.blockForward(l, xs[l], batch, seqLen, tab, false, k).saved);
          live.push(...savedTensors(sv));
        }
        const s = sv;
        const g = tidy(() => this.blockBackward(l, s, dx, batch, seqLen, tab));
        // numbers needed: this block's weight gradients go to gradOut now, so peak memory stays one block
        const o = this.offs[l];
        addInto(gradOut, o.n1, readHost(g.dn1));
        addInto(gradOut, o.q, readHost(g.dwq));
        addInto(gradOut, o.k, readHost(g.dwk));
        addInto(gradOut, o.v, readHost(g.dwv));
        addInto(gradOut, o.o, readHost(g.dwo));
        addInto(gradOut, o.n2, readHost(g.dn2));
        addInto(gradOut, o.g, readHost(g.dwg));
        addInto(gradOut, o.u, readHost(g.dwu));
        addInto(gradOut, o.d, readHost(g.dwd));
        tf.dispose([g.dwq, g.dwk, g.dwv, g.dwo, g.dn1, g.dn2, g.dwg, g.dwu, g.dwd, dx, xs[l + 1]]);
        tf.dispose(savedTensors(s));
        dx = g.dx;
        live.push(dx);
      }
      // ---- input embedding: scatter-add of the rows of dx0 (no gather gradient on wasm); numbers needed
      const dx0 = readHost(dx);
      const E = this.embedOffset;
      for (let n = 0; n < ids.length; n++) {
        const dst = E + ids[n] * D, src = n * D;
        for (let d = 0; d < D; d++) gradOut[dst + d] += dx0[src + d];
      }
      return head.loss;
    } finally {
      // every tensor created above is in `live`; disposing one twice is a no-op in tfjs
      tf.dispose(live);
    }
  }

  /** The loss alone (no gradients): the forward pass and the chunked cross-entropy. */
  loss(ids: Int32Array, batch: number, seqLen: number): number {
    this.check(ids, batch, seqLen);
    const h = this.forwardHidden(ids, batch, seqLen);
    try {
      return this.headLossAndGrad(h, ids, batch, seqLen, 0).loss;
    } finally {
      h.dispose();
    }
  }

  /** Logits [batch, seqLen, vocab], row-major. */
  logits(ids: Int32Array, batch: number, seqLen: number): Float32Array {
    this.check(ids, batch, seqLen);
    const V = this.cfg.vocabSize, N = batch * seqLen;
    const out = new Float32Array(N * V);
    const h = this.forwardHidden(ids, batch, seqLen);
    try {
      const C = this.headChunk(N);
      for (let s = 0; s < N; s += C) {
        const len = Math.min(C, N - s);
        const lg = tidy(() => tf.matMul(tf.slice(h, [s, 0], [len, -1]), this.embT as T2));
        out.set(readHost(lg), s * V); // numbers needed: the caller asked for the logits
        lg.dispose();
      }
      return out;
    } finally {
      h.dispose();
    }
  }

  // ---------------------------------------------------------------- pieces

  private check(ids: Int32Array, batch: number, seqLen: number): void {
    if (!this.emb) throw new Error("Llama: setWeights() must be called before any pass");
    if (!Number.isInteger(batch) || batch < 1 || !Number.isInteger(seqLen) || seqLen < 2) {
      throw new RangeError(`Llama: batch ${batch} and seqLen ${seqLen} must be integers >= 1 and >= 2`);
    }
    if (ids.length !== batch * seqLen) throw new RangeError(`Llama: ${ids.length} token ids for batch ${batch} x seqLen ${seqLen}`);
    const V = this.cfg.vocabSize;
    for (let i = 0; i < ids.length; i++) {
      const t = ids[i];
      if (t < 0 || t >= V) {
        throw new UserError("M4", `token id ${t} at position ${i} is outside the vocabulary [0, ${V}); the data was tokenized with another tokenizer or the model's vocab_size is wrong`);
      }
    }
  }

  /** x0 = E[ids] [N, D]. */
  private embed(ids: Int32Array): T2 {
    return tidy(() => {
      const it = tf.tensor1d(ids, "int32");
      return tf.gather(this.emb as T2, it) as T2;
    });
  }

  /** Final-norm output h [N, D] for the loss / logits paths (no activations kept). */
  private forwardHidden(ids: Int32Array, batch: number, seqLen: number): T2 {
    const tab = this.seqTables(seqLen);
    let x = this.embed(ids);
    for (let l = 0; l < this.cfg.numLayers; l++) {
      const nx = tidy(() => this.blockForward(l, x, batch, seqLen, tab).out);
      x.dispose();
      x = nx;
    }
    const h = tidy(() => rmsForward(x, this.norm as T1, this.cfg.rmsNormEps).h);
    x.dispose();
    return h;
  }

  private seqTables(T: number): SeqTables {
    const hit = this.tables.get(T);
    if (hit) return hit;
    const c = this.cfg, E = c.headDim, half = E / 2, R = c.numHeads / c.numKvHeads;
    // inv_freq = 1/theta^(2i/E); angles in float64, rounded once (the fixture is float64 math)
    const cos = new Float32Array(T * E), sin = new Float32Array(T * E);
    for (let t = 0; t < T; t++) {
      for (let i = 0; i < half; i++) {
        const ang = t / Math.pow(c.ropeTheta, (2 * i) / E);
        const cs = Math.cos(ang), sn = Math.sin(ang);
        cos[t * E + i] = cs; cos[t * E + half + i] = cs;
        sin[t * E + i] = sn; sin[t * E + half + i] = sn;
      }
    }
    const mask = new Float32Array(R * T * T);
    for (let i = 0; i < R; i++) {
      for (let t = 0; t < T; t++) {
        const row = (i * T + t) * T;
        for (let s = t + 1; s < T; s++) mask[row + s] = -Infinity;
      }
    }
    const tab: SeqTables = {
      cos: tf.tensor3d(cos, [T, 1, E]), sin: tf.tensor3d(sin, [T, 1, E]),
      mask: tf.tensor2d(mask, [R * T, T]),
    };
    this.tables.set(T, tab);
    return tab;
  }

  /**
   * RoPE, HF's x*cos + rotate_half(x)*sin, on x [B,T,nh,E]. rotate_half(x) = [-x2, x1] is x @ ROT with ROT a signed
   * permutation [E,E]: exact (one +-1 term per output), and a small matMul instead of slices + concat, which copy
   * their whole input on wasm. back=true applies the adjoint: dx = dy*cos + (dy*sin) @ ROT^T.
   */
  private rope(x: T4, tab: SeqTables, back: boolean): T4 {
    const E = this.cfg.headDim, half = E / 2;
    if (!this.rot) {
      const r = new Float32Array(E * E); // r[j*E + i]: weight of input j in output i
      for (let i = 0; i < half; i++) { r[(i + half) * E + i] = -1; r[i * E + i + half] = 1; }
      this.rot = tf.keep(tf.tensor2d(r, [E, E]));
      this.rotT = tf.keep(tf.tensor2d(transposeJs(r, E, E), [E, E]));
    }
    const flat2 = (t: tf.Tensor): T2 => tf.reshape(t, [-1, E]) as T2;
    if (!back) return tf.add(tf.mul(x, tab.cos), tf.mul(tf.reshape(tf.matMul(flat2(x), this.rot), x.shape), tab.sin)) as T4;
    return tf.add(tf.mul(x, tab.cos), tf.reshape(tf.matMul(flat2(tf.mul(x, tab.sin)), this.rotT as T2), x.shape)) as T4;
  }

  /** One decoder block. Call inside tf.tidy. */
  private blockForward(l: number, x: T2, B: number, T: number, tab: SeqTables, needOut = true, kept?: Kept): { out: T2; saved: Saved } {
    const c = this.cfg, w = this.layers[l];
    const H = c.numHeads, K = c.numKvHeads, E = c.headDim;
    const G = B * K, R = H / K;
    // -- attention
    const n1 = rmsForward(x, w.n1, c.rmsNormEps);
    let qr: T4, kr: T4, v: T4;
    if (kept) {
      ({ qr, kr, v } = kept);
    } else {
      // three matMuls rather than one fused one + slices: tf.slice on wasm copies its whole input first (~25 ns/float)
      const q = tf.reshape(tf.matMul(n1.h, w.wqT), [B, T, H, E]) as T4;
      const k = tf.reshape(tf.matMul(n1.h, w.wkT), [B, T, K, E]) as T4;
      v = tf.reshape(tf.matMul(n1.h, w.wvT), [B, T, K, E]) as T4;
      qr = this.rope(q, tab, false); kr = this.rope(k, tab, false);
    }
    const qg = splitFirst(groupQ(qr, B, T, K, R, E));               // G x [R*T, E]
    const kgT = splitFirst(groupKvT(kr, B, T, K, E));               // G x [E, T]
    const vg = kept ? [] : splitFirst(groupKv(v, B, T, K, E));      // G x [T, E]
    const p: T2[] = [], og: T2[] = [];
    for (let g = 0; g < G; g++) {
      // a nested scope per group: only P survives, the [R*T, T] scores are freed at once (peak memory)
      const pg = tidy(() => tf.softmax(tf.add(tf.mul(tf.matMul(qg[g], kgT[g]), this.scale), tab.mask)) as T2); // [R*T, T]
      p.push(pg);
      if (!kept) og.push(tf.matMul(pg, vg[g]));                            // [R*T, E]
    }
    const o = kept ? kept.o : ungroupQ(tf.stack(og) as tf.Tensor3D, B, T, K, R, E); // [N, HE]
    const x1 = kept ? kept.x1 : tf.add(x, tf.matMul(o, w.woT)) as T2;
    // -- SwiGLU MLP
    const n2 = rmsForward(x1, w.n2, c.rmsNormEps);
    const g = kept ? kept.g : tf.matMul(n2.h, w.wgT) as T2, u = kept ? kept.u : tf.matMul(n2.h, w.wuT) as T2; // [N, F]
    const sg = tf.sigmoid(g) as T2;
    const a = tf.mul(g, sg) as T2;                                          // silu(g)
    const m = tf.mul(a, u) as T2;
    // the M6 recomputation needs the saved activations only: the down projection (~5% of the step's FLOPs) is skipped
    const out = (needOut ? tf.add(x1, tf.matMul(m, w.wdT)) : x1) as T2;
    return {
      out,
      saved: { xhat1: n1.xhat, r1: n1.r, h1: n1.h, qr, kr, v, p, o, x1, xhat2: n2.xhat, r2: n2.r, h2: n2.h, g, u, sg, a, m },
    };
  }

  /** Backward of one block given dOut [N, D]. Call inside tf.tidy. */
  private blockBackward(l: number, s: Saved, dOut: T2, B: number, T: number, tab: SeqTables): BlockGrads {
    const c = this.cfg, w = this.layers[l];
    const N = B * T, H = c.numHeads, K = c.numKvHeads, E = c.headDim;
    const G = B * K, R = H / K;
    // -- MLP: out = x1 + m @ Wd^T
    // Big intermediates are freed as soon as they are used (nested scopes, explicit disposes): at micro-batch
    // 4 x seq 1024 one [N, F] tensor is 25 MB and one group's [R*T, T] 38 MB, against wasm's 4 GB.
    // dy^T once per weight: the left operand of dW = dy^T @ x and the right one of dx^T = W^T @ dy^T
    const dOutT = transpose2(dOut);                                         // [D, N]
    const dwd = tf.matMul(dOutT, s.m) as T2;                                // [D, F]
    const { dg, du } = tidy(() => {
      const dm = transpose2(tf.matMul(w.wdT, dOutT) as T2);                 // dm = dOut @ Wd [N, F]
      // d silu(g)/dg = sg * (1 + g * (1 - sg))
      return {
        du: tf.mul(dm, s.a) as T2,
        dg: tf.mul(tf.mul(dm, s.u), tf.mul(s.sg, tf.add(1, tf.mul(s.g, tf.sub(1, s.sg))))) as T2,
      };
    });
    dOutT.dispose();
    const dgT = transpose2(dg), duT = transpose2(du);                       // [F, N]
    tf.dispose([dg, du]);
    const dwg = tf.matMul(dgT, s.h2) as T2, dwu = tf.matMul(duT, s.h2) as T2; // [F, D]
    const dh2 = tidy(() => transpose2(tf.add(tf.matMul(w.wgT, dgT), tf.matMul(w.wuT, duT)) as T2)); // dg @ Wg + du @ Wu [N, D]
    tf.dispose([dgT, duT]);
    const nb2 = rmsBackward(dh2 as T2, s.xhat2, s.r2, w.n2);
    const dx1 = tf.add(dOut, nb2.dx) as T2;
    // -- attention: x1 = x + o @ Wo^T
    const dx1T = transpose2(dx1);                                           // [D, N]
    const dwo = tf.matMul(dx1T, s.o) as T2;                                 // [D, HE]
    const dO = tf.reshape(tidy(() => transpose2(tf.matMul(w.woT, dx1T) as T2)), [B, T, H, E]) as T4; // dx1 @ Wo [B,T,H,E]
    dx1T.dispose();
    const dOg3 = groupQ(dO, B, T, K, R, E);                                 // [G, R*T, E]
    const delta = splitFirst(tf.sum(tf.mul(dOg3, groupQ(tf.reshape(s.o, [B, T, H, E]) as T4, B, T, K, R, E)), -1, true)); // G x [R*T, 1]
    const dOg = splitFirst(dOg3);                                   // G x [R*T, E]
    const dOgT = splitFirst(groupQT(dO, B, T, K, R, E));            // G x [E, R*T]
    const qgT = splitFirst(groupQT(s.qr, B, T, K, R, E));           // G x [E, R*T]
    const kg = splitFirst(groupKv(s.kr, B, T, K, E));               // G x [T, E]
    const vgT = splitFirst(groupKvT(s.v, B, T, K, E));              // G x [E, T]
    const dq: T2[] = [], dkT: T2[] = [], dvT: T2[] = [];
    for (let g = 0; g < G; g++) {
      const r = tidy(() => {
        const dP = tf.matMul(dOg[g], vgT[g]);                               // [R*T, T]
        const dS = tf.mul(tf.mul(s.p[g], tf.sub(dP, delta[g])), this.scale); // softmax backward, then the 1/sqrt(E)
        return {
          dq: tf.matMul(dS, kg[g]) as T2,                                   // [R*T, E]
          dkT: tf.matMul(qgT[g], dS) as T2,                                 // [E, T]: sums the R query heads
          dvT: tf.matMul(dOgT[g], s.p[g]) as T2,                            // [E, T]
        };
      });
      dq.push(r.dq); dkT.push(r.dkT); dvT.push(r.dvT);
    }
    const dqr = tf.reshape(ungroupQ(tf.stack(dq) as tf.Tensor3D, B, T, K, R, E), [B, T, H, E]) as T4;
    const dkr = tf.reshape(ungroupKvT(tf.stack(dkT) as tf.Tensor3D, B, T, K, E), [B, T, K, E]) as T4;
    const dv = ungroupKvT(tf.stack(dvT) as tf.Tensor3D, B, T, K, E);        // [N, KE]
    const dq2 = tf.reshape(this.rope(dqr, tab, true), [N, H * E]) as T2;
    const dk2 = tf.reshape(this.rope(dkr, tab, true), [N, K * E]) as T2;
    const dq2T = transpose2(dq2), dk2T = transpose2(dk2), dv2T = transpose2(dv); // [out, N]
    const dwq = tf.matMul(dq2T, s.h1) as T2, dwk = tf.matMul(dk2T, s.h1) as T2, dwv = tf.matMul(dv2T, s.h1) as T2; // [out, D]
    const dh1 = tidy(() => transpose2(tf.add(tf.add(tf.matMul(w.wqT, dq2T), tf.matMul(w.wkT, dk2T)), tf.matMul(w.wvT, dv2T)) as T2)); // [N, D]
    tf.dispose([dq2T, dk2T, dv2T]);
    const nb1 = rmsBackward(dh1 as T2, s.xhat1, s.r1, w.n1);
    const dx = tf.add(dx1, nb1.dx) as T2;
    return { dx, dwq, dwk, dwv, dwo, dn1: nb1.dw, dn2: nb2.dw, dwg, dwu, dwd };
  }

  /** Tokens per LM-head chunk (by default at most ~2^24 logits, 64 MB, live at once). */
  private headChunk(N: number): number {
    return Math.max(1, Math.min(N, this.headChunkTokens));
  }

  /**
   * Tied LM head + HF causal-LM cross-entropy over h [N, D], chunked over tokens.
   * gradScale 0: loss only. Otherwise returns dh [N, D] and dE [V, D] of loss*gradScale.
   * dlogits = (softmax - onehot) * gradScale / (B*(T-1)); the last position of each row has none.
   */
  private headLossAndGrad(h: T2, ids: Int32Array, B: number, T: number, gradScale: number): { loss: number; dh: T2 | null; dE: T2 | null } {
    const V = this.cfg.vocabSize, N = B * T, D = this.cfg.hiddenSize;
    const C = this.headChunk(N);
    const want = gradScale > 0;
    const coef = gradScale / (B * (T - 1));
    let lossSum = 0;
    const dhs: T2[] = [];
    let dE: T2 | null = null;
    try {
      for (let s0 = 0; s0 < N; s0 += C) {
        const len = Math.min(C, N - s0);
        const r = tidy(() => {
          const hc = len === N ? h : tf.slice(h, [s0, 0], [len, D]);
          const lg = tf.matMul(hc, this.embT as T2);                       // [len, V]
          const p = tf.softmax(lg) as T2;
          // numbers needed: the loss, and the label positions of the gradient. On wasm `pv` is a view
          // on p's own buffer (written in place); elsewhere a copy that is uploaded again below.
          const inPlace = tf.getBackend() === "wasm";
          const pv = inPlace ? readHost(p) : Float32Array.from(readHost(p));
          let lgv: Float32Array | null = null;
          for (let n = 0; n < len; n++) {
            const gi = s0 + n, t = gi % T, row = n * V;
            if (t === T - 1) { if (want) pv.fill(0, row, row + V); continue; } // predicts nothing
            const label = ids[gi + 1], pl = pv[row + label];
            if (pl > 1e-30) {
              lossSum -= Math.log(pl);
            } else {
              // the fp32 probability underflowed: take log-sum-exp from the logits row, in float64
              lgv = lgv ?? readHost(lg);
              let mx = -Infinity;
              for (let j = 0; j < V; j++) mx = Math.max(mx, lgv[row + j]);
              let se = 0;
              for (let j = 0; j < V; j++) se += Math.exp(lgv[row + j] - mx);
              lossSum += mx + Math.log(se) - lgv[row + label];
              lgv = null; // views on the wasm heap must not outlive the next allocation
            }
            if (want) pv[row + label] = pl - 1;
          }
          if (!want) return {};
          let dh: T2, dlT: T2;
          if (inPlace) {
            // on wasm the scaling (in place on p) and the transposes run in JS on heap views: tf.mul and tf.transpose
            // of the [len, V] tensor cost ~4x more (a fresh 50 MB output each). Same float32 products as tf.mul.
            // dh = dl @ E runs as a sum over vocabulary blocks, dl[:, blk] @ E[blk, :]: with K = V in one product,
            // XNNPACK streams the whole 113 MB packed E once per few rows of dl (~1.7x slower, measured).
            const blocks = this.embRows.map((e) => [e, emptyF32([len, e.shape[0]]) as T2] as const);
            dlT = emptyF32([V, len]) as T2;                              // allocate first: views die on allocation
            const pw = readHost(p), c32 = Math.fround(coef);
            for (let i = 0; i < pw.length; i++) pw[i] *= c32;
            transposeJs(pw, len, V, readHost(dlT));
            let c0 = 0;
            for (const [, blk] of blocks) {
              const bw = readHost(blk), Vb = blk.shape[1];
              for (let n = 0; n < len; n++) bw.set(pw.subarray(n * V + c0, n * V + c0 + Vb), n * Vb);
              c0 += Vb;
            }
            let acc: T2 | null = null;
            for (const [e, blk] of blocks) {
              const part = tf.matMul(blk, e) as T2;
              blk.dispose();
              if (acc) { const nx = tf.add(acc, part) as T2; tf.dispose([acc, part]); acc = nx; } else acc = part;
            }
            dh = acc as T2;
            p.dispose();
          } else {
            const dl = tf.mul(tf.tensor2d(pv, [len, V]), tf.scalar(coef));      // [len, V]
            dlT = tf.transpose(dl) as T2;
            dh = tf.matMul(dl, this.emb as T2) as T2;                      // [len, D]
          }
          // dE = dl^T @ hc [V, D]: an explicit transpose of dl then a plain matMul, so the result is already in
          // the flat layout (adding a [D, V] product transposed in JS cost ~200 ms)
          const part = tf.matMul(dlT, hc) as T2;                           // [V, D]
          return { dh, dE: (dE ? tf.add(dE, part) : part) as T2 };
        });
        if (r.dh && r.dE) {
          dhs.push(r.dh);
          if (dE) dE.dispose();
          dE = r.dE;
        }
      }
      const loss = lossSum / (B * (T - 1));
      if (!want) return { loss, dh: null, dE: null };
      const dh = (dhs.length === 1 ? dhs[0] : tf.concat(dhs, 0)) as T2;
      if (dhs.length > 1) tf.dispose(dhs);
      return { loss, dh, dE: dE as unknown as T2 };
    } catch (e) {
      tf.dispose(dhs);
      if (dE) (dE as T2).dispose();
      throw e;
    }
  }
}

// -------------------------------------------------------------------- ops

/** Rows of E per block of the LM head's dh = dl @ E on wasm (a packed block, 2048 x 576 floats, ~4.7 MB). */
const HEAD_K_CHUNK = 2048;

/** tf.tidy for functions returning our own records of tensors (tfjs' TensorContainer typing lacks index-signature-free interfaces). */
function tidy<R>(fn: () => R): R {
  return tf.tidy(fn as unknown as () => tf.TensorContainer) as unknown as R;
}

/**
 * A float32 tensor whose values the caller writes at once (all of them) through readHost: on wasm an uninitialised
 * heap block, made the way kernels make their outputs (backend.makeOutput + engine.makeTensorFromTensorInfo);
 * tf.fill would write it once more for nothing. Elsewhere zeros.
 */
function emptyF32(shape: number[]): tf.Tensor {
  const be = tf.backend() as unknown as { makeOutput?: (s: number[], d: "float32") => tf.TensorInfo };
  if (tf.getBackend() === "wasm" && typeof be.makeOutput === "function") {
    return tf.engine().makeTensorFromTensorInfo(be.makeOutput(shape, "float32"), tf.backend());
  }
  return tf.fill(shape, 0);
}

/** 2-D transpose; on wasm in JS on heap views (~3x faster than tfjs-wasm's Transpose kernel, same values). */
function transpose2(a: T2): T2 {
  if (tf.getBackend() !== "wasm") return tf.transpose(a);
  const [rows, cols] = a.shape;
  const out = emptyF32([cols, rows]) as T2; // allocate first: heap views die on allocation
  transposeJs(readHost(a), rows, cols, readHost(out));
  return out;
}

/**
 * tf.unstack along axis 0. On wasm each part is copied once from a heap view: tfjs-wasm's Unpack slices, and
 * its Slice first copies the WHOLE input to JS, so unstacking G parts copied the input G+1 times.
 */
function splitFirst(x: tf.Tensor): T2[] {
  if (tf.getBackend() !== "wasm") return tf.unstack(x) as T2[];
  const G = x.shape[0], shape = x.shape.slice(1), size = x.size / G;
  const outs: T2[] = [];
  for (let g = 0; g < G; g++) outs.push(emptyF32(shape) as T2); // allocate all first: heap views die on allocation
  const src = readHost(x);
  for (let g = 0; g < G; g++) readHost(outs[g]).set(src.subarray(g * size, (g + 1) * size));
  return outs;
}

/** RMSNorm in fp32: h = w * (x * rsqrt(mean(x^2) + eps)). */
function rmsForward(x: T2, w: T1, eps: number): { xhat: T2; r: T2; h: T2 } {
  const r = tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), eps)) as T2; // [N,1]
  const xhat = tf.mul(x, r) as T2;
  return { xhat, r, h: tf.mul(xhat, w) as T2 };
}

/** dx = r * (dxhat - xhat * mean(dxhat * xhat)), dxhat = dh * w; dw = sum_n dh * xhat. */
function rmsBackward(dh: T2, xhat: T2, r: T2, w: T1): { dx: T2; dw: T1 } {
  const dxhat = tf.mul(dh, w);
  const dw = tf.sum(tf.mul(dh, xhat), 0) as T1;
  const dx = tf.mul(r, tf.sub(dxhat, tf.mul(xhat, tf.mean(tf.mul(dxhat, xhat), -1, true)))) as T2;
  return { dx, dw };
}


// Query head h = j*R + i belongs to kv head j (M4); a group (b, j) holds its R heads' rows as i*T + t.

/** [B,T,H,E] -> [G, R*T, E] */
function groupQ(x: T4, B: number, T: number, K: number, R: number, E: number): tf.Tensor3D {
  return tf.reshape(tf.transpose(tf.reshape(x, [B, T, K, R, E]), [0, 2, 3, 1, 4]), [B * K, R * T, E]);
}
/** [B,T,H,E] -> [G, E, R*T] */
function groupQT(x: T4, B: number, T: number, K: number, R: number, E: number): tf.Tensor3D {
  return tf.reshape(tf.transpose(tf.reshape(x, [B, T, K, R, E]), [0, 2, 4, 3, 1]), [B * K, E, R * T]);
}
/** [G, R*T, E] -> [N, H*E] */
function ungroupQ(x: tf.Tensor3D, B: number, T: number, K: number, R: number, E: number): T2 {
  return tf.reshape(tf.transpose(tf.reshape(x, [B, K, R, T, E]), [0, 3, 1, 2, 4]), [B * T, K * R * E]);
}
/** [B,T,K,E] -> [G, T, E] */
function groupKv(x: T4, B: number, T: number, K: number, E: number): tf.Tensor3D {
  return tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [B * K, T, E]);
}
/** [B,T,K,E] -> [G, E, T] */
function groupKvT(x: T4, B: number, T: number, K: number, E: number): tf.Tensor3D {
  return tf.reshape(tf.transpose(x, [0, 2, 3, 1]), [B * K, E, T]);
}
/** [G, E, T] -> [N, K*E] */
function ungroupKvT(x: tf.Tensor3D, B: number, T: number, K: number, E: number): T2 {
  return tf.reshape(tf.transpose(tf.reshape(x, [B, K, E, T]), [0, 3, 1, 2]), [B * T, K * E]);
}

function savedTensors(s: Saved): tf.Tensor[] {
  return [s.xhat1, s.r1, s.h1, s.qr, s.kr, s.v, ...s.p, s.o, s.x1, s.xhat2, s.r2, s.h2, s.g, s.u, s.sg, s.a, s.m];
}

function keptTensors(k: Kept): tf.Tensor[] {
  return [k.qr, k.kr, k.v, k.o, k.x1, k.g, k.u];
}

// -------------------------------------------------------------------- host side

/**
 * A tensor's float32 values in JS. On wasm: a view on the wasm heap (no copy; dataSync copies at
 * ~10 ns/float); valid only until the next tfjs allocation, so read it at once. Elsewhere: dataSync.
 */
export function readHost(t: tf.Tensor): Float32Array {
  if (tf.getBackend() === "wasm") {
    const be = tf.backend() as unknown as { typedArrayFromHeap?: (t: tf.TensorInfo) => Float32Array };
    if (typeof be.typedArrayFromHeap === "function") return be.typedArrayFromHeap(t);
  }
  return t.dataSync() as Float32Array;
}

/**
 * wasm only: overwrite a float32 tensor's values in place. The tensor's id is unregistered and registered again
 * on the C++ side (same memory) first: tfjs-wasm frees what it caches per tensor id on that unregistering (the
 * XNNPACK operators holding a packed copy of a matMul's right operand), so no stale packed copy survives.
 * `write` gets a fresh view of the tensor's heap memory and must fill all of it.
 */
function wasmOverwrite(t: tf.Tensor, write: (heap: Float32Array) => void): void {
  interface WasmBe {
    dataIdMap: { get(d: object): { id: number; memoryOffset: number; refCount?: number } | undefined };
    wasm: { HEAPU8: Uint8Array; tfjs: { disposeData(id: number): void; registerTensor(id: number, size: number, offset: number): void } };
  }
  const be = tf.backend() as unknown as WasmBe;
  const d = be.dataIdMap.get(t.dataId);
  if (!d || t.dtype !== "float32") throw new Error(`wasmOverwrite: tensor ${t.id} is not a live float32 wasm tensor`);
  if ((d.refCount ?? 1) !== 1) throw new Error(`wasmOverwrite: tensor ${t.id} shares its data (refCount ${d.refCount})`);
  be.wasm.tfjs.disposeData(d.id);
  be.wasm.tfjs.registerTensor(d.id, t.size, d.memoryOffset);
  // the view after registering: the C++ side may allocate, and a memory growth detaches older views
  write(new Float32Array(be.wasm.HEAPU8.buffer, d.memoryOffset, t.size));
}

/** dst[off + i] += src[i] (float32 adds, as the accumulation of micro-batch gradients). */
function addInto(dst: Float32Array, off: number, src: Float32Array): void {
  const d = dst.subarray(off, off + src.length);
  for (let i = 0; i < src.length; i++) d[i] += src[i];
}

/** [rows, cols] -> [cols, rows] into `out`, in 64x64 blocks written row by row (the faster order measured). */
export function transposeJs<O extends Float32Array<ArrayBufferLike>>(src: Float32Array<ArrayBufferLike>, rows: number, cols: number, out: O = new Float32Array(rows * cols) as O): O {
  if (out.length !== rows * cols || src.length !== rows * cols) throw new RangeError(`transposeJs: sizes ${src.length}/${out.length} for [${rows}, ${cols}]`);
  const BS = 64;
  for (let c0 = 0; c0 < cols; c0 += BS) {
    const c1 = Math.min(cols, c0 + BS);
    for (let r0 = 0; r0 < rows; r0 += BS) {
      const r1 = Math.min(rows, r0 + BS);
      for (let c = c0; c < c1; c++) {
        const o = c * rows;
        for (let r = r0; r < r1; r++) out[o + r] = src[r * cols + c];
      }
    }
  }
  return out;
}
