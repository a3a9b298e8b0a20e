/**
 * The bench's cases (bench/bench.ts runs them in turn): the step cases (single-thread, the actor runtime, the
 * framework-free loop, the upload stall, MPI, PyTorch's anchor) on one shape, and the cases that need no data shape
 * (optim, gemm, attention, webgpu, webgpu-attention, frozen-step). Each records its rows in the run (bench-run.ts); a failure is
 * noted and the other cases go on.
 */
import { activationBudget, type IsaChoice } from "../src/config";
import { supportedIsas } from "../src/model/engine/native";
import type { Shape } from "./shape";
import { actorRunner, localRunner, runSteps, runUploadCase, stepRow, type BenchRow, type Runner } from "./steps";
import { builtinGemmBf16, fmaPeak } from "./native-probes";
import { runOptimCase } from "./optim";
import { runFrameworkFree, runMpiCase, runTorch, torchVersion } from "./subproc";
import { median, r } from "./stats";
import { frozenStepBench } from "./model-frozen-step";
import { webgpuBench } from "./webgpu";
import { webgpuAttentionBench } from "./webgpu-attention";
import { attentionBench } from "./attention";
import { gemmShapesBench } from "./gemm-shapes";
import { type BenchRun, emit, log } from "./bench-run";
import { cores, type Options } from "./options";

/** Case `mpi`: two MPI processes x world 1 against one process at world 2, same steps. */
export async function runMpi(run: BenchRun, o: Options, shape: Shape, scratch: string): Promise<void> {
  await run.guard("mpi", async () => {
    log(
      `mpi: mpirun -np 2 --dist mpi --world 1 against one process at --world 2, ${o.warmup} warm-up + ${o.steps} timed steps each`,
    );
    for (const row of await runMpiCase(shape, {
      steps: o.steps,
      warmup: o.warmup,
      scratch,
      timeoutMs: 3_600_000,
      log,
    })) {
      run.record(row);
      log(
        `  ${row.case}: ${row.step_ms_median} ms/step, ${row.tok_per_s} tok/s${row.allreduce_ms_median === null ? "" : `, allreduce ${String(row.allreduce_ms_median)} ms (${(100 * Number(row.allreduce_share)).toFixed(1)} % of the step)`}`,
      );
    }
  });
}

