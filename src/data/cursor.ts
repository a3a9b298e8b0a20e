/**
 * The cursor: the run's data position and identity (C1–C3, D5).
 *
 * samples_consumed is a pure function of the ABSOLUTE step (C2): samplesAt(step, S) = step * S.
 * Never add a resume offset to it: an inflated cursor makes the next session skip data it never read.
 * A resume is refused (C3) when the checkpoint has no cursor, when seq_len, seed, perm sha or
 * fingerprint differ, when samples_consumed is not a whole number of steps, or when
 * step * seqs_per_step != samples_consumed. Resuming then starts at permutation index
 * samples_consumed (D5), with no replay.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { type FixWay, type FlagChange, UserError } from "../errors";
import { isWhole, type FieldRule, type Stateful } from "../checkpoint/stateful";

export interface Cursor {
  seq_len: number;
  samples_consumed: number;
  shuffle_seed: number;
  dataset_files_sha: string;
  shuffle_perm_sha: string;
  step: number;
}

export const CURSOR_FILE = "cursor.json";
const KEYS: Array<keyof Cursor> = [
  "seq_len",
  "samples_consumed",
  "shuffle_seed",
  "dataset_files_sha",
  "shuffle_perm_sha",
  "step",
];
const HEX64 = /^[0-9a-f]{64}$/;

export function samplesAt(step: number, seqsPerStep: number): number {
  if (!Number.isSafeInteger(step) || step < 0)
    throw new RangeError(`samplesAt: step ${step} must be a whole number >= 0`);
  if (!Number.isSafeInteger(seqsPerStep) || seqsPerStep < 1)
    throw new RangeError(`samplesAt: seqsPerStep ${seqsPerStep} must be a positive integer`);
  return step * seqsPerStep;
}

export function makeCursor(o: {
  step: number;
  seqsPerStep: number;
  seqLen: number;
  seed: number;
  fingerprint: string;
  permSha: string;
}): Cursor {
  const c: Cursor = {
    seq_len: o.seqLen,
    samples_consumed: samplesAt(o.step, o.seqsPerStep),
    shuffle_seed: o.seed,
    dataset_files_sha: o.fingerprint,
    shuffle_perm_sha: o.permSha,
    step: o.step,
  };
  checkCursorFields(c as unknown as Record<string, unknown>, "makeCursor", (m) => new RangeError(m));
  return c;
}

function checkCursorFields(o: Record<string, unknown>, where: string, fail: (m: string) => Error): void {
  for (const k of KEYS) if (!(k in o)) throw fail(`${where}: cursor has no "${k}"`);
  for (const k of ["seq_len"] as const)
    if (!(Number.isSafeInteger(o[k]) && (o[k] as number) >= 1))
      throw fail(`${where}: cursor ${k}=${JSON.stringify(o[k])} must be a positive whole number`);
  for (const k of ["samples_consumed", "shuffle_seed", "step"] as const) {
    if (!(Number.isSafeInteger(o[k]) && (o[k] as number) >= 0))
      throw fail(`${where}: cursor ${k}=${JSON.stringify(o[k])} must be a whole number >= 0`);
  }
  for (const k of ["dataset_files_sha", "shuffle_perm_sha"] as const) {
    if (typeof o[k] !== "string" || !HEX64.test(o[k] as string))
      throw fail(`${where}: cursor ${k}=${JSON.stringify(o[k])} must be 64 lowercase hex digits`);
  }
}

/** Write DIR/cursor.json atomically: a temp file in DIR, fsync, rename over the target, fsync DIR. */
export function saveCursor(dir: string, c: Cursor): void {
  checkCursorFields(c as unknown as Record<string, unknown>, "saveCursor", (m) => new RangeError(m));
  const body: Record<string, unknown> = {};
  for (const k of KEYS) body[k] = c[k];
  const target = path.join(dir, CURSOR_FILE);
  const tmp = path.join(dir, `.${CURSOR_FILE}.${process.pid}.${Date.now()}.tmp`);
  const fd = fs.openSync(tmp, "w");
  try {
    fs.writeSync(fd, `${JSON.stringify(body, null, 2)}\n`);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, target);
  try {
    const dfd = fs.openSync(dir, "r");
    try {
      fs.fsyncSync(dfd);
    } finally {
      fs.closeSync(dfd);
    }
  } catch {
    // directory fsync is not supported everywhere (e.g. some network filesystems); the rename stands
  }
}

