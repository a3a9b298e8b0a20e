/**
 * LocalHub — a small, file-backed Hugging Face Hub that the real `@huggingface/hub` client talks to
 * (the part of huggingface.co's HTTP API that @huggingface/hub uses; group L in docs/RULES.md). It is the fake Hub of the integration tests (A6) and the embedded Hub of the
 * offline demo (B6), and it can inject every fault the checkpoint cycle must survive (K3, K4, R2–R4).
 *
 * Like the real Hub it keeps a history per repo (commit ids and parents, branches, PR refs, reads at
 * any revision, L1), refuses a commit whose parentCommit is stale with 412 under a lock shared by
 * every process serving the same directory (L2), has private repos and read/write tokens (L4),
 * acknowledges a commit only once it is fsynced (L5), and frees what no commit reaches after a
 * super-squash (L6). The parts live in server/: routes, repo (storage), history (commits, branches,
 * gc), commit, read, write, lfs, auth, faults, lock, fsio, http.
 */
import * as http from "node:http";
import * as path from "node:path";
import type { AddressInfo } from "node:net";
import { Auth, type HubToken } from "./server/auth";
import { commitEndpoint } from "./server/commit";
import type { HubContext, HubEvent } from "./server/context";
import { FaultSwitch, type HubEndpoint, type HubFaults } from "./server/faults";
import { collectGarbage, type GcResult } from "./server/history";
import { checkStoreWritable } from "./server/fsio";
import { HttpError, readBody, sendError, storageFailure } from "./server/http";
import { Signer, lfsBatch, lfsUpload } from "./server/lfs";
import {
  commitsEndpoint,
  pathsInfoEndpoint,
  repoInfoEndpoint,
  resolveEndpoint,
  treeEndpoint,
  whoamiEndpoint,
} from "./server/read";
import { RepoStore, type RepoRef } from "./server/repo";
import { route, type Route } from "./server/routes";
import {
  createBranchEndpoint,
  createRepoEndpoint,
  deleteBranchEndpoint,
  deleteRepoEndpoint,
  preuploadEndpoint,
  superSquashEndpoint,
  validRepoName,
} from "./server/write";

export { HUB_ENDPOINTS, parseFaults, type HubEndpoint, type HubFaults } from "./server/faults";
export type { HubEvent } from "./server/context";
export type { HubToken, TokenRole } from "./server/auth";
export { loadTokensFile } from "./server/auth";

export interface LocalHubOptions {
  dir: string;
  /** A token with the write role (HF_TOKEN of `dist/hub-server.js`). */
  token?: string;
  /** More tokens, each with a role (L4). With none at all, the Hub is open to everyone. */
  tokens?: HubToken[];
  host?: string;
  port?: number;
  /** Files larger than this go through LFS (every *.safetensors / *.bin / *.pt does anyway). Default 64 KiB. */
  lfsThreshold?: number;
  /** Entries per tree-listing page (the client follows `Link: rel="next"`). Default 100. */
  pageSize?: number;
  /** A JSON file of faults, re-read whenever it changes (L7). */
  faultsFile?: string;
  /** gc keeps unreferenced objects younger than this (uploads whose commit is still coming). Default 1 h. */
  gcGraceMs?: number;
  /** Called with each event (commits, paused commits, deletions, squashes, faults file loads). */
  onEvent?: (e: HubEvent) => void;
}

export class LocalHub {
  readonly requests: { method: string; path: string; status: number }[] = [];
  private readonly ctx: HubContext;
  private readonly auth: Auth;
  private readonly host: string;
  private readonly port: number;
  private readonly faultSwitch: FaultSwitch;
  private server: http.Server | null = null;
  private base = "";
  private readonly timers = new Set<NodeJS.Timeout>();

