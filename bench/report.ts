/** The markdown table of one bench run (bench/results/latest.md). */
import type { BenchRow } from "./steps";

export interface Ratio {
  ratio: string;
  value: number | null;
  target: string | null;
  met: boolean | null;
  num: string;
  den: string;
  value_best_steps?: number | null;
  note?: string;
}

export interface Machine {
  cpu: string;
  /** /proc/cpuinfo's vendor, family and model, and the ISA flags that pick kernels (the model name alone does not name a generation) */
  cpu_id?: { vendor: string; family: number; model: number; flags: string[] };
  cores: number;
  available_parallelism: number;
  total_mem_gb: number;
  node: string;
  platform: string;
  date: string;
  load_avg_1m_start: number;
  /** cores a spin probe of availableParallelism threads actually got, at the start and at the end of the run */
  cores_available_start?: number;
  cores_available_end?: number;
}

const fmt = (v: unknown): string =>
  v === null || v === undefined
    ? "–"
    : typeof v === "number"
      ? Number.isInteger(v)
        ? v.toLocaleString("en-US")
        : String(v)
      : String(v);

export function markdown(o: {
  machine: Machine;
  shape: Record<string, unknown>;
  rows: BenchRow[];
  ratios: Ratio[];
  notes: string[];
  wallS: number;
  command: string;
}): string {
  const L: string[] = [];
  const m = o.machine;
  L.push(`# Bench: actor vs single-thread step cost`, "");
  L.push(`Run ${m.date} · \`${o.command}\` · ${o.wallS.toFixed(0)} s wall`, "");
  L.push(`| machine | |`, `|---|---|`);
  const id = m.cpu_id
    ? ` (${m.cpu_id.vendor}, family ${m.cpu_id.family} model ${m.cpu_id.model}; ${m.cpu_id.flags.join(", ")})`
    : "";
  L.push(
    `| CPU | ${m.cpu}${id} |`,
    `| cores (os.cpus / availableParallelism) | ${m.cores} / ${m.available_parallelism} |`,
  );
  L.push(
    `| memory | ${m.total_mem_gb} GB |`,
    `| node | ${m.node} (${m.platform}) |`,
    `| load average at start (1 min) | ${m.load_avg_1m_start} |`,
    `| cores a ${m.available_parallelism}-thread spin probe got (start / end) | ${fmt(m.cores_available_start)} / ${fmt(m.cores_available_end)} |`,
    "",
  );
  L.push(`| shape | |`, `|---|---|`);
  for (const [k, v] of Object.entries(o.shape)) L.push(`| ${k} | ${fmt(v)} |`);
  L.push("");
  const isGemm = (x: BenchRow) => String(x.case).startsWith("fma-peak-") || String(x.case).startsWith("gemm-");
  const isAttention = (x: BenchRow) => String(x.case).startsWith("attention-");
  const isWebgpuAttention = (x: BenchRow) => String(x.case).startsWith("webgpu-attention-");
  const steps = o.rows.filter(
    (x) => !String(x.case).startsWith("optim-") && !isGemm(x) && !isAttention(x) && !isWebgpuAttention(x),
  );
  if (steps.length) {
    L.push(`## Step cost (median of timed steps after warm-up)`, "");
    L.push(
      `| case | backend | world | params | seq | micro | accum | tok/step | step ms (median) | p25–p75 | tok/s | compute / reduce / update / overhead ms | cores busy | tok/CPU-s | n |`,
    );
    L.push(`|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|`);
    for (const x of steps) {
      const q = x.step_ms_p25 !== undefined ? `${fmt(x.step_ms_p25)}–${fmt(x.step_ms_p75)}` : "–";
      const parts =
        x.compute_ms_median !== undefined
          ? `${fmt(x.compute_ms_median)} / ${fmt(x.reduce_ms_median)} / ${fmt(x.update_ms_median)} / ${fmt(x.overhead_ms_median)}`
          : "–";
      L.push(
        `| ${x.case} | ${x.backend} | ${fmt(x.world)} | ${fmt(x.params)} | ${fmt(x.seq_len)} | ${fmt(x.micro_batch)} | ${fmt(x.accum)} | ${fmt(x.tokens_per_step)} | ${fmt(x.step_ms_median)} | ${q} | ${fmt(x.tok_per_s)} | ${parts} | ${fmt(x.cpu_util_median)} | ${fmt(x.tok_per_cpu_s)} | ${fmt(x.steps_timed)} |`,
      );
    }
    L.push("");
  }
  const opt = o.rows.filter((x) => String(x.case).startsWith("optim-"));
  if (opt.length) {
    L.push(
      `## The optimizer's passes against the memory bandwidth (${fmt(opt[0].world)} slots; the trainer's own functions)`,
      "",
    );
    L.push(
      "Bytes per element: fold 24 (the first micro-batch's 16), reduce 8 per slot + 4, AdamW 28; the probe is the best of float64 triads in JS and C (24), an in-place axpy in C (24) and a copy (16), by the same threads in the same rounds. Each cell: GB/s (fraction of the probe).",
      "",
    );
    L.push(`| case | params | threads | probe GB/s | fold | first fold | reduce | AdamW | n |`);
    L.push(`|---|---|---|---|---|---|---|---|---|`);
    const cell = (x: BenchRow, k: string) => `${fmt(x[`${k}_gb_per_s`])} (${fmt(x[`${k}_of_bw`])})`;
    for (const x of opt) {
      L.push(
        `| ${x.case} | ${fmt(x.params)} | ${fmt(x.threads)} | ${fmt(x.bw_probe_gb_per_s)} | ${cell(x, "fold")} | ${cell(x, "fold_first")} | ${cell(x, "reduce")} | ${cell(x, "update")} | ${fmt(x.steps_timed)} |`,
      );
    }
    L.push("");
  }
  const gemm = o.rows.filter(isGemm);
  if (gemm.length) {
    L.push(`## Built-in GEMM against the core's FMA peak (the gemm case; per shape: gemm-shapes.md)`, "");
    L.push(
      `| case | GFLOP/s (peak probe) | lowest / median fraction of peak over the model's shapes | shapes |`,
      `|---|---|---|---|`,
    );
    for (const x of gemm)
      L.push(
        `| ${x.case} | ${fmt(x.gflops)} | ${x.min_of_peak === undefined ? "–" : `${fmt(x.min_of_peak)} / ${fmt(x.median_of_peak)}`} | ${fmt(x.shapes)} |`,
      );
    L.push("");
  }
  const att = o.rows.filter(isAttention);
  if (att.length) {
    L.push(`## Attention: the fused kernel (the attention case, one sequence)`, "");
    L.push(`| case | fused fwd / bwd ms | kept for the backward, MB |`, `|---|---|---|`);
    for (const x of att)
      L.push(`| ${x.case} | ${fmt(x.fused_fwd_ms)} / ${fmt(x.fused_bwd_ms)} | ${fmt(x.fused_saved_mb)} |`);
    L.push("");
    const based = att.filter((x) => x.base_rev !== undefined);
    if (based.length) {
      L.push(
        `The fused kernel against an older revision's own build, loaded beside this one (\`--attention-base\`; checkpointed step: the base's forward twice):`,
        "",
        `| case | base | base fwd / bwd ms | fused fwd / bwd ms | fwd+bwd speedup | checkpointed-step speedup | kept for the backward, MB (base / fused) |`,
        `|---|---|---|---|---|---|---|`,
      );
      for (const x of based)
        L.push(
          `| ${x.case} | ${x.base_rev} | ${fmt(x.base_fwd_ms)} / ${fmt(x.base_bwd_ms)} | ${fmt(x.fused_fwd_ms)} / ${fmt(x.fused_bwd_ms)} | ${fmt(x.speedup_vs_base_fwd_bwd)} | ${fmt(x.speedup_vs_base_ckpt_step)} | ${fmt(x.base_saved_mb)} / ${fmt(x.fused_saved_mb)} |`,
        );
      L.push("");
    }
  }
  const wa = o.rows.filter(isWebgpuAttention);
  if (wa.length) {
    L.push(`## Attention on the webgpu engine (the webgpu-attention case, one sequence; best call of every round)`, "");
    L.push(
      `| case | heads | fwd / bwd ms | base | base fwd / bwd ms | fwd+bwd speedup | outputs vs base (rel) |`,
      `|---|---|---|---|---|---|---|`,
    );
    for (const x of wa)
      L.push(
        `| ${x.case} | ${x.heads} | ${fmt(x.fwd_ms)} / ${fmt(x.bwd_ms)} | ${x.base_rev ?? "–"} | ${x.base_rev === undefined ? "–" : `${fmt(x.base_fwd_ms)} / ${fmt(x.base_bwd_ms)}`} | ${fmt(x.speedup_vs_base_fwd_bwd)} | ${fmt(x.base_max_rel_diff)} |`,
      );
    L.push("", `Adapter: ${wa[0].adapter}`, "");
  }
  if (o.ratios.length) {
    L.push(`## Ratios (computed within this run)`, "");
    L.push(
      `"from fastest steps" = the same ratio from each case's fastest timed step (an upper bound when the machine is shared).`,
      "",
    );
    L.push(
      `| ratio | value (medians) | from fastest steps | target | met | numerator / denominator |`,
      `|---|---|---|---|---|---|`,
    );
    for (const x of o.ratios) {
      L.push(
        `| ${x.ratio} | ${fmt(x.value)} | ${fmt(x.value_best_steps)} | ${x.target ?? "–"} | ${x.met === null ? "–" : x.met ? "yes" : "**no**"} | ${x.num} / ${x.den}${x.note ? ` (${x.note})` : ""} |`,
      );
    }
    L.push("");
  }
  if (o.notes.length) {
    L.push(`## Notes`, "");
    for (const n of o.notes) L.push(`- ${n}`);
    L.push("");
  }
  return L.join("\n");
}
