/**
 * Llama (HF LlamaForCausalLM math, M4) with a hand-written backward pass, llm.c style: for each op a forward and
 * a backward function side by side, on flat row-major Float32Arrays, through the engine's Kernels (kernels.ts).
 *
 * Shape legend:  B batch, T sequence, N = B*T tokens, D hidden, H query heads, K kv heads, E head_dim,
 *                F ffn width, V vocab, L layers, C tokens per LM-head chunk.
 *
 * Weights are READ from the bound flat fp32 parameters (layout.ts order, HF [out, in] shapes), in place: a
 * projection is a forward job, y = x @ W^T (plus the residual where the block adds one), and two backward jobs,
 * dW += dy^T @ x and dx = dy @ W, each a product of the kernels' matmuls (kernels.ts: matmuls, or the matmul
 * calls it equals on an engine without it); the tied LM head is one too. Products that share a call share one
 * matmuls list: q, k and v forward; gate and up; each projection's backward; q, k and v backward (their dx one
 * job of three terms), gate and up likewise. No
 * replica, no transposed copy: the model sees the shared master weights as they are at each call. Gradients
 * ACCUMULATE (beta 1, +=) straight into the caller's gradient buffer (same layout), scaled by gradScale.
 * Activations live in an arena allocated once per (B, T). Gradient checkpointing (M6) keeps each block's input
 * and recomputes the block's activations right before its backward, with the same kernels on the same inputs:
 * the gradients are bit-identical to the run without it, so the policy is only a trade of time for memory, chosen
 * per (B, T) by activationPlan: the fastest that fits activationBudgetBytes, in the order measured (docs/RULES.md
 * M6): keep everything ("none"); keep the blocks' matmul outputs and attention's (q, k, v, o, lse, x1, gate, up)
 * and recompute only the norms and SwiGLU ("kept"); recompute whole blocks but attention, whose out and lse are
 * kept; recompute whole blocks (minus the down projection). Attention keeps no [B,H,T,T] matrix:
 * its backward recomputes the probabilities from the saved log-sum-exp (kernels.ts).
 * Generation runs this same forward on new positions with a key/value cache (forwardCached, KvCache): the only
 * difference is attention, over the cache through the kernels' attentionCachedForward.
 * A layer's weights are bound by name in one place (layout.ts: weightBinder).
 */
import { UserError } from "../errors";
import type { LlamaConfig } from "./llama-config";
import { type DeferredKernels, isDeferred, type Kernels, type MatmulJob, runMatmuls } from "./kernels";
import { type LayerWeights, type WeightBinder, weightBinder } from "./layout";

/** One block's activations: what its backward reads. */
interface Acts {
  h1: Float32Array;
  r1: Float32Array; // input norm: [N,D], rstd [N]
  q: Float32Array;
  k: Float32Array;
  v: Float32Array; // [N,H*E], [N,K*E], [N,K*E]; q and k after RoPE
  lse: Float32Array; // attention's per-row log-sum-exp [B,H,T] (the backward recomputes the probabilities)
  o: Float32Array; // attention output [N,H*E]
  x1: Float32Array; // x + o @ Wo^T [N,D]
  h2: Float32Array;
  r2: Float32Array; // post-attention norm
  gate: Float32Array;
  up: Float32Array;
  swiglu: Float32Array; // gate, up, silu(gate)*up [N,F]
}

/** Everything one (B, T) needs, allocated once. */
interface Arena {
  B: number;
  T: number;
  xs: Float32Array[]; // xs[l] = block l's input [N,D]; xs[L] feeds the final norm
  acts: Acts[]; // one per layer (training), sharing arrays per the recomputation; [0] forward only
  recompute: "none" | "kept" | "whole"; // M6: nothing, the non-matmul part of each block, or whole blocks
  attnKept: boolean; // attention's out and lse kept per layer (all but "whole" over its budget): never recomputed
  hF: Float32Array;
  rF: Float32Array; // final norm [N,D], [N]
  logits: Float32Array; // one LM-head chunk [C,V]
  targets: Int32Array; // [N]: the next token, -1 at each row's last position
  cos: Float32Array;
  sin: Float32Array; // RoPE tables [T, E/2]
  grads: {
    dx: Float32Array;
    dh: Float32Array; // the residual stream's gradient, a norm output's [N,D]
    dO: Float32Array;
    dq: Float32Array;
    dk: Float32Array;
    dv: Float32Array;
    dSwiglu: Float32Array;
    dGate: Float32Array;
    dUp: Float32Array;
  } | null;
}

