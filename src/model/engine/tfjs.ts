/**
 * The tfjs engine: Kernels (src/model/kernels.ts) with the matrix product on the ACTIVE tfjs backend (wasm,
 * cpu or tensorflow; selected by backend.ts before this is called) and every other kernel in plain JS (js.ts).
 * It is the portable fallback: it needs nothing but the npm packages.
 *
 * matmul(transA, transB, ...) honours cblas_sgemm's contract exactly, but never asks tfjs for a transposed
 * operand: on tfjs-wasm (XNNPACK) matMul is fast only on plain 2-D operands (transposeA measured ~18x slower,
 * transposeB ~8x), and XNNPACK packs the RIGHT operand on every call (~2.7 ns/float). So each call picks
 * one of two plans, by the floats it has to move:
 *    C   = op(A) @ op(B)        operands transposed in JS where a flag asks for it
 *    C^T = op(B)^T @ op(A)^T    then C written from the [N, M] product, transposed in JS
 * (e.g. the forward x @ W^T runs as W @ x^T: the big weight is the left operand, read as it is, and only the
 * small x^T is transposed and packed). Operands are uploaded per call (tf.tensor2d copies them onto the wasm
 * heap) and disposed before the call returns: the engine keeps no reference to the caller's arrays, so the
 * shared master weights can change between calls and the next product sees them.
 * alpha and beta are applied in JS in float64 on the product's float32 values, rounded once into C. A product
 * with a long inner dimension (K > 8192: the LM head's dh = dlogits @ E) runs as a sum over K blocks: XNNPACK
 * streams the whole packed right operand once per few rows of the left one, ~1.7x slower measured at K = V.
 *
 * Attention, too, runs on this matmul (scores, weighted sum and their gradients per GQA group: one kv head and
 * its query heads in one sequence, the backward recomputing the scores), with the causal softmax in JS: the plain-JS
 * loops of js.ts are ~5x slower.
 */
import * as tf from "@tensorflow/tfjs-core";
import type { Kernels } from "../kernels";
import { jsKernels } from "./js";

type Matmul = Kernels["matmul"];

/**
 * Visits the index space [outer, inner] in 64x64 tiles, outer-major, calling visit(o0, o1, i0, i1) for each
 * tile [o0, o1) x [i0, i1): the blocked order of transposeInto and combineTransposed (the faster one measured).
 */
function forEachTile(
  outer: number,
  inner: number,
  visit: (o0: number, o1: number, i0: number, i1: number) => void,
): void {
  const BS = 64;
  for (let o0 = 0; o0 < outer; o0 += BS) {
    const o1 = Math.min(outer, o0 + BS);
    for (let i0 = 0; i0 < inner; i0 += BS) visit(o0, o1, i0, Math.min(inner, i0 + BS));
  }
}

/** [rows, cols] -> [cols, rows] into `out`, in 64x64 blocks written row by row (the faster order measured). */
export function transposeInto(src: Float32Array, rows: number, cols: number, out: Float32Array): Float32Array {
  forEachTile(cols, rows, (c0, c1, r0, r1) => {
    for (let c = c0; c < c1; c++) {
      const o = c * rows;
      for (let r = r0; r < r1; r++) out[o + r] = src[r * cols + c];
    }
  });
  return out;
}

/** The product's float32 values: on wasm a view on the heap (no copy; valid until the next tfjs allocation). */
function readProduct(t: tf.Tensor): Float32Array {
  if (tf.getBackend() === "wasm") {
    const be = tf.backend() as unknown as { typedArrayFromHeap?: (t: tf.TensorInfo) => Float32Array };
    if (typeof be.typedArrayFromHeap === "function") return be.typedArrayFromHeap(t);
  }
  return t.dataSync() as Float32Array;
}

/** Transpose scratch, grown on demand and reused (fresh big allocations page-fault at ~11 ns/float). */
class TransposeScratch {
  private a = new Float32Array(0);
  private b = new Float32Array(0);
  /** A view of n floats of buffer "a" or "b" (one per operand: a product may transpose both). */
  take(which: "a" | "b", n: number): Float32Array {
    if (which === "a") {
      if (this.a.length < n) this.a = new Float32Array(n);
      return this.a.subarray(0, n);
    }
    if (this.b.length < n) this.b = new Float32Array(n);
    return this.b.subarray(0, n);
  }
  release(): void {
    this.a = new Float32Array(0);
    this.b = new Float32Array(0);
  }
}

/**
 * attention "matmul" (default): attention on this engine's matmul (see the header); "js": js.ts's plain loops (the
 * readable reference, ~5x slower; tests check both against the float64 fixture). Generation's cached attention
 * (attentionCachedForward: a few query rows against the cache) is js.ts's loops either way: products of one row
 * gain nothing from a tfjs round trip.
 */
