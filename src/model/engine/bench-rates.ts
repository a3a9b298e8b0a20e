/**
 * The bench's figures that a run quotes at start (run.ts: bf16Warning), each with the bench file and command it
 * came from; nothing is timed in the trainer. Update a figure and its file together when the bench measures again.
 *
 * VDPBF16PS's rate over the fp32 FMA's on one core, per CPU, as the bench measured it: what a `--precision bf16` run
 * on the VDPBF16PS kernel is told to expect at start. A row
 * comes from the bench's gemm case run on that CPU (`node dist/bench/bench.js --cases gemm`): its rows
 * fma-peak-avx512bf16 over fma-peak-avx512, both register-only loops of one core.
 */
import * as fs from "node:fs";

export interface Vdpbf16Rate {
  /** how the start line names the CPU */
  cpu: string;
  /** /proc/cpuinfo's vendor_id and cpu family of the machine measured */
  vendor: string;
  family: number;
  /** the VDPBF16PS peak over the FMA's */
  ratio: number;
}

export const VDPBF16PS_RATES: readonly Vdpbf16Rate[] = [
  // bench/results/latest.json (2026-12-05, a 2-core AMD EPYC, family 25 model 17: Zen 4, as README names it), from `node dist/bench/bench.js
  // --model frozen --seq 1024 --micro-batch 4 --accum 1 --steps 3 --warmup 1 --worlds 2 --precisions fp32,bf16
  // --cases actor,torch,frozen-step,optim,attention,gemm --optim-sizes 106M --gemm-rounds 3 --gemm-seqs 1024
  // --torch-threads 2 --attention-base /tmp/base-2babbe7 --out bench/results`: fma-peak-avx512bf16 236.4 GFLOP/s,
  // fma-peak-avx512 118.2
  { cpu: "AMD Zen 4 (family 25)", vendor: "AuthenticAMD", family: 25, ratio: 236.4 / 118.2 },
  // bench/results/avx2/latest.json (2026-12-07, a 2-core AMD EPYC, family 26 model 2: Zen 5), from the command in
  // BF16_EMULATION_SPEED's note: fma-peak-avx512bf16 576.0 GFLOP/s, fma-peak-avx512 287.6
  { cpu: "AMD Zen 5 (family 26)", vendor: "AuthenticAMD", family: 26, ratio: 576.0 / 287.6 },
];

/** The CPU's vendor and family from /proc/cpuinfo's text (its first processor); null where it has neither. */
export function cpuFamily(cpuinfo?: string): { vendor: string; family: number } | null {
  let text = cpuinfo;
  if (text === undefined) {
    try {
      text = fs.readFileSync("/proc/cpuinfo", "utf8");
    } catch {
      return null; // not Linux
    }
  }
  const vendor = /^vendor_id\s*:\s*(\S+)/m.exec(text)?.[1];
  const family = Number(/^cpu family\s*:\s*(\d+)/m.exec(text)?.[1]);
  return vendor && Number.isInteger(family) ? { vendor, family } : null;
}

/** The bench's figure for this CPU, or null where the table has none. */
export function vdpbf16Rate(id = cpuFamily()): Vdpbf16Rate | null {
  return VDPBF16PS_RATES.find((r) => id !== null && r.vendor === id.vendor && r.family === id.family) ?? null;
}

/**
 * P8: the bf16 emulation's speed against fp32 (tokens per second, bf16 / fp32), the one figure the start line quotes:
 * the lower of the two "world 2 --isa avx2 / avx512: bf16 (emulated) / fp32 products tok/s" ratios (0.944 on the
 * AVX2 emulation, 0.926 on the AVX-512 one) in bench/results/avx2/latest.json, from `node dist/bench/bench.js
 * --model frozen --seq 1024 --micro-batch 4 --accum 1 --steps 5 --warmup 1 --worlds 2 --precisions fp32,bf16
 * --isas avx2,avx512 --cases torch,actor,gemm --torch-threads 2 --sequential --gemm-seqs 1024 --gemm-rounds 3
 * --out bench/results/avx2` on a 2-core AMD Zen 5 (family 26 model 2), each kernel forced by --isa, the runtimes
 * 1.96-1.97 cores busy. Update it, and that file, when the bench measures the emulation again.
 */
export const BF16_EMULATION_SPEED = 0.93;
