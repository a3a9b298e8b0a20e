// Bad input a careful user still gives (issue 53): each is refused at once, exit 2, one line naming the value and
// the rule, nothing written; and each refusal's advice is run here and works.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { tmpDir } from "./helpers/tmp";
import { tinyRun } from "./helpers/run";
import {
  advisedCommands,
  assertAdviceRuns,
  assertRefused,
  node,
  type Output,
  runAdvisedAsync,
  spawnOutput,
  tinyModel,
} from "./helpers/cli";
import { startTestHub } from "./helpers/hub";
import { writeSyntheticMix } from "./helpers/mix";
import { writeTinyTokenizer } from "./fixtures/data-synth";
import { corpusDocs, corpusJsonl } from "./fixtures/corpus-docs";
import { installDriverAdvice } from "../src/model/engine/webgpu/device";
import { parseArgs } from "../src/config";
import { loadNative, supportedIsas } from "../src/model/engine/native";

const mix = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 512 });

test("a --hub-url that is no http(s) URL is refused before any work, exit 2, naming it; the URL it asks for works (G10, G11)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-hub-url-");
  const bad = node("main.js", tinyRun(mix.root, out, ["--hub-url", "not a url", "--dry-run"]));
  assertRefused(
    bad,
    /^refused: --hub-url "not a url" is not an http\(s\) URL such as https:\/\/huggingface\.co: run node dist\/main\.js .* --hub-url https:\/\/huggingface\.co \(the Hugging Face Hub\), or node dist\/main\.js .* --hub-url embedded \(the local Hub\) \[G10\]$/m,
  );
  assert.deepEqual(fs.readdirSync(out), [], "nothing written in --out");
  // the advice: an http(s) URL, or embedded, each as the command printed
  assertAdviceRuns(bad.stderr, { min: 2 });
  // a URL with a password or a query: the same URL without them
  const creds = node(
    "main.js",
    tinyRun(mix.root, out, ["--hub-url", "https://me:pw@huggingface.co/?x=1", "--dry-run"]),
  );
  assertRefused(
    creds,
    /holds a user name or password, .*: run node dist\/main\.js .* --hub-url https:\/\/huggingface\.co \[G10\]$/m,
  );
  assertAdviceRuns(creds.stderr);
  const model = tinyModel();
  const gen = ["--model", model, "--prompt", "The", "--max-new-tokens", "2", "--backend", "cpu"];
  const g = node("generate.js", [...gen, "--hub-url", "not a url"]);
  assertRefused(
    g,
    /^generate: --hub-url "not a url" is not an http\(s\) URL such as https:\/\/huggingface\.co: run node dist\/generate\.js .* --hub-url https:\/\/huggingface\.co \[G11\]$/m,
  );
  assert.equal(g.stdout, "");
  const env = node("generate.js", gen, { ...process.env, HF_ENDPOINT: "huggingface.co" });
  assertRefused(env, /^generate: HF_ENDPOINT "huggingface\.co" is not an http\(s\) URL/m);
  assertAdviceRuns(g.stderr);
});

test("a --root that is a file is refused before any work, exit 2, naming it, also with --demo; a folder works (D1)", {
  timeout: 300_000,
}, () => {
  const dir = tmpDir("tstrain-root-file-");
  const file = path.join(dir, "not-a-folder");
  fs.writeFileSync(file, "x");
  const out = path.join(dir, "out");
  const demo = node("main.js", ["--demo", "--dry-run", "--root", file, "--out", out]);
  assertRefused(
    demo,
    /^refused: --root ".*not-a-folder" is a file, not a folder: --demo builds its mix in a folder there; name a folder \(or a path that does not exist yet\) \[D1\]$/m,
  );
  assert.ok(!fs.existsSync(out), "no --out made, no embedded Hub started");
  const plain = node("main.js", tinyRun(file, out, ["--dry-run"]));
  assertRefused(
    plain,
    /^refused: --root ".*not-a-folder" is a file, not a folder: a mix root is the folder prepare wrote; name a folder \[D1\]$/m,
  );
  assert.ok(!fs.existsSync(out));
  // the advice: a folder (the mix's)
  const ok = node("main.js", tinyRun(mix.root, out, ["--dry-run"]));
  assert.equal(ok.status, 0, ok.stderr);
});

