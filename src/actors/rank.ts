/**
 * Rank actor (A1): one worker thread per device. Builds its own compute engine (initEngine) and a model
 * bound to the SHARED master weights (no replica: it multiplies against them directly, and they do not
 * change during the compute phase), reads its own windows, and holds no optimizer state: the weights, the
 * moments and the gradient slots are shared memory (shm.ts). It also runs its slice of the reduce and of the AdamW
 * update, so the coordinator's per-step work is a handful of scalars.
 *
 * Message loop: one message at a time, in order; every failure is reported as `failed` with the
 * rank id, and the coordinator stops the run.
 */
import { parentPort } from "node:worker_threads";
import { Llama } from "../model/llama";
import { initEngine } from "../model/backend";
import { type DeviceTraffic, isDeferred, type Kernels } from "../model/kernels";
import { readManifest } from "../data/manifest";
import { PackedTokenStore } from "../data/token-store";
import { WindowPermutation } from "../data/permutation";
import { TrainStream, ValStream } from "../data/sampler";
import { CTL_ABORT, viewShared, type SharedViews } from "./shm";
import { updateSlice } from "../optim/optim-simd";
import { chunkSquares, foldMicro, reduceChunks64, SQ_CHUNK, sumSlots64 } from "../optim/optim";
import { toWireError, unreachable, type FromRank, type RankInit, type ToRank } from "./protocol";
import { memorySampler } from "./memory";
import { faultAfterCompute, faultAtValidation, faultBeforeMicroBatch } from "./injected-faults";
import { gradientArrays, runMicroBatches } from "./micro-batches";

interface RankState {
  init: RankInit;
  model: Llama;
  kernels: Kernels;
  views: SharedViews;
  stream: TrainStream;
  val: ValStream | null;
  ids: Int32Array;
  /** A micro-batch's float32 gradient, before it is added into the slot (A10); two on a deferred engine folding on the host. */
  grads: Float32Array[];
  /** The engine's traffic() at the end of the previous compute (a device engine's bytes per step). */
  traffic: DeviceTraffic | null;
  mem: ReturnType<typeof memorySampler>;
}

let state: RankState | null = null;
let myRank = -1;

function send(m: FromRank): void {
  parentPort!.postMessage(m);
}

async function handleInit(init: RankInit): Promise<FromRank> {
  const be = await initEngine(init.backend, init.native, init.gpu);
  const views = viewShared(init.shared);
  const d = init.data;
  const manifest = readManifest(d.root);
  const store = PackedTokenStore.open(d.root, manifest, "train");
  const perm = new WindowPermutation(store.numWindows(d.seqLen), d.dataSeed);
  const stream = new TrainStream(store, perm, {
    world: init.dataWorld,
    accum: d.accum,
    microBatch: d.microBatch,
    seqLen: d.seqLen,
  });
  const val = d.nVal > 0 ? new ValStream(PackedTokenStore.open(d.root, manifest, "val"), d.seqLen, d.nVal) : null;
  const model = new Llama(init.model, be.kernels, {
    gradCkpt: init.gradCkpt,
    activationBudgetBytes: init.activationBudgetBytes,
  });
  model.bindParams(views.params); // the shared master weights themselves
  be.kernels.weightsAre?.(views.params); // P8: they change only in update(), which says so
  state = {
    init,
    model,
    kernels: be.kernels,
    views,
    stream,
    val,
    ids: new Int32Array(d.microBatch * d.seqLen),
    grads: gradientArrays(be.kernels, init.shared.P, init.fold),
    traffic: isDeferred(be.kernels) ? be.kernels.traffic() : null,
    mem: memorySampler(() => model.arenaBytes()),
  };
  return { type: "ready", rank: init.rank, backend: be.engine, detail: be.detail, device: be.device };
}

