// The cursor's own rules, one by one (C1, C2, C3): what it accepts, what it refuses and how the refusal reads.
// Written to kill the mutants StrykerJS found surviving in src/data/cursor.ts (test/MUTATION.md).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import {
  CURSOR_FILE,
  loadCursor,
  makeCursor,
  samplesAt,
  saveCursor,
  validateResume,
  type Cursor,
} from "../src/data/cursor";
import { tmpDir } from "./helpers/tmp";

const SHA_A = "a".repeat(64);
const SHA_B = "0123456789abcdef".repeat(4);
const good = { step: 3, seqsPerStep: 8, seqLen: 16, seed: 5, fingerprint: SHA_A, permSha: SHA_B };

const isRange = (re: RegExp) => (e: unknown) => e instanceof RangeError && re.test((e as Error).message);
const isC1 = (re: RegExp) => (e: unknown) =>
  (e as Error).name === "UserError" && /\[C1\]$/.test((e as Error).message) && re.test((e as Error).message);

test("samples_consumed is step x seqs_per_step, and only whole, non-negative steps and positive step sizes are accepted (C2)", () => {
  assert.equal(samplesAt(0, 8), 0);
  assert.equal(samplesAt(3, 8), 24);
  assert.equal(samplesAt(5, 1), 5);
  for (const step of [-1, 1.5, Number.NaN])
    assert.throws(() => samplesAt(step, 8), isRange(new RegExp(`samplesAt: step ${step} must be a whole number >= 0`)));
  for (const s of [0, -2, 2.5])
    assert.throws(() => samplesAt(1, s), isRange(new RegExp(`samplesAt: seqsPerStep ${s} must be a positive integer`)));
});

test("makeCursor records the position and identity, and refuses a field out of its rule with a RangeError naming it (C1, C2)", () => {
  const c = makeCursor(good);
  assert.deepEqual(c, {
    seq_len: 16,
    samples_consumed: 24,
    shuffle_seed: 5,
    dataset_files_sha: SHA_A,
    shuffle_perm_sha: SHA_B,
    step: 3,
  });
  assert.equal(
    makeCursor({ ...good, seqLen: 1, seed: 0, step: 0 }).seq_len,
    1,
    "seq_len 1 and seed 0 and step 0 are valid",
  );
  assert.throws(
    () => makeCursor({ ...good, seqLen: 0 }),
    isRange(/^makeCursor: cursor seq_len=0 must be a positive whole number$/),
  );
  assert.throws(() => makeCursor({ ...good, seqLen: 2.5 }), isRange(/seq_len=2.5 must be a positive whole number/));
  assert.throws(
    () => makeCursor({ ...good, seed: -1 }),
    isRange(/^makeCursor: cursor shuffle_seed=-1 must be a whole number >= 0$/),
  );
  assert.throws(() => makeCursor({ ...good, seed: 0.5 }), isRange(/shuffle_seed=0.5/));
  for (const bad of ["A".repeat(64), "a".repeat(63), "a".repeat(65), `x${"a".repeat(64)}`, `${"a".repeat(64)}x`]) {
    assert.throws(
      () => makeCursor({ ...good, fingerprint: bad }),
      isRange(/^makeCursor: cursor dataset_files_sha=".*" must be 64 lowercase hex digits$/),
      bad,
    );
    assert.throws(
      () => makeCursor({ ...good, permSha: bad }),
      isRange(/shuffle_perm_sha=".*" must be 64 lowercase hex digits/),
      bad,
    );
  }
});

test("saveCursor writes cursor.json atomically with a trailing newline, closes what it opens, and refuses an invalid cursor (C1)", () => {
  const dir = tmpDir("cursor-save");
  const fds = () => fs.readdirSync("/proc/self/fd").length;
  const before = fds();
  saveCursor(dir, makeCursor(good));
  assert.equal(fds(), before, "no file descriptor left open");
  const text = fs.readFileSync(path.join(dir, CURSOR_FILE), "utf8");
  assert.ok(text.endsWith("}\n"), "one trailing newline");
  assert.deepEqual(fs.readdirSync(dir), [CURSOR_FILE], "no temp file left");
  assert.deepEqual(loadCursor(dir), makeCursor(good));
  const bad = { ...makeCursor(good), samples_consumed: -8 } as Cursor;
  assert.throws(
    () => saveCursor(dir, bad),
    isRange(/^saveCursor: cursor samples_consumed=-8 must be a whole number >= 0$/),
  );
  assert.deepEqual(loadCursor(dir), makeCursor(good), "the refused cursor did not replace the saved one");
});

