/**
 * What changes refs: commits with the real Hub's parentCommit check (412 on a stale parent, L2),
 * PR refs, branches, super-squash, and the collection of what no ref reaches any more (L6).
 */
import * as fsp from "node:fs/promises";
import * as path from "node:path";
import { HttpError, revisionNotFound } from "./http";
import { STALE_PARENT, type CommitRecord, type FileMap, type RefsState, type RepoRef, type RepoStore } from "./repo";

export interface CommitRequest {
  /** Branch (or refs/pr/N) the commit goes to. */
  rev: string;
  /** Open a pull request ref instead of moving the branch (the real Hub's ?create_pr=1). */
  createPr: boolean;
  parentCommit?: string;
  title: string;
  message: string;
  /** Builds the new tree from the parent's; runs under the lock. */
  build: (base: FileMap) => Promise<FileMap>;
  /** Runs after the commit file is durable and before refs move (the crash-test hook, L5). */
  beforeRefs?: (c: CommitRecord) => Promise<void>;
}
export interface CommitResult {
  commit: CommitRecord;
  pr: number | null;
}

const BRANCH_RE = /^[A-Za-z0-9][A-Za-z0-9._\-/]*$/;

/** The commit the new one goes on top of; a stale or unknown parentCommit is the real Hub's 412. */
function pickParent(
  refs: RefsState,
  q: CommitRequest,
): { parent: string; set: (refs: RefsState, id: string) => number | null } {
  const pr = /^refs\/pr\/(\d+)$/.exec(q.rev);
  const head = pr ? refs.prs[pr[1]] : refs.branches[q.rev === "HEAD" ? "main" : q.rev];
  if (!head) throw revisionNotFound(q.rev);
  if (q.createPr) {
    const n = Math.max(0, ...Object.keys(refs.prs).map(Number)) + 1;
    return { parent: q.parentCommit ?? head, set: (s, id) => ((s.prs[String(n)] = id), n) };
  }
  if (q.parentCommit !== undefined && q.parentCommit !== head) throw new HttpError(412, STALE_PARENT);
  if (pr) return { parent: head, set: (s, id) => ((s.prs[pr[1]] = id), null) };
  const branch = q.rev === "HEAD" ? "main" : q.rev;
  return { parent: head, set: (s, id) => ((s.branches[branch] = id), null) };
}

export async function applyCommit(store: RepoStore, r: RepoRef, q: CommitRequest): Promise<CommitResult> {
  return store.lock(r, async () => {
    const refs = await store.mustRefs(r);
    const { parent, set } = pickParent(refs, q);
    const base = await store.readCommit(r, parent);
    if (!base) throw new HttpError(412, STALE_PARENT);
    const files = await q.build({ ...base.files });
    const c = store.newCommit([parent], q.title, q.message, files);
    await store.writeCommit(r, c);
    if (q.beforeRefs) await q.beforeRefs(c);
    const pr = set(refs, c.id);
    await store.writeRefs(r, refs);
    return { commit: c, pr };
  });
}

export async function createBranch(
  store: RepoStore,
  r: RepoRef,
  branch: string,
  o: { startingPoint?: string; empty?: boolean; overwrite?: boolean },
): Promise<void> {
  if (!BRANCH_RE.test(branch) || branch.startsWith("refs/") || /^[0-9a-f]{40}$/.test(branch))
    throw new HttpError(400, `invalid branch name ${JSON.stringify(branch)}`);
  await store.lock(r, async () => {
    const refs = await store.mustRefs(r);
    if (refs.branches[branch] && !o.overwrite)
      throw new HttpError(409, `Reference already exists: refs/heads/${branch}`);
    let id: string;
    if (o.empty) {
      const c = store.newCommit([], `Create branch ${branch}`, "", {});
      await store.writeCommit(r, c);
      id = c.id;
    } else {
      id = (await store.resolve(r, o.startingPoint ?? "main")).commit.id;
    }
    refs.branches[branch] = id;
    await store.writeRefs(r, refs);
  });
}

