/**
 * A float64 reference of the model with bf16 matrix products (P8), for checking `--precision bf16`: the plain-JS
 * kernels of src/model/engine/js.ts for everything but the products, and the products written out here in
 * float64 with every operand rounded to bf16 (to nearest even, a denormal read as 0: `bf16` in ./numeric.ts) at
 * the points where the native engine rounds them:
 *  - the linears (matmul): both operands, whatever the transposes; C = s or beta*C + s, s summed in float64;
 *  - attention (native/ops/attention.c): the scores from bf16(q) and bf16(float(scale*k)); the weighted sum of values
 *    from bf16(unnormalised probabilities) and bf16(v), normalised after; in the backward, the probabilities
 *    recomputed from the log-sum-exp, datt from bf16(dout) and bf16(v), dq from bf16(dscores) and bf16(k), dk from
 *    bf16(dscores) and bf16(q), dv from bf16(probabilities) and bf16(dout).
 * Everything between two products (softmax, RMSNorm, RoPE, SwiGLU, cross-entropy) is the fp32 path's, as in the
 * engine. The result differs from the engine's only by summation (float64 here, fp32 FMA chains there).
 */
import { jsKernels } from "../../src/model/engine/js";
import type { Kernels } from "../../src/model/kernels";
import { bf16 } from "./numeric";

/** x[i] rounded to bf16, into a float64 array (the products then read each operand once). */
function roundAll(x: Float32Array, n: number): Float64Array {
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = bf16(x[i]);
  return out;
}

/** C[M,N] = op(A) @ op(B) (+ beta*C) on bf16-rounded operands, summed in float64; alpha must be 1 (P8). */
function matmulBf16(
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
  if (alpha !== 1) throw new Error(`bf16 reference matmul: alpha ${alpha}, the engine's bf16 products take 1`);
  const a = roundAll(A, M * K),
    b = roundAll(B, K * N);
  for (let i = 0; i < M; i++)
    for (let j = 0; j < N; j++) {
      let s = 0;
      for (let k = 0; k < K; k++) s += a[transA ? k * M + i : i * K + k] * b[transB ? j * K + k : k * N + j];
      C[i * N + j] = beta === 0 ? s : beta * C[i * N + j] + s;
    }
}

/**
 * The native kernel's forward (native/ops/attention.c) with one key block per row: the float32 scores from bf16 operands,
 * p = exp(s - max) in float32 (unnormalised, as the online softmax feeds its product), out = (sum_u bf16(p) bf16(v))
 * times float32(1 / sum p), lse = max + log(sum p). The fixture's T (16) is under the kernel's block of 256 keys,
 * so its running max is the row's max and these are its rounding points.
 */
function attentionForwardBf16(
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
): void {
  if (T > 256) throw new Error(`bf16 reference attention: T ${T} is over one key block of the native kernel (256)`);
  const scale = Math.fround(1 / Math.sqrt(E));
  const p = new Float32Array(T);
  for (let b = 0; b < B; b++)
    for (let h = 0; h < H; h++) {
      const j = Math.floor((h * K) / H);
      for (let t = 0; t < T; t++) {
        const qo = ((b * T + t) * H + h) * E;
        scoresBf16(p, q, qo, k, b, t, T, K, j, E, scale);
        let mx = -Infinity;
        for (let u = 0; u <= t; u++) mx = Math.max(mx, p[u]);
        let sum = 0;
        for (let u = 0; u <= t; u++) {
          p[u] = Math.exp(p[u] - mx);
          sum += p[u];
        }
        lse[(b * H + h) * T + t] = mx + Math.log(sum);
        const inv = Math.fround(1 / sum);
        for (let e = 0; e < E; e++) {
          let s = 0;
          for (let u = 0; u <= t; u++) s += bf16(p[u]) * bf16(v[((b * T + u) * K + j) * E + e]);
          out[qo + e] = Math.fround(s) * inv;
        }
      }
    }
}

/** p[u] = float32(sum_e bf16(q) * bf16(float32(scale * k))) for u <= t: the scores as the engine's product gives them. */
function scoresBf16(
  p: Float32Array,
  q: Float32Array,
  qo: number,
  k: Float32Array,
  b: number,
  t: number,
  T: number,
  K: number,
  j: number,
  E: number,
  scale: number,
): void {
  for (let u = 0; u <= t; u++) {
    const ko = ((b * T + u) * K + j) * E;
    let s = 0;
    for (let e = 0; e < E; e++) s += bf16(q[qo + e]) * bf16(Math.fround(scale * k[ko + e]));
    p[u] = s;
  }
}

/**
 * The native kernel's backward: p = exp(s - lse) in float32 from the recomputed scores, datt from bf16(dout) and
 * bf16(v), dscores = p * (datt - D) * scale in float32 (D = dout . out), then dq from bf16(dscores) and bf16(k), dk
 * from bf16(dscores) and bf16(q), dv from bf16(p) and bf16(dout).
 */
function attentionBackwardBf16(
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
): void {
  const scale = Math.fround(1 / Math.sqrt(E));
  const dkAcc = new Float64Array(B * T * K * E),
    dvAcc = new Float64Array(B * T * K * E);
  const p = new Float32Array(T),
    ds = new Float32Array(T); // one row of probabilities and of dscores, float32 as the engine stores them
  for (let b = 0; b < B; b++)
    for (let h = 0; h < H; h++) {
      const j = Math.floor((h * K) / H);
      for (let t = 0; t < T; t++) {
        const qo = ((b * T + t) * H + h) * E,
          x = lse[(b * H + h) * T + t];
        scoresBf16(p, q, qo, k, b, t, T, K, j, E, scale);
        let dot = 0;
        for (let e = 0; e < E; e++) dot += dout[qo + e] * out[qo + e];
        const d = Math.fround(dot);
        for (let u = 0; u <= t; u++) {
          const vo = ((b * T + u) * K + j) * E;
          let dp = 0;
          for (let e = 0; e < E; e++) dp += bf16(dout[qo + e]) * bf16(v[vo + e]);
          p[u] = Math.exp(p[u] - x);
          ds[u] = p[u] * (Math.fround(dp) - d) * scale;
        }
        for (let e = 0; e < E; e++) {
          let s = 0;
          for (let u = 0; u <= t; u++) s += bf16(ds[u]) * bf16(k[((b * T + u) * K + j) * E + e]);
          dq[qo + e] = s;
        }
        for (let u = 0; u <= t; u++) {
          const lo = ((b * T + u) * K + j) * E;
          for (let e = 0; e < E; e++) {
            dkAcc[lo + e] += bf16(ds[u]) * bf16(q[qo + e]);
            dvAcc[lo + e] += bf16(p[u]) * bf16(dout[qo + e]);
          }
        }
      }
    }
  dk.set(dkAcc);
  dv.set(dvAcc);
}

/** The reference Kernels (slow: float64 loops; for llama-tiny-sized models). */
export function bf16ReferenceKernels(): Kernels {
  return {
    ...jsKernels,
    name: "float64 reference with bf16 products (test/helpers/bf16-reference.ts)",
    matmul: matmulBf16,
    attentionForward: attentionForwardBf16,
    attentionBackward: attentionBackwardBf16,
    dispose: () => {},
  };
}
