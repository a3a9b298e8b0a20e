// Writing and reading a checkpoint folder (src/checkpoint/save.ts, read.ts; K2, K7): the write is atomic (a
// failure part way leaves neither the folder nor its partial copy), the manifest lists every other file, and the
// read gives back bit-identical tensors and the same documents, refusing a damaged folder naming the file.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { buildConfig, hfConfigJson } from "../src/model/llama-config";
import { paramLayout } from "../src/model/layout";
import { decodeSafetensors } from "../src/model/safetensors";
import { makeCursor } from "../src/data/cursor";
import {
  CKPT_FILES,
  CheckpointWriteError,
  checkpointDir,
  estimateCheckpointBytes,
  partialDirOf,
  readHfConfig,
  readRunConfigIfAny,
  checkpointDocs,
  checkpointRoot,
  listCheckpointFolders,
  parseManifest,
  readCheckpointFolder,
  writeCheckpointFolder,
  type TrainerState,
} from "../src/checkpoint";
import { tmpDir } from "./helpers/tmp";

const cfg = buildConfig({ seqLen: 8, layers: 1, hidden: 72, vocabSize: 40 });
const P = paramLayout(cfg).total;
const filled = (seed: number) =>
  Float32Array.from({ length: P }, (_, i) => Math.fround(Math.sin(i * 0.37 + seed) * (1 + seed)));
const state = (step: number): TrainerState => ({
  format: "tstrain-trainer-state/1",
  step,
  opt_steps: step,
  skipped_steps: 0,
  scaler: { scale: 65536, growthTracker: step },
  lr_shape: { warmup: 1, decayStart: 4, total: 10 },
  seqs_per_step: 2,
  log_history: [
    { step, loss: 3.5, lr: 1e-3, grad_norm: 0.25, loss_scale: 65536, skipped_steps: 0, tok_per_s: 100, elapsed_s: 1 },
  ],
});
const docsAt = (step: number, runConfig: unknown = { lr: 6e-4, seed: 1 }) =>
  checkpointDocs({
    trainerState: state(step),
    cursor: makeCursor({
      step,
      seqsPerStep: 2,
      seqLen: 8,
      seed: 1,
      fingerprint: "a".repeat(64),
      permSha: "b".repeat(64),
    }),
    hfConfig: hfConfigJson(cfg),
    runConfig,
  });
const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");
const bitsEqual = (a: Float32Array, b: Float32Array, what: string) =>
  assert.ok(Buffer.from(a.buffer).equals(Buffer.from(b.buffer)), `${what} bit-identical`);

test("a written checkpoint reads back bit-identical: weights, both AdamW moments, the trainer state and the configs (K2)", () => {
  const run = tmpDir("ckpt-rt");
  const dir = checkpointDir(run, 4);
  const [p, m, v] = [filled(1), filled(2), filled(3)];
  writeCheckpointFolder(dir, cfg, p, m, v, docsAt(4));
  const [p2, m2, v2] = [new Float32Array(P), new Float32Array(P), new Float32Array(P)];
  const got = readCheckpointFolder(dir, cfg, p2, m2, v2);
  bitsEqual(p2, p, "weights");
  bitsEqual(m2, m, "exp_avg");
  bitsEqual(v2, v, "exp_avg_sq");
  assert.deepEqual(got.state, state(4));
  assert.deepEqual(got.hfConfig, hfConfigJson(cfg));
  assert.deepEqual(got.runConfig, { lr: 6e-4, seed: 1 });
  assert.deepEqual(fs.readdirSync(run).sort(), ["ckpt"], "nothing but the folder is left in the run folder");
  assert.deepEqual(fs.readdirSync(checkpointRoot(run)), ["checkpoint-4"], "no partial folder is left beside it");
});

test("the manifest is written into every folder and lists the size and sha256 of every other file, and only them (K7)", () => {
  const dir = checkpointDir(tmpDir("ckpt-manifest"), 6);
  writeCheckpointFolder(dir, cfg, filled(1), filled(2), filled(3), docsAt(6));
  assert.deepEqual(fs.readdirSync(dir).sort(), [...CKPT_FILES, "manifest.json"].sort());
  const man = parseManifest(fs.readFileSync(path.join(dir, "manifest.json")), "manifest");
  assert.equal(man.step, 6);
  assert.deepEqual(Object.keys(man.files).sort(), [...CKPT_FILES].sort());
  for (const [name, f] of Object.entries(man.files)) {
    const b = fs.readFileSync(path.join(dir, name));
    assert.deepEqual(f, { size: b.byteLength, sha256: sha(b) }, name);
  }
});