test("a resume with another batch split names the change and the flags that work, and both work (C3)", {
  timeout: 600_000,
}, () => {
  const out = tmpDir("tstrain-geometry-");
  const first = node("main.js", tinyRun(mix.root, out, ["--world", "2", "--stop-after-steps", "4"]));
  assert.equal(first.status, 0, first.stderr);
  const ckpt = path.join(out, "ckpt", "checkpoint-4");
  assert.ok(fs.existsSync(path.join(ckpt, "cursor.json")), first.stdout + first.stderr);
  const resume = (extra: string[]) =>
    node("main.js", tinyRun(mix.root, out, ["--world", "2", "--resume", ckpt, ...extra]));
  const world = resume(["--world", "1"]);
  assertRefused(
    world,
    /^refused: resume refused: the batch changed: 4 → 2 sequences per step \(world 2 → 1\); \S+checkpoint-4 was trained at 4, and a resumed run must read the same sequences per step: run node dist\/main\.js .* --world 2 \(the run's split\), or node dist\/main\.js .* --world 1 .*--accum 2 \(this split, with that many micro-batches a step\) \[C3\]$/m,
  );
  const micro = resume(["--micro-batch", "1"]);
  assertRefused(
    micro,
    /^refused: resume refused: the batch changed: 4 → 2 sequences per step \(micro-batch 2 → 1\); .*: run node dist\/main\.js .* --micro-batch 2 \(the run's split\), or node dist\/main\.js .* --micro-batch 1 .*--accum 2 \(.*\) \[C3\]$/m,
  );
  // the advice, each way, as printed, on the run as it stopped: the split the run used, and the new split with --accum 2
  const pristine = tmpDir("tstrain-geometry-pristine-");
  fs.cpSync(out, pristine, { recursive: true });
  const before = () => {
    fs.rmSync(out, { recursive: true, force: true });
    fs.cpSync(pristine, out, { recursive: true });
  };
  for (const bad of [world, micro])
    for (const r of assertAdviceRuns(bad.stderr, { min: 2, before }))
      assert.match(r.stdout, /resume from \S+checkpoint-4: step 4/);
});

test("the webgpu refusal's driver advice is the command docs/webgpu.md shows, scripts/mesa-backports.sh, which adds bookworm-backports of the machine's own apt mirror, else says what to add by hand; the repository names no package registry's host (P1)", () => {
  const root = path.join(__dirname, "..", "..");
  const script = path.join(root, "scripts", "mesa-backports.sh");
  const advice = installDriverAdvice();
  const cmd = /or the software adapter on Debian 12: (\S+) \(as root/.exec(advice);
  assert.ok(cmd, advice);
  assert.equal(path.resolve(cmd[1]), script, "the advice's command is the script, by a path that works from here");
  const doc = fs.readFileSync(path.join(root, "docs", "webgpu.md"), "utf8");
  assert.match(doc, /^scripts\/mesa-backports\.sh +# as root/m, "docs/webgpu.md shows the same command");
  // the advised command, run (--dry-run, on a planted apt configuration): it reads the machine's mirror, or says
  // what to add by hand, and names no host of its own
  const etc = tmpDir("tstrain-apt-");
  fs.mkdirSync(path.join(etc, "sources.list.d"));
  const run = () => spawnSync(cmd[1], ["--dry-run", "--etc", etc], { encoding: "utf8" });
  let r = run();
  assert.equal(r.status, 2, r.stdout + r.stderr);
  assert.match(r.stderr, /name no Debian mirror: add the bookworm-backports suite \(component main\) of the mirror/);
  assert.doesNotMatch(r.stderr, /https?:\/\//, "no host of its own");
  fs.writeFileSync(
    path.join(etc, "sources.list"),
    "# old style\ndeb [arch=amd64] http://mirror.example/debian bookworm main\n",
  );
  r = run();
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(
    r.stdout,
    /\nTypes: deb\nURIs: http:\/\/mirror\.example\/debian\nSuites: bookworm-backports\nComponents: main\n/,
  );
  fs.writeFileSync(
    path.join(etc, "sources.list.d", "debian.sources"),
    "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n\nTypes: deb\nURIs: https://local.example/debian\nSuites: bookworm\n",
  );
  r = run();
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(
    r.stdout,
    /\nURIs: https:\/\/local\.example\/debian\nSuites: bookworm-backports\n/,
    "the deb822 sources first, the security archive skipped",
  );
  assert.match(
    r.stdout,
    /would run: apt-get update -qq && apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers libvulkan1$/m,
  );
  fs.writeFileSync(path.join(etc, "sources.list.d", "backports.sources"), "Types: deb\nSuites: bookworm-backports\n");
  r = run();
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /already list bookworm-backports/);
  assert.doesNotMatch(r.stdout, /would write/, "nothing added where the suite is listed");
  // no registry's host in any tracked file (the names are built here, so this file does not hold them either)
  const hosts = [
    ["deb", "debian", "org"],
    ["security", "debian", "org"],
    ["archive", "ubuntu", "com"],
    ["registry", "npmjs", "org"],
    ["pypi", "org"],
    ["files", "pythonhosted", "org"],
    ["crates", "io"],
    ["proxy", "golang", "org"],
  ].map((h) => h.join("."));
  const found = spawnSync("git", ["grep", "-n", "-i", "-F", ...hosts.flatMap((h) => ["-e", h])], {
    cwd: root,
    encoding: "utf8",
  });
  if (found.status === 128) return; // not a git checkout (a copied tree): nothing to search
  assert.equal(found.stdout, "", "a registry host named in the repository");
  assert.equal(found.status, 1, found.stderr);
});

test("a config file's table, dotted key, array of tables, non-finite number or TOML in a .json is refused in one line saying what to write; what it says works (G12)", () => {
  const dir = tmpDir("tstrain-config-refusals-");
  const cases: Array<[name: string, text: string, refusal: RegExp, fixed: string]> = [
    [
      "table.toml",
      "[train]\nlr = 0.001\n",
      /: \[train\] is a table, but the file is flat: .*move its settings to the top of the file and drop the \[train\] line \[G12\]$/,
      "lr = 0.001\n",
    ],
    [
      "dotted.toml",
      "micro.batch = 2\n",
      /: micro\.batch \(a dotted key\) is not a flag, and the file is flat: .*write micro-batch = 2 instead \[G12\]$/,
      "micro-batch = 2\n",
    ],
    [
      "array.toml",
      "[[x]]\nlr = 0.001\n",
      /: \[\[x\]\] is an array of tables, but the file is flat: .*drop it and write the settings at the top of the file \[G12\]$/,
      "lr = 0.001\n",
    ],
    [
      "inf.toml",
      "lr = inf\n",
      /: lr = Infinity is infinite \(inf, or a number too large for a double, as 1e400\), but lr takes a number: fix its value \[G12\]$/,
      "lr = 0.001\n",
    ],
    ["big.toml", "lr = 1e400\n", /: lr = Infinity is infinite .*but lr takes a number/, "lr = 0.001\n"],
    ["nan.toml", "lr = nan\n", /: lr = NaN is not a number \(nan\), but lr takes a number/, "lr = 0.001\n"],
  ];
  for (const [name, text, refusal, fixed] of cases) {
    const file = path.join(dir, name);
    fs.writeFileSync(file, text);
    assert.throws(
      () => parseArgs(["--config", file]),
      (e: Error) => {
        assert.match(e.message, refusal);
        assert.doesNotMatch(e.message, /\n|rename|closest/, "one line, no rename to an unrelated flag");
        return true;
      },
    );
    fs.writeFileSync(file, fixed); // the advice
    assert.doesNotThrow(() => parseArgs(["--config", file]), name);
  }
  const json = path.join(dir, "recipe.json");
  fs.writeFileSync(json, "micro-batch = 2\nlr = 0.001\n");
  assert.throws(
    () => parseArgs(["--config", json]),
    /: --config \S+recipe\.json holds TOML, not JSON \(a \.json file is read as JSON\): rename it to \S+recipe\.toml \[G12\]$/,
  );
  fs.renameSync(json, path.join(dir, "recipe.toml")); // the advice
  assert.equal(parseArgs(["--config", path.join(dir, "recipe.toml")]).config.microBatch, 2);
  fs.writeFileSync(json, '{"lr": 1,}');
  assert.throws(
    () => parseArgs(["--config", json]),
    /: --config \S+ is not valid JSON: line 1: [^\n]*\. Fix the file \[G12\]$/,
  );
});

test("--precision bf16 with a bf16 --isa this CPU lacks is refused before any work, exit 2; every command it advises works here (P1, P8)", {
  timeout: 300_000,
}, (t) => {
  const native = loadNative();
  if ("reason" in native) return t.skip(`native engine unavailable here: ${native.reason}`);
  const missing = (["amx", "avx512bf16"] as const).find((i) => !supportedIsas().includes(i));
  if (!missing) return t.skip("this CPU runs both bf16 kernels: nothing to refuse");
  const out = tmpDir("tstrain-bf16-isa-");
  const bad = node("main.js", tinyRun(mix.root, out, ["--precision", "bf16", "--isa", missing, "--dry-run"]));
  assertRefused(
    bad,
    new RegExp(
      `^refused: --isa ${missing} is not available: --isa ${missing}: this CPU has no ${missing} \\(it runs [^)]*\\); run node dist/main\\.js .* \\(--isa auto, here \\w+\\) \\[P1\\]$`,
      "m",
    ),
  );
  assert.deepEqual(fs.readdirSync(out), [], "nothing written in --out");
  // the advice: the command it gives (bf16, so no tfjs backend), run as printed
  assert.doesNotMatch(advisedCommands(bad.stderr)[0], new RegExp(`--isa ${missing}`));
  for (const r of assertAdviceRuns(bad.stderr)) assert.match(r.stdout, /"precision":"bf16"/);
});

const ROOT = path.join(__dirname, "..", "..");

/** `bash -c script` in the repository root, without blocking this process (a test Hub may be serving in it). */
function bash(script: string, env: NodeJS.ProcessEnv): Promise<Output> {
  return spawnOutput("bash", ["-c", script], { cwd: ROOT, env });
}

/** A shell word for `a`. */
const sh = (a: string) => `'${a.replace(/'/g, "'\\''")}'`;

test("a malformed HF_TOKEN with the embedded Hub is refused before any work, exit 2, without showing it; the command it gives (env -u HF_TOKEN, the same command) works (K5)", {
  timeout: 300_000,
}, async () => {
  const cases: Array<[token: string, why: RegExp]> = [
    [
      "hf_SECRETembedded0123\n",
      /holds a character an HTTP header cannot carry \(a line break, LF, as its last character\)/,
    ],
    [
      "hf_SECRET\r\nembedded0123",
      /holds a character an HTTP header cannot carry \(a carriage return, CR, at character 10 of 23\)/,
    ],
    ["ghp_SECRETembedded0123", /does not start with "hf_"/],
  ];
  for (const [token, why] of cases) {
    const out = tmpDir("tstrain-token-embedded-");
    const args = tinyRun(mix.root, out, ["--hub-url", "embedded", "--hub-repo", "local/tok", "--dry-run"]);
    const env = { ...process.env, HF_TOKEN: token };
    const bad = node("main.js", args, env);
    assertRefused(
      bad,
      /^refused: the Hub token \(HF_TOKEN\) .*; the embedded local Hub needs no token: run it without, as in env -u HF_TOKEN node dist\/main\.js .* \[K5\]$/m,
    );
    assert.match(bad.stderr, why);
    assert.ok(!bad.stderr.includes("SECRET"), "the token is shown");
    assert.deepEqual(fs.readdirSync(out), [], "nothing written in --out, no Hub started");
    // the advice, as printed: the same command without HF_TOKEN
    const cmd = / as in (env -u HF_TOKEN .*) \[K5\]$/m.exec(bad.stderr)?.[1] ?? "";
    assert.equal(cmd, `env -u HF_TOKEN node dist/main.js ${args.join(" ")}`);
    const ok = await bash(cmd, env);
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stdout, /"dry_run":true/);
  }
});

test("an HF_TOKEN holding a character an HTTP header cannot carry is refused before any work, exit 2, without showing it; the export it gives makes the run work (K5)", {
  timeout: 300_000,
}, async () => {
  const secret = "hf_SECRETremote0123456789";
  const th = await startTestHub({ token: secret });
  try {
    const out = tmpDir("tstrain-token-remote-");
    const args = tinyRun(mix.root, out, ["--hub-url", th.url, "--hub-repo", "me/tok", "--dry-run"]);
    for (const token of [`${secret}\n`, `${secret.slice(0, 9)}\n${secret.slice(9)}`, `\u2028${secret}`]) {
      const env = { ...process.env, HF_TOKEN: token };
      const bad = await bash(`exec ${sh(process.execPath)} dist/main.js ${args.map(sh).join(" ")}`, env);
      assertRefused(
        bad,
        /^refused: the Hub token \(HF_TOKEN\) holds a character an HTTP header cannot carry \([^)]*\), so no request can send it; set HF_TOKEN to the token alone \(hf_ then letters and digits\), as in export HF_TOKEN=.* \[K5\]$/m,
      );
      assert.ok(!bad.stderr.includes("SECRET"), "the token is shown");
      assert.deepEqual(fs.readdirSync(out), [], "nothing written in --out");
      // the advice, as printed, then the same command
      const fix = / as in (export HF_TOKEN=.*) \[K5\]$/m.exec(bad.stderr)?.[1] ?? "";
      assert.ok(fix, bad.stderr);
      const ok = await bash(`${fix} && exec ${sh(process.execPath)} dist/main.js ${args.map(sh).join(" ")}`, env);
      assert.equal(ok.status, 0, ok.stderr);
      assert.match(ok.stdout, /"dry_run":true/);
      assert.ok(!(ok.stdout + ok.stderr).includes(secret), "the token is shown");
    }
  } finally {
    await th.close();
  }
});

/** A path as a regular expression matching it literally. */
const lit = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

test("--hub-dir on a read-only filesystem is refused before any work, exit 2, naming the path and EROFS; a writable --hub-dir works (O1)", {
  timeout: 300_000,
}, (t) => {
  const ro = tmpDir("tstrain-ro-hub-");
  const m = spawnSync("mount", ["-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", ro], { encoding: "utf8" });
  if (m.status !== 0) {
    const why = `mount -t tmpfs failed (${(m.stderr || m.error?.message || "").trim()})`;
    if (process.env.TSTRAIN_REQUIRE_TMPFS === "1") assert.fail(`TSTRAIN_REQUIRE_TMPFS=1 but ${why}`);
    return t.skip(`no read-only filesystem to test on: ${why}`);
  }
  try {
    const out = tmpDir("tstrain-ro-hub-out-");
    const hubDir = path.join(ro, "hub");
    const hub = ["--hub-url", "embedded", "--hub-repo", "local/ro", "--dry-run"];
    const bad = node("main.js", tinyRun(mix.root, out, [...hub, "--hub-dir", hubDir]));
    assertRefused(
      bad,
      new RegExp(
        `^refused: --hub-dir ${lit(hubDir)} cannot be created: it is on a read-only filesystem \\(EROFS\\); the embedded local Hub stores its files there\\. Choose a writable folder for --hub-dir \\[O1\\]$`,
        "m",
      ),
    );
    assert.doesNotMatch(bad.stdout, /embedded local Hub at/, "no Hub started");
    assert.deepEqual(fs.readdirSync(out), [], "nothing written in --out");
    // the advice: a writable folder
    const ok = node("main.js", tinyRun(mix.root, out, [...hub, "--hub-dir", path.join(out, "hub-here")]));
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stdout, /"dry_run":true/);
  } finally {
    spawnSync("umount", [ro]);
  }
});

test("a refused run leaves no empty <out>/hub it made, and keeps the Hub folder that was there; the start it advises works (O1, L8)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-refused-hub-");
  const hub = ["--hub-url", "embedded", "--hub-repo", "local/refused"];
  const missing = path.join(out, "ckpt", "checkpoint-4");
  const refused = () => node("main.js", tinyRun(mix.root, out, [...hub, "--resume", missing]));
  const bad = refused();
  assertRefused(
    bad,
    /^refused: resume refused: --resume \S+checkpoint-4 does not exist\. \S+ holds no checkpoint; name a checkpoint folder \(RUN\/ckpt\/checkpoint-N\), or run node dist\/main\.js .* --resume auto \(to continue from the Hub\), or node dist\/main\.js .* \(a fresh start\) \[C3\]$/m,
  );
  assert.doesNotMatch(advisedCommands(bad.stderr)[1], /--resume/, "a fresh start has no --resume");
  assert.ok(!fs.existsSync(path.join(out, "hub")), "an empty hub/ is left");
  // a Hub folder that was there before the refused run is kept, empty or not
  fs.mkdirSync(path.join(out, "hub", "earlier"), { recursive: true });
  fs.writeFileSync(path.join(out, "hub", "earlier.txt"), "saved before");
  assert.equal(refused().status, 2);
  assert.ok(fs.existsSync(path.join(out, "hub", "earlier")), "a folder saved before is removed");
  assert.equal(fs.readFileSync(path.join(out, "hub", "earlier.txt"), "utf8"), "saved before");
  // the advice, as printed, each in the state refused (--resume auto finds nothing on the Hub: a fresh start)
  fs.rmSync(path.join(out, "hub"), { recursive: true });
  const before = () => {
    for (const d of ["ckpt", "hub", "final", "resume"]) fs.rmSync(path.join(out, d), { recursive: true, force: true });
  };
  for (const r of assertAdviceRuns(bad.stderr, { min: 2, before })) assert.match(r.stdout, /^step 8\/8 /m);
});