/** DIR/cursor.json, or null when there is none. A malformed cursor is a UserError (C1), never a guess. */
export function loadCursor(dir: string): Cursor | null {
  const p = path.join(dir, CURSOR_FILE);
  if (!fs.existsSync(p)) return null;
  return parseCursor(fs.readFileSync(p, "utf8"), `cursor ${p}`);
}

/** The one parser of cursor.json (a local file or a Hub download, named by WHERE): every field checked (C1). */
export function parseCursor(text: string, where: string): Cursor {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new UserError(
      "C1",
      `${where} is not valid JSON (${(e as Error).message}): the checkpoint is damaged; resume from an earlier verified checkpoint`,
    );
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw))
    throw new UserError("C1", `${where} is not a JSON object; resume from an earlier verified checkpoint`);
  checkCursorFields(
    raw as Record<string, unknown>,
    where,
    (m) => new UserError("C1", `${m}; the checkpoint is damaged, resume from an earlier verified checkpoint`),
  );
  const o = raw as Record<string, unknown>;
  const c = {} as Record<string, unknown>;
  for (const k of KEYS) c[k] = o[k];
  return c as unknown as Cursor;
}

/** The split of a step's sequences: micro-batch x rank threads x MPI processes x accumulation. */
export interface BatchGeometry {
  microBatch: number;
  world: number;
  hosts: number;
  accum: number;
}

const seqsOf = (g: BatchGeometry): number => g.microBatch * g.world * g.hosts * g.accum;

/**
 * C3: a resume whose sequences per step differ from the run's, said as what changed and what works: the old
 * values back, or the new split with an --accum that gives the old sequences per step. `then` is the run's
 * recorded geometry (run_config.json); without it, only the sequences per step are known.
 */
export function batchChangeRefusal(
  where: string,
  thenSeqs: number,
  then: BatchGeometry | null,
  now: BatchGeometry,
): UserError {
  const nowSeqs = seqsOf(now);
  const flags: Array<[keyof BatchGeometry, string]> = [
    ["world", "--world"],
    ["microBatch", "--micro-batch"],
    ["accum", "--accum"],
  ];
  const changed: string[] = [];
  const back: FlagChange[] = [];
  const hosts = then !== null && then.hosts !== now.hosts;
  if (then) {
    for (const [k, flag] of flags) {
      if (then[k] !== now[k]) {
        changed.push(`${flag.slice(2)} ${then[k]} → ${now[k]}`);
        back.push([flag, String(then[k])]);
      }
    }
    if (hosts) changed.push(`MPI processes ${then.hosts} → ${now.hosts}`);
  }
  const perAccum = now.microBatch * now.world * now.hosts;
  const accum = thenSeqs / perAccum;
  const ways: FixWay[] = [
    ...(back.length ? [{ changes: back, why: hosts ? `under ${then?.hosts} MPI processes` : "the run's split" }] : []),
    ...(Number.isInteger(accum) && accum >= 1 && accum !== now.accum
      ? [{ changes: [["--accum", String(accum)]] as const, why: "this split, with that many micro-batches a step" }]
      : []),
  ];
  const why = `resume refused: the batch changed: ${thenSeqs} → ${nowSeqs} sequences per step${changed.length ? ` (${changed.join(", ")})` : ""}; ${where} was trained at ${thenSeqs}, and a resumed run must read the same sequences per step: `;
  if (!ways.length)
    return new UserError(
      "C3",
      `${why}${hosts && !back.length ? `run it under ${then?.hosts} MPI processes, or ` : ""}split ${thenSeqs} sequences per step as micro-batch x world x MPI processes x accum`,
    );
  return new UserError(
    "C3",
    `${why}${hosts && !back.length ? `run it under ${then?.hosts} MPI processes, or ` : ""}run `,
    {
      ways,
    },
  );
}

