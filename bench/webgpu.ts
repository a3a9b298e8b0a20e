/**
 * The bench's `webgpu` case: the frozen model on the webgpu engine, on whatever adapter is here (in CI and on a
 * machine without a GPU, Mesa's llvmpipe), every figure from one run:
 *  - peak_gflops: the adapter's fp32 FMA peak, probed (webgpu-peak.ts);
 *  - step: one forward+backward at --seq x --micro-batch (default 256 x 1), timed over warm calls, each to its
 *    settle (webgpu-step.ts, a process of its own), its tok/s and `mfu_of_peak` = model FLOPs per token x tok/s /
 *    the probed peak (model FLOPs: 6 * params + 12 * layers * seq * hidden, as frozen-step counts them);
 *  - base: the same script on a base revision's build (`--webgpu-base DIR`, made by bench/native/build-base.sh),
 *    and the speed-up over it;
 *  - profile: one more forward+backward with every dispatch timed by the device's timestamp queries, device
 *    milliseconds and calls per shader (kernel family), where the adapter has timestamp-query;
 *  - counts: the frozen step at seq 1024, micro-batch 4, accum 8, counted on a device that runs nothing
 *    (webgpu-count.ts), its fold on the device: dispatches per micro-batch, and the bytes up and down per optimizer
 *    step, against the weights (up) and the float64 slot (down).
 */
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { createProfiledWebgpuKernels } from "../src/model/engine/webgpu/engine";
import { buildConfig, countParams } from "../src/model/llama-config";
import { paramLayout } from "../src/model/layout";
import { initWeights } from "../src/model/init";
import { Llama } from "../src/model/llama";
import { webgpuFmaPeak } from "./webgpu-peak";
import { webgpuCounts } from "./webgpu-count";

/** Targets of the case (issue 59: a GPU rank paced by its device): per micro-batch, and per step over the floors. */
export const WEBGPU_TARGETS = { dispatchesPerMicro: 450, downOverSlot: 1.05, upOverWeights: 1.1 } as const;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b),
    n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

interface StepRun {
  ms: number[];
  loss: number;
  adapter: string;
  dispatches: number | null;
}

/** webgpu-step.js on a built tree, in its own process. */
function stepOn(tree: string, seq: number, microBatch: number, calls: number, layers?: number): StepRun {
  const script = path.join(__dirname, "webgpu-step.js");
  const args = [script, "--tree", tree, "--seq", String(seq), "--micro-batch", String(microBatch)];
  args.push("--calls", String(calls), ...(layers ? ["--layers", String(layers)] : []));
  const r = spawnSync(process.execPath, args, { encoding: "utf8", maxBuffer: 1 << 24 });
  const line = (r.stdout ?? "").split("\n").find((l) => l.startsWith("WEBGPU_STEP "));
  if (r.status !== 0 || !line)
    throw new Error(
      `webgpu-step on ${tree}: exit ${r.status}: ${(r.stderr ?? "").trim().split("\n").slice(-3).join(" | ")}`,
    );
  return JSON.parse(line.slice("WEBGPU_STEP ".length)) as StepRun;
}

/** One forward+backward with every dispatch timed on the device: each shader's calls and milliseconds. */
async function profileStep(seq: number, microBatch: number, layers?: number) {
  const w = await createProfiledWebgpuKernels();
  if ("reason" in w) return { unavailable: `${w.reason}; ${w.fix}` };
  const k = w.kernels;
  const cfg = buildConfig({ seqLen: seq, layers });
  const P = paramLayout(cfg).total;
  const params = new Float32Array(P);
  initWeights(cfg, 20260919, params);
  const m = new Llama(cfg, k, { gradCkpt: false });
  m.bindParams(params);
  k.weightsAre?.(params);
  const ids = new Int32Array(microBatch * seq).map((_, i) => (i * 7919) % cfg.vocabSize);
  const grads = new Float32Array(P);
  // one pass: the timestamps are the device's, so compiling the pipelines on the host does not enter them
  m.lossAndGrads(ids, microBatch, seq, 1, grads);
  await k.settle([grads], { clear: true });
  const rows = [...w.profile()].map(([kernel, t]) => ({ kernel, calls: t.calls, device_ms: +t.ms.toFixed(2) }));
  const total = rows.reduce((s, r) => s + r.device_ms, 0);
  k.dispose();
  return {
    device_ms: +total.toFixed(1),
    kernels: rows
      .filter((r) => r.calls > 0)
      .sort((a, b) => b.device_ms - a.device_ms)
      .map((r) => ({ ...r, share: +(r.device_ms / Math.max(1e-9, total)).toFixed(3) })),
  };
}