/**
 * A run on a mix with a real tokenizer (vocab 320), stopped at step 8 of 12 with checkpoints 4 and 8 on disk:
 * made once, copied by each test that damages it.
 */
let stoppedRun: { root: string; out: string; args: string[] } | null = null;
function stoppedRunCopy(): { root: string; out: string; args: string[] } {
  if (!stoppedRun) {
    const work = tmpDir("tstrain-stopped-run-");
    const tok = writeTinyTokenizer(
      path.join(work, "tok"),
      corpusDocs().filter((d) => d.length > 0),
    );
    fs.writeFileSync(path.join(work, "c.jsonl"), corpusJsonl());
    const root = path.join(work, "mix");
    const p = node("prepare.js", [
      "--input",
      path.join(work, "c.jsonl"),
      "--tokenizer",
      tok,
      "--out",
      root,
      "--workers",
      "1",
      "--val-fraction",
      "0.05",
    ]);
    assert.equal(p.status, 0, p.stderr);
    const out = path.join(work, "run");
    const args = tinyRun(root, out, ["--vocab-size", "320", "--max-steps", "12"]);
    const r = node("main.js", [...args, "--stop-after-steps", "8"]);
    assert.equal(r.status, 0, r.stderr);
    for (const n of [4, 8]) assert.ok(fs.existsSync(path.join(out, "ckpt", `checkpoint-${n}`)), r.stdout);
    stoppedRun = { root, out, args };
  }
  const out = tmpDir("tstrain-stopped-copy-");
  fs.cpSync(stoppedRun.out, out, { recursive: true });
  return {
    root: stoppedRun.root,
    out,
    args: tinyRun(stoppedRun.root, out, ["--vocab-size", "320", "--max-steps", "12"]),
  };
}

