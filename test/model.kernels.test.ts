/**
 * The native engine's kernels (src/model/engine/native.ts, native/tstrain.c) against float64
 * references written here: every method of the Kernels interface, on odd shapes, on views of a
 * SharedArrayBuffer at odd offsets, with the "+=" (accumulate) and "=" (overwrite, old contents ignored)
 * semantics of src/model/kernels.ts, and bit-identical run to run.
 *
 * Where the addon is not built or no OpenBLAS is found (the no-BLAS machine), every native test is skipped
 * with the reason and the fix, and the first test prints them; with TSTRAIN_REQUIRE_NATIVE=1 (CI sets it where
 * OpenBLAS is installed) failing to load is a test FAILURE. The last test holds native against the plain-JS
 * reference kernels (src/model/engine/js.ts, the tfjs engine's non-matmul half) on the same inputs.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Worker } from "node:worker_threads";
import * as path from "node:path";
import type { Kernels } from "../src/model/kernels";
import { loadNative } from "../src/model/engine/native";
import { profiledAttention } from "../bench/native-probes";
import { jsKernels, type NonMatmulKernels } from "../src/model/engine/js";
import { matmulReference } from "./helpers/matmul-reference";

const loaded = loadNative();
const K: Kernels | null = "kernels" in loaded ? loaded.kernels : null;
const unavailable = "reason" in loaded ? `native engine unavailable: ${loaded.reason}; fix: ${loaded.fix}` : false;

test("the native engine loads, or says why and how to get it (TSTRAIN_REQUIRE_NATIVE=1 makes that a failure)", (t) => {
  if ("reason" in loaded) {
    t.diagnostic(unavailable as string);
    process.stderr.write(`# ${unavailable}\n`);
    assert.ok(loaded.reason.length > 0 && loaded.fix.length > 0);
    assert.notEqual(process.env.TSTRAIN_REQUIRE_NATIVE, "1", `TSTRAIN_REQUIRE_NATIVE=1 but ${unavailable}`);
    return;
  }
  t.diagnostic(loaded.kernels.name);
  assert.match(
    loaded.kernels.name,
    /^native \(GEMM: built-in (avx512|avx2|portable), .* micro-kernel, fp32; C kernels/,
  );
});

// ------------------------------------------------------------------ helpers
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 15), z | 1);
    z ^= z + Math.imul(z ^ (z >>> 7), z | 61);
    return (((z ^ (z >>> 14)) >>> 0) / 4294967296) * 2 - 1; // [-1, 1)
  };
}

/** A Float32Array of n random values: a view at an odd offset into a SharedArrayBuffer when `shared`. */
function rand(n: number, seed: number, shared = false, scale = 1): Float32Array {
  const r = rng(seed);
  const a = shared ? new Float32Array(new SharedArrayBuffer((n + 7) * 4), 3 * 4, n) : new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = r() * scale;
  return a;
}
function filled(n: number, v: number, shared = false): Float32Array {
  const a = shared ? new Float32Array(new SharedArrayBuffer((n + 5) * 4), 1 * 4, n) : new Float32Array(n);
  a.fill(v);
  return a;
}
const copy = (a: Float32Array, shared = false): Float32Array => {
  const b = shared
    ? new Float32Array(new SharedArrayBuffer((a.length + 3) * 4), 2 * 4, a.length)
    : new Float32Array(a.length);
  b.set(a);
  return b;
};

/** max |got - want| / max(1, max |want|): a scaled error that a wrong term (sign, missing term, transposition) blows up. */
function close(got: ArrayLike<number>, want: ArrayLike<number>, tol: number, what: string): void {
  assert.equal(got.length, want.length, `${what}: length`);
  let err = 0,
    mag = 1;
  for (let i = 0; i < want.length; i++) {
    const d = Math.abs(got[i] - want[i]);
    if (!(d <= err)) err = Number.isNaN(d) ? Infinity : Math.max(err, d);
    mag = Math.max(mag, Math.abs(want[i]));
  }
  assert.ok(err / mag <= tol, `${what}: scaled error ${err / mag} > ${tol}`);
}
const bytesEqual = (a: Float32Array, b: Float32Array) =>
  Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));

const TOL = 2e-5; // float32 storage against float64 references

