// O7: a reader that closes the output (`| head`) ends no command: the real prepare, main and generate, each with a
// closed pipe on stdout, on stderr, and on both (`2>&1 | head`), finish their work with the exit code they would
// have had.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawn } from "node:child_process";
import { tmpDir } from "./helpers/tmp";
import { tinyRun } from "./helpers/run";
import { writeTinyTokenizer } from "./fixtures/data-synth";
import { corpusDocs, corpusJsonl } from "./fixtures/corpus-docs";
import { writeSyntheticMix } from "./helpers/mix";
import { buildConfig, hfConfigJson } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { flatToTensors, writeSafetensors } from "../src/model/safetensors";

const DIST = path.join(__dirname, "..");

type Closed = "stdout" | "stderr" | "both";

/**
 * Runs `node dist/<file> args` with the pipe named by `closed` already closed by its reader (as `| head` closes
 * it once it has its lines; here before the first write, the harshest case); `both` is `2>&1` into that pipe.
 * Returns the exit code and what the open stream (if any) carried.
 */
async function runClosed(file: string, args: string[], closed: Closed): Promise<{ code: number | null; open: string }> {
  const cmd = [path.join(DIST, file), ...args];
  // `both`: bash sends stderr into stdout's pipe, then becomes node (exec: the same process, the same exit code)
  const child =
    closed === "both"
      ? spawn("bash", ["-c", 'exec "$@" 2>&1', "_", process.execPath, ...cmd], { stdio: ["ignore", "pipe", "ignore"] })
      : spawn(process.execPath, cmd, { stdio: ["ignore", "pipe", "pipe"] });
  const gone = closed === "stderr" ? child.stderr : child.stdout;
  const kept = closed === "stderr" ? child.stdout : closed === "stdout" ? child.stderr : null;
  gone?.destroy();
  let open = "";
  kept?.setEncoding("utf8");
  kept?.on("data", (s: string) => {
    open += s;
  });
  const code = await new Promise<number | null>((resolve) => child.on("close", (c) => resolve(c)));
  return { code, open };
}

// a progress line at every chance: many writes to the closed pipe (the children inherit it)
process.env.TSTRAIN_PROGRESS_SECONDS = "0";

const work = tmpDir("tstrain-pipes-");
const tok = writeTinyTokenizer(
  path.join(work, "tok"),
  corpusDocs().filter((d) => d.length > 0),
);
fs.writeFileSync(path.join(work, "c.jsonl"), corpusJsonl());
const mix = writeSyntheticMix({ vocab: 64, trainTokens: 32 * 1024, valTokens: 512 });
// an exported model for generate (3 layers, width 72, vocab 300) with its tokenizer
const model = path.join(work, "model");
const cfg = buildConfig({ seqLen: 48, layers: 3, hidden: 72, vocabSize: 300 });
const params = new Float32Array(paramLayout(cfg).total);
initWeights(cfg, 1234, params);
fs.mkdirSync(model);
writeSafetensors(path.join(model, "model.safetensors"), flatToTensors(cfg, params), { format: "pt" });
fs.writeFileSync(path.join(model, "config.json"), JSON.stringify(hfConfigJson(cfg)));
writeTinyTokenizer(
  model,
  corpusDocs().filter((d) => d.length > 0),
);
const noStack = /\n\s+at |internal error|error:/;

for (const closed of ["stdout", "stderr", "both"] as const) {
  test(`prepare with a closed pipe on ${closed} builds the mix and exits 0 (O7)`, { timeout: 120_000 }, async () => {
    const out = path.join(work, `mix-${closed}`);
    const p = await runClosed(
      "prepare.js",
      ["--input", path.join(work, "c.jsonl"), "--tokenizer", tok, "--out", out, "--workers", "1"],
      closed,
    );
    assert.equal(p.code, 0, p.open);
    assert.ok(fs.existsSync(path.join(out, "manifest.json")), "the mix is built");
    assert.doesNotMatch(p.open, noStack);
  });

  test(`main with a closed pipe on ${closed} trains to its last step, ends its session, leaves no lock, exits 0 (O7)`, {
    timeout: 300_000,
  }, async () => {
    const out = path.join(work, `run-${closed}`);
    const t = await runClosed(
      "main.js",
      tinyRun(mix.root, out, ["--max-steps", "4", "--push-every-steps", "2"]),
      closed,
    );
    assert.equal(t.code, 0, t.open);
    assert.doesNotMatch(t.open, noStack);
    const metrics = fs.readFileSync(path.join(out, "metrics.jsonl"), "utf8").trim().split("\n");
    assert.equal(JSON.parse(metrics[metrics.length - 1]).step, 4, "the run trained to its last step");
    const sessions = fs
      .readFileSync(path.join(out, "sessions.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l).event);
    assert.deepEqual(sessions, ["start", "end"], "the session's start has its end");
    assert.ok(!fs.existsSync(path.join(out, ".tstrain.lock")), "no stale lock");
    assert.ok(fs.existsSync(path.join(out, "final", "model.safetensors")), "the model is exported");
    if (closed === "stdout") assert.match(t.open, /the output's reader closed it \(EPIPE\); the run goes on/);
  });

  test(`generate with a closed pipe on ${closed} generates to its end and exits 0 (O7)`, {
    timeout: 120_000,
  }, async () => {
    const g = await runClosed(
      "generate.js",
      ["--model", model, "--prompt", "The", "--max-new-tokens", "8", "--backend", "cpu"],
      closed,
    );
    assert.equal(g.code, 0, g.open);
    assert.doesNotMatch(g.open, noStack);
    if (closed === "stdout") assert.match(g.open, /generate: \d+ tokens in/, "the generation went on to its end");
    if (closed === "stderr") assert.ok(g.open.startsWith("The"), `the text still streams: ${JSON.stringify(g.open)}`);
  });
}
