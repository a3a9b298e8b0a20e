/**
 * The LFS side of a commit: the batch answer (basic transfer only, signed upload hrefs, never
 * multipart or xet) and the signed PUT, whose bytes are checked against the announced sha256 here
 * because the client never checks what it sent.
 */
import type * as http from "node:http";
import * as fs from "node:fs";
import * as fsp from "node:fs/promises";
import * as path from "node:path";
import { createHash, createHmac, randomBytes } from "node:crypto";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { HttpError, parseJson, readBody, sendJson } from "./http";
import { renameDurable } from "./fsio";
import type { RepoRef, RepoStore } from "./repo";

export class Signer {
  private readonly secret = randomBytes(32);

  private sign(r: RepoRef, oid: string, size: number, exp: number): string {
    return createHmac("sha256", this.secret)
      .update(`${r.type}/${r.owner}/${r.name}/${oid}/${size}/${exp}`)
      .digest("hex");
  }

  href(base: string, r: RepoRef, oid: string, size: number): string {
    const exp = Date.now() + 3600_000;
    const where = `${r.type}/${encodeURIComponent(r.owner)}/${encodeURIComponent(r.name)}/${oid}`;
    return `${base}/__lfs/upload/${where}?size=${size}&exp=${exp}&sig=${this.sign(r, oid, size, exp)}`;
  }

  /** The size the href was signed for; 403 when the signature is wrong or expired. */
  check(r: RepoRef, oid: string, q: URLSearchParams): number {
    const size = Number(q.get("size"));
    const exp = Number(q.get("exp"));
    const sig = q.get("sig") ?? "";
    if (sig !== this.sign(r, oid, size, exp)) throw new HttpError(403, "upload URL signature is invalid");
    if (!(exp > Date.now())) throw new HttpError(403, "upload URL has expired");
    return size;
  }
}

export async function lfsBatch(
  req: http.IncomingMessage,
  res: http.ServerResponse,
  store: RepoStore,
  r: RepoRef,
  signer: Signer,
  base: string,
): Promise<void> {
  const body = parseJson(await readBody(req));
  await store.mustRefs(r);
  if (body.operation !== "upload" || !Array.isArray(body.objects))
    throw new HttpError(400, "LFS batch: only {operation: 'upload', objects: [...]} is supported");
  const objects = await Promise.all(
    body.objects.map(async (o: { oid: unknown; size: unknown }) => {
      const oid = String(o.oid);
      const size = Number(o.size);
      if (!/^[0-9a-f]{64}$/.test(oid) || !Number.isInteger(size) || size < 0) {
        return {
          oid,
          size,
          error: { code: 422, message: "oid must be a sha256 hex digest and size a non-negative integer" },
        };
      }
      // No `actions` = already stored. Never multipart (no chunk_size), never xet.
      if ((await store.hasObject(r, oid)) === size) return { oid, size };
      return {
        oid,
        size,
        authenticated: true,
        actions: { upload: { href: signer.href(base, r, oid, size), expires_in: 3600 } },
      };
    }),
  );
  sendJson(res, 200, { transfer: "basic", objects }, {}, "application/vnd.git-lfs+json");
}

export async function lfsUpload(
  req: http.IncomingMessage,
  res: http.ServerResponse,
  store: RepoStore,
  r: RepoRef,
  signer: Signer,
  oid: string,
  q: URLSearchParams,
): Promise<void> {
  let size: number;
  try {
    size = signer.check(r, oid, q);
  } catch (e) {
    await readBody(req).catch(() => undefined);
    throw e;
  }
  const p = store.objectPath(r, oid);
  await fsp.mkdir(path.dirname(p), { recursive: true });
  const tmp = store.tmpFor(p, "upload");
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
    if (n !== size) throw new HttpError(400, `uploaded ${n} bytes for an object announced as ${size} bytes`);
    if (got !== oid) throw new HttpError(400, `uploaded bytes hash to sha256 ${got}, not the announced oid ${oid}`);
    await renameDurable(tmp, p);
  } catch (e) {
    await fsp.rm(tmp, { force: true });
    throw e;
  }
  res.writeHead(200, { "Content-Length": 0, ETag: `"${oid}"` });
  res.end();
}
