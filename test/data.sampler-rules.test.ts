// The sampler's own argument rules (D4, D6, D7): every index it is given is checked against its range and named
// in the refusal. Written to kill the mutants StrykerJS found surviving in src/data/sampler.ts (test/MUTATION.md).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readManifest } from "../src/data/manifest";
import { WindowPermutation } from "../src/data/permutation";
import { checkGeometry, permIndex, seqsPerStep, TrainStream, ValStream, type Geometry } from "../src/data/sampler";
import { PackedTokenStore } from "../src/data/token-store";
import { writePositionalMix } from "./helpers/mix";
import { tmpDir } from "./helpers/tmp";

const g: Geometry = { world: 2, accum: 3, microBatch: 2, seqLen: 4 };
const rangeErr = (re: RegExp) => (e: unknown) => e instanceof RangeError && re.test((e as Error).message);
const userErr = (rule: string, re: RegExp) => (e: unknown) =>
  (e as Error).name === "UserError" && (e as Error).message.endsWith(`[${rule}]`) && re.test((e as Error).message);

test("a geometry needs positive whole numbers, named in the refusal; 1 is valid everywhere (P6)", () => {
  checkGeometry({ world: 1, accum: 1, microBatch: 1, seqLen: 1 });
  assert.equal(seqsPerStep(g), 12);
  for (const k of ["world", "accum", "microBatch", "seqLen"] as const) {
    for (const v of [0, -1, 1.5])
      assert.throws(
        () => seqsPerStep({ ...g, [k]: v }),
        rangeErr(new RegExp(`^Geometry\\.${k} must be a positive integer, got ${v}$`)),
        `${k}=${v}`,
      );
  }
});

test("permIndex takes each coordinate in its range only, and names the one that is not (D6)", () => {
  assert.equal(permIndex(0, 0, 0, 0, g), 0);
  assert.equal(
    permIndex(2, 1, 2, 1, g),
    2 * 12 + (2 * 2 + 1) * 2 + 1,
    "the last row of the last micro-batch of the last rank",
  );
  for (const s of [-1, 0.5])
    assert.throws(
      () => permIndex(s, 0, 0, 0, g),
      rangeErr(new RegExp(`^permIndex: step ${s} must be a whole number >= 0$`)),
    );
  for (const r of [-1, 2, 0.5])
    assert.throws(
      () => permIndex(0, r, 0, 0, g),
      rangeErr(new RegExp(`^permIndex: rank ${r} outside \\[0, world=2\\)$`)),
    );
  for (const m of [-1, 3, 0.5])
    assert.throws(
      () => permIndex(0, 0, m, 0, g),
      rangeErr(new RegExp(`^permIndex: micro ${m} outside \\[0, accum=3\\)$`)),
    );
  for (const w of [-1, 2, 0.5])
    assert.throws(
      () => permIndex(0, 0, 0, w, g),
      rangeErr(new RegExp(`^permIndex: row ${w} outside \\[0, microBatch=2\\)$`)),
    );
});

test("the streams refuse a permutation of another size, an index past the split, a short buffer and a val count out of range (D4, D6, D7)", () => {
  const root = tmpDir("sampler-rules");
  writePositionalMix(root, [48], [12]); // 12 train windows of 4 tokens, 3 val windows
  const m = readManifest(root);
  const train = PackedTokenStore.open(root, m, "train");
  assert.throws(
    () => new TrainStream(train, new WindowPermutation(11, 1), g),
    userErr("D4", /the permutation covers 11 windows but the train split holds 12 windows of 4 tokens/),
  );
  const st = new TrainStream(train, new WindowPermutation(12, 1), g);
  assert.equal(st.readMicroBatch(0, 1, 2).length, 8, "step 0 ends exactly at window 12");
  assert.throws(
    () => st.windowFor(1, 0, 0, 0),
    userErr("D6", /step 1 needs permutation index 12 but the train split has only 12 windows: the epoch never wraps/),
  );
  assert.throws(
    () => st.readMicroBatch(0, 0, 0, new Int32Array(7)),
    rangeErr(/^readMicroBatch: out has 7 slots, needs 8$/),
  );
  const out = new Int32Array(9);
  assert.equal(st.readMicroBatch(0, 0, 0, out), out, "a longer buffer is used as given");
  const val = PackedTokenStore.open(root, m, "val");
  for (const n of [0, 4, 1.5])
    assert.throws(
      () => new ValStream(val, 4, n),
      userErr("D7", new RegExp(`^validation asks for ${n} windows of 4 tokens but the val split holds 3`)),
      `nVal=${n}`,
    );
  assert.equal(new ValStream(val, 4, 1).nVal, 1, "one val window is enough");
  const vs = new ValStream(val, 4, 3);
  assert.deepEqual([...vs.read(2)], [8, 9, 10, 11]);
  for (const i of [-1, 3, 0.5])
    assert.throws(() => vs.read(i), rangeErr(new RegExp(`^ValStream\\.read: index ${i} outside \\[0, nVal=3\\)$`)));
});