/** Cases 1-3: the framework-free loop's runs around single-thread and the actor runtime (interleaved). */
export async function runStepCases(run: BenchRun, o: Options, s: Shape, scratch: string): Promise<void> {
  // ---- 3 (first half): the framework-free loop of --benchmark, as the user runs it. It cannot take
  // turns step by step with the in-process cases (one process per run), so its runs sandwich them:
  // half before, half after, and the row reports the mean of the runs' medians.
  const ffRuns: BenchRow[] = [];
  const frameworkFree = async (k: number) => {
    await run.guard("framework-free", async () => {
      log(
        `framework-free run ${k + 1}/${o.ffRuns}: dist/main.js --benchmark ${o.steps} (its first step is its warm-up)`,
      );
      const row = await runFrameworkFree(s, { steps: o.steps, scratch, timeoutMs: 8 * 60_000, log });
      log(`  framework-free: ${row.step_ms_median} ms/step, ${row.tok_per_s} tok/s`);
      ffRuns.push(row);
    });
  };
  const ffBefore = o.cases.has("framework-free") ? Math.floor(o.ffRuns / 2) : 0;
  for (let k = 0; k < ffBefore; k++) await frameworkFree(k);

  // ---- 1 + 2: single-thread and the actor runtime, interleaved step by step; with --isas, one group of runtimes per
  // kernel in turn (two frozen runtimes at world 2 hold about 12 GB); --sequential: one runtime alive at a time
  if (o.cases.has("single") || o.cases.has("actor")) {
    const groups: Array<{ isa: IsaChoice; spawn: Array<() => Promise<Runner>> }> = [];
    for (const [g, isa] of o.isas.entries()) {
      const spawn: Array<() => Promise<Runner>> = [];
      if (o.cases.has("single") && g === 0) spawn.push(() => localRunner(s, 1));
      if (o.cases.has("actor"))
        for (const w of o.worlds)
          for (const gemm of o.gemms)
            for (const precision of o.precisions) {
              if (precision === "bf16" && gemm !== "builtin") continue; // P8: bf16 is the built-in GEMM's
              if (isa !== "auto" && gemm !== "builtin") continue; // --isa picks a built-in kernel
              spawn.push(() => {
                log(`spawning actor runtime world ${w}, --gemm ${gemm} --precision ${precision} --isa ${isa}`);
                return actorRunner(s, w, gemm, precision, isa);
              });
            }
      if (o.interleave) groups.push({ isa, spawn });
      else for (const f of spawn) groups.push({ isa, spawn: [f] });
    }
    for (const { isa, spawn } of groups)
      await run.guard(`single/actor${isa === "auto" ? "" : ` --isa ${isa}`}`, async () => {
        const runners: Runner[] = [];
        // the peaks before any rank exists (a rank's thread, idle or not, shares the core's FMA units with the probe
        // on an SMT sibling), and again after the steps: the higher of the two
        const peaksBefore = stepPeaks(o.precisions.includes("bf16") ? ["-bf16"] : [], isa);
        try {
          for (const f of spawn) runners.push(await f());
          log(`${o.interleave ? "interleaved" : "back to back"}: ${runners.map((x) => x.name).join(", ")}`);
          const got = await runSteps(runners, o.warmup, o.steps, o.interleave, log, o.rewarm);
          const after = stepPeaks(
            runners.map((x) => x.name),
            isa,
          );
          const higher = (a?: { isa: string; gflops: number }, b?: { isa: string; gflops: number }) =>
            a && b ? (a.gflops >= b.gflops ? a : b) : (a ?? b);
          const peaks = { fp32: higher(peaksBefore.fp32, after.fp32), bf16: higher(peaksBefore.bf16, after.bf16) };
          for (const x of runners) {
            const mem = x.memory ? await x.memory() : {};
            const row = stepRow(s, x.name, x.world, x.backend, got.get(x)!, {
              backend_detail: x.backendDetail,
              interleaved: o.interleave,
              rewarm_steps_per_turn: o.interleave ? o.rewarm : 0,
              ...(isa === "auto" ? {} : { isa }),
              ...mem,
            });
            Object.assign(row, peakMfu(s, row, x.name.endsWith("-bf16") ? peaks.bf16 : peaks.fp32));
            run.record(row);
          }
        } finally {
          for (const x of runners) await x.close();
        }
      });
  }

  // ---- 3 (second half)
  if (o.cases.has("framework-free")) {
    for (let k = ffBefore; k < o.ffRuns; k++) await frameworkFree(k);
    if (ffRuns.length) {
      const meds = ffRuns.map((x) => Number(x.step_ms_median));
      const med = meds.reduce((a, b) => a + b, 0) / meds.length;
      const tps = Number(ffRuns[0].tokens_per_step);
      run.record({
        ...ffRuns[0],
        step_ms_median: r(med),
        tok_per_s: r((tps / med) * 1000),
        steps_timed: ffRuns.reduce((a, x) => a + Number(x.steps_timed), 0),
        step_ms_min: null,
        runs: ffRuns.map((x) => ({
          step_ms_median: x.step_ms_median,
          tok_per_s: x.tok_per_s,
          wall_s: x.subprocess_wall_s,
        })),
        combine:
          ffRuns.length > 1 ? "mean of the runs' medians (runs before and after the interleaved cases)" : "one run",
      });
    }
  }
}

/** Case 5: the upload stall (B3), per world, optionally with the uploader reniced. */
export async function runUploadCases(run: BenchRun, o: Options, s: Shape, scratch: string): Promise<void> {
  // ---- 5: upload stall (B3)
  if (o.cases.has("upload")) {
    const variants: Array<{ w: number; nice: boolean }> = [];
    for (const w of o.uploadWorlds) {
      variants.push({ w, nice: false });
      if (o.uploadNice) variants.push({ w, nice: true });
    }
    for (const { w, nice } of variants) {
      const tag = `upload-w${w}${nice ? "-nice" : ""}`;
      await run.guard(tag, async () => {
        log(
          `upload stall: actor world ${w}, embedded LocalHub on loopback${nice ? ", uploader thread reniced to 19" : ""}`,
        );
        const u = await runUploadCase(s, w, { warmup: o.warmup, steps: o.steps, scratch, niceUploader: nice, log });
        const up = {
          uploads: u.uploads.length,
          upload_s_median: r(median(u.uploads.map((x) => x.seconds)), 2),
          push_verify_s_median: r(median(u.uploads.map((x) => x.pushVerifySeconds ?? Number.NaN)), 2),
          stage_ms_median: r(median(u.stageMs)),
          uploader_niced: nice,
          backend_detail: u.detail,
        };
        run.record(stepRow(s, `${tag}-quiet`, w, u.backend, u.quiet, up));
        run.record(stepRow(s, `${tag}-overlap`, w, u.backend, u.overlap, up));
      });
    }
  }
}

