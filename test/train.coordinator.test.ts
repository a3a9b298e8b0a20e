/**
 * The coordinator's own optimizer slice (A2): with a core the ranks leave idle it takes one slice of the reduce and
 * of the AdamW update. The weights must not depend on who runs which slice (up to the order the slices' sums of
 * squares are added in).
 */
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test, describe } from "node:test";
import { Coordinator, RankFailure, RankRefusal, type StepResult } from "../src/actors/coordinator";
import { newScaler, type OptimizerPosition } from "../src/optim/optim";
import { buildConfig } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { writeSyntheticMix } from "./helpers/mix";
import { isUserError } from "../src/errors";
import type { RankFault } from "../src/actors/injected-faults";
import type { UploaderEvent } from "../src/actors/protocol";
import { CTL_ABORT } from "../src/actors/shm";
import { SingleThreadTrainer } from "../src/single-thread";
import { checkpointDocs, readCheckpointFolder, type TrainerState } from "../src/checkpoint";
import { readManifest } from "../src/data/manifest";
import { PackedTokenStore } from "../src/data/token-store";
import { ValStream } from "../src/data/sampler";
import { paramLayout } from "../src/model/layout";
import { sameBits } from "./helpers/numeric";
import { bf16Support } from "../src/model/engine/native";
import { tmpDir } from "./helpers/tmp";

const mix = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 512 });
const model = buildConfig({ seqLen: 32, layers: 2, hidden: 144, vocabSize: 64 });

async function train(
  world: number,
  coordinatorShare: boolean,
  steps: number,
): Promise<{ params: Float32Array; own: boolean; norms: number[] }> {
  const coord = Coordinator.create({
    world,
    model,
    gradCkpt: true,
    activationBudgetBytes: 0,
    backend: "wasm",
    fault: null,
    coordinatorShare,
    data: { root: mix.root, seqLen: 32, dataSeed: 3, microBatch: 2, accum: 2 / world, nVal: 0 },
  });
  initWeights(model, 11, coord.views.params);
  const norms: number[] = [];
  try {
    await coord.spawn();
    const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
    for (let s = 0; s < steps; s++) {
      const r = await coord.step(s, pos, 3e-3, { warmup: 1, decayStart: steps, total: steps });
      assert.ok(r.applied, `step ${s} applied`);
      norms.push(r.gradNorm!);
    }
    return { params: Float32Array.from(coord.views.params), own: coord.ownSlice !== null, norms };
  } finally {
    await coord.close();
  }
}

test("the coordinator's optimizer slice changes no bit of the weights or the gradient norms (A2, A10, B4)", {
  timeout: 120_000,
}, async () => {
  const ranksOnly = await train(1, false, 4);
  const shared = await train(1, true, 4);
  const w2 = await train(2, true, 4);
  assert.equal(ranksOnly.own, false);
  assert.equal(shared.own, true);
  assert.ok(
    ranksOnly.norms.some((n) => n > 1),
    `the clip is active in some step (norms ${ranksOnly.norms.map((n) => n.toFixed(3))}), so the slice order matters there`,
  );
  const bytes = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
  for (const r of [shared, w2]) {
    // every sum runs in an order fixed by the parameter index (the chunks' squares in chunk order), whoever owns a slice
    assert.deepEqual(r.norms, ranksOnly.norms, "the gradient norms, bit for bit");
    assert.ok(bytes(r.params).equals(bytes(ranksOnly.params)), "the weights, bit for bit");
  }
  // The comparison above means something only if the weights moved: AdamW moves each weight by about lr per step
  // (a sign-sized first step), so after 4 steps at lr 3e-3 the typical weight has moved by more than 1e-3.
  const init = new Float32Array(ranksOnly.params.length);
  initWeights(model, 11, init);
  for (const r of [ranksOnly, shared, w2]) {
    let moved = 0;
    for (let i = 0; i < init.length; i++) if (Math.abs(r.params[i] - init[i]) > 1e-3) moved++;
    assert.ok(
      moved > 0.5 * init.length,
      `only ${moved} of ${init.length} weights moved by more than 1e-3 from their init`,
    );
  }
});

/**
 * The coordinator's rules (A2), one behaviour per test, on a tiny model so each runs in seconds: what a step of the
 * actor runtime reports and leaves (checked against the one-thread step of src/single-thread.ts, an independent
 * implementation of the same step), the skip of a step whose gradient is non-finite while the coordinator takes a
 * slice (the NaN is a rank's: no fault can poison the coordinator's own slice alone, see test/MUTATION.md), a rank's
 * failure surfacing as a RankFailure that names the rank, the phase and the error,
 * the validation mean (D7), and the checkpoint capture (the staging copy of weights and moments, K2/B3).
 * The weights' and moments' values per step are checked in train.runtime.test.ts.
 */
