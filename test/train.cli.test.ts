// The command line: --help, refusals without a stack (exit 2), --dry-run (G7), --benchmark (G8).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { writeSyntheticMix } from "./helpers/mix";
import { runTiny, tinyConfig, tinyRun } from "./helpers/run";
import { tmpDir } from "./helpers/tmp";
import { advisedCommands, assertAdviceRuns, assertRefused, runAdvised } from "./helpers/cli";
import { adviceAfter } from "./helpers/survive";
import { buildConfig, countParams } from "../src/model/llama-config";
import { cpuWarning } from "../src/run";
import { readManifest } from "../src/data/manifest";
import { mixTokenWarning } from "../src/data/budget";

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
  const cfg = tinyConfig(mix.root, out, ["--dry-run"]);
  const r = await runTiny(cfg);
  const j = r.runJson;
  const total = readManifest(mix.root).total_tokens;
  assert.ok(total < cfg.tokens, "the tiny mix is smaller than --tokens");
  assert.deepEqual(
    r.rep.lines.filter((l) => l.startsWith("WARNING mix has")),
    [mixTokenWarning(total, cfg.tokens)],
    "the start-up warns of the small mix in data/budget.ts's words (D1)",
  );
  assert.equal(j.dry_run, true);
  assert.equal(j.steps_planned, 8);
  assert.equal(j.ckpt_every, 4);
  assert.equal(j.train_samples, 2048);
  assert.equal(j.val_samples, 16);
  assert.equal((j.params as { sum_numel: number }).sum_numel > 0, true);
  assert.equal(typeof j.fingerprint, "string");
  assert.ok(r.rep.lines.some((l) => l.startsWith('{"dry_run":true')));
  assert.ok(!fs.existsSync(path.join(out, "ckpt")));
});

test("rank threads beyond the CPUs the process may run on are warned of, with the fix for its launcher (A1, A9)", {
  timeout: 120_000,
}, () => {
  assert.equal(cpuWarning(2, 2, {}), null, "as many CPUs as rank threads");
  assert.equal(cpuWarning(1, 1, { OMPI_COMM_WORLD_SIZE: "2" }), null);
  assert.match(
    cpuWarning(2, 1, {}) ?? "",
    /^WARNING --world 2 starts 2 rank threads, but this process may run on 1 CPU \(its CPU affinity\): they share it, each step about 2\.0x as long: give the process 2 CPUs \(taskset -c, .*\), or run --world 1 \(A1, A9\)$/,
  );
  assert.match(cpuWarning(2, 1, { OMPI_COMM_WORLD_SIZE: "2" }) ?? "", /: launch with mpirun --bind-to none \.\.\. /);
  assert.match(
    cpuWarning(4, 2, { SLURM_STEP_ID: "0", SLURM_JOB_ID: "7" }) ?? "",
    /2 CPUs .*: launch with srun --cpus-per-task 4 \.\.\./,
  );
  // mpirun inside a Slurm allocation is still mpirun (its processes carry the allocation's variables)
  assert.match(
    cpuWarning(2, 1, { SLURM_STEP_ID: "0", OMPI_MCA_orte_hnp_uri: "x", OMPI_COMM_WORLD_SIZE: "2" }) ?? "",
    /mpirun --bind-to none/,
  );
  // the real CLI, pinned to one CPU by taskset (util-linux): warned at --world 2, not at --world 1
  const pinned = (world: string) =>
    spawnSync(
      "taskset",
      [
        "-c",
        "0",
        process.execPath,
        MAIN,
        ...tinyArgs(mix.root, tmpDir("tstrain-cpus-"), ["--world", world, "--dry-run"]),
      ],
      {
        encoding: "utf8",
        timeout: 60_000,
      },
    );
  const two = pinned("2");
  assert.equal(two.status, 0, `${two.error?.message ?? ""}${two.stderr}`);
  assert.match(
    two.stdout,
    /^WARNING --world 2 starts 2 rank threads, but this process may run on 1 CPU .*or run --world 1 \(A1, A9\)$/m,
  );
  const one = pinned("1");
  assert.equal(one.status, 0, one.stderr);
  assert.doesNotMatch(one.stdout, /rank threads/);
});

