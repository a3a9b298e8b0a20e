/**
 * A rank's micro-batches of one step (A10): each micro-batch's gradient computed on its own, then folded into the
 * rank's float64 slot in micro-batch order: slot = g on the step's first micro-batch, else slot + g, each element one
 * binary64 add (foldMicro's arithmetic, optim.ts).
 *
 * An engine that computes as it is called (native, tfjs) hands the gradient back at once, and foldMicro adds it.
 * A deferred engine (webgpu, kernels.ts: DeferredKernels) only queues the micro-batch, and folds on one of two places:
 *  - "device" (the default): the fold is a kernel too (DeferredKernels.fold, the same bits), so the slot lives on
 *    the device and comes back once a step, at the step's one settle, with every micro-batch's loss; between
 *    micro-batches nothing crosses but the tokens up. The host records micro-batch m + 1 while the device runs m
 *    (endMicroBatch resolves when the device has run a micro-batch): it only records.
 *  - "host": micro-batch m is recorded into one of two gradient arrays, its readback queued behind it (settle's
 *    `clear` zeroes the device's copy, so no gradient is ever uploaded), and only then does the rank wait for
 *    micro-batch m - 1's readback and fold it with foldMicro: the gradient comes down every micro-batch. Kept for
 *    comparison and for the tests that hold the device fold to it.
 * Either way the loop measures the host's milliseconds: the time the rank's thread spent recording, folding and
 * copying readbacks, not waiting for the device.
 */
import { isDeferred, type Kernels } from "../model/kernels";
import type { FoldPlace } from "../config";

export interface MicroBatchSteps {
  kernels: Kernels;
  accum: number;
  /** The token ids of micro-batch `micro` into `ids`. */
  read(micro: number, ids: Int32Array): void;
  ids: Int32Array;
  /** The micro-batch's loss, its gradient ADDED into `g` (zero on entry). */
  lossAndGrads(ids: Int32Array, g: Float32Array): number;
  /** The rank's float64 slot (its first grads[0].length elements are folded into). */
  slot: Float64Array;
  /** A deferred engine's fold place (default "device"); an engine that computes as it is called folds on the host. */
  foldPlace?: FoldPlace;
  /** A host fold: g into the slot (first: the step's first micro-batch sets it); leaves g zeroed on the host. */
  fold(g: Float32Array, first: boolean): void;
  /** The gradient arrays (gradientArrays): one, or two for a deferred engine folding on the host. */
  grads: readonly Float32Array[];
  /** Stop before micro-batch `micro` (the run was aborted). */
  stop(micro: number): boolean;
  /** Called after each micro-batch is folded (or, on the device, recorded): the memory sampler. */
  folded?(): void;
}

/** The gradient arrays a rank needs: two for a deferred engine folding on the host (one read back while the other fills). */
export function gradientArrays(kernels: Kernels, P: number, foldPlace: FoldPlace = "device"): Float32Array[] {
  const deferred = isDeferred(kernels);
  const grads = Array.from({ length: deferred && foldPlace === "host" ? 2 : 1 }, () => new Float32Array(P));
  // a deferred engine zeroes its copies on the device: the zeros are never uploaded
  if (deferred) for (const g of grads) kernels.fill(g, 0);
  return grads;
}

/** What ran: the micro-batches' losses in order, how many ran, and the host's milliseconds in all. */
export interface MicroBatchRun {
  losses: number[];
  micro: number;
  hostMs: number;
}

/** Runs the micro-batches. */
export async function runMicroBatches(s: MicroBatchSteps): Promise<MicroBatchRun> {
  const losses: number[] = [];
  const k = s.kernels;
  let micro = 0,
    hostMs = 0;
  const timed = <T>(f: () => T): T => {
    const t0 = performance.now();
    try {
      return f();
    } finally {
      hostMs += performance.now() - t0;
    }
  };
  if (!isDeferred(k)) {
    for (; micro < s.accum && !s.stop(micro); micro++) {
      timed(() => {
        s.read(micro, s.ids);
        losses.push(s.lossAndGrads(s.ids, s.grads[0]));
        s.fold(s.grads[0], micro === 0);
      });
      s.folded?.();
    }
    return { losses, micro, hostMs };
  }
  if ((s.foldPlace ?? "device") === "device") {
    const g = s.grads[0];
    const slot = s.slot.subarray(0, g.length); // the view settle reads back: the one fold wrote
    let running: Promise<void> | null = null;
    for (; micro < s.accum && !s.stop(micro); micro++) {
      const done = timed(() => {
        s.read(micro, s.ids);
        s.lossAndGrads(s.ids, g);
        k.fold(slot, g, micro === 0);
        return k.endMicroBatch();
      });
      s.folded?.();
      if (running) await running; // micro-batch `micro` is queued: the device runs it meanwhile
      running = done;
    }
    const r = await k.settle([slot]); // the slot, once a step, and every micro-batch's loss
    hostMs += r.hostMs;
    if (r.losses.length !== micro)
      throw new Error(`runMicroBatches: ${r.losses.length} micro-batch losses for ${micro} micro-batches`);
    return { losses: r.losses, micro, hostMs };
  }
  if (s.grads.length < 2)
    throw new Error(
      "runMicroBatches: a deferred engine folding on the host needs two gradient arrays (gradientArrays)",
    );
  let pending: { readback: Promise<{ loss: number; hostMs: number }>; g: Float32Array; micro: number } | null = null;
  const finish = async (p: NonNullable<typeof pending>) => {
    const r = await p.readback;
    losses.push(r.loss);
    hostMs += r.hostMs;
    timed(() => s.fold(p.g, p.micro === 0));
    s.folded?.();
  };
  try {
    for (; micro < s.accum && !s.stop(micro); micro++) {
      const g = s.grads[micro % s.grads.length];
      const readback = timed(() => {
        s.read(micro, s.ids);
        s.lossAndGrads(s.ids, g);
        return k.settle([g], { clear: true });
      });
      readback.catch(() => {}); // awaited below; a failure must not surface as an unhandled rejection first
      const previous = pending;
      pending = { readback, g, micro };
      if (previous) await finish(previous); // micro-batch `micro` is queued: the device computes it meanwhile
    }
    if (pending) await finish(pending);
  } finally {
    if (pending) await pending.readback.catch(() => {});
  }
  return { losses, micro, hostMs };
}
