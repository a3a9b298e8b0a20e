/**
 * LocalHub — a small, file-backed Hugging Face Hub that the real `@huggingface/hub` client talks to
 * (HUB-PROTOCOL.md). It is the fake Hub of the integration tests (A6) and the embedded Hub of the
 * offline demo (B6), and it can inject every fault the checkpoint cycle must survive (K3, K4, R2–R4).
 *
 * Storage, per repo under `dir/{models|datasets}/{owner}/{name}/`:
 *   objects/{sha256}   content-addressed bytes (regular and LFS files alike)
 *   main.json          the one branch: { commit, files: { path: {sha256, size, lfs, gitOid} } }
 * A commit writes its objects first and then replaces main.json with one rename, so a commit applies
 * all of its adds and deletes or none of them.
 */
import * as http from "node:http";
import * as fs from "node:fs";
import * as fsp from "node:fs/promises";
import * as path from "node:path";
import { createHash, createHmac, randomBytes } from "node:crypto";
import type { AddressInfo } from "node:net";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";

// ---- endpoints and faults ---------------------------------------------------------------------

/** Every endpoint the server answers; fault maps are keyed by these names. */
export type HubEndpoint =
  | "createRepo" //  POST /api/repos/create
  | "repoInfo" //    GET  /api/{type}s/{owner}/{name}            (repoExists)
  | "preupload" //   POST /api/{type}s/{owner}/{name}/preupload/{rev}
  | "lfsBatch" //    POST /[datasets/]{owner}/{name}.git/info/lfs/objects/batch
  | "upload" //      PUT  signed LFS upload href
  | "commit" //      POST /api/{type}s/{owner}/{name}/commit/{rev}
  | "list" //        GET  /api/{type}s/{owner}/{name}/tree/{rev}[/{path}]
  | "pathsInfo" //   POST /api/{type}s/{owner}/{name}/paths-info/{rev}
  | "resolve" //     GET/HEAD …/resolve/{rev}/{path}  (every file except latest.json)
  | "raw" //         GET/HEAD …/raw/{rev}/{path}      (every file except latest.json)
  | "pointerRead"; // GET/HEAD …/resolve|raw/{rev}/latest.json
export const HUB_ENDPOINTS: readonly HubEndpoint[] = [
  "createRepo", "repoInfo", "preupload", "lfsBatch", "upload", "commit", "list", "pathsInfo", "resolve", "raw", "pointerRead",
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
  /** Downloads (resolve) of files whose path ends with one of these are truncated, see truncateMode. */
  truncateDownload: string[];
  /** "cut": announce the full length, send half, drop the connection. "short": serve the first half
   *  as if it were the whole file (consistent headers, wrong content). */
  truncateMode: "cut" | "short";
  /** How many requests the faults above apply to before they clear themselves; null = until clearFaults(). */
  failCount: number | null;
}

function noFaults(): HubFaults {
  return {
    status: {}, delayMs: {}, dropOnCommit: [], corruptOnCommit: [], extraOnCommit: [],
    failPointerWrite: false, truncateDownload: [], truncateMode: "cut", failCount: null,
  };
}

export interface LocalHubOptions {
  dir: string;
  /** When set, every request must carry `Authorization: Bearer <token>` (signed upload hrefs excepted). */
  token?: string;
  host?: string;
  port?: number;
  /** Files larger than this go through LFS (every *.safetensors / *.bin / *.pt does anyway). Default 64 KiB. */
  lfsThreshold?: number;
  /** Entries per tree-listing page (the client follows `Link: rel="next"`). Default 100. */
  pageSize?: number;
}

type RepoType = "model" | "dataset";
interface StoredFile { sha256: string; size: number; lfs: boolean; gitOid: string }
interface RepoState { commit: string; files: Record<string, StoredFile> }
interface RepoRef { type: RepoType; owner: string; name: string }

class HttpError extends Error {
  constructor(readonly status: number, message: string, readonly code?: string) {
    super(message);
  }
}

const POINTER_PATH = "latest.json";
const GITATTRIBUTES = "*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n*.pt filter=lfs diff=lfs merge=lfs -text\n";
const ALWAYS_LFS = /\.(safetensors|bin|pt|pth|ckpt|npy|msgpack)$/;
const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