const skip = unavailable;

// ------------------------------------------------------------------ matmul
test("matmul: every transpose pair, odd shapes, alpha, beta = 0 ignores NaN in C, beta = 1 accumulates, SAB views", {
  skip,
}, () => {
  const k = K!;
  let seed = 1;
  for (const [M, N, Kd] of [
    [1, 1, 1],
    [7, 13, 5],
    [33, 17, 65],
    [64, 3, 129],
    [5, 70, 1],
  ] as const)
    for (const tA of [false, true])
      for (const tB of [false, true])
        for (const [alpha, beta] of [
          [1, 0],
          [0.5, 1],
          [-2, 0.25],
        ] as const) {
          const shared = (seed & 1) === 1;
          const A = rand(M * Kd, seed++, shared),
            B = rand(Kd * N, seed++, !shared);
          const C = beta === 0 ? filled(M * N, NaN, shared) : rand(M * N, seed++, shared);
          const want = matmulReference(tA, tB, M, N, Kd, alpha, A, B, beta, C).out;
          k.matmul(tA, tB, M, N, Kd, alpha, A, B, beta, C);
          close(C, want, TOL, `matmul tA=${tA} tB=${tB} ${M}x${N}x${Kd} alpha=${alpha} beta=${beta}`);
        }
});

test("matmul refuses arrays too short for the shapes, and non-Float32Array operands, before touching memory", {
  skip,
}, () => {
  const k = K!;
  const A = new Float32Array(6),
    B = new Float32Array(6),
    C = new Float32Array(4);
  assert.throws(() => k.matmul(false, false, 2, 2, 4, 1, A, B, 0, C), /A has 6 elements, the shapes need 8/);
  assert.throws(() => k.matmul(false, false, 3, 2, 2, 1, A, B, 0, C), /C has 4 elements, the shapes need 6/);
  assert.throws(
    () => k.matmul(false, false, 2, 2, 2, 1, new Float64Array(4) as unknown as Float32Array, B, 0, C),
    /A must be a Float32Array/,
  );
  assert.throws(() => k.matmul(false, false, -1, 2, 2, 1, A, B, 0, C), /M must be a whole number/);
});

// ------------------------------------------------------------------ embedding
test("embedding: gather rows; scatter-add accumulates, repeated ids add up, in place on SAB views", { skip }, () => {
  const k = K!;
  const V = 11,
    D = 9,
    N = 13;
  const E = rand(V * D, 5, true);
  const ids = new Int32Array([3, 0, 10, 3, 3, 7, 1, 10, 2, 0, 5, 5, 9]);
  const out = filled(N * D, NaN, true);
  k.embeddingForward(out, ids, E, N, D);
  const want = new Float64Array(N * D);
  for (let n = 0; n < N; n++) for (let i = 0; i < D; i++) want[n * D + i] = E[ids[n] * D + i];
  close(out, want, 0, "embeddingForward");

  const dout = rand(N * D, 6, true);
  const dE = rand(V * D, 7, true);
  const wantE = Float64Array.from(dE);
  for (let n = 0; n < N; n++) for (let i = 0; i < D; i++) wantE[ids[n] * D + i] += dout[n * D + i];
  k.embeddingBackward(dE, ids, dout, N, D);
  close(dE, wantE, TOL, "embeddingBackward (+=)");
  assert.throws(() => k.embeddingForward(out, new Int32Array(N).fill(V), E, N, D), /outside the embedding/);
  assert.throws(() => k.embeddingBackward(dE, new Int32Array(N).fill(-1), dout, N, D), /outside the embedding/);
});

