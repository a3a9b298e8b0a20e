/**
 * Peak memory of one rank (G6): this thread's V8 heap, the tensors tfjs holds and the size of the wasm heap (which
 * only grows, and is capped at 4 GB per worker) when a tfjs backend runs (never initialised here: on the native
 * engine both are 0), and the model's activation arena. Sampled after each micro-batch, where a step's memory is
 * at its highest.
 */
import * as v8 from "node:v8";
import * as tf from "@tensorflow/tfjs-core";
import type { RankMemory } from "./protocol";

function wasmHeapBytes(): number {
  if (tf.getBackend() !== "wasm") return 0;
  try {
    const be = tf.backend() as unknown as { wasm?: { HEAPU8?: Uint8Array } };
    return be.wasm?.HEAPU8?.buffer.byteLength ?? 0;
  } catch {
    return 0;
  }
}

export function memorySampler(arenaBytes: () => number = () => 0) {
  let heapPeak = 0;
  let tfPeak = 0;
  const sample = () => {
    heapPeak = Math.max(heapPeak, v8.getHeapStatistics().used_heap_size);
    if (tf.getBackend()) tfPeak = Math.max(tfPeak, tf.memory().numBytes); // tf.memory() would initialise a backend
  };
  return {
    sample,
    report(rank: number): RankMemory {
      sample();
      return {
        rank,
        heapPeakBytes: heapPeak,
        tfPeakBytes: tfPeak,
        wasmHeapBytes: wasmHeapBytes(),
        arenaBytes: arenaBytes(),
      };
    },
  };
}
