/**
 * The coordinator's own optimizer slice (A2): with a core the ranks leave idle it takes one slice of the reduce and
 * of the AdamW update. The weights must not depend on who runs which slice (up to the order the slices' sums of
 * squares are added in).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Coordinator } from "../src/actors/coordinator";
import { newScaler, type OptimizerPosition } from "../src/optim/optim";
import { buildConfig } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { writeSyntheticMix } from "./helpers/mix";

const mix = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 512 });
const model = buildConfig({ seqLen: 32, layers: 2, hidden: 144, vocabSize: 64 });

async function train(
  world: number,
  coordinatorShare: boolean,
  steps: number,
): Promise<{ params: Float32Array; own: boolean; norms: number[] }> {
  const coord = Coordinator.create({
    world,
    model,
    gradCkpt: true,
    backend: "wasm",
    fault: null,
    coordinatorShare,
    data: { root: mix.root, seqLen: 32, dataSeed: 3, microBatch: 2, accum: 2 / world, nVal: 0 },
  });
  initWeights(model, 11, coord.views.params);
  const norms: number[] = [];
  try {
    await coord.spawn();
    const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
    for (let s = 0; s < steps; s++) {
      const r = await coord.step(s, pos, 3e-3, { warmup: 1, decayStart: steps, total: steps });
      assert.ok(r.applied, `step ${s} applied`);
      norms.push(r.gradNorm!);
    }
    return { params: Float32Array.from(coord.views.params), own: coord.ownSlice !== null, norms };
  } finally {
    await coord.close();
  }
}

test("the coordinator's optimizer slice changes nothing but the clip coefficient's last bits (A2, B4)", {
  timeout: 120_000,
}, async () => {
  const ranksOnly = await train(1, false, 4);
  const shared = await train(1, true, 4);
  const w2 = await train(2, true, 4);
  assert.equal(ranksOnly.own, false);
  assert.equal(shared.own, true);
  assert.ok(
    ranksOnly.norms.some((n) => n > 1),
    `the clip is active in some step (norms ${ranksOnly.norms.map((n) => n.toFixed(3))}), so the slice order matters there`,
  );
  let worst = 0;
  for (const r of [shared, w2]) {
    for (let i = 0; i < r.params.length; i++) worst = Math.max(worst, Math.abs(r.params[i] - ranksOnly.params[i]));
    for (const [i, n] of r.norms.entries())
      assert.ok(Math.abs(n - ranksOnly.norms[i]) <= 1e-5 * n, `step ${i} norm ${n} vs ${ranksOnly.norms[i]}`);
  }
  assert.ok(worst <= 1e-5, `largest weight difference ${worst}`);
  // The comparison above means something only if the weights moved: AdamW moves each weight by about lr per step
  // (a sign-sized first step), so after 4 steps at lr 3e-3 the typical weight has moved by more than 1e-3.
  const init = new Float32Array(ranksOnly.params.length);
  initWeights(model, 11, init);
  for (const r of [ranksOnly, shared, w2]) {
    let moved = 0;
    for (let i = 0; i < init.length; i++) if (Math.abs(r.params[i] - init[i]) > 1e-3) moved++;
    assert.ok(
      moved > 0.5 * init.length,
      `only ${moved} of ${init.length} weights moved by more than 1e-3 from their init`,
    );
  }
});
