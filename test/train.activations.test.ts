/**
 * M6 by measurement: the run picks the fastest recomputation policy whose activation arena fits
 * --activation-budget-gb (0 = half this machine's memory over the process's ranks), says which on its start line
 * and in --dry-run's JSON, and its ranks allocate exactly the bytes it announced; --no-grad-ckpt keeps everything
 * and says when that is over the budget; a bad budget is refused before any work (G10).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { activationBudget, parseArgs, validate } from "../src/config";
import { activationPlan, activationPlans } from "../src/model/llama";
import { buildConfig } from "../src/model/llama-config";
import { writeSyntheticMix } from "./helpers/mix";
import { runTiny, tinyConfig } from "./helpers/run";
import { tmpDir } from "./helpers/tmp";

const mix = writeSyntheticMix({ vocab: 64, trainTokens: 64 * 1024, valTokens: 1024 });
// tinyRun's shape (test/helpers/run.ts): seq 16, 2 layers, hidden 36, the runs below at micro-batch 2
const model = buildConfig({ seqLen: 16, layers: 2, hidden: 36, vocabSize: 64 });
const plan = (budget: number, gradCkpt = true) => activationPlan(model, 2, 16, gradCkpt, budget);
const [noneBytes, keptBytes] = activationPlans(model, 2, 16).map((p) => p.bytes);
const GB = 2 ** 30;

test("the budget is --activation-budget-gb, or half the machine's memory over the ranks on it (M6)", () => {
  assert.deepEqual(activationBudget({ activationBudgetGb: 0, world: 2 }, 24 * GB, {}), {
    bytes: 6 * GB,
    auto: true,
    totalBytes: 24 * GB,
    ranksHere: 2,
  });
  assert.equal(activationBudget({ activationBudgetGb: 0, world: 1 }, 24 * GB, {}).bytes, 12 * GB);
  // processes an MPI launcher put on this host share its memory too
  for (const env of [{ OMPI_COMM_WORLD_LOCAL_SIZE: "3" }, { MPI_LOCALNRANKS: "3" }, { SLURM_NTASKS_PER_NODE: "3" }])
    assert.equal(
      activationBudget({ activationBudgetGb: 0, world: 2 }, 24 * GB, env).bytes,
      2 * GB,
      JSON.stringify(env),
    );
  assert.deepEqual(
    activationBudget({ activationBudgetGb: 1.5, world: 2 }, 24 * GB, { OMPI_COMM_WORLD_LOCAL_SIZE: "3" }),
    {
      bytes: 1.5 * GB,
      auto: false,
      totalBytes: 24 * GB,
      ranksHere: 6,
    },
  );
  assert.equal(parseArgs([]).config.activationBudgetGb, 0);
});

test("a negative or non-numeric --activation-budget-gb is refused before any work (M6, G10)", () => {
  assert.throws(
    () => validate(parseArgs(["--activation-budget-gb", "-1"]).config),
    /--activation-budget-gb: -1 must be a number of GB >= 0/,
  );
  assert.throws(() => validate(parseArgs(["--activation-budget-gb", "lots"]).config), /activation-budget-gb/);
});

for (const [name, budgetOf, want, words] of [
  ["a budget that holds everything recomputes nothing", (b: number[]) => b[3], "none", /nothing recomputed/],
  ["one that holds the matmul outputs recomputes norms and SwiGLU", (b: number[]) => b[2], "kept", /norms and SwiGLU/],
  ["one below every policy recomputes whole blocks and says so", () => 1, "whole", /whole blocks recomputed, .*OVER/],
] as const) {
  test(`--dry-run: ${name} (M6)`, { timeout: 60_000 }, async () => {
    const budget = budgetOf([0, 0, keptBytes, noneBytes]);
    const r = await runTiny(
      tinyConfig(mix.root, tmpDir("tstrain-act-"), ["--dry-run", "--activation-budget-gb", String(budget / GB)]),
    );
    const p = plan(Math.floor((budget / GB) * GB));
    assert.equal(p.recompute, want);
    const a = r.runJson.activations as { recompute: string; bytes: number; budget_bytes: number; fits: boolean };
    assert.deepEqual(a, {
      recompute: p.recompute,
      attn_kept: p.attnKept,
      bytes: p.bytes,
      budget_bytes: Math.floor((budget / GB) * GB),
      fits: p.fits,
    });
    const line = r.rep.lines.find((l) => l.startsWith("activations: "));
    assert.ok(line, r.rep.lines.join("\n"));
    assert.match(line, words);
    assert.match(line, /at micro-batch 2 x seq 16; budget .* \(--activation-budget-gb\)/);
  });
}

test("--no-grad-ckpt keeps every activation and says when that is over the budget (M6)", {
  timeout: 60_000,
}, async () => {
  const r = await runTiny(
    tinyConfig(mix.root, tmpDir("tstrain-act-"), ["--dry-run", "--no-grad-ckpt", "--activation-budget-gb", "1e-9"]),
  );
  const line = r.rep.lines.find((l) => l.startsWith("activations: ")) ?? "";
  assert.match(
    line,
    /^activations: nothing recomputed \(every activation kept\) by --no-grad-ckpt, .*OVER the budget: drop --no-grad-ckpt/,
  );
  assert.equal((r.runJson.activations as { bytes: number }).bytes, plan(0, false).bytes);
});

test("the ranks allocate exactly the arena the start line announced, under each budget (M6)", {
  timeout: 180_000,
}, async () => {
  // the ranks also hold validation's forward-only arena (batch 1), the same under every budget: compare differences
  const held: Record<string, number[]> = {};
  for (const [budget, want] of [
    [noneBytes, "none"],
    [keptBytes, "kept"],
    [1, "whole"],
  ] as const) {
    const r = await runTiny(
      tinyConfig(mix.root, tmpDir("tstrain-act-run-"), [
        "--world",
        "2",
        "--max-steps",
        "1",
        "--activation-budget-gb",
        String(budget / GB),
      ]),
    );
    assert.equal(plan(Math.floor((budget / GB) * GB)).recompute, want);
    const mem = JSON.parse(r.rep.lines.find((l) => l.startsWith("memory: "))!.slice("memory: ".length)) as {
      per_rank: { arena_bytes: number }[];
    };
    held[want] = mem.per_rank.map((m) => m.arena_bytes);
  }
  const [none, kept, , whole] = activationPlans(model, 2, 16).map((p) => p.bytes);
  assert.deepEqual(
    [0, 1].map((r) => [held.none[r] - held.whole[r], held.kept[r] - held.whole[r]]),
    [0, 1].map(() => [none - whole, kept - whole]),
    "each rank's training arena is the announced policy's size",
  );
  assert.ok(held.whole.every((b) => b >= whole));
});
