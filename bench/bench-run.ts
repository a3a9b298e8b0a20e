/**
 * One bench run's record (bench/bench.ts): its rows, notes and failed cases, and the two outputs every case writes
 * to: progress lines on stderr (log) and BENCH_JSON lines on stdout (emit).
 */
import type { BenchRow } from "./steps";
import type { GemmRow } from "./gemm-shapes";
import type { KernelRow } from "./kernel-profile";

export function log(s: string): void {
  process.stderr.write(`${s}\n`);
}

export function emit(x: object): void {
  process.stdout.write(`BENCH_JSON ${JSON.stringify(x)}\n`);
}

/** One bench run's results so far: the rows, the notes, the failed cases, the frozen step's kernel profile. */
export class BenchRun {
  readonly rows: BenchRow[] = [];
  gemm: { rows: GemmRow[]; peaks: Record<string, number> } | null = null;
  readonly notes: string[] = [];
  failed = 0;
  /** the frozen-step case's profiled step, one per precision */
  profiled: { rows: KernelRow[]; stepMs: number; engine: string; precision: string }[] = [];

  /** Appended to every case name recorded while set ("@1024" with --seqs), so rows of two shapes stay apart. */
  suffix = "";

  record(row: BenchRow): void {
    if (this.suffix) row.case = `${row.case}${this.suffix}`;
    this.rows.push(row);
    emit(row);
  }

  /** Runs one case; a failure is counted, noted and printed as BENCH_ERROR, and the other cases go on. */
  async guard(what: string, f: () => Promise<void>): Promise<void> {
    try {
      await f();
    } catch (e) {
      this.failed++;
      const msg = `${what} failed: ${(e as Error).message ?? String(e)}`;
      this.notes.push(msg);
      log(`!! ${msg}`);
      process.stdout.write(`BENCH_ERROR ${JSON.stringify({ case: what, error: (e as Error).message ?? String(e) })}\n`);
    }
  }
}
