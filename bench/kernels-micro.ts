/**
 * Kernel microbench for the native engine: one thread, the frozen model's shapes (M1: hidden 576,
 * 9/3 heads of 64, ffn 1536, vocab 49,152) at N tokens, every product with the transpose flags the model uses.
 * Prints a table (and a BENCH_JSON line per row): best-of-reps time, GFLOP/s for products, and an estimate of
 * each kernel's time per training step (calls per step x time). Also the single-thread sgemm rate at 2048^2.
 *
 *   node dist/bench/kernels-micro.js [--tokens 256] [--reps 5] [--chunk 256]
 *
 * Timings on a shared machine are noisy: compare rows within one run.
 */
import { loadNative } from "../src/model/engine/native";
import type { Kernels } from "../src/model/kernels";
import { arg } from "./args";
import { seededFloats } from "./seeded";

/** n floats uniform in [-0.1, 0.1) from `seed` */
const rand = (n: number, seed: number): Float32Array => seededFloats(n, seed, 0.2);

/** best-of-reps milliseconds of f (one untimed call first) */
function best(f: () => void, reps: number): number {
  f();
  let b = Infinity;
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    f();
    b = Math.min(b, performance.now() - t0);
  }
  return b;
}

export interface MicroRow {
  kernel: string;
  shape: string;
  ms: number;
  gflops: number | null;
  per_step: number;
  step_ms: number;
}

/** Single-thread sgemm GFLOP/s at [n,n]x[n,n] (best of reps). */
export function sgemmRate(k: Kernels, n: number, reps: number): number {
  const A = rand(n * n, 1),
    B = rand(n * n, 2),
    C = new Float32Array(n * n);
  const ms = best(() => k.matmul(false, false, n, n, n, 1, A, B, 0, C), reps);
  return (2 * n * n * n) / (ms / 1000) / 1e9;
}

/** Every kernel on the frozen model's shapes at N tokens (seq N, batch 1), with calls per training step (22 layers,
 *  gradient checkpointing's recomputation not counted). */
export function microRows(k: Kernels, N: number, reps: number, chunk: number): MicroRow[] {
  const D = 576,
    H = 9,
    Kh = 3,
    E = 64,
    F = 1536,
    V = 49152,
    L = 22,
    T = N;
  const rows: MicroRow[] = [];
  const mm = (
    name: string,
    tA: boolean,
    tB: boolean,
    M: number,
    Nn: number,
    Kd: number,
    beta: number,
    perStep: number,
  ) => {
    const A = rand(M * Kd, 3),
      B = rand(Kd * Nn, 4),
      C = new Float32Array(M * Nn);
    const ms = best(() => k.matmul(tA, tB, M, Nn, Kd, 1, A, B, beta, C), reps);
    rows.push({
      kernel: `matmul ${name}`,
      shape: `${tA ? "T" : "N"}${tB ? "T" : "N"} ${M}x${Nn}x${Kd}`,
      ms,
      gflops: (2 * M * Nn * Kd) / (ms / 1000) / 1e9,
      per_step: perStep,
      step_ms: ms * perStep,
    });
  };
  // forward (y = x @ W^T)
  mm("fwd q/o (x W^T)", false, true, N, D, D, 0, 2 * L);
  mm("fwd k/v (x W^T)", false, true, N, Kh * E, D, 0, 2 * L);
  mm("fwd gate/up (x W^T)", false, true, N, F, D, 0, 2 * L);
  mm("fwd down (m W^T)", false, true, N, D, F, 1, L);
  // backward: dx = dy @ W, dW += dy^T @ x
  mm("bwd dx q/o (dy W)", false, false, N, D, D, 0, 2 * L);
  mm("bwd dx k/v (dy W)", false, false, N, D, Kh * E, 1, 2 * L);
  mm("bwd dx gate/up (dy W)", false, false, N, D, F, 0, 2 * L);
  mm("bwd dx down (dy W)", false, false, N, F, D, 0, L);
  mm("bwd dW q/o (dy^T x)", true, false, D, D, N, 1, 2 * L);
  mm("bwd dW k/v (dy^T x)", true, false, Kh * E, D, N, 1, 2 * L);
  mm("bwd dW gate/up (dy^T x)", true, false, F, D, N, 1, 2 * L);
  mm("bwd dW down (dy^T m)", true, false, D, F, N, 1, L);
  // LM head, in row chunks
  const chunks = Math.ceil(N / chunk),
    c = Math.min(chunk, N);
  mm("head logits (h E^T)", false, true, c, V, D, 0, chunks);
  mm("head dh (dlogits E)", false, false, c, D, V, 0, chunks);
  mm("head dE (dlogits^T h)", true, false, V, D, c, 1, chunks);

  const t = (kernel: string, shape: string, perStep: number, f: () => void) => {
    const ms = best(f, reps);
    rows.push({ kernel, shape, ms, gflops: null, per_step: perStep, step_ms: ms * perStep });
  };
  const lg = rand(c * V, 5),
    tg = new Int32Array(c).map((_, i) => (i * 31) % V);
  const lgc = new Float32Array(lg.length);
  t("crossEntropy (grad)", `${c}x${V}`, chunks, () => {
    lgc.set(lg);
    k.crossEntropy(lgc, tg, c, V, 1 / N);
  });
  t("  (copy of the logits, not a kernel)", `${c}x${V}`, 0, () => {
    lgc.set(lg);
  });
  const q = rand(N * H * E, 6),
    kk = rand(N * Kh * E, 7),
    v = rand(N * Kh * E, 8),
    out = new Float32Array(N * H * E),
    lse = new Float32Array(H * T);
  t("attentionForward", `T${T} H${H} K${Kh} E${E}`, L, () => k.attentionForward(out, lse, q, kk, v, 1, T, H, Kh, E));
  const dq = new Float32Array(q.length),
    dk = new Float32Array(kk.length),
    dv = new Float32Array(v.length);
  t("attentionBackward", `T${T} H${H} K${Kh} E${E}`, L, () =>
    k.attentionBackward(dq, dk, dv, out, q, kk, v, out, lse, 1, T, H, Kh, E),
  );
  const x = rand(N * D, 9),
    w = rand(D, 10),
    hn = new Float32Array(N * D),
    rstd = new Float32Array(N),
    dx = new Float32Array(N * D),
    dw = new Float32Array(D);
  t("rmsnormForward", `${N}x${D}`, 2 * L + 1, () => k.rmsnormForward(hn, rstd, x, w, N, D, 1e-5));
  t("rmsnormBackward", `${N}x${D}`, 2 * L + 1, () => k.rmsnormBackward(dx, dw, hn, x, w, rstd, N, D));
  const cos = rand((T * E) / 2, 11),
    sin = rand((T * E) / 2, 12);
  t("ropeForward (q and k)", `T${T} ${H}+${Kh} heads`, L, () => {
    k.ropeForward(q, cos, sin, 1, T, H, E);
    k.ropeForward(kk, cos, sin, 1, T, Kh, E);
  });
  t("ropeBackward (dq and dk)", `T${T} ${H}+${Kh} heads`, L, () => {
    k.ropeBackward(dq, cos, sin, 1, T, H, E);
    k.ropeBackward(dk, cos, sin, 1, T, Kh, E);
  });
  const g = rand(N * F, 13),
    u = rand(N * F, 14),
    m = new Float32Array(N * F),
    dg = new Float32Array(N * F),
    du = new Float32Array(N * F);
  t("swigluForward", `${N}x${F}`, L, () => k.swigluForward(m, g, u, N * F));
  t("swigluBackward", `${N}x${F}`, L, () => k.swigluBackward(dg, du, m, g, u, N * F));
  const Em = rand(V * D, 15),
    ids = new Int32Array(N).map((_, i) => (i * 977) % V),
    emb = new Float32Array(N * D),
    dE = new Float32Array(V * D);
  t("embeddingForward", `${N}x${D}`, 1, () => k.embeddingForward(emb, ids, Em, N, D));
  t("embeddingBackward", `${N}x${D}`, 1, () => k.embeddingBackward(dE, ids, emb, N, D));
  return rows;
}