test("--benchmark N runs N timed steps without actors, prints BENCH_JSON and never writes a checkpoint (G8)", {
  timeout: 60_000,
}, async () => {
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
  assert.match(
    cli(["--backend", "metal"]).stderr,
    /--backend "metal" is not one of auto, native, tensorflow, wasm, cpu, webgpu/,
  );
  assert.match(cli(["--torch-compile"]).stderr, /no meaning here/);
});

test("--stop-after-steps must be a whole number of intervals, beyond the resume point and within the horizon, and the commands it advises run (G1)", {
  timeout: 300_000,
}, async () => {
  /** The refusal matching `re`, then each command it advises run as printed, a dry run: the values `advised` ("": none). */
  const refusedThenAdvised = (out: string, extra: string[], re: RegExp, advised: string[]) => {
    const bad = cli(tinyRun(mix.root, out, [...extra, "--dry-run"]));
    assertRefused(bad, re);
    const cmds = advisedCommands(bad.stderr);
    assert.deepEqual(
      cmds.map((c) => /--stop-after-steps (\d+)$/.exec(c)?.[1] ?? ""),
      advised,
      "each value, as the command that gives it; the horizon, as the command without the flag",
    );
    for (const c of cmds.filter((c) => !c.includes("--stop-after-steps")))
      assert.ok(!c.includes("--stop-after-steps"), c);
    assertAdviceRuns(bad.stderr, { min: advised.length });
  };
  refusedThenAdvised(
    tmpDir("g1-"),
    ["--stop-after-steps", "3"],
    /--stop-after-steps 3 is not a whole multiple of the checkpoint interval 4: .*; run node dist\/main\.js .* --stop-after-steps 4, or node dist\/main\.js .* \(run to the horizon\) \[G1\]$/m,
    ["4", ""],
  );
  refusedThenAdvised(
    tmpDir("g1-"),
    ["--stop-after-steps", "12"],
    /--stop-after-steps 12 exceeds the horizon 8; run node dist\/main\.js .* --stop-after-steps 4, or .* \(run to the horizon\) \[G1\]$/m,
    ["4", ""],
  );
  const out = tmpDir("g1-");
  await runTiny(tinyConfig(mix.root, out, ["--stop-after-steps", "4"]));
  refusedThenAdvised(
    out,
    ["--stop-after-steps", "4", "--resume", path.join(out, "ckpt", "checkpoint-4")],
    /--stop-after-steps 4 is not beyond the resume point step 4: .*; run node dist\/main\.js .* --stop-after-steps 8, or .* \(run to the horizon\) \[G1\]$/m,
    ["8", ""],
  );
});

/** The tiny run of helpers/run.ts, on wasm, without samples, as flags for dist/main.js. */
function tinyArgs(root: string, out: string, extra: string[] = []): string[] {
  return tinyRun(root, out, ["--vocab-size", "64", "--backend", "wasm", "--no-sample", ...extra]);
}

test("--resume DIR checks every file against the checkpoint's manifest.json and refuses a changed byte or a missing manifest (K7)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-k7-");
  const first = cli(tinyArgs(mix.root, out, ["--stop-after-steps", "4"]));
  assert.equal(first.status, 0, first.stderr);
  const ck = path.join(out, "ckpt", "checkpoint-4");
  const weights = path.join(ck, "model.safetensors");
  const good = fs.readFileSync(weights);
  const bad = Buffer.from(good);
  bad[bad.length - 3] ^= 0x01; // one flipped bit inside the last tensor's data: the file still parses
  fs.writeFileSync(weights, bad);
  const flipped = cli(tinyArgs(mix.root, out, ["--resume", ck]));
  assert.equal(flipped.status, 2, flipped.stdout + flipped.stderr);
  assert.match(
    flipped.stderr,
    /^refused: --resume .*checkpoint-4: model\.safetensors has sha256 [0-9a-f]{12}…, manifest\.json says [0-9a-f]{12}….*\[K7\]\n$/s,
  );
  assert.ok(!fs.existsSync(path.join(out, "ckpt", "checkpoint-8")), "nothing was trained");
  fs.writeFileSync(weights, good);

  const manifest = path.join(ck, "manifest.json");
  const saved = fs.readFileSync(manifest);
  fs.rmSync(manifest);
  const none = cli(tinyArgs(mix.root, out, ["--resume", ck]));
  assert.equal(none.status, 2, none.stdout + none.stderr);
  assert.match(
    none.stderr,
    /has no manifest\.json, so its files cannot be checked .*: run node dist\/main\.js .* --resume-without-manifest \(if a tstrain from before manifests existed wrote it\); otherwise resume from another checkpoint folder, or start fresh with another --out \[K7\]\n$/,
  );
  // the advice, as printed: it resumes the folder unchecked
  const [old] = assertAdviceRuns(none.stderr);
  assert.match(old.stdout, /has no manifest\.json; reading it unchecked as --resume-without-manifest asks \(K7\)/);
  fs.writeFileSync(manifest, saved);

  const ok = cli(tinyArgs(mix.root, out, ["--resume", ck]));
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /checkpoint-4 matches its manifest\.json \(size and sha256 of every file, K7\)/);
  assert.ok(fs.existsSync(path.join(out, "ckpt", "checkpoint-8")));
});