  constructor(o: LocalHubOptions) {
    if (!o || typeof o.dir !== "string" || o.dir === "")
      throw new TypeError("LocalHub: options.dir must be a directory path");
    this.host = o.host ?? "127.0.0.1";
    this.port = o.port ?? 0;
    const pageSize = o.pageSize ?? 100;
    if (!Number.isInteger(this.port) || this.port < 0 || this.port > 65535)
      throw new TypeError(`LocalHub: options.port must be 0..65535, got ${o.port}`);
    if (!Number.isInteger(pageSize) || pageSize < 1)
      throw new TypeError(`LocalHub: options.pageSize must be a positive integer, got ${o.pageSize}`);
    this.auth = new Auth([
      ...(o.token ? [{ token: o.token, role: "write" as const, name: "local" }] : []),
      ...(o.tokens ?? []),
    ]);
    const emit = o.onEvent ?? (() => undefined);
    this.faultSwitch = new FaultSwitch(o.faultsFile ?? null, (message) => emit({ type: "faults", message }));
    this.ctx = {
      store: new RepoStore(path.resolve(o.dir), (r) => emit({ type: "lock-wait", repo: `${r.owner}/${r.name}` })),
      faults: this.faultSwitch,
      signer: new Signer(),
      pageSize,
      lfsThreshold: o.lfsThreshold ?? 64 * 1024,
      gcGraceMs: o.gcGraceMs ?? 3600_000,
      base: () => this.base,
      running: () => this.server !== null,
      emit,
      sleep: (ms) => this.sleep(ms),
    };
  }

  /** Base URL without a trailing slash, e.g. http://127.0.0.1:41234 */
  get url(): string {
    return this.base;
  }

