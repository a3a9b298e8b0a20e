/**
 * The Hub layer's errors: the ones a caller branches on (each with a distinct `name`, so the branch still works
 * after the error crossed a worker thread as a plain object: comlink / structured clone keep `name`), the one-line
 * description of any Hub failure for messages, and the scrubbing that keeps HF_TOKEN (and signed URLs' queries)
 * out of every error (K5).
 */
import { HubApiError } from "@huggingface/hub";

/** Removes the token from a text, and the query of every URL in it (signed upload URLs carry
 *  credentials of their own there). */
export function scrubSecret(text: string, secret: string | undefined): string {
  const t = text.replace(/(https?:\/\/[^\s?#]+)\?[^\s#]*/g, "$1?…");
  if (!secret) return t;
  return t.split(secret).join("hf_***");
}

/** The token out of an error, its stack, its cause and its data (the client keeps the answer's JSON there). */
export function scrubError(e: unknown, secret: string | undefined): unknown {
  if (!(e instanceof Error)) return e;
  e.message = scrubSecret(e.message, secret);
  if (e.stack) e.stack = scrubSecret(e.stack, secret);
  const c = (e as { cause?: unknown }).cause;
  if (c instanceof Error) scrubError(c, secret);
  const d = (e as { data?: unknown }).data;
  if (d && typeof d === "object") {
    try {
      (e as { data?: unknown }).data = JSON.parse(scrubSecret(JSON.stringify(d), secret));
    } catch {
      /* leave data as is */
    }
  }
  return e;
}

/** Errors whose message already says what they are (this layer's own). */
const OWN_ERRORS: ReadonlySet<string> = new Set([
  "Error",
  "HubLookupError",
  "RepoMissingError",
  "NotAHubError",
  "RetryExhausted",
]);

/** One line that says what kind of failure this was (HTTP status, timeout, network), for messages. */
export function describeHubError(e: unknown): string {
  if (e instanceof HubApiError) return `HTTP ${e.statusCode}: ${e.message}`;
  if (e instanceof Error) {
    const cause = (e as { cause?: { code?: string; message?: string } }).cause;
    if (e.name === "TypeError" && e.message === "fetch failed")
      return `network error: ${cause?.code ?? cause?.message ?? "fetch failed"}`;
    if (e.name === "TypeError" && e.message === "terminated")
      return "network error: the connection closed before the announced bytes arrived (terminated)";
    // Our own errors already say what they are; a foreign one keeps its name (TypeError, AbortError …).
    return OWN_ERRORS.has(e.name) ? e.message : `${e.name}: ${e.message}`;
  }
  return String(e);
}

/** The repo itself does not exist (404 with X-Error-Code RepoNotFound) — never a 401, never a timeout. */
export class RepoMissingError extends Error {
  readonly repo: string;
  constructor(repo: string, message?: string) {
    super(message ?? `Hub repo ${repo} does not exist (RepoNotFound)`);
    this.name = "RepoMissingError";
    this.repo = repo;
  }
}

/** The Hub answered, or failed to answer, in a way that proves nothing (401, 5xx, timeout, network). */
export class HubLookupError extends Error {
  readonly status: number | null;
  constructor(message: string, status: number | null) {
    super(message);
    this.name = "HubLookupError";
    this.status = status;
  }
}

export interface VerifyReport {
  missing: string[];
  mismatch: string[];
  extra: string[];
  readbackOk: boolean;
}

/**
 * A checkpoint that did not reach the Hub whole (K3) or did not verify there (K4): the pointer was not moved
 * and the local copy at `localDir` is kept.
 */
abstract class CheckpointNotPublished extends Error {
  abstract readonly rule: "K3" | "K4";
  readonly pathInRepo: string;
  readonly localDir: string;
  constructor(message: string, rule: "K3" | "K4", name: string, pathInRepo: string, localDir: string) {
    super(`${message} [${rule}]`);
    this.name = name;
    this.pathInRepo = pathInRepo;
    this.localDir = localDir;
  }
}

/** K4: the pushed checkpoint is not what the Hub holds. The pointer was not moved; the local copy is kept. */
export class CheckpointVerifyError extends CheckpointNotPublished {
  readonly rule = "K4";
  readonly verify: VerifyReport;
  constructor(message: string, pathInRepo: string, localDir: string, verify: VerifyReport) {
    super(message, "K4", "CheckpointVerifyError", pathInRepo, localDir);
    this.verify = verify;
  }
}

/** K3: a stage other than verification failed (upload / commit, or the pointer write). Local copy kept. */
export class CheckpointPublishError extends CheckpointNotPublished {
  readonly rule = "K3";
  readonly stage: "upload" | "verify" | "pointer";
  constructor(message: string, stage: "upload" | "verify" | "pointer", pathInRepo: string, localDir: string) {
    super(message, "K3", "CheckpointPublishError", pathInRepo, localDir);
    this.stage = stage;
  }
}

/**
 * K8: a commit named the parent revision this run last saw, and the Hub answered 412: someone else
 * committed to the repo meanwhile. The run stops rather than overwrite the other writer's pointer.
 */
export class ConcurrentWriterError extends Error {
  readonly rule = "K8";
  readonly otherCommit: string | null;
  readonly expectedParent: string;
  constructor(repo: string, expectedParent: string, otherCommit: string | null, what: string) {
    super(
      `another writer committed to ${repo} while this run was using it: ${what} named parent commit ${expectedParent.slice(0, 12)} ` +
        `but the repo's head is now ${otherCommit ? otherCommit.slice(0, 12) : "(unknown: the head could not be read)"} (HTTP 412). ` +
        `Two runs must not share one --hub-repo; this run stops without touching latest.json. Stop the other run, or give this one its own --hub-repo [K8]`,
    );
    this.name = "ConcurrentWriterError";
    this.otherCommit = otherCommit;
    this.expectedParent = expectedParent;
  }
}

/**
 * K9: the address answered a Hub API route as a web server does, not as a Hub: 501 or 405, another 4xx that is not
 * JSON (a Hub's errors are), or an HTML page. Permanent: no retry makes a web server a Hub.
 */
export class NotAHubError extends Error {
  readonly httpStatus: number;
  constructor(where: string, status: number, contentType: string | null) {
    super(
      `${where} answered ${status}${contentType ? ` (${contentType.split(";")[0]})` : ""}, as a web server does, not as a Hub: a Hub answers its API routes with JSON`,
    );
    this.name = "NotAHubError";
    this.httpStatus = status;
  }
}

/** K9: whether an answer to `url` shows that the address is not a Hub (NotAHubError's rule); HEAD answers carry no body to judge. */
export function isNotAHubAnswer(url: string, method: string, status: number, contentType: string | null): boolean {
  if (method === "HEAD" || !new URL(url).pathname.includes("/api/")) return false;
  if (status === 501 || status === 405) return true;
  const json = contentType !== null && /json/i.test(contentType);
  if (status >= 400 && status < 500 && ![401, 403, 408, 409, 412, 429].includes(status)) return !json;
  return status < 300 && contentType !== null && /html/i.test(contentType);
}

/** K9: the Hub could not store what it was sent (its disk is full, read-only, or its folder is gone): the local Hub's 507. */
export function isHubStorageFailure(e: unknown): boolean {
  const s = (e as { statusCode?: unknown } | null)?.statusCode;
  return s === 507;
}