function tfjsNodeInstalled(): boolean {
  for (const pkg of ["@tensorflow/tfjs-node-gpu", "@tensorflow/tfjs-node"]) {
    try {
      require.resolve(pkg);
      return true;
    } catch {
      /* not installed */
    }
  }
  return false;
}

test("--backend tensorflow without tfjs-node is refused before any work, exit 2 with its own message (P1, A1)", {
  timeout: 120_000,
}, () => {
  const out = path.join(tmpDir("tstrain-tf-"), "run");
  const r = cli(tinyArgs(mix.root, out, ["--backend", "tensorflow"]));
  if (tfjsNodeInstalled()) {
    // On a machine with tfjs-node the request is valid: the run trains (what this test guards is the refusal's path).
    assert.equal(r.status, 0, r.stderr);
    return;
  }
  assert.equal(r.status, 2, r.stdout + r.stderr);
  assert.match(
    r.stderr,
    /^refused: --backend tensorflow is not available \(@tensorflow\/tfjs-node-gpu: not installed; @tensorflow\/tfjs-node: not installed\); install .*, or run node dist\/main\.js .* --backend wasm \(tfjs-wasm\) \[P1\]\n$/s,
  );
  assert.doesNotMatch(r.stderr, /RankFailure/);
  assert.equal(r.stdout, "", "refused before the plan is printed");
  assert.ok(!fs.existsSync(out), "nothing was written");
  // the advice, as printed, trains
  assertAdviceRuns(r.stderr);
});

test("a shard holding a token id outside the vocabulary is refused before the ranks start, naming the shard and the id (D1)", {
  timeout: 120_000,
}, () => {
  const root = tmpDir("tstrain-bigid-");
  for (const f of fs.readdirSync(mix.root)) fs.copyFileSync(path.join(mix.root, f), path.join(root, f));
  const manifest = JSON.parse(fs.readFileSync(path.join(root, "manifest.json"), "utf8")) as {
    shards: { file: string; sha256: string }[];
  };
  const shard = manifest.shards[1];
  const bytes = fs.readFileSync(path.join(root, shard.file));
  bytes.writeUInt16LE(65535, 2 * 1000); // one token id 65535 in a mix whose manifest says 64 ids
  fs.writeFileSync(path.join(root, shard.file), bytes);
  shard.sha256 = createHash("sha256").update(bytes).digest("hex"); // the bytes are what prepare wrote, as far as D3 can tell
  fs.writeFileSync(path.join(root, "manifest.json"), JSON.stringify(manifest));
  const r = cli(tinyArgs(root, tmpDir("tstrain-bigid-out-")));
  assert.equal(r.status, 2, r.stdout + r.stderr);
  assert.match(
    r.stderr,
    new RegExp(
      `^refused: shard ${path.join(root, shard.file).replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} holds token id 65535, outside the model's vocabulary \\[0, 64\\).*--vocab-size 65536.*\\[D1\\]\\n$`,
      "s",
    ),
  );
  assert.doesNotMatch(r.stdout, /^precision:|^backend:/m, "no rank was started");
});

