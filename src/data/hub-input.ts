/**
 * Hub inputs for `prepare` (D2): `--input hf://datasets/owner/name[@revision]/path-glob` and
 * `--tokenizer owner/name` (or hf://models/owner/name[@revision], hf://datasets/...). Everything goes
 * through `@huggingface/hub` (no hand-written Hub HTTP); the token comes from HF_TOKEN only and is
 * scrubbed from every error.
 *
 * Reproducibility: the revision (a branch, a tag or a commit) is resolved once to the commit sha the
 * Hub serves it at (the X-Repo-Commit header of a file probe), and every listing and download after
 * that names the sha, so a branch that moves during the build cannot mix two versions. Each file's
 * sha256 comes from the listing (the LFS oid) or, for a small regular file, from hashing it; streamed
 * files are hashed as they are read and a mismatch fails the build. manifest.json records the sha
 * and every file's sha256, and the mix fingerprint (D3) covers them.
 *
 * Globs: `*` matches within one path segment, `**` any number of segments, `?` one character; no
 * glob (or a directory) takes every supported file under it. Revisions with a "/" are written
 * URL-encoded (hf://datasets/o/n@refs%2Fconvert%2Fparquet/...).
 */
import { refuseMalformedToken } from "../hub/token";
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { downloadFile, fileDownloadInfo, HubApiError, listFiles } from "@huggingface/hub";
import type { RepoDesignation } from "@huggingface/hub";
import { UserError } from "../errors";
import { DEFAULT_HUB_URL, hubUrlProblem, isHfUrl, isRepoId, parseHfUrl } from "../hub/address";
import { isNotAHubAnswer, NotAHubError, scrubSecret } from "../hub/hub-errors";
import { kindOf, type InputFile, SUPPORTED_FORMATS } from "./inputs";
import type { SourceInfo } from "./manifest";

export interface HubSpec {
  repoType: "dataset" | "model";
  repo: string;
  revision: string;
  glob: string;
}

/** What manifest.json records about a Hub input (and the fingerprint covers). */
export type HubSource = SourceInfo;

/** hf://datasets/owner/name[@revision][/path-glob] (also hf://models/...), by address.ts's one grammar. */
export function parseHubUrl(s: string, what: string): HubSpec {
  const u = parseHfUrl(s, { what, rule: "D2", form: "hf://datasets/owner/name[@revision]/path-glob" });
  return { repoType: u.repoType, repo: u.repo, revision: u.revision, glob: u.path };
}

/** A glob as a RegExp over '/'-separated repo paths (see the module comment). */
export function globRegExp(glob: string): RegExp {
  let re = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i];
    if (c === "*" && glob[i + 1] === "*") {
      i++;
      if (glob[i + 1] === "/") {
        i++;
        re += "(?:.*/)?";
      } else re += ".*";
    } else if (c === "*") re += "[^/]*";
    else if (c === "?") re += "[^/]";
    else re += c.replace(/[.+^${}()|[\]\\]/g, "\\$&");
  }
  return new RegExp(`^${re}$`);
}

function hasGlob(s: string): boolean {
  return /[*?]/.test(s);
}

// ---------------------------------------------------------------------------------------------
// client plumbing

function hubToken(): string | undefined {
  const t = process.env.HF_TOKEN;
  if (t === undefined || t === "") return undefined;
  refuseMalformedToken({ readsOnly: true }, t); // K5: a token no request can carry, or without hf_, refused as a run refuses it
  return t;
}

function scrub(e: unknown, token: string | undefined): unknown {
  if (e instanceof Error && token) {
    e.message = scrubSecret(e.message, token);
    if (e.stack) e.stack = scrubSecret(e.stack, token);
  }
  return e;
}

/** fetch, refusing an answer that shows the address is a web server, not a Hub (K9's rule, hub-errors.ts). */
const hubFetch: typeof fetch = async (input, init) => {
  const res = await fetch(input, init);
  const url = String(input instanceof Request ? input.url : input).split("?")[0];
  const method = init?.method ?? "GET";
  const type = res.headers.get("content-type");
  if (isNotAHubAnswer(url, method, res.status, type)) {
    await res.body?.cancel().catch(() => undefined);
    throw new NotAHubError(`${method} ${url}`, res.status, type);
  }
  return res;
};