async function compute(s: RankState, step: number, gradScale: number): Promise<FromRank> {
  const t0 = performance.now();
  const slot = s.views.slots[s.init.rank];
  const d = s.init.data;
  s.kernels.prepareWeights?.(s.init.rank, s.init.world); // P8: this rank's share of the weights' bf16 copies
  const { losses, micro, hostMs } = await runMicroBatches({
    kernels: s.kernels,
    accum: d.accum,
    ids: s.ids,
    grads: s.grads,
    slot,
    foldPlace: s.init.fold,
    stop: () => Atomics.load(s.views.ctl, CTL_ABORT) !== 0,
    read: (m, ids) => {
      faultBeforeMicroBatch(s.init.fault, s.init.rank, step);
      s.stream.readMicroBatch(step, s.init.dataRank, m, ids);
    },
    lossAndGrads: (ids, g) => s.model.lossAndGrads(ids, d.microBatch, d.seqLen, gradScale, g),
    fold: (g, first) => foldMicro(slot, g, first), // A10: each micro-batch's gradient on its own, added in float64; g back to 0
    // (on a deferred engine folding on the device, the fold is its kernel: the same bits)
    folded: () => s.mem.sample(),
  });
  faultAfterCompute(s.init.fault, s.init.rank, step, slot, losses);
  const reply: FromRank = { type: "computed", rank: s.init.rank, step, losses, micro, ms: performance.now() - t0 };
  const now = isDeferred(s.kernels) ? s.kernels.traffic() : null;
  if (now && s.traffic) {
    const was = s.traffic;
    const up = (t: DeviceTraffic) => t.up.weights + t.up.constants + t.up.inputs + t.up.state;
    const down = (t: DeviceTraffic) => t.down.arrays + t.down.loss;
    reply.device = {
      up: up(now) - up(was),
      down: down(now) - down(was),
      gradientUp: now.up.state - was.up.state,
      dispatches: now.dispatches - was.dispatches,
      hostMs,
    };
    s.traffic = now;
  }
  return reply;
}

/** This rank's chunks as a parameter range [lo, hi) of the P-vector. */
function chunkRange(s: RankState): [number, number] {
  const [c0, c1] = s.init.chunks;
  return [Math.min(s.init.shared.P, c0 * SQ_CHUNK), Math.min(s.init.shared.P, c1 * SQ_CHUNK)];
}

function reduce(s: RankState, step: number, invScale: number, mode: "final" | "sum"): FromRank {
  const t0 = performance.now();
  const [lo, hi] = chunkRange(s);
  const v = s.views;
  if (mode === "sum") sumSlots64(v.slots, v.slots[0], lo, hi);
  else reduceChunks64(v.slots, v.grad, invScale, s.init.shared.P, v.sq, ...s.init.chunks);
  return { type: "reduced", rank: s.init.rank, step, ms: performance.now() - t0 };
}

function squares(s: RankState, step: number): FromRank {
  const t0 = performance.now();
  chunkSquares(s.views.grad, s.init.shared.P, s.views.sq, ...s.init.chunks);
  return { type: "squared", rank: s.init.rank, step, ms: performance.now() - t0 };
}

function update(s: RankState, step: number, lr: number, coef: number, t: number): FromRank {
  const t0 = performance.now();
  const [lo, hi] = s.init.slice;
  updateSlice(s.views, s.init.decayRanges, lo, hi, lr, coef, t);
  s.kernels.weightsChanged?.(); // P8: copies of the weights made before this update are stale
  return { type: "updated", rank: s.init.rank, step, ms: performance.now() - t0 };
}

async function evaluate(s: RankState, from: number, to: number): Promise<FromRank> {
  if (!s.val) throw new Error("no validation stream on this rank (nVal = 0)");
  faultAtValidation(s.init.fault, s.init.rank);
  const seq = s.init.data.seqLen;
  const ids = new Int32Array(seq);
  let lossSum = 0;
  let count = 0;
  for (let i = from; i < to; i++) {
    s.val.read(i, ids);
    const loss = s.model.loss(ids, 1, seq);
    lossSum += isDeferred(s.kernels) ? (await s.kernels.settle([])).loss : loss;
    count++;
  }
  return { type: "evaluated", rank: s.init.rank, lossSum, count };
}

async function handle(msg: ToRank): Promise<FromRank | null> {
  if (msg.type === "init") {
    myRank = msg.init.rank;
    return handleInit(msg.init);
  }
  const s = state;
  if (!s) throw new Error(`rank received ${msg.type} before init`);
  switch (msg.type) {
    case "compute":
      return compute(s, msg.step, msg.gradScale);
    case "reduce":
      return reduce(s, msg.step, msg.invScale, msg.mode);
    case "squares":
      return squares(s, msg.step);
    case "update":
      return update(s, msg.step, msg.lr, msg.coef, msg.t);
    case "eval":
      return evaluate(s, msg.from, msg.to);
    case "memory":
      return { type: "memory", memory: s.mem.report(s.init.rank) };
    case "close":
      s.model.dispose();
      s.kernels.dispose();
      return { type: "closed", rank: s.init.rank };
    default:
      return unreachable(msg);
  }
}

// Messages are handled strictly in order: a promise chain, so an async init cannot interleave.
let chain: Promise<void> = Promise.resolve();
parentPort!.on("message", (msg: ToRank) => {
  chain = chain.then(async () => {
    try {
      const reply = await handle(msg);
      if (reply) send(reply);
      if (reply?.type === "closed") parentPort!.close(); // the thread ends once the coordinator has the answer
    } catch (e) {
      send({ type: "failed", rank: myRank, error: toWireError(e) });
    }
  });
});