test("a refusal raised inside a rank exits 2 with its own message, not as the rank's failure (A1)", {
  timeout: 120_000,
}, () => {
  const out = tmpDir("tstrain-rankrefuse-");
  const r = spawnSync(process.execPath, [MAIN, ...tinyArgs(mix.root, out, ["--world", "2"])], {
    encoding: "utf8",
    timeout: 120_000,
    env: { ...process.env, TSTRAIN_FAULT: "1:5:refuse" },
  });
  assert.equal(r.status, 2, r.stdout + r.stderr);
  assert.match(r.stderr, /^refused: injected refusal: rank 1 refuses at step 5 \(TSTRAIN_FAULT\) \[A1\]\n$/);
  assert.doesNotMatch(r.stderr, /RankFailure|error:/);
  assert.ok(fs.existsSync(path.join(out, "ckpt", "checkpoint-4")), "the checkpoint saved before the refusal is kept");
});

test("a file-system error the user causes (--hub-dir under a file, a folder at <out>/sessions.jsonl) is a refusal naming the path, exit 2, not a bug (O1, O6)", {
  timeout: 120_000,
}, () => {
  const parent = tmpDir("tstrain-o6-");
  const file = path.join(parent, "a-file");
  fs.writeFileSync(file, "x");
  const r = cli(
    tinyArgs(mix.root, path.join(parent, "run"), [
      "--hub-url",
      "embedded",
      "--hub-repo",
      "me/o6",
      "--hub-dir",
      path.join(file, "hub"),
    ]),
  );
  // --hub-dir is checked before the Hub starts (O1), so this one is named before any work
  assert.equal(r.status, 2, r.stdout + r.stderr);
  assert.match(
    r.stderr,
    /^refused: --hub-dir \S+a-file\/hub cannot be created: \S+a-file is a file, not a folder \(ENOTDIR\); .* \[O1\]\n$/,
  );
  // one no check foresees: a folder where the run appends its session record
  const out = path.join(parent, "run2");
  fs.mkdirSync(path.join(out, "sessions.jsonl"), { recursive: true });
  const d = cli(tinyArgs(mix.root, out));
  assert.equal(d.status, 2, d.stdout + d.stderr);
  assert.match(
    d.stderr,
    /^refused: open \S+run2\/sessions\.jsonl failed: it is a folder where a file was expected \(EISDIR\): name the file \[O6\]\n$/,
  );
});

test("the vocabulary trap: the frozen shape over a small tokenizer warns with what --vocab-size gives; --layers/--hidden default to the mix's padded vocabulary (M2)", {
  timeout: 300_000,
}, () => {
  const mix100 = writeSyntheticMix({ vocab: 100, trainTokens: 32 * 1024, valTokens: 512 });
  const small = [
    "--root",
    mix100.root,
    "--seq-len",
    "16",
    "--micro-batch",
    "1",
    "--accum",
    "1",
    "--max-steps",
    "8",
    "--push-every-steps",
    "4",
    "--val-tokens",
    "256",
    "--backend",
    "wasm",
    "--no-sample",
  ];
  const paramsOf = (stdout: string) =>
    (JSON.parse(stdout.split("\n").find((l) => l.startsWith('{"dry_run"'))!) as { params: { sum_numel: number } })
      .params.sum_numel;
  const frozen = cli([...small, "--out", tmpDir("tstrain-vocab-frozen-"), "--dry-run"]);
  assert.equal(frozen.status, 0, frozen.stderr);
  const padded = countParams(buildConfig({ seqLen: 16, vocabSize: 128 })).sum_numel.toLocaleString("en-US");
  const warn = frozen.stdout.split("\n").filter((l) => /vocabulary/.test(l));
  assert.equal(warn.length, 1, frozen.stdout);
  assert.match(
    warn[0],
    new RegExp(
      `^WARNING the mix's tokenizer has 100 ids but the model's vocabulary is 49,152 \\(the frozen default\\): 49,052 embedding rows never see a token, the loss starts near ln\\(49,152\\) = 10\\.80 instead of ln\\(100\\) = 4\\.61, .* --vocab-size 128 trains a ${padded}-parameter model on the same mix \\(M2\\)$`,
    ),
  );
  assert.equal(paramsOf(frozen.stdout), 106_194_240, "the frozen shape itself is unchanged (M1)");

  const variant = cli([
    ...small,
    "--out",
    tmpDir("tstrain-vocab-var-"),
    "--layers",
    "2",
    "--hidden",
    "36",
    "--dry-run",
  ]);
  assert.equal(variant.status, 0, variant.stderr);
  assert.equal(
    paramsOf(variant.stdout),
    countParams(buildConfig({ seqLen: 16, layers: 2, hidden: 36, vocabSize: 128 })).sum_numel,
    "100 ids padded to 128",
  );
  assert.doesNotMatch(variant.stdout, /WARNING.*vocabulary/);
  const given = cli([
    ...small,
    "--out",
    tmpDir("tstrain-vocab-given-"),
    "--layers",
    "2",
    "--hidden",
    "36",
    "--vocab-size",
    "49152",
    "--dry-run",
  ]);
  assert.equal(
    paramsOf(given.stdout),
    countParams(buildConfig({ seqLen: 16, layers: 2, hidden: 36, vocabSize: 49152 })).sum_numel,
    "--vocab-size says otherwise",
  );

  // A checkpoint of another vocabulary (a variant trained before this default) names the flags that rebuild its shape.
  const out = tmpDir("tstrain-vocab-resume-");
  const first = cli([
    ...small,
    "--out",
    out,
    "--layers",
    "2",
    "--hidden",
    "36",
    "--vocab-size",
    "256",
    "--stop-after-steps",
    "4",
  ]);
  assert.equal(first.status, 0, first.stderr);
  const again = cli([
    ...small,
    "--out",
    out,
    "--layers",
    "2",
    "--hidden",
    "36",
    "--resume",
    path.join(out, "ckpt", "checkpoint-4"),
  ]);
  assert.equal(again.status, 2, again.stdout + again.stderr);
  assert.match(
    again.stderr,
    /^refused: resume refused: the checkpoint .*checkpoint-4 holds a model with vocab_size 256 but this run builds vocab_size 128\. Resume with the shape it was trained with: run node dist\/main\.js .* --layers 2 --hidden 36 --vocab-size 256 \[M2\]\n$/,
  );
  // the advice, as printed, resumes
  const [resumed] = assertAdviceRuns(again.stderr);
  assert.match(resumed.stdout, /resume from \S+checkpoint-4: step 4/);
});