export interface LlamaOptions {
  /** M6: recompute each block in the backward pass instead of keeping its activations. */
  gradCkpt: boolean;
  /**
   * Tokens per LM-head / cross-entropy chunk; default: a deferred engine's headChunkTokens, else ~2^24 logits
   * (64 MB) at once (defaultHeadChunkTokens). Results do not depend on it beyond float rounding.
   */
  headChunkTokens?: number;
  /**
   * M6, with gradCkpt: the bytes a training arena may take (activationPlan); default 0, the least memory (whole
   * blocks recomputed). The session passes the run's budget (--activation-budget-gb).
   */
  activationBudgetBytes?: number;
}

export class Llama {
  readonly cfg: LlamaConfig;
  readonly gradCkpt: boolean;
  private readonly ops: Kernels;
  /** The same engine when it is deferred (kernels.ts: DeferredKernels), else null. */
  private readonly dev: DeferredKernels | null;
  private readonly bind: WeightBinder;
  private readonly headChunkTokens: number;
  private readonly activationBudgetBytes: number;
  private params: Float32Array | null = null;
  private readonly arenas = new Map<string, Arena>();

  constructor(c: LlamaConfig, kernels: Kernels, o: LlamaOptions) {
    if (c.numHeads % c.numKvHeads !== 0)
      throw new UserError("M2", `num_key_value_heads ${c.numKvHeads} must divide num_attention_heads ${c.numHeads}`);
    if (c.headDim % 2 !== 0) throw new UserError("M2", `head_dim ${c.headDim} must be even (RoPE)`);
    this.cfg = c;
    this.ops = kernels;
    this.dev = isDeferred(kernels) ? kernels : null;
    this.gradCkpt = o.gradCkpt;
    this.bind = weightBinder(c);
    const hc = o.headChunkTokens ?? this.dev?.headChunkTokens(c.vocabSize) ?? defaultHeadChunkTokens(c.vocabSize);
    if (!Number.isInteger(hc) || hc < 1)
      throw new RangeError(`Llama: headChunkTokens ${o.headChunkTokens} must be a positive integer`);
    this.headChunkTokens = hc;
    const kb = o.activationBudgetBytes ?? 0;
    if (!(kb >= 0) || Number.isNaN(kb))
      throw new RangeError(`Llama: activationBudgetBytes ${o.activationBudgetBytes} must be a number >= 0`);
    this.activationBudgetBytes = kb;
  }

  /** Binds the flat fp32 parameters (any Float32Array, e.g. a view on a SharedArrayBuffer): read at every call, never copied. */
  bindParams(params: Float32Array): void {
    if (params.length !== this.bind.total)
      throw new RangeError(`bindParams: params has ${params.length} floats, the layout needs ${this.bind.total}`);
    this.params = params;
  }

  /** Bytes held in activation arenas (typed arrays outside the V8 heap). */
  arenaBytes(): number {
    const arrays = new Set<Float32Array | Int32Array>(); // acts share arrays: count each once
    for (const a of this.arenas.values()) {
      for (const x of [...a.xs, a.hF, a.rF, a.logits, a.targets, a.cos, a.sin]) arrays.add(x);
      for (const s of a.acts) for (const x of Object.values(s)) arrays.add(x);
      if (a.grads) for (const x of Object.values(a.grads)) arrays.add(x);
    }
    let n = 0;
    for (const x of arrays) n += x.byteLength;
    return n;
  }

  dispose(): void {
    this.arenas.clear();
    this.params = null;
  }

  // ================================================================ public passes

  /**
   * HF causal-LM loss (positions 0..T-2 predict 1..T-1, mean over B*(T-1)); ADDS d(loss * gradScale)/dθ into
   * gradOut (flat layout, += so micro-batches accumulate). Returns the unscaled loss.
   */
  lossAndGrads(ids: Int32Array, B: number, T: number, gradScale: number, gradOut: Float32Array): number {
    const P = this.check(ids, B, T);
    if (gradOut.length !== this.bind.total)
      throw new RangeError(`lossAndGrads: gradOut has ${gradOut.length} floats, the layout needs ${this.bind.total}`);
    if (!Number.isFinite(gradScale) || gradScale <= 0)
      throw new RangeError(`lossAndGrads: gradScale ${gradScale} must be a positive finite number`);
    const a = this.arena(B, T, true),
      grads = a.grads!,
      L = this.cfg.numLayers;
    // ---- forward: keep every block's input; its activations too unless checkpointing
    this.ops.embeddingForward(a.xs[0], ids, this.bind.embed(P), B * T, this.cfg.hiddenSize);
    for (let l = 0; l < L; l++) this.blockForward(P, l, a, a.acts[l], "forward");
    // ---- final norm, LM head + cross-entropy (dhF lands in grads.dh), final norm backward into dx
    this.finalNormForward(P, a);
    const loss = this.headForwardBackward(P, a, gradScale, gradOut);
    this.zero(grads.dx);
    this.finalNormBackward(P, a, gradOut);
    // ---- blocks in reverse (M6: recompute the block's activations from its input first)
    for (let l = L - 1; l >= 0; l--) {
      if (a.recompute !== "none") this.blockForward(P, l, a, a.acts[l], "recompute");
      this.blockBackward(P, l, a, a.acts[l], gradOut);
    }
    this.ops.embeddingBackward(this.bind.embed(gradOut), ids, grads.dx, B * T, this.cfg.hiddenSize);
    return loss;
  }

