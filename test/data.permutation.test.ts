import { test } from "node:test";
import assert from "node:assert/strict";
import { MAX_PERM_N, permSha, WindowPermutation } from "../src/data/permutation";

function assertBijection(n: number, seed: number): void {
  const p = new WindowPermutation(n, seed);
  const seen = new Uint8Array(n);
  for (let i = 0; i < n; i++) {
    const v = p.at(i);
    assert.ok(Number.isInteger(v) && v >= 0 && v < n, `n=${n} seed=${seed}: at(${i})=${v} outside [0, n)`);
    assert.equal(seen[v], 0, `n=${n} seed=${seed}: window ${v} visited twice`);
    seen[v] = 1;
  }
}

test("the permutation is a bijection over [0, n) for tiny, odd, power-of-two and awkward sizes (D4)", () => {
  for (const n of [
    1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 255, 256, 257, 1000, 1023, 1024, 1025, 4097, 65536, 65537, 100003,
  ]) {
    for (const seed of [0, 1, 20260919]) assertBijection(n, seed);
  }
});

test("pinned: n = 1000 windows, seed 20260919 gives these first ten indices and this perm sha (D4, version-independent)", () => {
  const p = new WindowPermutation(1000, 20260919);
  assert.deepEqual(
    Array.from({ length: 10 }, (_, i) => p.at(i)),
    [192, 668, 49, 427, 843, 629, 649, 303, 142, 403],
  );
  assert.equal(permSha(1000, 20260919), "6acd0ae1f1e5c2adc151e1d32d51381c91f1bfed71a77770e615409a14605f45");
});

test("the order depends on the seed and the window count, and so does shuffle_perm_sha (D4, C3)", () => {
  const a = new WindowPermutation(1000, 1);
  const b = new WindowPermutation(1000, 2);
  const sameA = Array.from({ length: 50 }, (_, i) => a.at(i));
  const sameB = Array.from({ length: 50 }, (_, i) => b.at(i));
  assert.notDeepEqual(sameA, sameB);
  assert.notEqual(permSha(1000, 1), permSha(1000, 2));
  assert.notEqual(permSha(1000, 1), permSha(1001, 1));
  assert.equal(permSha(1000, 1), permSha(1000, 1));
  assert.match(permSha(1, 0), /^[0-9a-f]{64}$/);
});

test("any permutation index is reached in O(1), with no replay, even for 2^40 windows (D5)", () => {
  // O(1) is checked by counting work, not by timing it: every lookup runs a handful of Feistel encryptions (the
  // cycle walk: 2^42 / n < 4 expected), whatever the index. A lookup that replayed the permutation up to i, or
  // walked from 0, would run ~i of them.
  const proto = WindowPermutation.prototype as unknown as { encrypt: (x: number) => number };
  assert.equal(typeof proto.encrypt, "function", "permutation.ts has its encrypt step (the unit of work counted here)");
  const orig = proto.encrypt;
  let calls = 0;
  proto.encrypt = function (this: unknown, x: number) {
    calls++;
    return orig.call(this, x);
  };
  try {
    const n = 2 ** 40 + 3;
    const p = new WindowPermutation(n, 20260919);
    const work = (i: number) => {
      calls = 0;
      const v = p.at(i);
      return { v, calls };
    };
    const late = work(n - 1),
      mid = work(987_654_321_012),
      early = work(5);
    for (const w of [late, mid, early]) {
      assert.ok(w.v >= 0 && w.v < n);
      assert.ok(w.calls >= 1 && w.calls <= 32, `a lookup ran ${w.calls} encryptions`);
    }
    assert.notEqual(late.v, mid.v);
    let total = 0;
    for (let k = 0; k < 1000; k++) total += work(Math.floor((n - 1) * (k / 999))).calls;
    assert.ok(total <= 8 * 1000, `1000 lookups spread over [0, n) ran ${total} encryptions (expected under 4 each)`);
    assert.equal(new WindowPermutation(n, 20260919).at(n - 1), late.v, "same (n, seed) -> same window");
  } finally {
    proto.encrypt = orig;
  }
});

test("an empty window count, a too-large one or a fractional seed is refused with the rule named (D4)", () => {
  assert.throws(
    () => new WindowPermutation(0, 1),
    (e: Error) => e.name === "UserError" && /n=0/.test(e.message) && /\[D4\]/.test(e.message),
  );
  assert.throws(() => new WindowPermutation(MAX_PERM_N + 1, 1), /\[D4\]/);
  assert.throws(() => new WindowPermutation(10, 1.5), /--data-seed must be a non-negative whole number \(got 1.5\)/);
  assert.throws(
    () => new WindowPermutation(10, 1.5),
    (e: Error) => e.name === "UserError" && /\[D4\]/.test(e.message),
  );
  assert.throws(() => new WindowPermutation(10, -1), /--data-seed .*\(got -1\)/);
  for (const i of [10, -1, 1.5, Number.NaN]) {
    assert.throws(
      () => new WindowPermutation(10, 1).at(i),
      (e: Error) => e instanceof RangeError && e.message.includes(`index ${i} outside [0, 10)`),
      `at(${i})`,
    );
  }
  assert.equal(new WindowPermutation(MAX_PERM_N, 1).n, MAX_PERM_N, "the largest window count is accepted");
});

test("the Feistel domain is the smallest even-bit power of two >= n, at least 2^2 (D4)", () => {
  for (const [n, h] of [
    [1, 1],
    [4, 1],
    [5, 2],
    [16, 2],
    [17, 3],
    [64, 3],
    [65, 4],
    [2 ** 40, 20],
    [2 ** 40 + 3, 21],
  ] as const) {
    assert.equal(new WindowPermutation(n, 7).halfBits, h, `n=${n}`);
  }
});
