/**
 * `node dist/generate.js --model DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]
 *   [--top-p P] [--seed S] [--backend auto|native|wasm|cpu|tensorflow] [--tokenizer tokenizer.json]
 *   [--allow-other-tokenizer]
 *   [--hub-url URL] [--no-cache]`
 *
 * DIR is an exported `final/` or a checkpoint folder (model.safetensors + config.json), local or on the Hub as
 * hf://datasets/owner/name[@revision]/path (or hf://models/...; token from HF_TOKEN). Text streams to stdout as tokens come;
 * generation stops at EOS or after --max-new-tokens. This file is the command line only: loading a model folder
 * and generating text live in generation.ts.
 *
 * Generation, module by module (paths under src/):
 *
 * LOAD
 *   1. this file parses the flags and checks the sampling options (model/decode.ts checkSampling); an hf://
 *      model is first downloaded into a temp folder through hub/client.ts (fetchModelDir).
 *   2. generation.ts loadModelDir: config.json through checkpoint/index.ts readHfConfig and
 *      model/llama-config.ts configFromHf; model.safetensors through model/safetensors.ts into the flat weights
 *      of model/layout.ts; the tokenizer (--tokenizer when given, else the folder's, else the run's mix root's),
 *      refused when its ids differ from the ones the model was trained with (data/vocab-hash.ts).
 *   3. model/backend.ts initEngine picks the engine, as for training (model/kernels.ts).
 *
 * GENERATE
 *   4. generation.ts generateText: the prompt's ids, then model/decode.ts generateWithCache: KvDecoder runs one
 *      position per call through model/llama.ts forwardCached (the training forward's ops, attention over the
 *      key/value cache with the kernels' attentionCachedForward) and pickToken chooses the next id (greedy, or
 *      temperature, top-k, top-p from a seeded generator). --no-cache runs generateNoCache on the training
 *      forward (generation.ts lastLogits) instead: the same tokens.
 *   5. generation.ts streamingDecoder writes the text as the tokens come, to stdout.
 *
 * DURING TRAINING
 *   6. session/metrics.ts calls generation.ts sampleAtCheckpoint at every checkpoint (the same generateText,
 *      greedy, on the live weights); report.ts recordSample appends it to samples.jsonl (G11).
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fsRefusal, isUserError, UserError } from "./errors";
import { guardOutput } from "./pipes";
import { commandWith, type FlagArgs, type FlagTable, parseFlags, shellWord } from "./cli-args";
import { initEngine, type BackendName } from "./model/backend";
import { checkSampling } from "./model/decode";
import { createHubClient } from "./hub/client";
import { describeHubError } from "./hub/hub-errors";
import { refuseMalformedToken } from "./hub/token";
import { DEFAULT_HUB_URL, hubEndpoint, isHfUrl, parseHfUrl, type HfUrl } from "./hub/address";
import { generateText, loadModelDir, promptIds, type GenerateRequest } from "./generation";

// ---------------------------------------------------------------------------------------------
// CLI

const USAGE = `usage: node dist/generate.js --model DIR|hf://datasets/owner/name[@revision]/path --prompt TEXT
  [--max-new-tokens N]  tokens to generate at most (default 64); stops earlier at EOS
  [--temperature T]     0 = greedy (default); > 0 samples
  [--top-k K]           keep the K most likely tokens (default 0 = off)
  [--top-p P]           keep the smallest set reaching probability P (default 1 = off)
  [--seed S]            sampling seed (default 0): the same seed gives the same text
  [--backend NAME]      auto (default), native, wasm, cpu, tensorflow
  [--tokenizer FILE]    the tokenizer.json to use (default: DIR's, else the run's mix root's)
  [--allow-other-tokenizer]  use a tokenizer whose vocabulary differs from the one the export recorded
  [--hub-url URL]       for hf:// models (default $HF_ENDPOINT, else ${DEFAULT_HUB_URL}; token from HF_TOKEN)
  [--no-cache]          recompute the whole sequence per token (the reference path; slow)`;

/** The number flags' defaults (parseGenerateArgs's), which a refused value is told to pass instead. */
const NUMBER_DEFAULTS: Readonly<Record<string, number>> = {
  "--max-new-tokens": 64,
  "--temperature": 0,
  "--top-k": 0,
  "--top-p": 1,
  "--seed": 0,
};

interface CliArgs extends GenerateRequest {
  model: string;
  backend: BackendName;
  tokenizer?: string;
  /** --hub-url when given; else HF_ENDPOINT, else the Hugging Face Hub (hub/address.ts). */
  hubUrl: string;
  allowOtherTokenizer: boolean;
}

