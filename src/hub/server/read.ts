/** Endpoints that read a repo at any revision: info, whoami, commits, tree, paths-info, file reads. */
import type * as http from "node:http";
import * as fs from "node:fs";
import { HttpError, parseJson, readBody, sendJson } from "./http";
import type { HubContext } from "./context";
import type { HubToken } from "./auth";
import { lfsPointerText, repoId, type CommitRecord, type RepoRef, type StoredFile } from "./repo";
import { splitRevPath } from "./routes";
import { dirEntry, entries, fileEntry, isDir, lastCommit, type TreeEntry } from "./tree";

/** repoExists (`GET /api/{type}s/{name}`) and modelInfo / datasetInfo (`…/revision/{rev}`). */
export async function repoInfoEndpoint(
  ctx: HubContext,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
): Promise<void> {
  const { refs, commit } = await ctx.store.resolve(r, rest.join("/") || "main");
  sendJson(res, 200, {
    _id: createdId(refs.createdAt, r),
    id: repoId(r),
    author: r.owner,
    private: refs.private,
    sha: commit.id,
    lastModified: commit.date,
    createdAt: refs.createdAt,
    gated: false,
    disabled: false,
    downloads: 0,
    likes: 0,
    cardData: refs.license ? { license: refs.license } : {},
    siblings: Object.keys(commit.files)
      .sort()
      .map((rfilename) => ({ rfilename })),
  });
}

/** A stable 24-hex id for the repo, like the real Hub's Mongo ids. */
function createdId(createdAt: string, r: RepoRef): string {
  return Buffer.from(`${createdAt}${repoId(r)}`)
    .toString("hex")
    .slice(0, 24)
    .padEnd(24, "0");
}

export function whoamiEndpoint(res: http.ServerResponse, who: HubToken | null): void {
  if (!who) throw new HttpError(401, "Invalid credentials in Authorization header");
  const name = who.name ?? "local";
  sendJson(res, 200, {
    type: "user",
    id: Buffer.from(name).toString("hex").slice(0, 24).padEnd(24, "0"),
    name,
    fullname: name,
    email: null,
    emailVerified: false,
    isPro: false,
    orgs: [],
    canPay: false,
    avatarUrl: "",
    periodEnd: null,
    billingMode: "postpaid",
    auth: {
      type: "access_token",
      accessToken: { displayName: name, role: who.role, createdAt: new Date(0).toISOString() },
    },
  });
}

/** listCommits / countCommits: newest first along first parents, `?limit=&p=` pages, X-Total-Count. */
export async function commitsEndpoint(
  ctx: HubContext,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
  u: URL,
): Promise<void> {
  const { commit } = await ctx.store.resolve(r, rest.join("/") || "main");
  const chain = await ctx.store.history(r, commit.id);
  const limit = Math.max(1, Math.min(1000, Number(u.searchParams.get("limit") ?? "50") || 50));
  const page = Math.max(0, Number(u.searchParams.get("p") ?? "0") || 0);
  const slice = chain.slice(page * limit, (page + 1) * limit);
  const headers: http.OutgoingHttpHeaders = { "X-Total-Count": String(chain.length) };
  if ((page + 1) * limit < chain.length) {
    const next = new URL(`${ctx.base()}${u.pathname}${u.search}`);
    next.searchParams.set("p", String(page + 1));
    headers.Link = `<${next.toString()}>; rel="next"`;
  }
  const out = slice.map((c) => ({
    id: c.id,
    title: c.title,
    message: c.message,
    authors: [{ user: "local", avatar: "" }],
    date: c.date,
  }));
  sendJson(res, 200, out, headers);
}

function withLastCommit(e: TreeEntry, chain: CommitRecord[]): TreeEntry {
  return { ...e, lastCommit: lastCommit(chain, e.path) };
}

export async function treeEndpoint(
  ctx: HubContext,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
  u: URL,
): Promise<void> {
  const { rev, path: p } = splitRevPath(rest);
  const { commit } = await ctx.store.resolve(r, rev);
  const under = p.join("/").replace(/\/+$/, "");
  if (under && !isDir(commit.files, under)) {
    if (commit.files[under]) throw new HttpError(400, `${under} is a file, not a folder`);
    throw new HttpError(404, `${under} does not exist on "${rev}"`, "EntryNotFound");
  }
  const recursive = ["true", "1"].includes(u.searchParams.get("recursive") ?? "");
  const all = entries(commit.files, under, recursive);
  const cursor = Number(u.searchParams.get("cursor") ?? "0") || 0;
  let page = all.slice(cursor, cursor + ctx.pageSize);
  if (u.searchParams.get("expand") === "true") {
    const chain = await ctx.store.history(r, commit.id);
    page = page.map((e) => withLastCommit(e, chain));
  }
  const headers: http.OutgoingHttpHeaders = {};
  if (cursor + ctx.pageSize < all.length) {
    const next = new URL(`${ctx.base()}${u.pathname}${u.search}`);
    next.searchParams.set("cursor", String(cursor + ctx.pageSize));
    headers.Link = `<${next.toString()}>; rel="next"`;
  }
  sendJson(res, 200, page, headers);
}