/** The session records of a run folder, in order. */
function sessionEvents(out: string): Array<{ event: string; session: string; ended?: string }> {
  return fs
    .readFileSync(path.join(out, "sessions.jsonl"), "utf8")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
}

test("a checkpoint whose model.safetensors is truncated is refused naming the file's path, and the session's record ends; the checkpoint it advises resumes (K2, B5)", {
  timeout: 600_000,
}, () => {
  const run = stoppedRunCopy();
  const ck8 = path.join(run.out, "ckpt", "checkpoint-8");
  const file = path.join(ck8, "model.safetensors");
  fs.truncateSync(file, fs.statSync(file).size - 100);
  fs.rmSync(path.join(ck8, "manifest.json")); // read unchecked, as --resume-without-manifest asks
  const before = sessionEvents(run.out).length;
  const bad = node("main.js", [...run.args, "--resume", ck8, "--resume-without-manifest"]);
  assertRefused(
    bad,
    new RegExp(
      `^refused: checkpoint model\\.safetensors at ${lit(file)} is not a valid safetensors file \\(.*truncated.*\\): the checkpoint is damaged\\. Resume from another checkpoint: run node dist/main\\.js .* --resume \\S+checkpoint-4 \\(the newest other one\\) \\[K2\\]$`,
      "m",
    ),
  );
  const events = sessionEvents(run.out).slice(before);
  assert.deepEqual(
    events.map((e) => e.event),
    ["start", "end"],
    "the session that started has its end record",
  );
  assert.equal(events[1].session, events[0].session);
  assert.equal(events[1].ended, "refused");
  // the advice, as printed: the same command, resuming from the checkpoint it names
  const [ok] = assertAdviceRuns(bad.stderr);
  assert.match(ok.stdout, /resume from \S+checkpoint-4: step 4/);
});