function hubFailure(e: unknown, what: string, fix: string): Error {
  if (e instanceof UserError) return e;
  if (e instanceof NotAHubError)
    return new UserError(
      "D2",
      `${what}: the Hub address is not a Hub: ${e.message}; name a Hub with --hub-url (or HF_ENDPOINT), as ${DEFAULT_HUB_URL}`,
    );
  if (e instanceof HubApiError) {
    if (e.statusCode === 401 || e.statusCode === 403)
      return new UserError(
        "D2",
        `${what}: the Hub answered ${e.statusCode} (${e.message}); set HF_TOKEN to a token that can read it`,
      );
    if (e.statusCode === 404) return new UserError("D2", `${what}: not found on the Hub (${e.message}); ${fix}`);
    return new Error(`${what}: the Hub answered HTTP ${e.statusCode}: ${e.message}`, { cause: e });
  }
  if (e instanceof TypeError && e.message === "fetch failed") {
    const cause = (e as { cause?: { code?: string; message?: string } }).cause;
    return new UserError(
      "D2",
      `${what}: could not reach the Hub (${cause?.code ?? cause?.message ?? "network error"}); check --hub-url / HF_ENDPOINT and the network, then run prepare again`,
    );
  }
  return new Error(`${what}: ${(e as Error)?.message ?? String(e)}`, { cause: e });
}

interface Client {
  hubUrl: string;
  token: string | undefined;
  repo: RepoDesignation & { name: string };
}

function client(spec: HubSpec, hubUrl: string): Client {
  const bad = hubUrlProblem(hubUrl);
  if (bad) throw new UserError("D2", `--hub-url ${JSON.stringify(hubUrl)} ${bad}`);
  return { hubUrl: hubUrl.replace(/\/+$/, ""), token: hubToken(), repo: { type: spec.repoType, name: spec.repo } };
}

/** The commit sha a revision resolves to: the X-Repo-Commit of a probe of one file at that revision. */
async function resolveRevision(c: Client, revision: string, probePath: string, missing: () => Error): Promise<string> {
  let commit: string | null = null;
  const seeing: typeof fetch = async (input, init) => {
    const res = await hubFetch(input, init);
    commit = res.headers.get("x-repo-commit") ?? commit;
    return res;
  };
  const info = await fileDownloadInfo({
    repo: c.repo,
    path: probePath,
    revision,
    hubUrl: c.hubUrl,
    fetch: seeing,
    accessToken: c.token,
  });
  if (!info) throw missing();
  if (commit === null || !/^[0-9a-f]{40}$/.test(commit))
    throw new Error(`the Hub did not say which commit ${c.repo.name}@${revision} is (no X-Repo-Commit header)`);
  return commit;
}

interface Listed {
  path: string;
  size: number;
  sha256: string | null;
}

