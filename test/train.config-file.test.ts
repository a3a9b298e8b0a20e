// `--config FILE` (G12): a TOML file whose keys are the flags' names, overridden by the command line; a run's
// run_config.json read back as a config; the start line naming where each setting came from; the refusals.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { parse } from "smol-toml";
import { configLine, FLAGS, parseArgs, type RunConfig } from "../src/config";
import { writeSyntheticMix } from "./helpers/mix";
import { tinyRun, withFlags } from "./helpers/run";
import { tmpDir } from "./helpers/tmp";
import { advisedCommands, assertAdviceRuns, assertRefused } from "./helpers/cli";

const ROOT = path.join(__dirname, "..", "..");
const MAIN = path.join(__dirname, "..", "main.js");
const RECIPE = path.join(ROOT, "recipe.toml");
const mix = writeSyntheticMix({ vocab: 64, trainTokens: 192 * 1024, valTokens: 4096 });

function cli(args: string[]) {
  return spawnSync(process.execPath, [MAIN, ...args], { encoding: "utf8", timeout: 300_000 });
}

/** The dry run's plan: its one JSON line (G7). */
function plan(args: string[]): Record<string, unknown> {
  const r = cli([...args, "--dry-run"]);
  assert.equal(r.status, 0, `${args.join(" ")}: ${r.stderr}`);
  const line = r.stdout.split("\n").find((l) => l.startsWith('{"dry_run"'));
  assert.ok(line, r.stdout);
  return JSON.parse(line) as Record<string, unknown>;
}

/** The start line of a run's stdout: its first line. */
function startLine(args: string[]): string {
  const r = cli([...args, "--dry-run"]);
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.split("\n")[0];
}

/** flag/value pairs as TOML lines (`--seq-len 16` -> `seq-len = 16`; a bare switch -> `x = true`); the last of a flag wins. */
function toToml(args: string[]): string {
  const lines = new Map<string, string>();
  for (let i = 0; i < args.length; i++) {
    const name = args[i].slice(2);
    const spec = FLAGS.find((f) => f.flag === name)!;
    if (spec.kind === "bool") lines.set(name, "true");
    else lines.set(name, spec.kind === "string" ? JSON.stringify(args[++i]) : args[++i]);
  }
  return [...lines].map(([k, v]) => `${k} = ${v}\n`).join("");
}

/** A TOML file's settings as flags: the same run without the file. */
function asFlags(doc: Record<string, unknown>): string[] {
  const out: string[] = [];
  for (const [k, v] of Object.entries(doc)) {
    const spec = FLAGS.find((f) => f.flag === k)!;
    if (spec.kind !== "bool") out.push(`--${k}`, String(v));
    else if (v === true) out.push(`--${k}`);
    else if (spec.negatable) out.push(`--no-${k}`);
  }
  return out;
}

function writeFile(name: string, text: string): string {
  const f = path.join(tmpDir("tstrain-cfgfile-"), name);
  fs.writeFileSync(f, text);
  return f;
}

const userErr = (rule: string, re: RegExp) => (e: unknown) =>
  (e as Error).name === "UserError" && (e as Error).message.endsWith(`[${rule}]`) && re.test((e as Error).message);

const withoutFile = (c: RunConfig) => ({ ...c, configFile: "" });

test("recipe.toml is the frozen recipe: every flag of the table with its default, and nothing else (G12)", () => {
  const doc = parse(fs.readFileSync(RECIPE, "utf8")) as Record<string, unknown>;
  const rows = FLAGS.filter((f) => f.flag !== "config");
  assert.deepEqual(Object.keys(doc).sort(), rows.map((f) => f.flag).sort(), "one key per flag");
  for (const f of rows) assert.equal(doc[f.flag], f.def, `${f.flag} is its default`);
  const read = parseArgs(["--config", RECIPE]);
  assert.deepEqual(withoutFile(read.config), parseArgs([]).config, "the file's config is the defaults' config");
  assert.equal(read.config.configFile, RECIPE);
  assert.equal(read.origins.get("micro-batch"), RECIPE);
});