  /** The loss alone (no gradients). */
  loss(ids: Int32Array, B: number, T: number): number {
    const P = this.check(ids, B, T);
    const a = this.forwardHidden(P, ids, B, T, null);
    let sum = 0;
    this.headChunks(P, a, (c0, len, logits) => {
      sum += this.ops.crossEntropy(logits, a.targets.subarray(c0, c0 + len), len, this.cfg.vocabSize, 0);
    });
    return sum / (B * (T - 1));
  }

  /** Logits [B, T, V], row-major. */
  logits(ids: Int32Array, B: number, T: number): Float32Array {
    const P = this.check(ids, B, T);
    return this.headLogits(P, this.forwardHidden(P, ids, B, T, null));
  }

  /**
   * Generation (G11): logits [T, V] of T new tokens of one sequence at positions cache.length .. cache.length+T-1.
   * The same forward as training's (embedding, each block's norms, projections, RoPE, SwiGLU and residuals, the
   * final norm, the tied head, through the same kernels), except that each block writes its new keys and values into
   * the cache and attends over the whole cache (attentionCachedForward). The cache then holds T more positions.
   */
  forwardCached(ids: Int32Array, cache: KvCache): Float32Array {
    const P = this.checkCached(ids, cache);
    const out = this.headLogits(P, this.forwardHidden(P, ids, 1, ids.length, cache));
    cache.length += ids.length;
    return out;
  }

  // ================================================================ decoder block = attention, then MLP

  /**
   * "forward": xs[l+1] = block(xs[l]), activations into s. "recompute" (M6) redoes what the backward reads and the
   * arena did not keep (the matmul outputs unless "whole"; attention unless its out and lse were kept), never the
   * block's output.
   */
  private blockForward(
    P: Float32Array,
    l: number,
    a: Arena,
    s: Acts,
    pass: "forward" | "recompute",
    cache: KvCache | null = null,
  ): void {
    const W = this.bind.layer(P, l),
      mm = pass === "forward" || a.recompute === "whole",
      attn = pass === "forward" || !a.attnKept;
    this.attentionForward(W, a, s, a.xs[l], mm, attn, cache?.layer(l, a.T) ?? null);
    this.mlpForward(W, a, s, mm, pass === "forward" ? a.xs[l + 1] : null);
  }

  /** In: grads.dx = dL/d(block output). Out: grads.dx = dL/d(block input); weight gradients += into gradOut. */
  private blockBackward(P: Float32Array, l: number, a: Arena, s: Acts, gradOut: Float32Array): void {
    const W = this.bind.layer(P, l),
      dW = this.bind.layer(gradOut, l);
    this.mlpBackward(W, dW, a, s);
    this.attentionBackward(W, dW, a, s, a.xs[l]);
  }

  // ---------------------------------------------------------------- attention: x1 = x + o_proj(attn(rope(qkv(norm1(x)))))