export function createTfjsKernels(o: { attention?: "matmul" | "js" } = {}): Kernels {
  const backend = tf.getBackend();
  if (!backend) throw new Error("createTfjsKernels: no tfjs backend is active (call initEngine first)");
  const scratch = new TransposeScratch();
  const matmul: Matmul = (transA, transB, M, N, K, alpha, A, B, beta, C) => {
    if (A.length < M * K || B.length < K * N || C.length < M * N) {
      throw new RangeError(`matmul: A ${A.length}, B ${B.length}, C ${C.length} floats for M=${M} N=${N} K=${K}`);
    }
    if (tf.getBackend() !== backend)
      throw new Error(`matmul: the tfjs backend changed from ${backend} to ${tf.getBackend()} under this engine`);
    if (M === 0 || N === 0) return;
    if (K === 0) {
      scaleC(C, M * N, beta);
      return;
    }
    if (K > K_BLOCK_OVER && !transA && !transB) productInKBlocks(scratch, M, N, K, alpha, A, B, beta, C);
    else product(scratch, transA, transB, M, N, K, alpha, A, B, beta, C);
  };
  return {
    name: `tfjs ${backend}${backend === "wasm" ? ` (XNNPACK, SIMD ${tf.env().getBool("WASM_HAS_SIMD_SUPPORT") ? "on" : "off"})` : ""}; other kernels in JS`,
    matmul,
    ...jsKernels,
    ...(o.attention === "js" ? {} : matmulAttention(matmul)),
    dispose(): void {
      scratch.release();
    },
  };
}

/** Products with an inner dimension above this many run in blocks of K_BLOCK (see the header). */
const K_BLOCK_OVER = 8192;
const K_BLOCK = 2048;

/** C = beta C + sum over K blocks of alpha A[:, kb] @ B[kb, :] (B's rows are contiguous; A's column block is copied). */
function productInKBlocks(
  scratch: TransposeScratch,
  M: number,
  N: number,
  K: number,
  alpha: number,
  A: Float32Array,
  B: Float32Array,
  beta: number,
  C: Float32Array,
): void {
  for (let k0 = 0; k0 < K; k0 += K_BLOCK) {
    const kb = Math.min(K_BLOCK, K - k0),
      a = scratch.take("a", M * kb);
    for (let m = 0; m < M; m++) a.set(A.subarray(m * K + k0, m * K + k0 + kb), m * kb);
    product(scratch, false, false, M, N, kb, alpha, a, B.subarray(k0 * N, (k0 + kb) * N), k0 === 0 ? beta : 1, C);
  }
}

/** One tfjs matMul for C = alpha op(A) @ op(B) + beta C, on the plan that moves fewer floats (see the header). */
function product(
  scratch: TransposeScratch,
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
): void {
  // floats moved in JS (transposes) + floats XNNPACK packs (the right operand), per plan
  const direct = (transA ? M * K : 0) + (transB ? K * N : 0) + K * N;
  const swapped = (transB ? 0 : K * N) + (transA ? 0 : M * K) + M * N + K * M;
  const swap = swapped < direct;
  // left [rows, K] @ right [K, cols]
  let left: Float32Array, right: Float32Array, rows: number, cols: number;
  if (!swap) {
    left = transA ? transposeInto(A.subarray(0, K * M), K, M, scratch.take("a", M * K)) : A.subarray(0, M * K);
    right = transB ? transposeInto(B.subarray(0, N * K), N, K, scratch.take("b", K * N)) : B.subarray(0, K * N);
    rows = M;
    cols = N;
  } else {
    left = transB ? B.subarray(0, N * K) : transposeInto(B.subarray(0, K * N), K, N, scratch.take("b", N * K));
    right = transA ? A.subarray(0, K * M) : transposeInto(A.subarray(0, M * K), M, K, scratch.take("a", K * M));
    rows = N;
    cols = M;
  }
  const leftTensor = tf.tensor2d(left, [rows, K]),
    rightTensor = tf.tensor2d(right, [K, cols]);
  let productTensor: tf.Tensor | null = null;
  try {
    productTensor = tf.matMul(leftTensor, rightTensor);
    const P = readProduct(productTensor);
    if (!swap) combine(C, P, M * N, alpha, beta);
    else combineTransposed(C, P, M, N, alpha, beta);
  } finally {
    leftTensor.dispose();
    rightTensor.dispose();
    if (productTensor) productTensor.dispose();
  }
}