test("generate refuses a checkpoint that fails its manifest, naming the file (K7), and prints nothing of a refused prompt; the folder it advises generates (G11, K7)", {
  timeout: 600_000,
}, () => {
  const run = stoppedRunCopy();
  const ck8 = path.join(run.out, "ckpt", "checkpoint-8");
  const file = path.join(ck8, "model.safetensors");
  const bytes = fs.readFileSync(file);
  bytes[bytes.length - 5] ^= 1; // one bit of one weight
  fs.writeFileSync(file, bytes);
  const gen = (model: string, prompt = "The") =>
    node("generate.js", ["--model", model, "--prompt", prompt, "--max-new-tokens", "3", "--backend", "cpu"]);
  const bad = gen(ck8);
  assertRefused(
    bad,
    /^generate: --model \S+checkpoint-8: model\.safetensors has sha256 [0-9a-f]{12}…, manifest\.json says [0-9a-f]{12}… \(its bytes changed after it was written\); the checkpoint cannot be trusted\. Generate from another folder: run node dist\/generate\.js .*--model \S+checkpoint-4 \(the newest other checkpoint\) \[K7\]$/m,
  );
  assert.equal(bad.stdout, "", "nothing generated");
  // the advice, as printed: the folder it names
  const [ok] = assertAdviceRuns(bad.stderr);
  assert.match(ok.stdout, /^The/);
  const other = /--model (\S+checkpoint-4)/.exec(ok.cmd)?.[1] ?? "";
  // a prompt longer than the model's 16 positions is refused, and not printed
  const long = gen(other, "The cat sat on the mat. ".repeat(8));
  assert.equal(long.status, 2, long.stderr);
  assert.match(long.stderr, /^generate: the prompt is \d+ tokens, the model has 16 positions: shorten it \[G11\]$/m);
  assert.equal(long.stdout, "", "the refused prompt is printed");
});