  /**
   * mm: the projections (and RoPE) run, else they were kept; attn: attention runs, else its out and lse were kept.
   * kv: generation's cache of this layer (the new keys and values go into it; attention runs over all of it).
   */
  private attentionForward(
    W: LayerWeights,
    a: Arena,
    s: Acts,
    x: Float32Array,
    mm: boolean,
    attn: boolean,
    kv: CachedLayer | null,
  ): void {
    const c = this.cfg,
      ops = this.ops,
      N = a.B * a.T,
      D = c.hiddenSize,
      H = c.numHeads,
      K = c.numKvHeads,
      E = c.headDim;
    ops.rmsnormForward(s.h1, s.r1, x, W.inputNorm, N, D, c.rmsNormEps);
    if (mm) {
      this.matmuls([
        fwd(s.q, s.h1, W.wq, N, D, H * E),
        fwd(s.k, s.h1, W.wk, N, D, K * E),
        fwd(s.v, s.h1, W.wv, N, D, K * E),
      ]);
      const { cos, sin } = kv ?? a; // RoPE at the positions these tokens hold
      if (this.dev) this.dev.ropeQK(s.q, s.k, cos, sin, a.B, a.T, H, K, E, false);
      else {
        ops.ropeForward(s.q, cos, sin, a.B, a.T, H, E);
        ops.ropeForward(s.k, cos, sin, a.B, a.T, K, E);
      }
    }
    if (kv) {
      const at = kv.past * K * E;
      this.copy(kv.keys.subarray(at, at + s.k.length), s.k);
      this.copy(kv.values.subarray(at, at + s.v.length), s.v);
      ops.attentionCachedForward(s.o, s.q, kv.keys, kv.values, kv.past, a.T, H, K, E);
    } else if (attn) ops.attentionForward(s.o, s.lse, s.q, s.k, s.v, a.B, a.T, H, K, E); // recomputed: the same bits
    if (mm) this.matmuls([fwd(s.x1, s.o, W.wo, N, H * E, D, x)]); // x1 = x + o Wo^T: the residual
  }

  /** grads.dx = dL/dx1 in, dL/dx out (the residual passes dx1 through; norm1's backward adds into it). */
  private attentionBackward(W: LayerWeights, dW: LayerWeights, a: Arena, s: Acts, x: Float32Array): void {
    const c = this.cfg,
      ops = this.ops,
      g = a.grads!,
      N = a.B * a.T,
      D = c.hiddenSize,
      H = c.numHeads,
      K = c.numKvHeads,
      E = c.headDim;
    // g.dx = dL/dx1 is also dL/dx through the residual: rmsnormBackward adds norm1's part into it last
    this.matmuls([dWJob(dW.wo, g.dx, s.o, N, H * E, D), dxJob(g.dO, [[g.dx, W.wo, D]], N, H * E)]);
    ops.attentionBackward(g.dq, g.dk, g.dv, g.dO, s.q, s.k, s.v, s.o, s.lse, a.B, a.T, H, K, E);
    if (this.dev) this.dev.ropeQK(g.dq, g.dk, a.cos, a.sin, a.B, a.T, H, K, E, true);
    else {
      ops.ropeBackward(g.dq, a.cos, a.sin, a.B, a.T, H, E);
      ops.ropeBackward(g.dk, a.cos, a.sin, a.B, a.T, K, E);
    }
    // dh = dq Wq + dk Wk + dv Wv: one job of three terms, summed in that order
    this.matmuls([
      dWJob(dW.wq, g.dq, s.h1, N, D, H * E),
      dWJob(dW.wk, g.dk, s.h1, N, D, K * E),
      dWJob(dW.wv, g.dv, s.h1, N, D, K * E),
      dxJob(
        g.dh,
        [
          [g.dq, W.wq, H * E],
          [g.dk, W.wk, K * E],
          [g.dv, W.wv, K * E],
        ],
        N,
        D,
      ),
    ]);
    ops.rmsnormBackward(g.dx, dW.inputNorm, g.dh, x, W.inputNorm, s.r1, N, D);
  }

  // ---------------------------------------------------------------- MLP: out = x1 + down(silu(gate(h2)) * up(h2)), h2 = norm2(x1)

  private mlpForward(W: LayerWeights, a: Arena, s: Acts, mm: boolean, out: Float32Array | null): void {
    const c = this.cfg,
      ops = this.ops,
      N = a.B * a.T,
      D = c.hiddenSize,
      F = c.intermediateSize;
    ops.rmsnormForward(s.h2, s.r2, s.x1, W.postAttnNorm, N, D, c.rmsNormEps);
    if (mm) {
      this.matmuls([fwd(s.gate, s.h2, W.wGate, N, D, F), fwd(s.up, s.h2, W.wUp, N, D, F)]);
    }
    ops.swigluForward(s.swiglu, s.gate, s.up, N * F);
    if (out) this.matmuls([fwd(out, s.swiglu, W.wDown, N, F, D, s.x1)]); // out = x1 + swiglu Wdown^T: the residual
  }

