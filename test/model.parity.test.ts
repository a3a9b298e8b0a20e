/**
 * M4 / M6 parity against the float64 PyTorch reference in test/fixtures/llama-tiny (HF LlamaForCausalLM
 * math): loss within 1e-5 relative, logits and every gradient within 1e-4 relative (||a-b||/||b||), on
 * the wasm and the cpu backends, with gradient checkpointing on and off.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs-core";
import { initBackend } from "../src/model/backend";
import { Llama } from "../src/model/llama";
import { FIX, loadTinyFixture } from "./helpers/fixture";
import { relErr } from "./helpers/numeric";
import { readSafetensors } from "../src/model/safetensors";



const { cfg, ref, B, T, ids, layout, weights } = loadTinyFixture();
const refGrads = readSafetensors(path.join(FIX, "grads.f64.safetensors")).tensors;
const refLogits = readSafetensors(path.join(FIX, "logits.f64.safetensors")).tensors.get("logits")!.data as Float64Array;

for (const backend of ["wasm", "cpu"] as const) {
  const results = new Map<boolean, { loss: number; grads: Float32Array }>();
  for (const gradCkpt of [false, true]) {
    test(`on ${backend} with gradCkpt=${gradCkpt}, loss, logits and every gradient match the float64 reference (M4, M6)`, async () => {
      await initBackend(backend);
      const m = new Llama(cfg, { gradCkpt });
      m.setWeights(weights);
      const grads = new Float32Array(layout.total);
      const loss = m.lossAndGrads(ids, B, T, 1, grads);
      assert.ok(Math.abs(loss - ref.loss) / ref.loss < 1e-5, `loss ${loss} vs ${ref.loss}`);
      assert.ok(Math.abs(m.loss(ids, B, T) - ref.loss) / ref.loss < 1e-5, "loss() agrees");
      const le = relErr(m.logits(ids, B, T), refLogits);
      assert.ok(le < 1e-4, `logits rel err ${le}`);
      let worst = 0;
      for (const e of layout.entries) {
        const r = refGrads.get(e.name);
        assert.ok(r, `reference has ${e.name}`);
        const err = relErr(grads.subarray(e.offset, e.offset + e.size), r.data as Float64Array);
        assert.ok(err < 1e-4, `${e.name}: gradient rel err ${err}`);
        worst = Math.max(worst, err);
      }
      console.log(`${backend} gradCkpt=${gradCkpt}: loss rel err ${(Math.abs(loss - ref.loss) / ref.loss).toExponential(2)}, logits ${le.toExponential(2)}, worst gradient ${worst.toExponential(2)}`);
      results.set(gradCkpt, { loss, grads });
      m.dispose();
    });
  }

  test(`on ${backend}, gradient checkpointing gives bit-identical gradients and loss (M6)`, () => {
    const a = results.get(false), b = results.get(true);
    assert.ok(a && b, "both parity runs ran");
    assert.equal(a.loss, b.loss);
    assert.deepEqual(a.grads, b.grads);
  });

  test(`on ${backend}, gradients with gradScale 65536 are exactly 65536 x the unscaled ones and accumulate with += (P2)`, async () => {
    await initBackend(backend);
    const m = new Llama(cfg, { gradCkpt: true });
    m.setWeights(weights);
    const g1 = new Float32Array(layout.total), g2 = new Float32Array(layout.total);
    const l1 = m.lossAndGrads(ids, B, T, 1, g1);
    const l2 = m.lossAndGrads(ids, B, T, 65536, g2);
    assert.equal(l1, l2, "the returned loss is unscaled");
    let mismatches = 0;
    for (let i = 0; i < g1.length; i++) if (g2[i] !== 65536 * g1[i]) mismatches++;
    assert.equal(mismatches, 0, "scaled gradients differ from 65536 x unscaled");
    // a second call adds into the same buffer
    m.lossAndGrads(ids, B, T, 1, g1);
    const again = new Float32Array(layout.total);
    m.lossAndGrads(ids, B, T, 1, again);
    const twice = again.map((x) => 2 * x);
    // the embedding takes several adds per call (head + scattered rows), so 2g is not bit-exact there
    assert.ok(relErr(g1, twice) < 1e-6, "a second call adds its gradient to what gradOut held");
    const firstLayer = layout.entries[1];
    for (let i = firstLayer.offset; i < layout.total; i++) assert.equal(g1[i], twice[i]);
    m.dispose();
  });

  test(`on ${backend}, repeated passes leave the tfjs tensor count flat`, async () => {
    await initBackend(backend);
    for (const gradCkpt of [false, true]) {
      const before = tf.memory().numTensors;
      const m = new Llama(cfg, { gradCkpt });
      m.setWeights(weights);
      const g = new Float32Array(layout.total);
      m.lossAndGrads(ids, B, T, 1, g);
      m.loss(ids, B, T);
      m.logits(ids, B, T);
      const after1 = tf.memory().numTensors;
      for (let i = 0; i < 3; i++) { m.lossAndGrads(ids, B, T, 1, g); m.loss(ids, B, T); m.logits(ids, B, T); }
      m.setWeights(weights);
      assert.equal(tf.memory().numTensors, after1, `gradCkpt=${gradCkpt}: tensors leak across passes`);
      m.dispose();
      assert.equal(tf.memory().numTensors, before, `gradCkpt=${gradCkpt}: dispose() leaves tensors behind`);
    }
  });
}

test("chunking the LM head over tokens changes nothing beyond float rounding, batch rows stay independent (M4)", async () => {
  await initBackend("wasm");
  const whole = new Llama(cfg, { gradCkpt: false });
  const chunked = new Llama(cfg, { gradCkpt: true, headChunkTokens: 5 }); // 32 tokens -> 7 chunks, the last partial
  whole.setWeights(weights);
  chunked.setWeights(weights);
  const g1 = new Float32Array(layout.total), g2 = new Float32Array(layout.total);
  const l1 = whole.lossAndGrads(ids, B, T, 1, g1), l2 = chunked.lossAndGrads(ids, B, T, 1, g2);
  assert.ok(Math.abs(l1 - l2) / l1 < 1e-6);
  assert.ok(relErr(g2, g1) < 1e-6);
  assert.ok(relErr(chunked.logits(ids, B, T), whole.logits(ids, B, T)) < 1e-6);
  // row 1 of the batch alone gives row 1's logits: no attention across sequences
  const row1 = whole.logits(ids.subarray(T), 1, T), both = whole.logits(ids, B, T);
  assert.ok(relErr(row1, both.subarray(T * cfg.vocabSize)) < 1e-6);
  whole.dispose();
  chunked.dispose();
});

test("the loss stays exact when fp32 probabilities underflow: it equals log-sum-exp minus the label logit in float64 (M4)", async () => {
  await initBackend("wasm");
  const big = weights.slice();
  const e = layout.entries[0];
  for (let i = e.offset; i < e.offset + e.size; i++) big[i] *= 300; // logits in the tens of thousands
  const m = new Llama(cfg, { gradCkpt: true });
  m.setWeights(big);
  const V = cfg.vocabSize, lg = m.logits(ids, B, T);
  let ref = 0, underflows = 0;
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T - 1; t++) {
      const row = lg.subarray((b * T + t) * V, (b * T + t + 1) * V);
      const mx = Math.max(...row);
      let se = 0;
      for (const x of row) se += Math.exp(x - mx);
      const nll = mx + Math.log(se) - row[ids[b * T + t + 1]];
      if (nll > 69) underflows++; // p < 1e-30
      ref += nll;
    }
  }
  ref /= B * (T - 1);
  assert.ok(underflows > 0, "the test must reach the underflow path");
  const loss = m.loss(ids, B, T), g = new Float32Array(layout.total);
  assert.ok(Number.isFinite(loss));
  assert.ok(Math.abs(loss - ref) / ref < 1e-5, `loss ${loss} vs ${ref}`);
  assert.equal(m.lossAndGrads(ids, B, T, 1, g), loss);
  assert.ok(g.every(Number.isFinite));
  m.dispose();
});

test("token ids outside the vocabulary are refused before any compute (M4)", async () => {
  await initBackend("cpu");
  const m = new Llama(cfg, { gradCkpt: true });
  m.setWeights(weights);
  const bad = ids.slice();
  bad[5] = cfg.vocabSize;
  assert.throws(() => m.loss(bad, B, T), /token id 96 at position 5 is outside the vocabulary \[0, 96\)/);
  assert.throws(() => m.loss(ids, B, T + 1), RangeError);
  m.dispose();
});

test("setWeights reads a view on a SharedArrayBuffer and keeps no alias to it (A2)", async () => {
  for (const backend of ["wasm", "cpu"] as const) {
    await initBackend(backend);
    const shared = new Float32Array(new SharedArrayBuffer(weights.byteLength));
    shared.set(weights);
    const m = new Llama(cfg, { gradCkpt: true });
    m.setWeights(shared);
    const before = m.loss(ids, B, T);
    shared.fill(0); // the coordinator overwrites the master weights: the replica must not change until setWeights
    assert.equal(m.loss(ids, B, T), before, backend);
    assert.ok(Math.abs(before - ref.loss) / ref.loss < 1e-5, backend);
    m.dispose();
  }
});
