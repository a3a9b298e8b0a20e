// Refusals whose advice must work where it is given (issue 60): each bad input is refused before any work, exit 2,
// one line naming the rule; the command (or the file line) it advises is then run here, in the same state, and works.
// What a CPU without some kernels is told is checked by playing that CPU (TSTRAIN_TEST_ISAS, native.ts).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawn, spawnSync } from "node:child_process";
import { tmpDir } from "./helpers/tmp";
import { tinyRun } from "./helpers/run";
import { advisedCommands, assertAdviceRuns, assertRefused, node, runAdvised, tinyModel } from "./helpers/cli";
import { adviceAfter } from "./helpers/survive";
import { writeSyntheticMix } from "./helpers/mix";
import { writeTinyTokenizer } from "./fixtures/data-synth";
import { corpusDocs, corpusJsonl } from "./fixtures/corpus-docs";
import { parseArgs } from "../src/config";
import { bf16Support, loadNative, supportedIsas } from "../src/model/engine/native";
import { BF16_EMULATION_SPEED } from "../src/model/engine/bench-rates";
import { firstSignal, setPhase } from "../src/session/stop";

// room for the defaults a refusal may advise: seq 1024 at the tiny run's 8 steps of 2 sequences, and held-out windows
const mix = writeSyntheticMix({ vocab: 64, trainTokens: 64 * 1024, valTokens: 4096 });
const ROOT = path.join(__dirname, "..", "..");

/** The tiny run's dry run on the synthetic mix, with `extra` set (a flag given again replaces the tiny run's). */
const dry = (out: string, extra: string[] = []) =>
  tinyRun(mix.root, out, ["--vocab-size", "64", "--dry-run", ...extra]);

/** A folder's files, each with its size and modification time: what "adds nothing, changes nothing" compares. */
function snapshot(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out.push(`${path.relative(dir, p)} ${fs.statSync(p).size} ${fs.statSync(p).mtimeMs}`);
    }
  };
  walk(dir);
  return out.sort();
}

test("a resume with another --seed or --data-seed is refused before any training, naming the checkpoint's seed, with --resume PATH or auto and despite --allow-config-change; the seed it names resumes, and run_config.json records the weights' seed (P7)", {
  timeout: 600_000,
}, () => {
  const out = tmpDir("tstrain-seed-resume-");
  const hub = ["--vocab-size", "64", "--hub-url", "embedded", "--hub-repo", "local/seeds"];
  const first = node("main.js", tinyRun(mix.root, out, [...hub, "--stop-after-steps", "4"]));
  assert.equal(first.status, 0, first.stderr);
  const ck4 = path.join(out, "ckpt", "checkpoint-4");
  const pristine = tmpDir("tstrain-seed-pristine-"); // the run as it stopped, for each advised resume to train in
  fs.cpSync(out, pristine, { recursive: true });
  const cases: Array<[extra: string[], refusal: RegExp, seed: string]> = [
    [
      ["--resume", "auto", "--seed", "5"],
      /^refused: resume refused: this run changes the seeds of \S+checkpoint-4: --seed 20260919 -> 5 \(its weights were initialised with 20260919\)\. .*Resume with the checkpoint's seed: node dist\/main\.js .*--seed 20260919; or start a new run with another --out \[P7\]$/m,
      "--seed 20260919",
    ],
    [["--resume", ck4, "--seed", "5"], /: --seed 20260919 -> 5 .*--seed 20260919; .* \[P7\]$/m, "--seed 20260919"],
    [
      ["--resume", "auto", "--seed", "5", "--allow-config-change"],
      /--allow-config-change does not allow it.* \[P7\]$/m,
      "--seed 20260919",
    ],
    [
      ["--resume", "auto", "--data-seed", "7"],
      /: --data-seed 20260919 -> 7 \(its window order was drawn with 20260919\)\. .*--data-seed 20260919; .* \[P7\]$/m,
      "--data-seed 20260919",
    ],
  ];
  for (const [extra, refusal, seed] of cases) {
    // each case on the run as it stopped: the advice names this --out, and the run it advises trains there
    fs.rmSync(out, { recursive: true, force: true });
    fs.cpSync(pristine, out, { recursive: true });
    const restored = snapshot(path.join(out, "ckpt"));
    const bad = node("main.js", tinyRun(mix.root, out, [...hub, ...extra]));
    assertRefused(bad, refusal);
    assert.doesNotMatch(bad.stdout, /^step \d/m, "no step trained");
    assert.deepEqual(snapshot(path.join(out, "ckpt")), restored, "no checkpoint changed by the refusal");
    // the advice: this command with the seed it names in place of the new one, run as printed
    const advised = adviceAfter(bad.stderr, /Resume with the checkpoint's seeds?:/);
    assert.ok(advised.join(" ").endsWith(seed), advised.join(" "));
    const ok = runAdvised(advised);
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stdout, /resume from \S+checkpoint-4: step 4/);
    const rc = JSON.parse(fs.readFileSync(path.join(out, "ckpt", "checkpoint-8", "run_config.json"), "utf8"));
    assert.deepEqual([rc.seed, rc.dataSeed], [20260919, 20260919], "the weights' seeds, and nothing else");
  }
});