export function parseGenerateArgs(argv: string[]): CliArgs | null {
  const o: CliArgs = {
    model: "",
    prompt: "",
    maxNewTokens: NUMBER_DEFAULTS["--max-new-tokens"],
    temperature: NUMBER_DEFAULTS["--temperature"],
    topK: NUMBER_DEFAULTS["--top-k"],
    topP: NUMBER_DEFAULTS["--top-p"],
    seed: NUMBER_DEFAULTS["--seed"],
    cache: true,
    backend: "auto",
    hubUrl: "",
    allowOtherTokenizer: false,
  };
  let havePrompt = false;
  let hubUrlGiven: string | undefined;
  const num = (a: FlagArgs): number => {
    const v = a.value();
    const n = Number(v);
    if (v.trim() === "" || !Number.isFinite(n))
      throw new UserError("G11", `${a.flag} ${JSON.stringify(v)} is not a number: run `, {
        ways: [{ changes: [[a.flag, String(NUMBER_DEFAULTS[a.flag])]], why: "its default" }],
        after: `\n${USAGE}`,
      });
    return n;
  };
  const flags: FlagTable<CliArgs> = {
    "--model": (o, a) => {
      o.model = a.value();
    },
    "--prompt": (o, a) => {
      o.prompt = a.value();
      havePrompt = true;
    },
    "--max-new-tokens": (o, a) => {
      o.maxNewTokens = num(a);
    },
    "--temperature": (o, a) => {
      o.temperature = num(a);
    },
    "--top-k": (o, a) => {
      o.topK = num(a);
    },
    "--top-p": (o, a) => {
      o.topP = num(a);
    },
    "--seed": (o, a) => {
      o.seed = num(a);
    },
    "--backend": (o, a) => {
      const b = a.value();
      if (!["auto", "native", "wasm", "cpu", "tensorflow"].includes(b))
        throw new UserError("G11", `--backend ${b} is not one of auto, native, wasm, cpu, tensorflow: run `, {
          ways: [{ changes: [["--backend", "auto"]], why: "the default" }],
        });
      o.backend = b as BackendName;
    },
    "--tokenizer": (o, a) => {
      o.tokenizer = a.value();
    },
    "--hub-url": (_o, a) => {
      hubUrlGiven = a.value();
    },
    "--no-cache": (o) => {
      o.cache = false;
    },
    "--allow-other-tokenizer": (o) => {
      o.allowOtherTokenizer = true;
    },
  };
  if (
    parseFlags(argv, o, flags, {
      value(flag, v) {
        if (v === undefined) {
          const dflt = flag === "--backend" ? "auto" : NUMBER_DEFAULTS[flag];
          if (dflt === undefined) throw new UserError("G11", `${flag} needs a value\n${USAGE}`);
          throw new UserError("G11", `${flag} needs a value: run `, {
            ways: [{ changes: [[flag, String(dflt)]], why: "its default" }],
            after: `\n${USAGE}`,
          });
        }
        return v;
      },
      unknown: (a) => new UserError("G11", `unknown argument ${JSON.stringify(a)}\n${USAGE}`),
      repeated: (given, once) =>
        new UserError(
          "G11",
          `${given.join(" and ")} set the same flag: a flag is read once, and all but one would be dropped without a word. Give each once, as in node dist/generate.js ${once.map(shellWord).join(" ")}`,
        ),
    }) === null
  )
    return null;
  o.hubUrl = hubEndpoint(hubUrlGiven, "G11").url; // G11: a bad --hub-url or HF_ENDPOINT, named
  if (!o.model || !havePrompt) throw new UserError("G11", `generate needs --model and --prompt\n${USAGE}`);
  checkSampling(o);
  if (!Number.isInteger(o.maxNewTokens) || o.maxNewTokens < 1)
    throw new UserError("G11", `--max-new-tokens ${o.maxNewTokens} must be a whole number >= 1: run `, {
      ways: [{ changes: [["--max-new-tokens", String(o.maxNewTokens >= 1 ? Math.floor(o.maxNewTokens) : 1)]] }],
    });
  return o;
}

/** hf://datasets/owner/name[@revision]/path (or hf://models/...) -> a local copy through the Hub client. */
async function fetchModelDir(url: string, hubUrl: string, argv: readonly string[]): Promise<string> {
  const u = parseHfUrl(url, {
    what: "--model",
    rule: "G11",
    form: "hf://datasets/owner/name[@revision]/path (or hf://models/...)",
    needPath: "name the folder, e.g. hf://datasets/you/run-ckpts/final",
  });
  refuseMalformedToken({ readsOnly: true }); // K5: before the first request, with advice that works
  const store = createHubClient({ hubUrl, repo: u.repo, repoType: u.repoType, revision: u.revision });
  const dest = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-generate-"));
  try {
    await store.downloadFolder(u.path, dest, {
      progress: (l) => process.stderr.write(`generate: ${l}\n`),
    });
  } catch (e) {
    fs.rmSync(dest, { recursive: true, force: true });
    if (isUserError(e)) throw e;
    const why = `--model ${url}: could not download it (${describeHubError(e)})`;
    throw new UserError("G11", `${why}; ${await modelAdvice(e, u, hubUrl, argv)}`);
  }
  return dest;
}