async function main(): Promise<void> {
  const N = Number(arg("--tokens", "256")),
    reps = Number(arg("--reps", "5")),
    chunk = Number(arg("--chunk", "256"));
  const n = loadNative();
  if ("reason" in n) throw new Error(`native engine unavailable: ${n.reason}; fix: ${n.fix}`);
  const k = n.kernels;
  process.stderr.write(`engine: ${k.name}\n`);
  const rows = microRows(k, N, reps, chunk);
  const total = rows.reduce((s, r) => s + r.step_ms, 0);
  const pad = (s: string, n: number) => s.padEnd(n);
  process.stdout.write(
    `${pad("kernel", 32)}${pad("shape", 26)}${pad("ms", 10)}${pad("GFLOP/s", 9)}${pad("calls", 7)}${pad("ms/step", 10)}share\n`,
  );
  for (const r of rows) {
    process.stdout.write(
      `${pad(r.kernel, 32)}${pad(r.shape, 26)}${pad(r.ms.toFixed(3), 10)}${pad(r.gflops === null ? "" : r.gflops.toFixed(1), 9)}${pad(String(r.per_step), 7)}${pad(r.step_ms.toFixed(1), 10)}${((100 * r.step_ms) / total).toFixed(1)}%\n`,
    );
    process.stdout.write(`BENCH_JSON ${JSON.stringify({ case: "kernel-micro", engine: "native", tokens: N, ...r })}\n`);
  }
  const sq = sgemmRate(k, 2048, 3);
  process.stdout.write(
    `sum of the estimates: ${total.toFixed(0)} ms per step of ${N} tokens (forward + backward, no recomputation): ${(N / (total / 1000)).toFixed(1)} tok/s\n`,
  );
  process.stdout.write(`sgemm 2048^2 single thread: ${sq.toFixed(1)} GFLOP/s\n`);
  k.dispose();
}

if (require.main === module) {
  main().catch((e: unknown) => {
    process.stderr.write(`${(e as Error).stack ?? String(e)}\n`);
    process.exitCode = 1;
  });
}
