/**
 * decideStep (src/optim/optim.ts), the one decision of a step that the actor runtime (Coordinator.step) and the
 * single-thread loop (SingleThreadTrainer.step) both call, rule by rule. The expected figures are written out from
 * the rules in docs/RULES.md here, not computed with the functions decideStep uses (lrFactor, clipCoef, scalerUpdate):
 * - P2: a non-finite gradient is not applied, the skip is counted, the optimizer step does not advance, the scale
 *   halves and the growth count restarts; a finite one advances the count, and the 2000th clean step doubles it;
 * - P4: the clip coefficient is min(1, 1/(norm + 1e-6)) of norm = sqrt(sumSq);
 * - P5: the LR is that of optimizer step k = applied steps so far (not the data step), and AdamW's t is k + 1.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { decideStep, unscaleFactor, type OptimizerPosition, type StepDecision } from "../src/optim/optim";

const BASE_LR = 6e-4;
/** warmup 4, flat to optimizer step 6, then down to 0 at 10 (P5); the factors below are written out by hand. */
const SHAPE = { warmup: 4, decayStart: 6, total: 10 };
const FACTOR: Record<number, number> = {
  0: 1 / 4,
  1: 2 / 4,
  2: 3 / 4,
  3: 4 / 4,
  4: 1,
  5: 1,
  6: 1,
  7: 1 - 1 / 4,
  8: 1 - 2 / 4,
  9: 1 - 3 / 4,
  10: 0,
  12: 0,
};

const at = (optSteps: number, scale = 65536, growthTracker = 0, skipped = 0): OptimizerPosition => ({
  optSteps,
  scaler: { scale, growthTracker },
  skipped,
});

function applied(d: StepDecision): Extract<StepDecision, { apply: true }> {
  assert.equal(d.apply, true, "a finite gradient is applied (P2)");
  return d as Extract<StepDecision, { apply: true }>;
}

test("a non-finite gradient is skipped: counted, the optimizer step stays, the scale halves and its growth count restarts (P2)", () => {
  for (const sumSq of [Number.NaN, Number.POSITIVE_INFINITY]) {
    const pos = at(3, 1024, 1500, 2);
    const d = decideStep(pos, { sumSq, finite: false }, BASE_LR, SHAPE);
    assert.equal(d.apply, false, `sumSq ${sumSq}: not applied`);
    assert.equal(d.gradNorm, null);
    assert.deepEqual(d.next, { optSteps: 3, scaler: { scale: 512, growthTracker: 0 }, skipped: 3 });
    assert.equal(
      d.lr,
      BASE_LR * FACTOR[3],
      "the LR reported for a skipped step is that of the step it would have been (P5)",
    );
    assert.deepEqual(pos, at(3, 1024, 1500, 2), "the position passed in is not changed (decideStep is pure)");
  }
});

test("a finite gradient is applied: the optimizer step advances, the scale stays and its growth count rises; the 2000th clean step doubles it (P2)", () => {
  const d = applied(decideStep(at(5, 1024, 7, 2), { sumSq: 0.25, finite: true }, BASE_LR, SHAPE));
  assert.deepEqual(d.next, { optSteps: 6, scaler: { scale: 1024, growthTracker: 8 }, skipped: 2 });
  const grow = applied(decideStep(at(5, 1024, 1998), { sumSq: 0.25, finite: true }, BASE_LR, SHAPE));
  assert.deepEqual(grow.next.scaler, { scale: 1024, growthTracker: 1999 }, "the 1999th clean step does not grow yet");
  const grown = applied(decideStep(at(5, 1024, 1999), { sumSq: 0.25, finite: true }, BASE_LR, SHAPE));
  assert.deepEqual(grown.next.scaler, { scale: 2048, growthTracker: 0 }, "the 2000th clean step doubles the scale");
});

test("the clip coefficient is min(1, 1/(norm + 1e-6)) of the norm sqrt(sumSq) (P4)", () => {
  const cases: Array<[number, number]> = [
    [0.25, 1], // norm 0.5: below the max, no clipping
    [0.999998 * 0.999998, 1], // norm just under 1: 1/(norm+1e-6) > 1, clamped
    [4, 1 / (2 + 1e-6)], // norm 2: halved
    [10000, 1 / (100 + 1e-6)],
  ];
  for (const [sumSq, coef] of cases) {
    const d = applied(decideStep(at(0), { sumSq, finite: true }, BASE_LR, SHAPE));
    assert.equal(d.gradNorm, Math.sqrt(sumSq), `sumSq ${sumSq}: the norm is its square root`);
    assert.equal(d.coef, coef, `sumSq ${sumSq}: clip coefficient`);
  }
});

test("the LR is that of optimizer step k = the applied steps so far, and AdamW's t is k + 1 (P5)", () => {
  for (const [k, f] of Object.entries(FACTOR)) {
    const d = applied(decideStep(at(Number(k)), { sumSq: 1, finite: true }, BASE_LR, SHAPE));
    assert.equal(d.lr, BASE_LR * f, `LR of optimizer step ${k}`);
    assert.equal(d.t, Number(k) + 1, `t of optimizer step ${k}`);
  }
  // A skip in between: the next step takes the LR and t of the step that was skipped, not of the data step.
  let pos = at(0);
  const seen: Array<[number, number]> = [];
  for (const finite of [true, false, true, true]) {
    const d = decideStep(pos, { sumSq: finite ? 1 : Number.NaN, finite }, BASE_LR, SHAPE);
    if (d.apply) seen.push([d.lr, d.t]);
    pos = d.next;
  }
  assert.deepEqual(seen, [
    [BASE_LR * FACTOR[0], 1],
    [BASE_LR * FACTOR[1], 2],
    [BASE_LR * FACTOR[2], 3],
  ]);
  assert.deepEqual(pos, { optSteps: 3, scaler: { scale: 32768, growthTracker: 2 }, skipped: 1 });
});

test("the reduce's factor averages over world*accum micro-batches and unscales by the loss scale in one multiply (P2)", () => {
  assert.equal(unscaleFactor(1, 1, 1), 1);
  assert.equal(unscaleFactor(2, 4, 65536), 1 / 524288);
  assert.equal(unscaleFactor(3, 2, 1024), 1 / 6144);
});
