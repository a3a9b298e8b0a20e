/**
 * A webgpu rank's micro-batches (src/actors/micro-batches.ts, the loop rank.ts runs) on this machine's adapter (CI:
 * Mesa 25's llvmpipe, TSTRAIN_REQUIRE_WEBGPU=1; elsewhere skipped, saying why):
 *  - micro-batch m + 1 is recorded before micro-batch m's readback resolves: the rank never waits for the host
 *    between micro-batches;
 *  - after the first step, nothing crosses per micro-batch but the tokens up (the ids, the targets, and the ids'
 *    occurrence lists that embeddingBackward reads) and the gradient and loss rows down,
 *    and the weights go up once per step: no gradient is uploaded (the readback zeroes the device's copy);
 *  - the folded float64 gradient and the losses are bit-identical to micro-batches run one at a time, each awaited;
 *  - the profile mode (the bench's webgpu case) times every dispatch once, by shader, unquantised (not every time
 *    a whole number of 65.536 us), and changes no result.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { DeferredKernels, DeviceTraffic } from "../src/model/kernels";
import { Llama } from "../src/model/llama";
import { buildConfig } from "../src/model/llama-config";
import { paramLayout } from "../src/model/layout";
import { initWeights } from "../src/model/init";
import { foldMicro } from "../src/optim/optim";
import { gradientArrays, runMicroBatches } from "../src/actors/micro-batches";
import { useWebgpu } from "./helpers/webgpu";
import { createProfiledWebgpuKernels } from "../src/model/engine/webgpu/engine";

const ACCUM = 4;
const B = 2;
const T = 32;
const cfg = buildConfig({ seqLen: T, layers: 2, hidden: 144, vocabSize: 300 });

function tokens(micro: number, step: number, ids: Int32Array): void {
  for (let i = 0; i < ids.length; i++) ids[i] = (i * 7 + micro * 31 + step * 101) % cfg.vocabSize;
}

interface Setup {
  kernels: DeferredKernels;
  model: Llama;
  params: Float32Array;
  slot: Float64Array;
}

async function setup(t: Parameters<typeof useWebgpu>[0]): Promise<Setup | null> {
  const kernels = await useWebgpu(t);
  if (!kernels) return null;
  const P = paramLayout(cfg).total;
  const params = new Float32Array(new SharedArrayBuffer(4 * P)); // the trainer's master weights are shared memory
  initWeights(cfg, 7, params);
  const model = new Llama(cfg, kernels, { gradCkpt: false });
  model.bindParams(params);
  kernels.weightsAre?.(params);
  return { kernels, model, params, slot: new Float64Array(P) };
}

test("a webgpu rank records micro-batch m+1 before m's readback resolves, uploads no gradient, and folds the serial loop's bits (A10)", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const { kernels, model, slot } = s;
  const P = slot.length;
  const grads = gradientArrays(kernels, P);
  assert.equal(grads.length, 2, "a deferred engine gets two gradient arrays");
  const events: string[] = [];
  // settle wrapped: the readback of micro-batch m resolves only after a macrotask, and says when it did
  const settle = kernels.settle.bind(kernels);
  let recorded = -1;
  const watched: DeferredKernels = {
    ...kernels,
    settle: (arrays, opts) => {
      const m = recorded;
      return settle(arrays, opts).then(
        (r) => new Promise((ok) => setTimeout(() => (events.push(`resolved ${m}`), ok(r)), 5)),
      );
    },
  };
  const ids = new Int32Array(B * T);
  const traffic: DeviceTraffic[] = [kernels.traffic()];
  const losses: number[][] = [];
  for (let step = 0; step < 2; step++) {
    const r = await runMicroBatches({
      kernels: watched,
      accum: ACCUM,
      ids,
      grads,
      stop: () => false,
      read: (m, into) => tokens(m, step, into),
      lossAndGrads: (x, g) => {
        recorded++;
        events.push(`record ${recorded}`);
        return model.lossAndGrads(x, B, T, 1024, g);
      },
      fold: (g, first) => foldMicro(slot, g, first),
    });
    assert.equal(r.micro, ACCUM);
    losses.push(r.losses);
    traffic.push(kernels.traffic());
    kernels.weightsChanged?.(); // as the optimizer's update says (P8)
  }
  // within a step (the step's last readback ends it: the optimizer needs the whole gradient)
  for (let m = 1; m < 2 * ACCUM; m++)
    if (m % ACCUM !== 0)
      assert.ok(
        events.indexOf(`record ${m}`) < events.indexOf(`resolved ${m - 1}`),
        `micro-batch ${m} was recorded only after micro-batch ${m - 1}'s readback resolved: ${events.join(", ")}`,
      );

  // the second step's traffic: the weights once, the tokens per micro-batch, the gradient and loss rows down
  const [, a, b] = traffic;
  const up = (k: keyof DeviceTraffic["up"]) => b.up[k] - a.up[k];
  assert.equal(up("state"), 0, "no array a kernel writes (the gradient) was uploaded");
  assert.equal(up("weights"), 4 * P, "the weights go up once per step");
  assert.equal(up("constants"), 0, "the RoPE tables stay resident");
  // embeddingBackward's occurrence lists of the ids (webgpu.ts): distinct tokens, starts, rows
  let lists = 0;
  for (let m = 0; m < ACCUM; m++) {
    tokens(m, 1, ids);
    lists += 4 * (2 * new Set(ids).size + 1 + B * T);
  }
  assert.equal(
    up("inputs"),
    ACCUM * 2 * 4 * B * T + lists,
    "per micro-batch, only the tokens go up: the token ids, the targets, and the ids' occurrence lists",
  );
  assert.equal(b.down.arrays - a.down.arrays, ACCUM * 4 * P, "the gradient comes down once per micro-batch");
  assert.equal(b.down.loss - a.down.loss, ACCUM * 4 * B * T, "and the loss rows (one per position)");

  // the same two steps, each micro-batch awaited before the next is recorded: the same losses and slot bits
  const r = await setup(t);
  if (!r) return;
  const g = new Float32Array(P);
  const serial: number[][] = [];
  for (let step = 0; step < 2; step++) {
    const ls: number[] = [];
    for (let m = 0; m < ACCUM; m++) {
      tokens(m, step, ids);
      r.model.lossAndGrads(ids, B, T, 1024, g);
      ls.push((await r.kernels.settle([g])).loss);
      foldMicro(r.slot, g, m === 0);
    }
    serial.push(ls);
    r.kernels.weightsChanged?.();
  }
  assert.deepEqual(losses, serial);
  assert.ok(
    Buffer.from(slot.buffer).equals(Buffer.from(r.slot.buffer)),
    "the folded gradient differs from the serial loop's",
  );
  kernels.dispose();
  r.kernels.dispose();
});

test("the webgpu engine's profile mode (the bench's) times every dispatch of a pass by shader, with the same loss", async (t) => {
  const plain = await setup(t);
  if (!plain) return;
  const w = await createProfiledWebgpuKernels();
  if ("reason" in w) {
    if (/timestamp-query/.test(w.reason)) return t.skip(w.reason);
    throw new Error(w.reason);
  }
  const P = plain.slot.length;
  const params = new Float32Array(P);
  initWeights(cfg, 7, params);
  const model = new Llama(cfg, w.kernels, { gradCkpt: false });
  model.bindParams(params);
  w.kernels.weightsAre?.(params);
  const ids = new Int32Array(B * T);
  tokens(0, 0, ids);
  const g = new Float32Array(P),
    h = new Float32Array(P);
  model.lossAndGrads(ids, B, T, 1024, g);
  const profiled = await w.kernels.settle([g], { clear: true });
  plain.model.lossAndGrads(ids, B, T, 1024, h);
  const want = await plain.kernels.settle([h]);
  assert.equal(profiled.loss, want.loss, "profiling changes no result");
  assert.ok(Buffer.from(g.buffer).equals(Buffer.from(h.buffer)), "nor the gradient");
  const prof = w.profile();
  const calls = [...prof.values()].reduce((s, x) => s + x.calls, 0);
  assert.equal(calls, w.kernels.traffic().dispatches, "every dispatch timed once");
  for (const [name, x] of prof) assert.ok(x.ms >= 0 && Number.isFinite(x.ms), `${name}: ${x.ms} ms`);
  assert.ok(prof.has("attentionForward") && prof.has("crossEntropy"), [...prof.keys()].join(", "));
  // timestamps unquantised (device.ts: Dawn's timestamp_quantization off): quantised, every time would be a
  // multiple of 65.536 us (Dawn masks the low 16 bits of each nanosecond timestamp), and so would every total
  const quanta = [...prof.values()].map((x) => x.ms / 0.065536);
  assert.ok(
    quanta.some((q) => Math.abs(q - Math.round(q)) > 1e-3),
    `every shader's time is a whole number of 65.536 us: ${quanta.join(", ")}`,
  );
  w.kernels.dispose();
  plain.kernels.dispose();
});
