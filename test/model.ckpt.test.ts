/**
 * M6 gradient checkpointing on a GQA shape (9 query heads over 3 kv heads, 3 layers, batch 3): every recomputation
 * policy (keep the blocks' matmul outputs and attention's out and lse, and recompute norms and SwiGLU; recompute
 * whole blocks but attention, whose out and lse are kept; or recompute whole blocks, budget 0) gives loss and
 * gradients bit-identical to the pass that keeps every activation, on every engine, accumulating over micro-batches;
 * each runs the attention forward only where it keeps nothing of it; and each engine is deterministic run to run
 * (exact resume, B1). activationPlan picks the fastest policy that fits the budget, and its bytes are exactly what
 * the model allocates.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { buildConfig } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { activationPlan, activationPlans, Llama } from "../src/model/llama";
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
    let forwards = 0, // attention forwards per run
      swiglus = 0; // SwiGLU forwards per run
    const counted: Kernels = {
      ...e.kernels,
      swigluForward: (...a) => {
        swiglus++;
        e.kernels.swigluForward(...a);
      },
      attentionForward: (...a) => {
        forwards++;
        e.kernels.attentionForward(...a);
      },
    };
    const run = (gradCkpt: boolean, activationBudgetBytes?: number) => {
      forwards = 0;
      swiglus = 0;
      const m = new Llama(cfg, counted, { gradCkpt, activationBudgetBytes });
      m.bindParams(weights);
      const g = new Float32Array(total);
      const losses = [
        m.lossAndGrads(ids.subarray(0, B * T), B, T, 1024, g),
        m.lossAndGrads(ids.subarray(B * T), B, T, 1024, g),
      ];
      return { losses, g, forwards, swiglus, bytes: m.arenaBytes() };
    };
    // each policy's own bytes as the budget: the plan picks exactly it, and the model allocates exactly that
    const L = cfg.numLayers,
      plan = (budget: number) => activationPlan(cfg, B, T, true, budget),
      [noneBytes, keptBytes, attnBytes, wholeBytes] = activationPlans(cfg, B, T).map((p) => p.bytes);
    assert.deepEqual(
      [plan(0), plan(attnBytes), plan(keptBytes), plan(noneBytes), activationPlan(cfg, B, T, false, 0)].map((p) => [
        p.recompute,
        p.attnKept,
        p.fits,
      ]),
      [
        ["whole", false, false],
        ["whole", true, true],
        ["kept", true, true],
        ["none", true, true],
        ["none", true, false],
      ],
      "the fastest policy that fits the budget; without --grad-ckpt nothing is recomputed",
    );
    assert.ok(wholeBytes < attnBytes && attnBytes < keptBytes && keptBytes < noneBytes);
    const plain = run(false),
      none = run(true, noneBytes),
      kept = run(true, keptBytes),
      attnKept = run(true, attnBytes),
      whole = run(true, wholeBytes),
      again = run(true, keptBytes);
    assert.deepEqual(
      [plain.bytes, none.bytes, kept.bytes, attnKept.bytes, whole.bytes],
      [noneBytes, noneBytes, keptBytes, attnBytes, wholeBytes],
      "activationPlan's bytes are the arena the model allocates",
    );
    assert.deepEqual(
      [plain.swiglus, none.swiglus, kept.swiglus, attnKept.swiglus, whole.swiglus],
      [2 * L, 2 * L, 4 * L, 4 * L, 4 * L],
      "SwiGLU forwards over two micro-batches: recomputed by every policy but none",
    );
    assert.deepEqual(
      [plain.forwards, none.forwards, kept.forwards, attnKept.forwards, whole.forwards],
      [2 * L, 2 * L, 2 * L, 2 * L, 4 * L],
      "attention forwards over two micro-batches: once per layer, twice only when whole blocks keep nothing of it",
    );
    assert.deepEqual(attnKept.losses, plain.losses);
    assert.deepEqual(
      attnKept.g,
      plain.g,
      "checkpointed gradients (whole blocks but attention recomputed) are bit-identical",
    );
    assert.deepEqual(none.g, plain.g, "a budget that holds everything recomputes nothing");
    assert.deepEqual(kept.losses, plain.losses);
    assert.deepEqual(kept.g, plain.g, "checkpointed gradients (matmul outputs kept) are bit-identical");
    assert.deepEqual(whole.losses, plain.losses);
    assert.deepEqual(whole.g, plain.g, "checkpointed gradients (whole blocks recomputed) are bit-identical");
    assert.deepEqual(again.g, kept.g, "run to run: same gradients");
    assert.throws(
      () => new Llama(cfg, e.kernels, { gradCkpt: true, activationBudgetBytes: -1 }),
      /activationBudgetBytes -1/,
    );
    assert.ok(plain.g.some((x) => x !== 0));
  });
}
