/**
 * The `gemm` case of `npm run bench`: the built-in GEMM (each kernel this CPU runs) and OpenBLAS on every matrix
 * product of the frozen model (hidden 576, 9/3 heads of 64, ffn 1536) at seq 256 and seq 1024, one thread, against
 * the core's FMA peak for the kernel's instruction set measured in the same run (a register-only loop of 12
 * independent FMA chains). Kernels, shapes and peak probes take turns round by round, so drift on a shared machine
 * hits them alike. Both the probe and the products are timed on CPU time (the thread's, the process's), so time
 * spent descheduled by other load does not count; each figure is the best of its calls and rounds.
 */
import { builtinGemm, builtinGemmBf16, fmaPeak, loadNative, supportedIsas } from "../src/model/engine/native";

export interface GemmShape {
  name: string;
  ta: boolean;
  tb: boolean;
  M: number;
  N: number;
  K: number;
  seq: number;
}
export interface GemmRow {
  shape: string;
  what: string;
  seq: number;
  kernel: string;
  gflops: number;
  peak_gflops: number | null;
  of_peak: number | null;
}

/** The frozen model's products at `seq` tokens (one sequence), with the transpose flags the model uses. */
export function modelShapes(seq: number): GemmShape[] {
  const T = seq,
    D = 576,
    KV = 192,
    F = 1536,
    E = 64,
    B = 64;
  const s = (name: string, ta: boolean, tb: boolean, M: number, N: number, K: number): GemmShape => ({
    name,
    ta,
    tb,
    M,
    N,
    K,
    seq,
  });
  return [
    s("fwd q/o  x W^T", false, true, T, D, D),
    s("fwd k/v  x W^T", false, true, T, KV, D),
    s("fwd gate/up x W^T", false, true, T, F, D),
    s("fwd down x W^T", false, true, T, D, F),
    s("bwd dx = dy W (q/o)", false, false, T, D, D),
    s("bwd dx = dy W (down)", false, false, T, D, F),
    s("bwd dW = dy^T x (q/o)", true, false, D, D, T),
    s("bwd dW = dy^T x (gate/up)", true, false, F, D, T),
    s("bwd dW = dy^T x (down)", true, false, D, F, T),
    s("attn scores (q*scale) k^T, k as [E, T] (64-row block)", false, false, B, T, E),
    s("attn out att v", false, false, B, E, T),
    s("attn dk/dv att^T dout", true, false, B, E, T),
  ];
}

function rand(n: number, seed: number): Float32Array {
  const a = new Float32Array(n);
  let x = seed >>> 0;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    a[i] = (x / 4294967296 - 0.5) * 0.2;
  }
  return a;
}

/**
 * Rounds over every (shape, kernel) and the peak probes; returns one row per pair with the best GFLOP/s of its
 * rounds and its fraction of the same run's best peak for that instruction set.
 */
