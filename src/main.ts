/**
 * `node dist/main.js [flags]`: parse, build, run, report. Everything else lives in run.ts, session/ and the
 * actors; this file only maps outcomes to exit codes (0 done, 2 refused, 1 failed, 3 stopped by a
 * signal after saving and publishing a checkpoint at the current step: O3) and forwards signals.
 */
import * as os from "node:os";
import { parseArgs, usage } from "./config";
import { fsRefusal, isUserError, UserError } from "./errors";
import { guardOutput } from "./pipes";
import { runSession } from "./run";
import {
  EXIT_STOPPED,
  firstSignal,
  requestStop,
  RunComplete,
  RunStopped,
  setCommandLine,
  withThisCommand,
} from "./session/stop";

/**
 * O3: the first SIGINT, SIGTERM or SIGUSR2 finishes the step, saves, publishes and exits 3 (before the first step:
 * exits 3 once the plan is made; after the last: the run finishes; a dry run or a benchmark: exits at once, saying
 * which, session/stop.ts firstSignal); a second exits at once. SIGUSR2 is the one Open MPI's mpirun passes on to every process at once (A12).
 */
function onSignals(): void {
  let seen = 0;
  const handler = (sig: NodeJS.Signals) => {
    seen += 1;
    if (seen === 1) {
      const first = firstSignal(sig); // what it does where the session is: true when it is said (O3)
      process.stderr.write(`\n${first.notice}\n`);
      if (first.exitNow) process.exit(128 + os.constants.signals[sig]);
      requestStop(sig);
      return;
    }
    process.stderr.write(`${sig} again: exiting at once; the last published checkpoint is the resume point\n`);
    process.exit(128 + os.constants.signals[sig]);
  };
  for (const sig of ["SIGINT", "SIGTERM", "SIGUSR2"] as const) process.on(sig, handler);
}

async function main(): Promise<number> {
  guardOutput(); // O7: `| head` ends no run (the reporter says where its log lines go)
  const { config, help, origins, fromFile } = parseArgs(process.argv.slice(2));
  if (help) {
    process.stdout.write(`${usage()}\n`);
    return 0;
  }
  setCommandLine(process.argv.slice(2), fromFile);
  onSignals();
  try {
    await runSession(config, undefined, origins);
  } catch (e) {
    if (e instanceof RunStopped) {
      process.stdout.write(`${e.message}\n`);
      return EXIT_STOPPED;
    }
    if (!(e instanceof RunComplete)) throw e;
    process.stdout.write(`${e.message}\n`);
  }
  return 0;
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (caught: unknown) => {
    const refused = fsRefusal(caught, "O6") ?? caught; // O6: a full disk or a bad path is the user's to fix, not a bug
    // a refusal's advice that changes the command line: the whole command that does it (stop.ts withThisCommand)
    const e = refused instanceof UserError ? withThisCommand(refused) : refused;
    if (isUserError(e)) {
      process.stderr.write(`refused: ${(e as Error).message}\n`);
      process.exitCode = 2;
    } else {
      const err = e as Error;
      process.stderr.write(
        `error: ${err?.name ?? "Error"}: ${err?.message ?? String(e)}\n${process.env.TSTRAIN_DEBUG ? (err?.stack ?? "") : ""}`,
      );
      process.exitCode = 1;
    }
  },
);