export async function deleteBranch(store: RepoStore, r: RepoRef, branch: string): Promise<void> {
  await store.lock(r, async () => {
    const refs = await store.mustRefs(r);
    if (branch === "main") throw new HttpError(403, "the main branch cannot be deleted");
    if (!refs.branches[branch]) throw revisionNotFound(branch);
    delete refs.branches[branch];
    await store.writeRefs(r, refs);
  });
}

/** The real Hub's super-squash: the branch becomes one commit with its current tree and no parent;
 *  then everything no ref reaches is collected, which frees pruned checkpoints' bytes (L6). */
export async function superSquash(
  store: RepoStore,
  r: RepoRef,
  branch: string,
  message: string | undefined,
  graceMs: number,
): Promise<{ commit: CommitRecord; freed: GcResult }> {
  const c = await store.lock(r, async () => {
    const refs = await store.mustRefs(r);
    const head = refs.branches[branch];
    const tip = head ? await store.readCommit(r, head) : null;
    if (!tip) throw revisionNotFound(branch);
    const c = store.newCommit([], message || `Super-squash branch '${branch}'`, "", tip.files);
    await store.writeCommit(r, c);
    refs.branches[branch] = c.id;
    await store.writeRefs(r, refs);
    return c;
  });
  return { commit: c, freed: await collectGarbage(store, r, graceMs) };
}

export interface GcResult {
  commits: number;
  objects: number;
  bytes: number;
}

/** Every commit some ref reaches, with every ancestor. */
async function reachable(store: RepoStore, r: RepoRef, refs: RefsState): Promise<Map<string, CommitRecord>> {
  const seen = new Map<string, CommitRecord>();
  const todo = [...Object.values(refs.branches), ...Object.values(refs.prs)];
  while (todo.length) {
    const id = todo.pop()!;
    if (seen.has(id)) continue;
    const c = await store.readCommit(r, id);
    if (!c) continue;
    seen.set(id, c);
    todo.push(...c.parents);
  }
  return seen;
}

/** The commit files no ref reaches; their objects are what a squash or a deleted branch freed. */
async function unreachable(
  store: RepoStore,
  r: RepoRef,
  kept: Map<string, CommitRecord>,
): Promise<{ files: string[]; objects: Set<string> }> {
  const dir = path.join(store.repoDir(r), "commits");
  const out = { files: [] as string[], objects: new Set<string>() };
  for (const n of await fsp.readdir(dir).catch(() => [] as string[])) {
    if (!n.endsWith(".json") || kept.has(n.slice(0, -5))) continue;
    const c = await store.readCommit(r, n.slice(0, -5));
    for (const f of Object.values(c?.files ?? {})) out.objects.add(f.sha256);
    out.files.push(path.join(dir, n));
  }
  return out;
}

/** Deletes commits no ref reaches and objects no kept commit names. An object no commit ever named
 *  is kept while younger than graceMs: it is an upload whose commit has not come yet. Runs under
 *  the commit lock, so no commit is between its objects and its refs. */
export async function collectGarbage(store: RepoStore, r: RepoRef, graceMs: number): Promise<GcResult> {
  return store.lock(r, async () => {
    const kept = await reachable(store, r, await store.mustRefs(r));
    const live = new Set<string>();
    for (const c of kept.values()) for (const f of Object.values(c.files)) live.add(f.sha256);
    const dead = await unreachable(store, r, kept);
    const out: GcResult = { commits: dead.files.length, objects: 0, bytes: 0 };
    for (const f of dead.files) await fsp.rm(f, { force: true });
    const objects = path.join(store.repoDir(r), "objects");
    for (const n of await fsp.readdir(objects).catch(() => [] as string[])) {
      if (!/^[0-9a-f]{64}$/.test(n) || live.has(n)) continue;
      const st = await fsp.stat(path.join(objects, n)).catch(() => null);
      if (!st || (!dead.objects.has(n) && Date.now() - st.mtimeMs < graceMs)) continue;
      await fsp.rm(path.join(objects, n), { force: true });
      out.objects++;
      out.bytes += st.size;
    }
    for (const p of await store.leftovers(r, graceMs)) await fsp.rm(p, { force: true });
    return out;
  });
}
