/**
 * The figures a bench run derives from its rows (bench/bench.ts): the training rows' MFU against the frozen step's
 * matMul rate, each row's own figures against their targets (MFU of the peak, the GEMM's fraction of its peak), and
 * the table of ratios between cases (ratioTable: a new ratio is a row there).
 */
import type { BenchRow } from "./steps";
import type { Ratio } from "./report";
import { r } from "./stats";
import { emit } from "./bench-run";
import { cores, type Options } from "./options";

type RatioField = "tok_per_s" | "step_ms_median" | "tok_per_cpu_s";

/** One ratio of the run: the numerator case's field over the denominator case's, with its target (null: reported
 *  only). A row of ratioTable; params picks, among rows of one case, those of that parameter count (optim). */
interface RatioSpec {
  name: string;
  numerator: string;
  denominator: string;
  target: { op: ">=" | "<="; v: number } | null;
  field?: RatioField;
  note?: string;
  /** said after the denominator (the torch row chosen as the best) */
  denominatorNote?: string;
  params?: number;
}

/** A RatioSpec's value from the rows (null when either case is missing or the denominator is 0), with the same ratio
 *  from each case's fastest step beside it. */
function ratio(rows: BenchRow[], s: RatioSpec): Ratio | null {
  const field = s.field ?? "tok_per_s";
  const find = (c: string) => rows.find((x) => x.case === c && (s.params === undefined || x.params === s.params));
  const a = find(s.numerator),
    b = find(s.denominator);
  const av = a?.[field],
    bv = b?.[field];
  if (typeof av !== "number" || typeof bv !== "number" || bv === 0) return null;
  const value = r(av / bv, 3);
  const t = s.target;
  const met = t === null || value === null ? null : t.op === ">=" ? value >= t.v : value <= t.v;
  // the same ratio from each case's fastest step: what the code can do when the machine leaves it alone
  const bestField = field === "tok_per_s" ? "tok_per_s_best" : field === "step_ms_median" ? "step_ms_min" : null;
  const ab = bestField ? a?.[bestField] : null,
    bb = bestField ? b?.[bestField] : null;
  const best = typeof ab === "number" && typeof bb === "number" && bb !== 0 ? r(ab / bb, 3) : null;
  return {
    ratio: s.name,
    value,
    target: t ? `${t.op} ${t.v}` : null,
    met,
    num: `${s.numerator} ${field}`,
    den: `${s.denominator} ${field}${s.denominatorNote ? ` ${s.denominatorNote}` : ""}`,
    value_best_steps: best,
    ...(s.note ? { note: s.note } : {}),
  };
}

/** Adds the training rows' MFU where the frozen-step case measured the matMul rate. */
export function addTrainingMfu(rows: BenchRow[]): void {
  // ---- MFU of the training steps too, where this run measured the matMul rate (frozen-step case):
  // per rank, (model FLOPs per token x tok/s / world) / matMul rate, for rows of the same model and seq; a bf16
  // row (the trainer's -bf16 rows, PyTorch's autocast) against the bf16 products' rate (frozen-step-bf16)
  for (const fz of rows.filter((x) => x.case === "frozen-step" || x.case === "frozen-step-bf16")) {
    if (typeof fz.matmul_gflops !== "number" || typeof fz.model_flops_per_token !== "number") continue;
    const bf16 = fz.case === "frozen-step-bf16";
    for (const x of rows) {
      if (x === fz || x.params !== fz.params || x.seq_len !== fz.seq_len || typeof x.tok_per_s !== "number") continue;
      if (String(x.case).startsWith("frozen-step")) continue;
      if (/-bf16(@|$)/.test(String(x.case)) !== bf16) continue;
      const per = String(x.case).startsWith("torch") ? 1 : Math.max(1, x.world ?? 1);
      x.mfu = r((fz.model_flops_per_token * x.tok_per_s) / per / (fz.matmul_gflops * 1e9), 3);
      x.mfu_note = `per rank, against the single-thread matmul rate of the frozen-step case's engine (${String(fz.backend)}) in this run`;
      // the case's own line was printed before the rate was known: one more line with the training step's MFU
      emit({
        case: x.case,
        mfu: x.mfu,
        world: x.world,
        backend: x.backend,
        params: x.params,
        seq_len: x.seq_len,
        micro_batch: x.micro_batch,
        tok_per_s: x.tok_per_s,
        matmul_gflops: fz.matmul_gflops,
        model_flops_per_token: fz.model_flops_per_token,
        what: String(x.case).startsWith("torch")
          ? "PyTorch's training step (forward, backward, clip, AdamW)"
          : "the whole training step (forward, backward, reduce, AdamW, weight refresh) per rank",
      });
    }
  }
}