test("node dist/main.js --config FILE --dry-run prints the same plan as the same settings given as flags (G12)", {
  timeout: 600_000,
}, () => {
  // The recipe itself, on a small mix: only what the mix cannot hold is overridden on the command line.
  const over = ["--root", mix.root, "--out", tmpDir("tstrain-cfg-recipe-"), "--max-steps", "1", "--val-tokens", "2048"];
  const recipe = parse(fs.readFileSync(RECIPE, "utf8")) as Record<string, unknown>;
  const fromFile = plan(["--config", RECIPE, ...over]);
  assert.deepEqual(fromFile, plan(withFlags(asFlags(recipe), over)));
  assert.equal(fromFile.tokens_per_step, 4 * 32 * 1024, "the recipe's step: micro 4 x accum 32 x seq 1024");
  // A file that changes nearly every setting of the plan: the tiny run's flags, written as TOML.
  const tiny = tinyRun(mix.root, tmpDir("tstrain-cfg-tiny-"), ["--vocab-size", "64", "--world", "2"]);
  const file = writeFile("tiny.toml", toToml(tiny));
  const fromTiny = plan(["--config", file]);
  assert.deepEqual(fromTiny, plan(tiny));
  assert.deepEqual([fromTiny.steps_planned, fromTiny.seqs_per_step, fromTiny.world], [8, 4, 2]);
});

test("a flag on the command line overrides the file; the file overrides --demo's defaults (G12)", () => {
  const file = writeFile("o.toml", "micro-batch = 2\nseq-len = 16\nworld = 1\nlr = 0.002\n");
  const p = parseArgs(["--config", file, "--micro-batch", "3", "--demo"]);
  assert.equal(p.config.microBatch, 3, "the flag wins over the file");
  assert.equal(p.config.seqLen, 16, "the file wins over --demo's 64");
  assert.equal(p.config.world, 1, "the file wins over --demo's 2");
  assert.equal(p.config.layers, 4, "--demo's own where the file says nothing");
  assert.equal(p.config.lr, 0.002);
  assert.deepEqual(
    ["micro-batch", "seq-len", "layers", "demo"].map((f) => p.origins.get(f)),
    ["flag", file, "--demo", "flag"],
  );
  // and through the CLI: the plan follows the flag
  const out = tmpDir("tstrain-cfg-over-");
  const tiny = writeFile("t.toml", toToml(tinyRun(mix.root, out, ["--vocab-size", "64"])));
  const a = plan(["--config", tiny]);
  const b = plan(["--config", tiny, "--micro-batch", "3"]);
  assert.deepEqual([a.seqs_per_step, b.seqs_per_step], [2, 3]);
});

test("the start line names where each non-default setting came from: the file, --demo or a flag (G12)", () => {
  const file = writeFile("s.toml", 'seq-len = 32\nhub-repo = "me/x"\naccum = 32\n');
  const p = parseArgs(["--config", file, "--demo", "--lr", "0.001"]);
  const n = FLAGS.filter((f) => !["config", "gc-nonreentrant", "torch-compile"].includes(f.flag)).length;
  assert.equal(
    configLine(p.config, p.origins),
    `config: from ${file}: hub-repo="me/x", seq-len=32; ` +
      'from --demo: root="./.demo/data", out="./.demo/run", hub-url="embedded", layers=4, hidden=144, tokens=153600, max-steps=300, val-tokens=8192, log-every=25, world=2; ' +
      `from flags: lr=0.001, demo=true; ${n - 14} others at their defaults (node dist/main.js --help lists them)`,
  );
  const recipe = parseArgs(["--config", RECIPE, "--max-steps", "1"]);
  assert.equal(
    configLine(recipe.config, recipe.origins),
    `config: from ${RECIPE}: only defaults; from flags: max-steps=1; ${n - 1} others at their defaults (node dist/main.js --help lists them)`,
  );
  // accum = 32 in the file is the default again (over --demo's 1): not a change, so not listed
  assert.equal(p.config.accum, 32);
  // the run's first line, from the CLI
  const tiny = writeFile("t.toml", toToml(tinyRun(mix.root, tmpDir("tstrain-cfg-start-"), ["--vocab-size", "64"])));
  const line = startLine(["--config", tiny, "--world", "2"]);
  assert.match(line, new RegExp(`^config: from ${tiny.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}: root=".*", out=".*", `));
  assert.match(line, /seq-len=16, layers=2, hidden=36, vocab-size=64, micro-batch=2, accum=1, lr=0\.003, max-steps=8/);
  assert.match(line, /; from flags: dry-run=true, world=2; \d+ others at their defaults/);
});

