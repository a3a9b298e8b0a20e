/**
 * The compute layer's ONE kernel interface. The model (llama.ts) is written against it, llm.c style: one
 * forward and one backward per op, on flat row-major Float32Arrays, every output buffer allocated by the
 * caller. An engine implements it, one of three: `native` (src/model/engine/native.ts: a Node-API addon of the
 * project's own C, native/: every matrix product on the built-in GEMM, or on the system's OpenBLAS loaded at run
 * time with `--gemm openblas`, and the other kernels in plain C), `tfjs` (src/model/engine/tfjs.ts: matmul, and
 * attention through it, on a tfjs backend; the rest in plain JS, src/model/engine/js.ts) or `webgpu`
 * (src/model/engine/webgpu/engine.ts: every kernel a WGSL compute shader, webgpu/shaders/, on a WebGPU device),
 * the one DeferredKernels engine (below): it queues its kernels and hands their results back at settle().
 *
 * Shape legend:  B batch, T sequence, N = B*T tokens, D hidden, H query heads, K kv heads (GQA: kv head j
 *                serves query heads j*H/K ... (j+1)*H/K-1), E head_dim, F ffn width, V vocab.
 *
 * Conventions, for every engine:
 *  - Arrays may be views (subarrays) on ordinary memory, on a SharedArrayBuffer, or on a wasm heap. An engine that
 *    computes as it is called (native, tfjs) reads and writes them in place before the call returns, and keeps no
 *    reference to them afterwards, with one exception: the master weights handed to weightsAre, which the native
 *    engine's bf16 kernels (AMX and VDPBF16PS) keep a pointer to and a packed copy of until weightsChanged. A
 *    deferred engine (DeferredKernels: webgpu) keeps every array it is handed, by its buffer: a device mirror of
 *    it, for as long as the buffer lives; its outputs reach the caller's arrays at settle().
 *  - "+=" outputs ACCUMULATE into what the caller passes (gradients; the residual stream's gradient);
 *    "=" outputs are overwritten. Inputs are never written unless the op says it works in place.
 *  - Every kernel is deterministic: the same inputs give bit-identical outputs, run to run (exact resume, B1,
 *    and gradient checkpointing's bit-identical gradients, M6, depend on it).
 *  - float32 storage; an engine may accumulate in wider precision inside a kernel.
 */

export interface Kernels {
  /** e.g. "native (GEMM: built-in avx512, AVX-512F 8x32 micro-kernel, fp32; C kernels AVX-512 (x86-64-v4), row kernels avx512)". */
  readonly name: string;

  // ------------------------------------------------------------------ matrix product
  /**
   * C[M,N] = alpha * op(A) @ op(B) + beta * C, cblas_sgemm's row-major contract without leading dimensions:
   * op(A) is [M,K] (A stored [M,K], or [K,M] when transA), op(B) is [K,N] (B stored [K,N], or [N,K] when
   * transB). beta = 0 means C is overwritten (its old contents, even NaN, are ignored); beta = 1 accumulates.
   */
  matmul(
    transA: boolean,
    transB: boolean,
    M: number,
    N: number,
    K: number,
    alpha: number,
    A: Float32Array,
    B: Float32Array,
    beta: number,
    C: Float32Array,
  ): void;

  // ------------------------------------------------------------------ embedding
  /** out[N,D] = E[ids[n], :]. ids are checked by the model (0 <= id < V). */
  embeddingForward(out: Float32Array, ids: Int32Array, E: Float32Array, N: number, D: number): void;
  /** dE[ids[n], :] += dout[n, :] (scatter-add, in n order). */
  embeddingBackward(dE: Float32Array, ids: Int32Array, dout: Float32Array, N: number, D: number): void;

  // ------------------------------------------------------------------ RMSNorm (M4: fp32, HF LlamaRMSNorm)
  /** rstd[n] = 1/sqrt(mean(x[n,:]^2) + eps); out[n,:] = x[n,:] * rstd[n] * w. */
  rmsnormForward(
    out: Float32Array,
    rstd: Float32Array,
    x: Float32Array,
    w: Float32Array,
    N: number,
    D: number,
    eps: number,
  ): void;
  /** dx += d/dx, dw += d/dw, from dout, the forward's input x, w and its saved rstd. */
  rmsnormBackward(
    dx: Float32Array,
    dw: Float32Array,
    dout: Float32Array,
    x: Float32Array,
    w: Float32Array,
    rstd: Float32Array,
    N: number,
    D: number,
  ): void;