test("a malformed HF_TOKEN is refused by prepare's hf:// input and generate's hf:// model before any request, exit 2, without showing it; the export it gives makes both work (K5)", {
  timeout: 300_000,
}, async () => {
  const secret = "hf_SECRETreads0123456789";
  const th = await startTestHub({ token: secret });
  try {
    const work = tmpDir("tstrain-token-reads-");
    fs.mkdirSync(path.join(work, "corpus"));
    fs.writeFileSync(path.join(work, "corpus", "c.jsonl"), corpusJsonl());
    const corpus = th.store({ repo: "me/corpus", token: secret });
    await corpus.ensureRepo();
    await corpus.uploadFolder(path.join(work, "corpus"), "data", "the corpus");
    const models = th.store({ repo: "me/models", token: secret });
    await models.ensureRepo();
    await models.uploadFolder(tinyModel(), "final", "a model");
    const tok = writeTinyTokenizer(
      path.join(work, "tok"),
      corpusDocs().filter((d) => d.length > 0),
    );
    const prepare = [
      "dist/prepare.js",
      "--input",
      "hf://datasets/me/corpus/data/*.jsonl",
      "--tokenizer",
      tok,
      "--hub-url",
      th.url,
      "--out",
      path.join(work, "mix"),
      "--workers",
      "1",
    ];
    const generate = [
      "dist/generate.js",
      "--model",
      "hf://datasets/me/models/final",
      "--prompt",
      "The",
      "--max-new-tokens",
      "2",
      "--backend",
      "cpu",
      "--hub-url",
      th.url,
    ];
    for (const [cmd, who] of [
      [prepare, "prepare"],
      [generate, "generate"],
    ] as const) {
      const line = `exec ${sh(process.execPath)} ${cmd.map(sh).join(" ")}`;
      const env = { ...process.env, HF_TOKEN: `${secret}\n` };
      const bad = await bash(line, env);
      assertRefused(
        bad,
        new RegExp(
          `^${who}: the Hub token \\(HF_TOKEN\\) holds a character an HTTP header cannot carry \\(a line break, LF, as its last character\\), so no request can send it; set HF_TOKEN to the token alone \\(hf_ then letters and digits\\), as in export HF_TOKEN=.* \\[K5\\]$`,
          "m",
        ),
      );
      assert.ok(!bad.stderr.includes("SECRET"), "the token is shown");
      assert.equal(bad.stdout, "");
      // the advice, as printed, then the same command
      const fix = / as in (export HF_TOKEN=.*) \[K5\]$/m.exec(bad.stderr)?.[1] ?? "";
      const ok = await bash(`${fix} && ${line}`, env);
      assert.equal(ok.status, 0, ok.stderr);
      assert.ok(!(ok.stdout + ok.stderr).includes(secret), "the token is shown");
    }
    assert.ok(fs.existsSync(path.join(work, "mix", "manifest.json")), "prepare wrote the mix");
    // a token without hf_ can be dropped for a read: prepare and generate say so
    const noHf = await bash(`exec ${sh(process.execPath)} ${generate.map(sh).join(" ")}`, {
      ...process.env,
      HF_TOKEN: "ghp_SECRET",
    });
    assertRefused(
      noHf,
      /^generate: the Hub token \(HF_TOKEN\) does not start with "hf_", so the Hub client would refuse it; set HF_TOKEN to a Hugging Face access token, or unset it \(unset HF_TOKEN\) to read a public repo \[K5\]$/m,
    );
  } finally {
    await th.close();
  }
});