describe("the coordinator, rule by rule (A2, D7, K2)", () => {
  const SEQ = 16;
  const MICRO = 2;
  const SEED = 11;
  const DATA_SEED = 3;
  const mix = writeSyntheticMix({ vocab: 64, trainTokens: 16 * 1024, valTokens: 1024 });
  const model = buildConfig({ seqLen: SEQ, layers: 1, hidden: 36, vocabSize: 64 });
  const SHAPE = { warmup: 2, decayStart: 2, total: 5 };

  interface Rt {
    world: number;
    accum: number;
    share?: boolean;
    fault?: RankFault;
    nVal?: number;
  }

  function create(o: Rt): Coordinator {
    const setup = {
      world: o.world,
      model,
      gradCkpt: true,
      activationBudgetBytes: 0,
      backend: "wasm" as const,
      fault: o.fault ?? null,
      data: { root: mix.root, seqLen: SEQ, dataSeed: DATA_SEED, microBatch: MICRO, accum: o.accum, nVal: o.nVal ?? 0 },
    };
    const c = Coordinator.create(o.share === undefined ? setup : { ...setup, coordinatorShare: o.share });
    initWeights(model, SEED, c.views.params);
    return c;
  }

  async function withRuntime<T>(o: Rt, fn: (c: Coordinator) => Promise<T>): Promise<T> {
    const c = create(o);
    try {
      await c.spawn();
      return await fn(c);
    } finally {
      await c.close();
    }
  }

  const oneThread = (world: number, accum: number) =>
    SingleThreadTrainer.create({
      model,
      gradCkpt: true,
      activationBudgetBytes: 0,
      backend: "wasm",
      root: mix.root,
      seqLen: SEQ,
      dataSeed: DATA_SEED,
      world,
      accum,
      microBatch: MICRO,
      seed: SEED,
    });

  const near = (got: number, want: number, rel: number) => Math.abs(got - want) <= rel * Math.abs(want);

  for (const [world, accum, share] of [
    [2, 2, true],
    [1, 2, true],
    [2, 1, false],
  ] as const) {
    test(`every figure of a step at world ${world}, accum ${accum}${share ? ", with the coordinator's slice" : ""} is the one-thread step's: the loss averaged over world*accum micro-batches, the norm over all slices, the LR, the scale used, and the position it leaves (A2, P2, P4, P5)`, {
      timeout: 120_000,
    }, async () => {
      const local = await oneThread(world, accum);
      try {
        await withRuntime({ world, accum, share }, async (c) => {
          assert.equal(c.ownSlice !== null, share, "the coordinator takes a slice exactly when asked to");
          if (c.ownSlice) assert.deepEqual(c.ownSlice[1], c.P, "its slice is the last one, ending at P");
          assert.equal(c.backendInfo.backend, local.backend, "the backend the ranks built is reported");
          assert.ok(c.backendInfo.detail.length > 0, "with its detail line");
          // A scale other than the default, grown once, so the scale used and the position left are not the defaults.
          const pos: OptimizerPosition = { optSteps: 0, scaler: { scale: 1024, growthTracker: 1999 }, skipped: 0 };
          const ref: OptimizerPosition = structuredClone(pos);
          for (let s = 0; s < 3; s++) {
            const want = await local.step(s, ref, 1e-3, SHAPE);
            const t0 = performance.now();
            const got: StepResult = await c.step(s, pos, 1e-3, SHAPE);
            const wall = performance.now() - t0;
            const tag = `step ${s}`;
            assert.equal(got.step, s);
            assert.ok(near(got.loss, want.loss, 1e-9), `${tag}: loss ${got.loss} vs the one-thread mean ${want.loss}`);
            assert.ok(
              got.loss > 1 && got.loss < 10,
              `${tag}: loss ${got.loss} is a per-token cross-entropy near ln 64`,
            );
            assert.equal(got.applied, true, `${tag}: applied`);
            assert.ok(
              near(got.gradNorm!, want.gradNorm!, 1e-5),
              `${tag}: norm ${got.gradNorm} vs ${want.gradNorm} (P4)`,
            );
            assert.equal(got.lr, want.lr, `${tag}: the LR of the schedule (P5)`);
            assert.equal(got.scaleUsed, want.scaleUsed, `${tag}: the scale the micro-batches were scaled by`);
            assert.deepEqual(pos, ref, `${tag}: the position the step leaves (P2)`);
            // Each phase's reported time is a part of the step's: positive, and not more than the whole step took.
            for (const k of ["computeMs", "reduceMs", "updateMs"] as const)
              assert.ok(got[k] > 0 && got[k] <= wall, `${tag}: ${k} ${got[k]} within the step's ${wall} ms`);
          }
          assert.equal(pos.scaler.scale, 2048, "the 2000th clean step doubled the scale (P2)");
          assert.equal(pos.optSteps, 3);
        });
      } finally {
        local.dispose();
      }
    });
  }

  test("by default the coordinator takes a slice exactly when the ranks leave a core idle (A2)", () => {
    const cores = os.availableParallelism();
    for (const world of [1, 2]) {
      const c = create({ world, accum: 1 });
      assert.equal(c.ownSlice !== null, world < cores, `world ${world} on ${cores} cores`);
    }
  });

  test("until its ranks have reported, a coordinator names no backend: '?' with an empty detail (A2)", () => {
    assert.deepEqual(create({ world: 1, accum: 1 }).backendInfo, { backend: "?", detail: "" });
  });

  test("a NaN in one rank's gradient skips the step with the coordinator's slice taken: nothing moves, no update time, the scale halves (P2)", {
    timeout: 120_000,
  }, async () => {
    await withRuntime({ world: 2, accum: 1, share: true, fault: { rank: 1, step: 0, kind: "nan" } }, async (c) => {
      const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
      const before = [c.views.params, c.views.m, c.views.v].map((a) => Float32Array.from(a));
      const r = await c.step(0, pos, 1e-3, SHAPE);
      assert.equal(r.applied, false);
      assert.equal(r.gradNorm, null);
      assert.equal(r.updateMs, 0, "no update ran");
      for (const [i, a] of [c.views.params, c.views.m, c.views.v].entries())
        assert.ok(sameBits(a, before[i]), `array ${i} untouched`);
      assert.deepEqual(pos, { optSteps: 0, scaler: { scale: 32768, growthTracker: 0 }, skipped: 1 });
    });
  });

  test("a rank that throws fails the step with a RankFailure naming the rank, the phase and the error, and the other ranks are told to stop (A2)", {
    timeout: 120_000,
  }, async () => {
    await withRuntime({ world: 2, accum: 1, share: true, fault: { rank: 1, step: 1, kind: "throw" } }, async (c) => {
      const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
      await c.step(0, pos, 1e-3, SHAPE);
      assert.equal(Atomics.load(c.views.ctl, CTL_ABORT), 0);
      const e = await c.step(1, pos, 1e-3, SHAPE).then(
        () => null,
        (x: unknown) => x,
      );
      assert.ok(e instanceof RankFailure, `a RankFailure, not ${String(e)}`);
      assert.equal(e.name, "RankFailure");
      assert.equal(e.rank, 1);
      assert.equal(e.phase, "step 1 compute");
      assert.equal(
        e.message,
        "rank 1 failed during step 1 compute: injected fault: rank 1 throws at step 1 (TSTRAIN_FAULT)",
      );
      assert.equal(
        Atomics.load(c.views.ctl, CTL_ABORT),
        1,
        "the abort flag stops the others at their next micro-batch",
      );
      assert.deepEqual(pos.optSteps, 1, "the failed step moved nothing");
      // Every rank's reply was awaited before the failure surfaced: the runtime still answers both ranks.
      assert.deepEqual(
        (await c.memory()).map((m) => m.rank),
        [0, 1],
      );
    });
  });

  test("a rank whose thread exits fails the step with a RankFailure giving the exit code, and every later request to it fails the same way (A2)", {
    timeout: 120_000,
  }, async () => {
    await withRuntime({ world: 2, accum: 1, share: false, fault: { rank: 0, step: 0, kind: "exit" } }, async (c) => {
      const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
      const e = await c.step(0, pos, 1e-3, SHAPE).then(
        () => null,
        (x: unknown) => x,
      );
      assert.ok(e instanceof RankFailure, `a RankFailure, not ${String(e)}`);
      assert.equal(e.message, "rank 0 failed during step 0 compute: worker thread exited with code 3");
      const again = await c.memory().then(
        () => null,
        (x: unknown) => x,
      );
      assert.equal(again, e, "the dead rank answers every later request with its failure");
    });
  });

  test("a rank that refuses to start fails spawn with a RankRefusal keeping the refusal's message and rule, and a later request to it fails naming that request's phase (A1, A2, D7)", {
    timeout: 120_000,
  }, async () => {
    const c = create({ world: 1, accum: 1, nVal: 1_000_000 });
    try {
      const e = await c.spawn().then(
        () => null,
        (x: unknown) => x,
      );
      assert.ok(e instanceof RankRefusal, `a RankRefusal, not ${String(e)}`);
      assert.ok(isUserError(e), "main prints it as a refusal and exits 2");
      assert.equal(e.phase, "init");
      assert.equal(e.rank, 0);
      assert.equal(e.rule, "D7");
      assert.match(
        e.message,
        /^validation asks for 1000000 windows of 16 tokens but the val split holds \d+; use valWindowCount\(\) to size it \[D7\]$/,
      );
      // The rank's thread lives on without a model: the next request fails on it, named after that request's phase.
      const later = await c.memory().then(
        () => null,
        (x: unknown) => x,
      );
      assert.ok(later instanceof RankFailure, `a RankFailure, not ${String(later)}`);
      assert.equal(later.message, "rank 0 failed during memory report: rank received memory before init");
    } finally {
      await c.close();
    }
  });

  test("the validation loss is the mean over windows [0, nVal) split across the ranks, and a rank's failure there is a RankFailure (D7, A2)", {
    timeout: 120_000,
  }, async () => {
    const nVal = 5;
    const local = await oneThread(1, 1);
    let want = 0;
    try {
      const manifest = readManifest(mix.root);
      const val = new ValStream(PackedTokenStore.open(mix.root, manifest, "val"), SEQ, nVal);
      const ids = new Int32Array(SEQ);
      for (let i = 0; i < nVal; i++) {
        val.read(i, ids);
        want += local.llama.loss(ids, 1, SEQ);
      }
      want /= nVal;
    } finally {
      local.dispose();
    }
    for (const world of [1, 2]) {
      const got = await withRuntime({ world, accum: 1, nVal }, (c) => c.evaluate(nVal));
      assert.ok(near(got, want, 1e-9), `world ${world}: ${got} vs the mean ${want} of the ${nVal} windows' losses`);
    }
    await withRuntime({ world: 2, accum: 1, nVal, fault: { rank: 1, step: 0, kind: "val" } }, async (c) => {
      const e = await c.evaluate(nVal).then(
        () => null,
        (x: unknown) => x,
      );
      assert.ok(e instanceof RankFailure);
      assert.equal(
        e.message,
        "rank 1 failed during validation: injected fault: rank 1 fails validation (TSTRAIN_FAULT)",
      );
    });
  });

  test("the memory report has one entry per rank, in rank order (A2)", { timeout: 120_000 }, async () => {
    const mem = await withRuntime({ world: 2, accum: 1 }, async (c) => {
      await c.step(0, { optSteps: 0, scaler: newScaler(), skipped: 0 }, 1e-3, SHAPE);
      return c.memory();
    });
    assert.deepEqual(
      mem.map((m) => m.rank),
      [0, 1],
    );
    for (const m of mem) assert.ok(m.heapPeakBytes > 0 && m.arenaBytes > 0, JSON.stringify(m));
  });

  test("a checkpoint captures the weights and both moments of the step it is taken at, with its documents, while training goes on (K2, B3)", {
    timeout: 120_000,
  }, async () => {
    const runDir = tmpDir("coord-ckpt");
    await withRuntime({ world: 1, accum: 1, share: true }, async (c) => {
      assert.deepEqual(
        await c.drainUploads(),
        { head: null, outcomes: [], failure: null },
        "no uploader: nothing to drain",
      );
      assert.throws(
        () =>
          c.stageWrite({
            step: 0,
            dir: path.join(runDir, "x"),
            docs: checkpointDocs({ trainerState: {} as TrainerState, cursor: 0, hfConfig: 0, runConfig: 0 }),
            publish: null,
          }),
        /uploader not started/,
      );
      const events: UploaderEvent[] = [];
      await c.startUploader({ hub: null, prune: false, minFreeGb: 0, keepLocal: 5, runDir }, (e) => events.push(e));
      const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
      const saved: Float32Array[][] = [];
      for (let s = 0; s < 2; s++) {
        await c.step(s, pos, 1e-3, SHAPE);
        saved.push([c.views.params, c.views.m, c.views.v].map((a) => Float32Array.from(a)));
        const trainerState: TrainerState = {
          format: "tstrain-trainer-state/1",
          step: s + 1,
          opt_steps: pos.optSteps,
          skipped_steps: pos.skipped,
          scaler: pos.scaler,
          lr_shape: SHAPE,
          seqs_per_step: 1,
          log_history: [],
        };
        const dir = path.join(runDir, "ckpt", `checkpoint-${s + 1}`);
        const out = await c.stageCheckpoint({
          step: s + 1,
          dir,
          publish: null,
          docs: checkpointDocs({
            trainerState,
            cursor: { step: s + 1 },
            hfConfig: { model_type: "llama", s },
            runConfig: { lr: 1e-3, s },
          }),
        });
        assert.equal(out.step, s + 1);
        assert.equal(out.dir, dir);
        assert.equal(out.published, null, "no Hub: not published");
        assert.ok(out.writeSeconds >= 0);
      }
      // The next step moves the live weights; the checkpoints keep what they captured.
      await c.step(2, pos, 1e-3, SHAPE);
      const P = paramLayout(model).total;
      for (let s = 0; s < 2; s++) {
        const got = [new Float32Array(P), new Float32Array(P), new Float32Array(P)];
        const dir = path.join(runDir, "ckpt", `checkpoint-${s + 1}`);
        const docs = readCheckpointFolder(dir, model, got[0], got[1], got[2]);
        for (const [i, a] of got.entries())
          assert.ok(
            sameBits(a, saved[s][i]),
            `checkpoint ${s + 1}: ${["weights", "m", "v"][i]} are those after step ${s}`,
          );
        assert.ok(!sameBits(got[0], c.views.params), "and not the live weights");
        assert.equal(docs.state.step, s + 1);
        assert.deepEqual(docs.hfConfig, { model_type: "llama", s });
        assert.deepEqual(docs.runConfig, { lr: 1e-3, s });
        assert.deepEqual(JSON.parse(fs.readFileSync(path.join(dir, "cursor.json"), "utf8")), { step: s + 1 });
      }
      assert.deepEqual(
        events.map((e) => (e.type === "published" ? e.outcome.step : e.type)),
        [1, 2],
        "the uploader reported each publication",
      );
      const d = await c.drainUploads();
      assert.deepEqual(
        d.outcomes.map((o) => o.step),
        [1, 2],
      );
      // A write that fails (its folder cannot be made: a file is in the way) rejects, and the next checkpoint still works.
      fs.writeFileSync(path.join(runDir, "blocker"), "");
      await assert.rejects(
        c.stageCheckpoint({
          step: 9,
          dir: path.join(runDir, "blocker", "checkpoint-9"),
          publish: null,
          docs: checkpointDocs({ trainerState: {} as TrainerState, cursor: {}, hfConfig: {}, runConfig: {} }),
        }),
      );
    });
  });
});

