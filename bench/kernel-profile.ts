/**
 * Bench-only timing proxy over a Kernels object: every call is timed on this process's CPU time (cpuMs:
 * process.cpuUsage, so a busy machine's waits do not land on whichever kernel was running) and added to a row per
 * kernel (matmul: per transpose pair and shape), so one training step (timed on the same clock) gives each kernel's
 * share of the step. The proxy costs two clock reads per call (~1 us; a step makes a few thousand calls), and the
 * profiled call is run apart from the timed ones. With the native engine's timed copy of the fused attention
 * (profiledAttention: the same bits), its work between the block products is timed inside the kernel too (on the wall clock: a CPU-time clock read costs a
 * system call, and there are ~100,000 such regions a step), and product_ms is the call's time less that; so the step
 * splits into the matrix products (the model's and attention's) and everything else: profileSummary. On a busy
 * machine the wall-clock part reads long, so the split errs towards the non-product side.
 */
import type { ProfiledAttention } from "./native-probes";
import type { Kernels } from "../src/model/kernels";

export interface KernelRow {
  kernel: string;
  calls: number;
  ms: number;
  gflop: number | null;
  gflops: number | null;
  share: number;
  /** the fused attention kernels only: the ms of their block products (the call's time less the rest, which the
   *  native engine's timed copy measures) */
  product_ms?: number;
}

/** One profiled step split into the matrix products and the rest (ms, and share of the step). */
export interface ProfileSummary {
  step_ms: number;
  /** the model's products (kernels.matmul) */
  matmul_ms: number;
  /** the fused attention's block products (null: the engine cannot time them apart) */
  attention_product_ms: number | null;
  /** everything but the matrix products: the step less the two above */
  non_product_ms: number;
  non_product_share: number;
  /** the non-product part by kernel family; "outside" is JS, copies and allocation between the kernels */
  parts: {
    swiglu: number;
    rmsnorm: number;
    rope: number;
    cross_entropy: number;
    embedding: number;
    attention_non_product: number;
    other_kernels: number;
    outside: number;
  };
}

type AnyFn = (...a: unknown[]) => unknown;

/** This process's CPU time so far, in ms (user + system): the profile's clock. */
export function cpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

export function profiledKernels(
  k: Kernels,
  attention: ProfiledAttention | null = null,
): {
  kernels: Kernels;
  rows: (stepMs: number) => KernelRow[];
  reset: () => void;
} {
  const acc = new Map<string, { calls: number; ms: number; flop: number; prod: number }>();
  const add = (key: string, ms: number, flop: number, prod = 0) => {
    const a = acc.get(key) ?? { calls: 0, ms: 0, flop: 0, prod: 0 };
    a.calls++;
    a.ms += ms;
    a.flop += flop;
    a.prod += prod;
    acc.set(key, a);
  };
  const wrapped: Record<string, unknown> = { name: `${k.name} (profiled)` };
  for (const key of Object.keys(k) as (keyof Kernels)[]) {
    const f = k[key];
    if (typeof f !== "function" || key === "dispose") continue;
    if (key === "matmul") {
      wrapped.matmul = (
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
      ) => {
        const t0 = cpuMs();
        k.matmul(tA, tB, M, N, K, alpha, A, B, beta, C);
        add(
          `matmul ${tA ? "T" : "N"}${tB ? "T" : "N"} ${M}x${N}x${K}${beta !== 0 ? " +=" : ""}`,
          cpuMs() - t0,
          2 * M * N * K,
        );
      };
    } else if (attention && (key === "attentionForward" || key === "attentionBackward")) {
      const timed = (key === "attentionForward" ? attention.forward : attention.backward) as AnyFn;
      wrapped[key] = (...a: unknown[]) => {
        attention.restMs();
        const t0 = cpuMs();
        const r = timed(...a);
        const ms = cpuMs() - t0;
        add(key, ms, 0, Math.max(0, ms - attention.restMs()));
        return r;
      };
    } else {
      wrapped[key] = (...a: unknown[]) => {
        const t0 = cpuMs();
        const r = (f as AnyFn).apply(k, a);
        add(key, cpuMs() - t0, 0);
        return r;
      };
    }
  }
  wrapped.dispose = () => k.dispose();
  return {
    kernels: wrapped as unknown as Kernels,
    reset: () => acc.clear(),
    rows: (stepMs: number) => {
      const out: KernelRow[] = [];
      for (const [kernel, a] of acc) {
        out.push({
          kernel,
          calls: a.calls,
          ms: +a.ms.toFixed(2),
          gflop: a.flop ? +(a.flop / 1e9).toFixed(3) : null,
          gflops: a.flop ? +(a.flop / (a.ms / 1000) / 1e9).toFixed(1) : null,
          share: +(a.ms / stepMs).toFixed(4),
          ...(attention && kernel.startsWith("attention") ? { product_ms: +a.prod.toFixed(2) } : {}),
        });
      }
      const inKernels = out.reduce((s, r) => s + r.ms, 0);
      out.sort((a, b) => b.ms - a.ms);
      out.push({
        kernel: OUTSIDE,
        calls: 0,
        ms: +(stepMs - inKernels).toFixed(2),
        gflop: null,
        gflops: null,
        share: +((stepMs - inKernels) / stepMs).toFixed(4),
      });
      return out;
    },
  };
}