export function gemmShapesBench(opts: { seqs: number[]; rounds: number; log: (m: string) => void }): {
  rows: GemmRow[];
  peaks: Record<string, number>;
} {
  const g = builtinGemm();
  if (!g) throw new Error("the native addon does not load (npm run build:native)");
  const isas = supportedIsas().filter((i) => i !== "portable");
  const blas = loadNative({ gemm: "openblas", isa: "auto" });
  const kernels: Array<{
    name: string;
    run: (sh: GemmShape, A: Float32Array, B: Float32Array, C: Float32Array) => void;
    peakOf: string | null;
  }> = isas.map((isa) => ({
    name: `builtin ${isa}`,
    peakOf: isa,
    run: (sh: GemmShape, A: Float32Array, B: Float32Array, C: Float32Array) =>
      g(isa, sh.ta, sh.tb, sh.M, sh.N, sh.K, 1, A, sh.ta ? sh.M : sh.K, B, sh.tb ? sh.K : sh.N, 0, C, sh.N),
  }));
  // bf16 products on AMX (native/gemm.h: gemm_bf16), where the CPU has AMX-BF16, against TDPBF16PS's own
  // register-only peak (--precision bf16, P8)
  const bf = builtinGemmBf16();
  if (bf?.hw)
    kernels.push({
      name: "builtin bf16 (AMX)",
      peakOf: "amx",
      run: (sh, A, B, C) =>
        bf.gemm("amx", sh.ta, sh.tb, sh.M, sh.N, sh.K, 1, A, sh.ta ? sh.M : sh.K, B, sh.tb ? sh.K : sh.N, 0, C, sh.N),
    });
  if ("kernels" in blas) {
    const k = blas.kernels;
    kernels.push({
      name: "openblas",
      peakOf: null,
      run: (sh, A, B, C) => k.matmul(sh.ta, sh.tb, sh.M, sh.N, sh.K, 1, A, B, 0, C),
    });
  } else opts.log(`gemm: OpenBLAS not measured (${blas.reason})`);
  const shapes = opts.seqs.flatMap(modelShapes);
  const data = shapes.map((sh, i) => ({
    A: rand(sh.M * sh.K, 3 + i),
    B: rand(sh.K * sh.N, 5 + i),
    C: new Float32Array(sh.M * sh.N),
  }));
  const best = new Map<string, number>();
  const peaks: Record<string, number> = {};
  for (let round = 0; round < opts.rounds; round++) {
    for (let probe = 0; probe < 10; probe++)
      for (const isa of [...isas, ...(bf?.hw ? (["amx"] as const) : [])])
        peaks[isa] = Math.max(peaks[isa] ?? 0, fmaPeak(isa, 500_000) ?? 0);
    shapes.forEach((sh, i) => {
      const d = data[i];
      for (const k of kernels) {
        k.run(sh, d.A, d.B, d.C); // untimed: caches and packing buffers warm
        // each call timed alone on the process's CPU clock (this thread is the only busy one), the fastest kept:
        // time the call was not running (another process had the core) does not count, as for the peak probe
        const reps = Math.max(3, Math.round(1e8 / (2 * sh.M * sh.N * sh.K)));
        let fastest = Infinity;
        for (let r = 0; r < reps; r++) {
          const c0 = process.cpuUsage();
          k.run(sh, d.A, d.B, d.C);
          const c = process.cpuUsage(c0);
          fastest = Math.min(fastest, Math.max(1, c.user + c.system) / 1e6);
        }
        const gf = (2 * sh.M * sh.N * sh.K) / fastest / 1e9;
        const key = `${i}|${k.name}`;
        best.set(key, Math.max(best.get(key) ?? 0, gf));
      }
    });
    opts.log(
      `gemm: round ${round + 1}/${opts.rounds}, peaks ${Object.entries(peaks)
        .map(([k, v]) => `${k} ${v.toFixed(1)}`)
        .join(", ")} GFLOP/s`,
    );
  }
  const rows: GemmRow[] = [];
  shapes.forEach((sh, i) => {
    for (const k of kernels) {
      const gf = best.get(`${i}|${k.name}`)!;
      const peak = k.peakOf ? peaks[k.peakOf] : null;
      rows.push({
        shape: `${sh.ta ? "T" : "N"}${sh.tb ? "T" : "N"} ${sh.M}x${sh.N}x${sh.K}`,
        what: sh.name,
        seq: sh.seq,
        kernel: k.name,
        gflops: Math.round(gf * 10) / 10,
        peak_gflops: peak === null ? null : Math.round(peak * 10) / 10,
        of_peak: peak ? Math.round((gf / peak) * 1000) / 1000 : null,
      });
    }
  });
  return { rows, peaks };
}

/** The per-shape table (markdown): one line per shape, one column per kernel (GFLOP/s and fraction of peak). */
export function gemmTableMarkdown(rows: GemmRow[], peaks: Record<string, number>, machine: string): string {
  const kernels = [...new Set(rows.map((x) => x.kernel))];
  const shapes = [...new Set(rows.map((x) => `${x.seq}|${x.what}|${x.shape}`))];
  const lines = [
    "# Built-in GEMM on the frozen model's shapes (one thread)",
    "",
    `Machine: ${machine}. Peaks measured in the same run (12 independent register-only FMA chains): ${Object.entries(
      peaks,
    )
      .map(([k, v]) => `${k} ${v.toFixed(1)} GFLOP/s`)
      .join(", ")}.`,
    "Each cell: best GFLOP/s of the run's calls, timed on CPU time (fraction of that instruction set's peak). Command: `npm run bench -- --cases gemm`.",
    "",
    `| seq | product | shape (M x N x K) | ${kernels.join(" | ")} |`,
    `|---|---|---|${kernels.map(() => "---").join("|")}|`,
  ];
  for (const key of shapes) {
    const [seq, what, shape] = key.split("|");
    const cells = kernels.map((k) => {
      const x = rows.find((y) => `${y.seq}|${y.what}|${y.shape}` === key && y.kernel === k)!;
      return x.of_peak === null ? `${x.gflops}` : `${x.gflops} (${x.of_peak.toFixed(2)})`;
    });
    lines.push(`| ${seq} | ${what} | ${shape} | ${cells.join(" | ")} |`);
  }
  const worst = (k: string) =>
    Math.min(...rows.filter((x) => x.kernel === k && x.of_peak !== null).map((x) => x.of_peak!));
  lines.push(
    "",
    ...kernels
      .filter((k) => k.startsWith("builtin"))
      .map((k) => `Lowest fraction of peak, ${k}: ${worst(k).toFixed(3)}.`),
  );
  return `${lines.join("\n")}\n`;
}
