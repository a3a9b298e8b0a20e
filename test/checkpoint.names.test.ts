// The checkpoint layout's names (src/checkpoint/names.ts, K2): one name per step, read back to the same step,
// and nothing else taken for a checkpoint.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as path from "node:path";
import {
  CKPT_DIR,
  CKPT_FILES,
  FINAL_DIR,
  MANIFEST_FILE,
  POINTER_FILE,
  checkpointDir,
  checkpointName,
  checkpointRepoPath,
  checkpointRoot,
  isPartialName,
  partialDirOf,
  stepOfCheckpointName,
  stepOfRepoFile,
} from "../src/checkpoint";

test("checkpoint-N names round-trip: the name of step N reads back as N, locally and on the Hub (K2)", () => {
  for (const step of [0, 1, 7, 10, 150, 300, 1_000_000, Number.MAX_SAFE_INTEGER]) {
    assert.equal(checkpointName(step), `checkpoint-${step}`);
    assert.equal(stepOfCheckpointName(checkpointName(step)), step);
    assert.equal(checkpointRepoPath(step), `ckpt/checkpoint-${step}`);
    assert.equal(stepOfRepoFile(`${checkpointRepoPath(step)}/model.safetensors`), step);
    assert.equal(checkpointDir("/run", step), path.join("/run", "ckpt", `checkpoint-${step}`));
  }
  assert.equal(checkpointRoot("/run"), path.join("/run", "ckpt"));
});

test("a step that is not a whole number >= 0 has no checkpoint name (K2)", () => {
  for (const bad of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 53]) {
    assert.throws(() => checkpointName(bad), /checkpoint step must be a whole number >= 0, got /, String(bad));
  }
});

test("only canonical checkpoint-N names are checkpoints: no leading zeros, signs, suffixes or other folders (K2)", () => {
  for (const n of [
    "checkpoint-007",
    "checkpoint--1",
    "checkpoint-+1",
    "checkpoint-1.5",
    "checkpoint-",
    "checkpoint-1x",
    "xcheckpoint-1",
    "checkpoint-1.partial-123",
    "checkpoint-1.superseded-9",
    "final",
    "Checkpoint-1",
    " checkpoint-1",
  ]) {
    assert.equal(stepOfCheckpointName(n), null, n);
  }
  assert.equal(stepOfCheckpointName("checkpoint-0"), 0);
  for (const p of [
    "ckpt/checkpoint-12",
    "ckpt/checkpoint-012/x",
    "final/model.safetensors",
    "x/ckpt/checkpoint-1/a",
    "ckpt/checkpoint-1.partial-3/a",
    "latest.json",
  ]) {
    assert.equal(stepOfRepoFile(p), null, p);
  }
  assert.equal(stepOfRepoFile("ckpt/checkpoint-12/sub/dir/file"), 12);
});

test("a folder being written carries a .partial-<pid> name, which is never a checkpoint name (K2, O4)", () => {
  const dir = checkpointDir("/run", 8);
  const tmp = partialDirOf(dir, 4242);
  assert.equal(tmp, `${dir}.partial-4242`);
  assert.equal(isPartialName(path.basename(tmp)), true);
  assert.equal(stepOfCheckpointName(path.basename(tmp)), null);
  for (const n of ["checkpoint-8", "checkpoint-8.partial-", "checkpoint-8.partial-12x", "a.partial"])
    assert.equal(isPartialName(n), false, n);
});

test("the file list of a checkpoint is the six files of K2, the manifest apart (K2, K7)", () => {
  assert.deepEqual(
    [...CKPT_FILES],
    [
      "model.safetensors",
      "optimizer.safetensors",
      "trainer_state.json",
      "cursor.json",
      "config.json",
      "run_config.json",
    ],
  );
});

test("the repo layout beside the checkpoints: the pointer is latest.json at the root and the exported model is final/ (K2, R2, G4)", () => {
  assert.equal(POINTER_FILE, "latest.json");
  assert.equal(FINAL_DIR, "final");
  assert.equal(CKPT_DIR, "ckpt");
  assert.equal(MANIFEST_FILE, "manifest.json");
  assert.equal(stepOfRepoFile(`${FINAL_DIR}/model.safetensors`), null, "final/ is not a checkpoint folder");
  assert.equal(stepOfRepoFile(POINTER_FILE), null, "the pointer is not a checkpoint file");
});

test("the checkpoint module sits below the actors, the Hub cycle and the session: it imports only src/errors, src/model, src/data, src/optim and itself", () => {
  // scripts/deps.cjs reads every import of src/ with the TypeScript parser (type-only and require() included).
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const deps = require(path.join(__dirname, "..", "..", "scripts", "deps.cjs")) as {
    analyze(src: string): { edges: { from: string; to: string }[] };
  };
  const { edges } = deps.analyze(path.join(__dirname, "..", "..", "src"));
  const out = edges.filter((e) => e.from.startsWith("checkpoint/"));
  assert.ok(out.length >= 5, `the graph has the module's imports (${out.length})`);
  const allowed = /^(errors\.ts|model\/.*|data\/.*|optim\/.*|checkpoint\/.*)$/;
  assert.deepEqual(
    out.filter((e) => !allowed.test(e.to)).map((e) => `${e.from} -> ${e.to}`),
    [],
  );
});
