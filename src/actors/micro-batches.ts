/**
 * A rank's micro-batches of one step (A10): each micro-batch's gradient computed on its own, then folded into the
 * rank's float64 slot (foldMicro) in micro-batch order.
 *
 * An engine that computes as it is called (native, tfjs) hands the gradient back at once. A deferred engine
 * (webgpu, kernels.ts: DeferredKernels) only queues the micro-batch; its gradient is read back while the device computes
 * the next one: micro-batch m is recorded into one of two gradient arrays, its readback is queued behind it, and
 * only then does the rank wait for micro-batch m - 1's readback and fold it. The readback zeroes the device's copy
 * (settle's `clear`), so no gradient is ever uploaded, and nothing crosses per micro-batch but the tokens in and
 * the gradient and the loss rows out.
 */
import { isDeferred, type Kernels } from "../model/kernels";

export interface MicroBatchSteps {
  kernels: Kernels;
  accum: number;
  /** The token ids of micro-batch `micro` into `ids`. */
  read(micro: number, ids: Int32Array): void;
  ids: Int32Array;
  /** The micro-batch's loss, its gradient ADDED into `g` (zero on entry). */
  lossAndGrads(ids: Int32Array, g: Float32Array): number;
  /** g into the slot (first: the step's first micro-batch sets it); leaves g zeroed on the host. */
  fold(g: Float32Array, first: boolean): void;
  /** One gradient array; a deferred engine uses two (gradients(), ping-ponged). */
  grads: readonly Float32Array[];
  /** Stop before micro-batch `micro` (the run was aborted). */
  stop(micro: number): boolean;
  /** Called after each fold (the memory sampler). */
  folded?(): void;
}

/** The gradient arrays a rank needs on this engine: two for a deferred engine (one read back while the other fills). */
export function gradientArrays(kernels: Kernels, P: number): Float32Array[] {
  const deferred = isDeferred(kernels);
  const grads = Array.from({ length: deferred ? 2 : 1 }, () => new Float32Array(P));
  // a deferred engine zeroes its copies on the device: the zeros are never uploaded
  if (deferred) for (const g of grads) kernels.fill(g, 0);
  return grads;
}

/** Runs the micro-batches; their losses in order, and how many ran. */
export async function runMicroBatches(s: MicroBatchSteps): Promise<{ losses: number[]; micro: number }> {
  const losses: number[] = [];
  const k = s.kernels;
  let micro = 0;
  if (!isDeferred(k)) {
    for (; micro < s.accum && !s.stop(micro); micro++) {
      s.read(micro, s.ids);
      losses.push(s.lossAndGrads(s.ids, s.grads[0]));
      s.fold(s.grads[0], micro === 0);
      s.folded?.();
    }
    return { losses, micro };
  }
  if (s.grads.length < 2)
    throw new Error("runMicroBatches: a deferred engine needs two gradient arrays (gradientArrays)");
  let pending: { readback: Promise<{ loss: number }>; g: Float32Array; micro: number } | null = null;
  const finish = async (p: NonNullable<typeof pending>) => {
    losses.push((await p.readback).loss);
    s.fold(p.g, p.micro === 0);
    s.folded?.();
  };
  try {
    for (; micro < s.accum && !s.stop(micro); micro++) {
      const g = s.grads[micro % s.grads.length];
      s.read(micro, s.ids);
      s.lossAndGrads(s.ids, g);
      const readback = k.settle([g], { clear: true });
      readback.catch(() => {}); // awaited below; a failure must not surface as an unhandled rejection first
      const previous = pending;
      pending = { readback, g, micro };
      if (previous) await finish(previous); // micro-batch `micro` is queued: the device computes it meanwhile
    }
    if (pending) await finish(pending);
  } finally {
    if (pending) await pending.readback.catch(() => {});
  }
  return { losses, micro };
}