  async start(): Promise<string> {
    if (this.server) return this.base;
    await checkStoreWritable(this.ctx.store.root); // L9: a read-only or full --dir is refused before listening
    void this.faultSwitch.current; // a faults file given at start is read (and reported) now
    const server = http.createServer((req, res) => {
      this.handle(req, res).catch((e) => {
        const full = storageFailure(e, this.ctx.store.root); // K9: a full or read-only disk is said as such, not as a bug
        if (res.headersSent) res.destroy();
        else if (full) sendError(req, res, full.status, full.message, full.code);
        else sendError(req, res, 500, `internal error: ${(e as Error).message}`);
      });
    });
    server.keepAliveTimeout = 5000;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.port, this.host, () => resolve());
    });
    this.server = server;
    const a = server.address() as AddressInfo;
    const h = a.family === "IPv6" || a.address.includes(":") ? `[${a.address}]` : a.address;
    this.base = `http://${h}:${a.port}`;
    return this.base;
  }

  async stop(): Promise<void> {
    const s = this.server;
    if (!s) return;
    this.server = null;
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    await new Promise<void>((resolve) => {
      s.close(() => resolve());
      s.closeAllConnections();
    });
  }

  setFaults(f: Partial<HubFaults>): void {
    this.faultSwitch.set(f);
  }

  clearFaults(): void {
    this.faultSwitch.clear();
  }

  /** Deletes commits no ref reaches and objects no kept commit names (and older than gcGraceMs). */
  collectGarbage(repo: RepoRef): Promise<GcResult> {
    return collectGarbage(this.ctx.store, repo, this.ctx.gcGraceMs);
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.timers.delete(t);
        resolve();
      }, ms);
      this.timers.add(t);
    });
  }

  // ---- one request -------------------------------------------------------------------------------

  private track(req: http.IncomingMessage, res: http.ServerResponse, pathname: string): void {
    const entry = { method: req.method ?? "GET", path: pathname, status: 0 };
    this.requests.push(entry);
    res.on("finish", () => (entry.status = res.statusCode));
    res.on("close", () => {
      if (!entry.status) entry.status = res.headersSent ? res.statusCode : 0;
    });
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const u = new URL(req.url ?? "/", "http://localhost");
    this.track(req, res, u.pathname);
    try {
      const segs = u.pathname
        .split("/")
        .filter((x) => x !== "")
        .map((x) => decodeURIComponentOr400(x));
      const rt = route(req.method ?? "GET", segs);
      const who = await this.admit(req, rt, u);
      if (!(await this.injectFaults(req, rt.endpoint!))) return;
      await this.dispatch(req, res, rt, u, who);
    } catch (e) {
      if (!(e instanceof HttpError)) throw e;
      await readBody(req).catch(() => undefined);
      sendError(req, res, e.status, e.message, e.code);
    }
  }

  /** Refuses unknown endpoints, bad names and callers without the access the endpoint needs (L4). */
  private async admit(req: http.IncomingMessage, rt: Route, u: URL): Promise<HubToken | null> {
    if (!rt.endpoint) throw new HttpError(404, `no such endpoint: ${req.method} ${u.pathname}`);
    if (rt.repo && !validRepoName(rt.repo)) throw new HttpError(400, "invalid repo name");
    if (rt.endpoint === "upload") return null; // signed hrefs authorise themselves
    const who = this.auth.identify(req.headers.authorization);
    if (this.auth.open || rt.access === "none") return who;
    const refs = rt.repo && rt.access === "read" && !who ? await this.ctx.store.readRefs(rt.repo) : null;
    // Anonymous callers cannot tell a private repo from a missing one (the real Hub's 401).
    this.auth.check(who, rt.access, refs ? refs.private : true);
    return who;
  }

  /** Delay and status faults; false when the server stopped while the request waited. */
  private async injectFaults(req: http.IncomingMessage, endpoint: HubEndpoint): Promise<boolean> {
    const f = this.faultSwitch.current;
    const delay = f.delayMs[endpoint] ?? 0;
    const forced = f.status[endpoint];
    // Counted when it matches, not when it is answered: a delayed request whose client gave up long
    // ago must not spend a fault set after it arrived.
    if (delay > 0 || forced) this.faultSwitch.consume(f);
    if (delay > 0) {
      await this.sleep(delay);
      if (!this.server) return false;
    }
    if (forced) {
      await readBody(req);
      throw new HttpError(forced, `injected fault: ${endpoint} answers ${forced}`);
    }
    return true;
  }

  private async dispatch(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    rt: Route,
    u: URL,
    who: HubToken | null,
  ): Promise<void> {
    const { ctx } = this;
    const r = rt.repo!;
    const endpoint = rt.endpoint!;
    switch (endpoint) {
      case "createRepo":
        return createRepoEndpoint(ctx, req, res);
      case "deleteRepo":
        return deleteRepoEndpoint(ctx, req, res);
      case "whoami":
        return whoamiEndpoint(res, who);
      case "repoInfo":
        return repoInfoEndpoint(ctx, res, r, []);
      case "revisionInfo":
        return repoInfoEndpoint(ctx, res, r, rt.rest);
      case "preupload":
        return preuploadEndpoint(ctx, req, res, r, rt.rest);
      case "lfsBatch":
        return lfsBatch(req, res, ctx.store, r, ctx.signer, this.base);
      case "upload":
        return lfsUpload(req, res, ctx.store, r, ctx.signer, rt.rest[0], u.searchParams);
      case "commit":
        return commitEndpoint(ctx, req, res, r, rt.rest, u);
      case "commits":
        return commitsEndpoint(ctx, res, r, rt.rest, u);
      case "createBranch":
        return createBranchEndpoint(ctx, req, res, r, rt.rest);
      case "deleteBranch":
        return deleteBranchEndpoint(ctx, req, res, r, rt.rest);
      case "superSquash":
        return superSquashEndpoint(ctx, req, res, r, rt.rest);
      case "list":
        return treeEndpoint(ctx, res, r, rt.rest, u);
      case "pathsInfo":
        return pathsInfoEndpoint(ctx, req, res, r, rt.rest);
      case "resolve":
      case "raw":
      case "pointerRead":
        return resolveEndpoint(ctx, req, res, r, rt.rest);
      default: {
        const never: never = endpoint;
        throw new Error(`unrouted endpoint ${String(never)}`);
      }
    }
  }
}

function decodeURIComponentOr400(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    throw new HttpError(400, "malformed URL");
  }
}