const OUTSIDE = "(outside the kernels: JS, copies, allocation)";

/** The step split into the matrix products and everything else, from profiledKernels' rows. */
export function profileSummary(rows: KernelRow[], stepMs: number): ProfileSummary {
  const ms = (pick: (r: KernelRow) => boolean) => rows.filter(pick).reduce((s, r) => s + r.ms, 0);
  const att = rows.filter((r) => r.kernel === "attentionForward" || r.kernel === "attentionBackward");
  const timed = att.length > 0 && att.every((r) => r.product_ms !== undefined);
  const attProd = timed ? att.reduce((s, r) => s + (r.product_ms ?? 0), 0) : null;
  const attMs = att.reduce((s, r) => s + r.ms, 0);
  const matmul = ms((r) => r.kernel.startsWith("matmul"));
  const named = (re: RegExp) => ms((r) => re.test(r.kernel));
  const parts = {
    swiglu: named(/^swiglu/),
    rmsnorm: named(/^rmsnorm/),
    rope: named(/^rope/),
    cross_entropy: named(/^crossEntropy/),
    embedding: named(/^embedding/),
    attention_non_product: attMs - (attProd ?? 0),
    other_kernels: 0,
    outside: ms((r) => r.kernel === OUTSIDE),
  };
  const nonProduct = stepMs - matmul - (attProd ?? 0);
  const listed = Object.values(parts).reduce((s, x) => s + x, 0);
  parts.other_kernels = Math.abs(nonProduct - listed) < 0.005 ? 0 : nonProduct - listed; // not float dust
  const r2 = (x: number) => +x.toFixed(2);
  return {
    step_ms: r2(stepMs),
    matmul_ms: r2(matmul),
    attention_product_ms: attProd === null ? null : r2(attProd),
    non_product_ms: r2(nonProduct),
    non_product_share: +(nonProduct / stepMs).toFixed(4),
    parts: Object.fromEntries(Object.entries(parts).map(([k, v]) => [k, r2(v)])) as ProfileSummary["parts"],
  };
}

export function kernelTableMarkdown(title: string, rows: KernelRow[], stepMs: number): string {
  const lines = [
    `# ${title}`,
    "",
    `One profiled training step (forward + backward): ${stepMs.toFixed(1)} ms of CPU time. Each kernel's calls, CPU time, and share of the step.`,
    "",
    "| kernel | calls | ms | share | GFLOP | GFLOP/s |",
    "|---|---|---|---|---|---|",
  ];
  for (const r of rows)
    lines.push(
      `| ${r.kernel} | ${r.calls} | ${r.ms.toFixed(1)} | ${(100 * r.share).toFixed(1)}% | ${r.gflop ?? ""} | ${r.gflops ?? ""} |`,
    );
  // grouped: all matmuls vs each other kernel
  const mm = rows.filter((r) => r.kernel.startsWith("matmul"));
  const mmMs = mm.reduce((s, r) => s + r.ms, 0),
    mmFlop = mm.reduce((s, r) => s + (r.gflop ?? 0), 0);
  lines.push(
    "",
    `All matrix products: ${mmMs.toFixed(1)} ms (${((100 * mmMs) / stepMs).toFixed(1)}% of the step), ${mmFlop.toFixed(1)} GFLOP at ${(mmFlop / (mmMs / 1000)).toFixed(1)} GFLOP/s.`,
    "",
  );
  const sm = profileSummary(rows, stepMs);
  const pct = (x: number) => `${((100 * x) / stepMs).toFixed(1)}%`;
  lines.push(
    `**Everything but the matrix products: ${sm.non_product_ms.toFixed(1)} ms, ${pct(sm.non_product_ms)} of the step** ` +
      (sm.attention_product_ms === null
        ? "(the attention kernels counted whole: this engine cannot time their block products apart)."
        : `(the step less the model's products, ${sm.matmul_ms.toFixed(1)} ms, and the fused attention's block products, ${sm.attention_product_ms.toFixed(1)} ms).`),
    "",
    "| part | ms | share |",
    "|---|---|---|",
    ...Object.entries(sm.parts).map(([k, v]) => `| ${k.replace(/_/g, " ")} | ${v.toFixed(1)} | ${pct(v)} |`),
    "",
  );
  return lines.join("\n");
}
