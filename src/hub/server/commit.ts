/**
 * The commit endpoint: the client's NDJSON body, the parentCommit check and PR refs (history.ts),
 * and the commit-time faults (dropped, corrupted and extra files, a failing pointer write, a pause
 * before the branch moves, an answer lost after the commit landed).
 */
import type * as http from "node:http";
import * as fsp from "node:fs/promises";
import { HttpError, checkRepoPath, readBody, sendJson } from "./http";
import { repoUrl, type HubContext } from "./context";
import { applyCommit } from "./history";
import {
  gitBlobOid,
  lfsPointerText,
  repoId,
  type CommitRecord,
  type FileMap,
  type RepoRef,
  type StoredFile,
} from "./repo";
import { POINTER_PATH } from "./routes";
import type { HubFaults } from "./faults";

type Op =
  | { kind: "add"; path: string; content?: Buffer; sha256?: string; size?: number }
  | { kind: "delete"; path: string }
  | { kind: "deleteFolder"; path: string };
interface CommitBody {
  summary: string;
  description: string;
  parentCommit?: string;
  ops: Op[];
}

function parseLine(line: string, body: CommitBody): void {
  // biome-ignore lint/suspicious/noExplicitAny: one NDJSON line of a commit, checked field by field below
  let o: { key: string; value: any };
  try {
    o = JSON.parse(line);
  } catch {
    throw new HttpError(400, "commit body: a line is not JSON");
  }
  const v = o.value ?? {};
  switch (o.key) {
    case "header":
      body.summary = String(v.summary ?? "");
      body.description = String(v.description ?? "");
      if (v.parentCommit !== undefined && v.parentCommit !== null) body.parentCommit = String(v.parentCommit);
      return;
    case "file":
      if (v.encoding !== "base64" || typeof v.content !== "string")
        throw new HttpError(400, "commit body: 'file' needs base64 content");
      body.ops.push({ kind: "add", path: checkRepoPath(v.path), content: Buffer.from(v.content, "base64") });
      return;
    case "lfsFile":
      if (v.algo !== "sha256" || !/^[0-9a-f]{64}$/.test(String(v.oid)))
        throw new HttpError(400, "commit body: 'lfsFile' needs algo sha256 and a hex oid");
      body.ops.push({ kind: "add", path: checkRepoPath(v.path), sha256: String(v.oid), size: Number(v.size) });
      return;
    case "deletedFile":
      body.ops.push({ kind: "delete", path: checkRepoPath(v.path) });
      return;
    case "deletedFolder":
      body.ops.push({ kind: "deleteFolder", path: checkRepoPath(String(v.path).replace(/\/+$/, "")) });
      return;
    default:
      throw new HttpError(400, `commit body: unknown key ${JSON.stringify(o.key)}`);
  }
}

export function parseCommitBody(raw: string): CommitBody {
  const body: CommitBody = { summary: "", description: "", ops: [] };
  for (const line of raw.split("\n")) if (line.trim() !== "") parseLine(line, body);
  if (!body.summary) throw new HttpError(400, "commit needs a summary");
  return body;
}

const endsWithAny = (p: string, list: string[]): boolean => list.some((s) => p === s || p.endsWith(s));

/** The stored file an add names: a regular file's bytes are stored now, an LFS object must exist. */
async function storeAdd(ctx: HubContext, r: RepoRef, op: Extract<Op, { kind: "add" }>): Promise<StoredFile> {
  if (op.content) return ctx.store.putObject(r, op.content);
  const size = await ctx.store.hasObject(r, op.sha256!);
  if (size === null) throw new HttpError(422, `lfsFile ${op.path}: object ${op.sha256} was never uploaded`);
  if (size !== op.size)
    throw new HttpError(422, `lfsFile ${op.path}: object ${op.sha256} holds ${size} bytes, commit says ${op.size}`);
  return { sha256: op.sha256!, size, lfs: true, gitOid: gitBlobOid(Buffer.from(lfsPointerText(op.sha256!, size))) };
}

