/**
 * The one rhythm of every progress report written as lines (B5): the training's `progress:` line to a file or a
 * pipe, prepare's lines, the Hub transfers', the demo tokenizer's, the shard hashing's and validation's
 * heartbeat. The first line once the work has run FIRST_LINE_SECONDS (5 s), then one every
 * TSTRAIN_PROGRESS_SECONDS (default 30), each wait cut to TSTRAIN_PROGRESS_SECONDS when that is shorter (0: a line
 * at every chance); nothing for quicker work. A reporter may add a closing line (prepare's 100 %). Every ETA and
 * elapsed time on those lines is fmtDuration's (src/duration.ts): "5s", "2m05s", "1h02m".
 */
import { fmtDuration } from "./duration";

/** Seconds of work before its first progress line. */
export const FIRST_LINE_SECONDS = 5;

/** Seconds between progress lines: TSTRAIN_PROGRESS_SECONDS, default 30 (an unreadable value reads as 30). */
export function progressEverySeconds(v = process.env.TSTRAIN_PROGRESS_SECONDS): number {
  const n = v === undefined || v === "" ? 30 : Number(v);
  return Number.isFinite(n) && n >= 0 ? n : 30;
}

/** When a piece of work's next progress line is due, by the rule above, counted from `t0` (ms, performance.now()). */
export class ProgressRhythm {
  private next: number;
  constructor(
    private readonly everyMs = progressEverySeconds() * 1000,
    t0 = performance.now(),
  ) {
    this.next = t0 + Math.min(FIRST_LINE_SECONDS * 1000, everyMs);
  }

  /** Whether a line is due at `now`; when it is, the next one is counted from `now`. */
  due(now = performance.now()): boolean {
    if (now < this.next) return false;
    this.next = now + this.everyMs;
    return true;
  }

  /**
   * For work with nothing to poll on while it runs (a Hub transfer, validation): calls `line` whenever one is
   * due, checked every second (every 0.1 s for a shorter rhythm), until the returned stop is called. The timer
   * keeps no process alive.
   */
  every(line: () => void): () => void {
    const timer = setInterval(
      () => {
        if (this.due()) line();
      },
      Math.min(1000, Math.max(100, this.everyMs)),
    );
    timer.unref();
    return () => clearInterval(timer);
  }
}

/** The ETA of `remaining` units at `perSecond` units a second, as fmtDuration prints it; "?" with no rate yet. */
export function etaOf(remaining: number, perSecond: number): string {
  return perSecond > 0 ? fmtDuration(Math.max(0, remaining) / perSecond) : "?";
}
