// Run a small training session in-process, through the real actors, with a capturing reporter.
import { FLAGS, parseArgs, validate, type RunConfig } from "../../src/config";
import { runSession, type RunResult } from "../../src/run";
import type { Reporter } from "../../src/report";
import type { LogEntry } from "../../src/checkpoint";

export interface Captured extends Reporter {
  lines: string[];
  metrics: LogEntry[];
}

export function captureReporter(echo = false): Captured {
  const lines: string[] = [];
  const metrics: LogEntry[] = [];
  return {
    lines,
    metrics,
    say(l: string) {
      lines.push(l);
      if (echo) console.log(l);
    },
    progress() {
      /* no terminal in tests */
    },
    metric(e: LogEntry) {
      metrics.push(e);
    },
    curve() {
      /* pictures are tested in report tests */
    },
  };
}

/**
 * The tiny run's flags (2 layers, width 36, seq 16, micro-batch 2, world 1, 8 steps, checkpoints at 4 and 8, a log
 * line every 2 steps, lr 3e-3) for dist/main.js or parseArgs; each flag of `extra` replaces the same flag of these
 * (or, given twice in `extra`, its last value wins), so a test names only what it changes: the trainer itself
 * refuses a flag given twice (G10).
 */
export function tinyRun(root: string, out: string, extra: string[] = []): string[] {
  return withFlags(
    [
      "--root",
      root,
      "--out",
      out,
      "--seq-len",
      "16",
      "--layers",
      "2",
      "--hidden",
      "36",
      "--micro-batch",
      "2",
      "--accum",
      "1",
      "--world",
      "1",
      "--max-steps",
      "8",
      "--push-every-steps",
      "4",
      "--log-every",
      "2",
      "--val-tokens",
      "256",
      "--lr",
      "3e-3",
    ],
    extra,
  );
}

/** A trainer command line's words as flags: each flag (its setting's name: `--no-prune` is prune's) with its words. */
function flagGroups(args: readonly string[]): Array<{ name: string; words: string[] }> {
  const out: Array<{ name: string; words: string[] }> = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    const bare = a.startsWith("--") ? a.slice(2).split("=")[0] : a;
    const spec = FLAGS.find((f) => f.flag === bare);
    const valued = spec !== undefined && spec.kind !== "bool" && !a.includes("=");
    const name = !spec && bare.startsWith("no-") ? bare.slice(3) : bare;
    out.push({ name, words: valued && i + 1 < args.length ? [a, args[++i]] : [a] });
  }
  return out;
}

/**
 * `args` with each flag of `extra` set: a flag `args` gives already is replaced where it stands, a new one is added
 * at the end; a flag `extra` gives twice takes its last value. The trainer refuses a flag given twice (G10), so a
 * test that changes a flag of a command line writes it with this.
 */
export function withFlags(args: readonly string[], extra: readonly string[]): string[] {
  const groups = flagGroups(args);
  for (const g of flagGroups(extra)) {
    const at = groups.findIndex((x) => x.name === g.name);
    if (at >= 0) groups[at] = g;
    else groups.push(g);
  }
  return groups.flatMap((g) => g.words);
}

/** @deprecated tinyRun's former name, kept while branches written against it land; use tinyRun. */
export const tinyArgs = tinyRun;

/** A tiny Llama (2 layers, width 36, vocab from the mix) on a synthetic mix, on wasm: tinyRun parsed. */
export function tinyConfig(root: string, out: string, argv: string[] = [], vocab = 64): RunConfig {
  const base = parseArgs(tinyRun(root, out, ["--backend", "wasm", ...argv])).config;
  return validate({ ...base, vocabSize: vocab });
}

export async function runTiny(
  cfg: RunConfig,
  env: Record<string, string> = {},
): Promise<RunResult & { rep: Captured }> {
  const saved: Record<string, string | undefined> = {};
  for (const [k, v] of Object.entries(env)) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  const rep = captureReporter(Boolean(process.env.TSTRAIN_TEST_ECHO));
  try {
    const r = await runSession(cfg, rep);
    return { ...r, rep };
  } catch (e) {
    (e as { lines?: string[] }).lines = rep.lines;
    throw e;
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}
