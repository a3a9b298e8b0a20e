/**
 * HubClient — everything the trainer needs from a Hub, behind one small interface, implemented with
 * `@huggingface/hub` only (no hand-written Hub HTTP). The one piece of HTTP plumbing here is the
 * `fetch` every client call is given: it adds per-request timeouts and remembers the status and
 * `X-Error-Code` of the last answer, because the client's `HubApiError` drops the header that tells
 * "file missing" (EntryNotFound) from "repo missing" (RepoNotFound) from "lookup failed" (R2).
 */
import * as fs from "node:fs";
import * as fsp from "node:fs/promises";
import * as path from "node:path";
import { createHash, randomBytes } from "node:crypto";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as NodeReadableStream } from "node:stream/web";
import {
  commit,
  createRepo,
  datasetInfo,
  downloadFile,
  fileDownloadInfo,
  HubApiError,
  listFiles,
  modelInfo,
  repoExists as hubRepoExists,
} from "@huggingface/hub";
import type { CommitOperation, RepoDesignation } from "@huggingface/hub";
import { UserError } from "../errors";
import { hubUrlProblem, isRepoId, isRepoPath, REPO_ID_RULE, REPO_PATH_RULE } from "./address";
import { hubTokenProblem } from "./token";
import {
  ConcurrentWriterError,
  describeHubError,
  HubLookupError,
  isNotAHubAnswer,
  NotAHubError,
  RepoMissingError,
  scrubError,
} from "./hub-errors";
import { TransferProgress } from "./transfer";
import { POINTER_FILE } from "../checkpoint/names";
import { parsePointer, pointerBytes, validatePointer, type Pointer } from "../checkpoint/state";
export type { Pointer };

export interface RemoteFile {
  path: string;
  size: number;
  /** LFS oid; for a regular file the sha256 of its downloaded bytes (or the server's oid when that is a sha256). */
  sha256: string | null;
  /** The git blob oid the Hub reports (sha1 for regular files, of the pointer for LFS files). */
  gitOid?: string;
  lfs?: boolean;
}

export interface HubClient {
  readonly repo: string;
  readonly repoType: "dataset" | "model";
  repoExists(): Promise<boolean>;
  /**
   * Creates the repo when it does not exist, private when `private` is true (public when false; the Hub's own
   * default when absent). An existing repo is left as it is: its visibility is never changed.
   */
  ensureRepo(o?: { private?: boolean }): Promise<{ created: boolean }>;
  /** Whether the repo is private, as the Hub's repo info says (null when it does not say). */
  isPrivate(): Promise<boolean | null>;
  /** One commit: every file under localDir lands under pathInRepo, and remote files under pathInRepo
   *  that are not in localDir are deleted in the same commit (the folder mirrors the local one). */
  uploadFolder(localDir: string, pathInRepo: string, message: string, o?: CommitOptions): Promise<string | null>;
  /** Files under prefix (whole repo when absent). Throws RepoMissingError when the repo is absent.
   *  A prefix that does not exist lists as []. `hashRegular: false` skips downloading regular files
   *  to hash them (their sha256 is then null unless the server's oid is one). */
  list(prefix?: string, o?: { hashRegular?: boolean }): Promise<RemoteFile[]>;
  /** null ONLY for EntryNotFound; RepoMissingError for RepoNotFound; anything else throws. */
  download(pathInRepo: string): Promise<Buffer | null>;
  downloadFolder(
    pathInRepo: string,
    destDir: string,
    o?: { progress?: (line: string) => void },
  ): Promise<{ files: number; bytes: number; seconds: number }>;
  /** latest.json; null only when the file is missing (EntryNotFound); RepoMissingError when the repo is. */
  readPointer(): Promise<Pointer | null>;
  /** Commit latest.json, read it back and compare; a mismatch throws. Returns the commit oid. */
  writePointer(p: Pointer, o?: CommitOptions): Promise<string | null>;
  /** The repo's head commit now (null when the Hub does not say). */
  head(): Promise<string | null>;
  /**
   * K8: the head this run last saw or made. Once set (by `followHead`), every commit names it as its
   * parent revision, so a commit by anyone else in between is answered 412 and surfaces as
   * ConcurrentWriterError naming the other writer's commit.
   */
  readonly knownHead: string | null;
  /** Start naming parents: remember `head` (a commit this run knows it made), or read the head now. */
  followHead(head?: string | null): Promise<string | null>;
}

