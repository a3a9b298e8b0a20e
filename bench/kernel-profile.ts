/**
 * Bench-only timing proxy over a Kernels object: every call is timed with performance.now() and added
 * to a row per kernel (matmul: per transpose pair and shape), so one training step gives each kernel's share of
 * the step. The proxy costs two clock reads per call (~0.1 us; a step makes a few thousand calls), and the
 * profiled call is run apart from the timed ones.
 */
import type { Kernels } from "../src/model/kernels";

export interface KernelRow {
  kernel: string;
  calls: number;
  ms: number;
  gflop: number | null;
  gflops: number | null;
  share: number;
}

type AnyFn = (...a: unknown[]) => unknown;

export function profiledKernels(k: Kernels): {
  kernels: Kernels;
  rows: (stepMs: number) => KernelRow[];
  reset: () => void;
} {
  const acc = new Map<string, { calls: number; ms: number; flop: number }>();
  const add = (key: string, ms: number, flop: number) => {
    const a = acc.get(key) ?? { calls: 0, ms: 0, flop: 0 };
    a.calls++;
    a.ms += ms;
    a.flop += flop;
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
        const t0 = performance.now();
        k.matmul(tA, tB, M, N, K, alpha, A, B, beta, C);
        add(
          `matmul ${tA ? "T" : "N"}${tB ? "T" : "N"} ${M}x${N}x${K}${beta !== 0 ? " +=" : ""}`,
          performance.now() - t0,
          2 * M * N * K,
        );
      };
    } else {
      wrapped[key] = (...a: unknown[]) => {
        const t0 = performance.now();
        const r = (f as AnyFn).apply(k, a);
        add(key, performance.now() - t0, 0);
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
        });
      }
      const inKernels = out.reduce((s, r) => s + r.ms, 0);
      out.sort((a, b) => b.ms - a.ms);
      out.push({
        kernel: "(outside the kernels: JS, copies, allocation)",
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

export function kernelTableMarkdown(title: string, rows: KernelRow[], stepMs: number): string {
  const lines = [
    `# ${title}`,
    "",
    `One profiled training step (forward + backward): ${stepMs.toFixed(1)} ms. Each kernel's calls, time, and share of the step.`,
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
  return lines.join("\n");
}
