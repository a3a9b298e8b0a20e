/**
 * M6 gradient checkpointing on a GQA shape (9 query heads over 3 kv heads, 3 layers, batch 3): every recomputation
 * policy (keep the blocks' matmul outputs and attention's out and lse, and recompute norms and SwiGLU; recompute
 * whole blocks but attention, whose out and lse are kept; or recompute whole blocks, ckptKeepBytes 0) gives loss and
 * gradients bit-identical to the pass that keeps every activation, on every engine, accumulating over micro-batches;
 * each runs the attention forward only where it keeps nothing of it; and each engine is deterministic run to run
 * (exact resume, B1).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { buildConfig } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { Llama } from "../src/model/llama";
import type { Kernels } from "../src/model/kernels";
import { ENGINES, useEngine } from "./helpers/engines";

const cfg = buildConfig({ seqLen: 10, layers: 3, hidden: 198, vocabSize: 50 }); // head_dim 22, 9 heads, 3 kv heads
const { total } = paramLayout(cfg);
const weights = new Float32Array(total);
initWeights(cfg, 5, weights);
const B = 3,
  T = 10;
const ids = Int32Array.from({ length: 2 * B * T }, (_, i) => (i * 2654435761) % cfg.vocabSize);

for (const engine of ENGINES) {
  test(`on ${engine}, every recomputation policy is bit-identical to the plain pass over two accumulated micro-batches (M6)`, async (t) => {
    assert.equal(cfg.numKvHeads, 3);
    assert.equal(cfg.numHeads, 9);
    const e = await useEngine(t, engine);
    if (!e) return;
    let forwards = 0; // attention forwards per run
    const counted: Kernels = {
      ...e.kernels,
      attentionForward: (...a) => {
        forwards++;
        e.kernels.attentionForward(...a);
      },
    };
    const run = (gradCkpt: boolean, ckptKeepBytes?: number) => {
      forwards = 0;
      const m = new Llama(cfg, counted, { gradCkpt, ckptKeepBytes });
      m.bindParams(weights);
      const g = new Float32Array(total);
      const losses = [
        m.lossAndGrads(ids.subarray(0, B * T), B, T, 1024, g),
        m.lossAndGrads(ids.subarray(B * T), B, T, 1024, g),
      ];
      return { losses, g, forwards };
    };
    // the budget that holds attention's out and lse of every layer (H*E + H floats a token) but not the matmul outputs
    const L = cfg.numLayers,
      attnBytes = L * B * T * (cfg.numHeads * cfg.headDim + cfg.numHeads) * 4;
    const plain = run(false),
      kept = run(true),
      attnKept = run(true, attnBytes),
      whole = run(true, 0),
      again = run(true);
    assert.deepEqual(
      [plain.forwards, kept.forwards, attnKept.forwards, whole.forwards],
      [2 * L, 2 * L, 2 * L, 4 * L],
      "attention forwards over two micro-batches: once per layer, twice only when whole blocks keep nothing of it",
    );
    assert.deepEqual(attnKept.losses, plain.losses);
    assert.deepEqual(
      attnKept.g,
      plain.g,
      "checkpointed gradients (whole blocks but attention recomputed) are bit-identical",
    );
    assert.deepEqual(kept.losses, plain.losses);
    assert.deepEqual(kept.g, plain.g, "checkpointed gradients (matmul outputs kept) are bit-identical");
    assert.deepEqual(whole.losses, plain.losses);
    assert.deepEqual(whole.g, plain.g, "checkpointed gradients (whole blocks recomputed) are bit-identical");
    assert.deepEqual(again.g, kept.g, "run to run: same gradients");
    assert.throws(() => new Llama(cfg, e.kernels, { gradCkpt: true, ckptKeepBytes: -1 }), /ckptKeepBytes -1/);
    assert.ok(plain.g.some((x) => x !== 0));
  });
}