test("a resume that changes --lr, --warmup-frac, --decay-frac or the update's constants is refused naming old and new, unless --allow-config-change lists them (P7)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-p7-");
  const first = cli(tinyArgs(mix.root, out, ["--stop-after-steps", "4"]));
  assert.equal(first.status, 0, first.stderr);
  const ck = path.join(out, "ckpt", "checkpoint-4");
  const pristine = tmpDir("tstrain-p7-pristine-"); // the run as it stopped, for each advised command to train in
  fs.cpSync(out, pristine, { recursive: true });
  const lr = cli(tinyArgs(mix.root, out, ["--resume", ck, "--lr", "1e-3"]));
  assert.equal(lr.status, 2, lr.stdout + lr.stderr);
  assert.match(
    lr.stderr,
    /^refused: resume refused: this run changes the update .*checkpoint-4 was trained with: --lr 0\.003 -> 0\.001\. .*Resume with the checkpoint's values: node dist\/main\.js .* --lr 0\.003; or add --allow-config-change to train on from there with the new values: node dist\/main\.js .* --allow-config-change \[P7\]\n$/,
  );
  const sched = cli(tinyArgs(mix.root, out, ["--resume", ck, "--warmup-frac", "0.1", "--decay-frac", "0.5"]));
  assert.equal(sched.status, 2, sched.stdout + sched.stderr);
  assert.match(
    sched.stderr,
    /--warmup-frac 0\.02 -> 0\.1, --decay-frac 0\.8 -> 0\.5\. .* --warmup-frac 0\.02 --decay-frac 0\.8; .*\[P7\]/,
  );
  assert.ok(!fs.existsSync(path.join(out, "ckpt", "checkpoint-8")), "nothing was trained");

  // A checkpoint of a tstrain whose AdamW beta2 was another: its run_config.json (and, so it still proves itself, its manifest) says so.
  const rcPath = path.join(ck, "run_config.json");
  const rcSaved = fs.readFileSync(rcPath);
  const manPath = path.join(ck, "manifest.json");
  const manSaved = fs.readFileSync(manPath);
  const rc = JSON.parse(rcSaved.toString("utf8")) as { update: Record<string, number> };
  assert.equal(rc.update.beta2, 0.95, "run_config.json records the update's constants");
  rc.update.beta2 = 0.999;
  const rcBytes = Buffer.from(JSON.stringify(rc));
  fs.writeFileSync(rcPath, rcBytes);
  const man = JSON.parse(manSaved.toString("utf8")) as { files: Record<string, { size: number; sha256: string }> };
  man.files["run_config.json"] = { size: rcBytes.length, sha256: createHash("sha256").update(rcBytes).digest("hex") };
  fs.writeFileSync(manPath, JSON.stringify(man));
  const betas = cli(tinyArgs(mix.root, out, ["--resume", ck]));
  assert.equal(betas.status, 2, betas.stdout + betas.stderr);
  assert.match(
    betas.stderr,
    /: beta2 0\.999 -> 0\.95\. .*Add --allow-config-change .*: node dist\/main\.js .* --allow-config-change \[P7\]/,
  );
  fs.writeFileSync(rcPath, rcSaved);
  fs.writeFileSync(manPath, manSaved);

  const allowed = cli(
    tinyArgs(mix.root, out, ["--resume", ck, "--lr", "1e-3", "--warmup-frac", "0.1", "--allow-config-change"]),
  );
  assert.equal(allowed.status, 0, allowed.stderr);
  assert.match(
    allowed.stdout,
    /^resume from .*checkpoint-4: step 4, .*; changed on purpose \(--allow-config-change\): --lr 0\.003 -> 0\.001, --warmup-frac 0\.02 -> 0\.1$/m,
  );
  const rc8 = JSON.parse(fs.readFileSync(path.join(out, "ckpt", "checkpoint-8", "run_config.json"), "utf8")) as {
    lr: number;
  };
  assert.equal(rc8.lr, 1e-3, "the checkpoints from there on record the new value");

  // each command the --lr refusal advised runs as printed, on the run as it stopped: the checkpoint's value, then
  // the new one kept with --allow-config-change
  for (const [label, want] of [
    [/Resume with the checkpoint's values:/, 0.003],
    [/with the new values:/, 1e-3],
  ] as const) {
    fs.rmSync(out, { recursive: true, force: true });
    fs.cpSync(pristine, out, { recursive: true });
    const ok = runAdvised(adviceAfter(lr.stderr, label));
    assert.equal(ok.status, 0, ok.stderr);
    const rc = JSON.parse(fs.readFileSync(path.join(out, "ckpt", "checkpoint-8", "run_config.json"), "utf8"));
    assert.equal(rc.lr, want, `${label}: the run trained on with that --lr`);
  }
});

