// The validated run config: the seed's defaults (G10), refusals with reasons, the step plan (P5, P6, K1).
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import {
  parseArgs,
  planSteps,
  usage,
  DEMO_DEFAULTS,
  FLAGS,
  checkFlagTable,
  validate,
  type RunConfig,
} from "../src/config";
import { isRepoId } from "../src/hub/address";
import { parseHubUrl } from "../src/data/hub-input";
import { createHubClient } from "../src/hub/client";
import { validRepoName } from "../src/hub/server/write";

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

test("the original script's flags with no meaning in this stack are refused with the reason, never ignored", () => {
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
  assert.throws(() => parseArgs(["--hub-repo", "no-slash"]), /is not a Hub repo id \(owner\/name/);
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

// The config's rules one by one (G10 and the rules each refusal names): every default, every range at its
// boundary, every parse refusal with the value it names, the --demo defaults, --help. Written to kill the mutants
// StrykerJS found surviving in src/config.ts (test/MUTATION.md).
const userErr = (rule: string, re: RegExp) => (e: unknown) =>
  (e as Error).name === "UserError" && (e as Error).message.endsWith(`[${rule}]`) && re.test((e as Error).message);
const base = (): RunConfig => ({ ...parseArgs([]).config });

test("every flag's default is the seed's (G10)", () => {
  assert.deepEqual(
    { ...parseArgs([]).config },
    {
      configFile: "",
      root: "./mix",
      out: "./run",
      hubRepo: "",
      hubRepoType: "dataset",
      hubUrl: "https://huggingface.co",
      hubDir: "",
      seqLen: 1024,
      attn: "eager",
      gradCkpt: true,
      layers: 0,
      hidden: 0,
      vocabSize: 0,
      microBatch: 4,
      accum: 32,
      activationBudgetGb: 0,
      lr: 6e-4,
      optim: "adamw_torch",
      tokens: 1_000_000_000,
      maxSteps: 0,
      warmupFrac: 0.02,
      decayFrac: 0.8,
      seed: 20260919,
      dataSeed: 20260919,
      resume: "",
      valTokens: 2_000_000,
      logEvery: 10,
      pushEverySteps: 0,
      stopAfterSteps: 0,
      prune: false,
      minFreeGb: 6,
      dryRun: false,
      benchmark: 0,
      world: 1,
      dist: "none",
      hosts: 1,
      backend: "auto",
      gpus: "",
      gemm: "builtin",
      isa: "auto",
      webgpuFold: "device",
      precision: "fp32",
      demo: false,
      sample: true,
      hubRetryMinutes: 30,
      hubTimeoutSeconds: 60,
      resumeIgnoreUnproven: false,
      resumeWithoutManifest: false,
      hubPrivate: true,
      allowConfigChange: false,
    },
  );
});

test("--demo sets its defaults, an explicit flag wins over them, and the explicit set names only what was given (B6)", () => {
  const d = parseArgs(["--demo"]);
  for (const [k, v] of Object.entries(DEMO_DEFAULTS))
    assert.equal((d.config as unknown as Record<string, unknown>)[k], v, k);
  assert.deepEqual(
    {
      world: d.config.world,
      seqLen: d.config.seqLen,
      maxSteps: d.config.maxSteps,
      tokens: d.config.tokens,
      hubUrl: d.config.hubUrl,
      demo: d.config.demo,
    },
    { world: 2, seqLen: 64, maxSteps: 300, tokens: 300 * 4 * 2 * 64, hubUrl: "embedded", demo: true },
  );
  // The folders and repo the README's demo section names (`./.demo/data`, `./.demo/run`, the embedded Hub's repo).
  assert.deepEqual(
    [d.config.root, d.config.out, d.config.hubRepo],
    ["./.demo/data", "./.demo/run", "local/tstrain-demo"],
  );
  const w = parseArgs(["--demo", "--world", "1", "--lr=0.001"]);
  assert.equal(w.config.world, 1);
  assert.equal(w.config.lr, 0.001);
  assert.deepEqual([...w.explicit].sort(), ["demo", "lr", "world"]);
  assert.equal(parseArgs([]).help, false);
  assert.equal(parseArgs(["-h"]).help, true);
  assert.equal(parseArgs(["--seq-len", "16", "--help"]).help, true);
});

test("the generate examples of the README and docs/ name a checkpoint the demo keeps on disk: one of the two newest (K1, G11)", () => {
  const root = path.join(__dirname, "..", "..");
  const pages = ["README.md", "docs/generation.md"].map((f) => fs.readFileSync(path.join(root, f), "utf8"));
  const named = pages.flatMap((p) =>
    [...p.matchAll(/--model \.demo\/run\/ckpt\/checkpoint-(\d+)/g)].map((m) => Number(m[1])),
  );
  assert.ok(named.length >= 2, "the README and docs/generation.md each have a checkpoint example");
  const plan = planSteps(parseArgs(["--demo"]).config);
  const all = Array.from(
    { length: Math.floor(plan.stepsPlanned / plan.ckptEvery) },
    (_, i) => (i + 1) * plan.ckptEvery,
  );
  const kept = all.slice(-2); // the uploader keeps the checkpoint it writes and one before it (train.run.test.ts checks the folders)
  for (const n of named)
    assert.ok(
      kept.includes(n),
      `a generate example names checkpoint-${n}, but the demo keeps only ${kept.map((k) => `checkpoint-${k}`).join(", ")}`,
    );
});

test("--help lists every flag with its values, an explanation and its default", () => {
  const u = usage();
  assert.ok(u.startsWith("usage: node dist/main.js [flags]\n\nData-parallel Llama training"), u.slice(0, 80));
  assert.ok(
    u.endsWith(
      "\n\nEnvironment: HF_TOKEN (Hub token; never printed or written); HF_ENDPOINT (the Hub's address when no --hub-url is given; --demo keeps its embedded Hub unless --hub-url is given).",
    ),
  );
  assert.ok(u.includes("Defaults are the frozen recipe.\n\n  --"), "a blank line before the flags");
  for (const f of FLAGS) {
    const line = u.split("\n").find((l) => l.startsWith(`  --${f.flag} `) || l.startsWith(`  --${f.flag}\t`));
    assert.ok(line, `--${f.flag} is listed`);
    const def = f.kind === "bool" ? (f.def ? "on" : "off") : JSON.stringify(f.def);
    assert.ok(line.endsWith(`(default ${def})`), `--${f.flag}: ${line}`);
    const text = line.slice(42, line.length - `(default ${def})`.length).trim();
    assert.ok(text.length >= 15, `--${f.flag} is explained: ${JSON.stringify(text)}`);
    if (f.choices) assert.ok(line.includes(f.choices.join("|")), `--${f.flag} lists its values`);
    else if (f.kind === "string") assert.ok(line.startsWith(`  --${f.flag} S `));
    else if (f.kind !== "bool") assert.ok(line.startsWith(`  --${f.flag} N `));
    if (f.negatable) assert.ok(line.startsWith(`  --${f.flag} / --no-${f.flag} `));
  }
  assert.equal(new Set(FLAGS.map((f) => f.flag)).size, FLAGS.length, "no flag twice");
});

test("the flags table (src/config-flags.json) is checked when it loads: a malformed row is refused by flag (G10)", () => {
  const ok = { flag: "lr", key: "lr", kind: "float", def: 6e-4, help: "peak learning rate" };
  assert.equal(checkFlagTable([ok]).length, 1);
  const bad: [unknown[], RegExp][] = [
    [[ok, ok], /flag "lr": not a new kebab-case flag name/],
    [[{ ...ok, flag: "Learning_rate" }], /flag "Learning_rate": not a new kebab-case/],
    [[{ ...ok, help: "" }], /flag "lr": needs a key and a help text/],
    [[{ ...ok, kind: "int", def: "6e-4" }], /flag "lr": kind int with default "6e-4"/],
    [[{ ...ok, kind: "decimal" }], /flag "lr": kind decimal/],
    [[{ ...ok, kind: "string", def: "a", choices: ["b", "c"] }], /flag "lr": its choices must include its default/],
    [[{ ...ok, negatable: true }], /flag "lr": only a bool flag is negatable/],
    [[null], /flag undefined: a row must be an object, got null/],
    [["lr"], /flag undefined: a row must be an object, got "lr"/],
    [[["lr"]], /flag undefined: a row must be an object, got \["lr"\]/],
    [[{ ...ok, flag: ["lr"] }], /flag \["lr"\]: not a new kebab-case/],
    [[{ ...ok, flag: "lr_peak" }], /flag "lr_peak": not a new kebab-case/],
    [[{ ...ok, key: undefined }], /flag "lr": needs a key and a help text/],
    [[{ ...ok, help: 5 }], /flag "lr": needs a key and a help text/],
    [
      [{ flag: "sample", key: "sample", kind: "bool", def: true, help: "write samples", negatable: false }],
      /flag "sample": only a bool flag is negatable/,
    ],
  ];
  for (const [rows, re] of bad) assert.throws(() => checkFlagTable(rows), re, JSON.stringify(rows));
  assert.throws(() => checkFlagTable({}), /not an array of flags/);
});

test("argument syntax: bare words, unknown flags, missing values, bool values and negation are refused by name (G10)", () => {
  assert.throws(
    () => parseArgs(["16"]),
    userErr("G10", /^unexpected argument "16": flags start with -- \(see --help\)/),
  );
  assert.throws(() => parseArgs(["--nope"]), userErr("G10", /^unknown flag --nope \(see --help/));
  assert.throws(() => parseArgs(["--no-prune"]), userErr("G10", /unknown flag --no-prune/), "--prune is not negatable");
  assert.throws(
    () => parseArgs(["--no-seq-len"]),
    userErr("G10", /unknown flag --no-seq-len/),
    "an int flag has no negation",
  );
  assert.throws(() => parseArgs(["--no-grad-ckpt=1"]), userErr("G10", /^--no-grad-ckpt takes no value/));
  assert.equal(parseArgs(["--no-grad-ckpt"]).config.gradCkpt, false);
  assert.equal(parseArgs(["--grad-ckpt=false"]).config.gradCkpt, false);
  assert.throws(
    () => parseArgs(["--no-grad-ckpt", "--grad-ckpt"]),
    userErr(
      "G10",
      /^--no-grad-ckpt and --grad-ckpt set the same flag: .*as in node dist\/main\.js --grad-ckpt \[G10\]$/,
    ),
    "a switch given both ways is one flag given twice",
  );
  assert.equal(parseArgs(["--prune"]).config.prune, true);
  assert.equal(parseArgs(["--prune=true"]).config.prune, true);
  assert.throws(
    () => parseArgs(["--prune=yes"]),
    userErr(
      "G10",
      /^--prune=yes: a switch is on or off: run node dist\/main\.js --prune \(on\), or node dist\/main\.js --prune=false \(off\) \[G10\]$/,
    ),
  );
  assert.throws(
    () => parseArgs(["--seq-len"]),
    userErr("G10", /^--seq-len needs a value: run node dist\/main\.js --seq-len 1024 \(its default\) \[G10\]$/),
  );
  assert.throws(
    () => parseArgs(["--hub-repo-type", "space"]),
    userErr("G10", /^--hub-repo-type "space" is not one of dataset, model/),
  );
  assert.equal(parseArgs(["--hub-repo-type", "model"]).config.hubRepoType, "model");
  assert.throws(() => parseArgs(["--no-such-flag"]), userErr("G10", /^unknown flag --no-such-flag \(see --help/));
  assert.throws(
    () => parseArgs(["--xyzgrad-ckpt"]),
    userErr("G10", /^unknown flag --xyzgrad-ckpt \(see --help/),
    "only 'no-' negates",
  );
  assert.throws(
    () => parseArgs(["--=5"]),
    userErr("G10", /^unknown flag -- \(see --help/),
    "'=' at once: an empty flag name",
  );
  // The refused torch-only flags, given as false, are accepted and set nothing.
  assert.deepEqual(parseArgs(["--gc-nonreentrant=false", "--torch-compile=false"]).config, parseArgs([]).config);
});

test("numbers: underscores and spaces allowed, anything else refused with the value; ints must be whole (G10)", () => {
  assert.equal(parseArgs(["--tokens", "1_000_000"]).config.tokens, 1_000_000);
  assert.equal(parseArgs(["--seq-len", " 32 "]).config.seqLen, 32);
  assert.equal(parseArgs(["--lr", "1e-3"]).config.lr, 1e-3);
  for (const raw of ["", " ", "abc", "Infinity", "1e400"])
    assert.throws(
      () => parseArgs(["--lr", raw]),
      userErr("G10", new RegExp(`^--lr ${JSON.stringify(raw)} is not a number`)),
      raw,
    );
  assert.throws(() => parseArgs(["--seq-len", "16.5"]), userErr("G10", /^--seq-len 16.5 must be a whole number/));
  assert.equal(parseArgs(["--min-free-gb", "0.5"]).config.minFreeGb, 0.5, "a float flag takes fractions");
});

test("torch-only switches and CUDA attention kernels are refused with the reason (G10)", () => {
  assert.throws(
    () => parseArgs(["--gc-nonreentrant"]),
    userErr(
      "G10",
      /^--gc-nonreentrant selects a torch autograd path; .*: run node dist\/main\.js \(without it\) \[G10\]$/,
    ),
  );
  assert.throws(
    () => parseArgs(["--torch-compile"]),
    userErr("G10", /^--torch-compile is torch\.compile; .*: run node dist\/main\.js \(without it\) \[G10\]$/),
  );
  for (const a of ["sdpa", "flash_attention_2"])
    assert.throws(
      () => parseArgs(["--attn", a]),
      userErr(
        "G10",
        new RegExp(
          `^--attn ${a} is a CUDA attention kernel of torch; .*: run node dist/main\\.js \\(eager, the one way\\) \\[G10\\]$`,
        ),
      ),
    );
  assert.equal(parseArgs(["--gc-nonreentrant=false", "--torch-compile=false", "--attn", "eager"]).config.attn, "eager");
  assert.ok(!("gc-nonreentrant" in parseArgs([]).config) && !("torchCompile" in parseArgs([]).config));
});

test("every range rule accepts its boundary and refuses one step past it, naming the flag and the value (G10)", () => {
  type Case = [keyof RunConfig, string, number, number | null, RegExp];
  const cases: Case[] = [
    ["seqLen", "seq-len", 2, 1, /1 must be a whole number >= 2 \(a window predicts seq_len-1 tokens\)/],
    ["microBatch", "micro-batch", 1, 0, /0 must be a positive whole number/],
    ["accum", "accum", 1, 0, /0 must be a positive whole number/],
    ["world", "world", 1, 0, /0 must be a positive whole number of ranks/],
    ["world", "world", 64, 65, /65 ranks is more than this trainer supports \(64\)/],
    ["layers", "layers", 0, -1, /-1 must be 0 \(frozen\) or a positive layer count/],
    ["hidden", "hidden", 0, -1, /-1 must be 0 \(frozen\) or a positive width/],
    ["vocabSize", "vocab-size", 0, -1, /-1 must be 0 \(frozen 49,152\) or at least 2/],
    ["vocabSize", "vocab-size", 2, 1, /1 must be 0 \(frozen 49,152\) or at least 2/],
    ["lr", "lr", 0.999, 1, /1 must be in \(0, 1\)/],
    ["lr", "lr", 1e-9, 0, /0 must be in \(0, 1\)/],
    ["tokens", "tokens", 1, 0, /0 must be a positive whole number/],
    ["maxSteps", "max-steps", 0, -1, /-1 must be >= 0/],
    ["warmupFrac", "warmup-frac", 0, -0.01, /-0.01 must be within \[0, 1\]/],
    ["warmupFrac", "warmup-frac", 1, 1.01, /1.01 must be within \[0, 1\]/],
    ["decayFrac", "decay-frac", 0, -0.01, /-0.01 must be within \[0, 1\]/],
    ["decayFrac", "decay-frac", 1, 1.01, /1.01 must be within \[0, 1\]/],
    ["seed", "seed", 0, -1, /-1 must be a whole number >= 0/],
    ["dataSeed", "data-seed", 0, -1, /-1 must be a whole number >= 0/],
    ["valTokens", "val-tokens", 1, 0, /0 must be a positive whole number/],
    ["logEvery", "log-every", 1, 0, /0 must be a positive whole number/],
    ["pushEverySteps", "push-every-steps", 0, -1, /-1 must be >= 0 \(0 = steps \/\/ 10\)/],
    ["stopAfterSteps", "stop-after-steps", 0, -1, /-1 must be >= 0 \(0 = run to the horizon\)/],
    ["minFreeGb", "min-free-gb", 0, -0.5, /-0.5 must be >= 0/],
    ["benchmark", "benchmark", 0, -1, /-1 must be >= 0/],
    ["hubTimeoutSeconds", "hub-timeout-seconds", 0.1, 0.09, /0.09 must be within \[0.1, 3600\]/],
    ["hubTimeoutSeconds", "hub-timeout-seconds", 3600, 3601, /3601 must be within \[0.1, 3600\]/],
    ["hubRetryMinutes", "hub-retry-minutes", 10080, 10081, /10081 must be > 0 and at most a week \(10080\)/],
    ["hubRetryMinutes", "hub-retry-minutes", 1e-3, 0, /0 must be > 0 and at most a week/],
  ];
  for (const [key, flag, ok, bad, re] of cases) {
    assert.equal(
      (validate({ ...base(), [key]: ok }) as unknown as Record<string, unknown>)[key],
      ok,
      `${flag}=${ok} accepted`,
    );
    if (bad !== null)
      assert.throws(
        () => validate({ ...base(), [key]: bad }),
        userErr("G10", new RegExp(`^--${flag}: ${re.source}`)),
        `${flag}=${bad}`,
      );
  }
  // whole-number rules refuse fractions too
  for (const [key, flag] of [
    ["seqLen", "seq-len"],
    ["microBatch", "micro-batch"],
    ["accum", "accum"],
    ["world", "world"],
    ["layers", "layers"],
    ["hidden", "hidden"],
    ["vocabSize", "vocab-size"],
    ["tokens", "tokens"],
    ["maxSteps", "max-steps"],
    ["seed", "seed"],
    ["dataSeed", "data-seed"],
    ["valTokens", "val-tokens"],
    ["logEvery", "log-every"],
    ["pushEverySteps", "push-every-steps"],
    ["stopAfterSteps", "stop-after-steps"],
    ["benchmark", "benchmark"],
  ] as const) {
    assert.throws(
      () => validate({ ...base(), [key]: 2.5 }),
      userErr("G10", new RegExp(`^--${flag}: 2.5 `)),
      `${flag}=2.5`,
    );
  }
  assert.ok(Object.isFrozen(validate(base())));
});

test("the cross-flag rules: --resume auto needs a Hub repo, the repo name's form, --hub-dir needs the embedded Hub, --dry-run excludes --benchmark", () => {
  assert.throws(
    () => validate({ ...base(), resume: "auto" }),
    userErr("R2", /^--resume auto asks the Hub where the run stopped, so it needs --hub-repo/),
  );
  assert.equal(validate({ ...base(), resume: "auto", hubRepo: "me/run" }).resume, "auto");
  assert.equal(validate({ ...base(), resume: "auto", demo: true }).resume, "auto", "--demo brings its own repo");
  assert.equal(validate({ ...base(), resume: "some/dir" }).resume, "some/dir", "a folder needs no Hub");
  for (const bad of ["run", "/run", "me/", "-me/run", "me/run/x", "me run/x", "me/run-", "me/a--b"])
    assert.throws(
      () => validate({ ...base(), hubRepo: bad }),
      userErr(
        "K5",
        new RegExp(
          `^--hub-repo ${JSON.stringify(bad).replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")} is not a Hub repo id \\(owner/name: .*\\); pass e\\.g\\. --hub-repo my-user/my-run-ckpts`,
        ),
      ),
      bad,
    );
  for (const ok of ["me/run", "Me-1/run.v2_x", "9a/b", "owner/_x"])
    assert.equal(validate({ ...base(), hubRepo: ok }).hubRepo, ok);
  assert.throws(
    () => validate({ ...base(), hubDir: "/tmp/h" }),
    userErr(
      "B6",
      /^--hub-dir "\/tmp\/h" is the folder of the embedded local Hub, but --hub-url is https:\/\/huggingface.co; run the same command with --hub-url embedded \(the embedded Hub, in --hub-dir\), or the same command without --hub-dir \(the Hub at https:\/\/huggingface\.co\) \[B6\]$/,
    ),
  );
  assert.equal(validate({ ...base(), hubDir: "/tmp/h", hubUrl: "embedded" }).hubDir, "/tmp/h");
  assert.throws(
    () => validate({ ...base(), dryRun: true, benchmark: 3 }),
    userErr("G7", /^--dry-run and --benchmark exclude each other: pick one/),
  );
  assert.equal(validate({ ...base(), dryRun: true }).dryRun, true);
  assert.equal(
    validate({ ...base(), hubUrl: "http://127.0.0.1:9/" }).hubUrl,
    "http://127.0.0.1:9",
    "trailing slashes dropped",
  );
  assert.equal(validate({ ...base(), hubUrl: "http://h//" }).hubUrl, "http://h");
});

test("the step plan: tokens per step, horizon from --tokens or --max-steps, checkpoint interval, warmup floor, decay start (P5, P6, K1)", () => {
  const c = (argv: string[]) =>
    planSteps(parseArgs(["--seq-len", "16", "--micro-batch", "2", "--accum", "3", "--world", "2", ...argv]).config);
  assert.deepEqual(c(["--tokens", "1920"]), {
    seqsPerStep: 12,
    tokensPerStep: 192,
    stepsPlanned: 10,
    ckptEvery: 1,
    warmup: 100,
    decayStart: 8,
  });
  assert.throws(
    () => c(["--tokens", "191"]),
    userErr(
      "P5",
      /^--tokens 191 is less than one step of 192 tokens \(micro 2 x world 2 x accum 3 x seq 16\): run the same command with --tokens 192 \(one step; more works too\) \[P5\]$/,
    ),
  );
  assert.deepEqual(c(["--tokens", "191", "--max-steps", "7"]).stepsPlanned, 7, "--max-steps wins");
  assert.equal(c(["--tokens", "192"]).stepsPlanned, 1, "exactly one step's tokens plan one step");
  const big = c(["--max-steps", "20000", "--warmup-frac", "0.01", "--decay-frac", "0.5", "--push-every-steps", "7"]);
  assert.deepEqual([big.warmup, big.decayStart, big.ckptEvery], [200, 10000, 7]);
  assert.equal(c(["--max-steps", "25"]).ckptEvery, 2, "steps // 10");
  assert.equal(c(["--max-steps", "9"]).ckptEvery, 1, "at least 1");
});

test("every documented flag parses under its own name into its own setting, with its kind (G10)", () => {
  const cases: Array<[string, string | null, keyof RunConfig, unknown]> = [
    ["root", "r", "root", "r"],
    ["out", "o", "out", "o"],
    ["hub-repo", "me/x", "hubRepo", "me/x"],
    ["hub-repo-type", "model", "hubRepoType", "model"],
    ["hub-url", "http://h", "hubUrl", "http://h"],
    ["seq-len", "32", "seqLen", 32],
    ["attn", "eager", "attn", "eager"],
    ["layers", "3", "layers", 3],
    ["hidden", "72", "hidden", 72],
    ["vocab-size", "300", "vocabSize", 300],
    ["micro-batch", "3", "microBatch", 3],
    ["accum", "5", "accum", 5],
    ["lr", "0.002", "lr", 0.002],
    ["optim", "adamw_torch_fused", "optim", "adamw_torch_fused"],
    ["tokens", "12345", "tokens", 12345],
    ["max-steps", "7", "maxSteps", 7],
    ["warmup-frac", "0.5", "warmupFrac", 0.5],
    ["decay-frac", "0.25", "decayFrac", 0.25],
    ["seed", "9", "seed", 9],
    ["data-seed", "8", "dataSeed", 8],
    ["resume", "ck/x", "resume", "ck/x"],
    ["val-tokens", "99", "valTokens", 99],
    ["log-every", "4", "logEvery", 4],
    ["push-every-steps", "6", "pushEverySteps", 6],
    ["stop-after-steps", "2", "stopAfterSteps", 2],
    ["prune", null, "prune", true],
    ["min-free-gb", "1.5", "minFreeGb", 1.5],
    ["dry-run", null, "dryRun", true],
    ["benchmark", "3", "benchmark", 3],
    ["world", "2", "world", 2],
    ["backend", "wasm", "backend", "wasm"],
    ["demo", null, "demo", true],
    ["grad-ckpt", null, "gradCkpt", true],
    ["hub-timeout-seconds", "5", "hubTimeoutSeconds", 5],
    ["hub-retry-minutes", "2", "hubRetryMinutes", 2],
    ["resume-ignore-unproven", null, "resumeIgnoreUnproven", true],
    ["resume-without-manifest", null, "resumeWithoutManifest", true],
    ["no-hub-private", null, "hubPrivate", false],
    ["allow-config-change", null, "allowConfigChange", true],
  ];
  for (const [flag, value, key, want] of cases) {
    const argv = value === null ? [`--${flag}`] : [`--${flag}`, value];
    assert.equal((parseArgs(argv).config as unknown as Record<string, unknown>)[key], want, `--${flag} ${value ?? ""}`);
  }
  for (const v of ["auto", "native", "tensorflow", "wasm", "cpu"])
    assert.equal(parseArgs(["--backend", v]).config.backend, v);
  for (const v of ["adamw_torch", "adamw_torch_fused", "adamw_apex_fused"])
    assert.equal(parseArgs(["--optim", v]).config.optim, v);
  assert.throws(
    () => parseArgs(["--backend", "gpu"]),
    /--backend "gpu" is not one of auto, native, tensorflow, wasm, cpu/,
  );
  assert.throws(
    () => parseArgs(["--optim", "sgd"]),
    /--optim "sgd" is not one of adamw_torch, adamw_torch_fused, adamw_apex_fused/,
  );
});

test("one Hub repo id rule, the Hub's: --hub-repo, an hf:// input, the Hub client and the local Hub agree on each id (K5)", () => {
  const cases: Array<[string, boolean]> = [
    ["me/run", true],
    ["owner/_x", true],
    ["_o/x_", true],
    ["Me-1/run.v2_x", true],
    [`me/${"a".repeat(96)}`, true],
    [`me/${"a".repeat(97)}`, false],
    ["owner/-x", false],
    ["owner/x.", false],
    [".o/x", false],
    ["me/a--b", false],
    ["me/a..b", false],
    ["me/run.git", false],
    ["me/ru n", false],
    ["me/run/x", false],
    ["run", false],
  ];
  for (const [id, ok] of cases) {
    assert.equal(isRepoId(id), ok, id);
    const flag = () => validate({ ...base(), hubRepo: id });
    if (ok) assert.equal(flag().hubRepo, id);
    else assert.throws(flag, userErr("K5", /is not a Hub repo id/), id);
    if (id.split("/").length === 2) {
      const input = () => parseHubUrl(`hf://datasets/${id}/x.jsonl`, "--input");
      if (ok) assert.equal(input().repo, id);
      else assert.throws(input, userErr("D2", /is not a Hub repo id/), id);
      const [owner, name] = id.split("/");
      assert.equal(validRepoName({ owner, name, type: "model" }), ok, `the local Hub: ${id}`);
    }
    const client = () => createHubClient({ hubUrl: "http://127.0.0.1:9", repo: id, repoType: "model", token: "" });
    if (ok) client();
    else assert.throws(client, TypeError, id);
  }
});