/** Attention scratch views for one GQA group of R query heads over T positions of head size E. */
interface GroupScratch {
  /** [R*T, E]: the group's queries, output gradients, query gradients (also the forward's output). */
  groupQ: Float32Array;
  groupDOut: Float32Array;
  groupDQ: Float32Array;
  /** [T, E]: the group's one kv head: keys, values and their gradients. */
  headK: Float32Array;
  headV: Float32Array;
  headDK: Float32Array;
  headDV: Float32Array;
  /** [R*T, T]: the scores, then the probabilities; the gradient of the probabilities, then of the scores. */
  probs: Float32Array;
  dScores: Float32Array;
}

/** One buffer, grown on demand, carved into a GroupScratch. */
class AttentionScratch {
  private buf = new Float32Array(0);
  views(R: number, T: number, E: number): GroupScratch {
    const q = R * T * E,
      kv = T * E,
      need = 3 * q + 4 * kv + 2 * R * T * T;
    if (this.buf.length < need) this.buf = new Float32Array(need);
    let o = 0;
    const take = (n: number) => this.buf.subarray(o, (o += n));
    return {
      groupQ: take(q),
      groupDOut: take(q),
      groupDQ: take(q),
      headK: take(kv),
      headV: take(kv),
      headDK: take(kv),
      headDV: take(kv),
      probs: take(R * T * T),
      dScores: take(R * T * T),
    };
  }
}

/** Rows of a [B,T,nh,E] tensor for head `h` of sequence b, t = 0..T-1, into a [T, E] block at row offset r0 of dst. */
function gatherHead(
  dst: Float32Array,
  r0: number,
  x: Float32Array,
  b: number,
  h: number,
  T: number,
  nh: number,
  E: number,
): void {
  for (let t = 0; t < T; t++) {
    const o = ((b * T + t) * nh + h) * E;
    dst.set(x.subarray(o, o + E), (r0 + t) * E);
  }
}

/** The reverse of gatherHead: the [T, E] block at row offset r0 of src into head `h` of sequence b of x. */
function scatterHead(
  x: Float32Array,
  src: Float32Array,
  r0: number,
  b: number,
  h: number,
  T: number,
  nh: number,
  E: number,
): void {
  for (let t = 0; t < T; t++) x.set(src.subarray((r0 + t) * E, (r0 + t + 1) * E), ((b * T + t) * nh + h) * E);
}

/**
 * In place, each of the `rows` rows of P [rows, T] (row r is position t = r % T): softmax over u <= t, zeros after;
 * lse[r] = the row's log-sum-exp.
 */
function causalSoftmaxRows(P: Float32Array, lse: Float32Array, rows: number, T: number): void {
  for (let r = 0; r < rows; r++) {
    const t = r % T,
      o = r * T;
    let mx = -Infinity;
    for (let u = 0; u <= t; u++) if (P[o + u] > mx) mx = P[o + u];
    let sum = 0;
    for (let u = 0; u <= t; u++) {
      const e = Math.exp(P[o + u] - mx);
      P[o + u] = e;
      sum += e;
    }
    lse[r] = mx + Math.log(sum);
    const inv = 1 / sum;
    for (let u = 0; u <= t; u++) P[o + u] = P[o + u] * inv;
    P.fill(0, o + t + 1, o + T);
  }
}

/** In place, the scores S [rows, T] become P = exp(S - lse[r]) over u <= t (row r is position t = r % T), zeros after. */
function probsFromLse(P: Float32Array, lse: Float32Array, rows: number, T: number): void {
  for (let r = 0; r < rows; r++) {
    const t = r % T,
      o = r * T,
      x = lse[r];
    for (let u = 0; u <= t; u++) P[o + u] = Math.exp(P[o + u] - x);
    P.fill(0, o + t + 1, o + T);
  }
}

/**
 * In place, dS = P * (dP - D[r]) * scale over `rows` rows of T, D[r] = dO[r] . O[r] (rows of E): the softmax's
 * backward, then the score scale.
 */
function softmaxBackwardRows(
  P: Float32Array,
  dS: Float32Array,
  dO: Float32Array,
  O: Float32Array,
  rows: number,
  T: number,
  E: number,
  scale: number,
): void {
  for (let r = 0; r < rows; r++) {
    const o = r * T;
    let d = 0;
    for (let e = 0; e < E; e++) d += dO[r * E + e] * O[r * E + e];
    for (let u = 0; u < T; u++) dS[o + u] = P[o + u] * (dS[o + u] - d) * scale;
  }
}

/**
 * Causal GQA attention (kernels.ts contract) on matrix products. A group (b, j) is kv head j of sequence b and its
 * R = H/K query heads h = j*R + i; its rows i*T + t are the [R*T, T] scores of those heads, and lse's [R*T] block at
 * (b, j*R). q, k, v, and the gradients, are gathered to / scattered from [rows, E] scratch; the backward recomputes
 * the probabilities from the scores and lse.
 */
