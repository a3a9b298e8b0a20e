/** HTTP plumbing of the local Hub: errors with the real Hub's status and X-Error-Code, bodies, answers. */
import type * as http from "node:http";
import { isRepoPath, REPO_PATH_RULE } from "../address";
import { realFsError } from "./fsio";

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}

/** A repo path the store accepts (address.ts's rule, the one the client holds to), or 400. */
export function checkRepoPath(p: unknown): string {
  if (!isRepoPath(p))
    throw new HttpError(400, `invalid path in repo: ${JSON.stringify(p)}: it must be ${REPO_PATH_RULE}`);
  return p;
}

export async function readBody(req: http.IncomingMessage, limit = 512 * 1024 * 1024): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of req) {
    n += (c as Buffer).length;
    if (n > limit) throw new HttpError(413, "request body too large");
    chunks.push(c as Buffer);
  }
  return Buffer.concat(chunks);
}

// biome-ignore lint/suspicious/noExplicitAny: a request body; every route checks the fields it reads
export function parseJson(b: Buffer): any {
  if (b.length === 0) return {};
  try {
    return JSON.parse(b.toString("utf8"));
  } catch {
    throw new HttpError(400, "request body is not valid JSON");
  }
}

export function sendError(
  req: http.IncomingMessage,
  res: http.ServerResponse,
  status: number,
  message: string,
  code?: string,
): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const headers: http.OutgoingHttpHeaders = { "X-Error-Message": message.replace(/[^\x20-\x7e]/g, "?") };
  if (code) headers["X-Error-Code"] = code;
  if (req.method === "HEAD") {
    // The client must not try to parse a JSON body it will never get.
    res.writeHead(status, { ...headers, "Content-Type": "text/plain" });
    res.end();
    return;
  }
  const body = JSON.stringify({ error: message });
  res.writeHead(status, { ...headers, "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
  res.end(body);
}

export function sendJson(
  res: http.ServerResponse,
  status: number,
  value: unknown,
  extra: http.OutgoingHttpHeaders = {},
  type = "application/json",
): void {
  const body = JSON.stringify(value);
  res.writeHead(status, { "Content-Type": type, "Content-Length": Buffer.byteLength(body), ...extra });
  res.end(body);
}

/** Errors of the store's own files that no request can fix: the disk full or read-only, the folder gone or barred. */
const STORAGE_CODES: ReadonlySet<string> = new Set([
  "ENOSPC",
  "EDQUOT",
  "EROFS",
  "EACCES",
  "EPERM",
  "ENOENT",
  "ENOTDIR",
  "EIO",
  "EFBIG",
]);

/**
 * K9: a failure of the store's own files as the answer 507 (Insufficient Storage, X-Error-Code HubStorageError)
 * naming the error, where it would otherwise be a bare 500: a run refuses such a Hub at its start, and retries it
 * while training (K6), when its owner may still free the disk. Null for any other error.
 */
export function storageFailure(e: unknown, root: string): HttpError | null {
  const x = realFsError(e, root) as NodeJS.ErrnoException;
  if (typeof x !== "object" || x === null || typeof x.code !== "string" || !STORAGE_CODES.has(x.code)) return null;
  const what = x.syscall ? ` (${x.syscall}${x.path ? ` ${x.path}` : ""})` : "";
  return new HttpError(
    507,
    `the Hub's storage failed: ${x.code}${what}: its disk is full or read-only, or its folder is gone`,
    "HubStorageError",
  );
}

/** 404 answers the client tells apart (R2). */
export const repoNotFound = (): HttpError => new HttpError(404, "Repository not found", "RepoNotFound");
export const revisionNotFound = (rev: string): HttpError =>
  new HttpError(404, `Invalid rev id: ${rev}`, "RevisionNotFound");