export async function pathsInfoEndpoint(
  ctx: HubContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
): Promise<void> {
  const body = parseJson(await readBody(req));
  const { commit } = await ctx.store.resolve(r, rest.join("/") || "main");
  if (!Array.isArray(body.paths)) throw new HttpError(400, "paths-info needs {paths: [...]}");
  const chain = body.expand === true ? await ctx.store.history(r, commit.id) : null;
  const out: TreeEntry[] = [];
  for (const raw of body.paths) {
    const p = String(raw).replace(/\/+$/, "");
    const e = commit.files[p]
      ? fileEntry(p, commit.files[p])
      : isDir(commit.files, p)
        ? dirEntry(p, commit.files)
        : null;
    if (e) out.push(chain ? withLastCommit(e, chain) : e);
  }
  sendJson(res, 200, out);
}

interface Span {
  start: number;
  end: number;
  status: number;
  total: number;
}

/** The byte range a Range header asks of a file of `total` bytes; null = 416. */
function parseRange(range: string | undefined, total: number): Span | null {
  if (!range) return { start: 0, end: total - 1, status: 200, total };
  const m = /^bytes=(\d*)-(\d*)$/.exec(range.trim());
  if (!m || (m[1] === "" && m[2] === "")) throw new HttpError(416, `unsupported Range ${range}`);
  // An empty file answers a range probe with 200 and its size, not 416.
  if (total === 0) return { start: 0, end: -1, status: 200, total };
  let start: number;
  let end = total - 1;
  if (m[1] === "") start = Math.max(0, total - Number(m[2]));
  else {
    start = Number(m[1]);
    if (m[2] !== "") end = Math.min(end, Number(m[2]));
  }
  return start >= total || start > end ? null : { start, end, status: 206, total };
}

function fileHeaders(f: StoredFile, raw: boolean, commit: string, s: Span, ranged: boolean): http.OutgoingHttpHeaders {
  const headers: http.OutgoingHttpHeaders = {
    "Content-Type": "application/octet-stream",
    "Content-Length": s.end - s.start + 1,
    "Accept-Ranges": "bytes",
    ETag: `"${raw ? f.gitOid : f.lfs ? f.sha256 : f.gitOid}"`,
    "X-Repo-Commit": commit,
  };
  if (s.status === 206) headers["Content-Range"] = `bytes ${s.start}-${s.end}/${s.total}`;
  else if (ranged && s.total === 0) headers["Content-Range"] = "bytes */0";
  if (f.lfs && !raw) {
    headers["X-Linked-ETag"] = `"${f.sha256}"`;
    headers["X-Linked-Size"] = f.size;
  }
  return headers;
}

/** GET/HEAD …/resolve|raw/{rev}/{path} at any revision, with Range and the truncation faults. */
export async function resolveEndpoint(
  ctx: HubContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
): Promise<void> {
  const [kind, rev, ...p] = rest;
  const { commit } = await ctx.store.resolve(r, rev);
  const filePath = p.join("/");
  const f = commit.files[filePath];
  if (!f) throw new HttpError(404, `Entry not found: ${filePath}`, "EntryNotFound");
  const raw = kind === "raw" && f.lfs;
  const faults = ctx.faults.current;
  const trunc = !raw && faults.truncateDownload.some((s) => filePath === s || filePath.endsWith(s));
  const full = raw ? Buffer.byteLength(lfsPointerText(f.sha256, f.size)) : f.size;
  const s = parseRange(req.headers.range, trunc && faults.truncateMode === "short" ? full >> 1 : full);
  if (!s) {
    res.writeHead(416, { "Content-Range": `bytes */${full}`, "Content-Type": "text/plain" });
    res.end();
    return;
  }
  // A one-byte probe (bytes=0-0) is what the client sizes the file with; a cut applies to real reads.
  const probe = s.status === 206 && s.start === 0 && s.end === 0;
  if (trunc && (faults.truncateMode === "short" || !probe)) ctx.faults.consume(faults);
  res.writeHead(s.status, fileHeaders(f, raw, commit.id, s, req.headers.range !== undefined));
  if (req.method === "HEAD" || s.end < s.start) {
    res.end();
    return;
  }
  if (raw) {
    res.end(Buffer.from(lfsPointerText(f.sha256, f.size)).subarray(s.start, s.end + 1));
    return;
  }
  sendObject(res, ctx.store.objectPath(r, f.sha256), s, trunc && faults.truncateMode === "cut" && !probe);
}

/** Streams the span; a cut sends half of it and then drops the connection. */
function sendObject(res: http.ServerResponse, file: string, s: Span, cut: boolean): void {
  const len = s.end - s.start + 1;
  const stream = fs.createReadStream(file, {
    start: s.start,
    end: cut ? s.start + Math.max(0, (len >> 1) - 1) : s.end,
  });
  stream.on("error", () => res.destroy());
  if (!cut) {
    stream.pipe(res);
    return;
  }
  // Fewer bytes than Content-Length announced, then the connection drops.
  stream.on("end", () => res.socket?.destroy());
  stream.pipe(res, { end: false });
}
