/**
 * Injected faults of the local Hub (K3, K4, R2–R4 rehearsals). Set in-process with setFaults(), or
 * from a JSON file that `dist/hub-server.js --faults FILE` re-reads whenever it changes (L7).
 */
import * as fs from "node:fs";

/** Every endpoint the server answers; fault maps are keyed by these names. */
export type HubEndpoint =
  | "createRepo" //    POST   /api/repos/create
  | "deleteRepo" //    DELETE /api/repos/delete
  | "repoInfo" //      GET    /api/{type}s/{owner}/{name}            (repoExists)
  | "revisionInfo" //  GET    /api/{type}s/{owner}/{name}/revision/{rev}  (modelInfo, datasetInfo)
  | "whoami" //        GET    /api/whoami-v2
  | "preupload" //     POST   /api/{type}s/{owner}/{name}/preupload/{rev}
  | "lfsBatch" //      POST   /[datasets/]{owner}/{name}.git/info/lfs/objects/batch
  | "upload" //        PUT    signed LFS upload href
  | "commit" //        POST   /api/{type}s/{owner}/{name}/commit/{rev}
  | "commits" //       GET    /api/{type}s/{owner}/{name}/commits/{rev}  (listCommits, countCommits)
  | "createBranch" //  POST   /api/{type}s/{owner}/{name}/branch/{branch}
  | "deleteBranch" //  DELETE /api/{type}s/{owner}/{name}/branch/{branch}
  | "superSquash" //   POST   /api/{type}s/{owner}/{name}/super-squash/{branch}
  | "list" //          GET    /api/{type}s/{owner}/{name}/tree/{rev}[/{path}]
  | "pathsInfo" //     POST   /api/{type}s/{owner}/{name}/paths-info/{rev}
  | "resolve" //       GET/HEAD …/resolve/{rev}/{path}  (every file except latest.json)
  | "raw" //           GET/HEAD …/raw/{rev}/{path}      (every file except latest.json)
  | "pointerRead"; //  GET/HEAD …/resolve|raw/{rev}/latest.json
export const HUB_ENDPOINTS: readonly HubEndpoint[] = [
  "createRepo",
  "deleteRepo",
  "repoInfo",
  "revisionInfo",
  "whoami",
  "preupload",
  "lfsBatch",
  "upload",
  "commit",
  "commits",
  "createBranch",
  "deleteBranch",
  "superSquash",
  "list",
  "pathsInfo",
  "resolve",
  "raw",
  "pointerRead",
];

export interface HubFaults {
  /** Answer this endpoint with this HTTP status instead of serving it. */
  status: Partial<Record<HubEndpoint, number>>;
  /** Wait this long before answering (long enough trips a client timeout). */
  delayMs: Partial<Record<HubEndpoint, number>>;
  /** A commit "succeeds" but files whose path ends with one of these are not stored. */
  dropOnCommit: string[];
  /** A commit stores these files (path suffix) with one byte flipped. */
  corruptOnCommit: string[];
  /** A commit also stores these files. */
  extraOnCommit: { path: string; content: string | Uint8Array }[];
  /** A commit that adds or deletes latest.json fails with 500 (and stores nothing). */
  failPointerWrite: boolean;
  /** A commit that adds or deletes a file whose path ends with one of these lands (durable, the branch
   *  moved) and is then answered 500 instead of its success JSON: the client never learns it landed (K8). */
  loseCommitAnswer: string[];
  /** Downloads (resolve) of files whose path ends with one of these are truncated, see truncateMode. */
  truncateDownload: string[];
  /** "cut": announce the full length, send half, drop the connection. "short": serve the first half
   *  as if it were the whole file (consistent headers, wrong content). */
  truncateMode: "cut" | "short";
  /** A commit stops after its objects and commit file are durable and before the branch moves,
   *  reports a "commit-paused" event, and waits until this is switched off (crash rehearsals, L5). */
  pauseCommit: boolean;
  /** How many requests the faults above apply to before they clear themselves; null = until cleared. */
  failCount: number | null;
}

export function noFaults(): HubFaults {
  return {
    status: {},
    delayMs: {},
    dropOnCommit: [],
    corruptOnCommit: [],
    extraOnCommit: [],
    failPointerWrite: false,
    loseCommitAnswer: [],
    truncateDownload: [],
    truncateMode: "cut",
    pauseCommit: false,
    failCount: null,
  };
}

