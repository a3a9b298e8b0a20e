/**
 * Writing a checkpoint folder (K2, K7), atomically: every file goes into `<dir>.partial-<pid>`, is
 * fsynced, the manifest (sizes and sha256 of the others) is written last, and the folder is renamed into
 * place (llm.c's DONE marker). A folder with the final name is complete; a failed write leaves nothing
 * behind, and a half-written folder is never mistaken for a checkpoint.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { UserError } from "../errors";
import type { LlamaConfig } from "../model/llama-config";
import { encodeSafetensors } from "../model/safetensors";
import { MANIFEST_FILE, partialDirOf } from "./names";
import { MANIFEST_FORMAT, type CheckpointDocs, type CheckpointManifest } from "./state";
import { TENSOR_PARTS } from "./tensor-parts";

/** Bytes one checkpoint folder takes for P parameters: weights + two moments in fp32, plus headers and documents. */
export function estimateCheckpointBytes(P: number, tensors = 64): number {
  return 12 * P + tensors * 3 * 200 + 256 * 1024;
}

/** A checkpoint folder could not be written (ENOSPC, EROFS, ...); no partial folder was left behind. */
export class CheckpointWriteError extends Error {
  readonly code: string | null;
  readonly dir: string;
  constructor(dir: string, cause: unknown) {
    const code = (cause as NodeJS.ErrnoException)?.code ?? null;
    const what =
      code === "ENOSPC"
        ? "the disk is full (ENOSPC)"
        : code === "EDQUOT"
          ? "the disk quota is used up (EDQUOT)"
          : `${code ?? ""} ${(cause as Error)?.message ?? String(cause)}`.trim();
    super(`writing checkpoint folder ${dir} failed: ${what}; the partial folder was removed`);
    this.name = "CheckpointWriteError";
    this.code = code;
    this.dir = dir;
  }
}

function jsonBytes(v: unknown): Buffer {
  return Buffer.from(`${JSON.stringify(v, null, 1)}\n`);
}

/** Writes `bytes` to `p` and fsyncs it before returning. */
function writeSynced(p: string, bytes: Uint8Array): void {
  const fd = fs.openSync(p, "wx");
  try {
    let off = 0;
    while (off < bytes.byteLength) off += fs.writeSync(fd, bytes, off, bytes.byteLength - off);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** fsync a folder, so a rename in it survives a crash; not every filesystem supports it. */
function fsyncDir(dir: string): void {
  try {
    const fd = fs.openSync(dir, "r");
    try {
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
  } catch {
    // directory fsync is not supported everywhere (e.g. some network filesystems); the rename stands
  }
}

function removeQuietly(p: string): void {
  try {
    fs.rmSync(p, { recursive: true, force: true });
  } catch {
    // nothing there to remove (e.g. its parent is not a folder)
  }
}

/**
 * Writes the files of `files` (name -> bytes, in order) and then their manifest into `<dir>.partial-<pid>`,
 * and renames it to `dir`. An existing `dir` is never overwritten (K2); any failure removes the partial
 * folder and throws CheckpointWriteError.
 */
export function writeFolderAtomic(dir: string, step: number, files: Iterable<[string, Uint8Array]>): void {
  if (fs.existsSync(dir)) {
    throw new UserError(
      "K2",
      `checkpoint folder ${dir} already exists; refusing to overwrite it. Move it away or choose another --out.`,
    );
  }
  const tmp = partialDirOf(dir, process.pid);
  try {
    fs.mkdirSync(path.dirname(dir), { recursive: true });
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.mkdirSync(tmp);
    const listed: CheckpointManifest["files"] = {};
    for (const [name, bytes] of files) {
      writeSynced(path.join(tmp, name), bytes);
      listed[name] = { size: bytes.byteLength, sha256: createHash("sha256").update(bytes).digest("hex") };
    }
    const manifest: CheckpointManifest = { format: MANIFEST_FORMAT, step, files: listed };
    writeSynced(path.join(tmp, MANIFEST_FILE), jsonBytes(manifest));
    fsyncDir(tmp);
    fs.renameSync(tmp, dir);
    fsyncDir(path.dirname(dir));
  } catch (e) {
    removeQuietly(tmp); // best effort: the write's own error is the one to report
    throw new CheckpointWriteError(dir, e);
  }
}

/** Write a complete checkpoint folder at `dir`: the tensor parts' files (weights, AdamW moments), the JSON documents, the manifest. */
export function writeCheckpointFolder(
  dir: string,
  cfg: LlamaConfig,
  params: Float32Array,
  m: Float32Array,
  v: Float32Array,
  docs: CheckpointDocs,
): void {
  const step = docs["trainer_state.json"].step;
  function* files(): Generator<[string, Uint8Array]> {
    for (const part of TENSOR_PARTS)
      yield [part.file, encodeSafetensors(part.stateDict(cfg, { params, m, v }), { format: "pt" })];
    for (const [name, doc] of Object.entries(docs)) yield [name, jsonBytes(doc)];
  }
  writeFolderAtomic(dir, step, files());
}
