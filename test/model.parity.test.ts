/**
 * M4 / M6 parity against the float64 PyTorch reference in test/fixtures/llama-tiny (HF LlamaForCausalLM
 * math): loss within 1e-5 relative, logits and every gradient within 1e-4 relative (||a-b||/||b||), on every
 * engine (tfjs-wasm, tfjs-cpu, native when it loads: test/helpers/engines.ts), with gradient checkpointing on
 * and off, the two bit-identical.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs-core";
import { Llama } from "../src/model/llama";
import { initBackend } from "../src/model/backend";
import { createTfjsKernels } from "../src/model/engine/tfjs";
import { relErr } from "./helpers/numeric";
import { FIX, loadTinyFixture } from "./helpers/fixture";
import { ENGINES, useEngine } from "./helpers/engines";
import { readSafetensors } from "../src/model/safetensors";

const { cfg, ref, B, T, ids, layout, weights } = loadTinyFixture();
const refGrads = readSafetensors(path.join(FIX, "grads.f64.safetensors")).tensors;
const refLogits = readSafetensors(path.join(FIX, "logits.f64.safetensors")).tensors.get("logits")!.data as Float64Array;

for (const engine of ENGINES) {
  const results = new Map<boolean, { loss: number; grads: Float32Array }>();
  for (const gradCkpt of [false, true]) {
    test(`on ${engine} with gradCkpt=${gradCkpt}, loss, logits and every gradient match the float64 reference (M4, M6)`, async (t) => {
      const e = await useEngine(t, engine);
      if (!e) return;
      const m = new Llama(cfg, e.kernels, { gradCkpt });
      m.bindParams(weights);
      const grads = new Float32Array(layout.total);
      const loss = m.lossAndGrads(ids, B, T, 1, grads);
      assert.ok(Math.abs(loss - ref.loss) / ref.loss < 1e-5, `loss ${loss} vs ${ref.loss}`);
      assert.ok(Math.abs(m.loss(ids, B, T) - ref.loss) / ref.loss < 1e-5, "loss() agrees");
      const le = relErr(m.logits(ids, B, T), refLogits);
      assert.ok(le < 1e-4, `logits rel err ${le}`);
      let worst = 0,
        at = "";
      for (const en of layout.entries) {
        const r = refGrads.get(en.name);
        assert.ok(r, `reference has ${en.name}`);
        const err = relErr(grads.subarray(en.offset, en.offset + en.size), r.data as Float64Array);
        assert.ok(err < 1e-4, `${en.name}: gradient rel err ${err}`);
        if (err > worst) {
          worst = err;
          at = en.name;
        }
      }
      console.log(
        `# PARITY ${engine} gradCkpt=${gradCkpt}: loss rel err ${(Math.abs(loss - ref.loss) / ref.loss).toExponential(2)}, logits ${le.toExponential(2)}, worst gradient ${worst.toExponential(2)} (${at})`,
      );
      results.set(gradCkpt, { loss, grads });
      m.dispose();
      e.kernels.dispose();
    });
  }

  test(`on ${engine}, gradient checkpointing gives bit-identical gradients and loss (M6)`, async (t) => {
    const a = results.get(false),
      b = results.get(true);
    if (!a && !b && !(await useEngine(t, engine))) return; // engine unavailable: skipped above too
    assert.ok(a && b, "both parity runs ran");
    assert.equal(a.loss, b.loss);
    assert.deepEqual(a.grads, b.grads);
  });

  test(`on ${engine}, gradients with gradScale 65536 are exactly 65536 x the unscaled ones and accumulate with += (P2)`, async (t) => {
    const e = await useEngine(t, engine);
    if (!e) return;
    const m = new Llama(cfg, e.kernels, { gradCkpt: true });
    m.bindParams(weights);
    const g1 = new Float32Array(layout.total),
      g2 = new Float32Array(layout.total);
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
    assert.ok(relErr(g1, twice) < 1e-6, "a second call adds its gradient to what gradOut held");
    m.dispose();
  });

  test(`on ${engine}, chunking the LM head over tokens changes nothing beyond float rounding, batch rows stay independent (M4)`, async (t) => {
    const e = await useEngine(t, engine);
    if (!e) return;
    const whole = new Llama(cfg, e.kernels, { gradCkpt: false });
    const chunked = new Llama(cfg, e.kernels, { gradCkpt: true, headChunkTokens: 5 }); // 32 tokens -> 7 chunks, the last partial
    whole.bindParams(weights);
    chunked.bindParams(weights);
    const g1 = new Float32Array(layout.total),
      g2 = new Float32Array(layout.total);
    const l1 = whole.lossAndGrads(ids, B, T, 1, g1),
      l2 = chunked.lossAndGrads(ids, B, T, 1, g2);
    assert.ok(Math.abs(l1 - l2) / l1 < 1e-6, `loss ${l2} vs ${l1}`);
    assert.ok(relErr(g2, g1) < 1e-6, `gradients rel err ${relErr(g2, g1)}`);
    assert.ok(relErr(chunked.logits(ids, B, T), whole.logits(ids, B, T)) < 1e-6);
    // row 1 of the batch alone gives row 1's logits: no attention across sequences
    const row1 = whole.logits(ids.subarray(T), 1, T),
      both = whole.logits(ids, B, T);
    assert.ok(relErr(row1, both.subarray(T * cfg.vocabSize)) < 1e-6);
  });

  test(`on ${engine}, the model multiplies against the bound parameters as they are now: an update in shared memory is seen by the next pass, with no refresh (A2, B4)`, async (t) => {
    const e = await useEngine(t, engine);
    if (!e) return;
    const shared = new Float32Array(new SharedArrayBuffer(weights.byteLength));
    shared.set(weights);
    const w2 = Float32Array.from(weights, (x, i) => x * (1 + 0.01 * Math.sin(i)) + 1e-3 * Math.cos(i));
    const run = (m: Llama) => {
      const g = new Float32Array(layout.total);
      return { loss: m.lossAndGrads(ids, B, T, 1, g), g };
    };
    const fresh = new Llama(cfg, e.kernels, { gradCkpt: true });
    fresh.bindParams(w2);
    const want = run(fresh);
    const m = new Llama(cfg, e.kernels, { gradCkpt: true });
    m.bindParams(shared);
    const before = run(m); // every weight has been a matmul operand now
    assert.ok(Math.abs(before.loss - ref.loss) / ref.loss < 1e-5);
    assert.notDeepEqual(before.g, want.g, "the two weight sets give different gradients");
    const n = tf.memory().numTensors;
    shared.set(w2); // the optimizer writes the master weights in place
    const got = run(m);
    assert.equal(got.loss, want.loss, "loss after the in-place update");
    assert.deepEqual(got.g, want.g, "gradients after the in-place update");
    assert.equal(m.loss(ids, B, T), fresh.loss(ids, B, T), "loss() too");
    assert.equal(tf.memory().numTensors, n, "no tfjs tensors are kept across passes");
  });
}

test("the plain-JS attention kernels (js.ts, the readable reference) match the float64 reference too (M4)", async () => {
  await initBackend("wasm");
  const k = createTfjsKernels({ attention: "js" });
  const m = new Llama(cfg, k, { gradCkpt: true });
  m.bindParams(weights);
  const grads = new Float32Array(layout.total);
  const loss = m.lossAndGrads(ids, B, T, 1, grads);
  assert.ok(Math.abs(loss - ref.loss) / ref.loss < 1e-5, `loss ${loss} vs ${ref.loss}`);
  for (const en of layout.entries) {
    const err = relErr(grads.subarray(en.offset, en.offset + en.size), refGrads.get(en.name)!.data as Float64Array);
    assert.ok(err < 1e-4, `${en.name}: gradient rel err ${err}`);
  }
});

test("the loss stays exact when fp32 probabilities underflow: it equals log-sum-exp minus the label logit in float64 (M4)", async (t) => {
  const e = (await useEngine(t, "wasm"))!;
  const big = weights.slice();
  const en = layout.entries[0];
  for (let i = en.offset; i < en.offset + en.size; i++) big[i] *= 300; // logits in the tens of thousands
  const m = new Llama(cfg, e.kernels, { gradCkpt: true });
  m.bindParams(big);
  const V = cfg.vocabSize,
    lg = m.logits(ids, B, T);
  let want = 0,
    underflows = 0;
  for (let b = 0; b < B; b++) {
    for (let s = 0; s < T - 1; s++) {
      const row = lg.subarray((b * T + s) * V, (b * T + s + 1) * V);
      const mx = Math.max(...row);
      let se = 0;
      for (const x of row) se += Math.exp(x - mx);
      const nll = mx + Math.log(se) - row[ids[b * T + s + 1]];
      if (nll > 69) underflows++; // p < 1e-30
      want += nll;
    }
  }
  want /= B * (T - 1);
  assert.ok(underflows > 0, "the test must reach the underflow path");
  const loss = m.loss(ids, B, T),
    g = new Float32Array(layout.total);
  assert.ok(Number.isFinite(loss));
  assert.ok(Math.abs(loss - want) / want < 1e-5, `loss ${loss} vs ${want}`);
  assert.equal(m.lossAndGrads(ids, B, T, 1, g), loss);
  assert.ok(g.every(Number.isFinite));
});

test("token ids outside the vocabulary are refused before any compute (M4)", async (t) => {
  const e = (await useEngine(t, "cpu"))!;
  const m = new Llama(cfg, e.kernels, { gradCkpt: true });
  assert.throws(() => m.loss(ids, B, T), /bindParams\(\) must be called/);
  m.bindParams(weights);
  const bad = ids.slice();
  bad[5] = cfg.vocabSize;
  assert.throws(() => m.loss(bad, B, T), /token id 96 at position 5 is outside the vocabulary \[0, 96\)/);
  assert.throws(() => m.loss(ids, B, T + 1), RangeError);
  assert.throws(() => m.bindParams(new Float32Array(3)), /params has 3 floats/);
});