const KEYS = Object.keys(noFaults()) as (keyof HubFaults)[];

/** A partial HubFaults from JSON, checked key by key; the error names the key and what it needs. */
export function parseFaults(v: unknown, where: string): Partial<HubFaults> {
  if (!v || typeof v !== "object" || Array.isArray(v))
    throw new Error(`${where}: faults must be a JSON object with keys ${KEYS.join(", ")}`);
  const o = v as Record<string, unknown>;
  for (const k of Object.keys(o))
    if (!KEYS.includes(k as keyof HubFaults))
      throw new Error(`${where}: unknown fault ${JSON.stringify(k)}; known: ${KEYS.join(", ")}`);
  for (const k of ["status", "delayMs"] as const) {
    const m = o[k];
    if (m === undefined) continue;
    if (!m || typeof m !== "object") throw new Error(`${where}: ${k} must map endpoint names to numbers`);
    for (const [e, n] of Object.entries(m)) {
      if (!HUB_ENDPOINTS.includes(e as HubEndpoint))
        throw new Error(`${where}: ${k}.${e} is not an endpoint; known: ${HUB_ENDPOINTS.join(", ")}`);
      if (typeof n !== "number" || !(n >= 0)) throw new Error(`${where}: ${k}.${e} must be a non-negative number`);
    }
  }
  for (const k of ["dropOnCommit", "corruptOnCommit", "loseCommitAnswer", "truncateDownload"] as const) {
    if (o[k] !== undefined && !(Array.isArray(o[k]) && (o[k] as unknown[]).every((s) => typeof s === "string")))
      throw new Error(`${where}: ${k} must be an array of path suffixes`);
  }
  if (o.truncateMode !== undefined && o.truncateMode !== "cut" && o.truncateMode !== "short")
    throw new Error(`${where}: truncateMode must be "cut" or "short"`);
  if (
    o.failCount !== undefined &&
    o.failCount !== null &&
    !(Number.isInteger(o.failCount) && (o.failCount as number) > 0)
  )
    throw new Error(`${where}: failCount must be a positive integer or null`);
  return o as Partial<HubFaults>;
}

/** The faults in force: setFaults() in-process, or a file re-read whenever it changes. */
export class FaultSwitch {
  private faults: HubFaults = noFaults();
  private fileStamp = "";

  constructor(
    private readonly file: string | null,
    private readonly warn: (line: string) => void,
  ) {}

  get current(): HubFaults {
    this.reload();
    return this.faults;
  }

  set(f: Partial<HubFaults>): void {
    this.faults = { ...this.faults, ...f };
  }

  clear(): void {
    this.faults = noFaults();
  }

  /**
   * One request took a fault of the set `matched` (what `current` gave it when it arrived): count it,
   * and clear everything once failCount requests have. A set replaced or cleared since then is not
   * counted against the one in force now: faults are matched per request as they were written.
   */
  consume(matched: HubFaults): void {
    if (matched !== this.faults || this.faults.failCount === null) return;
    this.faults.failCount -= 1;
    if (this.faults.failCount <= 0) this.clear();
  }

  /** A changed (or removed) faults file replaces the faults; a bad one is reported and ignored. */
  private reload(): void {
    if (!this.file) return;
    let st: fs.Stats | null = null;
    try {
      st = fs.statSync(this.file);
    } catch {
      st = null;
    }
    const stamp = st ? `${st.ino}:${st.size}:${st.mtimeMs}` : "absent";
    if (stamp === this.fileStamp) return;
    this.fileStamp = stamp;
    if (!st) {
      this.clear();
      this.warn(`faults: ${this.file} is absent: no faults`);
      return;
    }
    try {
      let v: unknown;
      try {
        v = JSON.parse(fs.readFileSync(this.file, "utf8"));
      } catch (e) {
        throw new Error(`${this.file} is not valid JSON (${(e as Error).message})`);
      }
      this.faults = { ...noFaults(), ...parseFaults(v, this.file) };
      this.warn(`faults: loaded ${this.file}: ${JSON.stringify(this.faults)}`);
    } catch (e) {
      this.warn(`faults: ${(e as Error).message}; keeping the faults in force`);
    }
  }
}
