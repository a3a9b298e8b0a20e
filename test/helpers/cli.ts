// The commands as a user runs them (node dist/<file>.js), and what a refusal must look like (issues 53, 60): one
// line on stderr naming the rule, exit 2, no stack trace. Shared by the test files that run refusals' advice.
import assert from "node:assert/strict";
import * as path from "node:path";
import { spawnSync } from "node:child_process";

export { tinyModel } from "./model-dir";
import { REPO_ROOT } from "./survive";

const DIST = path.join(__dirname, "..", "..");

/** `node dist/<file> ...args`, to its end. */
export function node(file: string, args: string[], env: NodeJS.ProcessEnv = process.env) {
  return spawnSync(process.execPath, [path.join(DIST, file), ...args], { encoding: "utf8", timeout: 150_000, env });
}

/** A command a refusal advised (argv as adviceAfter gives it, `dist/main.js ...`), run from the repo's root to its end. */
export function runAdvised(argv: string[], env: NodeJS.ProcessEnv = process.env) {
  return spawnSync(process.execPath, argv, { cwd: REPO_ROOT, encoding: "utf8", timeout: 150_000, env });
}

/** A refusal: exit 2, one line on stderr matching `line`, no stack trace, nothing on stdout. */
export function assertRefused(r: { status: number | null; stderr: string }, line: RegExp): void {
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, line);
  assert.equal(r.stderr.trim().split("\n").length, 1, `one line:\n${r.stderr}`);
  assert.doesNotMatch(r.stderr, /\n\s+at |internal error/);
}
