/**
 * The GPU rank as it trains (bench/gpu.sh runs it): the actor runtime (Coordinator + rank workers) on the webgpu
 * engine, whole optimizer steps of at least 8 micro-batches each, with everything a step does: each micro-batch
 * recorded while the device runs the one before (the overlap), folded into the rank's float64 slot on the device,
 * the slot read back once a step, the reduce and AdamW on the host, the weights uploaded again. Prints, and writes
 * as JSON into --out:
 *  - the adapter, refused when it is a software one (Mesa's llvmpipe/lavapipe, SwiftShader) unless --software asks
 *    for it (then at a small shape unless the shape flags say otherwise);
 *  - the probed fp32 FMA peak (webgpu-peak.ts), tok/s and mfu_of_peak of the median step;
 *  - bytes up and down per step, dispatches per micro-batch and the rank thread's host milliseconds per micro-batch,
 *    as the ranks count them (the log line's figures);
 *  - the device time per shader of one micro-batch (timestamp queries), its fold included;
 *  - the frozen step at seq 1024 x 4, accum 8, counted on a device that runs nothing (webgpu-count.ts): bytes down
 *    over the float64 slot, bytes up over the weights, dispatches per micro-batch, the host's milliseconds per
 *    micro-batch folding on the device and (for comparison) on the host;
 *  - with --gpus G > 1, the same steps at --world G and the ratio of its tok/s to world 1's.
 * It stops timing before --deadline-s (540 by default; gpu.sh's timeout is 600) and still prints what it measured.
 *
 *   node dist/bench/gpu-rank.js [--software] [--seq 1024] [--micro-batch 4] [--accum 8] [--steps 3]
 *     [--layers N] [--hidden N] [--vocab N] [--gpus G] [--deadline-s 540] [--out DIR]
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { arg } from "./args";
import { webgpuFmaPeak } from "./webgpu-peak";
import { webgpuCounts } from "./webgpu-count";
import { WEBGPU_TARGETS } from "./webgpu";
import { activationBudget } from "../src/config";
import { Coordinator, type StepResult } from "../src/actors/coordinator";
import { newScaler, type OptimizerPosition } from "../src/optim/optim";
import { buildConfig, countParams, type LlamaConfig } from "../src/model/llama-config";
import { paramLayout } from "../src/model/layout";
import { initWeights } from "../src/model/init";
import { Llama } from "../src/model/llama";
import { writeSyntheticMix } from "../src/data/synthetic";
import { createProfiledWebgpuKernels } from "../src/model/engine/webgpu/engine";
import { type GpuAdapter, openWebgpuDevice } from "../src/model/engine/webgpu/device";

/** The least micro-batches a step runs here: the overlap and the fold have to be in it (issue 59). */
const MIN_ACCUM = 8;
/** The shape --software takes unless the shape flags say otherwise: minutes on a 2-core llvmpipe. */
const SOFTWARE_SHAPE = { seq: 64, microBatch: 2, layers: 2, hidden: 144, vocab: 512 };

/** Whether an adapter is a software one (the CPU through Vulkan): its info says so, or its name does. */
export function softwareAdapter(info: NonNullable<GpuAdapter["info"]> & { isFallbackAdapter?: boolean }): boolean {
  const words = [info.vendor, info.architecture, info.device, info.description].join(" ");
  return (
    info.isFallbackAdapter === true || info.architecture === "software" || /llvmpipe|lavapipe|swiftshader/i.test(words)
  );
}