  /** grads.dx = dL/dout in, dL/dx1 out. */
  private mlpBackward(W: LayerWeights, dW: LayerWeights, a: Arena, s: Acts): void {
    const c = this.cfg,
      ops = this.ops,
      g = a.grads!,
      N = a.B * a.T,
      D = c.hiddenSize,
      F = c.intermediateSize;
    // g.dx = dL/dout is also dL/dx1 through the residual: rmsnormBackward adds norm2's part into it last
    this.matmuls([dWJob(dW.wDown, g.dx, s.swiglu, N, F, D), dxJob(g.dSwiglu, [[g.dx, W.wDown, D]], N, F)]);
    ops.swigluBackward(g.dGate, g.dUp, g.dSwiglu, s.gate, s.up, N * F);
    this.matmuls([
      dWJob(dW.wGate, g.dGate, s.h2, N, D, F),
      dWJob(dW.wUp, g.dUp, s.h2, N, D, F),
      dxJob(
        g.dh,
        [
          [g.dGate, W.wGate, F],
          [g.dUp, W.wUp, F],
        ],
        N,
        D,
      ),
    ]);
    ops.rmsnormBackward(g.dx, dW.postAttnNorm, g.dh, s.x1, W.postAttnNorm, s.r2, N, D);
  }

  // ---------------------------------------------------------------- linear: y = x W^T (+ residual), W [out, in] as in HF

  /** The products of `jobs` (fwd, dWJob, dxJob): one matmuls call, or the matmul calls it equals (kernels.ts). */
  private matmuls(jobs: MatmulJob[]): void {
    runMatmuls(this.ops, jobs);
  }

  // ================================================================ final norm, then the LM head (tied to the embedding) + cross-entropy

  /** hF = norm(xs[L]) with the final norm's weight. */
  private finalNormForward(P: Float32Array, a: Arena): void {
    const c = this.cfg;
    this.ops.rmsnormForward(
      a.hF,
      a.rF,
      a.xs[c.numLayers],
      this.bind.finalNorm(P),
      a.B * a.T,
      c.hiddenSize,
      c.rmsNormEps,
    );
  }

  /** grads.dh = dL/dhF in; grads.dx += dL/dxs[L] and the final norm's weight gradient += into gradOut. */
  private finalNormBackward(P: Float32Array, a: Arena, gradOut: Float32Array): void {
    const c = this.cfg,
      g = a.grads!;
    const [xL, w, dw] = [a.xs[c.numLayers], this.bind.finalNorm(P), this.bind.finalNorm(gradOut)];
    this.ops.rmsnormBackward(g.dx, dw, g.dh, xL, w, a.rF, a.B * a.T, c.hiddenSize);
  }

  /** logits = hF @ E^T in chunks of C rows, [N, V] never at once; `each` sees one chunk's logits [len, V]. */
  private headChunks(P: Float32Array, a: Arena, each: (c0: number, len: number, logits: Float32Array) => void): void {
    const N = a.B * a.T,
      D = this.cfg.hiddenSize,
      V = this.cfg.vocabSize,
      E = this.bind.embed(P);
    for (let c0 = 0; c0 < N; c0 += this.headChunkTokens) {
      const len = Math.min(this.headChunkTokens, N - c0);
      this.matmuls([fwd(a.logits, a.hF.subarray(c0 * D, (c0 + len) * D), E, len, D, V)]); // the tied head
      each(c0, len, a.logits);
    }
  }

  /** Per chunk of the final hidden states: logits, cross-entropy (logits become dlogits), dhF = dlogits @ E, dE += dlogits^T @ hF. */
  private headForwardBackward(P: Float32Array, a: Arena, gradScale: number, gradOut: Float32Array): number {
    const c = this.cfg,
      D = c.hiddenSize,
      V = c.vocabSize;
    const E = this.bind.embed(P),
      dE = this.bind.embed(gradOut),
      dh = a.grads!.dh;
    const coef = gradScale / (a.B * (a.T - 1)); // d(mean loss * gradScale)/d(logits) = (softmax - onehot) * coef
    let sum = 0;
    this.headChunks(P, a, (c0, len, logits) => {
      sum += this.ops.crossEntropy(logits, a.targets.subarray(c0, c0 + len), len, V, coef);
      const hc = a.hF.subarray(c0 * D, (c0 + len) * D);
      // the head's backward: dE += dlogits^T hF, dhF = dlogits E
      this.matmuls([
        dWJob(dE, logits, hc, len, D, V),
        dxJob(dh.subarray(c0 * D, (c0 + len) * D), [[logits, E, V]], len, D),
      ]);
    });
    return sum / (a.B * (a.T - 1));
  }

  // ================================================================ plumbing

  /** dst = src, through a deferred engine (it keeps both on the device), else on the host. */
  private copy(dst: Float32Array, src: Float32Array): void {
    if (this.dev) this.dev.copy(dst, src);
    else dst.set(src);
  }

  /** x = 0, through a deferred engine, else on the host. */
  private zero(x: Float32Array): void {
    if (this.dev) this.dev.fill(x, 0);
    else x.fill(0);
  }

