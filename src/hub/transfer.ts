/**
 * A Hub transfer's progress (an upload's or a download's): bytes done of a known total, and a line (share, MB/s,
 * ETA) at the progress rhythm (progress.ts) while it runs.
 */
import { fmtDuration } from "../duration";
import { etaOf, ProgressRhythm } from "../progress";

export class TransferProgress {
  private done = 0;
  private readonly t0 = performance.now();
  private readonly stopLines: (() => void) | null = null;
  constructor(
    private readonly what: string,
    private readonly total: number,
    log?: (line: string) => void,
  ) {
    if (log) this.stopLines = new ProgressRhythm(undefined, this.t0).every(() => log(this.line()));
  }
  add(n: number): void {
    this.done = Math.min(this.total, this.done + n);
  }
  private line(): string {
    const secs = (performance.now() - this.t0) / 1000;
    const rate = this.done / Math.max(1e-9, secs);
    const eta = etaOf(this.total - this.done, rate);
    const mb = (b: number) => (b / 1e6).toFixed(1);
    return `hub: ${this.what}: ${mb(this.done)}/${mb(this.total)} MB (${Math.floor((100 * this.done) / Math.max(1, this.total))}%), ${(rate / 1e6).toFixed(2)} MB/s, ${fmtDuration(secs)} so far, ETA ${eta}`;
  }
  stop(): void {
    this.stopLines?.();
  }
}