test("a write that fails part way leaves neither the checkpoint folder nor its partial copy, and says so (K2)", () => {
  const run = tmpDir("ckpt-fail");
  writeCheckpointFolder(checkpointDir(run, 2), cfg, filled(1), filled(2), filled(3), docsAt(2));
  const dir = checkpointDir(run, 4);
  // run_config.json cannot be serialised: the weights and moments are already written when it fails.
  assert.throws(
    () => writeCheckpointFolder(dir, cfg, filled(1), filled(2), filled(3), docsAt(4, { big: 1n })),
    (e: unknown) => {
      assert.ok(e instanceof CheckpointWriteError, String(e));
      assert.equal(e.dir, dir);
      assert.match(
        e.message,
        new RegExp(
          `^writing checkpoint folder ${dir.replace(/[\\.]/g, "\\$&")} failed: .*BigInt.*; the partial folder was removed$`,
        ),
      );
      return true;
    },
  );
  assert.deepEqual(
    fs.readdirSync(checkpointRoot(run)),
    ["checkpoint-2"],
    "only the earlier complete checkpoint is there",
  );
  assert.deepEqual(
    listCheckpointFolders(checkpointRoot(run)).map((c) => c.step),
    [2],
  );
  // The same step then writes cleanly: nothing left in the way.
  writeCheckpointFolder(dir, cfg, filled(1), filled(2), filled(3), docsAt(4));
  assert.deepEqual(
    listCheckpointFolders(checkpointRoot(run)).map((c) => c.step),
    [2, 4],
  );
});

test("a failing file system surfaces as CheckpointWriteError with its code, and an existing folder is never overwritten (K2)", () => {
  const run = tmpDir("ckpt-enotdir");
  fs.writeFileSync(path.join(run, "ckpt"), "a file where the folder should be");
  assert.throws(
    () => writeCheckpointFolder(checkpointDir(run, 1), cfg, filled(1), filled(2), filled(3), docsAt(1)),
    (e: unknown) =>
      e instanceof CheckpointWriteError && (e.code === "ENOTDIR" || e.code === "EEXIST") && e.message.includes(e.code),
  );
  const dir = checkpointDir(tmpDir("ckpt-exists"), 3);
  writeCheckpointFolder(dir, cfg, filled(1), filled(2), filled(3), docsAt(3));
  const before = fs.readFileSync(path.join(dir, "model.safetensors"));
  assert.throws(
    () => writeCheckpointFolder(dir, cfg, filled(9), filled(9), filled(9), docsAt(3)),
    (e: Error) =>
      e.name === "UserError" &&
      e.message ===
        `checkpoint folder ${dir} already exists; refusing to overwrite it. Move it away or choose another --out. [K2]`,
  );
  assert.ok(fs.readFileSync(path.join(dir, "model.safetensors")).equals(before), "the existing folder is untouched");
});

