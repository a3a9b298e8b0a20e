// The data budget's rules (D1, D6, D7): the mix's token budget, no wrap, the validation windows, argument by argument. Written to kill the mutants StrykerJS found
// surviving in src/data/budget.ts (test/MUTATION.md).
import { test } from "node:test";
import assert from "node:assert/strict";
import { checkNoWrap, mixTokenWarning, valWindowCount } from "../src/data/budget";

const plan = { nWindows: 100, startStep: 0, stepsPlanned: 10, seqsPerStep: 8, seqLen: 16 };
const rangeErr = (re: RegExp) => (e: unknown) => e instanceof RangeError && re.test((e as Error).message);
const userErr = (rule: string, re: RegExp) => (e: unknown) =>
  (e as Error).name === "UserError" && (e as Error).message.endsWith(`[${rule}]`) && re.test((e as Error).message);

test("the D1 warning appears only when the mix holds fewer tokens than --tokens", () => {
  assert.equal(mixTokenWarning(1000, 1000), null, "exactly enough: no warning");
  assert.equal(mixTokenWarning(1001, 1000), null);
  assert.equal(mixTokenWarning(999, 1000), "WARNING mix has 999 tokens < target 1,000 (--tokens) [D1]");
});

test("checkNoWrap refuses arguments that are not whole numbers >= 0, and a zero step size or window length, by name", () => {
  for (const k of Object.keys(plan) as Array<keyof typeof plan>) {
    for (const v of [-1, 1.5, Number.NaN]) {
      assert.throws(
        () => checkNoWrap({ ...plan, [k]: v }),
        rangeErr(new RegExp(`^checkNoWrap: ${k}=${v} must be a whole number >= 0$`)),
        `${k}=${v}`,
      );
    }
  }
  assert.throws(
    () => checkNoWrap({ ...plan, seqsPerStep: 0 }),
    rangeErr(/^checkNoWrap: seqsPerStep and seqLen must be >= 1$/),
  );
  assert.throws(() => checkNoWrap({ ...plan, seqLen: 0 }), rangeErr(/seqsPerStep and seqLen must be >= 1/));
  assert.deepEqual(
    checkNoWrap({ ...plan, seqsPerStep: 1, seqLen: 1 }),
    { available: 100, needed: 10, marginPct: 900 },
    "1 is a valid step size and window length",
  );
});

test("checkNoWrap: the margin, an exact fit, nothing left to read, and the horizon on resume (D6)", () => {
  assert.deepEqual(checkNoWrap(plan), { available: 100, needed: 80, marginPct: 25 });
  assert.deepEqual(
    checkNoWrap({ ...plan, nWindows: 80 }),
    { available: 80, needed: 80, marginPct: 0 },
    "an exact fit runs",
  );
  assert.deepEqual(
    checkNoWrap({ ...plan, startStep: 10 }),
    { available: 20, needed: 0, marginPct: Infinity },
    "at the horizon nothing is needed",
  );
  assert.deepEqual(
    checkNoWrap({ ...plan, nWindows: 80, startStep: 10 }),
    { available: 0, needed: 0, marginPct: Infinity },
    "nothing left and nothing needed",
  );
  assert.throws(
    () => checkNoWrap({ ...plan, nWindows: 79 }),
    userErr("D6", /short by 1 windows \(16 tokens\)\. The mix covers at most 9 steps/),
  );
  assert.throws(
    () => checkNoWrap({ ...plan, startStep: 11 }),
    userErr("D6", /resume point step 11 is beyond the planned horizon of 10 steps/),
  );
});

test("valWindowCount: min(max(1, val_tokens // seq_len), val_total // seq_len), refusals named (D7)", () => {
  assert.equal(valWindowCount(256, 1024, 16), 16);
  assert.equal(valWindowCount(0, 1024, 16), 1, "at least one window");
  assert.equal(valWindowCount(1 << 20, 1024, 16), 64, "no more than the val shards hold");
  assert.equal(valWindowCount(5, 5, 1), 5, "seq_len 1 is valid");
  for (const s of [0, -1, 2.5])
    assert.throws(
      () => valWindowCount(256, 1024, s),
      rangeErr(new RegExp(`^valWindowCount: seqLen ${s} must be a positive integer$`)),
    );
  for (const v of [-1, 0.5])
    assert.throws(
      () => valWindowCount(v, 1024, 16),
      userErr("D7", new RegExp(`^--val-tokens ${v} must be a whole number >= 0`)),
    );
  assert.throws(() => valWindowCount(256, 0, 16), userErr("D7", /the mix has no val tokens \(val_total_tokens=0\)/));
  assert.throws(
    () => valWindowCount(256, 15, 16),
    userErr("D7", /the val shards hold 15 tokens, less than one window of seq_len 16/),
  );
});
