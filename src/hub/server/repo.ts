/**
 * Storage of the local Hub: content-addressed objects, immutable commits and mutable refs, per repo
 * under `dir/{models|datasets}/{owner}/{name}/`:
 *   objects/{sha256}      the bytes of every file (regular and LFS alike), written once
 *   commits/{id}.json     one commit: {id, parents, title, message, date, files: {path: StoredFile}}
 *   refs.json             branches, PR refs and settings: the only file a commit replaces
 *   lock                  the commit lock shared across processes (lock.ts, L2)
 * A commit writes its objects and its commit file (each fsynced) and then replaces refs.json with one
 * fsynced rename, so a crash at any point leaves the branch at the previous commit or the new one,
 * never between (L5). Objects and commits that no ref reaches are collected by gc() (L6).
 */
import * as fs from "node:fs";
import * as fsp from "node:fs/promises";
import * as path from "node:path";
import { createHash, randomBytes } from "node:crypto";
import { HttpError, repoNotFound, revisionNotFound } from "./http";
import { withRepoLock } from "./lock";
import { fsyncDir, readJsonOrNull, tmpName, writeDurable } from "./fsio";

export type RepoType = "model" | "dataset";
export interface RepoRef {
  type: RepoType;
  owner: string;
  name: string;
}
export interface StoredFile {
  sha256: string;
  size: number;
  lfs: boolean;
  gitOid: string;
}
export type FileMap = Record<string, StoredFile>;
export interface CommitRecord {
  id: string;
  parents: string[];
  title: string;
  message: string;
  date: string;
  files: FileMap;
}
export interface RefsState {
  branches: Record<string, string>;
  /** Open pull requests: number → head commit (refs/pr/N). */
  prs: Record<string, string>;
  private: boolean;
  license?: string;
  createdAt: string;
}
export interface Resolved {
  refs: RefsState;
  commit: CommitRecord;
  branch: string | null;
}

export const STALE_PARENT = "A commit has happened since. Please refresh and try again.";
const HEX40 = /^[0-9a-f]{40}$/;

export function gitBlobOid(content: Buffer): string {
  return createHash("sha1").update(`blob ${content.length}\0`).update(content).digest("hex");
}
export function lfsPointerText(sha256: string, size: number): string {
  return `version https://git-lfs.github.com/spec/v1\noid sha256:${sha256}\nsize ${size}\n`;
}
export function sha256Hex(b: Buffer): string {
  return createHash("sha256").update(b).digest("hex");
}
export function repoId(r: RepoRef): string {
  return `${r.owner}/${r.name}`;
}

/** The commit a revision names: a branch, HEAD (= main), refs/heads/X, refs/pr/N or a full commit id. */
function refTarget(refs: RefsState, rev: string): { id: string; branch: string | null } | null {
  const name = rev === "HEAD" ? "main" : rev.startsWith("refs/heads/") ? rev.slice("refs/heads/".length) : rev;
  if (refs.branches[name]) return { id: refs.branches[name], branch: name };
  const pr = /^refs\/pr\/(\d+)$/.exec(rev);
  if (pr && refs.prs[pr[1]]) return { id: refs.prs[pr[1]], branch: null };
  return HEX40.test(rev) ? { id: rev, branch: null } : null;
}

export class RepoStore {
  /** onLockWait: another process holds a repo's commit lock and this one waits for it. */
  constructor(
    readonly root: string,
    private readonly onLockWait: (r: RepoRef) => void = () => undefined,
  ) {}

  repoDir(r: RepoRef): string {
    return path.join(this.root, r.type === "model" ? "models" : "datasets", r.owner, r.name);
  }
  objectPath(r: RepoRef, sha256: string): string {
    return path.join(this.repoDir(r), "objects", sha256);
  }
  private commitPath(r: RepoRef, id: string): string {
    return path.join(this.repoDir(r), "commits", `${id}.json`);
  }
  private refsPath(r: RepoRef): string {
    return path.join(this.repoDir(r), "refs.json");
  }

  /** Runs fn under the repo's commit lock (shared across processes, L2). */
  lock<T>(r: RepoRef, fn: () => Promise<T>): Promise<T> {
    return withRepoLock(path.join(this.repoDir(r), "lock"), fn, () => this.onLockWait(r));
  }

  async readRefs(r: RepoRef): Promise<RefsState | null> {
    return (await readJsonOrNull<RefsState>(this.refsPath(r))) ?? (await this.migrateOldLayout(r));
  }

  async mustRefs(r: RepoRef): Promise<RefsState> {
    const refs = await this.readRefs(r);
    if (!refs) throw repoNotFound();
    return refs;
  }

  async writeRefs(r: RepoRef, refs: RefsState): Promise<void> {
    await writeDurable(this.refsPath(r), JSON.stringify(refs));
  }

  async readCommit(r: RepoRef, id: string): Promise<CommitRecord | null> {
    return HEX40.test(id) ? readJsonOrNull<CommitRecord>(this.commitPath(r, id)) : null;
  }

  async writeCommit(r: RepoRef, c: CommitRecord): Promise<void> {
    await fsp.mkdir(path.dirname(this.commitPath(r, c.id)), { recursive: true });
    await writeDurable(this.commitPath(r, c.id), JSON.stringify(c));
  }