test("a resume with another --seq-len or horizon is refused with the command that gives the run's value, and it resumes (C3, P5)", {
  timeout: 600_000,
}, () => {
  const out = tmpDir("tstrain-plan-resume-");
  const first = node("main.js", tinyRun(mix.root, out, ["--vocab-size", "64", "--stop-after-steps", "4"]));
  assert.equal(first.status, 0, first.stderr);
  const pristine = tmpDir("tstrain-plan-resume-pristine-");
  fs.cpSync(out, pristine, { recursive: true });
  const ck4 = path.join(out, "ckpt", "checkpoint-4");
  const cases: Array<[extra: string[], refusal: RegExp, fix: string]> = [
    [
      ["--seq-len", "32"],
      /^refused: resume refused: \S+ cursor seq_len=16 != current 32; .*: run node dist\/main\.js .* \(the run's\) \[C3\]$/m,
      "--seq-len 16",
    ],
    [
      ["--max-steps", "12"],
      /^refused: resume refused: the checkpoint's horizon is 8 steps but this plan has 12; .*: run node dist\/main\.js .* \(the checkpoint's horizon\) \[P5\]$/m,
      "--max-steps 8",
    ],
  ];
  for (const [extra, refusal, fix] of cases) {
    fs.rmSync(out, { recursive: true, force: true });
    fs.cpSync(pristine, out, { recursive: true });
    const bad = node("main.js", tinyRun(mix.root, out, ["--vocab-size", "64", "--resume", ck4, ...extra]));
    assertRefused(bad, refusal);
    // the advice, run as printed: this command with the run's value, resuming in this --out
    const [cmd] = advisedCommands(bad.stderr);
    assert.ok(cmd.endsWith(` --resume ${ck4} ${fix}`) || cmd.endsWith(fix), cmd);
    const [ran] = assertAdviceRuns(bad.stderr);
    assert.match(ran.stdout, /resume from \S+checkpoint-4: step 4/);
  }
});

test("--demo --root on a prepared mix trains the demo's model on that mix and adds nothing there, with or without --dry-run; --dry-run writes nothing anywhere; a folder of other files is refused, and the folder it names works (D1, G7)", {
  timeout: 600_000,
}, () => {
  const own = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 1024 });
  const before = snapshot(own.root);
  const tmp = tmpDir("tstrain-demo-tmp-"); // the child's temp folder: a dry run's scratch must be gone from it
  const env = { ...process.env, TMPDIR: tmp };
  const scratchLeft = () => fs.readdirSync(tmp).filter((n) => n.startsWith("tstrain-dry-run-"));
  const demo = (out: string, extra: string[]) =>
    node(
      "main.js",
      ["--demo", "--root", own.root, "--out", out, "--world", "1", "--max-steps", "2", "--val-tokens", "256", ...extra],
      env,
    );
  const out = path.join(tmpDir("tstrain-demo-root-"), "run");
  const planned = demo(out, ["--dry-run"]);
  assert.equal(planned.status, 0, planned.stderr);
  assert.match(
    planned.stdout,
    /^demo: --root \S+ holds a prepared mix: the demo's model trains on it, and nothing is written there$/m,
  );
  const plain = node("main.js", dry(tmpDir("tstrain-demo-root-plain-"), ["--root", own.root]));
  const fp = (s: string) => JSON.parse(s.split("\n").find((l) => l.startsWith('{"dry_run"')) ?? "{}").fingerprint;
  assert.equal(fp(planned.stdout), fp(plain.stdout), "the plan is on that mix");
  assert.deepEqual(snapshot(own.root), before, "nothing added to the mix's folder by the dry run");
  assert.ok(!fs.existsSync(out), "the dry run made no --out");
  assert.deepEqual(scratchLeft(), [], "and left no scratch folder");
  const trained = demo(out, ["--push-every-steps", "2"]);
  assert.equal(trained.status, 0, trained.stderr);
  assert.match(trained.stdout, /^mix: \S+ tokens .* fp=/m);
  assert.ok(fs.existsSync(path.join(out, "final", "model.safetensors")), trained.stdout);
  assert.deepEqual(snapshot(own.root), before, "nothing added to the mix's folder by the run");
  // a dry run of the demo with no demo data yet builds it in its scratch folder and drops it: nothing anywhere
  const fresh = path.join(tmpDir("tstrain-demo-fresh-"), "data");
  const built = node("main.js", ["--demo", "--root", fresh, "--out", path.join(fresh, "..", "run"), "--dry-run"], env);
  assert.equal(built.status, 0, built.stderr);
  assert.match(
    built.stdout,
    /demo data: --dry-run writes nothing, so the demo mix is built in \S+ and removed after the plan/,
  );
  assert.deepEqual(fs.readdirSync(path.dirname(fresh)), [], "no --root, no --out");
  assert.deepEqual(scratchLeft(), [], "no scratch left");
  // a folder that holds other files is refused; the folder it names builds the demo's data there
  const mine = tmpDir("tstrain-demo-mine-");
  fs.writeFileSync(path.join(mine, "notes.txt"), "mine");
  const bad = node("main.js", ["--demo", "--root", mine, "--out", path.join(mine, "run"), "--dry-run"], env);
  assertRefused(
    bad,
    /^refused: --demo --root \S+: the folder holds 1 entry \(notes\.txt\) but neither a prepared mix \(manifest\.json\) nor the demo's data \(demo\.json\), and --demo would write its data among them\. Run node dist\/main\.js --demo --out \S+ --dry-run --root \S+demo-data \(a new folder of the demo's own\) \[D1\]$/m,
  );
  assertAdviceRuns(bad.stderr, { env });
  assert.deepEqual(fs.readdirSync(mine), ["notes.txt"], "nothing written among the user's files");
  // a folder that holds a prepared mix one level down: the advice names it too, and it plans on that mix
  const above = tmpDir("tstrain-demo-above-");
  fs.writeFileSync(path.join(above, "notes.txt"), "mine");
  fs.cpSync(own.root, path.join(above, "corpus"), { recursive: true });
  const nested = node(
    "main.js",
    ["--demo", "--root", above, "--out", path.join(above, "run"), "--world", "1", "--max-steps", "2", "--dry-run"],
    env,
  );
  assertRefused(
    nested,
    /Run node dist\/main\.js .*--root \S+corpus \(the demo's model on the mix there\), or .* \[D1\]$/m,
  );
  const ran = assertAdviceRuns(nested.stderr, { env, min: 2 });
  assert.match(ran[0].stdout, /holds a prepared mix: the demo's model trains on it/);
});

