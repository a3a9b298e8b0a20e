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
import { assertRefused, node, runAdvised, tinyModel } from "./helpers/cli";
import { adviceAfter } from "./helpers/survive";
import { writeSyntheticMix } from "./helpers/mix";
import { writeTinyTokenizer } from "./fixtures/data-synth";
import { corpusDocs, corpusJsonl } from "./fixtures/corpus-docs";
import { FLAGS, parseArgs } from "../src/config";
import { bf16Support, loadNative, supportedIsas } from "../src/model/engine/native";
import { BF16_EMULATION_SPEED } from "../src/model/engine/bench-rates";
import { firstSignal, setPhase } from "../src/session/stop";

// room for the defaults a refusal may advise: seq 1024 at the tiny run's 8 steps of 2 sequences, and held-out windows
const mix = writeSyntheticMix({ vocab: 64, trainTokens: 64 * 1024, valTokens: 4096 });
const ROOT = path.join(__dirname, "..", "..");

/** The tiny run's dry run on the synthetic mix, with `extra` set (a flag given again replaces the tiny run's). */
const dry = (out: string, extra: string[] = []) =>
  tinyRun(mix.root, out, ["--vocab-size", "64", "--dry-run", ...extra]);

/** Every `--flag value` (or bare `--flag`) in a piece of advice. */
function flagsIn(advice: string): string[] {
  const out: string[] = [];
  for (const m of advice.matchAll(/(--[a-z][a-z0-9-]*)(?: ([^\s,;()]+))?/g)) {
    const spec = FLAGS.find((f) => f.flag === m[1].slice(2));
    if (spec && spec.kind !== "bool" && m[2] !== undefined) out.push(m[1], m[2]);
    else out.push(m[1]);
  }
  return out;
}

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

test("a resume with another --seq-len or horizon is refused naming the run's value as a flag, and that flag resumes (C3, P5)", {
  timeout: 600_000,
}, () => {
  const out = tmpDir("tstrain-plan-resume-");
  const first = node("main.js", tinyRun(mix.root, out, ["--vocab-size", "64", "--stop-after-steps", "4"]));
  assert.equal(first.status, 0, first.stderr);
  const ck4 = path.join(out, "ckpt", "checkpoint-4");
  const cases: Array<[extra: string[], refusal: RegExp]> = [
    [
      ["--seq-len", "32"],
      /^refused: resume refused: \S+ cursor seq_len=16 != current 32; .*: resume with (--seq-len 16), the run's \[C3\]$/m,
    ],
    [
      ["--max-steps", "12"],
      /^refused: resume refused: the checkpoint's horizon is 8 steps but this plan has 12; .*Resume with (--max-steps 8) \(the checkpoint's horizon\) \[P5\]$/m,
    ],
  ];
  for (const [extra, refusal] of cases) {
    const bad = node("main.js", tinyRun(mix.root, out, ["--vocab-size", "64", "--resume", ck4, ...extra]));
    assertRefused(bad, refusal);
    const fix = refusal.exec(bad.stderr)?.[1] ?? "";
    const copy = tmpDir("tstrain-plan-resume-copy-");
    fs.cpSync(out, copy, { recursive: true });
    const resume = ["--vocab-size", "64", "--resume", path.join(copy, "ckpt", "checkpoint-4")];
    const ok = node("main.js", tinyRun(mix.root, copy, [...resume, ...extra, ...flagsIn(fix)]));
    assert.equal(ok.status, 0, `${extra.join(" ")} -> ${fix}: ${ok.stderr}`);
    assert.match(ok.stdout, /resume from \S+checkpoint-4: step 4/);
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
    /^refused: --demo --root \S+: the folder holds 1 entry \(notes\.txt\) but neither a prepared mix \(manifest\.json\) nor the demo's data \(demo\.json\), and --demo would write its data among them\. Pass --root (\S+demo-data) for a new folder of the demo's own \[D1\]$/m,
  );
  const root = / Pass --root (\S+) for a new folder/.exec(bad.stderr)?.[1] ?? "";
  const ok = node("main.js", ["--demo", "--root", root, "--out", path.join(mine, "run"), "--dry-run"], env);
  assert.equal(ok.status, 0, ok.stderr);
  assert.deepEqual(fs.readdirSync(mine), ["notes.txt"], "nothing written among the user's files");
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
          `^refused: --isa ${isa} is a bf16 kernel \\(.*\\), and this run computes in fp32.*: pass --isa \\w+ for fp32 products.* \\[P8\\]$`,
          "m",
        ),
      );
      assert.deepEqual(fs.readdirSync(out), [], "nothing written");
      // the advice: each alternative, run on the same CPU
      const advice = /fp32.*?: (pass --isa .*) \[P8\]$/m.exec(bad.stderr)?.[1] ?? "";
      if (played === "avx2,portable")
        assert.doesNotMatch(advice, /avx512|--precision bf16/, `${name}: nothing it cannot run`);
      const ways = advice.split(", or ");
      assert.ok(ways.length >= 1, bad.stderr);
      for (const way of ways) {
        const r = node("main.js", dry(out, ["--isa", isa, ...flagsIn(way)]), env);
        assert.equal(r.status, 0, `${name}, --isa ${isa}, ${way}: ${r.stderr}`);
      }
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
  for (const [h, want] of [
    ["100", "try --hidden 90 or --hidden 108"],
    ["99", "try --hidden 90 or --hidden 108"],
    ["20", "try --hidden 36, the narrowest width there is"],
  ]) {
    const out = tmpDir("tstrain-hidden-");
    const bad = node("main.js", dry(out, ["--hidden", h]));
    assertRefused(bad, new RegExp(`^refused: --hidden ${h} .*; ${want} \\[M2\\]$`, "m"));
    for (const w of [...bad.stderr.matchAll(/--hidden (\d+)/g)].map((m) => m[1]).filter((w) => w !== h)) {
      const ok = node("main.js", dry(out, ["--hidden", w]));
      assert.equal(ok.status, 0, `--hidden ${w}: ${ok.stderr}`);
    }
  }
});

