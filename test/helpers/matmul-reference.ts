// The float64 reference of every engine's matmul (test/model.kernels.test.ts, model.tfjs-engine.test.ts,
// model.webgpu.test.ts): alpha * op(A) @ op(B) + beta * C, each element summed over k in order in float64.

/**
 * out = alpha * op(A) @ op(B) + beta * C (beta 0: C ignored), op(A) [M, K] (A is [K, M] when tA), op(B) [K, N] (B is
 * [N, K] when tB); and each element's magnitude |alpha| * sum_k |a_mk b_kn| + |beta c_mn|, the scale float32
 * rounding errors are relative to.
 */
export function matmulReference(
  tA: boolean,
  tB: boolean,
  M: number,
  N: number,
  K: number,
  alpha: number,
  A: Float32Array,
  B: Float32Array,
  beta: number,
  C: Float32Array,
): { out: Float64Array; mag: Float64Array } {
  const out = new Float64Array(M * N),
    mag = new Float64Array(M * N);
  for (let m = 0; m < M; m++)
    for (let n = 0; n < N; n++) {
      let s = 0,
        a = 0;
      for (let k = 0; k < K; k++) {
        const p = A[tA ? k * M + m : m * K + k] * B[tB ? n * K + k : k * N + n];
        s += p;
        a += Math.abs(p);
      }
      out[m * N + n] = alpha * s + (beta === 0 ? 0 : beta * C[m * N + n]);
      mag[m * N + n] = Math.abs(alpha) * a + (beta === 0 ? 0 : Math.abs(beta * C[m * N + n]));
    }
  return { out, mag };
}
