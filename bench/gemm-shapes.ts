/**
 * The `gemm` case of `npm run bench`: the built-in GEMM (each kernel this CPU runs, in fp32 and in bf16 on its
 * emulation beside it; AMX and VDPBF16PS where present) and OpenBLAS on every matrix product of the frozen model
 * (hidden 576, 9/3 heads of 64, ffn 1536) at seq 256 and seq 1024, one thread, against the core's FMA peak for the
 * kernel's instruction set measured in the same run (a register-only loop of 12 independent FMA chains). Kernels and shapes take turns round by round, with a peak probe before every shape, so
 * drift on a shared machine hits them alike. Both the probe and the built-in products are timed in C on this thread's
 * CPU clock (a sample is a few products back to back, as the trainer's C code calls them), so time spent descheduled
 * by other load, other threads and the call from JS do not count; OpenBLAS, through its JS wrapper, on the process's
 * CPU clock. Each figure is the best sample of its rounds, and the peak the best of its probes. The built-in kernels
 * read attention's operands with the model's leading dimensions (heads inside [T, heads x 64] rows, blocks of
 * [T, T]); OpenBLAS's wrapper takes dense ones only.
 */
import { loadNative, supportedIsas } from "../src/model/engine/native";
import { builtinGemm, builtinGemmBf16, fmaPeak } from "./native-probes";
import { seededFloats } from "./seeded";

