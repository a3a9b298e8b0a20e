/**
 * A webgpu rank's micro-batches (src/actors/micro-batches.ts, the loop rank.ts runs) on this machine's adapter (CI:
 * Mesa 25's llvmpipe, TSTRAIN_REQUIRE_WEBGPU=1; elsewhere skipped, saying why), folding on the device (the
 * default) and on the host (--webgpu-fold host):
 *  - micro-batch m + 1 is recorded before the device has run micro-batch m (device fold) or before m's readback
 *    resolves (host fold): the rank never waits for the host between micro-batches;
 *  - after the first step, nothing goes up per micro-batch but the tokens (the ids, the targets, and the ids'
 *    occurrence lists that embeddingBackward reads), and the weights once per step: no gradient, no slot; down,
 *    the float64 slot once a step and the loss rows, at the step's one settle (device fold), or the gradient and
 *    the loss rows every micro-batch (host fold); the device fold costs one dispatch a micro-batch here;
 *  - both give the float64 slot and the losses of micro-batches run one at a time, each awaited, bit for bit;
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
import type { FoldPlace } from "../src/config";
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

/** Two steps of the rank's loop (runMicroBatches) folding at `place`, its events watched; the traffic before and after each step. */
async function pipelined(s: Setup, place: FoldPlace) {
  const { kernels, model, slot } = s;
  const P = slot.length;
  const grads = gradientArrays(kernels, P, place);
  const events: string[] = [];
  let recorded = -1,
    settles = 0;
  // what the loop waits on wrapped: the readback of micro-batch m (host fold), or its end on the device (device
  // fold), resolves only after a macrotask, and says when it did
  const later = <T>(what: string, p: Promise<T>) =>
    p.then((r) => new Promise<T>((ok) => setTimeout(() => (events.push(what), ok(r)), 5)));
  const watched: DeferredKernels = {
    ...kernels,
    settle: (arrays, opts) => {
      settles++;
      return later(`resolved ${recorded}`, kernels.settle(arrays, opts));
    },
    endMicroBatch: () => later(`resolved ${recorded}`, kernels.endMicroBatch()),
  };
  const ids = new Int32Array(B * T);
  const traffic: DeviceTraffic[] = [kernels.traffic()];
  const losses: number[][] = [];
  const settlesPerStep: number[] = [];
  let hostMs = 0;
  for (let step = 0; step < 2; step++) {
    const before = settles;
    const r = await runMicroBatches({
      kernels: watched,
      accum: ACCUM,
      ids,
      grads,
      slot,
      foldPlace: place,
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
    hostMs += r.hostMs;
    settlesPerStep.push(settles - before);
    traffic.push(kernels.traffic());
    kernels.weightsChanged?.(); // as the optimizer's update says (P8)
  }
  return { grads, events, traffic, losses, hostMs, settlesPerStep };
}

/** The upload of the second step: the weights once, the tokens per micro-batch, no gradient. */
function tokensOnlyUp(P: number, a: DeviceTraffic, b: DeviceTraffic, ids: Int32Array): void {
  const up = (k: keyof DeviceTraffic["up"]) => b.up[k] - a.up[k];
  assert.equal(up("state"), 0, "no array a kernel writes (the gradient, the slot) was uploaded");
  assert.equal(up("weights"), 4 * P, "the weights go up once per step");
  assert.equal(up("constants"), 0, "the RoPE tables stay resident");
  // embeddingBackward's occurrence lists of the ids (engine.ts): distinct tokens, starts, rows
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
}

test("a webgpu rank folds on the device (the default) and on the host (--webgpu-fold host) the serial loop's bits; on the device the slot comes back once a step and nothing but the tokens crosses between micro-batches (A10)", async (t) => {
  const dev = await setup(t);
  if (!dev) return;
  const P = dev.slot.length;
  const ids = new Int32Array(B * T);

  // the fold on the device: one gradient array, the slot read back at the step's one settle
  const d = await pipelined(dev, "device");
  assert.equal(d.grads.length, 1, "folding on the device, a rank needs one gradient array");
  assert.deepEqual(d.settlesPerStep, [1, 1], "one settle a step: the slot and every micro-batch's loss");
  for (let m = 1; m < 2 * ACCUM; m++)
    if (m % ACCUM !== 0)
      assert.ok(
        d.events.indexOf(`record ${m}`) < d.events.indexOf(`resolved ${m - 1}`),
        `micro-batch ${m} was recorded only after the device had run micro-batch ${m - 1}: ${d.events.join(", ")}`,
      );
  const [, a, b] = d.traffic;
  tokensOnlyUp(P, a, b, ids);
  assert.equal(b.down.arrays - a.down.arrays, 8 * P, "the float64 slot comes down once a step, and nothing else");
  assert.equal(b.down.loss - a.down.loss, ACCUM * 4 * B * T, "and the loss rows (one per position), once a step");
  assert.ok(d.hostMs > 0 && Number.isFinite(d.hostMs), `the host's milliseconds: ${d.hostMs}`);

  // the fold on the host: two gradient arrays, m + 1 recorded before m's readback resolves, the gradient down each time
  const host = await setup(t);
  if (!host) return;
  const h = await pipelined(host, "host");
  assert.equal(h.grads.length, 2, "folding on the host, a deferred engine gets two gradient arrays");
  for (let m = 1; m < 2 * ACCUM; m++)
    if (m % ACCUM !== 0)
      assert.ok(
        h.events.indexOf(`record ${m}`) < h.events.indexOf(`resolved ${m - 1}`),
        `micro-batch ${m} was recorded only after micro-batch ${m - 1}'s readback resolved: ${h.events.join(", ")}`,
      );
  const [, ha, hb] = h.traffic;
  tokensOnlyUp(P, ha, hb, ids);
  assert.equal(hb.down.arrays - ha.down.arrays, ACCUM * 4 * P, "the gradient comes down once per micro-batch");
  assert.equal(hb.down.loss - ha.down.loss, ACCUM * 4 * B * T, "and the loss rows (one per position)");
  assert.equal(
    hb.dispatches - ha.dispatches,
    b.dispatches - a.dispatches - ACCUM,
    "the device fold adds one dispatch a micro-batch here",
  );

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
  const bits = (x: Float64Array) => Buffer.from(x.buffer);
  assert.deepEqual(d.losses, serial, "the device fold's losses");
  assert.deepEqual(h.losses, serial, "the host fold's losses");
  assert.ok(bits(dev.slot).equals(bits(r.slot)), "the slot folded on the device differs from the serial loop's");
  assert.ok(bits(host.slot).equals(bits(r.slot)), "the slot folded on the host differs from the serial loop's");
  for (const x of [dev, host, r]) x.kernels.dispose();
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