test("--resume on a path that does not exist says so (not 'no cursor.json'), and names the checkpoints --out holds (C3)", {
  timeout: 120_000,
}, async () => {
  const out = tmpDir("tstrain-resume-missing-");
  const flags = tinyRun(mix.root, out, ["--vocab-size", "64", "--backend", "wasm"]);
  const gone = cli([...flags, "--resume", path.join(out, "ckpt", "checkpoint-4")]);
  assert.equal(gone.status, 2, gone.stderr);
  assert.match(
    gone.stderr,
    /^refused: resume refused: --resume \S+checkpoint-4 does not exist\. \S+\/ckpt holds no checkpoint; name a checkpoint folder \(RUN\/ckpt\/checkpoint-N\), or run node dist\/main\.js .* \(a fresh start\) \[C3\]\n$/,
  );
  assert.doesNotMatch(gone.stderr, /cursor\.json/);
  // the advice, as printed: a fresh start (no Hub repo here, so no --resume auto)
  const [fresh] = assertAdviceRuns(gone.stderr);
  assert.doesNotMatch(fresh.cmd, /--resume/);
  const typo = cli([...flags, "--resume", path.join(out, "ckpt", "checkpoint-44")]);
  assert.equal(typo.status, 2, typo.stderr);
  assert.match(
    typo.stderr,
    /--resume \S+checkpoint-44 does not exist\. \S+\/ckpt holds checkpoint-4, checkpoint-8: resume the newest: run node dist\/main\.js .* --resume \S+\/ckpt\/checkpoint-8 \[C3\]\n$/,
  );
  // the advice, as printed: the run is complete at checkpoint-8, so it resumes at the horizon and exports
  const [newest] = assertAdviceRuns(typo.stderr);
  assert.match(newest.stdout, /resume from \S+checkpoint-8: step 8/);
  fs.writeFileSync(path.join(out, "a-file"), "x");
  const file = cli([...flags, "--resume", path.join(out, "a-file")]);
  assert.equal(file.status, 2, file.stderr);
  assert.match(file.stderr, /--resume \S+a-file is a file, not a checkpoint folder\./);
});