// ------------------------------------------------------------------ RMSNorm
test("rmsnorm: forward (out, rstd) and backward (dx +=, dw +=) against float64", { skip }, () => {
  const k = K!;
  const N = 7,
    D = 37,
    eps = 1e-5;
  const x = rand(N * D, 11, true, 3),
    w = rand(D, 12, false, 2);
  for (let i = 2 * D; i < 3 * D; i++) x[i] = x[i] * 1e-3; // a row where eps matters (mean square ~ 3e-6 vs eps 1e-5)
  const out = filled(N * D, NaN, true),
    rstd = filled(N, NaN, true);
  k.rmsnormForward(out, rstd, x, w, N, D, eps);
  const wantOut = new Float64Array(N * D),
    wantR = new Float64Array(N);
  for (let n = 0; n < N; n++) {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += x[n * D + i] ** 2;
    const r = 1 / Math.sqrt(ss / D + eps);
    wantR[n] = r;
    for (let i = 0; i < D; i++) wantOut[n * D + i] = x[n * D + i] * r * w[i];
  }
  close(out, wantOut, TOL, "rmsnormForward out");
  close(rstd, wantR, TOL, "rmsnormForward rstd");

  const dout = rand(N * D, 13, true);
  const dx = rand(N * D, 14, true),
    dw = rand(D, 15, true);
  const wantDx = Float64Array.from(dx),
    wantDw = Float64Array.from(dw);
  for (let n = 0; n < N; n++) {
    const r = wantR[n];
    let dot = 0;
    for (let i = 0; i < D; i++) dot += dout[n * D + i] * w[i] * x[n * D + i];
    for (let i = 0; i < D; i++) {
      wantDx[n * D + i] += r * dout[n * D + i] * w[i] - (x[n * D + i] * r ** 3 * dot) / D;
      wantDw[i] += dout[n * D + i] * x[n * D + i] * r;
    }
  }
  k.rmsnormBackward(dx, dw, dout, x, w, rstd, N, D);
  close(dx, wantDx, TOL, "rmsnormBackward dx (+=)");
  close(dw, wantDw, TOL, "rmsnormBackward dw (+=)");
});

// ------------------------------------------------------------------ RoPE
function ropeTables(T: number, h: number): { cos: Float32Array; sin: Float32Array } {
  const cos = new Float32Array(T * h),
    sin = new Float32Array(T * h);
  for (let t = 0; t < T; t++)
    for (let i = 0; i < h; i++) {
      const a = t / 10000 ** ((2 * i) / (2 * h));
      cos[t * h + i] = Math.cos(a);
      sin[t * h + i] = Math.sin(a);
    }
  return { cos, sin };
}

test("rope: forward rotates each (i, i+h) pair in place; backward is its adjoint (<Rx, y> = <x, R^T y>)", {
  skip,
}, () => {
  const k = K!;
  const B = 2,
    T = 5,
    nh = 3,
    E = 6,
    h = E / 2;
  const { cos, sin } = ropeTables(T, h);
  const x0 = rand(B * T * nh * E, 21, true);
  const x = copy(x0, true);
  k.ropeForward(x, cos, sin, B, T, nh, E);
  const want = new Float64Array(x0.length);
  for (let b = 0; b < B; b++)
    for (let t = 0; t < T; t++)
      for (let j = 0; j < nh; j++) {
        const o = ((b * T + t) * nh + j) * E;
        for (let i = 0; i < h; i++) {
          const c = cos[t * h + i],
            s = sin[t * h + i];
          want[o + i] = x0[o + i] * c - x0[o + i + h] * s;
          want[o + i + h] = x0[o + i + h] * c + x0[o + i] * s;
        }
      }
  close(x, want, TOL, "ropeForward");
  const y0 = rand(x0.length, 22, true);
  const y = copy(y0);
  k.ropeBackward(y, cos, sin, B, T, nh, E);
  let lhs = 0,
    rhs = 0;
  for (let i = 0; i < x0.length; i++) {
    lhs += want[i] * y0[i];
    rhs += x0[i] * y[i];
  }
  assert.ok(Math.abs(lhs - rhs) <= 1e-5 * (1 + Math.abs(lhs)), `adjoint: <Rx,y> ${lhs} vs <x,R^T y> ${rhs}`);
  // and backward undoes forward (a rotation's adjoint is its inverse)
  const z = copy(x);
  k.ropeBackward(z, cos, sin, B, T, nh, E);
  close(z, x0, TOL, "ropeBackward(ropeForward(x)) = x");
  assert.throws(() => k.ropeForward(x, cos, sin, B, T, nh, 5), /even/);
});