/** This run's bf16 peak over its fp32 one, as the world-w actor rows measured them (0 where either is missing). */
function bf16PeakRatio(rows: BenchRow[], w: number, sfx: string): number {
  const f = rows.find((x) => x.case === `actor-w${w}${sfx}`)?.peak_gflops,
    b = rows.find((x) => x.case === `actor-w${w}-bf16${sfx}`)?.peak_gflops;
  return typeof f === "number" && typeof b === "number" && f > 0 ? b / f : 0;
}

/** Every ratio the run can give, in the report's order: a new one is a row here. */
function ratioTable(rows: BenchRow[], o: Options): RatioSpec[] {
  const ge = (v: number) => ({ op: ">=", v }) as const,
    le = (v: number) => ({ op: "<=", v }) as const;
  const worlds = o.worlds.filter((w) => w > 1),
    wMax = Math.max(...o.worlds);
  // PyTorch's best in fp32 (its autocast bf16 rows are set against the trainer's bf16 rows below)
  const torchRows = rows.filter(
    (x) =>
      String(x.case).startsWith("torch-") && !String(x.case).includes("autocast") && typeof x.tok_per_s === "number",
  );
  const torchBest = torchRows.length
    ? torchRows.reduce((a, b) => (Number(b.tok_per_s) > Number(a.tok_per_s) ? b : a))
    : null;
  const t: RatioSpec[] = [];
  for (const w of worlds)
    t.push({
      name: `world${w}/world1 tok/s`,
      numerator: `actor-w${w}`,
      denominator: "actor-w1",
      target: w === 2 ? ge(1.85) : null,
    });
  // the targets against PyTorch on the same machine, same shape, same run
  if (torchBest)
    t.push({
      name: "world2_over_torch_best",
      numerator: "actor-w2",
      denominator: String(torchBest.case),
      denominatorNote: `(PyTorch's best of ${torchRows.map((x) => x.case).join(", ")})`,
      target: ge(2),
    });
  t.push({ name: "world1_over_torch_1thread", numerator: "actor-w1", denominator: "torch-1thread", target: ge(1) });
  for (const w of o.worlds)
    t.push({
      name: `world ${w}: built-in GEMM / OpenBLAS tok/s`,
      numerator: `actor-w${w}`,
      denominator: `actor-w${w}-openblas`,
      target: w === 2 ? ge(1.6) : null,
    });
  for (const sfx of o.seqs.length > 1 ? o.seqs.map((q) => `@${q}`) : [""])
    for (const w of o.worlds) {
      t.push({
        name: `world ${w}${sfx}: bf16 / fp32 products tok/s (built-in GEMM, P8)`,
        numerator: `actor-w${w}-bf16${sfx}`,
        denominator: `actor-w${w}${sfx}`,
        // 1.6 where this run's bf16 peak is at least 1.8x its FMA peak (AMD Zen 4, Zen 5); else at least fp32's
        target: w === 2 ? ge(bf16PeakRatio(rows, w, sfx) >= 1.8 ? 1.6 : 1) : null,
      });
      // a forced fp32 kernel (--isas): bf16 on its emulation, at least 0.85 of its fp32 (issue 61)
      for (const isa of o.isas.filter((x) => x === "avx2" || x === "avx512"))
        t.push({
          name: `world ${w}${sfx} --isa ${isa}: bf16 (emulated) / fp32 products tok/s (P8)`,
          numerator: `actor-w${w}-${isa}-bf16${sfx}`,
          denominator: `actor-w${w}-${isa}${sfx}`,
          target: w === 2 ? ge(0.85) : null,
        });
      for (const prec of ["", "-bf16"])
        for (const d of [`torch-${cores}threads${sfx}`, `torch-${cores}threads-autocast-bf16${sfx}`])
          t.push({
            name: `world ${w}${prec}${sfx} / ${d} tok/s`,
            numerator: `actor-w${w}${prec}${sfx}`,
            denominator: d,
            target: null,
          });
    }
  for (const w of worlds)
    t.push({
      name: `world${w}/world1 tok per CPU-second (parallel efficiency, load-insensitive)`,
      numerator: `actor-w${w}`,
      denominator: "actor-w1",
      target: null,
      field: "tok_per_cpu_s",
      note: "1.0 = world 2 spends no more CPU per token than world 1",
    });
  t.push(
    {
      name: "mpi: 2 processes x world 1 / one process x world 2, tok/s",
      numerator: "mpi-np2-w1",
      denominator: "mpi-ref-w2",
      target: ge(0.9),
    },
    {
      name: "actor/single-thread tok/s (world 1, same work)",
      numerator: "actor-w1",
      denominator: "single-thread",
      target: null,
    },
  );
  if (wMax > 1)
    t.push({
      name: `actor world ${wMax}/single-thread tok/s (speed-up)`,
      numerator: `actor-w${wMax}`,
      denominator: "single-thread",
      target: null,
    });
  t.push({
    name: "actor/framework-free tok/s (world 1, same work)",
    numerator: "actor-w1",
    denominator: "framework-free",
    target: ge(0.95),
  });
  if (wMax > 1)
    t.push({
      name: `actor world ${wMax}/framework-free tok/s (speed-up)`,
      numerator: `actor-w${wMax}`,
      denominator: "framework-free",
      target: null,
    });
  t.push({
    name: "single-thread (in-process)/framework-free (subprocess) tok/s",
    numerator: "single-thread",
    denominator: "framework-free",
    target: null,
    note: "same loop, two processes: a consistency check",
  });
  for (const w of o.uploadWorlds) {
    t.push({
      name: `upload stall world ${w} (step ms overlapping an upload / not)`,
      numerator: `upload-w${w}-overlap`,
      denominator: `upload-w${w}-quiet`,
      target: w === 2 ? le(1.05) : null,
      field: "step_ms_median",
      note: w === 2 ? "B3" : "control: a core is free for the uploader",
    });
    if (o.uploadNice)
      t.push({
        name: `upload stall world ${w}, uploader niced (experiment)`,
        numerator: `upload-w${w}-nice-overlap`,
        denominator: `upload-w${w}-nice-quiet`,
        target: null,
        field: "step_ms_median",
        note: "uploader thread at nice 19",
      });
  }
  for (const p of o.optimSizes)
    t.push({
      name: `optim ${(p / 1e6).toFixed(0)}M: 1 thread / ${o.optimThreads} threads step ms (speed-up)`,
      numerator: "optim-1thread",
      denominator: `optim-${o.optimThreads}threads`,
      target: null,
      field: "step_ms_median",
      params: p,
    });
  t.push(
    {
      name: "single-thread/torch 1 thread tok/s",
      numerator: "single-thread",
      denominator: "torch-1thread",
      target: null,
    },
    {
      name: "frozen-step (fwd+bwd)/torch 1 thread (fwd+bwd+clip+AdamW) tok/s",
      numerator: "frozen-step",
      denominator: "torch-1thread",
      target: null,
      note: "same shape only with --model frozen",
    },
  );
  if (cores > 1)
    t.push({
      name: `actor world ${wMax}/torch ${cores} threads tok/s`,
      numerator: `actor-w${wMax}`,
      denominator: `torch-${cores}threads`,
      target: null,
    });
  return t;
}