export interface GemmShape {
  name: string;
  ta: boolean;
  tb: boolean;
  M: number;
  N: number;
  K: number;
  /** 0, or 1 where the model adds the product to C (residuals, dx += dy W, gradients accumulated) */
  beta: number;
  seq: number;
  /** the leading dimensions of A, B and C where the model's operands are views into wider matrices (attention's
   *  per-head blocks); absent: dense, each the width of its operand */
  ld?: [number, number, number];
  /** B is a weight (a linear's W, the head's E): the bf16 hardware kernels keep it packed for a whole optimizer step,
   *  so a rank never packs it per product; the bench registers it as the trainer does */
  weightB: boolean;
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

/** Rows of the tied LM head's products at seq T: the model runs the head in chunks of 2^24 / vocab tokens
 *  (src/model/llama.ts: headChunkTokens, 341 for the frozen vocab of 49152). */
const HEAD_CHUNK = Math.floor((1 << 24) / 49152);

/** Every matrix product of the frozen model's step at `seq` tokens (one sequence), with the transpose flags and
 *  beta the model uses (src/model/llama.ts: linearForward, linearBackward, the head; native/ops/attention.c). */
export function modelShapes(seq: number): GemmShape[] {
  const T = seq,
    D = 576,
    KV = 192,
    F = 1536,
    E = 64,
    B = 64,
    V = 49152,
    Th = Math.min(T, HEAD_CHUNK);
  const s = (
    name: string,
    ta: boolean,
    tb: boolean,
    M: number,
    N: number,
    K: number,
    beta = 0,
    ld?: [number, number, number],
  ): GemmShape => ({
    name,
    ta,
    tb,
    M,
    N,
    K,
    beta,
    seq,
    weightB: /^(fwd |bwd d[xsh] )/.test(name),
    ...(ld ? { ld } : {}),
  });
  return [
    s("fwd q = x Wq^T", false, true, T, D, D),
    s("fwd x + o Wo^T (residual)", false, true, T, D, D, 1),
    s("fwd k/v = x W^T", false, true, T, KV, D),
    s("fwd gate/up = x W^T", false, true, T, F, D),
    s("fwd x + s Wdown^T (residual)", false, true, T, D, F, 1),
    s(`fwd logits = h E^T (head, ${Th}-token chunk)`, false, true, Th, V, D),
    s("bwd dx = dy W (q, o)", false, false, T, D, D),
    s("bwd dx += dy W (k, v)", false, false, T, D, KV, 1),
    s("bwd dx = dy W (gate)", false, false, T, D, F),
    s("bwd dx += dy W (up)", false, false, T, D, F, 1),
    s("bwd ds = dy Wdown (down)", false, false, T, F, D),
    s("bwd dh = dlogits E (head)", false, false, Th, D, V),
    s("bwd dW += dy^T x (q/o)", true, false, D, D, T, 1),
    s("bwd dW += dy^T x (k/v)", true, false, KV, D, T, 1),
    s("bwd dW += dy^T x (gate/up)", true, false, F, D, T, 1),
    s("bwd dW += dy^T x (down)", true, false, D, F, T, 1),
    s("bwd dE += dlogits^T h (head)", true, false, V, D, Th, 1),
    // native/ops/attention.c: the fused attention_forward / attention_backward, the largest block of each product:
    // forward, 64 query rows against 256 keys; backward, every query row from the diagonal down against a key block
    // of 64 (the first block: T rows; dq's first accumulating block: T - 64). The scores read q's head in place
    // ([T, 9 x 64]) and the keys times scale as [E, T]; p v reads the block of probabilities and v's head in place
    // ([T, 3 x 64]); dq += dS k writes dq's head in place; dv += P^T dout reads a key block's P of every query row
    // below it and dout's head in place into dv's head ([T, 3 x 64])
    s("attn scores q (scale k)^T, fwd (64 x 256 block)", false, false, B, Math.min(T, 256), E, 0, [
      D,
      T,
      Math.min(T, 256),
    ]),
    s("attn o += p v, fwd", false, false, B, E, Math.min(T, 256), 1, [Math.min(T, 256), KV, E]),
    s("attn scores / dP, bwd (T rows x 64-key block)", false, false, T, B, E, 0, [D, T, B]),
    s("attn dq += dS k, bwd (T - 64 rows)", false, false, Math.max(T - B, 1), E, B, 1, [B, KV, D]),
    s("attn dk/dv += P^T dout, bwd", true, false, B, E, T, 1, [B, D, KV]),
  ];
}

/** The leading dimensions of a shape's A, B and C: the model's where it gives them, else dense. */
function lds(sh: GemmShape): [number, number, number] {
  return sh.ld ?? [sh.ta ? sh.M : sh.K, sh.tb ? sh.K : sh.N, sh.N];
}

/** The addon's gemm arguments after the kernel for one shape. */
function gemmArgs(sh: GemmShape, A: Float32Array, B: Float32Array, C: Float32Array) {
  const [lda, ldb, ldc] = lds(sh);
  return [sh.ta, sh.tb, sh.M, sh.N, sh.K, 1, A, lda, B, ldb, sh.beta, C, ldc] as const;
}

/** n floats uniform in [-0.1, 0.1) from `seed` */
const rand = (n: number, seed: number): Float32Array => seededFloats(n, seed, 0.2);

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
  // each kernel's time: CPU seconds for `calls` products back to back
  const kernels: Array<{
    name: string;
    time: (sh: GemmShape, A: Float32Array, B: Float32Array, C: Float32Array, calls: number) => number;
    peakOf: string | null;
  }> = [];
  // bf16 products (native/gemm.h: gemm_bf16, --precision bf16, P8): on each fp32 kernel's emulation, beside that
  // kernel and against its FMA peak; on AMX where the CPU has AMX-BF16, against TDPBF16PS's own register-only peak,
  // and on VDPBF16PS where it has AVX512_BF16, against VDPBF16PS's; a weight operand registered as a rank registers
  // the weights (the AMX and VDPBF16PS kernels keep it packed): once per step, so once per shape here (the untimed
  // warm-up call packs it), not per product
  const bf = builtinGemmBf16();
  let registered: Float32Array | null = null;
  const bfTime =
    (isa: "amx" | "avx512bf16" | "avx512" | "avx2") =>
    (sh: GemmShape, A: Float32Array, B: Float32Array, C: Float32Array, calls: number) => {
      if (!bf) return 0;
      const want = sh.weightB ? B : null;
      if (want !== registered) bf.weights(want ?? new Float32Array(0));
      registered = want;
      return bf.gemm(isa, ...gemmArgs(sh, A, B, C), calls);
    };
  for (const isa of isas) {
    kernels.push({
      name: `builtin ${isa}`,
      peakOf: isa,
      time: (sh: GemmShape, A: Float32Array, B: Float32Array, C: Float32Array, calls: number) =>
        g(isa, ...gemmArgs(sh, A, B, C), calls),
    });
    if (bf && (isa === "avx512" || isa === "avx2"))
      kernels.push({ name: `builtin ${isa} bf16`, peakOf: isa, time: bfTime(isa) });
  }
  if (bf?.hw) kernels.push({ name: "builtin bf16 (AMX)", peakOf: "amx", time: bfTime("amx") });
  if (bf?.dp) kernels.push({ name: "builtin avx512bf16", peakOf: "avx512bf16", time: bfTime("avx512bf16") });
  if ("kernels" in blas) {
    const k = blas.kernels;
    kernels.push({
      name: "openblas",
      peakOf: null,
      time: (sh, A, B, C, calls) => {
        const c0 = process.cpuUsage(); // this thread is the only busy one
        for (let i = 0; i < calls; i++) k.matmul(sh.ta, sh.tb, sh.M, sh.N, sh.K, 1, A, B, sh.beta, C);
        const c = process.cpuUsage(c0);
        return Math.max(1, c.user + c.system) / 1e6;
      },
    });
  } else opts.log(`gemm: OpenBLAS not measured (${blas.reason})`);
  const shapes = opts.seqs.flatMap(modelShapes);
  const data = shapes.map((sh, i) => ({
    A: rand((sh.ta ? sh.K : sh.M) * lds(sh)[0], 3 + i),
    B: rand((sh.tb ? sh.N : sh.K) * lds(sh)[1], 5 + i),
    C: new Float32Array(sh.M * lds(sh)[2]),
  }));
  const best = new Map<string, number>();
  const peaks: Record<string, number> = {};
  const probes = [...isas, ...(bf?.hw ? (["amx"] as const) : []), ...(bf?.dp ? (["avx512bf16"] as const) : [])];
  for (let round = 0; round < opts.rounds; round++) {
    shapes.forEach((sh, i) => {
      // a peak probe per instruction set before every shape, so the probes are spread over the run as the products
      // are (a burst of them at the start of each round could miss every fast minute some product then saw, and
      // that product would run at more than 1.0 of "the peak"), and about as many as a product's samples
      for (const isa of probes) peaks[isa] = Math.max(peaks[isa] ?? 0, fmaPeak(isa, 500_000) ?? 0);
      const d = data[i];
      const flops = 2 * sh.M * sh.N * sh.K;
      // a sample: enough products back to back for 2e7 flops (about 0.1 ms), so the clock's own cost is noise;
      // the fastest sample kept (time the products were not running, another process having the core, does not
      // count, as for the peak probe). Samples per round: about 4e8 flops in all and at least 6 for the built-in
      // kernels, so that every product gets about as many chances at a quiet minute over the run as the peak probe
      // (one a shape: 40 a round); OpenBLAS, 20-50x slower and held to no target: about 1e8 flops, at least 3.
      const calls = Math.max(1, Math.round(2e7 / flops));
      for (const k of kernels) {
        const [budget, least] = k.peakOf ? [4e8, 6] : [1e8, 3];
        const samples = Math.max(least, Math.round(budget / (flops * calls)));
        k.time(sh, d.A, d.B, d.C, 1); // untimed: caches and packing buffers warm
        let fastest = Infinity;
        for (let r = 0; r < samples; r++) fastest = Math.min(fastest, k.time(sh, d.A, d.B, d.C, calls) / calls);
        const gf = flops / fastest / 1e9;
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
  if (registered) bf?.weights(new Float32Array(0));
  const rows: GemmRow[] = [];
  shapes.forEach((sh, i) => {
    for (const k of kernels) {
      const gf = best.get(`${i}|${k.name}`)!;
      const peak = k.peakOf ? peaks[k.peakOf] : null;
      rows.push({
        shape: `${sh.ta ? "T" : "N"}${sh.tb ? "T" : "N"} ${sh.M}x${sh.N}x${sh.K}${sh.beta ? ", beta 1" : ""}${sh.ld ? `, ld ${sh.ld.join("/")}` : ""}`,
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
    "Each cell: best GFLOP/s of the run's samples (a few products back to back, timed in C on the thread's CPU clock; OpenBLAS through its JS wrapper on the process's, on dense operands), with the fraction of that instruction set's peak. `ld A/B/C`: the model's leading dimensions where its operands are views into wider matrices (the built-in kernels run them so). Command: `npm run bench -- --cases gemm`.",
    "",
    `| seq | product | shape (M x N x K, beta) | ${kernels.join(" | ")} |`,
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
