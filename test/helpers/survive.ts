// Run the trainer's CLI as a child process (real signals, real exit codes), reacting to the lines it
// prints: tests act on events the run reports, never on delays. Used by test/survive.*.test.ts.
import * as fs from "node:fs";
import * as path from "node:path";
import { spawn, type ChildProcess } from "node:child_process";
import { readSafetensors } from "../../src/model/safetensors";
import { LocalHub } from "../../src/hub/server";
import { tmpDir } from "./tmp";

export const REPO_ROOT = path.join(__dirname, "..", "..", "..");
export const MAIN = path.join(REPO_ROOT, "dist", "main.js");

export interface Child {
  code: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
}

export interface Live {
  done: Promise<Child>;
  child: ChildProcess;
}

/** Starts `node dist/main.js args` in `cwd`; onLine sees every stdout and stderr line as it comes. */
export function startCli(
  args: string[],
  o: { env?: Record<string, string>; cwd?: string; onLine?: (l: string, c: ChildProcess) => void } = {},
): Live {
  const cp = spawn(process.execPath, args, {
    cwd: o.cwd ?? REPO_ROOT,
    env: { ...process.env, ...o.env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "",
    stderr = "";
  const lines = (src: "out" | "err") => {
    let buf = "";
    return (d: Buffer) => {
      const s = d.toString();
      if (src === "out") stdout += s;
      else stderr += s;
      if (process.env.TSTRAIN_TEST_ECHO) process.stderr.write(s);
      buf += s;
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        const l = buf.slice(0, i);
        buf = buf.slice(i + 1);
        o.onLine?.(l, cp);
      }
    };
  };
  cp.stdout.on("data", lines("out"));
  cp.stderr.on("data", lines("err"));
  const done = new Promise<Child>((resolve) =>
    cp.on("close", (code, signal) => resolve({ code, signal, stdout, stderr })),
  );
  return { done, child: cp };
}

export function runCli(args: string[], o: Parameters<typeof startCli>[1] = {}): Promise<Child> {
  return startCli(args, o).done;
}

/** Splits a command the trainer printed as advice ("node dist/main.js --a b 'c d'") into argv. */
export function adviceArgv(cmd: string): string[] {
  const out: string[] = [];
  const re = /'((?:[^']|'\\'')*)'|(\S+)/g;
  let m: RegExpExecArray | null;
  while ((m = re.exec(cmd))) out.push(m[1] !== undefined ? m[1].replace(/'\\''/g, "'") : m[2]);
  return out;
}

/** The command after `label` in text (up to the end of the line), as argv without the leading `node`. */
export function adviceAfter(text: string, label: RegExp): string[] {
  // a command ends at " (" (what it does), "; " (the next way out), " [" (the rule) or the line's end: the printed
  // commands quote every word holding ";" or "("
  const m = new RegExp(`${label.source}\\s*(node dist/main\\.js[^\\n]*?)(?: \\(|;\\s|\\s*\\[|\\s*$)`, "m").exec(text);
  if (!m) throw new Error(`no advice after ${label} in:\n${text}`);
  const argv = adviceArgv(m[1].trim());
  if (argv[0] !== "node") throw new Error(`advice is not a node command: ${m[1]}`);
  return argv.slice(1);
}

/** model.safetensors of a folder as one buffer, tensors in name order (bit-identity checks). */
export function modelBytes(dir: string): Buffer {
  const t = readSafetensors(path.join(dir, "model.safetensors")).tensors;
  return Buffer.concat(
    [...t.keys()].sort().map((k) => {
      const d = t.get(k)!.data;
      return Buffer.from(d.buffer, d.byteOffset, d.byteLength);
    }),
  );
}

/** A LocalHub that can be stopped and started again on the same port and files (a Hub restart). */
export class RestartableHub {
  hub: LocalHub;
  readonly dir = tmpDir("tstrain-survive-hub-");
  port = 0;
  constructor() {
    this.hub = new LocalHub({ dir: this.dir });
  }
  async start(): Promise<string> {
    this.hub = new LocalHub({ dir: this.dir, port: this.port });
    const url = await this.hub.start();
    this.port = Number(new URL(url).port);
    return url;
  }
  async stop(): Promise<void> {
    await this.hub.stop();
  }
}

export function listDirs(d: string): string[] {
  return fs.existsSync(d) ? fs.readdirSync(d).sort() : [];
}