// ------------------------------------------------------------------ attention
function refAttention(
  q: Float32Array,
  kk: Float32Array,
  v: Float32Array,
  dout: Float32Array,
  B: number,
  T: number,
  H: number,
  Kh: number,
  E: number,
) {
  const scale = 1 / Math.sqrt(E);
  const out = new Float64Array(B * T * H * E),
    lse = new Float64Array(B * H * T);
  const dq = new Float64Array(B * T * H * E),
    dk = new Float64Array(B * T * Kh * E),
    dv = new Float64Array(B * T * Kh * E);
  const qi = (b: number, t: number, h: number) => ((b * T + t) * H + h) * E;
  const ki = (b: number, t: number, j: number) => ((b * T + t) * Kh + j) * E;
  for (let b = 0; b < B; b++)
    for (let h = 0; h < H; h++) {
      const j = Math.floor((h * Kh) / H);
      const p = new Float64Array(T * T);
      for (let t = 0; t < T; t++) {
        let mx = -Infinity;
        const s = new Float64Array(t + 1);
        for (let u = 0; u <= t; u++) {
          let d = 0;
          for (let e = 0; e < E; e++) d += q[qi(b, t, h) + e] * kk[ki(b, u, j) + e];
          s[u] = d * scale;
          mx = Math.max(mx, s[u]);
        }
        let z = 0;
        for (let u = 0; u <= t; u++) z += Math.exp(s[u] - mx);
        lse[(b * H + h) * T + t] = mx + Math.log(z);
        for (let u = 0; u <= t; u++) p[t * T + u] = Math.exp(s[u] - mx) / z;
        for (let u = 0; u <= t; u++)
          for (let e = 0; e < E; e++) out[qi(b, t, h) + e] += p[t * T + u] * v[ki(b, u, j) + e];
      }
      for (let t = 0; t < T; t++) {
        const dp = new Float64Array(t + 1);
        let sum = 0;
        for (let u = 0; u <= t; u++) {
          let d = 0;
          for (let e = 0; e < E; e++) d += dout[qi(b, t, h) + e] * v[ki(b, u, j) + e];
          dp[u] = d;
          sum += p[t * T + u] * d;
        }
        for (let u = 0; u <= t; u++) {
          const ds = p[t * T + u] * (dp[u] - sum) * scale;
          for (let e = 0; e < E; e++) {
            dq[qi(b, t, h) + e] += ds * kk[ki(b, u, j) + e];
            dk[ki(b, u, j) + e] += ds * q[qi(b, t, h) + e];
            dv[ki(b, u, j) + e] += p[t * T + u] * dout[qi(b, t, h) + e];
          }
        }
      }
    }
  return { out, lse, dq, dk, dv };
}

test("attention: causal GQA forward (out, lse) and backward (dq, dk, dv overwritten) against float64, T across the blocks of 64 queries and 256 keys", {
  skip,
}, () => {
  const k = K!;
  let seed = 100;
  for (const [B, T, H, Kh, E] of [
    [1, 1, 1, 1, 4],
    [2, 5, 3, 3, 6],
    [1, 70, 6, 2, 8],
    [2, 131, 4, 1, 5],
    [1, 64, 3, 3, 64],
    [1, 200, 6, 2, 40],
    [1, 600, 2, 1, 16],
  ] as const) {
    const q = rand(B * T * H * E, seed++, true, 2),
      kk = rand(B * T * Kh * E, seed++, true, 2),
      v = rand(B * T * Kh * E, seed++, true);
    const dout = rand(B * T * H * E, seed++, true);
    // a row whose largest score comes late (the online softmax rescales what it summed before), 30x the others
    if (T === 600) for (let i = 0; i < E; i++) q[(550 * H + 1) * E + i] = 30 * kk[530 * Kh * E + i];
    const ref = refAttention(q, kk, v, dout, B, T, H, Kh, E);
    const out = filled(B * T * H * E, NaN, true),
      lse = filled(B * H * T, NaN, true);
    k.attentionForward(out, lse, q, kk, v, B, T, H, Kh, E);
    const what = `B${B} T${T} H${H} K${Kh} E${E}`;
    close(lse, ref.lse, TOL, `attentionForward lse ${what}`);
    close(out, ref.out, TOL, `attentionForward out ${what}`);
    const dq = filled(q.length, NaN, true),
      dk = filled(kk.length, NaN, true),
      dv = filled(v.length, NaN, true);
    k.attentionBackward(dq, dk, dv, dout, q, kk, v, out, lse, B, T, H, Kh, E);
    close(dq, ref.dq, TOL, `attentionBackward dq ${what}`);
    close(dk, ref.dk, TOL, `attentionBackward dk ${what}`);
    close(dv, ref.dv, TOL, `attentionBackward dv ${what}`);
  }
  assert.throws(
    () =>
      k.attentionForward(
        new Float32Array(8),
        new Float32Array(3),
        new Float32Array(8),
        new Float32Array(8),
        new Float32Array(8),
        1,
        2,
        2,
        2,
        2,
      ),
    /lse has 3 elements, the shapes need 4/,
  );
  const z = new Float32Array(8);
  assert.throws(
    () => k.attentionBackward(z, z, z, z, z, z, z, new Float32Array(7), new Float32Array(4), 1, 2, 2, 2, 2),
    /out has 7 elements, the shapes need 8/,
  );
});

