/**
 * The standalone bench scripts' one flag reader (attention.ts, kernels-micro.ts, model-frozen-step.ts,
 * model-profile.ts, webgpu-step.ts, run as `node dist/bench/<script>.js --flag value`); the bench harness itself
 * parses its flags with the trainer's table (bench/options.ts).
 */

/** The value after `name` on the command line, or `dflt` when the flag is absent or last. */
export function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}