  /** A new commit record (not yet written) on top of parents. */
  newCommit(parents: string[], title: string, message: string, files: FileMap): CommitRecord {
    const date = new Date().toISOString();
    const id = createHash("sha1")
      .update(JSON.stringify({ parents, title, message, date, files }))
      .update(randomBytes(8))
      .digest("hex");
    return { id, parents, title, message, date, files };
  }

  async resolve(r: RepoRef, rev: string): Promise<Resolved> {
    const refs = await this.mustRefs(r);
    const t = refTarget(refs, rev);
    const commit = t ? await this.readCommit(r, t.id) : null;
    if (!t || !commit) throw revisionNotFound(rev);
    return { refs, commit, branch: t.branch };
  }

  /** The first-parent chain from id back to the root, newest first. */
  async history(r: RepoRef, id: string): Promise<CommitRecord[]> {
    const out: CommitRecord[] = [];
    for (let c = await this.readCommit(r, id); c; c = c.parents[0] ? await this.readCommit(r, c.parents[0]) : null)
      out.push(c);
    return out;
  }

  async hasObject(r: RepoRef, sha256: string): Promise<number | null> {
    try {
      return (await fsp.stat(this.objectPath(r, sha256))).size;
    } catch {
      return null;
    }
  }

  /** Stores bytes under their sha256, durably; a no-op when the object exists (it was fsynced then). */
  async putObject(r: RepoRef, content: Buffer): Promise<StoredFile> {
    const sha = sha256Hex(content);
    const p = this.objectPath(r, sha);
    if (!fs.existsSync(p)) {
      await fsp.mkdir(path.dirname(p), { recursive: true });
      await writeDurable(p, content);
    }
    return { sha256: sha, size: content.length, lfs: false, gitOid: gitBlobOid(content) };
  }

  /** Creates the repo's folders and fsyncs each parent, so the repo's entry survives a crash too. */
  async ensureDir(r: RepoRef): Promise<void> {
    const dir = this.repoDir(r);
    if (fs.existsSync(path.join(dir, "commits"))) return;
    await fsp.mkdir(path.join(dir, "objects"), { recursive: true });
    await fsp.mkdir(path.join(dir, "commits"), { recursive: true });
    for (let d = dir; d.length > this.root.length; d = path.dirname(d)) await fsyncDir(path.dirname(d));
    await fsyncDir(dir);
  }

  /** A repo with one commit holding files; 409 when it exists. */
  async create(r: RepoRef, o: { files: FileMap; private: boolean; license?: string }): Promise<CommitRecord> {
    await this.ensureDir(r);
    return this.lock(r, async () => {
      if (await this.readRefs(r)) throw new HttpError(409, "You already created this repo");
      const c = this.newCommit([], "initial commit", "", o.files);
      await this.writeCommit(r, c);
      const refs: RefsState = { branches: { main: c.id }, prs: {}, private: o.private, createdAt: c.date };
      if (o.license) refs.license = o.license;
      await this.writeRefs(r, refs);
      return c;
    });
  }

  /** Moves the repo aside in one rename (it is gone for every reader at once), then deletes it. */
  async remove(r: RepoRef): Promise<void> {
    const trash = path.join(this.root, ".trash");
    await fsp.mkdir(trash, { recursive: true });
    const aside = path.join(trash, `${r.type}-${r.owner}-${r.name}-${randomBytes(4).toString("hex")}`);
    await this.lock(r, async () => {
      await this.mustRefs(r);
      await fsp.rename(this.repoDir(r), aside);
      await fsyncDir(path.dirname(this.repoDir(r)));
    });
    await fsp.rm(aside, { recursive: true, force: true });
  }

  /** A repo stored by the first version of this server (one main.json, no history) becomes a repo
   *  with one commit, keeping its commit id. */
  private async migrateOldLayout(r: RepoRef): Promise<RefsState | null> {
    const old = await readJsonOrNull<{ commit: string; files: FileMap }>(path.join(this.repoDir(r), "main.json"));
    if (!old || !HEX40.test(old.commit)) return null;
    const date = new Date().toISOString();
    await this.writeCommit(r, {
      id: old.commit,
      parents: [],
      title: "imported from main.json",
      message: "",
      date,
      files: old.files,
    });
    const refs: RefsState = { branches: { main: old.commit }, prs: {}, private: false, createdAt: date };
    await this.writeRefs(r, refs);
    await fsp.rm(path.join(this.repoDir(r), "main.json"), { force: true });
    return refs;
  }

  /** Temp files of writes that never finished (a crash), older than graceMs. */
  async leftovers(r: RepoRef, graceMs: number): Promise<string[]> {
    const out: string[] = [];
    for (const sub of ["objects", "commits", ""]) {
      const dir = path.join(this.repoDir(r), sub);
      const names = await fsp.readdir(dir).catch(() => [] as string[]);
      for (const n of names) {
        if (!/\.(tmp|upload)$/.test(n)) continue;
        const st = await fsp.stat(path.join(dir, n)).catch(() => null);
        if (st && Date.now() - st.mtimeMs >= graceMs) out.push(path.join(dir, n));
      }
    }
    return out;
  }

  tmpFor(p: string, tag: string): string {
    return tmpName(p, tag);
  }
}