/** The corruptOnCommit fault: the same file with one byte flipped, stored as a new object. */
async function corrupt(ctx: HubContext, r: RepoRef, f: StoredFile): Promise<StoredFile> {
  const bytes = Buffer.from(await fsp.readFile(ctx.store.objectPath(r, f.sha256)));
  if (bytes.length === 0) return { ...(await ctx.store.putObject(r, Buffer.from([0]))), lfs: f.lfs };
  bytes[bytes.length >> 1] ^= 0xff;
  const o = await ctx.store.putObject(r, bytes);
  return { ...o, lfs: f.lfs, gitOid: f.lfs ? gitBlobOid(Buffer.from(lfsPointerText(o.sha256, o.size))) : o.gitOid };
}

/** The parent's tree with the ops applied, and the commit faults in force. */
async function buildTree(ctx: HubContext, r: RepoRef, files: FileMap, ops: Op[], f: HubFaults): Promise<FileMap> {
  let faulted = false;
  for (const op of ops) {
    if (op.kind === "delete") {
      if (!files[op.path]) throw new HttpError(404, `cannot delete ${op.path}: no such file`, "EntryNotFound");
      delete files[op.path];
    } else if (op.kind === "deleteFolder") {
      for (const k of Object.keys(files)) if (k.startsWith(`${op.path}/`)) delete files[k];
    } else if (endsWithAny(op.path, f.dropOnCommit)) {
      faulted = true; // "succeeds" without storing it
    } else {
      const stored = await storeAdd(ctx, r, op);
      faulted ||= endsWithAny(op.path, f.corruptOnCommit);
      files[op.path] = endsWithAny(op.path, f.corruptOnCommit) ? await corrupt(ctx, r, stored) : stored;
    }
  }
  for (const x of f.extraOnCommit) {
    faulted = true;
    files[checkRepoPath(x.path)] = await ctx.store.putObject(r, Buffer.from(x.content));
  }
  if (faulted) ctx.faults.consume(f);
  return files;
}

/** The pauseCommit fault: the commit is durable but the branch has not moved; wait to be killed. */
async function pauseIfAsked(ctx: HubContext, r: RepoRef, rev: string, c: CommitRecord): Promise<void> {
  if (!ctx.faults.current.pauseCommit) return;
  ctx.emit({ type: "commit-paused", repo: repoId(r), rev, commit: c.id });
  while (ctx.faults.current.pauseCommit) {
    if (!ctx.running()) throw new HttpError(503, "the server stopped during a paused commit");
    await ctx.sleep(20);
  }
}

export async function commitEndpoint(
  ctx: HubContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  r: RepoRef,
  rest: string[],
  u: URL,
): Promise<void> {
  const body = parseCommitBody((await readBody(req)).toString("utf8"));
  const rev = rest.join("/") || "main";
  const createPr = ["1", "true"].includes(u.searchParams.get("create_pr") ?? "");
  const f = ctx.faults.current;
  if (f.failPointerWrite && body.ops.some((op) => op.path === POINTER_PATH)) {
    ctx.faults.consume(f);
    throw new HttpError(500, "injected fault: the commit touching latest.json failed");
  }
  const done = await applyCommit(ctx.store, r, {
    rev,
    createPr,
    parentCommit: body.parentCommit,
    title: body.summary,
    message: body.description,
    build: (base) => buildTree(ctx, r, base, body.ops, f),
    beforeRefs: (c) => pauseIfAsked(ctx, r, rev, c),
  });
  ctx.emit({ type: "commit", repo: repoId(r), rev, commit: done.commit.id, pr: done.pr });
  if (f.loseCommitAnswer.length > 0 && body.ops.some((op) => endsWithAny(op.path, f.loseCommitAnswer))) {
    ctx.faults.consume(f);
    throw new HttpError(500, "injected fault: the commit landed but its answer was lost");
  }
  const answer: Record<string, unknown> = {
    success: true,
    commitOid: done.commit.id,
    commitUrl: `${repoUrl(ctx, r)}/commit/${done.commit.id}`,
    hookOutput: "",
  };
  if (done.pr !== null) answer.pullRequestUrl = `${repoUrl(ctx, r)}/discussions/${done.pr}`;
  sendJson(res, 200, answer);
}
