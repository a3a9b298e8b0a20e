/**
 * M6 recomputation policies: selective (the checkpointed forward keeps each block's matMul outputs, the default
 * when they fit in ckptKeepBytes) and whole-block (ckptKeepBytes 0) give gradients and losses bit-identical to
 * the non-checkpointed pass, on wasm and cpu, and leave the tfjs tensor count flat.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs-core";
import { initBackend } from "../src/model/backend";
import { Llama } from "../src/model/llama";
import { loadTinyFixture } from "./helpers/fixture";

const { cfg, B, T, ids, layout, weights } = loadTinyFixture();

for (const backend of ["wasm", "cpu"] as const) {
  test(`on ${backend}, selective and whole-block recomputation give bit-identical gradients to no checkpointing (M6)`, async () => {
    await initBackend(backend);
    const before = tf.memory().numTensors;
    const run = (o: { gradCkpt: boolean; ckptKeepBytes?: number }) => {
      const m = new Llama(cfg, o);
      m.setWeights(weights);
      const g = new Float32Array(layout.total);
      const loss = m.lossAndGrads(ids, B, T, 1, g);
      const n = tf.memory().numTensors;
      const g2 = new Float32Array(layout.total);
      assert.equal(m.lossAndGrads(ids, B, T, 1, g2), loss, "run to run: same loss");
      assert.deepEqual(g2, g, "run to run: same gradients");
      assert.equal(tf.memory().numTensors, n, "tensor count flat across passes");
      m.dispose();
      return { loss, g };
    };
    const plain = run({ gradCkpt: false });
    const selective = run({ gradCkpt: true });
    const whole = run({ gradCkpt: true, ckptKeepBytes: 0 });
    assert.equal(selective.loss, plain.loss);
    assert.equal(whole.loss, plain.loss);
    assert.deepEqual(selective.g, plain.g);
    assert.deepEqual(whole.g, plain.g);
    assert.equal(tf.memory().numTensors, before, "dispose() leaves no tensors");
    assert.throws(() => new Llama(cfg, { gradCkpt: true, ckptKeepBytes: -1 }), RangeError);
  });
}
