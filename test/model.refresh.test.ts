/**
 * Refreshing a replica's weights (every optimizer step) must be exactly a fresh replica: on wasm the refresh
 * overwrites the tensors in place, and tfjs-wasm caches XNNPACK's packed copy of every matMul's right operand
 * per tensor, so a stale packed copy would silently train on old weights. Also: the transposed twin
 * (layout.ts transposeRange, what the ranks share) gives the same replica as transposing locally.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs-core";
import { initBackend } from "../src/model/backend";
import { Llama } from "../src/model/llama";
import { transposeRange } from "../src/model/layout";
import { loadTinyFixture } from "./helpers/fixture";

const { cfg, B, T, ids, layout, weights } = loadTinyFixture();

for (const backend of ["wasm", "cpu"] as const) {
  test(`on ${backend}, a refreshed replica gives bit-identical loss and gradients to a fresh one, with or without the transposed twin`, async () => {
    await initBackend(backend);
    const before = tf.memory().numTensors;
    const w2 = Float32Array.from(weights, (x, i) => x * (1 + 0.01 * Math.sin(i)) + 1e-3 * Math.cos(i));
    const twin = new Float32Array(layout.total);
    transposeRange(layout.entries, w2, twin, 0, layout.total);
    const grads = (m: Llama) => {
      const g = new Float32Array(layout.total);
      return { loss: m.lossAndGrads(ids, B, T, 1, g), g };
    };
    const fresh = new Llama(cfg, { gradCkpt: true });
    fresh.setWeights(w2);
    const want = grads(fresh);
    fresh.dispose();
    for (const useTwin of [false, true]) {
      const m = new Llama(cfg, { gradCkpt: true });
      m.setWeights(weights);
      const old = grads(m);                     // every weight has been a matMul operand now (packed on wasm)
      assert.notDeepEqual(old.g, want.g, "the two weight sets give different gradients");
      const n = tf.memory().numTensors;
      m.setWeights(w2, useTwin ? twin : undefined);
      assert.equal(tf.memory().numTensors, n, "a refresh creates no tensors");
      const got = grads(m);
      assert.equal(got.loss, want.loss, `loss (twin ${useTwin})`);
      assert.deepEqual(got.g, want.g, `gradients (twin ${useTwin})`);
      m.setWeights(weights);                    // and back: again the first set's numbers exactly
      assert.deepEqual(grads(m).g, old.g, `back to the first weights (twin ${useTwin})`);
      m.dispose();
    }
    assert.equal(tf.memory().numTensors, before, "dispose() leaves no tensors");
    const m = new Llama(cfg, { gradCkpt: false });
    assert.throws(() => m.setWeights(weights, new Float32Array(3)), /flatT has 3 floats/);
  });
}
