/**
 * How a session ends other than by finishing: a signal (O3), a run already complete (R2), and the
 * command that continues the run, which every refusal's advice repeats.
 */
import { shellWord } from "../cli-args";
import { mainArgvWith, withMainCommands } from "../config";
import type { FlagChange, UserError } from "../errors";

// ---- the command line, for advice that must be a command that works ------------------------------

let commandLine: string[] | null = null;
let fileFlags: ReadonlySet<string> = new Set();
let launcher: string[] = [];

/** main.ts records the arguments it was started with (and the flags its --config file sets), so advice can repeat them. */
export function setCommandLine(argv: readonly string[], fromFile: ReadonlySet<string> = new Set()): void {
  commandLine = [...argv];
  fileFlags = fromFile;
}

/** Under an MPI launcher (A9): the launch that the resume command needs in front of `node dist/main.js`. */
export function setLauncher(prefix: readonly string[]): void {
  launcher = [...prefix];
}

const q = shellWord;

/** This run's own command, as it was started, with `prefix` in front (`env -u HF_TOKEN`, for advice to run it again). */
export function sameCommand(prefix: readonly string[] = []): string {
  const head = [...prefix, ...launcher, "node", "dist/main.js"];
  if (!commandLine) return `${head.map(q).join(" ")} <the same flags>`;
  return [...head, ...commandLine].map(q).join(" ");
}

/**
 * This run's own command with each change of `set` made (config.ts mainArgvWith): a `--flag value` in place of that
 * flag's value given (on the command line, in the --config file, or none): `sameCommandWith(["--seed", "20260919"])`.
 */
export function sameCommandWith(...set: FlagChange[]): string {
  const head = [...launcher, "node", "dist/main.js"];
  if (!commandLine) return `${head.map(q).join(" ")} <the same flags> ${set.flat().map(String).map(q).join(" ")}`;
  return [...head, ...mainArgvWith(commandLine, set, fileFlags)].map(q).join(" ");
}

/** A refusal with each way of its fix written as this run's own command with the way's changes (config.ts
 *  withMainCommands); as it is before main.ts has recorded the command line. */
export function withThisCommand(e: UserError): UserError {
  if (!commandLine) return e;
  return withMainCommands(e, [...launcher, "node", "dist/main.js"], commandLine, fileFlags);
}

/** The command that continues this run: the same flags, with --resume replaced (and `extra` added). */
export function resumeCommand(resume: string, extra: string[] = []): string {
  const head = [...launcher, "node", "dist/main.js"].join(" ");
  if (!commandLine) return `${head} <the same flags> --resume ${resume}${extra.length ? ` ${extra.join(" ")}` : ""}`;
  const out: string[] = [];
  for (let i = 0; i < commandLine.length; i++) {
    const a = commandLine[i];
    if (a === "--resume") {
      i++;
      continue;
    }
    if (a.startsWith("--resume=")) continue;
    if (extra.includes(a)) continue;
    out.push(a);
  }
  return [...launcher, "node", "dist/main.js", ...out, "--resume", resume, ...extra].map(q).join(" ");
}

// ---- signals (O3) --------------------------------------------------------------------------------

let stopSignal: string | null = null;

/** O3: the first SIGINT/SIGTERM/SIGUSR2 asks the run to finish its step, save and publish, and exit. */
export function requestStop(signal: string): void {
  stopSignal = stopSignal ?? signal;
}

/**
 * Where the session is, for what a signal does there (O3): making its plan (the loop then stops before its first
 * step, exit 3), training (the current step finishes, then a checkpoint is saved and published, exit 3), finishing
 * (the last step is done: its checkpoint, the validation and the export complete, exit 0), or a dry run or a
 * benchmark, which save nothing (the signal exits at once). null: not said (an MPI follower: process 0 decides).
 */
export type SessionPhase = "setup" | "training" | "finishing" | "saves-nothing";
let phase: SessionPhase | null = null;

export function setPhase(p: SessionPhase): void {
  phase = p;
}

/** O3: what the first SIGINT, SIGTERM or SIGUSR2 does now, said when it comes; `exitNow` when there is nothing to save. */
export function firstSignal(sig: string): { notice: string; exitNow: boolean } {
  const again = "send it again to exit at once";
  switch (phase) {
    case "saves-nothing":
      return { notice: `${sig}: a dry run or a benchmark saves nothing: exiting now`, exitNow: true };
    case "setup":
      return {
        notice: `${sig}: stopping before this session's first step: nothing is trained yet, so nothing is saved; the run exits once its plan is made (${again})`,
        exitNow: false,
      };
    case "finishing":
      return {
        notice: `${sig}: the last step is done: finishing its checkpoint, the validation and the export, then exiting as a finished run (${again}; the last published checkpoint is the resume point)`,
        exitNow: false,
      };
    default:
      return {
        notice: `${sig}: finishing the current step, then saving and publishing a checkpoint (${again})`,
        exitNow: false,
      };
  }
}

/** The signal that asked the run to stop, or null. */
export function stopRequested(): string | null {
  return stopSignal;
}

/** O3: exit code of a run stopped by a signal after it saved (and published) its checkpoint. */
export const EXIT_STOPPED = 3;

/** Thrown when a signal stopped the run cleanly; main prints the message and exits EXIT_STOPPED. */
export class RunStopped extends Error {
  constructor(
    message: string,
    readonly step: number,
  ) {
    super(message);
    this.name = "RunStopped";
  }
}

/** Thrown when --resume auto finds the run already complete: not an error, nothing to do. */
export class RunComplete extends Error {
  constructor(message: string) {
    super(message);
    this.name = "RunComplete";
  }
}
