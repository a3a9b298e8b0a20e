// The one parser of each checkpoint document (src/checkpoint/state.ts): trainer_state.json (K2), manifest.json
// (K7) and latest.json (R2). A damaged document is refused naming the file, the field and the rule it breaks.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import {
  lastLoggedLoss,
  priorLoss,
  makePointer,
  parseManifest,
  parsePointer,
  parseTrainerState,
  pointerBytes,
  priorLossOf,
  readTrainerState,
  validatePointer,
  type TrainerState,
} from "../src/checkpoint";
import { tmpDir } from "./helpers/tmp";

const entry = (step: number, loss: number) => ({
  step,
  loss,
  lr: 1e-3,
  grad_norm: 0.5,
  loss_scale: 65536,
  skipped_steps: 0,
  tok_per_s: 10,
  elapsed_s: 1,
});
const GOOD: TrainerState = {
  format: "tstrain-trainer-state/1",
  step: 8,
  opt_steps: 7,
  skipped_steps: 1,
  scaler: { scale: 32768, growthTracker: 3 },
  lr_shape: { warmup: 2, decayStart: 6, total: 10 },
  seqs_per_step: 4,
  log_history: [entry(7, 3.5), entry(8, 3.25)],
};
const bytes = (v: unknown) => JSON.stringify(v);
const WHERE = "/run/ckpt/checkpoint-8/trainer_state.json";
/** A K2 UserError naming the file, and whatever else `re` asks for. */
const isK2 = (re: RegExp) => (e: unknown) => {
  const m = (e as Error).message;
  assert.equal((e as Error).name, "UserError", m);
  assert.match(m, /\[K2\]$/);
  assert.ok(m.startsWith(`${WHERE} `), `names the file: ${m}`);
  assert.match(m, /the checkpoint is damaged; resume from an earlier verified checkpoint/);
  assert.match(m, re);
  return true;
};

test("a valid trainer_state.json parses to the very object written (K2)", () => {
  assert.deepEqual(parseTrainerState(bytes(GOOD), WHERE), GOOD);
  assert.deepEqual(parseTrainerState(Buffer.from(bytes(GOOD)), WHERE), GOOD, "bytes as well as text");
  const edge = {
    ...GOOD,
    step: 0,
    opt_steps: 0,
    skipped_steps: 0,
    scaler: { scale: 1e-30, growthTracker: 0 },
    lr_shape: { warmup: 0, decayStart: 0, total: 0 },
    seqs_per_step: 1,
    log_history: [],
  };
  assert.deepEqual(parseTrainerState(bytes(edge), WHERE), edge, "every lower bound is allowed");
  assert.deepEqual(parseTrainerState(bytes({ ...GOOD, opt_steps: 8 }), WHERE).opt_steps, 8, "opt_steps may equal step");
});