export interface WebgpuBenchOptions {
  seq: number;
  microBatch: number;
  calls: number;
  /** a base revision's build (bench/native/build-base.sh REV DIR) */
  base?: { dir: string; rev: string };
  layers?: number;
  log: (s: string) => void;
}

export async function webgpuBench(o: WebgpuBenchOptions): Promise<Record<string, unknown>> {
  const cfg = buildConfig({ seqLen: o.seq, layers: o.layers });
  const params = countParams(cfg).sum_numel;
  const flopsPerTok = 6 * params + 12 * cfg.numLayers * o.seq * cfg.hiddenSize;
  const tok = o.seq * o.microBatch;
  const peak = await webgpuFmaPeak();
  o.log(`webgpu: fp32 FMA peak ${peak.gflops} GFLOP/s (${peak.what})`);
  const rate = (r: StepRun) => {
    const ms = median(r.ms);
    const tokS = tok / (ms / 1000);
    return {
      step_ms: r.ms.map((x) => +x.toFixed(1)),
      step_ms_median: +ms.toFixed(1),
      tok_per_s: +tokS.toFixed(2),
      mfu_of_peak: +((flopsPerTok * tokS) / (peak.gflops * 1e9)).toFixed(4),
      loss: r.loss,
      dispatches_per_micro: r.dispatches,
    };
  };
  const root = path.join(__dirname, "..", "..");
  const after = rate(stepOn(root, o.seq, o.microBatch, o.calls, o.layers));
  o.log(
    `webgpu: this tree, fwd+bwd ${after.step_ms_median} ms (${after.tok_per_s} tok/s, ${after.mfu_of_peak} of peak)`,
  );
  const before = o.base ? rate(stepOn(o.base.dir, o.seq, o.microBatch, o.calls, o.layers)) : null;
  if (before) o.log(`webgpu: ${o.base!.rev}'s build, fwd+bwd ${before.step_ms_median} ms (${before.tok_per_s} tok/s)`);
  const profile = await profileStep(o.seq, o.microBatch, o.layers);
  const counts = await webgpuCounts(1024, 4, 8, o.layers);
  o.log(
    `webgpu: frozen step at seq 1024 x 4, accum 8: ${counts.dispatches_per_micro} dispatches per micro-batch; down ${counts.down_over_slot}x the float64 slot, up ${counts.up_over_weights}x the weights (${counts.per_micro_up_bytes} bytes per micro-batch)`,
  );
  return {
    case: "webgpu",
    adapter: peak.adapter,
    seq_len: o.seq,
    micro_batch: o.microBatch,
    layers: cfg.numLayers,
    params,
    model_flops_per_token: flopsPerTok,
    peak_gflops: peak.gflops,
    peak_what: peak.what,
    ...after,
    base: before && { rev: o.base!.rev, ...before },
    speedup_over_base: before ? +(before.step_ms_median / after.step_ms_median).toFixed(3) : null,
    profile,
    counts,
    targets: {
      dispatches_per_micro: {
        value: counts.dispatches_per_micro,
        target: `<= ${WEBGPU_TARGETS.dispatchesPerMicro}`,
        ok: counts.dispatches_per_micro <= WEBGPU_TARGETS.dispatchesPerMicro,
      },
      down_over_slot: {
        value: counts.down_over_slot,
        target: `<= ${WEBGPU_TARGETS.downOverSlot}x the float64 slot (8 bytes a parameter, once a step)`,
        ok: counts.down_over_slot <= WEBGPU_TARGETS.downOverSlot,
      },
      up_over_weights: {
        value: counts.up_over_weights,
        target: `<= ${WEBGPU_TARGETS.upOverWeights}x the weights (once a step; the tokens per micro-batch)`,
        ok: counts.up_over_weights <= WEBGPU_TARGETS.upOverWeights,
      },
    },
  };
}