  // ------------------------------------------------------------------ RoPE (HF rotate_half over cat(freqs, freqs))
  /**
   * In place on x [B,T,nh,E]: with h = E/2 and c = cos[t,i], s = sin[t,i] (tables [T, h]):
   *   x[i] <- x[i]*c - x[i+h]*s,   x[i+h] <- x[i+h]*c + x[i]*s     for i < h.
   */
  ropeForward(x: Float32Array, cos: Float32Array, sin: Float32Array, B: number, T: number, nh: number, E: number): void;
  /** In place on dx [B,T,nh,E], the adjoint:  d[i] <- d[i]*c + d[i+h]*s,   d[i+h] <- d[i+h]*c - d[i]*s. */
  ropeBackward(
    dx: Float32Array,
    cos: Float32Array,
    sin: Float32Array,
    B: number,
    T: number,
    nh: number,
    E: number,
  ): void;

  // ------------------------------------------------------------------ causal attention (GQA)
  /**
   * q [B,T,H,E], k and v [B,T,K,E] (after RoPE). For query head h (kv head j = floor(h*K/H)), with the scores
   * s[t,u] = q[b,t,h,:] . k[b,u,j,:] / sqrt(E) over the visible keys u <= t:
   *   lse[b,h,t] = log sum_u<=t exp(s[t,u])                 (saved for the backward: [B,H,T])
   *   out[b,t,h,:] = sum_u<=t exp(s[t,u] - lse) * v[b,u,j,:]   (= out [B,T,H,E])
   * The [T,T] probabilities need not exist (the native engine runs blocks of keys with an online softmax).
   */
  attentionForward(
    out: Float32Array,
    lse: Float32Array,
    q: Float32Array,
    k: Float32Array,
    v: Float32Array,
    B: number,
    T: number,
    H: number,
    K: number,
    E: number,
  ): void;
  /**
   * dq = dS @ k, dk = dS^T @ q, dv = P^T @ dout (each overwritten; GQA: a kv head sums over its query heads), with
   * P = exp(s - lse) (0 for u > t), dS = P * (dP - D) / sqrt(E), dP = dout @ v^T and D[t] = dout[t] . out[t] (the
   * softmax backward's rowsum(P * dP)), from dout [B,T,H,E] and the forward's q, k, v (after RoPE), out and lse.
   */
  attentionBackward(
    dq: Float32Array,
    dk: Float32Array,
    dv: Float32Array,
    dout: Float32Array,
    q: Float32Array,
    k: Float32Array,
    v: Float32Array,
    out: Float32Array,
    lse: Float32Array,
    B: number,
    T: number,
    H: number,
    K: number,
    E: number,
  ): void;

  /**
   * Cached attention (generation, forward only), one sequence: T new query positions P..P+T-1 against a key/value
   * cache that already holds positions 0..P+T-1 (the new ones included; all after RoPE). q [T,H,E]; kCache and
   * vCache [S,K,E] with S >= P+T (rows past P+T-1 are not read). For new position t and query head h (kv head
   * j = floor(h*K/H)), causal over the cache:
   *   p[u] = softmax_u<=P+t( q[t,h,:] . kCache[u,j,:] / sqrt(E) )     (scores rounded to float32, softmax in float64)
   *   out[t,h,:] = sum_u p[u] * vCache[u,j,:]                           (= out [T,H,E])
   * With P = 0 it is attentionForward's out for B = 1.
   */
  attentionCachedForward(
    out: Float32Array,
    q: Float32Array,
    kCache: Float32Array,
    vCache: Float32Array,
    P: number,
    T: number,
    H: number,
    K: number,
    E: number,
  ): void;

  // ------------------------------------------------------------------ SwiGLU
  /** out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); n = N*F elements. */
  swigluForward(out: Float32Array, gate: Float32Array, up: Float32Array, n: number): void;
  /**
   * With s = sigmoid(gate[i]): dgate[i] = dout[i] * up[i] * s * (1 + gate[i] * (1 - s)) and
   * dup[i] = dout[i] * gate[i] * s (both overwritten), from dout and the forward's gate and up.
   */
  swigluBackward(
    dgate: Float32Array,
    dup: Float32Array,
    dout: Float32Array,
    gate: Float32Array,
    up: Float32Array,
    n: number,
  ): void;

