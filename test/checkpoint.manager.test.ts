// The checkpoint manager (src/checkpoint/manager.ts, K2): it saves and restores the stateful parts (optimizer
// position, loss scaler, LR shape, data plan, log) and the tensors. What it writes is byte for byte the
// trainer_state.json tstrain always wrote (old checkpoints keep resuming, new ones look the same); what it reads
// back puts every part where it was; a state a reader would refuse is never written; a saved state that does
// not fit the plan is refused naming the rule.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { buildConfig, hfConfigJson } from "../src/model/llama-config";
import { paramLayout } from "../src/model/layout";
import { encodeSafetensors, flatToTensors } from "../src/model/safetensors";
import { makeCursor } from "../src/data/cursor";
import { newScaler, scalerUpdate, validScaler, type OptimizerPosition } from "../src/optim/optim";
import { SCALER_FIELDS } from "../src/optim/optim-state";
import {
  CheckpointManager,
  assembleTrainerState,
  checkpointDir,
  parseTrainerState,
  saveCheckpoint,
  trainerStateParts,
  type LogEntry,
} from "../src/checkpoint";
import { tmpDir } from "./helpers/tmp";

const read = (dir: string, name: string) => fs.readFileSync(path.join(dir, name));

const cfg = buildConfig({ seqLen: 8, layers: 1, hidden: 72, vocabSize: 40 });
const P = paramLayout(cfg).total;
const filled = (seed: number) =>
  Float32Array.from({ length: P }, (_, i) => Math.fround(Math.sin(i * 0.37 + seed) * (1 + seed)));
const lrShape = { warmup: 1, decayStart: 4, total: 10 };
const entry = (step: number): LogEntry => ({
  step,
  loss: 3.5 - step / 10,
  lr: 1e-3,
  grad_norm: 0.25,
  loss_scale: 32768,
  skipped_steps: 1,
  tok_per_s: 100,
  elapsed_s: step,
});

function managerOf(pos: OptimizerPosition, history: LogEntry[], shape = lrShape): CheckpointManager {
  return new CheckpointManager(trainerStateParts({ pos, lrShape: shape, seqsPerStep: 2, history }), {
    cursorAt: (step) =>
      makeCursor({ step, seqsPerStep: 2, seqLen: 8, seed: 1, fingerprint: "a".repeat(64), permSha: "b".repeat(64) }),
    hfConfig: hfConfigJson(cfg),
    runConfig: { lr: 6e-4, seed: 1 },
  });
}

test("the manager writes trainer_state.json field for field in the order tstrain always wrote it (K2)", () => {
  const pos: OptimizerPosition = { optSteps: 5, scaler: { scale: 32768, growthTracker: 3 }, skipped: 1 };
  const history = [entry(2), entry(4)];
  const docs = managerOf(pos, history).documents(6);
  // The bytes of the format as it was built by hand before the manager (session/in-flight.ts): pinned here.
  const before = {
    format: "tstrain-trainer-state/1",
    step: 6,
    opt_steps: 5,
    skipped_steps: 1,
    scaler: { scale: 32768, growthTracker: 3 },
    lr_shape: { warmup: 1, decayStart: 4, total: 10 },
    seqs_per_step: 2,
    log_history: [entry(2), entry(4)],
  };
  assert.equal(JSON.stringify(docs["trainer_state.json"], null, 1), JSON.stringify(before, null, 1));
  assert.deepEqual(Object.keys(docs), ["trainer_state.json", "cursor.json", "config.json", "run_config.json"]);
  assert.equal((docs["cursor.json"] as { step: number }).step, 6);
});

test("a checkpoint the manager saves restores every part and the tensors into a fresh run (K2)", () => {
  const run = tmpDir("ckpt-manager");
  const pos: OptimizerPosition = { optSteps: 7, scaler: { scale: 1024, growthTracker: 1999 }, skipped: 1 };
  const history = [entry(4), entry(8)];
  const tensors = { params: filled(1), m: filled(2), v: filled(3) };
  const dir = checkpointDir(run, 8);
  saveCheckpoint(dir, cfg, tensors, managerOf(pos, history).documents(8));

  const fresh: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
  const freshHistory: LogEntry[] = [];
  const into = { params: new Float32Array(P), m: new Float32Array(P), v: new Float32Array(P) };
  const state = managerOf(fresh, freshHistory).restore(dir, cfg, into);
  assert.equal(state.step, 8);
  assert.deepEqual(fresh, pos, "optimizer steps, skips and the scaler are back");
  assert.deepEqual(freshHistory, history, "the log is back, in the array the session appends to");
  for (const k of ["params", "m", "v"] as const)
    assert.ok(Buffer.from(into[k].buffer).equals(Buffer.from(tensors[k].buffer)), `${k} bit-identical`);
  // and the next checkpoint of the resumed run is what the first run would have written
  assert.deepEqual(
    managerOf(fresh, freshHistory).documents(8)["trainer_state.json"],
    managerOf(pos, history).documents(8)["trainer_state.json"],
  );
});