interface WorldRun {
  world: number;
  backend: string;
  steps: { ms: number; computeMs: number; reduceMs: number; updateMs: number; device: StepResult["device"] }[];
  cut: string | null;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** Whole steps at `world` ranks: one untimed (the pipelines compile), then up to `steps` timed, within the deadline. */
async function runWorld(
  o: { model: LlamaConfig; root: string; seq: number; microBatch: number; accum: number; steps: number },
  world: number,
  deadline: number,
  log: (s: string) => void,
): Promise<WorldRun> {
  const coord = Coordinator.create({
    world,
    model: o.model,
    gradCkpt: true,
    activationBudgetBytes: activationBudget({ activationBudgetGb: 0, world }).bytes,
    backend: "webgpu",
    fold: "device",
    fault: null,
    data: { root: o.root, seqLen: o.seq, dataSeed: 20260919, microBatch: o.microBatch, accum: o.accum, nVal: 0 },
  });
  initWeights(o.model, 20260919, coord.views.params);
  const run: WorldRun = { world, backend: "", steps: [], cut: null };
  try {
    await coord.spawn();
    run.backend = coord.backendInfo.detail;
    log(`world ${world}: ${run.backend}`);
    const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
    const shape = { warmup: 100, decayStart: 1_000_000, total: 1_000_000 };
    let last = 0;
    for (let i = 0; i <= o.steps; i++) {
      if (i > 0 && performance.now() + 1.2 * last > deadline) {
        run.cut = `stopped after ${i - 1} timed steps: the next would pass the deadline`;
        break;
      }
      const t0 = performance.now();
      const r = await coord.step(i, pos, 6e-4, shape);
      last = performance.now() - t0;
      const d = r.device;
      log(
        `world ${world} step ${i}${i === 0 ? " (untimed: compiles)" : ""}: ${last.toFixed(0)} ms (compute ${r.computeMs.toFixed(0)}, reduce ${r.reduceMs.toFixed(0)}, update ${r.updateMs.toFixed(0)}) loss ${r.loss.toFixed(4)}` +
          (d
            ? `; up ${d.up} B, down ${d.down} B, ${d.dispatchesPerMicro} dispatches/micro, host ${d.hostMsPerMicro.toFixed(1)} ms/micro`
            : ""),
      );
      if (i > 0)
        run.steps.push({ ms: last, computeMs: r.computeMs, reduceMs: r.reduceMs, updateMs: r.updateMs, device: d });
    }
  } finally {
    await coord.close();
  }
  return run;
}

/** One micro-batch with every dispatch timed (profile mode), its fold on the device included: each shader's share. */
async function profileMicroBatch(model: LlamaConfig, seq: number, microBatch: number) {
  const w = await createProfiledWebgpuKernels();
  if ("reason" in w) return { unavailable: `${w.reason}; ${w.fix}` };
  const k = w.kernels;
  const P = paramLayout(model).total;
  const params = new Float32Array(P);
  initWeights(model, 20260919, params);
  const m = new Llama(model, k, {
    gradCkpt: true,
    activationBudgetBytes: activationBudget({ activationBudgetGb: 0, world: 1 }).bytes,
  });
  m.bindParams(params);
  k.weightsAre?.(params);
  const ids = new Int32Array(microBatch * seq).map((_, i) => (i * 7919) % model.vocabSize);
  const g = new Float32Array(P),
    slot = new Float64Array(P);
  k.fill(g, 0);
  m.lossAndGrads(ids, microBatch, seq, 1, g);
  k.fold(slot, g, true);
  await k.endMicroBatch();
  await k.settle([slot]);
  const rows = [...w.profile()].map(([kernel, t]) => ({ kernel, calls: t.calls, device_ms: +t.ms.toFixed(2) }));
  const total = rows.reduce((s, r) => s + r.device_ms, 0);
  m.dispose();
  k.dispose();
  return {
    device_ms: +total.toFixed(1),
    kernels: rows
      .sort((a, b) => b.device_ms - a.device_ms)
      .map((r) => ({ ...r, share: +(r.device_ms / Math.max(1e-9, total)).toFixed(3) })),
  };
}

async function main(): Promise<void> {
  const t0 = performance.now();
  const deadline = t0 + 1000 * Number(arg("--deadline-s", "540"));
  const log = (s: string) => process.stderr.write(`gpu: ${s}\n`);
  const software = process.argv.includes("--software");
  const num = (flag: string, dflt: number) => Number(arg(flag, String(dflt)));
  const small = software ? SOFTWARE_SHAPE : null;
  const seq = num("--seq", small?.seq ?? 1024),
    microBatch = num("--micro-batch", small?.microBatch ?? 4),
    accum = num("--accum", MIN_ACCUM),
    steps = num("--steps", 3),
    gpus = num("--gpus", 1);
  const out = arg("--out", path.join("bench-out", "gpu"));
  const opt = (flag: string, dflt: number | undefined) => {
    const v = arg(flag, "");
    return v ? Number(v) : dflt;
  };
  const model = buildConfig({
    seqLen: seq,
    layers: opt("--layers", small?.layers),
    hidden: opt("--hidden", small?.hidden),
    vocabSize: opt("--vocab", small?.vocab),
  });
  for (const [flag, v, least] of [
    ["--seq", seq, 1],
    ["--micro-batch", microBatch, 1],
    ["--accum", accum, MIN_ACCUM],
    ["--steps", steps, 1],
    ["--gpus", gpus, 1],
  ] as const)
    if (!Number.isSafeInteger(v) || v < least)
      throw new Error(
        `${flag} ${v}: a whole number of at least ${least} (a step here has at least ${MIN_ACCUM} micro-batches)`,
      );

  // the adapter, named; a software one refused unless asked for
  const d = await openWebgpuDevice();
  if ("reason" in d) {
    process.stderr.write(`gpu.sh: no WebGPU adapter: ${d.reason}; fix: ${d.fix}\n`);
    process.exit(2);
  }
  const isSoftware = softwareAdapter(d.adapter.info ?? {});
  d.device.destroy();
  process.stdout.write(`adapter: ${d.name}${isSoftware ? " [software: the CPU]" : ""}\n`);
  if (isSoftware && !software) {
    process.stderr.write(
      "gpu.sh: this adapter is a software one (the CPU through Vulkan), not a GPU: the GPU's Vulkan driver is missing or not visible (docs/webgpu.md, Getting it on a GPU machine). To measure it anyway, at a small shape: bench/gpu.sh --software\n",
    );
    process.exit(2);
  }

  const peak = await webgpuFmaPeak();
  log(`fp32 FMA peak ${peak.gflops} GFLOP/s (${peak.what})`);
  const params = countParams(model).sum_numel,
    P = paramLayout(model).total;
  const flopsPerTok = 6 * params + 12 * model.numLayers * seq * model.hiddenSize;
  const worlds = gpus > 1 ? [1, gpus] : [1];
  const windows = Math.max(...worlds) * (steps + 1) * accum * microBatch;
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "tsbench-gpu-"));
  const runs: WorldRun[] = [];
  try {
    const root = writeSyntheticMix({
      vocab: model.vocabSize,
      trainTokens: Math.ceil(windows * 1.25 + 4) * seq,
      valTokens: 4 * seq,
      shards: 2,
      seed: 7,
      dir: path.join(scratch, "mix"),
    }).root;
    for (const world of worlds) {
      if (world > 1 && performance.now() > deadline - 0.5 * (deadline - t0)) {
        log(`world ${world}: skipped, too little time left before the deadline`);
        break;
      }
      runs.push(await runWorld({ model, root, seq, microBatch, accum, steps }, world, deadline, log));
    }
  } finally {
    fs.rmSync(scratch, { recursive: true, force: true });
  }
  const profile = performance.now() < deadline ? await profileMicroBatch(model, seq, microBatch) : null;
  const counts = await webgpuCounts(1024, 4, 8);
  const countsHost = await webgpuCounts(1024, 4, 8, undefined, "host"); // the host fold's host milliseconds

  const figures = runs.map((r) => {
    const ms = median(r.steps.map((s) => s.ms));
    const tokS = (r.world * accum * microBatch * seq) / (ms / 1000);
    const dev = r.steps.map((s) => s.device).filter((x) => x !== undefined);
    return {
      world: r.world,
      backend: r.backend,
      steps_timed: r.steps.length,
      step_ms: r.steps.map((s) => +s.ms.toFixed(1)),
      step_ms_median: +ms.toFixed(1),
      compute_ms_median: +median(r.steps.map((s) => s.computeMs)).toFixed(1),
      reduce_ms_median: +median(r.steps.map((s) => s.reduceMs)).toFixed(1),
      update_ms_median: +median(r.steps.map((s) => s.updateMs)).toFixed(1),
      tok_per_s: +tokS.toFixed(1),
      mfu_of_peak: +((flopsPerTok * tokS) / (r.world * peak.gflops * 1e9)).toFixed(4),
      up_bytes_per_step: dev.length ? Math.round(median(dev.map((x) => x.up))) : null,
      down_bytes_per_step: dev.length ? Math.round(median(dev.map((x) => x.down))) : null,
      // each rank's weights up and its float64 slot down, once a step: the floors
      up_over_weights: dev.length ? +(median(dev.map((x) => x.up)) / (r.world * 4 * P)).toFixed(4) : null,
      down_over_slot: dev.length ? +(median(dev.map((x) => x.down)) / (r.world * 8 * P)).toFixed(4) : null,
      dispatches_per_micro: dev.length ? dev[dev.length - 1].dispatchesPerMicro : null,
      host_ms_per_micro: dev.length ? +median(dev.map((x) => x.hostMsPerMicro)).toFixed(2) : null,
      cut: r.cut,
    };
  });
  const result = {
    case: "gpu-rank",
    adapter: d.name,
    software: isSoftware,
    seq_len: seq,
    micro_batch: microBatch,
    accum,
    layers: model.numLayers,
    hidden: model.hiddenSize,
    vocab: model.vocabSize,
    params,
    model_flops_per_token: flopsPerTok,
    peak_gflops: peak.gflops,
    peak_what: peak.what,
    worlds: figures,
    world_ratio:
      figures.length > 1 && figures[0].steps_timed && figures[1].steps_timed
        ? +(figures[1].tok_per_s / figures[0].tok_per_s).toFixed(3)
        : null,
    profile,
    frozen_counts: counts,
    frozen_counts_host_fold: countsHost,
    seconds: +((performance.now() - t0) / 1000).toFixed(1),
    date: new Date().toISOString(),
    load: os.loadavg().map((x) => +x.toFixed(2)),
  };
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, "gpu.json"), `${JSON.stringify(result, null, 2)}\n`);

  const p = (s: string) => process.stdout.write(`${s}\n`);
  p(`peak ${peak.gflops} GFLOP/s fp32 FMA (probed)`);
  p(
    `shape: seq ${seq} x micro-batch ${microBatch}, accum ${accum}; ${model.numLayers} layers, width ${model.hiddenSize}, vocab ${model.vocabSize} (${params} parameters)`,
  );
  for (const f of figures) {
    if (f.steps_timed === 0) {
      p(`world ${f.world}: no timed step [${f.cut}]`);
      continue;
    }
    p(
      `world ${f.world}: ${f.tok_per_s} tok/s, mfu_of_peak ${f.mfu_of_peak}, step ${f.step_ms_median} ms (median of ${f.steps_timed}; compute ${f.compute_ms_median}, reduce ${f.reduce_ms_median}, update ${f.update_ms_median})${f.cut ? ` [${f.cut}]` : ""}`,
    );
    p(
      `  per step: up ${f.up_bytes_per_step} B (${f.up_over_weights} x the weights), down ${f.down_bytes_per_step} B (${f.down_over_slot} x the float64 slot); ${f.dispatches_per_micro} dispatches/micro-batch; host ${f.host_ms_per_micro} ms/micro-batch`,
    );
  }
  if (result.world_ratio !== null) p(`world ${gpus} / world 1 tok/s: ${result.world_ratio}`);
  if (profile && "kernels" in profile && profile.kernels) {
    p(`device time of one micro-batch, by shader (${profile.device_ms} ms in all):`);
    for (const k of profile.kernels)
      p(
        `  ${k.kernel.padEnd(24)} ${String(k.calls).padStart(5)} calls ${k.device_ms.toFixed(1).padStart(10)} ms  ${(100 * k.share).toFixed(1).padStart(5)} %`,
      );
  } else p(`profile: ${profile && "unavailable" in profile ? profile.unavailable : "skipped: the deadline"}`);
  const c = counts;
  p(
    `frozen step (seq 1024 x 4, accum 8, counted on a device that runs nothing, 128 MiB bindings): ${c.dispatches_per_micro} dispatches/micro-batch; down ${c.down.arrays + c.down.loss} B = ${c.down_over_slot} x the float64 slot; up ${c.up.weights + c.up.constants + c.up.inputs + c.up.state} B = ${c.up_over_weights} x the weights`,
  );
  p(
    `frozen step, the host's ms per micro-batch (recording on that device: a lower bound): ${c.host_ms_per_micro} folding on the device; ${countsHost.host_ms_per_micro} folding on the host (the gradient copied out of the readback, foldMicro), ${countsHost.down_over_slot} x the slot down`,
  );
  const t = WEBGPU_TARGETS;
  const ok = (x: boolean) => (x ? "ok" : "MISSED");
  p(
    `targets (the frozen step): dispatches/micro-batch <= ${t.dispatchesPerMicro} ${ok(c.dispatches_per_micro <= t.dispatchesPerMicro)}; down <= ${t.downOverSlot} x the slot ${ok(c.down_over_slot <= t.downOverSlot)}; up <= ${t.upOverWeights} x the weights ${ok(c.up_over_weights <= t.upOverWeights)}`,
  );
  p(`${result.seconds} s; ${path.join(out, "gpu.json")}`);
}

if (require.main === module)
  main().catch((e) => {
    process.stderr.write(`gpu.sh: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(1);
  });