test("an unknown key is refused, exit 2, naming the closest flag, before any work (G12)", () => {
  const out = path.join(tmpDir("tstrain-cfg-unknown-"), "run");
  for (const [key, near] of [
    ["micro_batch", "micro-batch"],
    ["mirco-batch", "micro-batch"],
    ["seqlen", "seq-len"],
    ["hub_repo", "hub-repo"],
    ["max_steps", "max-steps"],
  ]) {
    const file = writeFile("u.toml", `out = ${JSON.stringify(out)}\n${key} = 4\n`);
    const r = cli(["--config", file]);
    assert.equal(r.status, 2, r.stderr);
    assert.equal(
      r.stderr,
      `refused: --config ${file}: ${key} is not a flag (the keys are the flags' names as on the command line, without --; node dist/main.js --help lists them); the closest is ${near}: rename ${key} to ${near} [G12]\n`,
    );
  }
  assert.ok(!fs.existsSync(out), "nothing was written");
  const neg = writeFile("n.toml", "no-hub-private = true\n");
  assert.throws(
    () => parseArgs(["--config", neg]),
    userErr("G12", /^--config .*n\.toml: no-hub-private is not a flag's name: write hub-private = false instead/),
  );
  const table = writeFile("t.toml", '[hub]\nrepo = "me/x"\n');
  assert.throws(
    () => parseArgs(["--config", table]),
    userErr(
      "G12",
      /: \[hub\] is a table, but the file is flat: .*write hub-repo = "me\/x" at the top of the file and drop the \[hub\] line \[G12\]$/,
    ),
  );
  const nested = writeFile("c.toml", 'config = "other.toml"\n');
  assert.throws(() => parseArgs(["--config", nested]), userErr("G12", /a config file cannot name another one/));
  const json = writeFile("run_config.json", JSON.stringify({ microBatch: 2, micro_batch: 2 }));
  assert.throws(
    () => parseArgs(["--config", json]),
    userErr("G12", /"micro_batch" is not a setting .*; the closest is "microBatch" \(--micro-batch\): rename it/),
  );
});

test("a value of the wrong type, a bad choice, bad TOML or a missing file is refused naming the file, key, value and what it takes (G12)", () => {
  const refused = (text: string, re: RegExp, rule = "G12") => {
    const file = writeFile("v.toml", text);
    assert.throws(() => parseArgs(["--config", file]), userErr(rule, re), text);
    return file;
  };
  refused(
    'micro-batch = "4"\n',
    /^--config \S+v\.toml: micro-batch = "4" is a string, but micro-batch takes a whole number of at most 9007199254740991 \(write it without quotes: micro-batch = 4\): fix its value/,
  );
  refused("seq-len = 16.5\n", /: seq-len = 16\.5 is a number with a fraction, but seq-len takes a whole number/);
  refused('lr = "fast"\n', /: lr = "fast" is a string, but lr takes a number: fix its value/);
  refused("prune = 1\n", /: prune = 1 is a whole number, but prune takes true or false: fix its value/);
  refused('prune = "true"\n', /: prune = "true" is a string, but prune takes true or false \(write it without quotes/);
  refused("root = 3\n", /: root = 3 is a whole number, but root takes a string \(in quotes: root = "3"\)/);
  refused('backend = "gpu"\n', /: backend = "gpu" is not one of auto, native, tensorflow, wasm, cpu, webgpu: pick one/);
  refused("tokens = 100000000000000000000\n", /tokens = 100000000000000000000 is a whole number too large to hold/);
  refused(
    "resume = 2026-01-01\n",
    /: resume = 2026-01-01 is a date, but resume takes a string \(in quotes: resume = "2026-01-01"\)/,
  );
  refused("micro-batch = 4\nlr = \n", /^--config \S+v\.toml is not valid TOML: line 2, column 6: /);
  refused(
    "micro-batch = 0\n",
    /^--micro-batch: 0 \(set in --config \S+v\.toml\) must be a positive whole number; run node dist\/main\.js --config \S+v\.toml --micro-batch 1 \(the nearest allowed\)/,
    "G10",
  );
  refused("torch-compile = true\n", /^--torch-compile is torch\.compile/, "G10");
  const missing = path.join(tmpDir("tstrain-cfg-missing-"), "nope.toml");
  assert.throws(
    () => parseArgs(["--config", missing]),
    userErr(
      "G12",
      /^--config \S+nope\.toml: open \S+nope\.toml failed: no such file or folder \(ENOENT\): check the path/,
    ),
  );
  const bad = writeFile("b.json", '{"microBatch": 2,}');
  assert.throws(() => parseArgs(["--config", bad]), userErr("G12", /b\.json is not valid JSON: /));
  const r = cli(["--config", writeFile("x.toml", "seq-len = [16]\n")]);
  assert.equal(r.status, 2);
  assert.match(
    r.stderr,
    /^refused: --config \S+x\.toml: seq-len = \[16\] is an array, but seq-len takes a whole number/,
  );
});

test("a refusal of a value the --config file gives advises the command whose flags override it, also where the advice drops a flag the file sets; each runs as printed (G12, G10, B6, P8)", {
  timeout: 300_000,
}, () => {
  const dir = tmpDir("tstrain-cfg-advice-");
  const cases: Array<[text: string, refusal: RegExp, words: RegExp[]]> = [
    ["min-free-gb = -1\n", /^refused: --min-free-gb: -1 \(set in --config \S+\) .* \[G10\]$/m, [/ --min-free-gb 0$/]],
    [
      "torch-compile = true\n",
      /^refused: --torch-compile is torch\.compile; .* \(without it\) \[G10\]$/m,
      [/ --torch-compile=false$/],
    ],
    [
      'precision = "bf16"\nbackend = "wasm"\n',
      /^refused: --precision bf16 \(set in --config \S+run\.toml\) runs on the native engine's own GEMM, .* \[P8\]$/m,
      [/ --backend native$/, / --precision fp32$/],
    ],
    [
      `hub-dir = "${path.join(dir, "hub")}"\nhub-url = "https://huggingface.co"\n`,
      /^refused: --hub-dir "\S+hub" \(set in --config \S+run\.toml\) is the folder of the embedded local Hub, .* \[B6\]$/m,
      [/ --hub-url embedded$/, / --hub-dir ''$/],
    ],
  ];
  for (const [text, refusal, words] of cases) {
    const file = path.join(dir, "run.toml");
    fs.writeFileSync(file, text);
    const out = tmpDir("tstrain-cfg-advice-out-");
    const bad = cli(["--config", file, ...tinyRun(mix.root, out, ["--dry-run"])]);
    assertRefused(bad, refusal);
    const cmds = advisedCommands(bad.stderr);
    assert.equal(cmds.length, words.length, bad.stderr);
    for (const [i, c] of cmds.entries()) assert.match(c, words[i], "the flag that overrides the file's value");
    assertAdviceRuns(bad.stderr, { min: words.length });
  }
});

test("a run's run_config.json given back as --config gives the same config and the same plan (G12)", {
  timeout: 600_000,
}, () => {
  const out = tmpDir("tstrain-cfg-rt-");
  const args = tinyRun(mix.root, out, [
    "--vocab-size",
    "64",
    "--backend",
    "wasm",
    "--hub-repo",
    "local/cfg-round-trip",
    "--hub-url",
    "embedded",
    "--no-sample",
  ]);
  const run = cli(args);
  assert.equal(run.status, 0, run.stderr);
  const rc = path.join(out, "ckpt", "checkpoint-8", "run_config.json");
  const saved = JSON.parse(fs.readFileSync(rc, "utf8")) as Record<string, unknown>;
  assert.equal(saved.hubUrl, "embedded", "the record names the embedded Hub, not its address of that session");
  const back = parseArgs(["--config", rc]);
  assert.deepEqual(withoutFile(back.config), parseArgs(args).config, "every setting as the run had it");
  assert.equal(back.origins.get("lr"), rc);
  // the same plan, into a fresh run folder
  const fresh = ["--out", tmpDir("tstrain-cfg-rt2-")];
  assert.deepEqual(plan(["--config", rc, ...fresh]), plan(withFlags(args, fresh)));
});
