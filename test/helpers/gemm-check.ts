// The check both GEMM tests make (test/model.gemm.test.ts, test/model.gemm-bf16.test.ts): every kernel's C has the
// same bits, sampled elements equal the documented order's, and what lies between C's rows is never written.
import assert from "node:assert/strict";

export interface KernelOutputs {
  label: string;
  outs: Array<{ isa: string; C: Float32Array }>;
  C0: Float32Array;
  M: number;
  N: number;
  ldc: number;
  /** elements checked against the reference: all when 0 */
  samples: number;
  reference: (i: number, j: number) => number;
}

export function checkKernelOutputs(o: KernelOutputs): void {
  const first = o.outs[0];
  for (const x of o.outs.slice(1)) {
    const a = new Uint32Array(first.C.buffer),
      b = new Uint32Array(x.C.buffer);
    const at = a.findIndex((v, k) => v !== b[k]);
    assert.equal(at, -1, `${o.label}: ${x.isa} differs from ${first.isa} at ${at} (${first.C[at]} vs ${x.C[at]})`);
  }
  const n = o.M * o.N;
  const picks =
    o.samples > 0 && o.samples < n
      ? Array.from({ length: o.samples }, (_, k) => Math.floor((((k * 2654435761) >>> 0) / 4294967296) * n))
      : Array.from({ length: n }, (_, k) => k);
  for (const p of picks) {
    const i = Math.floor(p / o.N),
      j = p % o.N;
    const want = o.reference(i, j),
      got = first.C[i * o.ldc + j];
    assert.ok(
      Object.is(got, want),
      `${o.label}: C[${i},${j}] = ${got} on ${first.isa}, the documented order gives ${want}`,
    );
  }
  for (let i = 0; i < o.M; i++)
    for (let j = o.N; j < o.ldc; j++)
      assert.ok(Object.is(first.C[i * o.ldc + j], o.C0[i * o.ldc + j]), `${o.label}: C's padding was written`);
}