function gitBlobOid(content: Buffer): string {
  return createHash("sha1").update(`blob ${content.length}\0`).update(content).digest("hex");
}
function lfsPointerText(sha256: string, size: number): string {
  return `version https://git-lfs.github.com/spec/v1\noid sha256:${sha256}\nsize ${size}\n`;
}
function sha256Hex(b: Buffer): string {
  return createHash("sha256").update(b).digest("hex");
}

/** A repo path the store accepts: relative, no empty, "." or ".." segments. */
function checkRepoPath(p: unknown): string {
  if (typeof p !== "string" || p === "" || p.startsWith("/") || p.split("/").some((s) => s === "" || s === "." || s === "..")) {
    throw new HttpError(400, `invalid path in repo: ${JSON.stringify(p)}`);
  }
  return p;
}

async function readBody(req: http.IncomingMessage, limit = 512 * 1024 * 1024): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of req) {
    n += (c as Buffer).length;
    if (n > limit) throw new HttpError(413, "request body too large");
    chunks.push(c as Buffer);
  }
  return Buffer.concat(chunks);
}

function parseJson(b: Buffer): any {
  try {
    return JSON.parse(b.toString("utf8"));
  } catch {
    throw new HttpError(400, "request body is not valid JSON");
  }
}

export class LocalHub {
  readonly requests: { method: string; path: string; status: number }[] = [];
  private readonly dir: string;
  private readonly token: string | undefined;
  private readonly host: string;
  private readonly port: number;
  private readonly lfsThreshold: number;
  private readonly pageSize: number;
  private readonly secret = randomBytes(32);
  private faults: HubFaults = noFaults();
  private server: http.Server | null = null;
  private base = "";
  private readonly timers = new Set<NodeJS.Timeout>();
  private readonly locks = new Map<string, Promise<unknown>>();

  constructor(o: LocalHubOptions) {
    if (!o || typeof o.dir !== "string" || o.dir === "") throw new TypeError("LocalHub: options.dir must be a directory path");
    this.dir = path.resolve(o.dir);
    this.token = o.token || undefined;
    this.host = o.host ?? "127.0.0.1";
    this.port = o.port ?? 0;
    this.lfsThreshold = o.lfsThreshold ?? 64 * 1024;
    this.pageSize = o.pageSize ?? 100;
    if (!Number.isInteger(this.port) || this.port < 0 || this.port > 65535) throw new TypeError(`LocalHub: options.port must be 0..65535, got ${o.port}`);
    if (!Number.isInteger(this.pageSize) || this.pageSize < 1) throw new TypeError(`LocalHub: options.pageSize must be a positive integer, got ${o.pageSize}`);
  }

  /** Base URL without a trailing slash, e.g. http://127.0.0.1:41234 */
  get url(): string {
    return this.base;
  }