/** The model folders of a repo listing: folders holding model.safetensors and config.json, final/ first, then newest. */
function modelFolders(files: string[]): string[] {
  const has = new Set(files);
  const dirs = files
    .filter((f) => f.endsWith("/model.safetensors") && has.has(f.replace(/model\.safetensors$/, "config.json")))
    .map((f) => f.slice(0, -"/model.safetensors".length));
  const step = (d: string) => Number(/checkpoint-(\d+)$/.exec(d)?.[1] ?? -1);
  return dirs.sort((a, b) => (b === "final" ? 1 : 0) - (a === "final" ? 1 : 0) || step(b) - step(a));
}

/**
 * G11: what to do when an hf:// model cannot be downloaded, as a command that runs where there is one: the same repo
 * as the other repo type when it exists as that, or a folder of the repo that holds a model; else what to check.
 */
async function modelAdvice(e: unknown, u: HfUrl, hubUrl: string, argv: readonly string[]): Promise<string> {
  const other = u.repoType === "dataset" ? "model" : "dataset";
  const at = u.revision === "main" ? "" : `@${encodeURIComponent(u.revision)}`;
  const cmd = (type: string, folder: string) =>
    commandWith(["node", "dist/generate.js"], argv, ["--model", `hf://${type}s/${u.repo}${at}/${folder}`]);
  try {
    if ((e as { name?: unknown }).name === "RepoMissingError") {
      const there = await createHubClient({ hubUrl, repo: u.repo, repoType: other }).repoExists();
      return there
        ? `${u.repo} is a ${other} repo, not a ${u.repoType} one: generate from it with ${cmd(other, u.path)}`
        : `check the repo id (owner/name), --hub-url and HF_TOKEN`;
    }
    const store = createHubClient({ hubUrl, repo: u.repo, repoType: u.repoType, revision: u.revision });
    const folders = modelFolders((await store.list(undefined, { hashRegular: false })).map((f) => f.path));
    if (folders.length)
      return `the folders of ${u.repo} that hold a model are ${folders.slice(0, 4).join(", ")}${folders.length > 4 ? ` (+${folders.length - 4} more)` : ""}: generate from one, as in ${cmd(u.repoType, folders[0])}`;
  } catch {
    /* the advice below: the Hub did not answer the questions that would have named a folder */
  }
  return "check the path, --hub-url and HF_TOKEN";
}

/** A refusal whose advice changes the command line, with each way written as this command changed (G11). */
function adviceAsCommands(e: { message: string }): { message: string } {
  const argv = process.argv.slice(2);
  return e instanceof UserError ? e.withCommands((ch) => commandWith(["node", "dist/generate.js"], argv, ...ch)) : e;
}

async function main(): Promise<void> {
  guardOutput("the generation goes on"); // O7: `| head -c 10` ends no generation
  let tmp: string | null = null;
  try {
    const a = parseGenerateArgs(process.argv.slice(2));
    if (a === null) {
      process.stdout.write(`${USAGE}\n`);
      return;
    }
    let dir = a.model;
    if (isHfUrl(dir)) dir = tmp = await fetchModelDir(dir, a.hubUrl, process.argv.slice(2));
    const m = loadModelDir(dir, a.tokenizer, a.allowOtherTokenizer);
    const engine = await initEngine(a.backend);
    process.stderr.write(
      `generate: ${a.model} (${m.cfg.numLayers} layers, width ${m.cfg.hiddenSize}, vocab ${m.cfg.vocabSize}) on ${engine.detail}; ${a.temperature === 0 ? "greedy" : `temperature ${a.temperature}, top-k ${a.topK}, top-p ${a.topP}, seed ${a.seed}`}${a.cache ? "" : ", no KV cache"}\n`,
    );
    promptIds(m, a); // G11: a prompt refused is refused before it is printed
    process.stdout.write(a.prompt);
    const t0 = performance.now();
    const r = generateText(m, engine.kernels, a, (s) => process.stdout.write(s));
    const secs = (performance.now() - t0) / 1000;
    process.stdout.write("\n");
    process.stderr.write(
      `generate: ${r.ids.length} tokens in ${secs.toFixed(2)} s (${(r.ids.length / Math.max(1e-9, secs)).toFixed(1)} tok/s)${r.ids.length < a.maxNewTokens ? ", stopped at EOS or the model's length" : ""}\n`,
    );
  } catch (caught) {
    const e = fsRefusal(caught, "O6") ?? caught; // O6: a full disk or a bad path is the user's to fix, not a bug
    if (isUserError(e)) {
      process.stderr.write(`generate: ${adviceAsCommands(e).message}\n`);
      process.exitCode = 2;
    } else {
      process.stderr.write(`generate: internal error (a bug, please report): ${(e as Error)?.stack ?? String(e)}\n`);
      process.exitCode = 1;
    }
  } finally {
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  }
}

if (require.main === module || require.main?.filename?.endsWith(`${path.sep}generate.js`)) {
  void main();
}