test("a resume's prior loss is the loss of the checkpoint's own step, the one its CKPT line printed, not the last logged (K2)", {
  timeout: 300_000,
}, () => {
  const out = tmpDir("tstrain-prior-loss-");
  // logged at 3 and 6, and at 8 as the window 7-8's mean; the checkpoint is step 8's own loss
  const args = tinyRun(mix.root, out, [
    "--log-every",
    "3",
    "--max-steps",
    "12",
    "--hub-url",
    "embedded",
    "--hub-repo",
    "local/prior",
  ]);
  const first = node("main.js", [...args, "--stop-after-steps", "8"]);
  assert.equal(first.status, 0, first.stderr);
  const own = /^CKPT 8 .* loss=(\S+)/m.exec(first.stdout)?.[1];
  const logged = /^step 8\/12 loss=(\S+)/m.exec(first.stdout)?.[1];
  assert.ok(own && logged, first.stdout);
  assert.notEqual(Number(own).toFixed(4), logged, "the window's mean differs from step 8's own loss here");
  const resumed = node("main.js", [...args, "--resume", "auto"]);
  assert.equal(resumed.status, 0, resumed.stderr);
  assert.match(resumed.stdout, new RegExp(`resume from \\S+checkpoint-8: step 8, prior loss ${lit(own)} \\(`));
});