test("the bench's timed copy of the fused attention (native/probes.c) gives the kernels' bits, checks the same, and times the work between its products", {
  skip,
}, () => {
  const k = K!,
    pa = profiledAttention()!;
  const [B, T, H, Kh, E] = [2, 150, 6, 2, 16];
  const q = rand(B * T * H * E, 71, true, 2),
    kk = rand(B * T * Kh * E, 72, true, 2),
    v = rand(B * T * Kh * E, 73, true),
    dout = rand(B * T * H * E, 74, true);
  const run = (fwd: typeof k.attentionForward, bwd: typeof k.attentionBackward) => {
    const out = filled(B * T * H * E, NaN),
      lse = filled(B * H * T, NaN),
      dq = filled(q.length, NaN),
      dk = filled(kk.length, NaN),
      dv = filled(v.length, NaN);
    fwd(out, lse, q, kk, v, B, T, H, Kh, E);
    bwd(dq, dk, dv, dout, q, kk, v, out, lse, B, T, H, Kh, E);
    return [out, lse, dq, dk, dv];
  };
  const want = run(k.attentionForward, k.attentionBackward);
  pa.restMs();
  const got = run(pa.forward, pa.backward);
  assert.ok(pa.restMs() > 0, "the timed copy's work between the products took some time");
  assert.equal(pa.restMs(), 0, "reading the time resets it");
  for (let i = 0; i < want.length; i++)
    assert.deepEqual(new Uint32Array(got[i].buffer), new Uint32Array(want[i].buffer), `array ${i}: the same bits`);
  assert.throws(
    () => pa.forward(want[0], new Float32Array(3), q, kk, v, B, T, H, Kh, E),
    /attentionForwardProfiled: lse has 3 elements/,
  );
});

test("cached attention refuses a cache shorter than the positions it reads, and H not a multiple of K, before touching memory", {
  skip,
}, () => {
  const k = K!;
  const out = new Float32Array(2 * 4 * 3).fill(7),
    q = new Float32Array(2 * 4 * 3);
  // P 5 + T 2 positions of K 2 heads x E 3 need 42 floats per cache
  assert.throws(
    () => k.attentionCachedForward(out, q, new Float32Array(36), new Float32Array(42), 5, 2, 4, 2, 3),
    /kCache has 36 elements, the shapes need 42/,
  );
  assert.throws(
    () => k.attentionCachedForward(out, q, new Float32Array(42), new Float32Array(41), 5, 2, 4, 2, 3),
    /vCache has 41 elements, the shapes need 42/,
  );
  assert.throws(
    () => k.attentionCachedForward(out, q, new Float32Array(63), new Float32Array(63), 5, 2, 4, 3, 3),
    /H must be a multiple of K/,
  );
  assert.ok(
    out.every((x) => x === 7),
    "out untouched",
  );
});

