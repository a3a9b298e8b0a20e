/**
 * The tfjs engine's matmul (src/model/engine/tfjs.ts) honours cblas_sgemm's row-major contract exactly, on
 * tfjs-wasm and tfjs-cpu: every transA/transB pair, on shapes where either plan (direct, or C^T = op(B)^T op(A)^T)
 * is chosen, alpha != 1, beta = 0 ignoring NaN in C, beta = 1 accumulating, beta = 0.5, operands that are views
 * on a SharedArrayBuffer; and it keeps no tfjs tensor and no reference to its operands after a call.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs-core";
import { initEngine } from "../src/model/backend";
import { matmulReference } from "./helpers/matmul-reference";

function rand(n: number, seed: number, shared = false): Float32Array {
  const a = shared ? new Float32Array(new SharedArrayBuffer(4 * (n + 3))).subarray(3) : new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    a[i] = (s / 2 ** 32) * 2 - 1;
  }
  return a;
}

for (const backend of ["wasm", "cpu"] as const) {
  test(`on tfjs-${backend}, matmul matches float64 for every transpose pair, both plans, alpha and beta`, async () => {
    const { kernels: k } = await initEngine(backend);
    const n0 = tf.memory().numTensors;
    // [M, N, K]: tall-thin and short-wide so that both plans are taken for each flag pair
    const shapes: [number, number, number][] = [
      [5, 7, 3],
      [64, 3, 17],
      [3, 70, 9],
      [33, 65, 129],
    ];
    let cases = 0;
    for (const [M, N, K] of shapes) {
      for (const tA of [false, true]) {
        for (const tB of [false, true]) {
          for (const [alpha, beta] of [
            [1, 0],
            [1, 1],
            [0.25, 0.5],
            [-2, 0],
          ] as const) {
            const A = rand(M * K, M + 3 * K + (tA ? 1 : 0), cases % 2 === 0),
              B = rand(K * N, N + 5 * K + (tB ? 1 : 0), cases % 3 === 0);
            const C = rand(M * N, 99 + cases);
            if (beta === 0) C.fill(Number.NaN); // beta 0: C's old contents, even NaN, are ignored
            const want = matmulReference(tA, tB, M, N, K, alpha, A, B, beta, C);
            const A0 = A.slice(),
              B0 = B.slice();
            k.matmul(tA, tB, M, N, K, alpha, A, B, beta, C);
            // float32 rounding: well within K * 2^-24 of each element's magnitude (a transposed or misplaced operand is O(1) off)
            let worst = 0;
            for (let i = 0; i < M * N; i++)
              worst = Math.max(worst, Math.abs(C[i] - want.out[i]) / (want.mag[i] * K * 2 ** -24 + 1e-30));
            assert.ok(
              worst < 1,
              `M=${M} N=${N} K=${K} transA=${tA} transB=${tB} alpha=${alpha} beta=${beta}: error ${worst}`,
            );
            assert.deepEqual(A, A0, "A is not written");
            assert.deepEqual(B, B0, "B is not written");
            cases++;
          }
        }
      }
    }
    assert.equal(tf.memory().numTensors, n0, "no tfjs tensor outlives a call");
    // the engine holds no copy of its operands: a changed operand changes the next product
    const A = rand(6, 1),
      B = rand(6, 2),
      C = new Float32Array(4);
    k.matmul(false, false, 2, 2, 3, 1, A, B, 0, C);
    const first = C.slice();
    A[0] = A[0] + 1;
    k.matmul(false, false, 2, 2, 3, 1, A, B, 0, C);
    assert.notDeepEqual(C, first);
    assert.throws(
      () => k.matmul(false, false, 2, 2, 3, 1, A.subarray(1), B, 0, C),
      /matmul: A 5, B 6, C 4 floats for M=2 N=2 K=3/,
    );
    k.dispose();
  });
}