test("--isa amx or avx512bf16 in fp32 is refused with the fixes the CPU runs, here and on a played AVX-512 and AVX2-only CPU; every command it advises runs there (P8, P1)", {
  timeout: 600_000,
}, (t) => {
  const native = loadNative();
  if ("reason" in native) {
    if (process.env.TSTRAIN_REQUIRE_NATIVE === "1") assert.fail(native.reason);
    return t.skip(`native engine unavailable here: ${native.reason}`);
  }
  const here = supportedIsas();
  const cpus: Array<[name: string, played: string | undefined]> = [
    ["this CPU", undefined],
    ["an AVX-512 CPU without AVX512_BF16", here.includes("avx512") ? "avx512,avx2,portable" : undefined],
    ["an AVX2-only CPU", "avx2,portable"],
  ];
  for (const [name, played] of cpus) {
    if (name !== "this CPU" && played === undefined) continue;
    const env = { ...process.env, ...(played ? { TSTRAIN_TEST_ISAS: played } : {}) };
    for (const isa of ["amx", "avx512bf16"]) {
      const out = tmpDir("tstrain-isa-fp32-");
      const bad = node("main.js", dry(out, ["--isa", isa]), env);
      assertRefused(
        bad,
        new RegExp(
          `^refused: --isa ${isa} is a bf16 kernel \\(.*\\), and this run computes in fp32.*: run node dist/main\\.js .* --isa \\w+ \\(fp32 products\\).* \\[P8\\]$`,
          "m",
        ),
      );
      assert.deepEqual(fs.readdirSync(out), [], "nothing written");
      // the advice: each alternative, run as printed on the same CPU
      if (played === "avx2,portable")
        for (const cmd of advisedCommands(bad.stderr))
          assert.doesNotMatch(cmd, /avx512|--precision bf16/, `${name}: nothing it cannot run`);
      assertAdviceRuns(bad.stderr, { env });
    }
  }
});

test("--precision bf16 where neither AMX nor VDPBF16PS runs says at start, also in a dry run, the emulation's measured speed and that --precision fp32 is faster; that runs without the warning (P8)", {
  timeout: 300_000,
}, (t) => {
  const native = loadNative();
  if ("reason" in native) {
    if (process.env.TSTRAIN_REQUIRE_NATIVE === "1") assert.fail(native.reason);
    return t.skip(`native engine unavailable here: ${native.reason}`);
  }
  const env = { ...process.env, TSTRAIN_TEST_ISAS: "avx2,portable" };
  const out = tmpDir("tstrain-bf16-emulated-");
  const r = node("main.js", dry(out, ["--precision", "bf16"]), env);
  assert.equal(r.status, 0, r.stderr);
  const warning = r.stdout.split("\n").find((l) => l.startsWith("WARNING --precision bf16"));
  assert.ok(warning, r.stdout);
  assert.ok(r.stdout.indexOf(warning) < r.stdout.indexOf("mix: "), "said before any work");
  assert.ok(warning.includes(`${BF16_EMULATION_SPEED}x the tokens per second of --precision fp32`), warning);
  assert.match(warning, /--precision fp32 is the faster choice here/);
  const fp32 = node("main.js", dry(out, ["--precision", "fp32"]), env);
  assert.equal(fp32.status, 0, fp32.stderr);
  assert.doesNotMatch(fp32.stdout, /WARNING --precision/);
  // where VDPBF16PS runs, no such warning (the line that says what to expect instead)
  if (bf16Support()?.dp) {
    const real = node("main.js", dry(out, ["--precision", "bf16"]));
    assert.equal(real.status, 0, real.stderr);
    assert.doesNotMatch(real.stdout, /WARNING --precision bf16/);
  }
});

test("a --hidden that splits into no heads of even width advises the nearest widths that pass every rule, and both run (M2)", {
  timeout: 300_000,
}, () => {
  for (const [h, widths] of [
    ["100", ["90", "108"]],
    ["99", ["90", "108"]],
    ["20", ["36"]],
  ] as const) {
    const out = tmpDir("tstrain-hidden-");
    const bad = node("main.js", dry(out, ["--hidden", h]));
    assertRefused(bad, new RegExp(`^refused: --hidden ${h} .*; run node dist/main\\.js .* \\[M2\\]$`, "m"));
    assert.deepEqual(
      advisedCommands(bad.stderr).map((c) => /--hidden (\d+)$/.exec(c)?.[1]),
      widths,
      "the nearest widths, each as the command that gives it",
    );
    if (widths.length === 1) assert.match(bad.stderr, / \(the narrowest width there is\) \[M2\]$/m);
    assertAdviceRuns(bad.stderr);
  }
});