/** The figures that are one row's own ratio, against a target: each row's MFU, each GEMM kernel's worst fraction of
 *  its FMA peak. */
function rowFigures(rows: BenchRow[]): Ratio[] {
  const out: Ratio[] = [];
  // world 2's MFU against the two cores' limit for the instructions its products ran on (fp32: FMA; bf16: VDPBF16PS
  // or AMX), each peak probed in the same run
  // (--isas: the forced kernels' rows too; fp32 on AVX2 at 0.80 or more, issue 61)
  for (const x of rows)
    if (/^actor-w2(-avx2|-avx512)?(-bf16)?$/.test(String(x.case)) && typeof x.mfu_of_peak === "number") {
      const want = x.case === "actor-w2-avx2" ? 0.8 : 0.7;
      out.push({
        ratio: `mfu_of_peak ${x.case} (per rank, against one core's ${String(x.peak_isa)} peak)`,
        value: x.mfu_of_peak,
        target: `>= ${want}`,
        met: x.mfu_of_peak >= want,
        num: `${x.case} tok_per_s`,
        den: `${String(x.peak_isa)} peak GFLOP/s`,
      });
    }
  for (const x of rows)
    if (typeof x.mfu === "number")
      out.push({
        ratio: `mfu ${x.case} (model FLOPs x tok/s per rank / matMul rate)`,
        value: x.mfu,
        target: x.case === "actor-w1" ? ">= 0.6" : null,
        met: x.case === "actor-w1" ? x.mfu >= 0.6 : null,
        num: `${x.case} tok_per_s`,
        den: "frozen-step matmul_gflops",
      });
  // bf16 on VDPBF16PS: every linear product at seq 1024 at 0.80 or more of its own peak
  const dp = rows.find((x) => x.case === "gemm-builtin-avx512bf16");
  if (dp && typeof dp.min_linear_1024_of_peak === "number")
    out.push({
      ratio: "gemm builtin-avx512bf16: lowest fraction of the VDPBF16PS peak over the linear products at seq 1024",
      value: dp.min_linear_1024_of_peak,
      target: ">= 0.8",
      met: dp.min_linear_1024_of_peak >= 0.8,
      num: "gemm builtin-avx512bf16 GFLOP/s (worst linear shape)",
      den: "fma-peak-avx512bf16 GFLOP/s",
    });
  // the AVX2 kernel in fp32 and its bf16 emulation: every linear product at seq 1024 at 0.80 or more of the AVX2
  // peak (issue 61)
  for (const k of ["builtin-avx2", "builtin-avx2-bf16"]) {
    const g = rows.find((x) => x.case === `gemm-${k}`);
    if (g && typeof g.min_linear_1024_of_peak === "number")
      out.push({
        ratio: `gemm ${k}: lowest fraction of the AVX2 FMA peak over the linear products at seq 1024`,
        value: g.min_linear_1024_of_peak,
        target: ">= 0.8",
        met: g.min_linear_1024_of_peak >= 0.8,
        num: `gemm ${k} GFLOP/s (worst linear shape)`,
        den: "fma-peak-avx2 GFLOP/s",
      });
  }
  for (const k of ["builtin-avx512", "builtin-avx2"]) {
    const g = rows.find((x) => x.case === `gemm-${k}`);
    if (g && typeof g.min_of_peak === "number")
      out.push({
        ratio: `gemm ${k}: lowest fraction of its FMA peak over the model's shapes`,
        value: g.min_of_peak,
        target: ">= 0.85",
        met: g.min_of_peak >= 0.85,
        num: `gemm ${k} GFLOP/s (worst shape)`,
        den: `fma-peak-${k.split("-")[1]} GFLOP/s`,
      });
  }
  return out;
}

/** The ratios of this run (each printed as it is found): the rows' own figures, then ratioTable's. */
export function computeRatios(rows: BenchRow[], o: Options): Ratio[] {
  const ratios = [...rowFigures(rows)];
  for (const s of ratioTable(rows, o)) {
    const x = ratio(rows, s);
    if (x) ratios.push(x);
  }
  for (const x of ratios) emit(x);
  return ratios;
}
