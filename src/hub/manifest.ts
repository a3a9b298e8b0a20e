/**
 * K7: the manifest every checkpoint folder carries, in the same commit as the files it lists: the
 * size and sha256 of every other file. It lets `--resume auto` prove a checkpoint complete (R5)
 * without trusting the pointer. A leaf module: written by src/checkpoint.ts, read by resume.ts.
 */
/** K7: the file in every checkpoint folder (and its Hub commit) that lists every other file's size and sha256. */
export const MANIFEST_FILE = "manifest.json";

export interface CheckpointManifest {
  format: "tstrain-manifest/1";
  step: number;
  files: Record<string, { size: number; sha256: string }>;
}

/** Parses and checks a manifest; throws a plain Error saying what is wrong. */
export function parseManifest(raw: string | Buffer, where: string): CheckpointManifest {
  let v: unknown;
  try {
    v = JSON.parse(raw.toString());
  } catch {
    throw new Error(`${where} is not valid JSON`);
  }
  const m = v as CheckpointManifest;
  if (!m || m.format !== "tstrain-manifest/1" || !Number.isSafeInteger(m.step) || typeof m.files !== "object" || m.files === null) {
    throw new Error(`${where} is not a tstrain manifest ({format: "tstrain-manifest/1", step, files})`);
  }
  for (const [k, f] of Object.entries(m.files)) {
    if (!f || !Number.isSafeInteger(f.size) || f.size < 0 || typeof f.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(f.sha256) || k === MANIFEST_FILE) {
      throw new Error(`${where}: entry ${JSON.stringify(k)} is not {size, sha256}`);
    }
  }
  return m;
}

