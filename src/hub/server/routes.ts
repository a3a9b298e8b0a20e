/** URL → endpoint of the local Hub, with what access each needs (L4 in docs/RULES.md). */
import type { Access } from "./auth";
import type { HubEndpoint } from "./faults";
import type { RepoRef, RepoType } from "./repo";

export interface Route {
  endpoint: HubEndpoint | null;
  repo?: RepoRef;
  rest: string[];
  access: Access;
}

/**
 * The pointer file a checkpointing client moves last (latest.json, K3), which the pointer faults
 * single out. The server knows the name, not the trainer: hub.server tests check it equals checkpoint/names.ts's.
 */
export const POINTER_PATH = "latest.json";
const NONE: Route = { endpoint: null, rest: [], access: "none" };

const typeOf = (s: string): RepoType | null => (s === "models" ? "model" : s === "datasets" ? "dataset" : null);

/** /api/{type}s/{owner}/{name}/{op}/... */
function repoApi(method: string, repo: RepoRef, op: string | undefined, rest: string[]): Route {
  const r = (endpoint: HubEndpoint, access: Access): Route => ({ endpoint, repo, rest, access });
  if (op === undefined) return method === "GET" || method === "HEAD" ? r("repoInfo", "read") : NONE;
  const read = method === "GET" || method === "HEAD";
  if (op === "revision" && read) return r("revisionInfo", "read");
  if (op === "tree" && read) return r("list", "read");
  if (op === "commits" && read) return r("commits", "read");
  if (op === "paths-info" && method === "POST") return r("pathsInfo", "read");
  if (op === "preupload" && method === "POST") return r("preupload", "write");
  if (op === "commit" && method === "POST") return r("commit", "write");
  if (op === "super-squash" && method === "POST") return r("superSquash", "write");
  if (op === "branch" && method === "POST") return r("createBranch", "write");
  if (op === "branch" && method === "DELETE") return r("deleteBranch", "write");
  return NONE;
}

function api(method: string, segs: string[]): Route {
  if (segs[1] === "repos" && segs.length === 3) {
    if (segs[2] === "create" && method === "POST") return { endpoint: "createRepo", rest: [], access: "write" };
    if (segs[2] === "delete" && method === "DELETE") return { endpoint: "deleteRepo", rest: [], access: "write" };
  }
  if (segs[1] === "whoami-v2" && segs.length === 2 && method === "GET")
    return { endpoint: "whoami", rest: [], access: "none" };
  const t = typeOf(segs[1] ?? "");
  if (!t || segs.length < 4) return NONE;
  return repoApi(method, { type: t, owner: segs[2], name: segs[3] }, segs[4], segs.slice(5));
}

/** Non-API paths: signed LFS uploads, the LFS batch, and file reads (resolve / raw). */
function files(method: string, segs: string[]): Route {
  if (segs[0] === "__lfs" && segs[1] === "upload" && segs.length === 6 && method === "PUT") {
    const t = segs[2] === "model" || segs[2] === "dataset" ? (segs[2] as RepoType) : null;
    return t
      ? { endpoint: "upload", repo: { type: t, owner: segs[3], name: segs[4] }, rest: [segs[5]], access: "none" }
      : NONE;
  }
  const type: RepoType = segs[0] === "datasets" ? "dataset" : "model";
  const s = type === "dataset" ? segs.slice(1) : segs;
  if (
    s.length === 6 &&
    s[1].endsWith(".git") &&
    s.slice(2).join("/") === "info/lfs/objects/batch" &&
    method === "POST"
  ) {
    return { endpoint: "lfsBatch", repo: { type, owner: s[0], name: s[1].slice(0, -4) }, rest: [], access: "write" };
  }
  if (s.length >= 5 && (s[2] === "resolve" || s[2] === "raw") && (method === "GET" || method === "HEAD")) {
    const filePath = s.slice(4).join("/");
    const endpoint: HubEndpoint = filePath === POINTER_PATH ? "pointerRead" : s[2] === "raw" ? "raw" : "resolve";
    return { endpoint, repo: { type, owner: s[0], name: s[1] }, rest: [s[2], s[3], ...s.slice(4)], access: "read" };
  }
  return NONE;
}

export function route(method: string, segs: string[]): Route {
  return segs[0] === "api" ? api(method, segs) : files(method, segs);
}

/** A revision followed by a path, as the tree listing sends them unencoded: refs/pr/N and
 *  refs/heads/X take three segments (a branch with a '/' in its name is ambiguous there). */
export function splitRevPath(rest: string[]): { rev: string; path: string[] } {
  if (rest[0] === "refs" && (rest[1] === "pr" || rest[1] === "heads") && rest.length >= 3)
    return { rev: rest.slice(0, 3).join("/"), path: rest.slice(3) };
  return { rev: rest[0] ?? "main", path: rest.slice(1) };
}