/**
 * P8: the one-thread step (src/single-thread.ts) on the bf16 AMX kernel, which keeps the weights' packed copies
 * between updates, against the same step on the portable kernel's emulation, which packs every product (the same
 * bits by P8): equal losses and weights step after step only if the trainer marks its copies stale after each
 * update, as a rank does. Each trainer runs alone (the copies are the process's).
 */
test("the one-thread trainer in bf16 marks the AMX kernel's weight copies stale after each update: its steps are the emulation's, bit for bit (P8)", {
  skip: (bf16Support()?.hw ?? false) ? false : "this CPU (or OS) has no AMX-BF16",
  timeout: 120_000,
}, async () => {
  const SEQ = 16;
  const model = buildConfig({ seqLen: SEQ, layers: 1, hidden: 36, vocabSize: 64 });
  const shape = { warmup: 1, decayStart: 4, total: 8 };
  const run = async (isa: "amx" | "portable") => {
    const t = await SingleThreadTrainer.create({
      model,
      gradCkpt: true,
      activationBudgetBytes: 0,
      backend: "native",
      native: { gemm: "builtin", isa, precision: "bf16" },
      root: mix.root,
      seqLen: SEQ,
      dataSeed: 3,
      world: 1,
      accum: 2,
      microBatch: 2,
      seed: 11,
    });
    try {
      const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
      const losses: number[] = [];
      for (const s of [0, 1, 2, 3]) losses.push((await t.step(s, pos, 3e-2, shape)).loss);
      return { losses, params: t.params.slice(), backend: t.backend };
    } finally {
      t.dispose();
    }
  };
  const amx = await run("amx");
  const emu = await run("portable");
  assert.equal(amx.backend, "native");
  assert.ok(new Set(emu.losses).size > 1, "the weights move from step to step");
  assert.deepEqual(amx.losses, emu.losses, "the losses, step after step");
  assert.ok(sameBits(amx.params, emu.params), "the weights after the last update");
});
