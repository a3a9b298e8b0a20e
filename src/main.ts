/**
 * `node dist/main.js [flags]`: parse, build, run, report. Everything else lives in run.ts and the
 * actors; this file only maps outcomes to exit codes (0 done, 2 refused, 1 failed).
 */
import { parseArgs, usage } from "./config";
import { isUserError } from "./errors";
import { runSession, RunComplete } from "./run";

async function main(): Promise<number> {
  const { config, help } = parseArgs(process.argv.slice(2));
  if (help) {
    process.stdout.write(usage() + "\n");
    return 0;
  }
  try {
    await runSession(config);
  } catch (e) {
    if (!(e instanceof RunComplete)) throw e;
    process.stdout.write(e.message + "\n");
  }
  return 0;
}

main().then(
  (code) => { process.exitCode = code; },
  (e: unknown) => {
    if (isUserError(e)) {
      process.stderr.write(`refused: ${(e as Error).message}\n`);
      process.exitCode = 2;
    } else {
      const err = e as Error;
      process.stderr.write(`error: ${err?.name ?? "Error"}: ${err?.message ?? String(e)}\n${process.env.TSTRAIN_DEBUG ? err?.stack ?? "" : ""}`);
      process.exitCode = 1;
    }
  },
);