// ------------------------------------------------------------------ SwiGLU
test("swiglu: forward and backward (dgate, dup overwritten) against float64", { skip }, () => {
  const k = K!;
  const n = 1003;
  const g = rand(n, 31, true, 8),
    u = rand(n, 32, true, 3),
    dout = rand(n, 33, true);
  const out = filled(n, NaN, true);
  k.swigluForward(out, g, u, n);
  const wo = new Float64Array(n),
    wg = new Float64Array(n),
    wu = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const x = g[i],
      s = 1 / (1 + Math.exp(-x));
    wo[i] = x * s * u[i];
    wu[i] = dout[i] * x * s;
    wg[i] = dout[i] * u[i] * s * (1 + x * (1 - s));
  }
  close(out, wo, TOL, "swigluForward");
  const dg = filled(n, NaN, true),
    du = filled(n, NaN);
  k.swigluBackward(dg, du, dout, g, u, n);
  close(dg, wg, TOL, "swigluBackward dgate");
  close(du, wu, TOL, "swigluBackward dup");
});

// ------------------------------------------------------------------ cross-entropy
test("crossEntropy: float64 loss over targeted rows, gradient in place (scaled), -1 rows add nothing, gradScale 0 leaves logits", {
  skip,
}, () => {
  const k = K!;
  const rows = 9,
    V = 1037;
  const logits0 = rand(rows * V, 41, true, 12);
  const targets = new Int32Array([5, -1, 1036, 0, 77, -1, 500, 3, 3]);
  // rows whose largest logit is far above the rest, in the last (non-multiple-of-8) elements and at the start: a
  // softmax that misses the true maximum overflows exp there
  logits0[2 * V + 1036] = 150;
  logits0[3 * V + 1033] = -40;
  logits0[4 * V] = 120;
  let wantLoss = 0;
  const wantG = new Float64Array(rows * V);
  const scale = 0.37;
  for (let r = 0; r < rows; r++) {
    if (targets[r] < 0) continue;
    let mx = -Infinity;
    for (let i = 0; i < V; i++) mx = Math.max(mx, logits0[r * V + i]);
    let z = 0;
    for (let i = 0; i < V; i++) z += Math.exp(logits0[r * V + i] - mx);
    wantLoss += mx + Math.log(z) - logits0[r * V + targets[r]];
    for (let i = 0; i < V; i++)
      wantG[r * V + i] = (Math.exp(logits0[r * V + i] - mx) / z - (i === targets[r] ? 1 : 0)) * scale;
  }
  const ev = copy(logits0, true);
  const lossEval = k.crossEntropy(ev, targets, rows, V, 0);
  assert.ok(Math.abs(lossEval - wantLoss) <= 1e-9 * Math.abs(wantLoss), `eval loss ${lossEval} vs ${wantLoss}`);
  assert.ok(bytesEqual(ev, logits0), "gradScale 0 must leave the logits untouched");
  const lg = copy(logits0, true);
  const loss = k.crossEntropy(lg, targets, rows, V, scale);
  assert.ok(Math.abs(loss - wantLoss) <= 1e-9 * Math.abs(wantLoss), `loss ${loss} vs ${wantLoss}`);
  close(lg, wantG, 1e-6, "crossEntropy gradient");
  for (const r of [1, 5])
    assert.ok(
      lg.subarray(r * V, (r + 1) * V).every((x) => x === 0),
      `row ${r} (target -1) has a zero gradient`,
    );
  assert.throws(() => k.crossEntropy(copy(logits0), new Int32Array(rows).fill(V), rows, V, 1), /target is outside/);
});

