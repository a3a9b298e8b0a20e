/** Endpoints that change a repo: create/delete, preupload, commit (with its faults), branches, squash. */
import type * as http from "node:http";
import { HttpError, checkRepoPath, parseJson, readBody, sendJson } from "./http";
import { repoUrl, type HubContext } from "./context";
import { createBranch, deleteBranch, superSquash } from "./history";
import { repoId, type FileMap, type RepoRef, type RepoType } from "./repo";
import { isRepoId } from "../address";

const ALWAYS_LFS = /\.(safetensors|bin|pt|pth|ckpt|npy|msgpack)$/;
const GITATTRIBUTES =
  "*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n*.pt filter=lfs diff=lfs merge=lfs -text\n";

export function validRepoName(r: RepoRef): boolean {
  return isRepoId(`${r.owner}/${r.name}`);
}

/** {name, organization, type} of createRepo / deleteRepo bodies. */
// biome-ignore lint/suspicious/noExplicitAny: a parsed request body, checked here field by field
function repoFromBody(body: any, what: string): RepoRef {
  if (body.type !== undefined && body.type !== "model" && body.type !== "dataset")
    throw new HttpError(
      400,
      `${what}: unsupported repo type ${JSON.stringify(body.type)} (this Hub stores models and datasets)`,
    );
  const r: RepoRef = { type: (body.type ?? "model") as RepoType, owner: body.organization, name: body.name };
  if (typeof r.owner !== "string" || typeof r.name !== "string" || !validRepoName(r)) {
    throw new HttpError(400, `${what} needs {organization, name} made of letters, digits, '.', '_' or '-'`);
  }
  return r;
}

export async function createRepoEndpoint(
  ctx: HubContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
): Promise<void> {
  const body = parseJson(await readBody(req));
  const r = repoFromBody(body, "createRepo");
  const visibility = body.visibility ?? (body.private === true ? "private" : "public");
  if (visibility !== "public" && visibility !== "private")
    throw new HttpError(400, `createRepo: visibility ${JSON.stringify(visibility)} is not "public" or "private"`);
  if (body.files !== undefined && !Array.isArray(body.files))
    throw new HttpError(400, "createRepo: files must be an array of {path, content (base64), encoding: 'base64'}");
  const files: FileMap = {};
  await ctx.store.ensureDir(r);
  files[".gitattributes"] = await ctx.store.putObject(r, Buffer.from(GITATTRIBUTES));
  for (const f of body.files ?? []) {
    if (f?.encoding !== "base64" || typeof f.content !== "string")
      throw new HttpError(400, "createRepo: each file needs base64 content");
    files[checkRepoPath(f.path)] = await ctx.store.putObject(r, Buffer.from(f.content, "base64"));
  }
  const license = typeof body.license === "string" ? body.license : undefined;
  // The real Hub writes a model card holding the license in its front matter, unless one was given.
  if (license !== undefined && !files["README.md"])
    files["README.md"] = await ctx.store.putObject(r, Buffer.from(`---\nlicense: ${license}\n---\n`));
  await ctx.store.create(r, { files, private: visibility === "private", license });
  sendJson(res, 200, { url: repoUrl(ctx, r), id: repoId(r), name: repoId(r) });
}

export async function deleteRepoEndpoint(
  ctx: HubContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
): Promise<void> {
  const r = repoFromBody(parseJson(await readBody(req)), "deleteRepo");
  await ctx.store.remove(r);
  ctx.emit({ type: "repo-deleted", repo: repoId(r) });
  res.writeHead(200, { "Content-Length": 0 });
  res.end();
}

export async function preuploadEndpoint(
  ctx: HubContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
): Promise<void> {
  const body = parseJson(await readBody(req));
  const { commit } = await ctx.store.resolve(r, rest.join("/") || "main");
  if (!Array.isArray(body.files)) throw new HttpError(400, "preupload needs {files: [...]}");
  const files = body.files.map((f: { path: unknown; size: unknown }) => {
    const p = checkRepoPath(f.path);
    const lfs = ALWAYS_LFS.test(p) || Number(f.size) > ctx.lfsThreshold;
    return { path: p, uploadMode: lfs ? "lfs" : "regular", shouldIgnore: false };
  });
  sendJson(res, 200, { files, commitOid: commit.id });
}

export async function createBranchEndpoint(
  ctx: HubContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
): Promise<void> {
  const body = parseJson(await readBody(req));
  await createBranch(ctx.store, r, rest.join("/"), {
    startingPoint: body.startingPoint ?? undefined,
    empty: body.emptyBranch === true,
    overwrite: body.overwrite === true,
  });
  sendJson(res, 200, {});
}

export async function deleteBranchEndpoint(
  ctx: HubContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
): Promise<void> {
  await readBody(req);
  await deleteBranch(ctx.store, r, rest.join("/"));
  sendJson(res, 200, {});
}

/** The real Hub's super-squash (`POST …/super-squash/{branch}` `{message}`, huggingface_hub's
 *  super_squash_history): one commit, no history; unreachable objects are freed at once (L6). */
export async function superSquashEndpoint(
  ctx: HubContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
): Promise<void> {
  const body = parseJson(await readBody(req));
  const branch = rest.join("/") || "main";
  const { commit, freed } = await superSquash(
    ctx.store,
    r,
    branch,
    typeof body.message === "string" ? body.message : undefined,
    ctx.gcGraceMs,
  );
  ctx.emit({
    type: "squashed",
    repo: repoId(r),
    branch,
    commit: commit.id,
    freedObjects: freed.objects,
    freedBytes: freed.bytes,
  });
  sendJson(res, 200, { commitId: commit.id, freed });
}
