/** Tree listings and paths-info entries of one commit, with the real Hub's `lastCommit` (expand). */
import { createHash } from "node:crypto";
import { lfsPointerText, type CommitRecord, type FileMap, type StoredFile } from "./repo";

export interface TreeEntry {
  type: "file" | "directory";
  path: string;
  size: number;
  oid: string;
  lfs?: { oid: string; size: number; pointerSize: number };
  lastCommit?: { id: string; title: string; date: string };
}

export function fileEntry(p: string, f: StoredFile): TreeEntry {
  const e: TreeEntry = { type: "file", path: p, size: f.size, oid: f.gitOid };
  if (f.lfs) e.lfs = { oid: f.sha256, size: f.size, pointerSize: Buffer.byteLength(lfsPointerText(f.sha256, f.size)) };
  return e;
}

export function dirEntry(p: string, files: FileMap): TreeEntry {
  return {
    type: "directory",
    path: p,
    size: 0,
    oid: createHash("sha1")
      .update(`tree ${p}\0${dirSignature(files, p)}`)
      .digest("hex"),
  };
}

export function isDir(files: FileMap, p: string): boolean {
  return Object.keys(files).some((k) => k.startsWith(`${p}/`));
}

/** Entries under `under` ("" = the root), sorted by path; directories included. */
export function entries(files: FileMap, under: string, recursive: boolean): TreeEntry[] {
  const dirs = new Set<string>();
  const out: TreeEntry[] = [];
  const pre = under ? `${under}/` : "";
  for (const [p, f] of Object.entries(files)) {
    if (!p.startsWith(pre)) continue;
    const parts = p.slice(pre.length).split("/");
    if (!recursive && parts.length > 1) {
      dirs.add(pre + parts[0]);
      continue;
    }
    for (let i = 1; i < parts.length; i++) dirs.add(pre + parts.slice(0, i).join("/"));
    out.push(fileEntry(p, f));
  }
  for (const d of dirs) out.push(dirEntry(d, files));
  return out.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

/** What a path is in a tree: a file's oid, a folder's list of (path, oid), or "" when absent. */
function dirSignature(files: FileMap, p: string): string {
  return Object.keys(files)
    .filter((k) => k.startsWith(`${p}/`))
    .sort()
    .map((k) => `${k}:${files[k].gitOid}`)
    .join("\n");
}
function signature(files: FileMap, p: string): string {
  const f = files[p];
  return f ? `file:${f.gitOid}` : dirSignature(files, p);
}

/** The newest commit on the first-parent chain (newest first) after which `p` no longer changed. */
export function lastCommit(chain: CommitRecord[], p: string): { id: string; title: string; date: string } | undefined {
  if (!chain.length) return undefined;
  const want = signature(chain[0].files, p);
  let last = chain[0];
  for (const c of chain.slice(1)) {
    if (signature(c.files, p) !== want) break;
    last = c;
  }
  return { id: last.id, title: last.title, date: last.date };
}