  // ------------------------------------------------------------------ cross-entropy over the LM head's logits
  /**
   * logits [rows, V], one row per predicted position; targets[r] in [0, V), or -1 = no target (the row adds
   * nothing and its gradient is 0). Returns sum over targeted rows of (logsumexp(row) - row[target]), in
   * float64. When gradScale > 0, logits is overwritten IN PLACE by its gradient:
   * (softmax(row) - onehot(target)) * gradScale; gradScale = 0 leaves logits untouched (evaluation).
   * The model runs the LM head in row chunks: logits = h_chunk @ E^T, this kernel, then dh = dlogits @ E and
   * dE += dlogits^T @ h_chunk (matmul), so [N, V] never exists at once.
   */
  crossEntropy(logits: Float32Array, targets: Int32Array, rows: number, V: number, gradScale: number): number;

  // ------------------------------------------------------------------ the weights (optional)
  /**
   * The trainer's master weights, which change only in the optimizer's update (P8): an engine may keep a derived
   * copy of a product's weight operand until weightsChanged(), which the trainer calls after every update: the
   * native engine's bf16 kernels (AMX and VDPBF16PS, native/gemm/weights.c) keep it packed, the webgpu engine keeps
   * it on the device and uploads it again after each change. The results are those without the copy.
   */
  weightsAre?(params: Float32Array): void;
  weightsChanged?(): void;
  /** Remakes share `part` of `parts` of those copies now (each rank its own, side by side, before its products). */
  prepareWeights?(part: number, parts: number): void;

  /** Frees what the engine holds (scratch, cached device copies). The object is unusable afterwards. */
  dispose(): void;
}

/**
 * A DEFERRED engine (webgpu): each kernel call only queues the kernel on a device that mirrors the caller's arrays
 * (kernels.ts's header: it keeps them). Outputs exist on the device, not yet in the caller's arrays, and
 * crossEntropy returns 0: settle() hands them back. Besides settle, the hooks that only such an engine has: the
 * fused calls it runs as one dispatch each (matmuls, ropeQK), the copies and fills the model makes on its arrays
 * (which stay on the device), the micro-batch fold into the float64 slot (fold, endMicroBatch), the constants it
 * keeps resident, its LM-head chunk and its traffic counters. The
 * model and the micro-batch loop (src/actors/micro-batches.ts) ask isDeferred(k), never for one hook.
 */
export interface DeferredKernels extends Kernels {
  /** The tag isDeferred reads. */
  readonly deferred: true;
  /**
   * settle() waits for everything queued, copies each array of `readback` (the rank's float64 slot, or a gradient
   * buffer) into host memory, and resolves to the mean cross-entropy over the targeted rows of every crossEntropy
   * call since the previous settle (the loss lossAndGrads / loss would return), and each micro-batch's (Settled).
   * Between settles the host must not read or write an array a kernel wrote, except through the kernels, nor
   * change an array a kernel has read (an input is uploaded once per settle, or per endMicroBatch). The host may
   * record more kernels before it resolves.
   */
  settle(readback: (Float32Array | Float64Array)[], opts?: SettleOptions): Promise<Settled>;
  /**
   * A10 on the device: slot[i] = g[i] (`first`: the step's first micro-batch sets the slot) or slot[i] + g[i] for
   * i < g.length, each one binary64 conversion or add rounded to nearest even (foldMicro's bits, optim.ts), and g = 0,
   * recorded as a kernel is. The slot (a rank's float64 slot, or a view of its first g.length elements) stays on the
   * device, host-stale, until a settle reads it back.
   */
  fold(slot: Float64Array, g: Float32Array, first: boolean): void;
  /**
   * Ends a micro-batch without reading anything back (the device fold's loop, src/actors/micro-batches.ts): the
   * crossEntropy rows since the previous end form one entry of the next settle's `losses`, and the inputs may be
   * rewritten (each is uploaded again when a kernel next reads it). Submits what is recorded; resolves once the
   * device has run it.
   */
  endMicroBatch(): Promise<void>;
  /**
   * Several products in one go, as one dispatch (runMatmuls: the calls it equals on other engines). Exactly
   * matmulsInSequence(this, jobs): for each job in order, copy(C, add) when it has `add`, then each term in order
   * as matmul(tA, tB, M, N, K, alpha, A, B, beta', C) with beta' = the job's beta for its first term (1 when it
   * has `add`) and 1 for each later term: a job's C = (add, or beta C) + the sum of its terms, rounded as those
   * calls round. An engine that has it gives the same bits as those calls on that engine. The jobs are
   * independent: no job reads another's C (nor its own C through A, B or add), and every term of a job has its
   * M and N.
   */
  matmuls(jobs: readonly MatmulJob[]): void;
  /**
   * RoPE on q [B,T,H,E] and k [B,T,K,E] in one call, the results of ropeForward(q, .., H, E) then
   * ropeForward(k, .., K, E) (backward: ropeBackward of both), which the model calls on other engines.
   */
  ropeQK(
    q: Float32Array,
    k: Float32Array,
    cos: Float32Array,
    sin: Float32Array,
    B: number,
    T: number,
    H: number,
    K: number,
    E: number,
    backward: boolean,
  ): void;
  /**
   * dst = src (equal lengths). The model copies between its activation arrays through this (they stay on the
   * device); on an engine that computes as it is called it copies on the host (dst.set(src)).
   */
  copy(dst: Float32Array, src: Float32Array): void;
  /** x[i] = value for every element: the model's zeroing of an accumulator, as copy. */
  fill(x: Float32Array, value: number): void;
  /**
   * A host array that never changes after this call (the RoPE tables): uploaded once and kept resident. Writing it
   * afterwards is the caller's error.
   */
  constant(a: Float32Array): void;
  /**
   * Tokens per LM-head chunk for a vocabulary of V (the model's default on other engines): the largest chunk one
   * binding holds, since each chunk costs its dispatches.
   */
  headChunkTokens(V: number): number;
  /** The counters since the engine was made: what crossed between host and device, and the dispatches. */
  traffic(): DeviceTraffic;
}