  /** Embedding, the blocks and the final norm, activations of one block at a time (loss / logits / generation). */
  private forwardHidden(P: Float32Array, ids: Int32Array, B: number, T: number, cache: KvCache | null): Arena {
    const c = this.cfg,
      a = this.arena(B, T, false),
      D = c.hiddenSize,
      N = B * T;
    this.ops.embeddingForward(a.xs[0], ids, this.bind.embed(P), N, D);
    for (let l = 0; l < c.numLayers; l++) this.blockForward(P, l, a, a.acts[0], "forward", cache);
    this.finalNormForward(P, a);
    return a;
  }

  /** The logits [N, V] of the arena's final hidden states, through the head's chunks. */
  private headLogits(P: Float32Array, a: Arena): Float32Array {
    const V = this.cfg.vocabSize,
      out = new Float32Array(a.B * a.T * V);
    this.headChunks(P, a, (c0, len, logits) =>
      this.copy(out.subarray(c0 * V, (c0 + len) * V), logits.subarray(0, len * V)),
    );
    return out;
  }

  /** Validates a cached pass's arguments before any compute; returns the bound parameters. */
  private checkCached(ids: Int32Array, cache: KvCache): Float32Array {
    if (!this.params) throw new Error("Llama: bindParams() must be called before any pass");
    const c = this.cfg,
      kc = cache.cfg;
    if (
      kc.numLayers !== c.numLayers ||
      kc.numKvHeads !== c.numKvHeads ||
      kc.headDim !== c.headDim ||
      kc.ropeTheta !== c.ropeTheta
    )
      throw new RangeError(
        "Llama: the KV cache was made for a model of other layers, kv heads, head_dim or rope_theta",
      );
    const V = c.vocabSize;
    if (ids.length < 1) throw new RangeError("Llama: a cached pass needs at least one new token");
    for (const id of ids)
      if (id < 0 || id >= V) throw new UserError("M4", `token id ${id} is outside the vocabulary [0, ${V})`);
    if (cache.length + ids.length > cache.capacity)
      throw new UserError(
        "M1",
        `the sequence reached the model's ${cache.capacity} positions (max_position_embeddings); ask for fewer new tokens`,
      );
    return this.params;
  }

  /** Validates a pass's arguments before any compute; returns the bound parameters. */
  private check(ids: Int32Array, B: number, T: number): Float32Array {
    if (!this.params) throw new Error("Llama: bindParams() must be called before any pass");
    if (!Number.isInteger(B) || B < 1 || !Number.isInteger(T) || T < 2)
      throw new RangeError(`Llama: batch ${B} and seqLen ${T} must be integers >= 1 and >= 2`);
    if (ids.length !== B * T) throw new RangeError(`Llama: ${ids.length} token ids for batch ${B} x seqLen ${T}`);
    const V = this.cfg.vocabSize;
    for (let i = 0; i < ids.length; i++) {
      const t = ids[i];
      if (t < 0 || t >= V)
        throw new UserError(
          "M4",
          `token id ${t} at position ${i} is outside the vocabulary [0, ${V}); the data was tokenized with another tokenizer or the model's vocab_size is wrong`,
        );
    }
    const a = this.arena(B, T, false);
    for (let n = 0; n < B * T; n++) a.targets[n] = n % T === T - 1 ? -1 : ids[n + 1];
    return this.params;
  }

