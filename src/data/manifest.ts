/**
 * The mix root's manifest (D1, D2): what `prepare` wrote and what every reader trusts only after
 * checking it. `readManifest` validates every field, that every shard file exists with exactly
 * tokens * bytes-per-token bytes, and that the totals agree with the shards. Shard contents (sha256)
 * are checked by `verifyShards` / `mixFingerprint` (fingerprint.ts), which read every byte.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { UserError } from "../errors";

export interface ShardInfo {
  file: string;
  tokens: number;
  sha256: string;
}
/** Where a Hub input came from (D2, D3): the commit it was read at and every file's sha256. */
export interface SourceInfo {
  repo_type: "dataset" | "model";
  repo: string;
  requested_revision: string;
  revision: string;
  pattern: string;
  files: { path: string; size: number; sha256: string }[];
}
export interface Manifest {
  format_version: 1;
  dtype: "uint16" | "uint32";
  total_tokens: number;
  shards: ShardInfo[];
  val_shards: ShardInfo[];
  val_total_tokens: number;
  eos_id: number;
  vocab_size: number;
  tokenizer_files: string[];
  /** Hub inputs, in input order (absent for local-only mixes); covered by the fingerprint (D3). */
  sources?: SourceInfo[];
  /** Provenance written by prepare (informative; not part of the contract above). */
  prepare?: Record<string, unknown>;
}

export const MANIFEST_FILE = "manifest.json";
const BUILD_HINT = "build the mix first (node dist/prepare.js --input CORPUS --tokenizer tokenizer.json --out ROOT)";
const KNOWN_KEYS = new Set([
  "format_version",
  "dtype",
  "total_tokens",
  "shards",
  "val_shards",
  "val_total_tokens",
  "eos_id",
  "vocab_size",
  "tokenizer_files",
  "sources",
  "prepare",
]);

export function bytesPerToken(dtype: Manifest["dtype"]): 2 | 4 {
  return dtype === "uint16" ? 2 : 4;
}

/** uint16 while every id fits (vocab_size <= 65,535), uint32 beyond (D2). */
export function dtypeForVocab(vocabSize: number): Manifest["dtype"] {
  return vocabSize > 65535 ? "uint32" : "uint16";
}

function isWholeNonNeg(v: unknown): v is number {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
}

/** A file name inside the root: relative, no parent steps, no absolute path. */
function safeRelative(p: unknown): p is string {
  if (typeof p !== "string" || p.length === 0 || path.isAbsolute(p) || p.includes("\\")) return false;
  return !p.split("/").some((seg) => seg === ".." || seg === "" || seg === ".");
}

function checkShardList(
  where: string,
  list: unknown,
  key: "shards" | "val_shards",
  bpt: number,
  root: string,
  seen: Set<string>,
): ShardInfo[] {
  if (!Array.isArray(list))
    throw new UserError(
      "D1",
      `${where}: "${key}" must be a list of {file, tokens, sha256}; rebuild the mix with node dist/prepare.js`,
    );
  return list.map((s: unknown, i: number) => {
    const o = s as Record<string, unknown>;
    const at = `${where}: ${key}[${i}]`;
    if (typeof o !== "object" || o === null) throw new UserError("D1", `${at} is not an object; rebuild the mix`);
    if (!safeRelative(o.file))
      throw new UserError(
        "D1",
        `${at}.file ${JSON.stringify(o.file)} must be a relative path inside the root; rebuild the mix`,
      );
    if (!isWholeNonNeg(o.tokens))
      throw new UserError(
        "D1",
        `${at}.tokens ${JSON.stringify(o.tokens)} must be a whole number >= 0; rebuild the mix`,
      );
    if (typeof o.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(o.sha256))
      throw new UserError("D1", `${at}.sha256 must be 64 lowercase hex digits; rebuild the mix`);
    if (seen.has(o.file))
      throw new UserError(
        "D1",
        `${at}.file "${o.file}" is listed twice; a shard may appear once in one split; rebuild the mix`,
      );
    seen.add(o.file);
    const fp = path.join(root, o.file);
    let st: fs.Stats;
    try {
      st = fs.statSync(fp);
    } catch {
      throw new UserError("D1", `shard ${fp} listed in ${key} is missing; restore it or rebuild the mix`);
    }
    if (!st.isFile()) throw new UserError("D1", `shard ${fp} is not a regular file; rebuild the mix`);
    const want = o.tokens * bpt;
    if (st.size !== want) {
      throw new UserError(
        "D1",
        `shard ${fp} is ${st.size} bytes but the manifest says ${o.tokens} tokens x ${bpt} bytes = ${want} bytes: the shard is truncated or was written with another dtype; rebuild the mix`,
      );
    }
    return { file: o.file, tokens: o.tokens, sha256: o.sha256 };
  });
}