test("a saved LR shape with another horizon is refused on restore naming P5; nothing is put back", () => {
  const run = tmpDir("ckpt-manager-p5");
  const pos: OptimizerPosition = { optSteps: 3, scaler: newScaler(), skipped: 0 };
  const dir = checkpointDir(run, 3);
  saveCheckpoint(dir, cfg, { params: filled(1), m: filled(2), v: filled(3) }, managerOf(pos, []).documents(3));
  const fresh: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
  const into = { params: new Float32Array(P), m: new Float32Array(P), v: new Float32Array(P) };
  assert.throws(
    () => managerOf(fresh, [], { ...lrShape, total: 20 }).restore(dir, cfg, into),
    (e: Error & { rule?: string }) =>
      e.rule === "P5" && /the checkpoint's horizon is 10 steps but this plan has 20/.test(e.message),
  );
  assert.equal(fresh.optSteps, 0, "the optimizer part is restored only after every check passed");
});

test("a state a reader would refuse is never written: the manager checks what it assembles with the reader's rules (K2, P2)", () => {
  const dir = tmpDir("ckpt-manager-bad");
  const history: LogEntry[] = [];
  const bad: Array<[string, OptimizerPosition, RegExp]> = [
    ["scaler at the growth interval", { optSteps: 1, scaler: { scale: 2, growthTracker: 2000 }, skipped: 0 }, /scaler/],
    ["scale 0", { optSteps: 1, scaler: { scale: 0, growthTracker: 0 }, skipped: 0 }, /scaler/],
    ["opt_steps past the step", { optSteps: 9, scaler: newScaler(), skipped: 0 }, /opt_steps/],
  ];
  for (const [what, pos, re] of bad)
    assert.throws(
      () => managerOf(pos, history).documents(4),
      (e: Error) => re.test(e.message) && /is not one a resume accepts/.test(e.message),
      what,
    );
  assert.deepEqual(fs.readdirSync(dir), []);
});

test("the trainer state is assembled only from the parts, all of them, in their order", () => {
  const pos: OptimizerPosition = { optSteps: 0, scaler: newScaler(), skipped: 0 };
  const parts = trainerStateParts({ pos, lrShape, seqsPerStep: 2, history: [] });
  assert.throws(() => assembleTrainerState(1, parts.slice(1)), /expected \[optimizer, loss scaler/);
  assert.throws(() => assembleTrainerState(1, [parts[1], parts[0], ...parts.slice(2)]), /expected \[optimizer/);
  const extra = { ...parts[0], stateDict: () => ({ opt_steps: 0, skipped_steps: 0, lr: 1 }) };
  assert.throws(
    () => assembleTrainerState(1, [extra, ...parts.slice(1)]),
    /has fields \[opt_steps, skipped_steps, lr\]/,
  );
});

test("one scaler check for the optimizer, the writer and the reader; every scaler the trainer reaches passes it (P2)", () => {
  // The reader's rule for the scaler field is validScaler itself (optim/optim.ts).
  const t = (scaler: unknown) => ({ scaler });
  for (const s of [newScaler(), { scale: 1, growthTracker: 1999 }, { scale: 2, growthTracker: 2000 }, null])
    assert.equal(SCALER_FIELDS[0].ok(t(s)), validScaler(s), JSON.stringify(s));
  // Every state scalerUpdate leads to, through two growths and back-offs, is one a checkpoint can hold.
  let s = newScaler();
  for (let i = 0; i < 4500; i++) {
    s = scalerUpdate(s, i % 1700 === 1699);
    assert.ok(validScaler(s), `after update ${i}: ${JSON.stringify(s)}`);
  }
  const where = path.join("x", "trainer_state.json");
  const bytes = (scaler: unknown) =>
    JSON.stringify({
      format: "tstrain-trainer-state/1",
      step: 1,
      opt_steps: 1,
      skipped_steps: 0,
      scaler,
      lr_shape: lrShape,
      seqs_per_step: 2,
      log_history: [],
    });
  assert.deepEqual(parseTrainerState(bytes({ scale: 4, growthTracker: 1999 }), where).scaler, {
    scale: 4,
    growthTracker: 1999,
  });
  assert.throws(
    () => parseTrainerState(bytes({ scale: 4, growthTracker: 2000 }), where),
    /growthTracker in \[0, 2000\)/,
  );
});

test("the tensor parts write model.safetensors and optimizer.safetensors byte for byte as before, and the manifest lists the files in the old order (K2, K7)", () => {
  const dir = checkpointDir(tmpDir("ckpt-manager-bytes"), 4);
  const pos: OptimizerPosition = { optSteps: 4, scaler: newScaler(), skipped: 0 };
  const t = { params: filled(1), m: filled(2), v: filled(3) };
  saveCheckpoint(dir, cfg, t, managerOf(pos, [entry(4)]).documents(4));
  // The files as save.ts built them before the tensor parts: weights under HF names; exp_avg.* then exp_avg_sq.*.
  const model = encodeSafetensors(flatToTensors(cfg, t.params), { format: "pt" });
  const moments = encodeSafetensors(
    [
      ...flatToTensors(cfg, t.m).map((x) => ({ ...x, name: `exp_avg.${x.name}` })),
      ...flatToTensors(cfg, t.v).map((x) => ({ ...x, name: `exp_avg_sq.${x.name}` })),
    ],
    { format: "pt" },
  );
  assert.ok(read(dir, "model.safetensors").equals(model), "model.safetensors unchanged");
  assert.ok(read(dir, "optimizer.safetensors").equals(moments), "optimizer.safetensors unchanged");
  const manifest = JSON.parse(read(dir, "manifest.json").toString("utf8")) as { files: Record<string, unknown> };
  assert.deepEqual(Object.keys(manifest.files), [
    "model.safetensors",
    "optimizer.safetensors",
    "trainer_state.json",
    "cursor.json",
    "config.json",
    "run_config.json",
  ]);
});