  /** The (B, T) arena, grown to a full set of per-layer activations and gradient scratch when `training`. */
  private arena(B: number, T: number, training: boolean): Arena {
    const c = this.cfg,
      N = B * T,
      D = c.hiddenSize,
      H = c.numHeads,
      K = c.numKvHeads,
      E = c.headDim,
      F = c.intermediateSize,
      L = c.numLayers;
    const f32 = (n: number): Float32Array => new Float32Array(n);
    const newActs = (): Acts => ({
      h1: f32(N * D),
      r1: f32(N),
      q: f32(N * H * E),
      k: f32(N * K * E),
      v: f32(N * K * E),
      lse: f32(B * H * T),
      o: f32(N * H * E),
      x1: f32(N * D),
      h2: f32(N * D),
      r2: f32(N),
      gate: f32(N * F),
      up: f32(N * F),
      swiglu: f32(N * F),
    });
    let a = this.arenas.get(`${B}x${T}`);
    if (!a) {
      const { cos, sin } = ropeTables(T, E, c.ropeTheta);
      this.dev?.constant(cos); // a deferred engine keeps the tables resident
      this.dev?.constant(sin);
      a = {
        B,
        T,
        xs: Array.from({ length: L + 1 }, () => f32(N * D)),
        acts: [newActs()],
        hF: f32(N * D),
        rF: f32(N),
        logits: f32(Math.min(N, this.headChunkTokens) * c.vocabSize),
        targets: new Int32Array(N),
        cos,
        sin,
        grads: null,
        recompute: "none",
        attnKept: true,
      };
      this.arenas.set(`${B}x${T}`, a);
    }
    if (training && !a.grads) {
      // M6: the fastest policy whose arena fits the budget (activationPlan)
      const p = activationPlan(c, B, T, this.gradCkpt, this.activationBudgetBytes, this.headChunkTokens);
      a.recompute = p.recompute;
      a.attnKept = p.attnKept;
      const s = a.acts[0];
      for (let l = 1; l < L; l++) {
        if (a.recompute === "none") a.acts.push(newActs());
        else if (a.recompute === "kept")
          a.acts.push({
            ...s,
            q: f32(N * H * E),
            k: f32(N * K * E),
            v: f32(N * K * E),
            o: f32(N * H * E),
            lse: f32(B * H * T),
            x1: f32(N * D),
            gate: f32(N * F),
            up: f32(N * F),
          });
        else if (a.attnKept) a.acts.push({ ...s, o: f32(N * H * E), lse: f32(B * H * T) });
        else a.acts.push(s);
      }
      a.grads = {
        dx: f32(N * D),
        dh: f32(N * D),
        dO: f32(N * H * E),
        dq: f32(N * H * E),
        dk: f32(N * K * E),
        dv: f32(N * K * E),
        dSwiglu: f32(N * F),
        dGate: f32(N * F),
        dUp: f32(N * F),
      };
    }
    return a;
  }
}

/** One layer's view of a KvCache for a pass of T new positions. */
interface CachedLayer {
  keys: Float32Array;
  values: Float32Array; // [capacity, K*E]
  past: number; // positions already cached; the pass writes past .. past+T-1
  cos: Float32Array;
  sin: Float32Array; // RoPE tables of the new positions [T, E/2]
}

/**
 * The key/value cache of one sequence for Llama.forwardCached: per layer, keys (after RoPE) and values
 * [capacity, K*E], and the RoPE tables of every position it can hold. `length` positions are filled.
 */
export class KvCache {
  /** Positions filled so far (the next token goes to position `length`). */
  length = 0;
  private readonly keys: Float32Array[];
  private readonly values: Float32Array[];
  private readonly cos: Float32Array;
  private readonly sin: Float32Array;

  constructor(
    readonly cfg: LlamaConfig,
    readonly capacity: number,
  ) {
    if (!Number.isInteger(capacity) || capacity < 1)
      throw new RangeError(`KvCache: capacity ${capacity} must be a positive integer`);
    const kvd = cfg.numKvHeads * cfg.headDim;
    this.keys = Array.from({ length: cfg.numLayers }, () => new Float32Array(capacity * kvd));
    this.values = Array.from({ length: cfg.numLayers }, () => new Float32Array(capacity * kvd));
    ({ cos: this.cos, sin: this.sin } = ropeTables(capacity, cfg.headDim, cfg.ropeTheta));
  }

  /** Forget every position (a new sequence). */
  reset(): void {
    this.length = 0;
  }

  /** Layer l's cache for a pass of T new positions. */
  layer(l: number, T: number): CachedLayer {
    const h = this.cfg.headDim / 2,
      p = this.length;
    return {
      keys: this.keys[l],
      values: this.values[l],
      past: p,
      cos: this.cos.subarray(p * h, (p + T) * h),
      sin: this.sin.subarray(p * h, (p + T) * h),
    };
  }
}

/** Tokens per LM-head chunk when not given: ~2^24 logits (64 MB) at once. */
export function defaultHeadChunkTokens(vocabSize: number): number {
  return Math.max(1, Math.floor((1 << 24) / vocabSize));
}

/** M6: what a training arena of one (B, T) keeps, and its bytes. */
export interface ActivationPlan {
  recompute: "none" | "kept" | "whole";
  /** attention's out and lse kept per layer (never recomputed) */
  attnKept: boolean;
  /** bytes of the whole training arena (activations, block inputs, gradient scratch, one LM-head chunk) */
  bytes: number;
  /** false when even the least-memory policy is over the budget (it runs anyway) */
  fits: boolean;
}

/**
 * M6: every recomputation policy of a training arena of (B, T), fastest first, as measured (docs/RULES.md M6):
 * keep everything, keep the matmul outputs, recompute whole blocks but attention, recompute whole blocks; with the
 * bytes each arena takes, exactly what Llama allocates. `fits` is left false (activationPlan sets it).
 */