/** Cases 4, 7 and 8: the optimizer alone, the frozen model's step, the GEMM on the model's shapes (none needs a data shape). */
export async function runOtherCases(run: BenchRun, o: Options): Promise<void> {
  // ---- 4: gradient averaging + AdamW alone
  if (o.cases.has("optim")) {
    await run.guard("optim", async () => {
      log(
        `optim: fold, reduce over 2 slots and AdamW against a bandwidth probe, P = ${o.optimSizes.map((p) => `${(p / 1e6).toFixed(0)}M`).join(", ")}, 1 thread vs ${o.optimThreads} threads`,
      );
      for (const row of await runOptimCase({
        sizes: o.optimSizes,
        world: 2,
        threads: o.optimThreads,
        warmup: Math.max(1, o.warmup),
        steps: o.steps,
        log,
      }))
        run.record(row);
    });
  }

  // ---- 8: the built-in GEMM on the frozen model's shapes against the core's FMA peak, and OpenBLAS beside it
  if (o.cases.has("gemm")) {
    await run.guard("gemm", async () => {
      log(
        `gemm: the frozen model's products at seq ${o.gemmSeqs.join(", ")}, one thread, ${o.gemmRounds} rounds, against the FMA peak of the same run`,
      );
      run.gemm = gemmShapesBench({ seqs: o.gemmSeqs, rounds: o.gemmRounds, log });
      for (const x of run.gemm.rows) emit({ case: "gemm", ...x });
      for (const [isa, v] of Object.entries(run.gemm.peaks))
        run.record({
          case: `fma-peak-${isa}`,
          gflops: r(v, 1),
          what: "one core, 12 independent register-only FMA chains",
        } as unknown as BenchRow);
      for (const k of [...new Set(run.gemm.rows.map((x) => x.kernel))].filter((k) => k.startsWith("builtin"))) {
        const mine = run.gemm.rows.filter((x) => x.kernel === k && x.of_peak !== null);
        const linear = mine.filter((x) => x.seq === 1024 && !x.what.startsWith("attn"));
        run.record({
          case: `gemm-${k.replaceAll(" ", "-")}`,
          min_of_peak: Math.min(...mine.map((x) => x.of_peak!)),
          ...(linear.length ? { min_linear_1024_of_peak: Math.min(...linear.map((x) => x.of_peak!)) } : {}),
          median_of_peak: r(median(mine.map((x) => x.of_peak!)), 3),
          shapes: mine.length,
        } as unknown as BenchRow);
      }
    });
  }

  // ---- 9: the fused attention kernel at the frozen shape (with --attention-base, against an older revision's build)
  if (o.cases.has("attention")) {
    await run.guard("attention", async () => {
      log(
        `attention: fused${o.attentionBase ? ` vs ${o.attentionBase.rev}'s build` : ""} at the frozen shape (9/3 heads of 64), T ${o.gemmSeqs.join(", ")}, ${o.precisions.join(", ")}, one thread, ${Math.max(5, o.gemmRounds)} rounds`,
      );
      for (const x of attentionBench({
        seqs: o.gemmSeqs,
        rounds: Math.max(5, o.gemmRounds),
        precisions: o.precisions,
        base: o.attentionBase,
        log,
      }))
        run.record({ case: `attention-T${x.seq}-${x.precision}`, ...x } as unknown as BenchRow);
    });
  }

  // ---- 10: the frozen model on the webgpu engine (with --webgpu-base, against an older revision's build)
  if (o.cases.has("webgpu")) {
    await run.guard("webgpu", async () => {
      log(
        `webgpu: the frozen model, seq ${o.seq}, micro ${o.microBatch}, ${Math.max(1, o.steps)} warm call(s)${o.webgpuBase ? ` vs ${o.webgpuBase.rev}'s build` : ""}; the peak probe, the device profile and the frozen step's counts`,
      );
      const x = await webgpuBench({
        seq: o.seq,
        microBatch: o.microBatch,
        calls: Math.max(1, o.steps),
        base: o.webgpuBase,
        log,
      });
      run.record(x as unknown as BenchRow);
    });
  }

  // ---- 11: the webgpu engine's fused attention alone (with --webgpu-base, against an older revision's build)
  if (o.cases.has("webgpu-attention")) {
    await run.guard("webgpu-attention", async () => {
      const rounds = Math.max(3, o.gemmRounds);
      log(
        `webgpu-attention: the fused attention at the frozen shape (9/3 heads of 64), T ${o.gemmSeqs.join(", ")}, forward then backward, ${rounds} rounds of 3 calls${o.webgpuBase ? `, taking turns with ${o.webgpuBase.rev}'s build` : ""}`,
      );
      for (const x of webgpuAttentionBench({ seqs: o.gemmSeqs, rounds, calls: 3, base: o.webgpuBase, log }))
        run.record({ case: `webgpu-attention-T${x.seq}`, ...x } as unknown as BenchRow);
    });
  }

  // ---- 7: the frozen 106M model's forward+backward and its MFU, whatever --model says
  if (o.cases.has("frozen-step")) {
    for (const isa of o.isas)
      for (const precision of o.precisions)
        await run.guard(`frozen-step-${precision}${isa === "auto" ? "" : `-${isa}`}`, async () => {
          log(
            `frozen-step: the 106M model, seq ${o.seq}, micro ${o.microBatch}, grad-ckpt ${o.gradCkpt}, ${precision}, --isa ${isa}, ${Math.max(3, o.steps)} warm calls`,
          );
          const { kernel_profile: kp, ...j } = await frozenStepBench({
            seq: o.seq,
            microBatch: o.microBatch,
            gradCkpt: o.gradCkpt,
            // the policy a rank of the widest world runs (one call stands for one rank's forward+backward)
            activationBudgetBytes: activationBudget({
              activationBudgetGb: o.activationBudgetGb,
              world: Math.max(...o.worlds),
            }).bytes,
            calls: Math.max(3, o.steps),
            backend: o.backend,
            precision,
            isa,
            log,
          });
          run.profiled.push({ rows: kp, stepMs: j.profile_step_ms, engine: String(j.kernels_name), precision });
          const name = `frozen-step${isa === "auto" ? "" : `-${isa}`}${precision === "bf16" ? "-bf16" : ""}`;
          run.record({ ...j, case: name } as unknown as BenchRow);
        });
  }
}

/** Case 6: the PyTorch anchor at this shape (fp32 at 1 and all threads; with --precisions bf16 also under
 *  torch.autocast("cpu", bfloat16) at all threads). */
export async function runTorchCases(run: BenchRun, o: Options, s: Shape): Promise<void> {
  const tv = torchVersion();
  if (!tv) {
    run.notes.push("torch: not installed (/usr/bin/python3 -c 'import torch' fails); no PyTorch column");
    log("torch: not installed");
    return;
  }
  const variants: Array<{ th: number; autocast: boolean }> = o.torchThreads.map((th) => ({ th, autocast: false }));
  if (o.precisions.includes("bf16")) variants.push({ th: cores, autocast: true });
  for (const { th, autocast } of variants)
    await run.guard(`torch-${th}${autocast ? "-autocast" : ""}`, async () => {
      log(
        `torch ${tv}: bench/anchors/torch_llama.py, ${th} thread(s)${autocast ? ", autocast bf16" : ""}, seq ${s.seqLen}`,
      );
      run.record(
        await runTorch(s, { steps: Math.max(o.steps, 3), threads: th, timeoutMs: 12 * 60_000, log, autocast }),
      );
    });
}

/** One core's register-only FMA peak for the instructions the built-in GEMM's steps use, measured now (best of 3):
 *  fp32 on the widest kernel, bf16 on AMX TDPBF16PS, else VDPBF16PS, else the fp32 kernel that emulates them; with a
 *  kernel forced (`isa`, as --isa forces it), that kernel's (avx2, avx512: fp32 and the bf16 emulation on its FMA).
 *  Empty on OpenBLAS-only runs. */
function stepPeaks(
  names: string[],
  isa: IsaChoice = "auto",
): {
  fp32?: { isa: string; gflops: number };
  bf16?: { isa: string; gflops: number };
} {
  const best = supportedIsas()[0];
  if (!best) return {};
  const peak = (isa: Parameters<typeof fmaPeak>[0]) => Math.max(...[0, 1, 2].map(() => fmaPeak(isa, 500_000) ?? 0));
  const fp32 = isa === "avx2" || isa === "portable" ? { isa, gflops: peak(isa) } : { isa: best, gflops: peak(best) };
  if (!names.some((n) => n.endsWith("-bf16"))) return { fp32 };
  if (isa !== "auto") return { fp32, bf16: isa === "amx" || isa === "avx512bf16" ? { isa, gflops: peak(isa) } : fp32 };
  const g = builtinGemmBf16();
  return {
    fp32,
    bf16: g?.hw
      ? { isa: "amx", gflops: peak("amx") }
      : g?.dp
        ? { isa: "avx512bf16", gflops: peak("avx512bf16") }
        : fp32,
  };
}

/** A training row's MFU against one core's peak for its instructions (per rank: model FLOPs x tok/s / world). */
function peakMfu(s: Shape, row: BenchRow, peak: { isa: string; gflops: number } | undefined): Record<string, unknown> {
  if (!peak?.gflops || typeof row.tok_per_s !== "number" || row.backend !== "native") return {};
  const flopsPerTok = 6 * s.params + 12 * s.model.numLayers * s.seqLen * s.model.hiddenSize;
  const perRank = (flopsPerTok * row.tok_per_s) / Math.max(1, row.world ?? 1);
  return {
    peak_isa: peak.isa,
    peak_gflops: r(peak.gflops, 1),
    mfu_of_peak: r(perRank / (peak.gflops * 1e9), 3),
    mfu_of_peak_note:
      "per rank: model FLOPs (6N + 12 L T d) x tok/s / world, over one core's register-only FMA peak for the instructions of this row's products, measured in this run",
  };
}
