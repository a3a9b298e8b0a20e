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

/** K4: the pushed checkpoint is not what the Hub holds. The pointer was not moved; the local copy is kept. */
export class CheckpointVerifyError extends Error {
  readonly rule = "K4";
  readonly pathInRepo: string;
  readonly localDir: string;
  readonly verify: VerifyReport;
  constructor(message: string, pathInRepo: string, localDir: string, verify: VerifyReport) {
    super(`${message} [K4]`);
    this.name = "CheckpointVerifyError";
    this.pathInRepo = pathInRepo;
    this.localDir = localDir;
    this.verify = verify;
  }
}

/** K3: a stage other than verification failed (upload / commit, or the pointer write). Local copy kept. */
export class CheckpointPublishError extends Error {
  readonly rule = "K3";
  readonly stage: "upload" | "verify" | "pointer";
  readonly pathInRepo: string;
  readonly localDir: string;
  constructor(message: string, stage: "upload" | "verify" | "pointer", pathInRepo: string, localDir: string) {
    super(`${message} [K3]`);
    this.name = "CheckpointPublishError";
    this.stage = stage;
    this.pathInRepo = pathInRepo;
    this.localDir = localDir;
  }
}
