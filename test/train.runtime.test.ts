/**
 * The actor runtime's step, checked against reference step math, at the level of
 * behaviour: spawn the coordinator and its rank workers, run steps, and compare what lands in shared memory
 * (master weights, both AdamW moments) with the reference AdamW applied to the same pre-step state.
 *
 * Independent references, so a defect in the runtime cannot hide behind itself:
 * - the gradient: the single-thread loop (src/single-thread.ts) computes the averaged, unscaled gradient of the
 *   same windows at the same weights in one thread; the runtime's reduced gradient (slot 0) must equal it;
 * - the LR: the trapezoid written out by hand for the shape used (P5), not lrFactor;
 * - the clip coefficient: min(1, 1 / (||g|| + 1e-6)) from that gradient in float64 (P4);
 * - the update: adamwSlice (test/helpers/optim-reference.ts, float64 intermediates) with torch's hyper-parameters (P3), t = applied steps + 1.
 *
 * Tolerance (stated once, used for weights and both moments, element-wise):
 *   |runtime - reference| <= REL * |reference| + ABS * max|reference|   with REL = 1e-5, ABS = 1e-6.
 * The runtime's kernel is float32 (optim-simd.ts) and the reference float64: their measured difference is a few
 * float32 ulps (about 1e-7 relative). A missing or wrong update is off by ~lr = 1e-3 on every weight.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Coordinator, type StepResult } from "../src/actors/coordinator";
import { SingleThreadTrainer } from "../src/single-thread";
import { newScaler, type DecayRange, type OptimizerPosition } from "../src/optim/optim";
import { adamwSlice } from "./helpers/optim-reference";
import type { RankFault } from "../src/actors/injected-faults";
import { buildConfig } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { writeSyntheticMix } from "./helpers/mix";
import { maxAbs, sameBits } from "./helpers/numeric";

const REL = 1e-5;
const ABS = 1e-6;
const SEQ = 16;
const MICRO = 2;
const SEED = 11;
const DATA_SEED = 3;
const BASE_LR = 1e-3;
const mix = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 1024 });
const model = buildConfig({ seqLen: SEQ, layers: 2, hidden: 36, vocabSize: 64 });
const ranges: DecayRange[] = paramLayout(model).entries.map((e) => ({
  lo: e.offset,
  hi: e.offset + e.size,
  decay: e.decay,
}));

/** The LR shape used here and its factors written out by hand (P5): warmup 2, decay from optimizer step 2 to 5. */
const SHAPE = { warmup: 2, decayStart: 2, total: 5 };
const FACTOR = [1 / 2, 2 / 2, 1 - 0 / 3, 1 - 1 / 3, 1 - 2 / 3];

interface Snap {
  p: Float32Array;
  m: Float32Array;
  v: Float32Array;
}

async function withRuntime<T>(
  o: { world: number; accum: number; share: boolean; fault?: RankFault; nVal?: number },
  fn: (c: Coordinator) => Promise<T>,
): Promise<T> {
  const coord = Coordinator.create({
    world: o.world,
    model,
    gradCkpt: true,
    activationBudgetBytes: 0,
    backend: "wasm",
    fault: o.fault ?? null,
    coordinatorShare: o.share,
    data: { root: mix.root, seqLen: SEQ, dataSeed: DATA_SEED, microBatch: MICRO, accum: o.accum, nVal: o.nVal ?? 0 },
  });
  initWeights(model, SEED, coord.views.params);
  try {
    await coord.spawn();
    return await fn(coord);
  } finally {
    await coord.close();
  }
}

const snap = (c: Coordinator): Snap => ({
  p: Float32Array.from(c.views.params),
  m: Float32Array.from(c.views.m),
  v: Float32Array.from(c.views.v),
});

/** The averaged, unscaled gradient of data step `step` at weights `params`, computed in one thread (single-thread.ts). */
async function referenceGradient(
  local: SingleThreadTrainer,
  params: Float32Array,
  step: number,
  scale: number,
): Promise<Float32Array> {
  local.params.set(params);
  await local.step(step, { optSteps: 0, scaler: { scale, growthTracker: 0 }, skipped: 0 }, BASE_LR, SHAPE);
  return Float32Array.from(local.grad);
}

function assertClose(name: string, got: Float32Array, want: Float32Array): void {
  const tol = ABS * maxAbs(want);
  let worst = 0,
    at = -1;
  for (let i = 0; i < want.length; i++) {
    const d = Math.abs(got[i] - want[i]);
    const excess = d - (REL * Math.abs(want[i]) + tol);
    if (!(excess <= worst)) {
      worst = excess;
      at = i;
    }
  }
  assert.ok(
    at < 0,
    `${name}: element ${at} is ${got[at]} but the reference gives ${want[at]} (tolerance ${REL} rel + ${tol} abs)`,
  );
}

/**
 * Run `steps` data steps; after each, check the runtime against the references (or, for a skipped step, that
 * nothing moved). Returns the step results.
 */