test("a plan the mix cannot hold (a step larger than the mix, a window longer than its held-out part, more steps than it covers) advises the flags that fit it, and they run (D6, D7, P5)", {
  timeout: 300_000,
}, () => {
  const cases: Array<[extra: string[], refusal: RegExp]> = [
    [
      ["--micro-batch", "100000"],
      /^refused: dataset too small for the plan: .*the epoch never wraps: run the same command with (--.*) \[D6\]$/m,
    ],
    [
      ["--seq-len", "100000", "--max-steps", "3"],
      /^refused: .*no full window of seq_len 100000: run the same command with (--.*) \[D4\]$/m,
    ],
    [["--max-steps", "100000"], /^refused: dataset too small .*: run the same command with (--max-steps \d+) \[D6\]$/m],
    [
      ["--max-steps", "0", "--tokens", "10"],
      /^refused: --tokens 10 is less than one step of 32 tokens .*: pass (--tokens 32) \(one step\) or more \[P5\]$/m,
    ],
  ];
  for (const [extra, refusal] of cases) {
    const out = tmpDir("tstrain-fit-");
    const bad = node("main.js", dry(out, extra));
    assertRefused(bad, refusal);
    const fix = refusal.exec(bad.stderr)?.[1] ?? "";
    assert.doesNotMatch(fix, /--tokens\/|lower/, "a command, not a hint");
    const ok = node("main.js", dry(out, [...extra, ...flagsIn(fix)]));
    assert.equal(ok.status, 0, `${extra.join(" ")} + ${fix}: ${ok.stderr}`);
  }
});