export interface CommitOptions {
  /**
   * This is a retry: the same commit may already have landed (an earlier attempt's answer was lost).
   * On 412 the repo is then checked for exactly what the commit would write; if it holds that, the
   * head is adopted as this run's own commit instead of being reported as another writer's.
   */
  retry?: boolean;
  /** Where a progress line goes, at the progress rhythm (progress.ts) while the upload runs (none for a quick one). */
  progress?: (line: string) => void;
}

const NO_TOKEN = "HF_TOKEN is not set, so no token was sent, and this Hub wants one";

interface LandedCheck {
  alreadyLanded?: () => Promise<boolean>;
}

export interface HubClientOptions {
  hubUrl: string;
  repo: string;
  repoType: "dataset" | "model";
  /** Defaults to process.env.HF_TOKEN. Never logged, never put in an error. */
  token?: string;
  fetch?: typeof fetch;
  /** Per request: the longest wait for the answer's headers (plus 1 s per MiB sent), and the longest
   *  silence while its body streams. Default 60 000. */
  timeoutMs?: number;
  /** Where listings and downloads read (a branch, tag or commit; default main). A client reading elsewhere than
   *  main makes no commit (generate's hf://…@revision models). */
  revision?: string;
}

const MIN_UPLOAD_BYTES_PER_MS = (1024 * 1024) / 1000; // 1 MiB/s budget for request bodies

/** What one client call saw last; the client's errors lose X-Error-Code, this keeps it. */
interface Tracker {
  fetch: typeof fetch;
  status: number | null;
  errorCode: string | null;
  repoCommit: string | null;
}

function isHex(s: unknown, n: number): s is string {
  return typeof s === "string" && s.length === n && /^[0-9a-f]+$/.test(s);
}

/** A repo path (address.ts's rule), after turning "\\" into "/" and dropping a leading or trailing "/". */
function normRepoPath(p: string, what: string): string {
  const q = p.replace(/\\/g, "/").replace(/^\/+|\/+$/g, "");
  if (!isRepoPath(q)) throw new TypeError(`${what} must be ${REPO_PATH_RULE}, got ${JSON.stringify(p)}`);
  return q;
}

/** Files under dir, recursively, as paths relative to it with '/' separators, sorted. */
export async function walkFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  async function rec(rel: string): Promise<void> {
    const entries = await fsp.readdir(path.join(dir, rel), { withFileTypes: true });
    for (const e of entries) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) await rec(r);
      else if (e.isFile()) out.push(r);
      else if (e.isSymbolicLink()) {
        const st = await fsp.stat(path.join(dir, r));
        if (st.isFile()) out.push(r);
        else
          throw new Error(
            `${path.join(dir, r)} is a link to something that is not a file; a checkpoint folder holds plain files`,
          );
      }
    }
  }
  await rec("");
  return out.sort();
}

class LiveHubClient implements HubClient {
  readonly repo: string;
  readonly repoType: "dataset" | "model";
  private readonly hubUrl: string;
  private readonly token: string | undefined;
  private readonly baseFetch: typeof fetch;
  private readonly timeoutMs: number;
  private readonly designation: RepoDesignation;
  private readonly revision: string;

  constructor(o: HubClientOptions) {
    if (!o || typeof o.hubUrl !== "string" || hubUrlProblem(o.hubUrl) !== null)
      throw new TypeError(`createHubClient: hubUrl must be an http(s) URL, got ${JSON.stringify(o?.hubUrl)}`);
    // The flags that name a repo are checked where they are read (config.ts, data/hub-input.ts, generate.ts).
    if (!isRepoId(o.repo))
      throw new TypeError(
        `createHubClient: repo must be a Hub repo id (${REPO_ID_RULE}), got ${JSON.stringify(o.repo)}`,
      );
    if (o.repoType !== "dataset" && o.repoType !== "model")
      throw new UserError("K5", `--hub-repo-type ${JSON.stringify(o.repoType)} is neither "dataset" nor "model"`);
    const token = o.token !== undefined ? o.token : process.env.HF_TOKEN;
    // The value itself is never shown, not even in part. A run checks HF_TOKEN at its start (token.ts).
    const problem = hubTokenProblem(token);
    if (problem) throw new UserError("K5", `${problem}; set HF_TOKEN to a Hugging Face access token`);
    this.token = token || undefined;
    this.hubUrl = o.hubUrl.replace(/\/+$/, "");
    this.repo = o.repo;
    this.repoType = o.repoType;
    this.baseFetch = o.fetch ?? fetch;
    this.timeoutMs = o.timeoutMs ?? 60_000;
    if (!(this.timeoutMs > 0)) throw new TypeError(`createHubClient: timeoutMs must be > 0, got ${o.timeoutMs}`);
    this.designation = { type: this.repoType, name: this.repo };
    this.revision = o.revision ?? "main";
  }