/** Whether `k` is a deferred engine (DeferredKernels), whose results come back at settle(). */
export function isDeferred(k: Kernels): k is DeferredKernels {
  return (k as Partial<DeferredKernels>).deferred === true;
}

/** One product of a matmuls job: alpha op(A) @ op(B), as matmul's arguments (kernels.ts: matmul). */
export interface MatmulTerm {
  tA: boolean;
  tB: boolean;
  M: number;
  N: number;
  K: number;
  alpha: number;
  A: Float32Array;
  B: Float32Array;
}

/** A matmuls job: C [M,N] = (add, or beta C) + its terms in order (the residual add of a projection is `add`). */
export interface MatmulJob {
  C: Float32Array;
  beta: number;
  add?: Float32Array;
  terms: readonly MatmulTerm[];
}

/**
 * What matmuls(jobs) means, as the calls it equals: the model's helper on an engine that computes as it is called
 * (native, tfjs, or the tests' kernels on js.ts). `add` is copied through a deferred engine's copy, else on the host.
 */
export function matmulsInSequence(k: Kernels, jobs: readonly MatmulJob[]): void {
  for (const job of jobs) {
    if (job.add) {
      if (isDeferred(k)) k.copy(job.C, job.add);
      else job.C.set(job.add);
    }
    job.terms.forEach((t, i) => {
      k.matmul(t.tA, t.tB, t.M, t.N, t.K, t.alpha, t.A, t.B, i > 0 || job.add ? 1 : job.beta, job.C);
    });
  }
}

/** matmuls(jobs) on `k`: a deferred engine's own, else the calls it equals (matmulsInSequence). */
export function runMatmuls(k: Kernels, jobs: readonly MatmulJob[]): void {
  if (isDeferred(k)) k.matmuls(jobs);
  else matmulsInSequence(k, jobs);
}

/** What settle() resolves to. */
export interface Settled {
  /** The mean cross-entropy over the targeted rows of every crossEntropy call since the previous settle. */
  loss: number;
  /** Its targeted rows. */
  rows: number;
  /**
   * The mean loss of each micro-batch ended by endMicroBatch since the previous settle, in order, then of the calls
   * after the last of them, if any (a settle per micro-batch: that micro-batch's loss alone).
   */
  losses: number[];
  /** Host milliseconds the settle spent after the device finished: readbacks copied into host arrays, the loss summed. */
  hostMs: number;
}

/** settle()'s options. */
export interface SettleOptions {
  /**
   * After each array of `readback` is read into host memory, the device's copy is set to 0 and stays the array's
   * value on the device: the caller consumes the host copy and zeroes it (foldMicro does), so the next kernel that
   * adds into the array neither uploads it nor waits for the host.
   */
  clear?: boolean;
}

/** Bytes that crossed between host and device (cumulative), by direction and by what they carried, and dispatches. */
export interface DeviceTraffic {
  /** Host to device: the master weights, constants (RoPE tables), inputs (token ids, targets), state (an array a kernel writes, uploaded whole). */
  up: { weights: number; constants: number; inputs: number; state: number };
  /** Device to host: arrays read back (the gradient), and the loss rows. */
  down: { arrays: number; loss: number };
  dispatches: number;
}