test("a --vocab-size below the mix tokenizer's ids advises a --vocab-size that holds them, and it runs (D1)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-vocab-small-");
  const bad = node("main.js", dry(out, ["--vocab-size", "10"]));
  assertRefused(
    bad,
    /^refused: the mix's tokenizer has 64 ids but the model's vocabulary is 10 \(--vocab-size 10\): .*Pass --vocab-size 64 .*, or rebuild the mix with a tokenizer of at most 10 ids \[D1\]$/m,
  );
  const ok = node("main.js", dry(out, flagsIn(/Pass (--vocab-size \d+)/.exec(bad.stderr)?.[1] ?? "")));
  assert.equal(ok.status, 0, ok.stderr);
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
        `^refused: ${bad[0]}[: ].*[:;] pass (${bad[0]} \\S+)( or ${bad[0]} \\S+)?( \\(.*\\))? \\[G10\\]$`,
        "m",
      ),
    );
    const ways = [...r.stderr.matchAll(new RegExp(`(${bad[0]}) (-?[0-9.e]+)`, "g"))]
      .map((m) => [m[1], m[2]])
      .filter(([, v]) => v !== bad[1]);
    assert.ok(ways.length > 0, r.stderr);
    for (const way of ways) {
      const ok = node("main.js", dry(out, [...state, ...way]));
      assert.equal(ok.status, 0, `${bad.join(" ")} -> ${way.join(" ")}: ${ok.stderr}`);
    }
  }
  const big = node("main.js", dry(tmpDir("tstrain-range-big-"), ["--max-steps", "1e30"]));
  assert.match(big.stderr, /--max-steps 1e30 is too large: a whole number is counted exactly up to 9007199254740991/);
  assert.doesNotMatch(big.stderr, /must be a whole number/);
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
    /^refused: --isa avx2 chooses a kernel of the built-in GEMM, and --gemm openblas does not run it, so it would be ignored: pass --gemm builtin to use it, or --isa auto \(the default\) for OpenBLAS \[P1\]$/m,
  );
  const builtin = node("main.js", dry(tmpDir("tstrain-isa-builtin-"), ["--gemm", "builtin", "--isa", "avx2"]));
  if (supportedIsas().includes("avx2")) assert.equal(builtin.status, 0, builtin.stderr);
  for (const [flags, backend] of [
    [["--isa", "avx2"], "wasm"],
    [["--gemm", "openblas"], "cpu"],
  ] as const) {
    const out = tmpDir("tstrain-isa-backend-");
    const bad = node("main.js", dry(out, [...flags, "--backend", backend]));
    assertRefused(
      bad,
      new RegExp(
        `^refused: ${flags.join(" ")} chooses the native engine's matrix products, and --backend ${backend} does not run that engine, so it would be ignored: pass --backend native to use it, or (--\\S+ \\S+) \\(the default\\) for --backend ${backend} \\[P1\\]$`,
        "m",
      ),
    );
    const back = /, or (--\S+ \S+) \(the default\)/.exec(bad.stderr)?.[1] ?? "";
    const ok = node("main.js", dry(out, [...flags, "--backend", backend, ...back.split(" ")]));
    assert.equal(ok.status, 0, ok.stderr);
    if (flags[1] === "avx2" && supportedIsas().includes("avx2")) {
      const native = node("main.js", dry(out, [...flags, "--backend", "native"]));
      assert.equal(native.status, 0, native.stderr);
    }
  }
});

test("--webgpu-fold with a backend other than webgpu is refused, since it would be ignored, and both fixes run (A10)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-fold-backend-");
  const bad = node("main.js", dry(out, ["--webgpu-fold", "host", "--backend", "wasm"]));
  assertRefused(
    bad,
    /^refused: --webgpu-fold host chooses where the webgpu engine folds each micro-batch's gradient, and --backend wasm always folds on the host, so it would be ignored: pass --backend webgpu to use it, or drop --webgpu-fold \[A10\]$/m,
  );
  const dropped = node("main.js", dry(out, ["--backend", "wasm"]));
  assert.equal(dropped.status, 0, dropped.stderr);
  const gpu = node("main.js", dry(out, ["--webgpu-fold", "host", "--backend", "webgpu"]));
  assert.equal(gpu.status, 0, gpu.stderr);
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
    assert.match(first, new RegExp(`^generate: ${flag} .*: pass ${flag} (\\S+).* \\[G11\\]$`), r.stderr);
    const fix = new RegExp(`pass ${flag} ([^\\s,]+)`).exec(first)?.[1] ?? "";
    const ok = node("generate.js", [...gen.filter((a) => a !== flag), flag, fix]);
    assert.equal(ok.status, 0, `${flag} ${fix}: ${ok.stderr}`);
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
    assert.match(first, new RegExp(`^prepare: ${flag} .*: pass ${flag} (\\S+).* \\[D2\\]$`));
    const fix = new RegExp(`pass ${flag} (\\S+)`).exec(first)?.[1] ?? "";
    const ok = node("prepare.js", [...args.slice(0, -2), flag, fix]);
    assert.equal(ok.status, 0, `${flag} ${value} -> ${fix}: ${ok.stderr}`);
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