test("output to a file or pipe gets progress lines with done/total, rate, elapsed and ETA every TSTRAIN_PROGRESS_SECONDS, and the log lines carry the ETA (B5, G9)", {
  timeout: 120_000,
}, () => {
  const out = tmpDir("tstrain-progress-");
  const r = spawnSync(
    process.execPath,
    [MAIN, ...tinyRun(mix.root, out, ["--vocab-size", "64", "--log-every", "4", "--backend", "wasm"])],
    { encoding: "utf8", timeout: 120_000, env: { ...process.env, TSTRAIN_PROGRESS_SECONDS: "0" } },
  );
  assert.equal(r.status, 0, r.stderr);
  const progress = r.stdout.split("\n").filter((l) => l.startsWith("progress: "));
  assert.equal(progress.length, 8, r.stdout);
  progress.forEach((l, i) => {
    assert.match(
      l,
      new RegExp(
        `^progress: step ${i + 1}/8 \\(${Math.floor((100 * (i + 1)) / 8)}% of this session\\) loss \\d+\\.\\d{4} lr \\S+ scale \\d+ \\| \\d+ tok/s \\| elapsed \\S+ \\| ETA (\\d+h)?(\\d+m)?\\d+s$`,
      ),
    );
  });
  const logs = r.stdout.split("\n").filter((l) => /^step \d+\/8 loss=/.test(l));
  assert.equal(logs.length, 2);
  for (const l of logs) assert.match(l, / tok\/s=\d+ elapsed=\S+ eta=(\d+h)?(\d+m)?\d+s$/);
});

test("the phases before and after training say what they do: hashing a large mix shows its progress, validation says what it covers (B5, D3, G2)", {
  timeout: 120_000,
}, () => {
  const big = writeSyntheticMix({ vocab: 64, trainTokens: 6 * 1024 * 1024, valTokens: 1024 });
  const r = spawnSync(
    process.execPath,
    [
      MAIN,
      ...tinyRun(big.root, tmpDir("tstrain-phases-"), ["--vocab-size", "64", "--max-steps", "4", "--backend", "wasm"]),
    ],
    { encoding: "utf8", timeout: 120_000, env: { ...process.env, TSTRAIN_PROGRESS_SECONDS: "0" } },
  );
  assert.equal(r.status, 0, r.stderr);
  const hashing = [
    ...r.stdout.matchAll(
      /^data: verifying the mix: (\d+)\/(\d+) MB of shards hashed \((\d+)%\), \d+ MB\/s, ETA (\d+h\d\dm|(\d+m)?\d+s)$/gm,
    ),
  ];
  assert.ok(hashing.length >= 2, r.stdout.slice(0, 3000));
  assert.ok(
    hashing.every((m) => Number(m[2]) === 13 && Number(m[1]) <= 13),
    "12.6 MB of shards, rounded",
  );
  assert.match(r.stdout, /^validation: 16 held-out windows of 16 tokens on 1 rank\(s\)$/m);
  assert.ok(r.stdout.indexOf("validation: 16 held-out") < r.stdout.indexOf("validation loss="), "said before the pass");
});

test("a reader that closes the output (| head) ends no run: no stack trace, the run finishes (G5)", {
  timeout: 300_000,
}, async () => {
  const out = tmpDir("tstrain-epipe-");
  const child = spawn(process.execPath, [MAIN, ...tinyRun(mix.root, out, ["--backend", "wasm"])], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (s: string) => {
    stderr += s;
  });
  // like `| head -1`: read the first line, then close the pipe while the run is still writing
  child.stdout.once("data", () => child.stdout.destroy());
  const code = await new Promise<number | null>((resolve) => child.on("exit", (c) => resolve(c)));
  assert.equal(code, 0, stderr);
  assert.match(stderr, /the output's reader closed it \(EPIPE\); the run goes on/);
  assert.ok(!/\n\s+at /.test(stderr), `no stack trace:\n${stderr}`);
  const metrics = fs.readFileSync(path.join(out, "metrics.jsonl"), "utf8").trim().split("\n");
  assert.equal(JSON.parse(metrics[metrics.length - 1]).step, 8, "the run trained to its last step");
});