  private get creds(): { accessToken: string } {
    // The client's types want a token; without one every call it makes is unauthenticated.
    return { accessToken: this.token as string };
  }

  /** A fetch for one client call: timeouts, and the status / X-Error-Code of the last answer. */
  private tracker(onSent?: (bytes: number) => void): Tracker {
    const t: Tracker = { fetch: undefined as unknown as typeof fetch, status: null, errorCode: null, repoCommit: null };
    const base = this.baseFetch;
    const timeoutMs = this.timeoutMs;
    t.fetch = (async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
      const ctl = new AbortController();
      const signal = init?.signal ? AbortSignal.any([ctl.signal, init.signal]) : ctl.signal;
      const body = init?.body;
      const sent = body instanceof Blob ? body.size : typeof body === "string" ? body.length : 0;
      const budget = timeoutMs + sent / MIN_UPLOAD_BYTES_PER_MS;
      const method = init?.method ?? "GET";
      const url = String(input instanceof Request ? input.url : input).split("?")[0];
      const where = `${method} ${url}`;
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        ctl.abort(new HubLookupError(`Hub request timed out after ${Math.round(budget)} ms: ${where}`, null));
      }, budget);
      timer.unref();
      let res: Response;
      try {
        res = await base(input, { ...init, signal });
      } catch (e) {
        if (timedOut) throw new HubLookupError(`Hub request timed out after ${Math.round(budget)} ms: ${where}`, null);
        throw e;
      } finally {
        clearTimeout(timer);
      }
      t.status = res.status;
      const type = res.headers.get("content-type");
      if (isNotAHubAnswer(res.url || url, method, res.status, type)) {
        await res.body?.cancel().catch(() => undefined);
        throw new NotAHubError(where, res.status, type); // K9: a web server, not a Hub; no retry helps
      }
      if (res.ok && body instanceof Blob) onSent?.(sent); // an LFS upload (or one part of it) went through
      t.errorCode = res.headers.get("x-error-code");
      t.repoCommit = res.headers.get("x-repo-commit") ?? t.repoCommit;
      if (!res.body) return res;
      // Body watchdog, armed only while the reader waits for the next chunk: a server that goes
      // silent mid-body fails the read, while a slow consumer (backpressure) never trips it.
      const reader = res.body.getReader();
      const watched = new ReadableStream<Uint8Array>(
        {
          async pull(c) {
            const idle = setTimeout(
              () => ctl.abort(new HubLookupError(`Hub response body stalled for ${timeoutMs} ms: ${where}`, null)),
              timeoutMs,
            );
            idle.unref();
            try {
              const { done, value } = await reader.read();
              if (done) c.close();
              else c.enqueue(value);
            } finally {
              clearTimeout(idle);
            }
          },
          cancel(reason) {
            return reader.cancel(reason);
          },
        },
        { highWaterMark: 0 },
      );
      const out = new Response(watched, { status: res.status, statusText: res.statusText, headers: res.headers });
      Object.defineProperty(out, "url", { value: res.url });
      return out;
    }) as typeof fetch;
    return t;
  }

  /** Runs one operation; errors leave with the token scrubbed out of them. */
  private async guard<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      throw this.withTokenHint(scrubError(e, this.token));
    }
  }

  /** A 401 while no token was sent is not a rejected token: say that HF_TOKEN is not set and how to set it. */
  private withTokenHint(e: unknown): unknown {
    if (this.token || !(e instanceof Error)) return e;
    const status = e instanceof HubApiError ? e.statusCode : (e as { status?: unknown }).status;
    if (status === 401 && !e.message.includes(NO_TOKEN))
      e.message += ` (${NO_TOKEN}: export HF_TOKEN=<a token with write access to ${this.repo}> and run again)`;
    return e;
  }

  repoExists(): Promise<boolean> {
    return this.guard(async () => {
      const t = this.tracker();
      const ok = await hubRepoExists({
        repo: this.designation,
        hubUrl: this.hubUrl,
        fetch: t.fetch,
        accessToken: this.token,
      });
      // The client maps 401 to "does not exist"; a rejected token proves nothing about the repo.
      if (!ok && t.status === 401) {
        if (!this.token)
          throw new HubLookupError(`the Hub answered 401 while checking whether ${this.repo} exists`, 401);
        throw new HubLookupError(
          `the Hub rejected the token (401) while checking whether ${this.repo} exists; check HF_TOKEN`,
          401,
        );
      }
      return ok;
    });
  }

  ensureRepo(o: { private?: boolean } = {}): Promise<{ created: boolean }> {
    return this.guard(async () => {
      if (await this.repoExists()) return { created: false };
      const t = this.tracker();
      try {
        await createRepo({
          repo: this.designation,
          hubUrl: this.hubUrl,
          fetch: t.fetch,
          ...this.creds,
          ...(o.private === undefined ? {} : { private: o.private }),
        });
        return { created: true };
      } catch (e) {
        if (e instanceof HubApiError && e.statusCode === 409) return { created: false }; // created meanwhile
        throw e;
      }
    });
  }

  uploadFolder(localDir: string, pathInRepo: string, message: string, o: CommitOptions = {}): Promise<string | null> {
    return this.guard(async () => {
      const prefix = normRepoPath(pathInRepo, "pathInRepo");
      const rels = await walkFiles(localDir);
      if (rels.length === 0) throw new Error(`nothing to upload: ${localDir} holds no files`);
      const wanted = new Set(rels.map((r) => `${prefix}/${r}`));
      const ops: CommitOperation[] = [];
      for (const r of rels) {
        // A file-backed Blob: the client hashes and uploads it by streaming from disk.
        const content = await fs.openAsBlob(path.join(localDir, r));
        ops.push({ operation: "addOrUpdate", path: `${prefix}/${r}`, content });
      }
      for (const f of await this.list(prefix, { hashRegular: false })) {
        if (!wanted.has(f.path)) ops.push({ operation: "delete", path: f.path });
      }
      const landed = async (): Promise<boolean> => {
        const remote = await this.list(prefix);
        if (remote.length !== rels.length) return false;
        for (const f of remote) {
          const rel = f.path.slice(prefix.length + 1);
          if (!rels.includes(rel)) return false;
          const p = path.join(localDir, ...rel.split("/"));
          if ((await fsp.stat(p)).size !== f.size) return false;
          const h = createHash("sha256");
          for await (const c of fs.createReadStream(p)) h.update(c as Buffer);
          if (h.digest("hex") !== f.sha256) return false;
        }
        return true;
      };
      let total = 0;
      for (const r of rels) total += (await fsp.stat(path.join(localDir, r))).size;
      const progress = new TransferProgress(`uploading ${prefix}/ (${rels.length} files)`, total, o.progress);
      try {
        return await this.commitOps(
          ops,
          message,
          `the commit of ${prefix}/`,
          o.retry ? { alreadyLanded: landed } : {},
          (n) => progress.add(n),
        );
      } finally {
        progress.stop();
      }
    });
  }

  private knownHeadValue: string | null = null;
  get knownHead(): string | null {
    return this.knownHeadValue;
  }

  /** One commit, naming the known head as its parent (K8); 412 -> ConcurrentWriterError. */
  private async commitOps(
    ops: CommitOperation[],
    title: string,
    what: string,
    o: LandedCheck,
    onSent?: (bytes: number) => void,
  ): Promise<string | null> {
    if (this.revision !== "main")
      throw new TypeError(`createHubClient: a client reading ${this.repo} at ${this.revision} makes no commit`);
    const parent = this.knownHeadValue;
    const t = this.tracker(onSent);
    try {
      const r = await commit({
        repo: this.designation,
        operations: ops,
        title,
        hubUrl: this.hubUrl,
        fetch: t.fetch,
        ...this.creds,
        ...(parent ? { parentCommit: parent } : {}),
      });
      const oid = r?.commit?.oid ?? null;
      if (parent !== null) this.knownHeadValue = oid ?? (await this.head());
      return oid;
    } catch (e) {
      if (!(e instanceof HubApiError && e.statusCode === 412) || parent === null) throw e;
      const other = await this.head().catch(() => null);
      if (o.alreadyLanded && (await o.alreadyLanded().catch(() => false))) {
        // Our own earlier attempt landed and its answer was lost: that head is ours.
        this.knownHeadValue = other;
        return other;
      }
      throw new ConcurrentWriterError(this.repo, parent, other, what);
    }
  }

  async followHead(head?: string | null): Promise<string | null> {
    this.knownHeadValue = head ?? (await this.head());
    return this.knownHeadValue;
  }

  isPrivate(): Promise<boolean | null> {
    return this.guard(async () => {
      const t = this.tracker();
      const q = { name: this.repo, hubUrl: this.hubUrl, fetch: t.fetch, accessToken: this.token };
      const info = this.repoType === "dataset" ? await datasetInfo(q) : await modelInfo(q);
      const p = (info as { private?: unknown }).private;
      return typeof p === "boolean" ? p : null;
    });
  }

  head(): Promise<string | null> {
    return this.guard(async () => {
      // The Hub's repo info at revision main carries its sha; a Hub that does not serve that route
      // still stamps every file it serves with X-Repo-Commit.
      const t = this.tracker();
      try {
        const info =
          this.repoType === "dataset"
            ? await datasetInfo({
                name: this.repo,
                revision: "main",
                additionalFields: ["sha"],
                hubUrl: this.hubUrl,
                fetch: t.fetch,
                accessToken: this.token,
              })
            : await modelInfo({
                name: this.repo,
                revision: "main",
                additionalFields: ["sha"],
                hubUrl: this.hubUrl,
                fetch: t.fetch,
                accessToken: this.token,
              });
        const sha = (info as { sha?: unknown }).sha;
        if (typeof sha === "string" && sha !== "") return sha;
      } catch (e) {
        if (
          !(e instanceof HubApiError && (e.statusCode === 404 || e.statusCode === 400 || e.statusCode === 405)) ||
          t.errorCode === "RepoNotFound"
        )
          throw e;
      }
      for (const p of [POINTER_FILE, ".gitattributes"]) {
        const t2 = this.tracker();
        const info = await fileDownloadInfo({
          repo: this.designation,
          path: p,
          hubUrl: this.hubUrl,
          fetch: t2.fetch,
          accessToken: this.token,
        });
        if (info && t2.repoCommit) return t2.repoCommit;
      }
      return null;
    });
  }

  list(prefix?: string, o?: { hashRegular?: boolean }): Promise<RemoteFile[]> {
    return this.guard(async () => {
      const p = prefix === undefined || prefix === "" ? undefined : normRepoPath(prefix, "prefix");
      const t = this.tracker();
      const out: RemoteFile[] = [];
      try {
        for await (const e of listFiles({
          repo: this.designation,
          recursive: true,
          path: p,
          revision: this.revision,
          hubUrl: this.hubUrl,
          fetch: t.fetch,
          accessToken: this.token,
        })) {
          if (e.type !== "file") continue;
          const sha = e.lfs?.oid ?? (isHex(e.oid, 64) ? e.oid : null);
          out.push({ path: e.path, size: e.lfs?.size ?? e.size, sha256: sha, gitOid: e.oid, lfs: !!e.lfs });
        }
      } catch (e) {
        if (e instanceof HubApiError && e.statusCode === 404 && t.errorCode === "RepoNotFound")
          throw new RepoMissingError(this.repo);
        if (e instanceof HubApiError && e.statusCode === 404 && t.errorCode === "EntryNotFound" && p !== undefined)
          return [];
        throw e;
      }
      if (o?.hashRegular !== false) {
        for (const f of out) {
          if (f.sha256 !== null) continue;
          const b = await this.download(f.path);
          if (b === null)
            throw new Error(`${f.path} was listed on ${this.repo} but cannot be downloaded (EntryNotFound)`);
          f.sha256 = createHash("sha256").update(b).digest("hex");
        }
      }
      return out.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
    });
  }

  /** The client's Blob for a file, or null for EntryNotFound. */
  private async blobOf(pathInRepo: string): Promise<Blob | null> {
    const t = this.tracker();
    try {
      return await downloadFile({
        repo: this.designation,
        path: normRepoPath(pathInRepo, "path"),
        revision: this.revision,
        hubUrl: this.hubUrl,
        fetch: t.fetch,
        accessToken: this.token,
      });
    } catch (e) {
      if (e instanceof HubApiError && e.statusCode === 404 && t.errorCode === "RepoNotFound")
        throw new RepoMissingError(this.repo);
      throw e;
    }
  }

  download(pathInRepo: string): Promise<Buffer | null> {
    return this.guard(async () => {
      const blob = await this.blobOf(pathInRepo);
      if (blob === null) return null;
      const b = Buffer.from(await blob.arrayBuffer());
      if (b.length !== blob.size)
        throw new Error(`download of ${pathInRepo} from ${this.repo} is short: got ${b.length} of ${blob.size} bytes`);
      return b;
    });
  }

  downloadFolder(
    pathInRepo: string,
    destDir: string,
    o: { progress?: (line: string) => void } = {},
  ): Promise<{ files: number; bytes: number; seconds: number }> {
    let progress: TransferProgress | null = null;
    return this.guard(async () => {
      const t0 = performance.now();
      const prefix = normRepoPath(pathInRepo, "pathInRepo");
      const files = await this.list(prefix, { hashRegular: false });
      if (files.length === 0) throw new Error(`nothing to download: ${this.repo} holds no files under ${prefix}/`);
      await fsp.mkdir(destDir, { recursive: true });
      progress = new TransferProgress(
        `downloading ${prefix}/ (${files.length} files)`,
        files.reduce((a, f) => a + f.size, 0),
        o.progress,
      );
      const moved = progress;
      let bytes = 0;
      for (const f of files) {
        const rel = normRepoPath(f.path.slice(prefix.length + 1), "file path");
        const dest = path.join(destDir, ...rel.split("/"));
        await fsp.mkdir(path.dirname(dest), { recursive: true });
        const blob = await this.blobOf(f.path);
        if (blob === null)
          throw new Error(`${f.path} was listed on ${this.repo} but cannot be downloaded (EntryNotFound)`);
        const tmp = `${dest}.${randomBytes(4).toString("hex")}.part`;
        const sha256 = createHash("sha256");
        const git = createHash("sha1").update(`blob ${f.size}\0`);
        let n = 0;
        const counter = new Transform({
          transform(chunk: Buffer, _enc, cb) {
            sha256.update(chunk);
            git.update(chunk);
            n += chunk.length;
            moved.add(chunk.length);
            cb(null, chunk);
          },
        });
        try {
          await pipeline(
            Readable.fromWeb(blob.stream() as unknown as NodeReadableStream<Uint8Array>),
            counter,
            fs.createWriteStream(tmp),
          );
        } catch (e) {
          await fsp.rm(tmp, { force: true });
          // WebBlob.stream() aborts with a bare string; say which file, and keep the original.
          throw new Error(`download of ${f.path} failed: ${e instanceof Error ? describeHubError(e) : String(e)}`, {
            cause: e,
          });
        }
        const got = sha256.digest("hex");
        const gitGot = git.digest("hex");
        const bad =
          n !== f.size
            ? `${n} bytes where the listing says ${f.size}`
            : f.sha256 !== null && got !== f.sha256
              ? `sha256 ${got} where the listing says ${f.sha256}`
              : !f.lfs && isHex(f.gitOid, 40) && gitGot !== f.gitOid
                ? `git oid ${gitGot} where the listing says ${f.gitOid}`
                : null;
        if (bad) {
          await fsp.rm(tmp, { force: true });
          throw new Error(`download of ${f.path} from ${this.repo} is not what the Hub lists: ${bad}`);
        }
        await fsp.rename(tmp, dest);
        bytes += n;
      }
      return { files: files.length, bytes, seconds: (performance.now() - t0) / 1000 };
    }).finally(() => progress?.stop());
  }

  readPointer(): Promise<Pointer | null> {
    return this.guard(async () => {
      const b = await this.download(POINTER_FILE);
      if (b === null) return null;
      return parsePointer(b, `${POINTER_FILE} on ${this.repo}`);
    });
  }

  writePointer(p: Pointer, o: CommitOptions = {}): Promise<string | null> {
    return this.guard(async () => {
      const want = validatePointer(p, "pointer to write");
      const body = pointerBytes(want);
      const same = (got: Pointer | null) =>
        got !== null && (Object.keys(want) as (keyof Pointer)[]).every((k) => got[k] === want[k]);
      const oid = await this.commitOps(
        [{ operation: "addOrUpdate", path: POINTER_FILE, content: new Blob([body]) }],
        `latest.json -> ${want.path_in_repo} (step ${want.step})`,
        `the write of latest.json (-> ${want.path_in_repo})`,
        o.retry ? { alreadyLanded: async () => same(await this.readPointer()) } : {},
      );
      const got = await this.readPointer();
      if (!same(got)) {
        throw new Error(
          `${POINTER_FILE} on ${this.repo} reads back as ${JSON.stringify(got)} after writing ${JSON.stringify(want)}`,
        );
      }
      return oid;
    });
  }
}

export function createHubClient(o: HubClientOptions): HubClient {
  return new LiveHubClient(o);
}