/** D1: read and validate ROOT/manifest.json. Every problem is a UserError naming the value and the fix. */
export function readManifest(root: string): Manifest {
  const mp = path.join(root, MANIFEST_FILE);
  if (!fs.existsSync(mp)) throw new UserError("D1", `no manifest at ${mp}: ${BUILD_HINT}`);
  let raw: unknown;
  try {
    raw = JSON.parse(fs.readFileSync(mp, "utf8"));
  } catch (e) {
    throw new UserError("D1", `manifest ${mp} is not valid JSON (${(e as Error).message}); rebuild the mix`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw))
    throw new UserError("D1", `manifest ${mp} is not a JSON object; rebuild the mix`);
  const o = raw as Record<string, unknown>;
  for (const k of Object.keys(o)) {
    if (!KNOWN_KEYS.has(k))
      throw new UserError(
        "D1",
        `manifest ${mp} has unknown key "${k}": it was not written by this prepare; rebuild the mix`,
      );
  }
  if (o.format_version !== 1)
    throw new UserError(
      "D1",
      `manifest ${mp} has format_version ${JSON.stringify(o.format_version)}, this reader knows 1; rebuild the mix with this version's prepare`,
    );
  if (o.dtype !== "uint16" && o.dtype !== "uint32")
    throw new UserError(
      "D1",
      `manifest ${mp} has unknown dtype ${JSON.stringify(o.dtype)}: token shards must be "uint16" or "uint32"; rebuild the mix`,
    );
  const dtype = o.dtype;
  if (!isWholeNonNeg(o.vocab_size) || o.vocab_size < 1 || o.vocab_size > 2 ** 31)
    throw new UserError(
      "D1",
      `manifest ${mp} vocab_size ${JSON.stringify(o.vocab_size)} must be a whole number in [1, 2^31]; rebuild the mix`,
    );
  if (dtype === "uint16" && o.vocab_size > 65536)
    throw new UserError(
      "D1",
      `manifest ${mp} stores uint16 tokens but vocab_size is ${o.vocab_size} > 65,536: ids would not fit; rebuild the mix`,
    );
  if (!isWholeNonNeg(o.eos_id) || o.eos_id >= o.vocab_size)
    throw new UserError(
      "D1",
      `manifest ${mp} eos_id ${JSON.stringify(o.eos_id)} is not an id in [0, vocab_size=${o.vocab_size}); rebuild the mix`,
    );
  if (!Array.isArray(o.tokenizer_files) || !o.tokenizer_files.every(safeRelative))
    throw new UserError(
      "D1",
      `manifest ${mp} tokenizer_files must be a list of file names inside the root; rebuild the mix`,
    );
  for (const f of o.tokenizer_files as string[]) {
    if (!fs.existsSync(path.join(root, f)))
      throw new UserError(
        "D1",
        `tokenizer file ${path.join(root, f)} listed in the manifest is missing (D2: the export ships it); restore it or rebuild the mix`,
      );
  }
  const bpt = bytesPerToken(dtype);
  const seen = new Set<string>();
  const shards = checkShardList(mp, o.shards, "shards", bpt, root, seen);
  const valShards = checkShardList(mp, o.val_shards ?? null, "val_shards", bpt, root, seen);
  if (shards.length === 0)
    throw new UserError("D1", `manifest ${mp} lists no training shards; rebuild the mix from a non-empty corpus`);
  const sum = shards.reduce((a, s) => a + s.tokens, 0);
  if (!isWholeNonNeg(o.total_tokens) || o.total_tokens !== sum) {
    throw new UserError(
      "D1",
      `manifest ${mp} total_tokens ${JSON.stringify(o.total_tokens)} disagrees with the sum of its ${shards.length} training shards (${sum} tokens): the manifest was edited or half-written; rebuild the mix`,
    );
  }
  const vsum = valShards.reduce((a, s) => a + s.tokens, 0);
  if (!isWholeNonNeg(o.val_total_tokens) || o.val_total_tokens !== vsum) {
    throw new UserError(
      "D1",
      `manifest ${mp} val_total_tokens ${JSON.stringify(o.val_total_tokens)} disagrees with the sum of its ${valShards.length} val shards (${vsum} tokens); rebuild the mix`,
    );
  }
  const sources = o.sources === undefined ? undefined : checkSources(mp, o.sources);
  if (o.prepare !== undefined && (typeof o.prepare !== "object" || o.prepare === null))
    throw new UserError("D1", `manifest ${mp} "prepare" must be an object; rebuild the mix`);
  const m: Manifest = {
    format_version: 1,
    dtype,
    total_tokens: sum,
    shards,
    val_shards: valShards,
    val_total_tokens: vsum,
    eos_id: o.eos_id,
    vocab_size: o.vocab_size,
    tokenizer_files: o.tokenizer_files as string[],
  };
  if (sources) m.sources = sources;
  if (o.prepare !== undefined) m.prepare = o.prepare as Record<string, unknown>;
  return m;
}

