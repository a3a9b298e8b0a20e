// The command line: --help, refusals without a stack (exit 2), --dry-run (G7), --benchmark (G8).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { writeSyntheticMix } from "./helpers/mix";
import { runTiny, tinyConfig } from "./helpers/run";
import { tmpDir } from "./helpers/tmp";

const MAIN = path.join(__dirname, "..", "main.js");
const mix = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 512 });

function cli(args: string[]) {
  return spawnSync(process.execPath, [MAIN, ...args], { encoding: "utf8", timeout: 120_000 });
}

test("--help prints the flags and exits 0", () => {
  const r = cli(["--help"]);
  assert.equal(r.status, 0);
  assert.match(r.stdout, /--stop-after-steps/);
});

test("a refusal prints one line naming the rule, no stack trace, and exits 2", () => {
  const r = cli(["--root", path.join(tmpDir("tstrain-nomix-"), "nothing")]);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /^refused: no manifest at .*build the mix first.*\[D1\]\n$/s);
  assert.ok(!/\n\s+at /.test(r.stderr), "no stack trace");
});

test("a plan that needs more windows than the mix holds is refused before step 1 (D6)", () => {
  const r = cli(["--root", mix.root, "--out", tmpDir("tstrain-wrap-"), "--seq-len", "16", "--dry-run"]);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /refused: .*(epoch never wraps|windows).*\[D6\]/s);
});

test("--dry-run builds everything, trains nothing and prints one JSON (G7)", { timeout: 60_000 }, async () => {
  const out = tmpDir("tstrain-dry-");
  const r = await runTiny(tinyConfig(mix.root, out, ["--dry-run"]));
  const j = r.runJson;
  assert.equal(j.dry_run, true);
  assert.equal(j.steps_planned, 8);
  assert.equal(j.ckpt_every, 4);
  assert.equal(j.train_samples, 2048);
  assert.equal(j.val_samples, 16);
  assert.equal((j.params as { sum_numel: number }).sum_numel > 0, true);
  assert.equal(typeof j.fingerprint, "string");
  assert.ok(r.rep.lines.some((l) => l.startsWith("{\"dry_run\":true")));
  assert.ok(!fs.existsSync(path.join(out, "ckpt")));
});

test("--benchmark N runs N timed steps without actors, prints BENCH_JSON and never writes a checkpoint (G8)", { timeout: 60_000 }, async () => {
  const out = tmpDir("tstrain-bench-");
  const r = await runTiny(tinyConfig(mix.root, out, ["--benchmark", "3"]));
  const j = r.runJson;
  assert.equal(j.case, "framework-free");
  assert.equal(j.benchmark_steps, 3);
  assert.ok((j.tok_per_s as number) > 0);
  assert.ok(r.rep.lines.some((l) => l.startsWith("BENCH_JSON ")));
  assert.ok(!fs.existsSync(path.join(out, "ckpt")));
});

test("an unknown backend name and a torch-only flag are refused (G10)", () => {
  assert.match(cli(["--backend", "webgpu"]).stderr, /--backend "webgpu" is not one of auto, native, tensorflow, wasm, cpu/);
  assert.match(cli(["--torch-compile"]).stderr, /no meaning here/);
});

test("--stop-after-steps must be a whole number of intervals, beyond the resume point and within the horizon (G1)", { timeout: 60_000 }, async () => {
  await assert.rejects(runTiny(tinyConfig(mix.root, tmpDir("g1-"), ["--stop-after-steps", "3", "--dry-run"])), /--stop-after-steps 3 is not a whole multiple of the checkpoint interval 4/);
  await assert.rejects(runTiny(tinyConfig(mix.root, tmpDir("g1-"), ["--stop-after-steps", "12", "--dry-run"])), /--stop-after-steps 12 exceeds the horizon 8/);
  const out = tmpDir("g1-");
  await runTiny(tinyConfig(mix.root, out, ["--stop-after-steps", "4"]));
  await assert.rejects(runTiny(tinyConfig(mix.root, out, ["--stop-after-steps", "4", "--resume", path.join(out, "ckpt", "checkpoint-4")])), /--stop-after-steps 4 is not beyond the resume point step 4/);
});

