/**
 * Errors a caller of the Hub layer branches on. Each has a distinct `name`, so the branch still works
 * after the error crossed a worker thread as a plain object (comlink / structured clone keep `name`).
 */

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