test("a checkpoint folder with a file missing or damaged is refused naming that file (K2, R1)", () => {
  const run = tmpDir("ckpt-damaged");
  const read = (d: string) =>
    readCheckpointFolder(d, cfg, new Float32Array(P), new Float32Array(P), new Float32Array(P));
  const isUser = (rule: string, re: RegExp) => (e: Error) =>
    e.name === "UserError" && e.message.endsWith(`[${rule}]`) && re.test(e.message);
  assert.throws(() => read(path.join(run, "nowhere")), isUser("R1", /--resume .*nowhere: no such checkpoint folder/));
  const fresh = (step: number) => {
    const d = checkpointDir(run, step);
    writeCheckpointFolder(d, cfg, filled(1), filled(2), filled(3), docsAt(step));
    return d;
  };
  for (const name of CKPT_FILES.filter((n) => n !== "cursor.json")) {
    const d = fresh(10 + CKPT_FILES.indexOf(name));
    fs.rmSync(path.join(d, name));
    assert.throws(
      () => read(d),
      isUser(
        "K2",
        new RegExp(
          `^checkpoint ${name.replace(".", "\\.")} is missing: ${path.join(d, name).replace(/[\\.]/g, "\\$&")}\\. A checkpoint needs every file of K2 \\(model\\.safetensors, optimizer\\.safetensors, trainer_state\\.json, cursor\\.json, config\\.json, run_config\\.json\\); resume from an earlier verified checkpoint`,
        ),
      ),
      name,
    );
  }
  const bad = fresh(30);
  fs.writeFileSync(
    path.join(bad, "trainer_state.json"),
    JSON.stringify({ ...state(30), scaler: { scale: 0, growthTracker: 0 } }),
  );
  assert.throws(
    () => read(bad),
    isUser(
      "K2",
      new RegExp(
        `^${path.join(bad, "trainer_state.json").replace(/[\\.]/g, "\\$&")} is not a tstrain trainer state: scaler`,
      ),
    ),
  );
  const json = fresh(31);
  fs.writeFileSync(path.join(json, "config.json"), "{");
  assert.throws(() => read(json), isUser("K2", /checkpoint config\.json at .* is not valid JSON/));
  // An optimizer file from a 1-layer model in a 2-layer checkpoint: the moments of layer 1 are missing.
  const two = buildConfig({ seqLen: 8, layers: 2, hidden: 72, vocabSize: 40 });
  const P2 = paramLayout(two).total;
  const opt = checkpointDir(run, 32);
  writeCheckpointFolder(opt, two, new Float32Array(P2), new Float32Array(P2), new Float32Array(P2), docsAt(32));
  fs.copyFileSync(path.join(fresh(33), "optimizer.safetensors"), path.join(opt, "optimizer.safetensors"));
  assert.throws(
    () => readCheckpointFolder(opt, two, new Float32Array(P2), new Float32Array(P2), new Float32Array(P2)),
    isUser(
      "K2",
      /optimizer\.safetensors in .*checkpoint-32 lacks exp_avg\.model\.layers\.1\..*: the optimizer state is incomplete/,
    ),
  );
});

test("listCheckpointFolders lists checkpoint-N folders by step, oldest first, and nothing else (K1, K2)", () => {
  const root = checkpointRoot(tmpDir("ckpt-list"));
  assert.deepEqual(listCheckpointFolders(root), [], "no folder yet");
  for (const n of [
    "checkpoint-100",
    "checkpoint-20",
    "checkpoint-3",
    "checkpoint-20.partial-9",
    "checkpoint-5.superseded-1",
    "checkpoint-007",
    "final",
  ])
    fs.mkdirSync(path.join(root, n), { recursive: true });
  assert.deepEqual(
    listCheckpointFolders(root),
    [3, 20, 100].map((step) => ({ step, dir: path.join(root, `checkpoint-${step}`) })),
  );
});

test("the disk estimate covers a written folder: 12 bytes a parameter (fp32 weights and two moments), 600 a tensor's headers, 256 KiB of documents (K2)", () => {
  const dir = checkpointDir(tmpDir("ckpt-estimate"), 1);
  writeCheckpointFolder(dir, cfg, filled(1), filled(2), filled(3), docsAt(1));
  const used = fs.readdirSync(dir).reduce((s, n) => s + fs.statSync(path.join(dir, n)).size, 0);
  const tensors = paramLayout(cfg).entries.length;
  assert.ok(
    estimateCheckpointBytes(P, tensors) >= used,
    `estimate ${estimateCheckpointBytes(P, tensors)} >= ${used} bytes written`,
  );
  assert.equal(estimateCheckpointBytes(0, 0), 256 * 1024, "the documents' allowance");
  assert.equal(
    estimateCheckpointBytes(P + 1, tensors) - estimateCheckpointBytes(P, tensors),
    12,
    "one more parameter: 3 fp32 values",
  );
  assert.equal(
    estimateCheckpointBytes(P, tensors + 1) - estimateCheckpointBytes(P, tensors),
    600,
    "one more tensor: its header in 3 files",
  );
  assert.equal(estimateCheckpointBytes(P), estimateCheckpointBytes(P, 64), "64 tensors unless told");
});