test("--resume on a path that does not exist says so (not 'no cursor.json'), and names the checkpoints --out holds (C3)", { timeout: 120_000 }, async () => {
  const out = tmpDir("tstrain-resume-missing-");
  const flags = ["--root", mix.root, "--out", out, "--seq-len", "16", "--layers", "2", "--hidden", "36", "--vocab-size", "64", "--micro-batch", "2",
    "--accum", "1", "--max-steps", "8", "--push-every-steps", "4", "--val-tokens", "256", "--backend", "wasm"];
  const gone = cli([...flags, "--resume", path.join(out, "ckpt", "checkpoint-4")]);
  assert.equal(gone.status, 2, gone.stderr);
  assert.match(gone.stderr, /^refused: resume refused: --resume \S+checkpoint-4 does not exist\. \S+\/ckpt holds no checkpoint; name a checkpoint folder .* or start fresh without --resume \[C3\]\n$/);
  assert.doesNotMatch(gone.stderr, /cursor\.json/);
  const ran = cli(flags);
  assert.equal(ran.status, 0, ran.stderr);
  const typo = cli([...flags, "--resume", path.join(out, "ckpt", "checkpoint-44")]);
  assert.equal(typo.status, 2, typo.stderr);
  assert.match(typo.stderr, /--resume \S+checkpoint-44 does not exist\. \S+\/ckpt holds checkpoint-4, checkpoint-8: resume the newest with --resume \S+\/ckpt\/checkpoint-8 \[C3\]/);
  fs.writeFileSync(path.join(out, "a-file"), "x");
  const file = cli([...flags, "--resume", path.join(out, "a-file")]);
  assert.equal(file.status, 2, file.stderr);
  assert.match(file.stderr, /--resume \S+a-file is a file, not a checkpoint folder\./);
});

test("output to a file or pipe gets progress lines with done/total, rate, elapsed and ETA every TSTRAIN_PROGRESS_SECONDS, and the log lines carry the ETA (B5, G9)", { timeout: 120_000 }, () => {
  const out = tmpDir("tstrain-progress-");
  const r = spawnSync(process.execPath, [MAIN, "--root", mix.root, "--out", out, "--seq-len", "16", "--layers", "2", "--hidden", "36", "--vocab-size", "64",
    "--micro-batch", "2", "--accum", "1", "--max-steps", "8", "--push-every-steps", "4", "--log-every", "4", "--val-tokens", "256", "--backend", "wasm"],
  { encoding: "utf8", timeout: 120_000, env: { ...process.env, TSTRAIN_PROGRESS_SECONDS: "0" } });
  assert.equal(r.status, 0, r.stderr);
  const progress = r.stdout.split("\n").filter((l) => l.startsWith("progress: "));
  assert.equal(progress.length, 8, r.stdout);
  progress.forEach((l, i) => assert.match(l, new RegExp(`^progress: step ${i + 1}/8 \\(${Math.floor((100 * (i + 1)) / 8)}% of this session\\) loss \\d+\\.\\d{4} lr \\S+ scale \\d+ \\| \\d+ tok/s \\| elapsed \\S+ \\| ETA (\\d+h)?(\\d+m)?\\d+s$`)));
  const logs = r.stdout.split("\n").filter((l) => /^step \d+\/8 loss=/.test(l));
  assert.equal(logs.length, 2);
  for (const l of logs) assert.match(l, / tok\/s=\d+ elapsed=\S+ eta=(\d+h)?(\d+m)?\d+s$/);
});

test("the phases before and after training say what they do: hashing a large mix shows its progress, validation says what it covers (B5, D3, G2)", { timeout: 120_000 }, () => {
  const big = writeSyntheticMix({ vocab: 64, trainTokens: 6 * 1024 * 1024, valTokens: 1024 });
  const r = spawnSync(process.execPath, [MAIN, "--root", big.root, "--out", tmpDir("tstrain-phases-"), "--seq-len", "16", "--layers", "2", "--hidden", "36", "--vocab-size", "64",
    "--micro-batch", "2", "--accum", "1", "--max-steps", "4", "--push-every-steps", "4", "--val-tokens", "256", "--backend", "wasm"],
  { encoding: "utf8", timeout: 120_000, env: { ...process.env, TSTRAIN_PROGRESS_SECONDS: "0" } });
  assert.equal(r.status, 0, r.stderr);
  const hashing = [...r.stdout.matchAll(/^data: verifying the mix: (\d+)\/(\d+) MB of shards hashed \((\d+)%\), \d+ MB\/s, ETA \d+s$/gm)];
  assert.ok(hashing.length >= 2, r.stdout.slice(0, 3000));
  assert.ok(hashing.every((m) => Number(m[2]) === 13 && Number(m[1]) <= 13), "12.6 MB of shards, rounded");
  assert.match(r.stdout, /^validation: 16 held-out windows of 16 tokens on 1 rank\(s\)$/m);
  assert.ok(r.stdout.indexOf("validation: 16 held-out") < r.stdout.indexOf("validation loss="), "said before the pass");
});
