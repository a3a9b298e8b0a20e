/**
 * What the webgpu engine sends to its device for the frozen model's optimizer step, counted without computing it:
 * the engine runs on a device that records and runs nothing (buffers hold no memory; a readback's staging is
 * zeros), through the rank's own micro-batch loop (runMicroBatches), its fold on the device (or, with `fold`
 * "host", on the host). The counts are the engine's own: dispatches per micro-batch, and the bytes up and down per
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

/** A device that records nothing and runs nothing; a MAP_READ buffer maps to zeros. */
function nullDevice(): GpuDevice {
  const buffer = (size: number, usage: number) => {
    let raw: ArrayBuffer | null = null;
    return {
      size,
      destroy() {},
      getMappedRange: () => (raw ??= new ArrayBuffer(usage & 1 ? size : 0)),
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
  for (let step = 0; step < 2; step++) {
    t.push(kernels.traffic());
    await runMicroBatches({
      kernels,
      accum,
      ids,
      grads,
      slot,
      foldPlace: fold,
      stop: () => false,
      read: (m, into) => into.fill((step * accum + m) % cfg.vocabSize),
      lossAndGrads: (x, g) => model.lossAndGrads(x, microBatch, seq, 1, g),
      fold: (g) => g.fill(0), // a host fold's arithmetic is the CPU's; only the traffic is counted here
    });
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
  };
}
