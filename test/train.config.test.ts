// The validated run config: the seed's defaults (G10), refusals with reasons, the step plan (P5, P6, K1).
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseArgs, planSteps, usage } from "../src/config";

test("defaults are the frozen recipe's numbers and paths are relative to the working directory (G10)", () => {
  const c = parseArgs([]).config;
  assert.equal(c.seqLen, 1024);
  assert.equal(c.microBatch, 4);
  assert.equal(c.accum, 32);
  assert.equal(c.lr, 6e-4);
  assert.equal(c.tokens, 1_000_000_000);
  assert.equal(c.seed, 20260919);
  assert.equal(c.dataSeed, 20260919);
  assert.equal(c.valTokens, 2_000_000);
  assert.equal(c.gradCkpt, true);
  assert.equal(c.root, "./mix");
  assert.equal(c.out, "./run");
  assert.equal(c.hubRepoType, "dataset");
  assert.ok(Object.isFrozen(c));
});

test("the frozen plan at world 2 is 262,144 tokens per step and 10 checkpoints (P6, K1)", () => {
  const p = planSteps(parseArgs(["--world", "2"]).config);
  assert.equal(p.seqsPerStep, 256);
  assert.equal(p.tokensPerStep, 262_144);
  assert.equal(p.stepsPlanned, 3814);
  assert.equal(p.ckptEvery, 381);
  assert.equal(p.warmup, 100);
  assert.equal(p.decayStart, 3051);
});

test("unknown flags and malformed numbers are refused with the flag's name", () => {
  assert.throws(() => parseArgs(["--lr-max", "1"]), /unknown flag --lr-max/);
  assert.throws(() => parseArgs(["--accum", "two"]), /--accum "two" is not a number/);
  assert.throws(() => parseArgs(["--accum", "1.5"]), /--accum 1.5 must be a whole number/);
  assert.throws(() => parseArgs(["--world", "0"]), /--world: 0 must be a positive whole number/);
  assert.throws(() => parseArgs(["--hub-repo-type", "space"]), /not one of dataset, model/);
  assert.throws(() => parseArgs(["--vocab-size", "1"]), /--vocab-size: 1 must be 0 \(frozen 49,152\) or at least 2/);
  assert.equal(parseArgs(["--vocab-size", "4096"]).config.vocabSize, 4096);
});

test("seed flags with no meaning in this stack are refused with the reason, never ignored", () => {
  assert.throws(() => parseArgs(["--torch-compile"]), /torch.compile.*no meaning here/);
  assert.throws(() => parseArgs(["--gc-nonreentrant"]), /no meaning here/);
  assert.throws(() => parseArgs(["--attn", "sdpa"]), /--attn sdpa is a CUDA attention kernel/);
  assert.equal(parseArgs(["--attn", "eager"]).config.attn, "eager");
  assert.equal(parseArgs(["--optim", "adamw_torch_fused"]).config.optim, "adamw_torch_fused");
});

test("--no-grad-ckpt turns checkpointing off, --grad-ckpt=false too (M6)", () => {
  assert.equal(parseArgs(["--no-grad-ckpt"]).config.gradCkpt, false);
  assert.equal(parseArgs(["--grad-ckpt=false"]).config.gradCkpt, false);
});

test("--resume auto needs --hub-repo (R2)", () => {
  assert.throws(() => parseArgs(["--resume", "auto"]), /--resume auto .* needs --hub-repo/);
  assert.throws(() => parseArgs(["--hub-repo", "no-slash"]), /not of the form owner\/name/);
});

test("--demo sets a small world-2 run unless a flag says otherwise", () => {
  const d = parseArgs(["--demo"]).config;
  assert.equal(d.world, 2);
  assert.equal(d.demo, true);
  assert.equal(parseArgs(["--demo", "--world", "1"]).config.world, 1);
});

test("--help lists every flag with its default", () => {
  const u = usage();
  for (const f of [
    "--seq-len",
    "--micro-batch",
    "--accum",
    "--world",
    "--backend",
    "--demo",
    "--resume",
    "--stop-after-steps",
    "--prune",
  ])
    assert.ok(u.includes(f), f);
  assert.ok(parseArgs(["--help"]).help);
});
