import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import { loadCursor, makeCursor, saveCursor, validateResume } from "../src/data/cursor";
import { mixFingerprint } from "../src/data/fingerprint";
import { readManifest } from "../src/data/manifest";
import { permSha, WindowPermutation } from "../src/data/permutation";
import { checkNoWrap, valWindowCount } from "../src/data/budget";
import { type Geometry, permIndex, seqsPerStep, TrainStream, ValStream, checkGeometry } from "../src/data/sampler";
import { PackedTokenStore } from "../src/data/token-store";
import { editManifest, writePositionalMix } from "./helpers/mix";
import { tmpDir } from "./helpers/tmp";

// 448 train tokens over four uneven shards -> 64 windows of 7 tokens; S = 8 -> exactly 8 steps.
const SEQ = 7;
const SEED = 20260919;
const root = tmpDir("sampler");
const manifest = writePositionalMix(root, [100, 37, 250, 61], [30, 19]);
const GEOMS: Geometry[] = [
  { world: 1, accum: 4, microBatch: 2, seqLen: SEQ },
  { world: 2, accum: 2, microBatch: 2, seqLen: SEQ },
  { world: 4, accum: 1, microBatch: 2, seqLen: SEQ },
  { world: 2, accum: 4, microBatch: 1, seqLen: SEQ },
  { world: 1, accum: 1, microBatch: 8, seqLen: SEQ },
];

/** Read steps [from, to) like a run would: every rank, every micro-batch; returns (permIndex -> window). */
function readSteps(stream: TrainStream, from: number, to: number, into: Map<number, number>): void {
  const g = stream.g;
  for (let s = from; s < to; s++) {
    for (let micro = 0; micro < g.accum; micro++) {
      for (let rank = 0; rank < g.world; rank++) {
        const batch = stream.readMicroBatch(s, rank, micro);
        for (let row = 0; row < g.microBatch; row++) {
          const first = batch[row * SEQ];
          assert.equal(first % SEQ, 0, "a window starts on a multiple of seq_len");
          for (let j = 0; j < SEQ; j++)
            assert.equal(batch[row * SEQ + j], first + j, "tokens are consecutive positions");
          const p = permIndex(s, rank, micro, row, g);
          assert.ok(!into.has(p), `permutation index ${p} read twice`);
          into.set(p, first / SEQ);
        }
      }
    }
  }
}

function openStream(g: Geometry): TrainStream {
  const store = PackedTokenStore.open(root, readManifest(root), "train");
  return new TrainStream(store, new WindowPermutation(store.numWindows(SEQ), SEED), g);
}

test("a window's tokens are its stream positions, also across shard boundaries (D4, D8)", () => {
  const store = PackedTokenStore.open(root, manifest, "train");
  assert.equal(store.totalTokens, 448);
  assert.equal(store.numWindows(SEQ), 64);
  const out = new Int32Array(SEQ * 2);
  for (let w = 0; w < 64; w++) {
    store.readWindow(w, SEQ, out, SEQ);
    assert.deepEqual(
      Array.from(out.subarray(SEQ)),
      Array.from({ length: SEQ }, (_, j) => w * SEQ + j),
    );
  }
  assert.throws(() => store.readWindow(64, SEQ, out), RangeError);
  store.close();
});

test("world sizes 1, 2 and 4 at the same sequences per step visit every window exactly once, in the same global order, across arbitrary segments (D6, B1)", () => {
  const orders: number[][] = [];
  for (const g of GEOMS) {
    assert.equal(seqsPerStep(g), 8);
    const seen = new Map<number, number>();
    // a run split into uneven segments, each with a fresh stream, as separate sessions would be
    for (const [a, b] of [
      [0, 3],
      [3, 4],
      [4, 4],
      [4, 7],
      [7, 8],
    ])
      readSteps(openStream(g), a, b, seen);
    const order = Array.from({ length: 64 }, (_, p) => seen.get(p)!);
    assert.deepEqual(
      [...order].sort((x, y) => x - y),
      Array.from({ length: 64 }, (_, i) => i),
      "every window exactly once",
    );
    orders.push(order);
  }
  for (const o of orders.slice(1)) assert.deepEqual(o, orders[0], "same global order for every split of S");
  const perm = new WindowPermutation(64, SEED);
  assert.deepEqual(
    orders[0],
    Array.from({ length: 64 }, (_, i) => perm.at(i)),
    "global order = the permutation",
  );
});

test("the (step, rank, micro, row) rule is s*S + (micro*world + rank)*microBatch + row (D6)", () => {
  const g: Geometry = { world: 2, accum: 3, microBatch: 4, seqLen: SEQ };
  assert.equal(seqsPerStep(g), 24);
  assert.equal(permIndex(0, 0, 0, 0, g), 0);
  assert.equal(permIndex(5, 1, 2, 3, g), 5 * 24 + (2 * 2 + 1) * 4 + 3);
  assert.throws(() => permIndex(0, 2, 0, 0, g), RangeError);
  assert.throws(() => permIndex(0, 0, 3, 0, g), RangeError);
  assert.throws(() => permIndex(0, 0, 0, 4, g), RangeError);
});