  async start(): Promise<string> {
    if (this.server) return this.base;
    await fsp.mkdir(this.dir, { recursive: true });
    const server = http.createServer((req, res) => {
      this.handle(req, res).catch((e) => {
        if (!res.headersSent) this.sendError(req, res, 500, `internal error: ${(e as Error).message}`);
        else res.destroy();
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
    this.faults = { ...this.faults, ...f };
  }

  clearFaults(): void {
    this.faults = noFaults();
  }

  // ---- plumbing ----------------------------------------------------------------------------------

  private repoDir(r: RepoRef): string {
    return path.join(this.dir, r.type === "model" ? "models" : "datasets", r.owner, r.name);
  }

  private async readState(r: RepoRef): Promise<RepoState | null> {
    try {
      return JSON.parse(await fsp.readFile(path.join(this.repoDir(r), "main.json"), "utf8")) as RepoState;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw e;
    }
  }

  private async mustState(r: RepoRef, rev?: string): Promise<RepoState> {
    const st = await this.readState(r);
    if (!st) throw new HttpError(404, "Repository not found", "RepoNotFound");
    if (rev !== undefined && rev !== "main" && rev !== st.commit) throw new HttpError(404, `Invalid rev id: ${rev}`, "RevisionNotFound");
    return st;
  }

  private async writeState(r: RepoRef, st: RepoState): Promise<void> {
    const p = path.join(this.repoDir(r), "main.json");
    const tmp = `${p}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
    await fsp.writeFile(tmp, JSON.stringify(st));
    await fsp.rename(tmp, p);
  }

  private objectPath(r: RepoRef, sha256: string): string {
    return path.join(this.repoDir(r), "objects", sha256);
  }

  private async putObject(r: RepoRef, content: Buffer): Promise<StoredFile & { content: Buffer }> {
    const sha = sha256Hex(content);
    const p = this.objectPath(r, sha);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    if (!fs.existsSync(p)) {
      const tmp = `${p}.${randomBytes(4).toString("hex")}.tmp`;
      await fsp.writeFile(tmp, content);
      await fsp.rename(tmp, p);
    }
    return { sha256: sha, size: content.length, lfs: false, gitOid: gitBlobOid(content), content };
  }

  /** Serialises commits per repo so two writers cannot clobber main.json. */
  private async withLock<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.locks.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    this.locks.set(key, next.catch(() => undefined));
    return next;
  }

  private signHref(r: RepoRef, oid: string, size: number): string {
    const exp = Date.now() + 3600_000;
    const msg = `${r.type}/${r.owner}/${r.name}/${oid}/${size}/${exp}`;
    const sig = createHmac("sha256", this.secret).update(msg).digest("hex");
    return `${this.base}/__lfs/upload/${r.type}/${encodeURIComponent(r.owner)}/${encodeURIComponent(r.name)}/${oid}?size=${size}&exp=${exp}&sig=${sig}`;
  }

  private checkSignature(r: RepoRef, oid: string, q: URLSearchParams): number {
    const size = Number(q.get("size"));
    const exp = Number(q.get("exp"));
    const sig = q.get("sig") ?? "";
    const want = createHmac("sha256", this.secret).update(`${r.type}/${r.owner}/${r.name}/${oid}/${size}/${exp}`).digest("hex");
    if (sig.length !== want.length || sig !== want) throw new HttpError(403, "upload URL signature is invalid");
    if (!(exp > Date.now())) throw new HttpError(403, "upload URL has expired");
    return size;
  }

  private sendError(req: http.IncomingMessage, res: http.ServerResponse, status: number, message: string, code?: string): void {
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const headers: http.OutgoingHttpHeaders = { "X-Error-Message": message.replace(/[^\x20-\x7e]/g, "?") };
    if (code) headers["X-Error-Code"] = code;
    if (req.method === "HEAD") {
      // The client must not try to parse a JSON body it will never get (HUB-PROTOCOL.md).
      res.writeHead(status, { ...headers, "Content-Type": "text/plain" });
      res.end();
      return;
    }
    const body = JSON.stringify({ error: message });
    res.writeHead(status, { ...headers, "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
    res.end(body);
  }

  private sendJson(res: http.ServerResponse, status: number, value: unknown, extra: http.OutgoingHttpHeaders = {}, type = "application/json"): void {
    const body = JSON.stringify(value);
    res.writeHead(status, { "Content-Type": type, "Content-Length": Buffer.byteLength(body), ...extra });
    res.end(body);
  }

  /** One request took a fault: count it, and clear everything once failCount requests have. */
  private consumeFault(): void {
    if (this.faults.failCount === null) return;
    this.faults.failCount -= 1;
    if (this.faults.failCount <= 0) this.clearFaults();
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

  // ---- routing -------------------------------------------------------------------------------------

  private route(method: string, segs: string[]): { endpoint: HubEndpoint | null; repo?: RepoRef; rest: string[] } {
    const typeOf = (s: string): RepoType | null => (s === "models" ? "model" : s === "datasets" ? "dataset" : null);
    if (segs[0] === "api") {
      if (segs[1] === "repos" && segs[2] === "create" && segs.length === 3 && method === "POST") return { endpoint: "createRepo", rest: [] };
      const t = typeOf(segs[1] ?? "");
      if (t && segs.length >= 4) {
        const repo = { type: t, owner: segs[2], name: segs[3] };
        if (segs.length === 4 && (method === "GET" || method === "HEAD")) return { endpoint: "repoInfo", repo, rest: [] };
        const op = segs[4];
        const rest = segs.slice(5);
        if (op === "preupload" && method === "POST") return { endpoint: "preupload", repo, rest };
        if (op === "commit" && method === "POST") return { endpoint: "commit", repo, rest };
        if (op === "tree" && (method === "GET" || method === "HEAD")) return { endpoint: "list", repo, rest };
        if (op === "paths-info" && method === "POST") return { endpoint: "pathsInfo", repo, rest };
      }
      return { endpoint: null, rest: [] };
    }
    if (segs[0] === "__lfs" && segs[1] === "upload" && segs.length === 6 && method === "PUT") {
      const t = segs[2] === "model" || segs[2] === "dataset" ? (segs[2] as RepoType) : null;
      if (t) return { endpoint: "upload", repo: { type: t, owner: segs[3], name: segs[4] }, rest: [segs[5]] };
      return { endpoint: null, rest: [] };
    }
    let type: RepoType = "model";
    let s = segs;
    if (s[0] === "datasets") {
      type = "dataset";
      s = s.slice(1);
    }
    if (s.length === 6 && s[1].endsWith(".git") && s[2] === "info" && s[3] === "lfs" && s[4] === "objects" && s[5] === "batch" && method === "POST") {
      return { endpoint: "lfsBatch", repo: { type, owner: s[0], name: s[1].slice(0, -4) }, rest: [] };
    }
    if (s.length >= 5 && (s[2] === "resolve" || s[2] === "raw") && (method === "GET" || method === "HEAD")) {
      const filePath = s.slice(4).join("/");
      const endpoint: HubEndpoint = filePath === POINTER_PATH ? "pointerRead" : s[2] === "raw" ? "raw" : "resolve";
      return { endpoint, repo: { type, owner: s[0], name: s[1] }, rest: [s[2], s[3], ...s.slice(4)] };
    }
    return { endpoint: null, rest: [] };
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const method = req.method ?? "GET";
    const u = new URL(req.url ?? "/", "http://localhost");
    const entry = { method, path: u.pathname, status: 0 };
    this.requests.push(entry);
    res.on("finish", () => (entry.status = res.statusCode));
    res.on("close", () => {
      if (!entry.status) entry.status = res.headersSent ? res.statusCode : 0;
    });

    let segs: string[];
    try {
      segs = u.pathname.split("/").filter((x) => x !== "").map((x) => decodeURIComponent(x));
    } catch {
      await readBody(req).catch(() => undefined);
      return this.sendError(req, res, 400, "malformed URL");
    }
    const { endpoint, repo, rest } = this.route(method, segs);
    try {
      if (!endpoint) {
        await readBody(req);
        throw new HttpError(404, `no such endpoint: ${method} ${u.pathname}`);
      }
      if (repo && (!NAME_RE.test(repo.owner) || !NAME_RE.test(repo.name))) {
        await readBody(req);
        throw new HttpError(400, "invalid repo name");
      }
      // Auth: signed upload hrefs authorise themselves; everything else needs the bearer token.
      if (this.token && endpoint !== "upload") {
        const auth = req.headers.authorization ?? "";
        if (auth !== `Bearer ${this.token}`) {
          await readBody(req);
          throw new HttpError(401, "Invalid credentials in Authorization header");
        }
      }
      let faulted = false;
      const delay = this.faults.delayMs[endpoint];
      if (delay && delay > 0) {
        faulted = true;
        await this.sleep(delay);
        if (!this.server) return; // stopped while waiting
      }
      const forced = this.faults.status[endpoint];
      if (forced) {
        await readBody(req);
        this.consumeFault();
        throw new HttpError(forced, `injected fault: ${endpoint} answers ${forced}`);
      }
      if (faulted) this.consumeFault();

      switch (endpoint) {
        case "createRepo":
          return await this.createRepo(req, res);
        case "repoInfo":
          return await this.repoInfo(res, repo!);
        case "preupload":
          return await this.preupload(req, res, repo!, rest);
        case "lfsBatch":
          return await this.lfsBatch(req, res, repo!);
        case "upload":
          return await this.upload(req, res, repo!, rest[0], u.searchParams);
        case "commit":
          return await this.commit(req, res, repo!, rest);
        case "list":
          return await this.tree(req, res, repo!, rest, u);
        case "pathsInfo":
          return await this.pathsInfo(req, res, repo!, rest);
        case "resolve":
        case "raw":
        case "pointerRead":
          return await this.resolve(req, res, repo!, rest);
        default: {
          const never: never = endpoint;
          throw new Error(`unrouted endpoint ${String(never)}`);
        }
      }
    } catch (e) {
      if (e instanceof HttpError) return this.sendError(req, res, e.status, e.message, e.code);
      throw e;
    }
  }

  // ---- endpoints ----------------------------------------------------------------------------------

  private async createRepo(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const body = parseJson(await readBody(req));
    if (body.type !== undefined && body.type !== "model" && body.type !== "dataset") throw new HttpError(400, `unsupported repo type ${JSON.stringify(body.type)}`);
    const type: RepoType = body.type === "dataset" ? "dataset" : "model";
    const owner = body.organization;
    const name = body.name;
    if (typeof owner !== "string" || typeof name !== "string" || !NAME_RE.test(owner) || !NAME_RE.test(name)) {
      throw new HttpError(400, "createRepo needs {organization, name} made of letters, digits, '.', '_' or '-'");
    }
    const r: RepoRef = { type, owner, name };
    await this.withLock(this.repoDir(r), async () => {
      if (await this.readState(r)) throw new HttpError(409, "You already created this repo");
      await fsp.mkdir(path.join(this.repoDir(r), "objects"), { recursive: true });
      const ga = await this.putObject(r, Buffer.from(GITATTRIBUTES));
      await this.writeState(r, {
        commit: createHash("sha1").update(`${owner}/${name}/${Date.now()}/${Math.random()}`).digest("hex"),
        files: { ".gitattributes": { sha256: ga.sha256, size: ga.size, lfs: false, gitOid: ga.gitOid } },
      });
    });
    const prefix = type === "dataset" ? "datasets/" : "";
    this.sendJson(res, 200, { url: `${this.base}/${prefix}${owner}/${name}`, id: `${owner}/${name}`, name: `${owner}/${name}` });
  }

  private async repoInfo(res: http.ServerResponse, r: RepoRef): Promise<void> {
    const st = await this.mustState(r);
    this.sendJson(res, 200, { id: `${r.owner}/${r.name}`, _id: st.commit.slice(0, 24), private: false, sha: st.commit, likes: 0 });
  }

  private async preupload(req: http.IncomingMessage, res: http.ServerResponse, r: RepoRef, rest: string[]): Promise<void> {
    const body = parseJson(await readBody(req));
    await this.mustState(r, rest.join("/"));
    if (!Array.isArray(body.files)) throw new HttpError(400, "preupload needs {files: [...]}");
    const files = body.files.map((f: { path: unknown; size: unknown }) => {
      const p = checkRepoPath(f.path);
      const size = Number(f.size);
      const lfs = ALWAYS_LFS.test(p) || size > this.lfsThreshold;
      return { path: p, uploadMode: lfs ? "lfs" : "regular", shouldIgnore: false };
    });
    this.sendJson(res, 200, { files, commitOid: (await this.mustState(r)).commit });
  }

  private async lfsBatch(req: http.IncomingMessage, res: http.ServerResponse, r: RepoRef): Promise<void> {
    const body = parseJson(await readBody(req));
    await this.mustState(r);
    if (body.operation !== "upload" || !Array.isArray(body.objects)) throw new HttpError(400, "LFS batch: only {operation: 'upload', objects: [...]} is supported");
    const objects = body.objects.map((o: { oid: unknown; size: unknown }) => {
      const oid = String(o.oid);
      const size = Number(o.size);
      if (!/^[0-9a-f]{64}$/.test(oid) || !Number.isInteger(size) || size < 0) {
        return { oid, size, error: { code: 422, message: "oid must be a sha256 hex digest and size a non-negative integer" } };
      }
      const p = this.objectPath(r, oid);
      let have = false;
      try {
        have = fs.statSync(p).size === size;
      } catch {
        have = false;
      }
      // No `actions` = already stored. Never multipart (no chunk_size), never xet.
      return have ? { oid, size } : { oid, size, authenticated: true, actions: { upload: { href: this.signHref(r, oid, size), expires_in: 3600 } } };
    });
    this.sendJson(res, 200, { transfer: "basic", objects }, {}, "application/vnd.git-lfs+json");
  }

  private async upload(req: http.IncomingMessage, res: http.ServerResponse, r: RepoRef, oid: string, q: URLSearchParams): Promise<void> {
    let size: number;
    try {
      size = this.checkSignature(r, oid, q);
    } catch (e) {
      await readBody(req).catch(() => undefined);
      throw e;
    }
    const p = this.objectPath(r, oid);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    const tmp = `${p}.${randomBytes(4).toString("hex")}.upload`;
    const h = createHash("sha256");
    let n = 0;
    const counter = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        h.update(chunk);
        n += chunk.length;
        cb(null, chunk);
      },
    });
    try {
      await pipeline(req, counter, fs.createWriteStream(tmp));
      const got = h.digest("hex");
      // The client never checks what it sent; the store must (HUB-PROTOCOL.md).
      if (n !== size) throw new HttpError(400, `uploaded ${n} bytes for an object announced as ${size} bytes`);
      if (got !== oid) throw new HttpError(400, `uploaded bytes hash to sha256 ${got}, not the announced oid ${oid}`);
      await fsp.rename(tmp, p);
    } catch (e) {
      await fsp.rm(tmp, { force: true });
      throw e;
    }
    res.writeHead(200, { "Content-Length": 0, ETag: `"${oid}"` });
    res.end();
  }

  private async commit(req: http.IncomingMessage, res: http.ServerResponse, r: RepoRef, rest: string[]): Promise<void> {
    const raw = (await readBody(req)).toString("utf8");
    type Op = { kind: "add"; path: string; content?: Buffer; sha256?: string; size?: number } | { kind: "delete"; path: string } | { kind: "deleteFolder"; path: string };
    const ops: Op[] = [];
    let summary = "";
    for (const line of raw.split("\n")) {
      if (line.trim() === "") continue;
      let o: { key: string; value: any };
      try {
        o = JSON.parse(line);
      } catch {
        throw new HttpError(400, "commit body: a line is not JSON");
      }
      const v = o.value ?? {};
      switch (o.key) {
        case "header":
          summary = String(v.summary ?? "");
          break;
        case "file": {
          if (v.encoding !== "base64" || typeof v.content !== "string") throw new HttpError(400, "commit body: 'file' needs base64 content");
          ops.push({ kind: "add", path: checkRepoPath(v.path), content: Buffer.from(v.content, "base64") });
          break;
        }
        case "lfsFile": {
          if (v.algo !== "sha256" || !/^[0-9a-f]{64}$/.test(String(v.oid))) throw new HttpError(400, "commit body: 'lfsFile' needs algo sha256 and a hex oid");
          ops.push({ kind: "add", path: checkRepoPath(v.path), sha256: String(v.oid), size: Number(v.size) });
          break;
        }
        case "deletedFile":
          ops.push({ kind: "delete", path: checkRepoPath(v.path) });
          break;
        case "deletedFolder":
          ops.push({ kind: "deleteFolder", path: checkRepoPath(String(v.path).replace(/\/+$/, "")) });
          break;
        default:
          throw new HttpError(400, `commit body: unknown key ${JSON.stringify(o.key)}`);
      }
    }
    if (!summary) throw new HttpError(400, "commit needs a summary");
    const f = this.faults;
    if (f.failPointerWrite && ops.some((op) => op.path === POINTER_PATH)) {
      this.consumeFault();
      throw new HttpError(500, "injected fault: the commit touching latest.json failed");
    }
    const oid = await this.withLock(this.repoDir(r), async () => {
      const st = await this.mustState(r, rest.join("/"));
      const files = { ...st.files };
      let faulted = false;
      const ends = (p: string, list: string[]) => list.some((s) => p === s || p.endsWith(s));
      for (const op of ops) {
        if (op.kind === "delete") {
          if (!files[op.path]) throw new HttpError(404, `cannot delete ${op.path}: no such file`, "EntryNotFound");
          delete files[op.path];
          continue;
        }
        if (op.kind === "deleteFolder") {
          for (const k of Object.keys(files)) if (k.startsWith(op.path + "/")) delete files[k];
          continue;
        }
        if (ends(op.path, f.dropOnCommit)) {
          faulted = true; // "succeeds" without storing it
          continue;
        }
        let stored: StoredFile;
        if (op.content) {
          const o = await this.putObject(r, op.content);
          stored = { sha256: o.sha256, size: o.size, lfs: false, gitOid: o.gitOid };
        } else {
          const p = this.objectPath(r, op.sha256!);
          let size: number;
          try {
            size = (await fsp.stat(p)).size;
          } catch {
            throw new HttpError(422, `lfsFile ${op.path}: object ${op.sha256} was never uploaded`);
          }
          if (size !== op.size) throw new HttpError(422, `lfsFile ${op.path}: object ${op.sha256} holds ${size} bytes, commit says ${op.size}`);
          stored = { sha256: op.sha256!, size, lfs: true, gitOid: gitBlobOid(Buffer.from(lfsPointerText(op.sha256!, size))) };
        }
        if (ends(op.path, f.corruptOnCommit)) {
          faulted = true;
          const bytes = Buffer.from(await fsp.readFile(this.objectPath(r, stored.sha256)));
          if (bytes.length === 0) bytes.writeUInt8(0, 0);
          else bytes[bytes.length >> 1] ^= 0xff;
          const o = await this.putObject(r, bytes.length ? bytes : Buffer.from([0]));
          stored = { sha256: o.sha256, size: o.size, lfs: stored.lfs, gitOid: stored.lfs ? gitBlobOid(Buffer.from(lfsPointerText(o.sha256, o.size))) : o.gitOid };
        }
        files[op.path] = stored;
      }
      for (const x of f.extraOnCommit) {
        faulted = true;
        const o = await this.putObject(r, Buffer.from(x.content));
        files[checkRepoPath(x.path)] = { sha256: o.sha256, size: o.size, lfs: false, gitOid: o.gitOid };
      }
      if (faulted) this.consumeFault();
      const commitOid = createHash("sha1").update(st.commit).update(summary).update(JSON.stringify(files)).update(String(Date.now())).digest("hex");
      await this.writeState(r, { commit: commitOid, files });
      return commitOid;
    });
    const prefix = r.type === "dataset" ? "datasets/" : "";
    this.sendJson(res, 200, { success: true, commitOid: oid, commitUrl: `${this.base}/${prefix}${r.owner}/${r.name}/commit/${oid}`, hookOutput: "" });
  }

  private entries(st: RepoState, under: string, recursive: boolean): any[] {
    const dirs = new Map<string, true>();
    const out: any[] = [];
    const pre = under ? under + "/" : "";
    for (const [p, f] of Object.entries(st.files)) {
      if (!p.startsWith(pre)) continue;
      const rel = p.slice(pre.length);
      const parts = rel.split("/");
      if (!recursive && parts.length > 1) {
        dirs.set(pre + parts[0], true);
        continue;
      }
      for (let i = 1; i < parts.length; i++) dirs.set(pre + parts.slice(0, i).join("/"), true);
      out.push(this.fileEntry(p, f));
    }
    for (const d of dirs.keys()) out.push({ type: "directory", path: d, size: 0, oid: createHash("sha1").update(`tree ${d}`).digest("hex") });
    out.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
    return out;
  }

  private fileEntry(p: string, f: StoredFile): any {
    const e: any = { type: "file", path: p, size: f.size, oid: f.gitOid };
    if (f.lfs) e.lfs = { oid: f.sha256, size: f.size, pointerSize: Buffer.byteLength(lfsPointerText(f.sha256, f.size)) };
    return e;
  }

  private async tree(_req: http.IncomingMessage, res: http.ServerResponse, r: RepoRef, rest: string[], u: URL): Promise<void> {
    const [rev, ...p] = rest;
    const st = await this.mustState(r, rev ?? "main");
    const under = p.join("/").replace(/\/+$/, "");
    if (under && !Object.keys(st.files).some((k) => k.startsWith(under + "/"))) {
      if (st.files[under]) throw new HttpError(400, `${under} is a file, not a folder`);
      throw new HttpError(404, `${under} does not exist on "main"`, "EntryNotFound");
    }
    const recursive = u.searchParams.get("recursive") === "true" || u.searchParams.get("recursive") === "1";
    const all = this.entries(st, under, recursive);
    const cursor = Number(u.searchParams.get("cursor") ?? "0") || 0;
    const page = all.slice(cursor, cursor + this.pageSize);
    const headers: http.OutgoingHttpHeaders = {};
    if (cursor + this.pageSize < all.length) {
      const next = new URL(`${this.base}${u.pathname}`);
      next.search = u.search;
      next.searchParams.set("cursor", String(cursor + this.pageSize));
      headers["Link"] = `<${next.toString()}>; rel="next"`;
    }
    this.sendJson(res, 200, page, headers);
  }

  private async pathsInfo(req: http.IncomingMessage, res: http.ServerResponse, r: RepoRef, rest: string[]): Promise<void> {
    const body = parseJson(await readBody(req));
    const st = await this.mustState(r, rest.join("/"));
    if (!Array.isArray(body.paths)) throw new HttpError(400, "paths-info needs {paths: [...]}");
    const out: any[] = [];
    for (const raw of body.paths) {
      const p = String(raw).replace(/\/+$/, "");
      if (st.files[p]) out.push(this.fileEntry(p, st.files[p]));
      else if (Object.keys(st.files).some((k) => k.startsWith(p + "/"))) out.push({ type: "directory", path: p, size: 0, oid: createHash("sha1").update(`tree ${p}`).digest("hex") });
    }
    this.sendJson(res, 200, out);
  }

  private async resolve(req: http.IncomingMessage, res: http.ServerResponse, r: RepoRef, rest: string[]): Promise<void> {
    const [kind, rev, ...p] = rest;
    const st = await this.mustState(r, rev);
    const filePath = p.join("/");
    const f = st.files[filePath];
    if (!f) throw new HttpError(404, `Entry not found: ${filePath}`, "EntryNotFound");
    const raw = kind === "raw" && f.lfs;
    let total = raw ? Buffer.byteLength(lfsPointerText(f.sha256, f.size)) : f.size;
    const trunc = !raw && this.faults.truncateDownload.some((s) => filePath === s || filePath.endsWith(s));
    const mode = this.faults.truncateMode;
    if (trunc && mode === "short") total = total >> 1;

    const range = req.headers.range;
    let start = 0;
    let end = total - 1; // inclusive
    let status = 200;
    if (range) {
      const m = /^bytes=(\d*)-(\d*)$/.exec(range.trim());
      if (!m || (m[1] === "" && m[2] === "")) throw new HttpError(416, `unsupported Range ${range}`);
      if (m[1] === "") {
        start = Math.max(0, total - Number(m[2]));
      } else {
        start = Number(m[1]);
        if (m[2] !== "") end = Math.min(end, Number(m[2]));
      }
      if (total === 0) {
        // An empty file answers a range probe with 200 and its size, not 416 (HUB-PROTOCOL.md).
        start = 0;
        end = -1;
      } else if (start >= total || start > end) {
        res.writeHead(416, { "Content-Range": `bytes */${total}`, "Content-Type": "text/plain" });
        res.end();
        return;
      } else status = 206;
    }
    const len = end - start + 1;
    const headers: http.OutgoingHttpHeaders = {
      "Content-Type": "application/octet-stream",
      "Content-Length": len,
      "Accept-Ranges": "bytes",
      ETag: `"${raw ? f.gitOid : f.lfs ? f.sha256 : f.gitOid}"`,
      "X-Repo-Commit": st.commit,
    };
    if (status === 206) headers["Content-Range"] = `bytes ${start}-${end}/${total}`;
    else if (range && total === 0) headers["Content-Range"] = "bytes */0";
    if (f.lfs && !raw) {
      headers["X-Linked-ETag"] = `"${f.sha256}"`;
      headers["X-Linked-Size"] = f.size;
    }
    // A one-byte probe (bytes=0-0) is what the client sizes the file with; a cut applies to real reads.
    const probe = status === 206 && start === 0 && end === 0;
    if (trunc && (mode === "short" || !probe)) this.consumeFault();
    res.writeHead(status, headers);
    if (req.method === "HEAD" || len <= 0) {
      res.end();
      return;
    }
    if (raw) {
      res.end(Buffer.from(lfsPointerText(f.sha256, f.size)).subarray(start, end + 1));
      return;
    }
    const cut = trunc && mode === "cut" && !probe;
    const sendEnd = cut ? start + Math.max(0, (len >> 1) - 1) : end;
    const stream = fs.createReadStream(this.objectPath(r, f.sha256), { start, end: sendEnd });
    stream.on("error", () => res.destroy());
    if (cut) {
      stream.on("end", () => {
        // Fewer bytes than Content-Length announced, then the connection drops.
        res.socket?.destroy();
      });
      stream.pipe(res, { end: false });
    } else {
      stream.pipe(res);
    }
  }
}
