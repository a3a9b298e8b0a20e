/**
 * The README's quick start runs as written: every command of its fenced `sh` blocks, except `npm ci` and
 * `npm test` themselves (this test is part of the tests, after the install). The demo is shortened with
 * `--max-steps` (every `node dist/main.js … --demo` command, so the resume sees the same plan), and a
 * checkpoint the README names is mapped to the same place in the shorter run (the demo checkpoints every tenth
 * of its steps). The commands run in a temp folder holding a link to dist/, so `.demo/` lands there, not in the
 * checkout.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { parseArgs, planSteps } from "../src/config";
import { tmpDir } from "./helpers/tmp";

const ROOT = path.join(__dirname, "..", "..");
const README = path.join(ROOT, "README.md");
const SHORT_STEPS = 20;

/** The commands of the fenced `sh` blocks under `## Quick start`, comments dropped, `\` continuations joined. */
export function quickStartCommands(readme: string): string[] {
  const start = readme.search(/^## Quick start\s*$/m);
  assert.ok(start >= 0, "README.md has a '## Quick start' section");
  const rest = readme.slice(start + 1);
  const end = rest.search(/^## /m);
  const section = end < 0 ? rest : rest.slice(0, end);
  const cmds: string[] = [];
  for (const block of section.matchAll(/^```sh\n([\s\S]*?)^```$/gm)) {
    const joined = block[1].replace(/\s*\\\n\s*/g, " ");
    for (const raw of joined.split("\n")) {
      const line = raw.replace(/(^|\s)#\s.*$/, "").trim();
      if (line) cmds.push(line);
    }
  }
  return cmds;
}

/** What must not run inside a test: the install and the whole test suite. */
const NOT_HERE = /^npm (ci|test)\b/;

/** The demo's arguments in a `node dist/main.js` command line (none when it is not a demo command). */
function demoArgs(cmd: string): string[] | null {
  const m = /^node dist\/main\.js\s+(.*)$/.exec(cmd);
  if (!m) return null;
  const args = m[1].split(/\s+/);
  return args.includes("--demo") ? args : null;
}

/** A command as the test runs it: a shorter demo, and the README's checkpoint names mapped onto it. */
export function shortened(cmd: string, steps: number): string {
  const args = demoArgs(cmd);
  if (args) return args.includes("--max-steps") ? cmd : `${cmd} --max-steps ${steps}`;
  const full = planSteps(parseArgs(["--demo"]).config);
  const short = planSteps(parseArgs(["--demo", "--max-steps", String(steps)]).config);
  return cmd.replace(/ckpt\/checkpoint-(\d+)/g, (_, n: string) => {
    const k = Number(n) / full.ckptEvery;
    assert.ok(Number.isInteger(k), `checkpoint-${n} is not one the demo writes (every ${full.ckptEvery} steps)`);
    return `ckpt/checkpoint-${k * short.ckptEvery}`;
  });
}

interface Ran {
  cmd: string;
  status: number | null;
  output: string;
}

/** Runs each command in `cwd` (npm's in the checkout) and stops at the first that fails. */
function runAll(cmds: string[], cwd: string): Ran[] {
  const ran: Ran[] = [];
  for (const cmd of cmds) {
    const r = spawnSync("bash", ["-c", cmd], {
      cwd: cmd.startsWith("npm ") ? ROOT : cwd,
      encoding: "utf8",
      timeout: 480_000,
      env: { ...process.env, HF_TOKEN: "" },
    });
    ran.push({ cmd, status: r.status, output: `${r.stdout}${r.stderr}` });
    if (r.status !== 0) break;
  }
  return ran;
}

/** A temp folder that runs `node dist/...` as the checkout does: dist/ is a link to the built tree. */
function workdir(tag: string): string {
  const dir = tmpDir(tag);
  fs.symlinkSync(path.join(ROOT, "dist"), path.join(dir, "dist"), "dir");
  return dir;
}

test("the quick start's commands are read from the README: the install, the demo, generate, the tests", () => {
  const cmds = quickStartCommands(fs.readFileSync(README, "utf8"));
  assert.ok(cmds.includes("npm ci"), cmds.join("\n"));
  assert.ok(cmds.includes("npm test"), cmds.join("\n"));
  assert.ok(
    cmds.some((c) => demoArgs(c) !== null),
    "a demo command",
  );
  assert.ok(
    cmds.some((c) => c.startsWith("node dist/generate.js")),
    "a generate command",
  );
  assert.deepEqual(
    quickStartCommands(
      "## Quick start\n\n```sh\nnpm ci   # install\n# a comment\nnode dist/main.js \\\n  --demo\n```\n\n## Next\n\n```sh\nnot this\n```\n",
    ),
    ["npm ci", "node dist/main.js --demo"],
  );
  assert.equal(
    shortened("node dist/generate.js --model .demo/run/ckpt/checkpoint-270 --prompt x", 20),
    "node dist/generate.js --model .demo/run/ckpt/checkpoint-18 --prompt x",
  );
  assert.equal(
    shortened("node dist/main.js --world 2 --demo", 20),
    "node dist/main.js --world 2 --demo --max-steps 20",
  );
});

test("a quick-start command that fails (a misspelled flag) fails the run of the quick start", () => {
  const ran = runAll([shortened("node dist/main.js --wrold 2 --demo", SHORT_STEPS)], workdir("quickstart-bad"));
  assert.equal(ran.length, 1);
  assert.equal(ran[0].status, 2, ran[0].output);
  assert.match(ran[0].output, /--wrold/);
});

test("every command of the README's quick start runs and exits 0 (the demo shortened)", { timeout: 900_000 }, () => {
  const cmds = quickStartCommands(fs.readFileSync(README, "utf8")).filter((c) => !NOT_HERE.test(c));
  const dir = workdir("quickstart");
  const ran = runAll(
    cmds.map((c) => shortened(c, SHORT_STEPS)),
    dir,
  );
  for (const r of ran) assert.equal(r.status, 0, `\`${r.cmd}\` exited ${r.status}:\n${r.output.slice(-4000)}`);
  assert.equal(ran.length, cmds.length, "every command ran");
  assert.ok(fs.existsSync(path.join(dir, ".demo", "run", "final", "model.safetensors")), "the demo exported final/");
  const gen = ran.find((r) => r.cmd.startsWith("node dist/generate.js"));
  assert.ok(gen && gen.output.trim().length > 0, "generate printed text");
});
