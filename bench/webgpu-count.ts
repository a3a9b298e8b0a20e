/**
 * What the webgpu engine sends to its device for the frozen model's optimizer step, counted without computing it:
 * the engine runs on a device that records and runs nothing (buffers hold no memory; a readback's staging holds
 * bytes of 1), through the rank's own micro-batch loop (runMicroBatches), its fold on the device (or, with `fold`
 * "host", on the host, with foldMicro as a rank folds: the host's milliseconds per micro-batch are the rank's). The counts are the engine's own: dispatches per micro-batch, and the bytes up and down per
 * step by what they carried, against the step's floors: the weights up once, and the float64 slot (8 bytes a
 * parameter) down once. The device offers WebGPU's guaranteed binding size (128 MiB), so the LM head and the fold
 * run in as many dispatches as on the least adapter.
 */
import { webgpuEngineOn } from "../src/model/engine/webgpu/engine";
import type { GpuDevice } from "../src/model/engine/webgpu/device";
import { buildConfig } from "../src/model/llama-config";
import { paramLayout } from "../src/model/layout";
import { Llama } from "../src/model/llama";
import type { DeviceTraffic } from "../src/model/kernels";
import { gradientArrays, runMicroBatches } from "../src/actors/micro-batches";
import type { FoldPlace } from "../src/config";
import { foldMicro } from "../src/optim/optim";

/** A device that records nothing and runs nothing; a MAP_READ buffer maps to bytes of 1. */
function nullDevice(): GpuDevice {
  const buffer = (size: number, usage: number) => {
    let raw: ArrayBuffer | null = null;
    return {
      size,
      destroy() {},
      // a readback's staging holds real pages (1-bytes), as a mapped readback does: copying it out costs its bytes
      getMappedRange: () => (raw ??= new Uint8Array(usage & 1 ? size : 0).fill(1).buffer),
      unmap() {},
      mapAsync: async () => {},
    };
  };
  const pass = { setPipeline() {}, setBindGroup() {}, dispatchWorkgroups() {}, end() {} };
  return {
    limits: {
      minStorageBufferOffsetAlignment: 256,
      minUniformBufferOffsetAlignment: 256,
      maxStorageBufferBindingSize: 2 ** 27, // WebGPU's guaranteed 128 MiB (llvmpipe's; GPUs offer more, fewer head chunks)
    },
    queue: { submit() {}, onSubmittedWorkDone: async () => {}, writeBuffer() {} },
    lost: new Promise(() => {}),
    onuncapturederror: null,
    createBuffer: (d) => buffer(d.size, d.usage),
    createShaderModule: () => ({}),
    createComputePipeline: () => ({ getBindGroupLayout: () => ({}) }),
    createBindGroup: () => ({}),
    createCommandEncoder: () => ({
      beginComputePass: () => pass,
      copyBufferToBuffer() {},
      clearBuffer() {},
      resolveQuerySet() {},
      finish: () => ({}),
    }),
    destroy() {},
  };
}

export interface WebgpuCounts {
  seq_len: number;
  micro_batch: number;
  accum: number;
  dispatches_per_micro: number;
  /** bytes per optimizer step (the second step: the first also makes the arena) */
  up: DeviceTraffic["up"];
  down: DeviceTraffic["down"];
  fold: FoldPlace;
  /** the weights once up and the float64 slot once down */
  floor_bytes: number;
  bytes_over_floor: number;
  /** device-to-host bytes per step over the float64 slot's (8 bytes a parameter), host-to-device over the weights' */
  down_over_slot: number;
  up_over_weights: number;
  /** what crosses per micro-batch besides the once-per-step weights and the gradient readback */
  per_micro_up_bytes: number;
  /**
   * The host's milliseconds per micro-batch (runMicroBatches): recording on a device that records nothing (a lower
   * bound of recording on a real one), and with the host fold the readback's copy and foldMicro, as a rank pays them
   */
  host_ms_per_micro: number;
}

/** The frozen model's step at seq x micro-batch, accum micro-batches, counted twice; the second step's figures. */
export async function webgpuCounts(
  seq: number,
  microBatch: number,
  accum: number,
  layers?: number,
  fold: FoldPlace = "device",
): Promise<WebgpuCounts> {
  const cfg = buildConfig({ seqLen: seq, layers });
  const P = paramLayout(cfg).total;
  const { kernels } = webgpuEngineOn(nullDevice(), "webgpu (counting: no device)");
  const params = new Float32Array(new SharedArrayBuffer(4 * P));
  const model = new Llama(cfg, kernels, { gradCkpt: false });
  model.bindParams(params);
  kernels.weightsAre?.(params);
  const grads = gradientArrays(kernels, P, fold);
  const slot = new Float64Array(new SharedArrayBuffer(8 * P)); // the rank's slot is shared memory
  const ids = new Int32Array(microBatch * seq);
  const t: DeviceTraffic[] = [];
  let hostMs = 0;
  for (let step = 0; step < 2; step++) {
    t.push(kernels.traffic());
    const r = await runMicroBatches({
      kernels,
      accum,
      ids,
      grads,
      slot,
      foldPlace: fold,
      stop: () => false,
      read: (m, into) => into.fill((step * accum + m) % cfg.vocabSize),
      lossAndGrads: (x, g) => model.lossAndGrads(x, microBatch, seq, 1, g),
      fold: (g, first) => foldMicro(slot, g, first), // a host fold: the rank's
    });
    hostMs = r.hostMs; // the second step's
    kernels.weightsChanged?.();
  }
  t.push(kernels.traffic());
  const [, a, b] = t;
  const up = {
    weights: b.up.weights - a.up.weights,
    constants: b.up.constants - a.up.constants,
    inputs: b.up.inputs - a.up.inputs,
    state: b.up.state - a.up.state,
  };
  const down = { arrays: b.down.arrays - a.down.arrays, loss: b.down.loss - a.down.loss };
  const floor = 4 * P + 8 * P;
  const upBytes = up.weights + up.constants + up.inputs + up.state,
    downBytes = down.arrays + down.loss;
  const total = upBytes + downBytes;
  kernels.dispose();
  return {
    seq_len: seq,
    micro_batch: microBatch,
    accum,
    dispatches_per_micro: (b.dispatches - a.dispatches) / accum,
    up,
    down,
    fold,
    floor_bytes: floor,
    bytes_over_floor: +(total / floor).toFixed(3),
    down_over_slot: +(downBytes / (8 * P)).toFixed(4),
    up_over_weights: +(upBytes / (4 * P)).toFixed(4),
    per_micro_up_bytes: (up.inputs + up.constants + up.state) / accum,
    host_ms_per_micro: +(hostMs / accum).toFixed(2),
  };
}
