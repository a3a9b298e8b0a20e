/**
 * `node dist/compare.js RUN_A RUN_B [--out FILE.svg] [--after STEP]`: two run folders' logged training losses side
 * by side (e.g. the demo with `--precision fp32` and with `--precision bf16`): per logged step both losses and
 * B's relative difference from A, the largest difference after --after (default 50), the validation figures
 * each run's report recorded, and one chart of both curves (default <RUN_B>/compare.svg).
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { fsRefusal, isUserError, UserError } from "./errors";
import type { LogEntry } from "./checkpoint";
import { lossCompareSvg, readJsonl } from "./report";

interface Args {
  a: string;
  b: string;
  out: string;
  after: number;
}

function parse(argv: readonly string[]): Args {
  const dirs: string[] = [];
  let out = "",
    after = 50;
  for (let i = 0; i < argv.length; i++) {
    const x = argv[i];
    if (x === "--out") out = argv[++i] ?? "";
    else if (x === "--after") after = Number(argv[++i]);
    else if (x.startsWith("--"))
      throw new UserError("B5", `unknown flag ${x}: compare takes RUN_A RUN_B [--out FILE.svg] [--after STEP]`);
    else dirs.push(x);
  }
  if (dirs.length !== 2) throw new UserError("B5", "give two run folders: node dist/compare.js RUN_A RUN_B");
  if (!Number.isSafeInteger(after) || after < 0)
    throw new UserError("B5", `--after ${after} must be a whole number >= 0`);
  for (const d of dirs)
    if (!fs.existsSync(path.join(d, "metrics.jsonl")))
      throw new UserError(
        "B5",
        `${d} has no metrics.jsonl: give the --out folder of a run that logged at least one step`,
      );
  return { a: dirs[0], b: dirs[1], out: out || path.join(dirs[1], "compare.svg"), after };
}

/** The run's RUN_JSON figures where its report kept them (sessions.jsonl's last end event carries none: read the report's table). */
function valPpl(dir: string): string {
  const f = path.join(dir, "report.html");
  if (!fs.existsSync(f)) return "unknown";
  const m = /val_ppl<\/th><td>([^<]+)</.exec(fs.readFileSync(f, "utf8"));
  return m ? m[1] : "unknown";
}

function main(): void {
  const o = parse(process.argv.slice(2));
  const a = readJsonl<LogEntry>(path.join(o.a, "metrics.jsonl")),
    b = readJsonl<LogEntry>(path.join(o.b, "metrics.jsonl"));
  const byStep = new Map(b.map((e) => [e.step, e]));
  let worst = 0,
    at = -1;
  console.log("step\tloss A\tloss B\t(B - A) / A");
  for (const x of a) {
    const y = byStep.get(x.step);
    if (!y) continue;
    const rel = (y.loss - x.loss) / x.loss;
    if (x.step > o.after && Math.abs(rel) > worst) [worst, at] = [Math.abs(rel), x.step];
    console.log(`${x.step}\t${x.loss.toFixed(4)}\t${y.loss.toFixed(4)}\t${(100 * rel).toFixed(2)} %`);
  }
  console.log(`largest difference after step ${o.after}: ${(100 * worst).toFixed(2)} % (step ${at})`);
  console.log(`val_ppl: A ${valPpl(o.a)}, B ${valPpl(o.b)}`);
  fs.writeFileSync(
    o.out,
    lossCompareSvg([
      { label: o.a, history: a },
      { label: o.b, history: b },
    ]),
  );
  console.log(`chart: ${path.resolve(o.out)}`);
}

try {
  main();
} catch (caught) {
  const e = fsRefusal(caught, "O6") ?? caught;
  if (!isUserError(e)) throw e;
  process.stderr.write(`compare: ${e.message}\n`);
  process.exitCode = 2;
}