test("a plan the mix cannot hold (a step larger than the mix, a window longer than its held-out part, more steps than it covers) advises the flags that fit it, and they run (D6, D7, P5)", {
  timeout: 300_000,
}, () => {
  const cases: Array<[extra: string[], refusal: RegExp]> = [
    [
      ["--micro-batch", "100000"],
      /^refused: dataset too small for the plan: .*the epoch never wraps: run node dist\/main\.js .* --micro-batch \d+ .*\(what the mix holds\) \[D6\]$/m,
    ],
    [
      ["--seq-len", "100000", "--max-steps", "3"],
      /^refused: .*no full window of seq_len 100000: run node dist\/main\.js .* --seq-len \d+ .*\(what the mix holds\) \[D4\]$/m,
    ],
    [
      ["--max-steps", "100000"],
      /^refused: dataset too small .*: run node dist\/main\.js .* --max-steps \d+ \(what the mix holds\) \[D6\]$/m,
    ],
    [
      ["--max-steps", "0", "--tokens", "10"],
      /^refused: --tokens 10 is less than one step of 32 tokens .*: run node dist\/main\.js .* --tokens 32 \(one step; more works too\) \[P5\]$/m,
    ],
  ];
  for (const [extra, refusal] of cases) {
    const out = tmpDir("tstrain-fit-");
    const bad = node("main.js", dry(out, extra));
    assertRefused(bad, refusal);
    assertAdviceRuns(bad.stderr);
  }
});

test("a --vocab-size below the mix tokenizer's ids advises a --vocab-size that holds them, and it runs (D1)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-vocab-small-");
  const bad = node("main.js", dry(out, ["--vocab-size", "10"]));
  assertRefused(
    bad,
    /^refused: the mix's tokenizer has 64 ids but the model's vocabulary is 10 \(--vocab-size 10\): .*Run node dist\/main\.js .* --vocab-size 64 \(.*\), or rebuild the mix with a tokenizer of at most 10 ids \[D1\]$/m,
  );
  assertAdviceRuns(bad.stderr);
});

test("a config file's dotted key, inline table or [table] is told the lines to write, only where the file has what it names; written, the run takes them (G12)", {
  timeout: 300_000,
}, () => {
  const dir = tmpDir("tstrain-config-dotted-");
  const cases: Array<[text: string, refusal: RegExp, check: (p: ReturnType<typeof parseArgs>) => unknown]> = [
    [
      'hub.repo.type = "model"\n',
      /: hub\.repo\.type \(a dotted key\) is not a flag, and the file is flat: .*: write hub-repo-type = "model" instead \[G12\]$/,
      (p) => assert.equal(p.config.hubRepoType, "model"),
    ],
    [
      "train.lr = 1e-3\n",
      /: train\.lr \(a dotted key\) is not a flag, .*: write lr = 0\.001 instead \[G12\]$/,
      (p) => assert.equal(p.config.lr, 1e-3),
    ],
    [
      '[hub]\nrepo-type = "model"\n',
      /: \[hub\] is a table, .*: write hub-repo-type = "model" at the top of the file and drop the \[hub\] line \[G12\]$/,
      (p) => assert.equal(p.config.hubRepoType, "model"),
    ],
    [
      'hub = { repo-type = "model" }\n',
      /: hub = \{ \.\.\. \} \(an inline table\) is not a flag, .*: write hub-repo-type = "model" instead \[G12\]$/,
      (p) => assert.equal(p.config.hubRepoType, "model"),
    ],
  ];
  for (const [text, refusal, check] of cases) {
    const file = path.join(dir, "run.toml");
    fs.writeFileSync(file, text);
    let said = "";
    assert.throws(
      () => parseArgs(["--config", file]),
      (e: Error) => {
        said = e.message;
        assert.match(e.message, refusal);
        assert.doesNotMatch(e.message, /drop the \[train\] line/, "no line the file does not have");
        return true;
      },
    );
    // the advice: the lines it gives, in place of the file's
    const lines = /: write (.*?) (instead|at the top of the file)/.exec(said)?.[1] ?? "";
    fs.writeFileSync(file, `${lines.split(" and ").join("\n")}\n`);
    check(parseArgs(["--config", file]));
    const out = tmpDir("tstrain-config-dotted-out-");
    const r = node("main.js", ["--config", file, ...dry(out)]);
    assert.equal(r.status, 0, `${fs.readFileSync(file, "utf8")}: ${r.stderr}`);
  }
});

