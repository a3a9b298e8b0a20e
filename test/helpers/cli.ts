// The commands as a user runs them (node dist/<file>.js), and what a refusal must look like (issues 53, 60): one
// line on stderr naming the rule, exit 2, no stack trace. Shared by the test files that run refusals' advice.
import assert from "node:assert/strict";
import * as path from "node:path";
import { spawn, spawnSync } from "node:child_process";

export { tinyModel } from "./model-dir";
import { REPO_ROOT } from "./survive";

const DIST = path.join(__dirname, "..", "..");

/** `node dist/<file> ...args`, to its end. */
export function node(file: string, args: string[], env: NodeJS.ProcessEnv = process.env) {
  return spawnSync(process.execPath, [path.join(DIST, file), ...args], { encoding: "utf8", timeout: 150_000, env });
}

/**
 * A command a refusal advised, run from the repo's root to its end: as printed (a string, `node dist/main.js ...`,
 * read by bash, with this node for `node`), or as argv (adviceAfter's, `dist/main.js ...`).
 */
export function runAdvised(cmd: string | string[], env: NodeJS.ProcessEnv = process.env) {
  if (typeof cmd !== "string")
    return spawnSync(process.execPath, cmd, { cwd: REPO_ROOT, encoding: "utf8", timeout: 150_000, env });
  return spawnSync("bash", ["-c", asBash(cmd)], { cwd: REPO_ROOT, encoding: "utf8", timeout: 150_000, env });
}

/** The same, not blocking this process (a test Hub may be serving in it). */
export function runAdvisedAsync(cmd: string, env: NodeJS.ProcessEnv = process.env): Promise<Output> {
  return spawnOutput("bash", ["-c", asBash(cmd)], { cwd: REPO_ROOT, env });
}

/** A child's exit status and what it printed. */
export interface Output {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** `file args` run to its end without blocking this process (a test Hub may be serving in it). */
export function spawnOutput(
  file: string,
  args: string[],
  opts: { cwd?: string; env?: NodeJS.ProcessEnv },
): Promise<Output> {
  return new Promise((resolve) => {
    const cp = spawn(file, args, { ...opts, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    cp.stdout.on("data", (d: Buffer) => {
      stdout += d;
    });
    cp.stderr.on("data", (d: Buffer) => {
      stderr += d;
    });
    cp.on("close", (status) => resolve({ status, stdout, stderr }));
  });
}

/** A printed command for bash: `exec` this test's node in place of the word `node` (and of a launcher's `node`). */
function asBash(cmd: string): string {
  const node = `'${process.execPath.replace(/'/g, "'\\''")}'`;
  if (!/(^|\s)node dist\/\w[\w-]*\.js(\s|$)/.test(cmd)) throw new Error(`not a command of this repo: ${cmd}`);
  return `exec ${cmd.replace(/(^|\s)node (dist\/)/, `$1${node} $2`)}`;
}

/**
 * The commands the first line of a refusal advises, each as printed: every `node dist/<file>.js ...` (with a launcher
 * or `env -u VAR` before it, when there is one), up to what follows a command: " (" (what it does), ", or", ";",
 * " [" (the rule) or the line's end. The printed commands quote every word holding a space, "(", ";" or ending in ",".
 */
export function advisedCommands(text: string): string[] {
  const line = text.split("\n").find((l) => /\[[A-Z]\d+\]/.test(l)) ?? text.split("\n")[0];
  const out: string[] = [];
  const start = /(?:(?:mpirun -np \d+|srun -n \d+|env -u \w+) )?node dist\/[\w-]+\.js(?=\s|$)/g;
  let m: RegExpExecArray | null;
  while ((m = start.exec(line))) {
    let i = m.index + m[0].length;
    let end = i;
    for (;;) {
      if (line[i] !== " ") break;
      const w = i + 1;
      if (w >= line.length || line[w] === "(" || line[w] === "[") break;
      // one shell word: quoted pieces ('...' or $'...') and unquoted runs
      let j = w;
      let lastUnquoted = false;
      while (j < line.length && line[j] !== " ") {
        if (line[j] === "'" || (line[j] === "$" && line[j + 1] === "'")) {
          const ansi = line[j] === "$";
          j += ansi ? 2 : 1;
          while (j < line.length && line[j] !== "'") j += ansi && line[j] === "\\" ? 2 : 1;
          j++;
          lastUnquoted = false;
        } else {
          j++;
          lastUnquoted = true;
        }
      }
      const trail = lastUnquoted && /[,;]$/.test(line.slice(w, j));
      end = trail ? j - 1 : j;
      i = j;
      if (trail) break;
    }
    out.push(line.slice(m.index, end));
    start.lastIndex = end;
  }
  return out;
}

/** A refusal: exit 2, one line on stderr matching `line`, no stack trace, nothing on stdout. */
export function assertRefused(r: { status: number | null; stderr: string }, line: RegExp): void {
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, line);
  assert.equal(r.stderr.trim().split("\n").length, 1, `one line:\n${r.stderr}`);
  assert.doesNotMatch(r.stderr, /\n\s+at |internal error/);
}

/**
 * Every command the first line of a refusal advises (advisedCommands), run as printed from the repo's root: each
 * exits 0. Returns each command with what it printed; `min`: how many commands the advice must hold (default 1).
 */
export function assertAdviceRuns(
  text: string,
  /** `before`: puts back the state the refusal was made in, before each command (one that trains changes it) */
  o: { env?: NodeJS.ProcessEnv; min?: number; before?: () => void } = {},
): Array<{ cmd: string; stdout: string; stderr: string }> {
  const cmds = advisedCommands(text);
  assert.ok(cmds.length >= (o.min ?? 1), `${o.min ?? 1} command(s) advised at least:\n${text}`);
  return cmds.map((cmd) => {
    o.before?.();
    const r = runAdvised(cmd, o.env);
    assert.equal(r.status, 0, `the advised ${cmd}\n${r.stderr}`);
    return { cmd, stdout: r.stdout, stderr: r.stderr };
  });
}