export function activationPlans(
  c: LlamaConfig,
  B: number,
  T: number,
  headChunkTokens: number = defaultHeadChunkTokens(c.vocabSize),
): ActivationPlan[] {
  const N = B * T,
    D = c.hiddenSize,
    H = c.numHeads,
    K = c.numKvHeads,
    E = c.headDim,
    F = c.intermediateSize,
    L = c.numLayers;
  const matmulOuts = N * (2 * H * E + 2 * K * E + D + 2 * F) + B * H * T; // q, k, v, o, x1, gate, up; lse
  const full = matmulOuts + N * (2 * D + 2 + F); // + h1, h2, r1, r2, swiglu
  const common =
    (L + 1) * N * D + // block inputs
    full + // layer 0's activations (every policy's shared scratch)
    N * D +
    N + // final norm
    Math.min(N, headChunkTokens) * c.vocabSize + // one LM-head chunk of logits
    N + // targets
    T * E + // RoPE cos and sin
    2 * N * D +
    2 * N * H * E +
    2 * N * K * E +
    3 * N * F; // gradient scratch
  const attn = N * H * E + B * H * T; // o, lse
  const perLayer: Array<[ActivationPlan["recompute"], boolean, number]> = [
    ["none", true, full],
    ["kept", true, matmulOuts],
    ["whole", true, attn],
    ["whole", false, 0],
  ];
  return perLayer.map(([recompute, attnKept, floats]) => ({
    recompute,
    attnKept,
    bytes: 4 * (common + (L - 1) * floats),
    fits: false,
  }));
}

/**
 * M6: the fastest policy of activationPlans whose arena fits budgetBytes, else the least memory (fits false).
 * Without gradCkpt nothing is recomputed, whatever the memory.
 */
export function activationPlan(
  c: LlamaConfig,
  B: number,
  T: number,
  gradCkpt: boolean,
  budgetBytes: number,
  headChunkTokens: number = defaultHeadChunkTokens(c.vocabSize),
): ActivationPlan {
  const all = activationPlans(c, B, T, headChunkTokens).map((p) => ({ ...p, fits: p.bytes <= budgetBytes }));
  if (!gradCkpt) return all[0];
  return all.find((p) => p.fits) ?? all[all.length - 1];
}

/** RoPE tables [T, E/2] (M4): angle t / theta^(2i/E) in float64, its cos and sin rounded once to float32. */
export function ropeTables(T: number, E: number, theta: number): { cos: Float32Array; sin: Float32Array } {
  const h = E / 2,
    cos = new Float32Array(T * h),
    sin = new Float32Array(T * h);
  for (let t = 0; t < T; t++) {
    for (let i = 0; i < h; i++) {
      const ang = t / Math.pow(theta, (2 * i) / E);
      cos[t * h + i] = Math.cos(ang);
      sin[t * h + i] = Math.sin(ang);
    }
  }
  return { cos, sin };
}

// ---------------------------------------------------------------- the projections' products, as matmuls jobs

/**
 * y[N, out] = x[N, in] @ W^T, or residual + x @ W^T when a residual [N, out] is given: the product is added to
 * y = residual (matmuls' add: copy, then beta 1), one rounding per element, the same bits as adding it afterwards.
 */
function fwd(
  y: Float32Array,
  x: Float32Array,
  W: Float32Array,
  N: number,
  inF: number,
  outF: number,
  residual?: Float32Array,
): MatmulJob {
  const term = { tA: false, tB: true, M: N, N: outF, K: inF, alpha: 1, A: x, B: W };
  return residual ? { C: y, beta: 1, add: residual, terms: [term] } : { C: y, beta: 0, terms: [term] };
}

/** dW[out, in] += dy^T @ x (accumulates over micro-batches). */
function dWJob(dW: Float32Array, dy: Float32Array, x: Float32Array, N: number, inF: number, outF: number): MatmulJob {
  return { C: dW, beta: 1, terms: [{ tA: true, tB: false, M: outF, N: inF, K: N, alpha: 1, A: dy, B: x }] };
}

/** dx[N, in] = sum over [dy, W, out] of dy[N, out] @ W[out, in], in that order (each later term added, beta 1). */
function dxJob(
  dx: Float32Array,
  parts: [dy: Float32Array, W: Float32Array, outF: number][],
  N: number,
  inF: number,
): MatmulJob {
  return {
    C: dx,
    beta: 0,
    terms: parts.map(([dy, W, outF]) => ({ tA: false, tB: false, M: N, N: inF, K: outF, alpha: 1, A: dy, B: W })),
  };
}