test("every range refusal of a number flag, and a value that is no number, no whole number or too large, gives a flag that runs in its place (G10)", {
  timeout: 900_000,
}, () => {
  const cases: Array<[bad: string[], state?: string[]]> = [
    [["--lr", "0"]],
    [["--lr", "1.5"]],
    [["--seq-len", "1"]],
    [["--micro-batch", "0"]],
    [["--accum", "0"]],
    [["--world", "0"]],
    [["--world", "100"]],
    [["--layers", "-1"]],
    [["--hidden", "-1"]],
    [["--vocab-size", "1"]],
    [["--tokens", "0"]],
    [
      ["--max-steps", "-1"],
      ["--tokens", "256"],
    ],
    [["--warmup-frac", "2"]],
    [["--decay-frac", "-0.5"]],
    [["--seed", "-1"]],
    [["--data-seed", "-1"]],
    [["--val-tokens", "0"]],
    [["--log-every", "0"]],
    [["--push-every-steps", "-1"]],
    [["--stop-after-steps", "-1"]],
    [["--min-free-gb", "-1"]],
    [["--activation-budget-gb", "-1"]],
    [["--hub-timeout-seconds", "0"]],
    [["--hub-retry-minutes", "0"]],
    [["--lr", "abc"]],
    [["--seq-len", "16.5"]],
    [["--micro-batch", "0.5"]],
    [
      ["--max-steps", "1e30"],
      ["--tokens", "256"],
    ],
    [["--world", "1e30"]],
  ];
  for (const [bad, state = []] of cases) {
    const out = tmpDir("tstrain-range-");
    const r = node("main.js", dry(out, [...state, ...bad]));
    assertRefused(
      r,
      new RegExp(
        `^refused: ${bad[0]}[: ].*[:;] run node dist/main\\.js .* ${bad[0]} \\S+( \\(.*\\))?(, or node dist/main\\.js .* ${bad[0]} \\S+)? \\[G10\\]$`,
        "m",
      ),
    );
    // each command it gives: the one run, its value replaced, nothing else changed, run as printed
    for (const cmd of advisedCommands(r.stderr)) {
      assert.ok(!` ${cmd} `.includes(` ${bad[0]} ${bad[1]} `), `the refused value is gone: ${cmd}`);
      assert.equal(cmd.split(" ").length, 2 + dry(out, [...state, ...bad]).length, `one value changed: ${cmd}`);
    }
    assertAdviceRuns(r.stderr);
  }
  const big = node("main.js", dry(tmpDir("tstrain-range-big-"), ["--max-steps", "1e30"]));
  assert.match(big.stderr, /--max-steps 1e30 is too large: a whole number is counted exactly up to 9007199254740991/);
  assert.doesNotMatch(big.stderr, /must be a whole number/);
});

test("every refusal of a flag's words or of flags that exclude each other gives whole commands, each with one change made, and each runs as printed (G10, G7, B6, A13, P8, O1)", {
  timeout: 900_000,
}, () => {
  const hubDir = path.join(tmpDir("tstrain-words-hub-"), "hub");
  const cases: Array<[extra: string[], refusal: RegExp, ways: RegExp[]]> = [
    [["--no-grad-ckpt=1"], /^refused: --no-grad-ckpt takes no value: run .* \[G10\]$/m, [/ --no-grad-ckpt$/]],
    [
      ["--prune=maybe"],
      /^refused: --prune=maybe: a switch is on or off: .* \[G10\]$/m,
      [/ --prune$/, / --prune=false$/],
    ],
    [["--backend", "metal"], /^refused: --backend "metal" is not one of .* \[G10\]$/m, [/ --backend auto$/]],
    [["--gc-nonreentrant"], /no meaning here: run .* \(without it\) \[G10\]$/m, [/--vocab-size 64 --dry-run$/]],
    [["--torch-compile"], /no meaning here: run .* \(without it\) \[G10\]$/m, [/--vocab-size 64 --dry-run$/]],
    [["--attn", "sdpa"], / \(eager, the one way\) \[G10\]$/m, [/--vocab-size 64 --dry-run$/]],
    [
      ["--hub-dir", hubDir, "--hub-url", "https://huggingface.co"],
      /^refused: --hub-dir \S+ is the folder of the embedded local Hub, .* \[B6\]$/m,
      [/ --hub-url embedded$/, /--hub-url https:\/\/huggingface\.co$/],
    ],
    [["--gpus", "x"], /^refused: --gpus "x": .* \(every GPU of the host\) \[A13\]$/m, [/--vocab-size 64 --dry-run$/]],
    [
      ["--gpus", "0"],
      /^refused: --gpus chooses the devices of --backend webgpu.* \[A13\]$/m,
      [/ --gpus 0 --backend webgpu$/, /--vocab-size 64 --dry-run$/],
    ],
    [
      ["--benchmark", "2"],
      /^refused: --dry-run and --benchmark exclude each other: pick one: .* \[G7\]$/m,
      [/--vocab-size 64 --dry-run$/, / --benchmark 2$/],
    ],
    [
      ["--precision", "bf16", "--backend", "wasm"],
      /^refused: --precision bf16 runs on the native engine's own GEMM, .* \[P8\]$/m,
      [/ --precision bf16 --backend native$/, / --backend wasm$/],
    ],
    [
      ["--precision", "bf16", "--gemm", "openblas"],
      /^refused: --precision bf16 runs on the built-in GEMM, not --gemm openblas: .* \[P8\]$/m,
      [/ --precision bf16$/, / --gemm openblas$/],
    ],
  ];
  for (const [extra, refusal, ways] of cases) {
    const out = tmpDir("tstrain-words-");
    const bad = node("main.js", dry(out, extra));
    assertRefused(bad, refusal);
    const cmds = advisedCommands(bad.stderr);
    assert.equal(cmds.length, ways.length, bad.stderr);
    for (const [i, c] of cmds.entries()) assert.match(c, ways[i], `the change: ${bad.stderr}`);
    assertAdviceRuns(bad.stderr, { min: ways.length });
  }
  // a flag without its value, last on the line: its default
  const bare = node("main.js", [...dry(tmpDir("tstrain-words-bare-")), "--accum"]);
  assertRefused(
    bare,
    /^refused: --accum needs a value: run node dist\/main\.js .* --accum 32 \(its default\) \[G10\]$/m,
  );
  assertAdviceRuns(bare.stderr);
  // --out names a file: the folder beside it
  const file = path.join(tmpDir("tstrain-words-file-"), "run");
  fs.writeFileSync(file, "mine");
  const onFile = node("main.js", tinyRun(mix.root, file, ["--vocab-size", "64", "--max-steps", "4"]));
  assertRefused(
    onFile,
    /^refused: --out \S+ is a file, not a folder; .* --out \S+run\.run \(a folder beside it\) \[O1\]$/m,
  );
  assertAdviceRuns(onFile.stderr);
  assert.equal(fs.readFileSync(file, "utf8"), "mine", "the file is left as it was");
});