function checkSources(mp: string, v: unknown): SourceInfo[] {
  const bad = (what: string): never => {
    throw new UserError("D1", `manifest ${mp} "sources" ${what}; rebuild the mix`);
  };
  if (!Array.isArray(v)) bad("must be a list");
  return (v as unknown[]).map((x, i) => {
    const o = x as Record<string, unknown>;
    if (typeof o !== "object" || o === null) bad(`[${i}] is not an object`);
    if (o.repo_type !== "dataset" && o.repo_type !== "model") bad(`[${i}].repo_type must be "dataset" or "model"`);
    for (const k of ["repo", "requested_revision", "pattern"])
      if (typeof o[k] !== "string") bad(`[${i}].${k} must be a string`);
    if (typeof o.revision !== "string" || !/^[0-9a-f]{40}$/.test(o.revision))
      bad(`[${i}].revision must be a 40-hex commit sha`);
    if (!Array.isArray(o.files)) bad(`[${i}].files must be a list`);
    const files = (o.files as Record<string, unknown>[]).map((f, j) => {
      if (
        typeof f?.path !== "string" ||
        !isWholeNonNeg(f.size) ||
        typeof f.sha256 !== "string" ||
        !/^[0-9a-f]{64}$/.test(f.sha256)
      )
        bad(`[${i}].files[${j}] must be {path, size, sha256}`);
      return { path: f.path as string, size: f.size as number, sha256: f.sha256 as string };
    });
    return {
      repo_type: o.repo_type as SourceInfo["repo_type"],
      repo: o.repo as string,
      requested_revision: o.requested_revision as string,
      revision: o.revision as string,
      pattern: o.pattern as string,
      files,
    };
  });
}

/** Canonical manifest bytes: fixed key order, 2-space JSON, trailing newline (byte-identical builds). */
export function manifestBytes(m: Manifest): string {
  const ordered: Manifest = {
    format_version: 1,
    dtype: m.dtype,
    total_tokens: m.total_tokens,
    shards: m.shards.map((s) => ({ file: s.file, tokens: s.tokens, sha256: s.sha256 })),
    val_shards: m.val_shards.map((s) => ({ file: s.file, tokens: s.tokens, sha256: s.sha256 })),
    val_total_tokens: m.val_total_tokens,
    eos_id: m.eos_id,
    vocab_size: m.vocab_size,
    tokenizer_files: [...m.tokenizer_files],
  };
  if (m.sources) {
    ordered.sources = m.sources.map((x) => ({
      repo_type: x.repo_type,
      repo: x.repo,
      requested_revision: x.requested_revision,
      revision: x.revision,
      pattern: x.pattern,
      files: x.files.map((f) => ({ path: f.path, size: f.size, sha256: f.sha256 })),
    }));
  }
  if (m.prepare) ordered.prepare = m.prepare;
  return `${JSON.stringify(ordered, null, 2)}\n`;
}