function matmulAttention(mm: Matmul): Pick<Kernels, "attentionForward" | "attentionBackward"> {
  const scratch = new AttentionScratch();
  return {
    attentionForward(out, lse, q, k, v, B, T, H, K, E) {
      const R = H / K,
        s = scratch.views(R, T, E),
        scale = 1 / Math.sqrt(E),
        P = s.probs;
      for (let b = 0; b < B; b++) {
        for (let j = 0; j < K; j++) {
          for (let i = 0; i < R; i++) gatherHead(s.groupQ, i * T, q, b, j * R + i, T, H, E);
          gatherHead(s.headK, 0, k, b, j, T, K, E);
          gatherHead(s.headV, 0, v, b, j, T, K, E);
          mm(false, true, R * T, T, E, scale, s.groupQ, s.headK, 0, P); // scores / sqrt(E)
          causalSoftmaxRows(P, lse.subarray((b * H + j * R) * T, (b * H + (j + 1) * R) * T), R * T, T);
          mm(false, false, R * T, E, T, 1, P, s.headV, 0, s.groupDQ); // out = P @ V (groupDQ as scratch)
          for (let i = 0; i < R; i++) scatterHead(out, s.groupDQ, i * T, b, j * R + i, T, H, E);
        }
      }
    },
    attentionBackward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, E) {
      const R = H / K,
        s = scratch.views(R, T, E),
        scale = 1 / Math.sqrt(E),
        P = s.probs,
        dS = s.dScores;
      for (let b = 0; b < B; b++) {
        for (let j = 0; j < K; j++) {
          for (let i = 0; i < R; i++) {
            gatherHead(s.groupQ, i * T, q, b, j * R + i, T, H, E);
            gatherHead(s.groupDOut, i * T, dout, b, j * R + i, T, H, E);
            gatherHead(s.groupDQ, i * T, out, b, j * R + i, T, H, E); // the group's output (groupDQ as scratch)
          }
          gatherHead(s.headK, 0, k, b, j, T, K, E);
          gatherHead(s.headV, 0, v, b, j, T, K, E);
          mm(false, true, R * T, T, E, scale, s.groupQ, s.headK, 0, P); // the forward's scores
          probsFromLse(P, lse.subarray((b * H + j * R) * T, (b * H + (j + 1) * R) * T), R * T, T);
          mm(false, true, R * T, T, E, 1, s.groupDOut, s.headV, 0, dS); // dP = dO @ V^T
          softmaxBackwardRows(P, dS, s.groupDOut, s.groupDQ, R * T, T, E, scale); // dS = P * (dP - D) / sqrt(E)
          mm(false, false, R * T, E, T, 1, dS, s.headK, 0, s.groupDQ); // dQ = dS @ K
          mm(true, false, T, E, R * T, 1, dS, s.groupQ, 0, s.headDK); // dK = dS^T @ Q (sums the R heads)
          mm(true, false, T, E, R * T, 1, P, s.groupDOut, 0, s.headDV); // dV = P^T @ dO
          for (let i = 0; i < R; i++) scatterHead(dq, s.groupDQ, i * T, b, j * R + i, T, H, E);
          scatterHead(dk, s.headDK, 0, b, j, T, K, E);
          scatterHead(dv, s.headDV, 0, b, j, T, K, E);
        }
      }
    },
  };
}

/** C = beta * C (beta 0: zeros, whatever C held). */
function scaleC(C: Float32Array, n: number, beta: number): void {
  if (beta === 0) C.fill(0, 0, n);
  else if (beta !== 1) for (let i = 0; i < n; i++) C[i] = beta * C[i];
}

/** C[i] = alpha * P[i] + beta * C[i]; beta 0 ignores C's old contents. */
function combine(C: Float32Array, P: Float32Array, n: number, alpha: number, beta: number): void {
  if (beta === 0) {
    if (alpha === 1) C.set(P.subarray(0, n));
    else for (let i = 0; i < n; i++) C[i] = alpha * P[i];
  } else if (alpha === 1 && beta === 1) {
    for (let i = 0; i < n; i++) C[i] += P[i];
  } else {
    for (let i = 0; i < n; i++) C[i] = alpha * P[i] + beta * C[i];
  }
}

/** The same from P = C^T [N, M]: C[m, n] = alpha * P[n, m] + beta * C[m, n], in 64x64 blocks. */
function combineTransposed(C: Float32Array, P: Float32Array, M: number, N: number, alpha: number, beta: number): void {
  forEachTile(M, N, (m0, m1, n0, n1) => {
    for (let m = m0; m < m1; m++) {
      const o = m * N;
      if (beta === 0) for (let n = n0; n < n1; n++) C[o + n] = alpha * P[n * M + m];
      else for (let n = n0; n < n1; n++) C[o + n] = alpha * P[n * M + m] + beta * C[o + n];
    }
  });
}
