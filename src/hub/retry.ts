/**
 * K6: which Hub failures are worth another try, and the capped, jittered exponential backoff that
 * tries again. A transient failure (connection refused / reset, a socket closed mid-answer, a
 * timeout, 429, any 5xx) is retried, one log line per failure, until the same piece of work has been
 * failing for `giveUpMs`; anything else (401/403, 404, 412, a verification mismatch) is permanent
 * and surfaces at once.
 */
import { HubApiError } from "@huggingface/hub";
import { describeHubError } from "./hub-errors";

const TRANSIENT_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENETDOWN",
  "EAI_AGAIN",
  "ENOTFOUND",
  "UND_ERR_SOCKET",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
  "UND_ERR_CLOSED",
  "ECONNABORTED",
]);

/** The error codes (ECONNREFUSED, ENOTFOUND, …) of an error, its causes and its aggregated errors. */
export function codesOf(e: unknown, depth = 0): string[] {
  if (!e || typeof e !== "object" || depth > 5) return [];
  const o = e as { code?: unknown; cause?: unknown; errors?: unknown };
  const own = typeof o.code === "string" ? [o.code] : [];
  const inner = Array.isArray(o.errors) ? o.errors.flatMap((x) => codesOf(x, depth + 1)) : [];
  return [...own, ...codesOf(o.cause, depth + 1), ...inner];
}

function statusOf(e: unknown): number | null {
  if (e instanceof HubApiError) return e.statusCode;
  const s =
    (e as { statusCode?: unknown; status?: unknown } | null)?.statusCode ?? (e as { status?: unknown } | null)?.status;
  return typeof s === "number" ? s : null;
}

/** True when trying the same request again can succeed without anyone changing anything. */
export function isTransient(e: unknown, depth = 0): boolean {
  // The client's blob streams abort with a bare string when the connection drops mid-body.
  if (typeof e === "string") return /terminated|socket|ECONN|aborted|network|closed/i.test(e);
  if (!e || typeof e !== "object" || depth > 5) return false;
  const err = e as Error & { cause?: unknown };
  if (err.name === "NotAHubError") return false; // K9: a web server does not become a Hub
  const status = statusOf(e);
  if (status !== null) return status === 429 || status === 408 || status >= 500;
  if (err.name === "HubLookupError") return true; // our own timeouts (status null)
  if (codesOf(e).some((c) => TRANSIENT_CODES.has(c))) return true;
  if (err.name === "TypeError" && (err.message === "fetch failed" || err.message === "terminated")) return true;
  if (err.name === "AbortError" || err.name === "TimeoutError") return true;
  if (
    /socket hang up|other side closed|ECONNRE(SET|FUSED)|UND_ERR_SOCKET|terminated|timed out|stalled/.test(
      String(err.message),
    )
  )
    return true;
  return err.cause !== undefined && isTransient(err.cause, depth + 1);
}

export interface RetryOptions {
  /** What is being done, for the log line ("upload of checkpoint 8"). */
  what: string;
  log: (line: string) => void;
  /** Give up once the work has been failing for this long (measured from `since`). */
  giveUpMs: number;
  /** When the failing started (ms, performance.now()); default: the first failure inside this call. */
  since?: () => number | null;
  /** Called at the first failure, so a caller can carry the clock across calls. */
  onFirstFailure?: (t: number) => void;
  /** Backoff: first wait, cap (ms). Defaults 500 and 30 000. */
  baseMs?: number;
  capMs?: number;
  /** A failure that isTransient would retry but this caller must not (K9: a Hub's storage failing at a run's start). */
  permanent?: (e: unknown) => boolean;
  /** Checked before each wait: a truthy answer abandons the retry loop (e.g. a newer checkpoint is waiting). */
  abandon?: () => string | null;
}

/** Thrown when `abandon` asked the loop to stop; carries the reason. */
export class RetryAbandoned extends Error {
  constructor(
    readonly reason: string,
    readonly last: unknown,
  ) {
    super(reason);
    this.name = "RetryAbandoned";
  }
}

/** Thrown when transient failures lasted longer than giveUpMs; `last` is the final failure. */
export class RetryExhausted extends Error {
  constructor(
    message: string,
    readonly last: unknown,
  ) {
    super(message);
    this.name = "RetryExhausted";
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** The wait before attempt n+1 (n >= 1): exponential, capped, with jitter in [50 %, 100 %]. */
export function backoffMs(n: number, baseMs = 500, capMs = 30_000, rnd: () => number = Math.random): number {
  const exp = Math.min(capMs, baseMs * 2 ** Math.min(30, n - 1));
  return Math.round(exp * (0.5 + 0.5 * rnd()));
}

export async function withRetry<T>(fn: (attempt: number) => Promise<T>, o: RetryOptions): Promise<T> {
  let first: number | null = null;
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn(attempt);
    } catch (e) {
      if (!isTransient(e) || o.permanent?.(e)) throw e;
      const now = performance.now();
      if (first === null) {
        first = o.since?.() ?? now;
        o.onFirstFailure?.(first);
      }
      const failingMs = now - first;
      if (failingMs >= o.giveUpMs) {
        const t = (ms: number) => (ms < 120_000 ? `${(ms / 1000).toFixed(1)} s` : `${(ms / 60_000).toFixed(1)} min`);
        throw new RetryExhausted(
          `${o.what} kept failing for ${t(failingMs)} (the limit is ${t(o.giveUpMs)}, --hub-retry-minutes); last error: ${describeHubError(e)}`,
          e,
        );
      }
      const why = o.abandon?.();
      if (why) throw new RetryAbandoned(why, e);
      const wait = Math.min(backoffMs(attempt, o.baseMs, o.capMs), Math.max(0, o.giveUpMs - failingMs));
      o.log(
        `hub: ${o.what} failed (attempt ${attempt}: ${describeHubError(e).slice(0, 200)}); retrying in ${(wait / 1000).toFixed(1)}s, failing for ${(failingMs / 1000).toFixed(0)}s of at most ${(o.giveUpMs / 1000).toFixed(0)}s (K6)`,
      );
      await sleep(wait);
    }
  }
}
