/** What every endpoint of the local Hub shares. */
import type { FaultSwitch } from "./faults";
import type { Signer } from "./lfs";
import type { RepoRef, RepoStore } from "./repo";

/** Things the server reports as they happen; `dist/hub-server.js` prints each as a line. */
export type HubEvent =
  | { type: "commit"; repo: string; rev: string; commit: string; pr: number | null }
  | { type: "commit-paused"; repo: string; rev: string; commit: string }
  | { type: "lock-wait"; repo: string }
  | { type: "repo-deleted"; repo: string }
  | { type: "squashed"; repo: string; branch: string; commit: string; freedObjects: number; freedBytes: number }
  | { type: "faults"; message: string };

export interface HubContext {
  readonly store: RepoStore;
  readonly faults: FaultSwitch;
  readonly signer: Signer;
  readonly lfsThreshold: number;
  readonly pageSize: number;
  /** Unreferenced objects younger than this are kept by gc (an upload whose commit is coming). */
  readonly gcGraceMs: number;
  /** Base URL without a trailing slash. */
  base(): string;
  running(): boolean;
  emit(e: HubEvent): void;
  sleep(ms: number): Promise<void>;
}

export function repoUrl(ctx: HubContext, r: RepoRef): string {
  return `${ctx.base()}/${r.type === "dataset" ? "datasets/" : ""}${r.owner}/${r.name}`;
}