test("a shard that holds a token id outside the model's vocabulary is told the --vocab-size that holds it, and that runs (D1)", {
  timeout: 300_000,
}, () => {
  // the manifest says 32 ids, the shards hold ids up to 63: a model of 40 passes the manifest's check, not the shards'
  const own = writeSyntheticMix({ vocab: 64, trainTokens: 64 * 1024, valTokens: 4096 });
  const mf = path.join(own.root, "manifest.json");
  fs.writeFileSync(mf, JSON.stringify({ ...JSON.parse(fs.readFileSync(mf, "utf8")), vocab_size: 32 }));
  const out = tmpDir("tstrain-vocab-ids-");
  const bad = node("main.js", tinyRun(own.root, out, ["--vocab-size", "40", "--dry-run"]));
  assertRefused(
    bad,
    /^refused: shard \S+ holds token id (\d+), outside the model's vocabulary \[0, 40\) .*Rebuild the mix with node dist\/prepare\.js, or run node dist\/main\.js .* --vocab-size \d+ \(if the ids are meant; a larger one works too\) \[D1\]$/m,
  );
  const id = Number(/holds token id (\d+)/.exec(bad.stderr)?.[1]);
  assert.ok(
    advisedCommands(bad.stderr)[0].endsWith(` --vocab-size ${id + 1}`),
    "the smallest vocabulary that holds it",
  );
  assertAdviceRuns(bad.stderr);
});

test("--gemm openblas where no BLAS loads is refused with the commands that do without it: the built-in GEMM, or tfjs-wasm; each runs (P1)", {
  timeout: 300_000,
}, (t) => {
  if ("reason" in loadNative()) return t.skip("no native addon: the P1 refusal names the build instead");
  const env = { ...process.env, TSTRAIN_BLAS: "/nonexistent/libopenblas-missing.so.0" };
  const bad = node("main.js", dry(tmpDir("tstrain-no-blas-"), ["--gemm", "openblas"]), env);
  assertRefused(
    bad,
    /^refused: --gemm openblas is not available: no BLAS found .*; fix: apt-get install libopenblas0-pthread .*, or run node dist\/main\.js .* \(the built-in GEMM\), or node dist\/main\.js .* --backend wasm \(tfjs-wasm, slower\) \[P1\]$/m,
  );
  const [builtin, wasm] = advisedCommands(bad.stderr);
  assert.doesNotMatch(builtin, /--gemm/);
  assert.doesNotMatch(wasm, /--gemm/, "--gemm openblas with a tfjs backend would be refused (P1): dropped too");
  assertAdviceRuns(bad.stderr, { env, min: 2 });
});

test("a flag given twice is refused naming both, with the command that gives it once; that command runs and takes the later value (G10)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-twice-");
  const args = [...dry(out), "--world", "2", "--world", "1"];
  const bad = node("main.js", args);
  assertRefused(
    bad,
    /^refused: --world 1, --world 2 and --world 1 set the same flag: a flag is read once, and all but one would be dropped without a word\. Give each once, as in (node dist\/main\.js .*) \[G10\]$/m,
  );
  const cmd = / as in (node dist\/main\.js .*) \[G10\]$/m.exec(bad.stderr)?.[1] ?? "";
  const ok = spawnSync("bash", ["-c", cmd], { cwd: ROOT, encoding: "utf8", timeout: 150_000 });
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /"world":1,/);
  const both = node("main.js", [...dry(out), "--prune", "--prune"]);
  assertRefused(both, /^refused: --prune and --prune set the same flag: .* \[G10\]$/m);
});

test("--isa or --gemm with a backend that does not run the native engine, or --isa with --gemm openblas, is refused, and the fixes it names run (P1)", {
  timeout: 300_000,
}, () => {
  // --isa with --gemm openblas: the built-in GEMM's kernel, which OpenBLAS does not run
  const blas = node("main.js", dry(tmpDir("tstrain-isa-openblas-"), ["--gemm", "openblas", "--isa", "avx2"]));
  assertRefused(
    blas,
    /^refused: --isa avx2 chooses a kernel of the built-in GEMM, and --gemm openblas does not run it, so it would be ignored: run node dist\/main\.js .*--isa avx2 \(the built-in GEMM, to use --isa avx2\), or node dist\/main\.js .*--gemm openblas \(OpenBLAS, without --isa\) \[P1\]$/m,
  );
  const [builtin, openblas] = advisedCommands(blas.stderr);
  assert.doesNotMatch(builtin, /--gemm/, builtin);
  assert.doesNotMatch(openblas, /--isa/, openblas);
  if (supportedIsas().includes("avx2") && !("reason" in loadNative({ gemm: "openblas", isa: "auto" })))
    assertAdviceRuns(blas.stderr, { min: 2 });
  for (const [flags, backend] of [
    [["--isa", "avx2"], "wasm"],
    [["--gemm", "openblas"], "cpu"],
    // --gpus names devices of --backend webgpu: the advised --backend native drops it too, as that would be refused
    [["--isa", "avx2", "--gpus", "0"], "wasm"],
  ] as const) {
    const out = tmpDir("tstrain-isa-backend-");
    const bad = node("main.js", dry(out, [...flags, "--backend", backend]));
    assertRefused(
      bad,
      new RegExp(
        `^refused: ${flags.slice(0, 2).join(" ")} chooses the native engine's matrix products, and --backend ${backend} does not run that engine, so it would be ignored: run node dist/main\\.js .* --backend native \\(to use it\\), or node dist/main\\.js .* \\(the default, for --backend ${backend}\\) \\[P1\\]$`,
        "m",
      ),
    );
    const [native, tfjs] = advisedCommands(bad.stderr);
    assert.ok(native.includes(flags.slice(0, 2).join(" ")) && !native.includes("--gpus"), native);
    assert.ok(tfjs.endsWith(`--backend ${backend}`) && !tfjs.includes(flags[0]), tfjs);
    assert.equal(runAdvised(tfjs).status, 0, tfjs);
    if (flags[1] === "avx2" && supportedIsas().includes("avx2")) assert.equal(runAdvised(native).status, 0, native);
  }
});