test("CheckpointWriteError says what failed in words a user can act on: a full disk, a used-up quota, else the code and the message (K2)", () => {
  const err = (code: string | undefined, message: string) => Object.assign(new Error(message), code ? { code } : {});
  const msg = (cause: unknown) => new CheckpointWriteError("/r/ckpt/checkpoint-3", cause).message;
  const wrap = (what: string) =>
    `writing checkpoint folder /r/ckpt/checkpoint-3 failed: ${what}; the partial folder was removed`;
  assert.equal(msg(err("ENOSPC", "no space left on device")), wrap("the disk is full (ENOSPC)"));
  assert.equal(msg(err("EDQUOT", "quota exceeded")), wrap("the disk quota is used up (EDQUOT)"));
  assert.equal(msg(err("EROFS", "read-only file system")), wrap("EROFS read-only file system"));
  assert.equal(msg(err(undefined, "boom")), wrap("boom"), "no code: the message alone, no leading space");
  assert.equal(msg("plain"), wrap("plain"), "a thrown string is said as it is");
  assert.equal(msg(null), wrap("null"), "even a thrown null gives a message");
  const e = new CheckpointWriteError("/r/x", err("ENOSPC", "x"));
  assert.equal(e.name, "CheckpointWriteError", "the session recognises a failed write by this name");
  assert.equal(e.code, "ENOSPC");
  assert.equal(new CheckpointWriteError("/r/x", err(undefined, "y")).code, null);
});

test("a checkpoint's JSON documents and manifest are written as indented JSON ending in a newline, the tensors with format pt metadata (K2, M7)", () => {
  const dir = checkpointDir(tmpDir("ckpt-bytes"), 5);
  const docs = docsAt(5);
  writeCheckpointFolder(dir, cfg, filled(1), filled(2), filled(3), docs);
  for (const [name, doc] of Object.entries(docs))
    assert.equal(fs.readFileSync(path.join(dir, name), "utf8"), `${JSON.stringify(doc, null, 1)}\n`, name);
  assert.match(
    fs.readFileSync(path.join(dir, "manifest.json"), "utf8"),
    /^\{\n "format": "tstrain-manifest\/1",[\s\S]*\}\n$/,
  );
  for (const name of ["model.safetensors", "optimizer.safetensors"]) {
    assert.deepEqual(
      decodeSafetensors(fs.readFileSync(path.join(dir, name))).metadata,
      { format: "pt" },
      `${name}: transformers loads only format pt`,
    );
  }
});

test("a leftover partial folder of an interrupted write by this process is cleared, and a write closes every file it opens (K2)", () => {
  const run = tmpDir("ckpt-leftover");
  const dir = checkpointDir(run, 7);
  const stale = partialDirOf(dir, process.pid);
  fs.mkdirSync(path.join(stale, "sub"), { recursive: true });
  fs.writeFileSync(path.join(stale, "sub", "model.safetensors"), "half");
  const fds = () => fs.readdirSync("/proc/self/fd").length;
  const before = fds();
  writeCheckpointFolder(dir, cfg, filled(1), filled(2), filled(3), docsAt(7));
  assert.equal(fds(), before, "no file or folder handle left open");
  assert.deepEqual(fs.readdirSync(checkpointRoot(run)), ["checkpoint-7"], "the leftover is gone");
  assert.deepEqual(fs.readdirSync(dir).sort(), [...CKPT_FILES, "manifest.json"].sort());
});

test("config.json is required and read as written; run_config.json is optional (null when absent) but refused when damaged (K2)", () => {
  const dir = checkpointDir(tmpDir("ckpt-configs"), 2);
  writeCheckpointFolder(dir, cfg, filled(1), filled(2), filled(3), docsAt(2, { root: "/data/mix", seed: 4 }));
  assert.deepEqual(readHfConfig(dir), hfConfigJson(cfg));
  assert.deepEqual(readRunConfigIfAny(dir), { root: "/data/mix", seed: 4 });
  fs.writeFileSync(path.join(dir, "run_config.json"), '{"root":');
  assert.throws(
    () => readRunConfigIfAny(dir),
    (e: Error) =>
      e.name === "UserError" && /^checkpoint run_config\.json at .* is not valid JSON .*\[K2\]$/.test(e.message),
  );
  fs.rmSync(path.join(dir, "run_config.json"));
  assert.equal(readRunConfigIfAny(dir), null, "a folder without run_config.json (e.g. final/) has none");
  fs.rmSync(path.join(dir, "config.json"));
  assert.throws(
    () => readHfConfig(dir),
    (e: Error) => e.name === "UserError" && /^checkpoint config\.json is missing: /.test(e.message),
  );
});