test("--resume auto where the Hub holds no checkpoint but ckpt/ does is refused naming the local ones; the command it gives resumes from them, not --resume auto (R1)", {
  timeout: 600_000,
}, async () => {
  const out = tmpDir("tstrain-hub-lost-");
  const args = tinyRun(mix.root, out, ["--hub-url", "embedded", "--hub-repo", "local/lost"]);
  const first = node("main.js", [...args, "--stop-after-steps", "4"]);
  assert.equal(first.status, 0, first.stderr);
  fs.rmSync(path.join(out, "hub"), { recursive: true }); // the Hub's folder gone: it holds nothing of this run
  const bad = node("main.js", [...args, "--resume", "auto"]);
  assertRefused(
    bad,
    /^refused: --resume auto found no checkpoint on local\/lost \(the Hub lost what this run pushed there, or never got it: .*\), but \S+ckpt holds checkpoint-4\. Resume from the newest local one: node dist\/main\.js .*--resume \S+checkpoint-4; or choose another --out\. \[R1\]$/m,
  );
  const cmd = /Resume from the newest local one: (node dist\/main\.js .*?); or choose/.exec(bad.stderr)?.[1] ?? "";
  assert.doesNotMatch(cmd, /--resume auto/, "the advice is not the command just refused");
  const ok = await bash(cmd.replace(/^node /, `exec ${sh(process.execPath)} `), process.env);
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /resume from \S+checkpoint-4: step 4/);
});

test("--resume auto on a Hub whose newer folder has no manifest (R3), or whose pointer is gone while its folders stay (R2), is refused with the command that resumes; each runs as printed", {
  timeout: 600_000,
}, async () => {
  const th = await startTestHub({});
  try {
    const out = tmpDir("tstrain-hub-unproven-");
    const run = (repo: string, extra: string[]) =>
      bash(
        `exec ${sh(process.execPath)} dist/main.js ${tinyRun(mix.root, out, [
          "--hub-url",
          th.url,
          "--hub-repo",
          repo,
          "--no-sample",
          ...extra,
        ])
          .map(sh)
          .join(" ")}`,
        process.env,
      );
    const first = await run("me/r3", ["--stop-after-steps", "4"]);
    assert.equal(first.status, 0, first.stderr);
    // a folder of step 8 on the Hub without its manifest: what a run that is not this one, or a lost commit, leaves
    const unproven = tmpDir("tstrain-hub-unproven-ck-");
    fs.cpSync(path.join(out, "ckpt", "checkpoint-4"), unproven, { recursive: true });
    fs.rmSync(path.join(unproven, "manifest.json"));
    await th.store({ repo: "me/r3" }).uploadFolder(unproven, "ckpt/checkpoint-8", "unproven");
    const r3 = await run("me/r3", ["--resume", "auto"]);
    assertRefused(
      r3,
      /^refused: latest\.json on me\/r3 points at step 4 .* has no manifest\.json .*, run node dist\/main\.js .* --resume auto --resume-ignore-unproven \[R3\]$/m,
    );
    const [cmd3] = advisedCommands(r3.stderr);
    const ok3 = await runAdvisedAsync(cmd3);
    assert.equal(ok3.status, 0, ok3.stderr);
    assert.match(ok3.stdout, /resume from \S+checkpoint-4: step 4/);
    // another repo holding the folder of step 4 (no manifest there) and no latest.json: the local copy resumes
    await th.store({ repo: "me/r2" }).ensureRepo();
    await th.store({ repo: "me/r2" }).uploadFolder(unproven, "ckpt/checkpoint-4", "no pointer");
    fs.rmSync(path.join(out, "ckpt", "checkpoint-8"), { recursive: true });
    const r2 = await run("me/r2", ["--resume", "auto"]);
    assertRefused(
      r2,
      /^refused: --resume auto found no latest\.json on me\/r2, but the repo holds 1 checkpoint folder\(s\) \(ckpt\/checkpoint-4\)\..* Resume from the newest local copy: run node dist\/main\.js .* --resume \S+checkpoint-4; or start the run over in a new --hub-repo \[R2\]$/m,
    );
    const [cmd2] = advisedCommands(r2.stderr);
    assert.doesNotMatch(cmd2, /--resume auto/);
    const ok2 = await runAdvisedAsync(cmd2);
    assert.equal(ok2.status, 0, ok2.stderr);
    assert.match(ok2.stdout, /resume from \S+checkpoint-4: step 4/);
  } finally {
    await th.close();
  }
});