test("--webgpu-fold with a backend other than webgpu is refused, since it would be ignored, and both fixes run (A10)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-fold-backend-");
  const bad = node("main.js", dry(out, ["--webgpu-fold", "host", "--backend", "wasm"]));
  assertRefused(
    bad,
    /^refused: --webgpu-fold host chooses where the webgpu engine folds each micro-batch's gradient, and --backend wasm always folds on the host, so it would be ignored: run node dist\/main\.js .*--webgpu-fold host --backend webgpu \(to use it\), or node dist\/main\.js .* \(without --webgpu-fold, on --backend wasm\) \[A10\]$/m,
  );
  assert.doesNotMatch(advisedCommands(bad.stderr)[1], /--webgpu-fold/);
  assertAdviceRuns(bad.stderr, { min: 2 });
});

test("generate: a number option that is no number or out of range names its rule on the first line, and the value it advises generates (G11)", {
  timeout: 300_000,
}, () => {
  const model = tinyModel();
  const gen = ["--model", model, "--prompt", "The", "--max-new-tokens", "2", "--backend", "cpu"];
  for (const [flag, value] of [
    ["--temperature", "NaN"],
    ["--seed", "NaN"],
    ["--top-k", "abc"],
    ["--temperature", "-1"],
    ["--top-p", "0"],
    ["--seed", "1.5"],
    ["--top-k", "2.5"],
  ]) {
    const r = node("generate.js", [...gen, flag, value]);
    assert.equal(r.status, 2, r.stderr);
    const first = r.stderr.split("\n")[0];
    assert.match(first, new RegExp(`^generate: ${flag} .*: run node dist/generate\\.js .* \\[G11\\]$`), r.stderr);
    for (const cmd of advisedCommands(first)) assert.ok(!` ${cmd} `.includes(` ${flag} ${value} `), cmd);
    for (const ran of assertAdviceRuns(first)) assert.match(ran.stdout, /^The/, ran.cmd);
  }
});