/** C3: every refusal before a resume. Returns where the data stream restarts (D5). */
export function validateResume(
  c: Cursor | null,
  expected: {
    seqLen: number;
    seed: number;
    permSha: string;
    fingerprint: string;
    seqsPerStep: number;
    /** the geometry now, and the run's as run_config.json records it (null: not recorded) */
    geometry?: { now: BatchGeometry; was: BatchGeometry | null };
  },
  where: string,
): { startStep: number; startSample: number } {
  if (c === null) {
    throw new UserError(
      "C3",
      `resume refused: ${where} has no cursor.json: a checkpoint without a recorded data position cannot be resumed, only restarted; resume from a checkpoint that has one, or start fresh without --resume`,
    );
  }
  const same: Array<[string, unknown, unknown, string | FlagChange]> = [
    ["seq_len", c.seq_len, expected.seqLen, ["--seq-len", String(c.seq_len)]],
    ["shuffle_seed", c.shuffle_seed, expected.seed, ["--data-seed", String(c.shuffle_seed)]],
    [
      "shuffle_perm_sha",
      c.shuffle_perm_sha,
      expected.permSha,
      "the window order differs (window count or permutation algorithm changed); resume with the same mix, seq_len and seed",
    ],
    [
      "dataset_files_sha",
      c.dataset_files_sha,
      expected.fingerprint,
      "the mix's shard bytes differ from the ones the run was trained on; point --root at the original mix",
    ],
  ];
  for (const [k, got, want, hint] of same) {
    if (got !== want) {
      const why = `resume refused: ${where} cursor ${k}=${JSON.stringify(got)} != current ${JSON.stringify(want)}; a resumed run must read the same data in the same order: `;
      throw typeof hint === "string"
        ? new UserError("C3", `${why}${hint}`)
        : new UserError("C3", `${why}run `, { ways: [{ changes: [hint], why: "the run's" }] });
    }
  }
  const S = expected.seqsPerStep;
  const g = expected.geometry;
  // the run's sequences per step: its recorded geometry's, else the cursor's own ratio (a step 0 cursor has none)
  const thenSeqs = g?.was
    ? seqsOf(g.was)
    : c.step > 0 && c.samples_consumed % c.step === 0
      ? c.samples_consumed / c.step
      : S;
  if (g && thenSeqs !== S && c.step * thenSeqs === c.samples_consumed)
    throw batchChangeRefusal(where, thenSeqs, g.was, g.now);
  if (c.samples_consumed % S !== 0) {
    throw new UserError(
      "C3",
      `resume refused: ${where} cursor samples_consumed=${c.samples_consumed} is not a whole number of steps at seqs_per_step=${S} (micro_batch*world*accum): the batch geometry changed; resume with the geometry the run used (same sequences per step)`,
    );
  }
  if (c.step * S !== c.samples_consumed) {
    throw new UserError(
      "C3",
      `resume refused: ${where} cursor step=${c.step} and samples_consumed=${c.samples_consumed} disagree at seqs_per_step=${S} (${c.step} x ${S} = ${c.step * S}): the cursor is inconsistent; resume from an earlier verified checkpoint`,
    );
  }
  return { startStep: c.step, startSample: c.samples_consumed };
}

// ---------------------------------------------------------------- the data part of trainer_state.json (K2)

export const DATA_FIELDS: readonly FieldRule[] = [
  {
    field: "seqs_per_step",
    must: "must be a whole number > 0",
    ok: (t) => isWhole(t.seqs_per_step) && (t.seqs_per_step as number) > 0,
  },
];

/**
 * The data part of a checkpoint's trainer state: the sequences a step reads (the plan's). The data position
 * itself is cursor.json (makeCursor), which the session's setup restores and checks before any work
 * (validateResume, C3, against this same seqs_per_step), so putting a saved state back changes nothing here.
 */
export function dataStateful(seqsPerStep: number): Stateful<{ seqs_per_step: number }> {
  return {
    name: "data",
    fields: DATA_FIELDS,
    stateDict: () => ({ seqs_per_step: seqsPerStep }),
    loadStateDict: () => undefined,
  };
}