async function listAt(c: Client, revision: string, dir: string | undefined): Promise<Listed[]> {
  const out: Listed[] = [];
  for await (const e of listFiles({
    repo: c.repo,
    revision,
    recursive: true,
    path: dir,
    hubUrl: c.hubUrl,
    fetch: hubFetch,
    accessToken: c.token,
  })) {
    if (e.type !== "file") continue;
    out.push({ path: e.path, size: e.lfs?.size ?? e.size, sha256: e.lfs?.oid ?? null });
  }
  return out.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

async function sha256OfRemote(c: Client, revision: string, p: string): Promise<string> {
  const blob = await downloadFile({
    repo: c.repo,
    path: p,
    revision,
    hubUrl: c.hubUrl,
    fetch: hubFetch,
    accessToken: c.token,
  });
  if (!blob) throw new Error(`${p} is listed at ${revision} but cannot be downloaded`);
  const h = createHash("sha256");
  for await (const chunk of blob.stream() as unknown as AsyncIterable<Uint8Array>) h.update(chunk);
  return h.digest("hex");
}

/** A remote file as an InputFile: a streamed GET (hashed and checked) or ranged reads (Parquet). */
function remoteInputFile(c: Client, spec: HubSpec, revision: string, f: Listed & { sha256: string }): InputFile {
  const name = `hf://${spec.repoType}s/${spec.repo}@${revision.slice(0, 12)}/${f.path}`;
  const kind = kindOf(f.path)!;
  const open = async (): Promise<Blob> => {
    const b = await downloadFile({
      repo: c.repo,
      path: f.path,
      revision,
      hubUrl: c.hubUrl,
      fetch: hubFetch,
      accessToken: c.token,
    });
    if (!b) throw new Error(`${name} was listed but cannot be downloaded (EntryNotFound)`);
    if (b.size !== f.size) throw new Error(`${name} is ${b.size} bytes on download but ${f.size} in the listing`);
    return b;
  };
  return {
    name,
    kind,
    bytes: f.size,
    async *stream(): AsyncGenerator<Uint8Array> {
      const h = createHash("sha256");
      let n = 0;
      try {
        const blob = await open();
        for await (const chunk of blob.stream() as unknown as AsyncIterable<Uint8Array>) {
          h.update(chunk);
          n += chunk.length;
          yield chunk;
        }
      } catch (e) {
        throw scrub(hubFailure(e, `reading ${name}`, "check the path and revision"), c.token);
      }
      const got = h.digest("hex");
      if (n !== f.size || got !== f.sha256) {
        throw new Error(
          `${name} arrived as ${n} bytes with sha256 ${got}, but the Hub lists ${f.size} bytes with sha256 ${f.sha256}: the download was cut or corrupted; run prepare again`,
        );
      }
    },
    random() {
      let blob: Promise<Blob> | null = null;
      return {
        byteLength: f.size,
        async slice(start: number, end?: number): Promise<ArrayBuffer> {
          try {
            blob ??= open();
            const part = (await blob).slice(start, end ?? f.size);
            const buf = await part.arrayBuffer();
            const want = (end ?? f.size) - start;
            if (!(buf instanceof ArrayBuffer) || buf.byteLength !== want)
              throw new Error(
                `a ranged read of ${name} [${start}, ${start + want}) returned ${buf?.byteLength ?? "no"} bytes`,
              );
            return buf;
          } catch (e) {
            throw scrub(hubFailure(e, `reading ${name}`, "check the path and revision"), c.token);
          }
        },
        async close(): Promise<void> {
          blob = null;
        },
      };
    },
  };
}

/** Lists the files an hf:// --input names at one resolved commit; refuses before any work if none. */
export async function resolveHubInput(url: string, hubUrl: string): Promise<{ files: InputFile[]; source: HubSource }> {
  const spec = parseHubUrl(url, "--input");
  const c = client(spec, hubUrl);
  try {
    const globbed = hasGlob(spec.glob);
    // the directory part before the first glob segment narrows the listing
    const segs = spec.glob === "" ? [] : spec.glob.split("/");
    const fixed: string[] = [];
    for (const s of segs) {
      if (hasGlob(s)) break;
      fixed.push(s);
    }
    const dir = globbed ? fixed.join("/") : "";
    const re = globbed ? globRegExp(spec.glob) : null;
    const pick = (all: Listed[]): Listed[] =>
      all.filter(
        (f) =>
          (re ? re.test(f.path) : spec.glob === "" || f.path === spec.glob || f.path.startsWith(`${spec.glob}/`)) &&
          kindOf(f.path) !== null,
      );
    const first = pick(await listAt(c, spec.revision, dir || undefined));
    if (first.length === 0) {
      throw new UserError(
        "D2",
        `--input ${url} matches no ${SUPPORTED_FORMATS} file on ${spec.repo} at ${spec.revision}; check the path-glob (e.g. hf://${spec.repoType}s/${spec.repo}/data/*.parquet)`,
      );
    }
    const revision = /^[0-9a-f]{40}$/.test(spec.revision)
      ? spec.revision
      : await resolveRevision(
          c,
          spec.revision,
          first[0].path,
          () => new Error(`${first[0].path} was listed at ${spec.revision} but its probe says it is missing`),
        );
    const listed = revision === spec.revision ? first : pick(await listAt(c, revision, dir || undefined));
    const files: InputFile[] = [];
    const recorded: HubSource["files"] = [];
    for (const f of listed) {
      const sha256 = f.sha256 ?? (await sha256OfRemote(c, revision, f.path));
      files.push(remoteInputFile(c, spec, revision, { ...f, sha256 }));
      recorded.push({ path: f.path, size: f.size, sha256 });
    }
    return {
      files,
      source: {
        repo_type: spec.repoType,
        repo: spec.repo,
        requested_revision: spec.revision,
        revision,
        pattern: spec.glob,
        files: recorded,
      },
    };
  } catch (e) {
    throw scrub(
      hubFailure(e, `--input ${url}`, `check the repo id, the revision and that it is a ${spec.repoType} repo`),
      c.token,
    );
  }
}

/** A --tokenizer that names the Hub (owner/name, or an hf:// URL) rather than a local file. */
export function isHubTokenizer(s: string): boolean {
  if (isHfUrl(s)) return true;
  return isRepoId(s) && !fs.existsSync(s);
}

export interface HubTokenizer {
  file: string;
  dir: string;
  source: { repo_type: "dataset" | "model"; repo: string; revision: string; sha256: string };
}

/**
 * Downloads tokenizer.json (and tokenizer_config.json / special_tokens_map.json when present) of a
 * Hub model (owner/name, hf://models/owner/name[@rev][/subdir]) or dataset (hf://datasets/...) into
 * a temp directory; the caller removes `dir`.
 */
export async function fetchHubTokenizer(s: string, hubUrl: string): Promise<HubTokenizer> {
  const spec: HubSpec = isHfUrl(s)
    ? parseHubUrl(s, "--tokenizer")
    : { repoType: "model", repo: s, revision: "main", glob: "" };
  if (hasGlob(spec.glob))
    throw new UserError("D2", `--tokenizer ${s}: name the folder that holds tokenizer.json, not a glob`);
  const c = client(spec, hubUrl);
  const base = spec.glob.endsWith("tokenizer.json") ? path.posix.dirname(spec.glob) : spec.glob;
  const inRepo = (f: string) => (base && base !== "." ? `${base}/${f}` : f);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-tokenizer-"));
  try {
    const revision = /^[0-9a-f]{40}$/.test(spec.revision)
      ? spec.revision
      : await resolveRevision(
          c,
          spec.revision,
          inRepo("tokenizer.json"),
          () =>
            new UserError(
              "D2",
              `--tokenizer ${s}: ${spec.repo}@${spec.revision} has no ${inRepo("tokenizer.json")}; name a repo (or folder) that holds a Hugging Face tokenizer.json`,
            ),
        );
    let sha = "";
    for (const f of ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]) {
      const blob = await downloadFile({
        repo: c.repo,
        path: inRepo(f),
        revision,
        hubUrl: c.hubUrl,
        fetch: hubFetch,
        accessToken: c.token,
      });
      if (!blob) {
        if (f === "tokenizer.json")
          throw new UserError(
            "D2",
            `--tokenizer ${s}: ${spec.repo}@${revision.slice(0, 12)} has no ${inRepo(f)}; name a repo (or folder) that holds a Hugging Face tokenizer.json`,
          );
        continue;
      }
      const bytes = Buffer.from(await blob.arrayBuffer());
      if (f === "tokenizer.json") sha = createHash("sha256").update(bytes).digest("hex");
      fs.writeFileSync(path.join(dir, f), bytes);
    }
    return {
      file: path.join(dir, "tokenizer.json"),
      dir,
      source: { repo_type: spec.repoType, repo: spec.repo, revision, sha256: sha },
    };
  } catch (e) {
    fs.rmSync(dir, { recursive: true, force: true });
    throw scrub(
      hubFailure(
        e,
        `--tokenizer ${s}`,
        `check the repo id (owner/name) and that it is a ${spec.repoType} repo; a local tokenizer must be a path that exists`,
      ),
      c.token,
    );
  }
}