test("a trainer_state.json that is not JSON, or not an object, is refused naming the file (K2)", () => {
  assert.throws(
    () => parseTrainerState('{"format": "tstrain-trainer-state/1", "step": 8', WHERE),
    isK2(/is not valid JSON \(/),
  );
  assert.throws(() => parseTrainerState("", WHERE), isK2(/is not valid JSON/));
  for (const v of ["[]", "null", "3", '"x"'])
    assert.throws(() => parseTrainerState(v, WHERE), isK2(/is not a JSON object/), v);
});

test("a trainer_state.json with one field out of its rule is refused naming the file, the field, the rule and the value (K2)", () => {
  const cases: Array<[string, unknown, RegExp]> = [
    [
      "format",
      "tstrain-trainer-state/2",
      /format must be "tstrain-trainer-state\/1" \(got "tstrain-trainer-state\/2"\)/,
    ],
    ["format", undefined, /format must be .* \(got nothing\)/],
    ["step", -1, /step must be a whole number >= 0 \(got -1\)/],
    ["step", 2.5, /step must be a whole number >= 0 \(got 2.5\)/],
    ["step", "8", /step must be a whole number >= 0 \(got "8"\)/],
    ["opt_steps", 9, /opt_steps must be a whole number in \[0, step\] \(got 9\)/],
    ["opt_steps", -1, /opt_steps must be a whole number in \[0, step\] \(got -1\)/],
    ["opt_steps", 1.5, /opt_steps .* \(got 1.5\)/],
    ["skipped_steps", -2, /skipped_steps must be a whole number >= 0 \(got -2\)/],
    ["skipped_steps", null, /skipped_steps must be a whole number >= 0 \(got null\)/],
    ["scaler", null, /scaler must be \{scale > 0, growthTracker in \[0, 2000\)\} \(got null\)/],
    ["scaler", { scale: 2, growthTracker: 2000 }, /scaler must be .*"growthTracker":2000/],
    ["scaler", { scale: 0, growthTracker: 0 }, /scaler must be .*"scale":0/],
    ["scaler", { scale: -1, growthTracker: 0 }, /scaler must be/],
    ["scaler", { scale: null, growthTracker: 0 }, /scaler must be/],
    ["scaler", { scale: 2, growthTracker: -1 }, /scaler must be/],
    ["scaler", { scale: 2, growthTracker: 0.5 }, /scaler must be/],
    ["scaler", { growthTracker: 0 }, /scaler must be/],
    ["scaler", [65536, 0], /scaler must be/],
    ["lr_shape", { warmup: 2, decayStart: 6 }, /lr_shape must be \{warmup, decayStart, total\} in whole steps/],
    ["lr_shape", { warmup: -1, decayStart: 6, total: 10 }, /lr_shape must be/],
    ["lr_shape", { warmup: 2, decayStart: 6.5, total: 10 }, /lr_shape must be/],
    ["lr_shape", { warmup: 2, decayStart: 6, total: "10" }, /lr_shape must be/],
    ["lr_shape", "trapezoid", /lr_shape must be/],
    ["seqs_per_step", 0, /seqs_per_step must be a whole number > 0 \(got 0\)/],
    ["seqs_per_step", 1.5, /seqs_per_step must be a whole number > 0 \(got 1.5\)/],
    ["log_history", {}, /log_history must be a list of objects \(got \{\}\)/],
    ["log_history", [entry(1, 2), 3], /log_history must be a list of objects/],
    ["log_history", [null], /log_history must be a list of objects/],
  ];
  for (const [field, value, re] of cases) {
    const bad: Record<string, unknown> = { ...GOOD, [field]: value };
    if (value === undefined) delete bad[field];
    assert.throws(
      () => parseTrainerState(bytes(bad), WHERE),
      isK2(new RegExp(`is not a tstrain trainer state: ${re.source}`)),
      `${field}=${JSON.stringify(value)}`,
    );
  }
});

test("readTrainerState reads <dir>/trainer_state.json through the same parser; a missing or damaged file names its path (K2)", () => {
  const dir = tmpDir("ckpt-state");
  const p = path.join(dir, "trainer_state.json");
  assert.throws(
    () => readTrainerState(dir),
    (e: Error) =>
      e.name === "UserError" &&
      e.message.includes(`checkpoint trainer_state.json is missing: ${p}`) &&
      /\[K2\]$/.test(e.message),
  );
  assert.equal(
    priorLossOf(dir),
    null,
    "no trainer state: the prior loss is unknown (completeness is judged by the full read)",
  );
  fs.writeFileSync(p, bytes(GOOD));
  assert.deepEqual(readTrainerState(dir), GOOD);
  assert.equal(priorLossOf(dir), 3.25);
  fs.writeFileSync(p, bytes({ ...GOOD, opt_steps: 99 }));
  assert.throws(
    () => readTrainerState(dir),
    (e: Error) => e.message.startsWith(`${p} is not a tstrain trainer state: opt_steps`) && /\[K2\]$/.test(e.message),
  );
  assert.throws(() => priorLossOf(dir), /opt_steps/, "the prior loss of a damaged state is refused, not guessed");
});

test("the prior loss is the last finite loss logged, or null when none is (K2)", () => {
  assert.equal(lastLoggedLoss(GOOD), 3.25);
  assert.equal(
    lastLoggedLoss({ ...GOOD, log_history: [entry(1, 4), { ...entry(2, 0), loss: null as unknown as number }] }),
    4,
    "a NaN loss is written as null and skipped",
  );
  assert.equal(lastLoggedLoss({ ...GOOD, log_history: [entry(1, 4), entry(2, Number.POSITIVE_INFINITY)] }), 4);
  assert.equal(lastLoggedLoss({ ...GOOD, log_history: [] }), null);
  assert.equal(lastLoggedLoss({ ...GOOD, log_history: [entry(1, 0)] }), 0, "a loss of 0 is a loss");
});

test("a resume's prior loss is the loss the checkpoint recorded of its own step, else the last one logged (K2)", () => {
  const own = { ...GOOD, loss: 3.5 };
  assert.equal(priorLoss(own), 3.5, "the checkpoint's own step's loss, not the last logged 3.25");
  assert.equal(priorLoss(GOOD), 3.25, "a checkpoint from before the loss was recorded: the last logged");
  assert.deepEqual(parseTrainerState(bytes(own), "w"), own);
  assert.throws(() => parseTrainerState(bytes({ ...GOOD, loss: "3.5" }), "w"), /loss must be a finite number/);
  const dir = tmpDir("ckpt-state-loss");
  fs.writeFileSync(path.join(dir, "trainer_state.json"), bytes(own));
  assert.equal(priorLossOf(dir), 3.5);
});

const SHA = "ab".repeat(32);
test("manifest.json parses when every entry is {size, sha256} and is refused naming the entry otherwise (K7)", () => {
  const m = {
    format: "tstrain-manifest/1",
    step: 8,
    files: { "model.safetensors": { size: 10, sha256: SHA }, "cursor.json": { size: 0, sha256: SHA } },
  };
  assert.deepEqual(parseManifest(JSON.stringify(m), "w"), m);
  assert.deepEqual(parseManifest(Buffer.from(JSON.stringify({ ...m, files: {} })), "w").files, {});
  assert.throws(
    () => parseManifest("{", "ckpt/checkpoint-8/manifest.json"),
    /^Error: ckpt\/checkpoint-8\/manifest\.json is not valid JSON$/,
  );
  for (const bad of [
    null,
    { ...m, format: "x" },
    { ...m, step: 1.5 },
    { ...m, step: "8" },
    { ...m, files: null },
    { ...m, files: undefined },
  ]) {
    assert.throws(
      () => parseManifest(JSON.stringify(bad), "M"),
      /^Error: M is not a tstrain manifest \(\{format: "tstrain-manifest\/1", step, files\}\)$/,
      JSON.stringify(bad),
    );
  }
  for (const [name, f] of [
    ["a", { size: -1, sha256: SHA }],
    ["a", { size: 1.5, sha256: SHA }],
    ["a", { sha256: SHA }],
    ["a", { size: 1, sha256: SHA.toUpperCase() }],
    ["a", { size: 1, sha256: SHA.slice(1) }],
    ["a", { size: 1, sha256: `${SHA}0` }],
    ["a", { size: 1 }],
    ["a", null],
    ["a", { size: 1, sha256: [SHA] }],
    ["manifest.json", { size: 1, sha256: SHA }],
  ] as const) {
    assert.throws(
      () => parseManifest(JSON.stringify({ ...m, files: { [name]: f } }), "M"),
      new RegExp(`^Error: M: entry "${name.replace(".", "\\.")}" is not \\{size, sha256\\}$`),
      JSON.stringify(f),
    );
  }
});

test("latest.json parses to exactly the six pointer fields, is written as it is read, and is refused naming the field (R2)", () => {
  const p = makePointer({
    pathInRepo: "ckpt/checkpoint-8",
    step: 8,
    seqsPerStep: 4,
    seqLen: 16,
    fingerprint: "fp",
    seed: 3,
  });
  assert.deepEqual(p, {
    path_in_repo: "ckpt/checkpoint-8",
    step: 8,
    samples_consumed: 32,
    tokens_consumed: 512,
    fingerprint: "fp",
    seed: 3,
  });
  assert.equal(pointerBytes(p), `${JSON.stringify(p, null, 1)}\n`);
  assert.deepEqual(parsePointer(pointerBytes(p), "latest.json on o/r"), p);
  assert.deepEqual(parsePointer(JSON.stringify({ ...p, extra: 1 }), "w"), p, "unknown fields are dropped");
  assert.throws(
    () => parsePointer("{nope", "latest.json on o/r"),
    /^Error: latest\.json on o\/r is not valid JSON \(5 bytes\)$/,
  );
  assert.throws(() => parsePointer(Buffer.from("é{"), "L"), /is not valid JSON \(3 bytes\)/, "bytes, not characters");
  assert.throws(() => validatePointer(null, "L"), /^Error: L: not a JSON object$/);
  assert.throws(() => validatePointer(7, "L"), /^Error: L: not a JSON object$/);
  for (const [k, v] of [
    ["path_in_repo", ""],
    ["path_in_repo", 3],
    ["step", -1],
    ["step", 1.5],
    ["samples_consumed", "32"],
    ["tokens_consumed", null],
    ["seed", -3],
    ["fingerprint", 1],
  ] as const) {
    assert.throws(
      () => validatePointer({ ...p, [k]: v }, "L"),
      new RegExp(
        `^Error: L: field ${k} is missing or invalid \\(got ${JSON.stringify(v).replace(/[.]/g, "\\.")}\\); expected \\{path_in_repo, step, samples_consumed, tokens_consumed, fingerprint, seed\\}$`,
      ),
      `${k}=${JSON.stringify(v)}`,
    );
  }
  const { seed: _seed, ...noSeed } = p;
  assert.throws(() => validatePointer(noSeed, "L"), /field seed is missing or invalid \(got undefined\)/);
});