// ------------------------------------------------------------------ determinism
test("every kernel is bit-identical run to run, and on ArrayBuffer vs SharedArrayBuffer operands", { skip }, () => {
  const k = K!;
  const B = 1,
    T = 67,
    H = 4,
    Kh = 2,
    E = 16,
    D = H * E,
    N = B * T,
    V = 301;
  const runOnce = (shared: boolean): Float32Array[] => {
    const outs: Float32Array[] = [];
    const x = rand(N * D, 1, shared),
      w = rand(D, 2, shared);
    const hN = filled(N * D, 0, shared),
      rstd = filled(N, 0, shared);
    k.rmsnormForward(hN, rstd, x, w, N, D, 1e-5);
    const Wq = rand(D * D, 3, shared),
      q = filled(N * D, 0, shared);
    k.matmul(false, true, N, D, D, 1, hN, Wq, 0, q);
    const kk = rand(N * Kh * E, 4, shared),
      v = rand(N * Kh * E, 5, shared);
    const { cos, sin } = ropeTables(T, E / 2);
    k.ropeForward(q, cos, sin, B, T, H, E);
    const out = filled(N * D, 0, shared),
      lse = filled(B * H * T, 0, shared);
    k.attentionForward(out, lse, q, kk, v, B, T, H, Kh, E);
    const dq = filled(N * D, 0, shared),
      dk = filled(kk.length, 0, shared),
      dv = filled(v.length, 0, shared);
    k.attentionBackward(dq, dk, dv, out, q, kk, v, out, lse, B, T, H, Kh, E);
    k.ropeBackward(dq, cos, sin, B, T, H, E);
    const sw = filled(N * D, 0, shared),
      dg = filled(N * D, 0, shared),
      du = filled(N * D, 0, shared);
    k.swigluForward(sw, q, out, N * D);
    k.swigluBackward(dg, du, sw, q, out, N * D);
    const dx = filled(N * D, 0, shared),
      dw = filled(D, 0, shared);
    k.rmsnormBackward(dx, dw, dg, x, w, rstd, N, D);
    const lg = rand(N * V, 6, shared, 5),
      tg = new Int32Array(N).map((_, i) => (i * 7) % V);
    const loss = k.crossEntropy(lg, tg, N, V, 0.5);
    const Em = rand(V * D, 7, shared),
      dE = filled(V * D, 0, shared),
      emb = filled(N * D, 0, shared);
    k.embeddingForward(emb, tg, Em, N, D);
    k.embeddingBackward(dE, tg, dx, N, D);
    outs.push(hN, rstd, q, out, lse, dq, dk, dv, sw, dg, du, dx, dw, lg, Float32Array.of(loss), emb, dE);
    return outs;
  };
  const a = runOnce(false),
    b = runOnce(false),
    c = runOnce(true);
  for (let i = 0; i < a.length; i++) {
    assert.ok(bytesEqual(a[i], b[i]), `output ${i} differs between two runs`);
    assert.ok(bytesEqual(a[i], c[i]), `output ${i} differs between ArrayBuffer and SharedArrayBuffer operands`);
  }
});

test("worker threads load the addon for themselves, share one BLAS, and compute what the main thread computes", {
  skip,
}, async () => {
  const mod = path.join(__dirname, "..", "src", "model", "engine", "native.js");
  const sab = new SharedArrayBuffer(4 * (3 * 64 * 64));
  const A = new Float32Array(sab, 0, 64 * 64),
    Bm = new Float32Array(sab, 4 * 64 * 64, 64 * 64);
  A.set(rand(64 * 64, 51));
  Bm.set(rand(64 * 64, 52));
  const want = new Float32Array(64 * 64);
  K!.matmul(false, true, 64, 64, 64, 1, A, Bm, 0, want);
  const code = `
    const { parentPort, workerData } = require("node:worker_threads");
    const n = require(${JSON.stringify(mod)}).loadNative();
    if (!n.kernels) { parentPort.postMessage({ error: n.reason }); }
    else {
      const A = new Float32Array(workerData.sab, 0, 4096), B = new Float32Array(workerData.sab, 4 * 4096, 4096);
      const out = new Float32Array(4096);
      n.kernels.matmul(false, true, 64, 64, 64, 1, A, B, 0, out);
      parentPort.postMessage({ out, name: n.kernels.name });
    }`;
  const got = await Promise.all(
    [0, 1].map(
      () =>
        new Promise<{ out?: Float32Array; error?: string; name?: string }>((resolve, reject) => {
          const w = new Worker(code, { eval: true, workerData: { sab } });
          w.once("message", (m) => {
            resolve(m);
            void w.terminate();
          });
          w.once("error", reject);
        }),
    ),
  );
  for (const g of got) {
    assert.equal(g.error, undefined);
    assert.ok(bytesEqual(g.out!, want), "a worker's product differs from the main thread's");
    assert.equal(g.name, K!.name);
  }
});

