/**
 * The C format check of `npm run lint` (scripts/lint-c.cjs: clang-format --dry-run -Werror over native/**\/*.{c,h}
 * and bench/native/*.{c,h}, style .clang-format): it passes on this tree, fails on a copy with one badly formatted
 * line planted (in the GEMM's frame, a nested kernel file, the bench's C), naming the file and line, `--write`
 * repairs the copy, and without clang-format it refuses with the command that installs it. Where clang-format is
 * missing the format tests report why they cannot run, unless TSTRAIN_REQUIRE_CLANG_FORMAT=1 (CI) makes that a
 * failure; the refusal is tested everywhere.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { spawnSync } from "node:child_process";

const ROOT = path.join(__dirname, "..", "..");
const SCRIPT = path.join("scripts", "lint-c.cjs");
const bin = process.env.CLANG_FORMAT || "clang-format";
const probe = spawnSync(bin, ["--version"], { encoding: "utf8" });
const skipNoFormat =
  (probe.error || probe.status !== 0) && process.env.TSTRAIN_REQUIRE_CLANG_FORMAT !== "1"
    ? `${bin} unavailable here; fix: apt-get update && apt-get install -y clang-format`
    : false;

/** Runs the lint script of the tree at root; env replaces the environment when given. */
function lint(root: string, args: string[] = [], env?: NodeJS.ProcessEnv) {
  const r = spawnSync(process.execPath, [path.join(root, SCRIPT), ...args], {
    cwd: root,
    encoding: "utf8",
    timeout: 120_000,
    env: env ?? process.env,
  });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

/** A copy of what the check reads: the script, .clang-format, native/, bench/native/. */
function copyTree(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-lint-c-"));
  for (const rel of [SCRIPT, ".clang-format", "native", path.join("bench", "native")]) {
    fs.mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
    fs.cpSync(path.join(ROOT, rel), path.join(dir, rel), { recursive: true });
  }
  return dir;
}

test("the C sources are formatted as .clang-format says (npm run lint's C check passes)", {
  skip: skipNoFormat,
}, () => {
  const r = lint(ROOT);
  assert.equal(r.status, 0, r.out);
  assert.match(r.out, /C format \(\d+ files, .*\): clean/);
});

// one badly formatted line each: the frame, a kernel two directories down, the bench's C
const PLANTS: [string, string, string][] = [
  ["native/gemm/frame.c", "  if (M <= 0 || N <= 0) return 0;", "  if (M<=0 ||N <= 0)   return 0;"],
  ["native/gemm/kernels/portable.c", "    float acc0[P_NR], acc1[P_NR];", "    float acc0[P_NR],acc1[P_NR] ;"],
  ["bench/native/gemm-bits.c", "static uint64_t h;", "static uint64_t  h;"],
];

for (const [file, good, bad] of PLANTS) {
  test(`a badly formatted line in ${file} fails the check, naming the file and line; --write repairs it`, {
    skip: skipNoFormat,
  }, () => {
    const dir = copyTree();
    try {
      const abs = path.join(dir, file);
      const clean = fs.readFileSync(abs, "utf8");
      assert.ok(clean.includes(good), `${file} no longer has the line this test plants a defect in: ${good}`);
      const line = clean.slice(0, clean.indexOf(good)).split("\n").length;
      fs.writeFileSync(abs, clean.replace(good, bad));
      const r = lint(dir);
      assert.equal(r.status, 1, r.out);
      assert.ok(r.out.includes(`${file}:${line}:`), `the failure names ${file}:${line}:\n${r.out}`);
      assert.match(r.out, /npm run format/);
      const w = lint(dir, ["--write"]);
      assert.equal(w.status, 0, w.out);
      assert.equal(fs.readFileSync(abs, "utf8"), clean, "--write gives back the clean file");
      assert.equal(lint(dir).status, 0);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
}

test("without clang-format the check refuses (exit 2) with the command that installs it", () => {
  const empty = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-lint-c-path-"));
  try {
    const env: NodeJS.ProcessEnv = { ...process.env, PATH: empty };
    delete env.CLANG_FORMAT;
    const r = lint(ROOT, [], env);
    assert.equal(r.status, 2, r.out);
    assert.match(r.out, /clang-format not found/);
    assert.match(r.out, /apt-get update && (sudo )?apt-get install -y clang-format/);
  } finally {
    fs.rmSync(empty, { recursive: true, force: true });
  }
});