async function checkAgainstReference(o: {
  world: number;
  accum: number;
  share: boolean;
  steps: number;
  fault?: RankFault;
}): Promise<StepResult[]> {
  const local = await SingleThreadTrainer.create({
    model,
    gradCkpt: true,
    activationBudgetBytes: 0,
    backend: "wasm",
    root: mix.root,
    seqLen: SEQ,
    dataSeed: DATA_SEED,
    world: o.world,
    accum: o.accum,
    microBatch: MICRO,
    seed: SEED,
  });
  try {
    return await withRuntime(o, async (c) => {
      const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
      const results: StepResult[] = [];
      let applied = 0;
      for (let s = 0; s < o.steps; s++) {
        const before = snap(c);
        const scale = pos.scaler.scale;
        const skip = o.fault?.kind === "nan" && o.fault.step === s;
        const r = await c.step(s, pos, BASE_LR, SHAPE);
        results.push(r);
        const tag = `world ${o.world} step ${s}`;
        assert.equal(r.lr, BASE_LR * FACTOR[applied], `${tag}: the LR of optimizer step ${applied} (P5)`);
        if (skip) {
          assert.equal(r.applied, false, `${tag}: a non-finite gradient is not applied (P2)`);
          assert.equal(r.gradNorm, null);
          const after = snap(c);
          for (const k of ["p", "m", "v"] as const)
            assert.ok(sameBits(after[k], before[k]), `${tag}: ${k} untouched by the skipped step (P2)`);
          assert.equal(pos.skipped, 1, `${tag}: the skip is counted`);
          assert.equal(pos.optSteps, applied, `${tag}: the optimizer step count does not move`);
          assert.equal(pos.scaler.scale, scale / 2, `${tag}: the loss scale halves (P2)`);
          continue;
        }
        assert.equal(r.applied, true, `${tag}: applied`);
        const g = await referenceGradient(local, before.p, s, scale);
        assertClose(`${tag} reduced gradient (grad) vs the one-thread gradient`, c.views.grad, g);
        let sumSq = 0;
        for (let i = 0; i < g.length; i++) sumSq += g[i] * g[i];
        const norm = Math.sqrt(sumSq);
        assert.ok(Math.abs(r.gradNorm! - norm) <= 1e-5 * norm, `${tag}: grad norm ${r.gradNorm} vs ${norm} (P4)`);
        const coef = Math.min(1, 1 / (norm + 1e-6));
        const want: Snap = {
          p: Float32Array.from(before.p),
          m: Float32Array.from(before.m),
          v: Float32Array.from(before.v),
        };
        adamwSlice(
          want.p,
          want.m,
          want.v,
          g,
          ranges,
          0,
          g.length,
          { lr: BASE_LR * FACTOR[applied], beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 },
          coef,
          applied + 1,
        );
        const after = snap(c);
        assertClose(`${tag} m (clip coef ${coef.toFixed(4)})`, after.m, want.m);
        assertClose(`${tag} v (clip coef ${coef.toFixed(4)})`, after.v, want.v);
        assertClose(`${tag} weights`, after.p, want.p);
        applied += 1;
        assert.equal(pos.optSteps, applied);
      }
      return results;
    });
  } finally {
    local.dispose();
  }
}

test("one step of the actor runtime at world 1 moves the weights and both moments by the reference AdamW on its gradient (P3, P4, P5)", {
  timeout: 120_000,
}, async () => {
  await checkAgainstReference({ world: 1, accum: 2, share: true, steps: 1 });
});

test("one step of the actor runtime at world 2 moves the weights and both moments by the reference AdamW on its gradient (P3, P4, P5)", {
  timeout: 120_000,
}, async () => {
  await checkAgainstReference({ world: 2, accum: 1, share: false, steps: 1 });
});

for (const [world, accum, share] of [
  [1, 2, false],
  [2, 1, true],
] as const) {
  test(`five steps at world ${world}: weights and moments follow the reference AdamW each step, with the LR of the schedule and the clip coefficient of the gradient's norm (P3, P4, P5)`, {
    timeout: 180_000,
  }, async () => {
    const rs = await checkAgainstReference({ world, accum, share, steps: 5 });
    assert.deepEqual(
      rs.map((r) => r.lr / BASE_LR),
      FACTOR,
      "LR factors 0.5, 1, 1, 2/3, 1/3 (P5)",
    );
    // The clip must be exercised: at least one step with a norm above 1 (coef < 1) and so a moment that depends on it.
    assert.ok(
      rs.some((r) => r.gradNorm! > 1.05),
      `some step clips (norms ${rs.map((r) => r.gradNorm!.toFixed(3))}) (P4)`,
    );
  });
}

test("a step with a non-finite gradient leaves weights and moments untouched, is counted, halves the scale, and the next step is optimizer step 1 of the schedule (P2, P5)", {
  timeout: 180_000,
}, async () => {
  const rs = await checkAgainstReference({
    world: 2,
    accum: 1,
    share: false,
    steps: 4,
    fault: { rank: 1, step: 1, kind: "nan" },
  });
  assert.deepEqual(
    rs.map((r) => r.applied),
    [true, false, true, true],
  );
  assert.deepEqual(
    rs.map((r) => r.scaleUsed),
    [65536, 65536, 32768, 32768],
  );
});

test("the loss on one fixed batch goes down step after step when the runtime trains on it repeatedly (world 2)", {
  timeout: 120_000,
}, async () => {
  await withRuntime({ world: 2, accum: 1, share: false, nVal: 8 }, async (c) => {
    const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
    const flat = { warmup: 0, decayStart: 100, total: 100 };
    const val0 = await c.evaluate(8);
    const losses: number[] = [];
    // Data step 0 every time: the same windows, so the loss before each update is the loss on the same batch.
    for (let k = 0; k < 6; k++) losses.push((await c.step(0, pos, 3e-3, flat)).loss);
    const last = (await c.step(0, pos, 0, flat)).loss; // lr 0 applies nothing: the loss after the sixth update
    losses.push(last);
    for (let k = 1; k < losses.length; k++)
      assert.ok(
        losses[k] < losses[k - 1],
        `loss on the fixed batch after update ${k}: ${losses[k]} not below ${losses[k - 1]} (all: ${losses.map((x) => x.toFixed(4))})`,
      );
    assert.ok(losses[0] - last > 0.05, `the fixed batch's loss fell by ${losses[0] - last}`);
    const val1 = await c.evaluate(8);
    assert.ok(val1 < val0, `held-out loss on the same 8 windows: ${val0} before, ${val1} after`);
  });
});