// ------------------------------------------------------------------ against the plain-JS reference kernels
test("native agrees with the plain-JS reference kernels (src/model/engine/js.ts) on every non-matmul kernel", {
  skip,
}, () => {
  const k = K!,
    j = jsKernels;
  const B = 2,
    T = 69,
    H = 6,
    Kh = 2,
    E = 8,
    D = 37,
    N = B * T,
    V = 523,
    F = 45;
  const both = (f: (kk: NonMatmulKernels, shared: boolean) => Float32Array[] | number, what: string, tol = TOL) => {
    const a = f(k, true),
      b = f(j, false);
    if (typeof a === "number" || typeof b === "number") {
      assert.ok(
        Math.abs(Number(a) - Number(b)) <= tol * (1 + Math.abs(Number(b))),
        `${what}: ${String(a)} vs ${String(b)}`,
      );
      return;
    }
    for (let i = 0; i < a.length; i++) close(a[i], b[i], tol, `${what} output ${i}`);
  };
  both((kk, sh) => {
    const o = filled(N * D, NaN, sh),
      r = filled(N, NaN, sh);
    kk.rmsnormForward(o, r, rand(N * D, 1, sh), rand(D, 2, sh), N, D, 1e-6);
    return [o, r];
  }, "rmsnormForward");
  both((kk, sh) => {
    const x = rand(N * D, 1, sh),
      w = rand(D, 2, sh),
      o = filled(N * D, 0, sh),
      r = filled(N, 0, sh);
    kk.rmsnormForward(o, r, x, w, N, D, 1e-6);
    const dx = rand(N * D, 3, sh),
      dw = rand(D, 4, sh);
    kk.rmsnormBackward(dx, dw, rand(N * D, 5, sh), x, w, r, N, D);
    return [dx, dw];
  }, "rmsnormBackward");
  const { cos, sin } = ropeTables(T, E / 2);
  both((kk, sh) => {
    const x = rand(N * H * E, 6, sh);
    kk.ropeForward(x, cos, sin, B, T, H, E);
    return [x];
  }, "ropeForward");
  both((kk, sh) => {
    const x = rand(N * H * E, 7, sh);
    kk.ropeBackward(x, cos, sin, B, T, H, E);
    return [x];
  }, "ropeBackward");
  both((kk, sh) => {
    const q = rand(N * H * E, 8, sh, 2),
      kv = rand(N * Kh * E, 9, sh, 2),
      v = rand(N * Kh * E, 10, sh);
    const out = filled(N * H * E, NaN, sh),
      lse = filled(B * H * T, NaN, sh);
    kk.attentionForward(out, lse, q, kv, v, B, T, H, Kh, E);
    const dq = filled(q.length, NaN, sh),
      dk = filled(kv.length, NaN, sh),
      dv = filled(v.length, NaN, sh);
    kk.attentionBackward(dq, dk, dv, rand(N * H * E, 11, sh), q, kv, v, out, lse, B, T, H, Kh, E);
    return [out, lse, dq, dk, dv];
  }, "attention");
  both((kk, sh) => {
    const g = rand(N * F, 12, sh, 6),
      u = rand(N * F, 13, sh),
      o = filled(N * F, NaN, sh),
      dg = filled(N * F, NaN, sh),
      du = filled(N * F, NaN, sh);
    kk.swigluForward(o, g, u, N * F);
    kk.swigluBackward(dg, du, rand(N * F, 14, sh), g, u, N * F);
    return [o, dg, du];
  }, "swiglu");
  const targets = new Int32Array(N).map((_, i) => (i % 5 === 4 ? -1 : (i * 37) % V));
  both(
    (kk, sh) => {
      const lg = rand(N * V, 15, sh, 8);
      return kk.crossEntropy(lg, targets, N, V, 0);
    },
    "crossEntropy loss",
    1e-9,
  );
  both((kk, sh) => {
    const lg = rand(N * V, 15, sh, 8);
    kk.crossEntropy(lg, targets, N, V, 0.25);
    return [lg];
  }, "crossEntropy gradient");
  const ids = new Int32Array(N).map((_, i) => (i * 13) % V);
  both((kk, sh) => {
    const Em = rand(V * D, 16, sh),
      out = filled(N * D, NaN, sh),
      dE = rand(V * D, 17, sh);
    kk.embeddingForward(out, ids, Em, N, D);
    kk.embeddingBackward(dE, ids, rand(N * D, 18, sh), N, D);
    return [out, dE];
  }, "embedding");
});