test("a resume at any step through a saved cursor yields exactly the remaining windows (C2, C3, D5)", () => {
  const fp = mixFingerprint(root, manifest);
  const ps = permSha(64, SEED);
  for (const g of GEOMS) {
    const S = seqsPerStep(g);
    const full = new Map<number, number>();
    readSteps(openStream(g), 0, 8, full);
    for (let stop = 0; stop <= 8; stop++) {
      const ck = tmpDir("ckpt");
      saveCursor(ck, makeCursor({ step: stop, seqsPerStep: S, seqLen: SEQ, seed: SEED, fingerprint: fp, permSha: ps }));
      const { startStep, startSample } = validateResume(
        loadCursor(ck),
        { seqLen: SEQ, seed: SEED, permSha: ps, fingerprint: fp, seqsPerStep: S },
        ck,
      );
      assert.equal(startStep, stop);
      assert.equal(startSample, stop * S);
      checkNoWrap({ nWindows: 64, startStep, stepsPlanned: 8, seqsPerStep: S, seqLen: SEQ });
      const rest = new Map<number, number>();
      readSteps(openStream(g), startStep, 8, rest);
      const expected = [...full].filter(([p]) => p >= startSample);
      assert.deepEqual(
        [...rest].sort((x, y) => x[0] - y[0]),
        expected.sort((x, y) => x[0] - y[0]),
      );
      fs.rmSync(ck, { recursive: true });
    }
  }
});

test("reading past the last window refuses instead of wrapping into a second epoch (D6)", () => {
  const s = openStream(GEOMS[1]);
  assert.throws(
    () => s.readMicroBatch(8, 0, 0),
    (e: Error) =>
      e.name === "UserError" &&
      /needs permutation index 64 but the train split has only 64 windows: the epoch never wraps/.test(e.message),
  );
});

test("a plan longer than the windows is refused before step 1, naming the shortfall (D6)", () => {
  const ok = checkNoWrap({ nWindows: 64, startStep: 2, stepsPlanned: 7, seqsPerStep: 8, seqLen: SEQ });
  assert.deepEqual({ available: ok.available, needed: ok.needed }, { available: 48, needed: 40 });
  assert.equal(ok.marginPct, 20);
  assert.throws(
    () => checkNoWrap({ nWindows: 64, startStep: 2, stepsPlanned: 9, seqsPerStep: 8, seqLen: SEQ }),
    (e: Error) =>
      e.name === "UserError" &&
      e.message.includes(
        "dataset too small for the plan: 48 windows available from sample 16, 56 needed for 7 steps x 8 sequences (392 tokens); short by 8 windows (56 tokens)",
      ) &&
      e.message.includes("at most 8 steps") &&
      e.message.includes("the epoch never wraps") &&
      e.message.endsWith("[D6]"),
  );
  assert.throws(
    () => checkNoWrap({ nWindows: 64, startStep: 10, stepsPlanned: 9, seqsPerStep: 8, seqLen: SEQ }),
    /resume point step 10 is beyond the planned horizon of 9 steps.*\[D6\]/,
  );
});

test("validation reads the val split's first n_val windows in order, never shuffled (D7)", () => {
  const store = PackedTokenStore.open(root, manifest, "val");
  assert.equal(store.totalTokens, 49);
  const nVal = valWindowCount(2_000_000, manifest.val_total_tokens, SEQ);
  assert.equal(nVal, 7);
  const vs = new ValStream(store, SEQ, nVal);
  for (let i = 0; i < nVal; i++)
    assert.deepEqual(
      Array.from(vs.read(i)),
      Array.from({ length: SEQ }, (_, j) => i * SEQ + j),
    );
  assert.equal(valWindowCount(14, manifest.val_total_tokens, SEQ), 2);
  assert.equal(valWindowCount(3, manifest.val_total_tokens, SEQ), 1, "at least one window");
  assert.throws(() => new ValStream(store, SEQ, 8), /asks for 8 windows of 7 tokens but the val split holds 7.*\[D7\]/);
});

test("reading a window from a multi-gigabyte shard does not load the shard (D8)", () => {
  const big = tmpDir("sparse");
  const tokens = 600_000_000; // 2.4 GB of uint32, sparse on disk
  writePositionalMix(big, [16], [16]);
  fs.truncateSync(path.join(big, "train-00000.bin"), tokens * 4);
  editManifest(big, (o) => {
    (o.shards as Array<{ tokens: number }>)[0].tokens = tokens;
    o.total_tokens = tokens;
  });
  const m = readManifest(big); // sizes only: no shard is read here
  const before = process.memoryUsage().rss;
  const store = PackedTokenStore.open(big, m, "train");
  const out = new Int32Array(1024);
  for (const w of [0, 1000, 585_000 - 1]) store.readWindow(w, 1024, out);
  store.close();
  const grew = process.memoryUsage().rss - before;
  assert.ok(grew < 64 * 1024 * 1024, `rss grew ${grew} bytes`);
  fs.rmSync(big, { recursive: true });
});

// The sampler's own argument rules (D4, D6, D7): every index it is given is checked against its range and named
// in the refusal. Written to kill the mutants StrykerJS found surviving in src/data/sampler.ts (test/MUTATION.md).
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