test("loadCursor: none is null, anything but a valid cursor object is refused as damaged (C1)", () => {
  const dir = tmpDir("cursor-load");
  assert.equal(loadCursor(dir), null);
  const p = path.join(dir, CURSOR_FILE);
  const write = (body: string) => fs.writeFileSync(p, body);
  for (const body of ["[]", "null", "5", '"cursor"']) {
    write(body);
    assert.throws(
      () => loadCursor(dir),
      isC1(
        new RegExp(
          `cursor ${p.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")} is not a JSON object; resume from an earlier verified checkpoint`,
        ),
      ),
      body,
    );
  }
  write("{not json");
  assert.throws(
    () => loadCursor(dir),
    isC1(/is not valid JSON .*the checkpoint is damaged; resume from an earlier verified checkpoint/),
  );
  const c = makeCursor(good) as unknown as Record<string, unknown>;
  for (const [k, v, rule] of [
    ["seq_len", 0, "a positive whole number"],
    ["step", -1, "a whole number >= 0"],
    ["shuffle_perm_sha", 7, "64 lowercase hex digits"],
  ] as const) {
    write(JSON.stringify({ ...c, [k]: v }));
    assert.throws(
      () => loadCursor(dir),
      isC1(
        new RegExp(
          `^cursor .*cursor\\.json: cursor ${k}=${v} must be ${rule}; the checkpoint is damaged, resume from an earlier verified checkpoint`,
        ),
      ),
      k,
    );
  }
  write(JSON.stringify({ ...c, shuffle_perm_sha: [c.shuffle_perm_sha] }));
  assert.throws(
    () => loadCursor(dir),
    isC1(/cursor shuffle_perm_sha=\[".*"\] must be 64 lowercase hex digits/),
    "a sha inside an array is not a sha",
  );
  const { step: _drop, ...noStep } = c;
  write(JSON.stringify(noStep));
  assert.throws(() => loadCursor(dir), isC1(/cursor has no "step"/));
  write(JSON.stringify({ ...c, extra: 1 }));
  assert.deepEqual(Object.keys(loadCursor(dir)!).sort(), Object.keys(c).sort(), "unknown keys are dropped");
});

test("a resume is refused on each identity field with the advice for that field, and on a cursor off the step grid (C3)", () => {
  const c = makeCursor(good);
  const exp = { seqLen: 16, seed: 5, permSha: SHA_B, fingerprint: SHA_A, seqsPerStep: 8 };
  assert.deepEqual(validateResume(c, exp, "ck"), { startStep: 3, startSample: 24 });
  const cases: Array<[Partial<typeof exp>, RegExp]> = [
    [{ seqLen: 32 }, /cursor seq_len=16 != current 32; .*: run the same command with --seq-len 16 \(the run's\)/],
    [{ seed: 6 }, /cursor shuffle_seed=5 != current 6; .*: run the same command with --data-seed 5 \(the run's\)/],
    [
      { permSha: SHA_A },
      /cursor shuffle_perm_sha=.* != current .*the window order differs \(window count or permutation algorithm changed\); resume with the same mix, seq_len and seed/,
    ],
    [
      { fingerprint: SHA_B },
      /cursor dataset_files_sha=.*the mix's shard bytes differ from the ones the run was trained on; point --root at the original mix/,
    ],
    [{ seqsPerStep: 16 }, /samples_consumed=24 is not a whole number of steps at seqs_per_step=16/],
  ];
  for (const [change, re] of cases) {
    assert.throws(
      () => validateResume(c, { ...exp, ...change }, "ck"),
      (e: Error) =>
        e.name === "UserError" &&
        /\[C3\]$/.test(e.message) &&
        /^resume refused: ck /.test(e.message) &&
        re.test(e.message),
      JSON.stringify(change),
    );
  }
  assert.throws(
    () => validateResume({ ...c, step: 2 }, exp, "ck"),
    /step=2 and samples_consumed=24 disagree at seqs_per_step=8 \(2 x 8 = 16\)/,
  );
  assert.throws(() => validateResume(null, exp, "ck"), /resume refused: ck has no cursor\.json/);
});