test("prepare and generate: a number that is out of range or no number, and a flag given twice, are refused with the value or the command that works, and it runs (D2, G11)", {
  timeout: 600_000,
}, () => {
  const work = tmpDir("tstrain-prepare-advice-");
  fs.writeFileSync(path.join(work, "c.jsonl"), corpusJsonl());
  const tok = writeTinyTokenizer(
    path.join(work, "tok"),
    corpusDocs().filter((d) => d.length > 0),
  );
  let n = 0;
  const prep = (extra: string[]) => {
    const base = ["--input", path.join(work, "c.jsonl"), "--tokenizer", tok, "--out", path.join(work, `mix-${n++}`)];
    return extra.includes("--val-fraction") ? [...base, ...extra] : [...base, "--val-fraction", "0.05", ...extra];
  };
  for (const [flag, value] of [
    ["--workers", "0"],
    ["--workers", "1.5"],
    ["--workers", "abc"],
    ["--val-fraction", "2"],
    ["--shard-tokens", "0"],
  ]) {
    const args = prep([flag, value]);
    const bad = node("prepare.js", args);
    assert.equal(bad.status, 2, bad.stderr);
    const first = bad.stderr.split("\n")[0];
    assert.match(first, new RegExp(`^prepare: ${flag} .*: run node dist/prepare\\.js .* \\[D2\\]$`));
    const [ran] = assertAdviceRuns(first);
    assert.match(ran.stdout, /^prepare: \S+: .* train tokens/m, ran.cmd);
  }
  // a flag given twice, in prepare and in generate: the command printed gives each once, and runs
  const model = tinyModel();
  const cases: Array<[file: string, args: string[], rule: string]> = [
    ["prepare.js", prep(["--workers", "2", "--workers", "1"]), "D2"],
    [
      "generate.js",
      ["--model", model, "--prompt", "The", "--max-new-tokens", "2", "--seed", "1", "--backend", "cpu", "--seed", "2"],
      "G11",
    ],
  ];
  for (const [file, args, rule] of cases) {
    const bad = node(file, args);
    const who = file.replace(/\.js$/, "");
    assertRefused(
      bad,
      new RegExp(
        `^${who}: (--workers 2 and --workers 1|--seed 1 and --seed 2) set the same flag: .*Give each once, as in (node dist/${file} .*) \\[${rule}\\]$`,
        "m",
      ),
    );
    const cmd = new RegExp(`as in (node dist/${file} .*) \\[${rule}\\]$`, "m").exec(bad.stderr)?.[1] ?? "";
    const ok = spawnSync("bash", ["-c", cmd], { cwd: ROOT, encoding: "utf8", timeout: 150_000 });
    assert.equal(ok.status, 0, `${cmd}: ${ok.stderr}`);
  }
  // an --out that holds a mix, or other files: the same command with --force, which moves them aside
  const held = prep([]);
  assert.equal(node("prepare.js", held).status, 0);
  const again = node("prepare.js", held);
  assertRefused(
    again,
    /^prepare: --out \S+ already holds a mix .*, or run node dist\/prepare\.js .* --force \(a replacement; .*\) \[D2\]$/m,
  );
  assertAdviceRuns(again.stderr);
  const other = path.join(work, "other");
  fs.mkdirSync(other);
  fs.writeFileSync(path.join(other, "notes.txt"), "mine");
  const full = node("prepare.js", [
    "--input",
    path.join(work, "c.jsonl"),
    "--tokenizer",
    tok,
    "--out",
    other,
    "--val-fraction",
    "0.05",
  ]);
  assertRefused(
    full,
    /^prepare: --out \S+other is not empty .*, or run node dist\/prepare\.js .* --force \(.*\) \[D2\]$/m,
  );
  assertAdviceRuns(full.stderr);
  // generate: a number flag without its value, and a --backend that is none
  const gen = ["--model", model, "--prompt", "The", "--max-new-tokens", "2", "--backend", "cpu"];
  for (const args of [
    [...gen, "--top-k"],
    [...gen.slice(0, -1), "metal"],
  ]) {
    const r = node("generate.js", args);
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr.split("\n")[0], /: run node dist\/generate\.js .* \(its default|the default\) \[G11\]$/);
    assertAdviceRuns(r.stderr);
  }
  // prepare's --input adds up: given twice it is two inputs, not a refusal
  const two = node("prepare.js", prep(["--input", path.join(work, "c.jsonl")]));
  assert.equal(two.status, 0, two.stderr);
});

test("what the first signal says is what the session does there: before the first step, while training, after the last step, and in a dry run (O3)", () => {
  const said = (p: Parameters<typeof setPhase>[0]) => {
    setPhase(p);
    return firstSignal("SIGTERM");
  };
  assert.match(said("setup").notice, /^SIGTERM: stopping before this session's first step: nothing is trained yet/);
  assert.match(
    said("training").notice,
    /^SIGTERM: finishing the current step, then saving and publishing a checkpoint/,
  );
  assert.match(
    said("finishing").notice,
    /^SIGTERM: the last step is done: finishing its checkpoint, the validation and the export/,
  );
  assert.deepEqual(said("saves-nothing"), {
    notice: "SIGTERM: a dry run or a benchmark saves nothing: exiting now",
    exitNow: true,
  });
  for (const p of ["setup", "training", "finishing"] as const) assert.equal(said(p).exitNow, false, p);
});

test("SIGTERM during the final validation says the run finishes, and it does: validation, export, exit 0 (O3)", {
  timeout: 600_000,
}, async () => {
  // many held-out windows, so that validation is still running when the signal comes
  const big = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 4 * 1024 * 1024 });
  const out = tmpDir("tstrain-term-validation-");
  const args = tinyRun(big.root, out, ["--vocab-size", "64", "--val-tokens", String(4 * 1024 * 1024), "--no-sample"]);
  const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    const child = spawn(process.execPath, [path.join(__dirname, "..", "main.js"), ...args], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    let sent = false;
    child.stdout.on("data", (d: Buffer) => {
      stdout += d;
      if (!sent && /^validation: /m.test(stdout)) {
        sent = true;
        child.kill("SIGTERM");
      }
    });
    child.stderr.on("data", (d: Buffer) => {
      stderr += d;
    });
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
  assert.match(r.stdout, /^validation: /m);
  assert.equal(r.code, 0, r.stderr + r.stdout.slice(-2000));
  assert.match(
    r.stderr,
    /^SIGTERM: the last step is done: finishing its checkpoint, the validation and the export, then exiting as a finished run/m,
  );
  assert.doesNotMatch(r.stderr, /saving and publishing a checkpoint/, "no checkpoint promised that is not made");
  assert.match(r.stdout, /^validation loss=/m);
  assert.ok(fs.existsSync(path.join(out, "final", "model.safetensors")), "exported");
});

test("every dependency with an install script is approved or denied in package.json's allowScripts (npm 11 blocks the rest and warns)", () => {
  const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8"));
  const lock = JSON.parse(fs.readFileSync(path.join(ROOT, "package-lock.json"), "utf8"));
  const scripted = Object.entries(lock.packages as Record<string, { hasInstallScript?: boolean }>)
    .filter(([k, v]) => k !== "" && v.hasInstallScript)
    .map(([k]) => k.replace(/^.*node_modules\//, ""));
  assert.ok(scripted.includes("webgpu"), "webgpu's postinstall is among them");
  const allow = (pkg.allowScripts ?? {}) as Record<string, boolean>;
  assert.deepEqual(
    scripted.filter((name) => typeof allow[name] !== "boolean"),
    [],
    "a dependency's install script npm would skip with a warning",
  );
});
