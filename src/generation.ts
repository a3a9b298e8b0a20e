/**
 * Text generation from a model folder or from a run's live weights: load an exported `final/` or a checkpoint
 * folder with its tokenizer (the folder's tokenizer.json, else the one of the mix it was trained on, else
 * --tokenizer), generate with the model's own forward pass (model/decode.ts), and sampleAtCheckpoint, the short
 * sample a training run logs at every checkpoint (G11). `node dist/generate.js` (src/generate.ts) is its CLI.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { type FixWay, UserError } from "./errors";
import { configFromHf, type LlamaConfig } from "./model/llama-config";
import { readSafetensors, tensorsToFlat } from "./model/safetensors";
import { paramLayout } from "./model/layout";
import { initEngine, type BackendName, type Engine } from "./model/backend";
import type { Kernels } from "./model/kernels";
import {
  checkSampling,
  generateNoCache,
  generateWithCache,
  GREEDY,
  KvDecoder,
  type SamplingOptions,
} from "./model/decode";
import { Llama } from "./model/llama";
import {
  listCheckpointFolders,
  MANIFEST_FILE,
  readHfConfig,
  readRunConfigIfAny,
  verifyCheckpointFolder,
} from "./checkpoint";
import { recordSample } from "./report";
import { vocabSha256 } from "./data/vocab-hash";

export interface LoadedModel {
  cfg: LlamaConfig;
  params: Float32Array;
  tokenizer: Tokenizer;
  eosId: number | null;
  dir: string;
}

const TOKENIZER_HINT = "pass --tokenizer PATH/tokenizer.json (the mix root holds one)";

export function loadTokenizerFile(file: string): { tk: Tokenizer; eosText: string | null } {
  let json: unknown;
  try {
    json = JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (e) {
    throw new UserError("G11", `cannot read the tokenizer ${file} (${(e as Error).message}); ${TOKENIZER_HINT}`);
  }
  const cfgPath = path.join(path.dirname(file), "tokenizer_config.json");
  let cfg: Record<string, unknown> = {};
  try {
    if (fs.existsSync(cfgPath)) cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new UserError(
      "G11",
      `${cfgPath} beside the tokenizer is not valid JSON (${(e as Error).message}): fix or remove it`,
    );
  }
  const eos =
    typeof cfg.eos_token === "string"
      ? cfg.eos_token
      : ((cfg.eos_token as { content?: string } | undefined)?.content ?? null);
  try {
    const tk = new Tokenizer(json as object, cfg);
    tk.encode("generate self-check: Hello, world! 123", { add_special_tokens: false });
    return { tk, eosText: eos };
  } catch (e) {
    throw new UserError(
      "G11",
      `the tokenizer ${file} cannot be loaded by @huggingface/tokenizers (${(e as Error).message}): it is not a complete Hugging Face tokenizer.json (model, pre_tokenizer, decoder, added_tokens); ${TOKENIZER_HINT}`,
    );
  }
}

/** G11: --model names a path that is not there: say so, and name the checkpoints still on disk beside it. */
function refuseMissingModelDir(dir: string): never {
  const ckpts =
    path.basename(path.dirname(dir)) === "ckpt" && fs.existsSync(path.dirname(dir))
      ? fs
          .readdirSync(path.dirname(dir))
          .filter((n) => /^checkpoint-\d+$/.test(n))
          .sort((a, b) => Number(a.slice(11)) - Number(b.slice(11)))
      : [];
  const there = ckpts.length
    ? ` ${path.dirname(dir)} holds ${ckpts.join(", ")} (only the newest checkpoints stay on disk); e.g. --model ${path.join(path.dirname(dir), ckpts[ckpts.length - 1])}`
    : " Name an exported final/ folder or a checkpoint folder (RUN/final, RUN/ckpt/checkpoint-N)";
  throw new UserError("G11", `--model ${dir} does not exist.${there}`);
}

/** The vocabulary hash `dir` was trained with, and where it is recorded: the export's run_summary.json, else
 *  (a checkpoint folder) the tokenizer.json of the mix root its run_config.json names; null when neither is there. */
function recordedVocab(dir: string): { sha: string; where: string } | null {
  const summaryFile = path.join(dir, "run_summary.json");
  if (fs.existsSync(summaryFile)) {
    let recorded: unknown;
    try {
      recorded = (JSON.parse(fs.readFileSync(summaryFile, "utf8")) as Record<string, unknown>).tokenizer_vocab_sha256;
    } catch (e) {
      throw new UserError(
        "G11",
        `${summaryFile} is not valid JSON (${(e as Error).message}); restore it from the Hub's copy of the export`,
      );
    }
    return typeof recorded === "string" ? { sha: recorded, where: "run_summary.json records" } : null; // older exports record none
  }
  const root = readRunConfigIfAny(dir)?.root;
  const mixTok =
    typeof root === "string"
      ? [root, path.join(root, "mix")].map((r) => path.join(r, "tokenizer.json")).find((f) => fs.existsSync(f))
      : undefined;
  return mixTok
    ? { sha: vocabSha256(loadTokenizerFile(mixTok).tk.get_vocab(true)), where: `the run's mix root (${mixTok}) has` }
    : null;
}

/** G11: a tokenizer whose ids differ from the ones the model was trained with would print garbage: refused unless allowed. */
function checkTokenizerIdentity(
  dir: string,
  tokFile: string,
  tk: Tokenizer,
  allowOther: boolean,
  /** whether the tokenizer was named by --tokenizer, and the folder's own is there to use without it */
  droppable: () => boolean,
): void {
  const recorded = allowOther ? null : recordedVocab(dir);
  if (!recorded) return;
  const got = vocabSha256(tk.get_vocab(true));
  if (got === recorded.sha) return;
  throw new UserError(
    "G11",
    `the tokenizer ${tokFile} is not the one ${dir} was trained with: its vocabulary hash is ${got.slice(0, 16)}…, ${recorded.where} ${recorded.sha.slice(0, 16)}… (the same ids would mean other tokens, so the text would be garbage): run `,
    {
      ways: [
        ...(droppable()
          ? [
              {
                changes: [["--tokenizer", null]] as const,
                why: "the model's own tokenizer: the export's tokenizer.json, or the mix root's",
              },
            ]
          : []),
        { changes: [["--allow-other-tokenizer", true]], why: "if its ids are known to match" },
      ],
    },
  );
}

/**
 * K7: a checkpoint folder (one with a manifest.json) proves itself against it before its weights are used, as a
 * resume does; a mismatch is refused naming the file, with the folders still to be trusted beside it. An export
 * (final/) carries no manifest.
 */
function checkManifest(dir: string): void {
  if (!fs.existsSync(path.join(dir, MANIFEST_FILE))) return;
  const others = listCheckpointFolders(path.dirname(path.resolve(dir))).filter(
    (c) => path.resolve(c.dir) !== path.resolve(dir),
  );
  const exported = path.join(path.dirname(path.dirname(path.resolve(dir))), "final");
  const ways: FixWay[] = [
    ...(others.length
      ? [{ changes: [["--model", others[others.length - 1].dir]] as const, why: "the newest other checkpoint" }]
      : []),
    ...(fs.existsSync(path.join(exported, "model.safetensors"))
      ? [{ changes: [["--model", exported]] as const, why: "the run's export" }]
      : []),
  ];
  const advice = ways.length
    ? { advice: "Generate from another folder: run ", ways }
    : { advice: "Generate from another checkpoint folder or an exported final/ folder", ways };
  verifyCheckpointFolder(dir, {
    allowNoManifest: true,
    advice,
    flag: "--model",
    unlisted: ["tokenizer.json", "tokenizer_config.json"],
  });
}

/** The tokenizer a model folder is read with when --tokenizer names none: its own, else its run's mix root's (a --demo
 *  run records its data folder, whose mix/ is the root); else the mix root it records, if any. */
function ownTokenizer(dir: string): string | { root?: string } {
  const inDir = path.join(dir, "tokenizer.json");
  if (fs.existsSync(inDir)) return inDir;
  const recorded = readRunConfigIfAny(dir)?.root;
  const root = typeof recorded === "string" ? recorded : undefined;
  const found = root
    ? [root, path.join(root, "mix")].map((r) => path.join(r, "tokenizer.json")).find((f) => fs.existsSync(f))
    : undefined;
  return found ?? { root };
}

/** Reads a model folder (final/ or a checkpoint): config.json, model.safetensors and a tokenizer. */
export function loadModelDir(dir: string, tokenizerFlag?: string, allowOtherTokenizer = false): LoadedModel {
  const cfgFile = path.join(dir, "config.json"),
    wFile = path.join(dir, "model.safetensors");
  if (!fs.existsSync(dir)) refuseMissingModelDir(dir);
  if (!fs.existsSync(cfgFile) || !fs.existsSync(wFile)) {
    throw new UserError(
      "G11",
      `--model ${dir} holds no config.json + model.safetensors: name an exported final/ folder or a checkpoint folder (RUN/final, RUN/ckpt/checkpoint-N)`,
    );
  }
  checkManifest(dir);
  const cfg = configFromHf(readHfConfig(dir));
  const params = new Float32Array(paramLayout(cfg).total);
  tensorsToFlat(cfg, readSafetensors(wFile).tensors, params);
  let tokFile = tokenizerFlag;
  if (tokFile === undefined) {
    const own = ownTokenizer(dir);
    if (typeof own !== "string")
      throw new UserError(
        "G11",
        `no tokenizer.json in ${dir}${own.root ? ` nor in the run's mix root ${own.root}` : ""}; ${TOKENIZER_HINT}`,
      );
    tokFile = own;
  }
  const { tk, eosText } = loadTokenizerFile(tokFile);
  // --tokenizer can be dropped where the folder's own tokenizer (or its mix root's) is there
  const droppable = () => tokenizerFlag !== undefined && typeof ownTokenizer(dir) === "string";
  checkTokenizerIdentity(dir, tokFile, tk, allowOtherTokenizer, droppable);
  const vocab = tk.get_vocab(true);
  let maxId = -1;
  for (const id of vocab.values()) if (id > maxId) maxId = id;
  if (maxId >= cfg.vocabSize)
    throw new UserError(
      "G11",
      `the tokenizer ${tokFile} has ids up to ${maxId} but the model's vocabulary is ${cfg.vocabSize}; ${TOKENIZER_HINT}`,
    );
  const eosId = eosText !== null ? (tk.token_to_id(eosText) ?? cfg.eosTokenId) : cfg.eosTokenId;
  return { cfg, params, tokenizer: tk, eosId, dir };
}

/** Prints text as tokens arrive: decodes the whole continuation and writes the new suffix, holding back a
 *  trailing U+FFFD (half of a multi-byte character whose other half is still to come). */
export function streamingDecoder(tk: Tokenizer, write: (s: string) => void): { push(id: number): void; end(): string } {
  const ids: number[] = [];
  let shown = "";
  const flush = (final: boolean): void => {
    let text = tk.decode(ids, { skip_special_tokens: true });
    if (!final) while (text.endsWith("\uFFFD")) text = text.slice(0, -1);
    if (text.startsWith(shown) && text.length > shown.length) {
      write(text.slice(shown.length));
      shown = text;
    }
  };
  return {
    push(id) {
      ids.push(id);
      flush(false);
    },
    end() {
      flush(true);
      return shown;
    },
  };
}

export interface GenerateRequest extends SamplingOptions {
  prompt: string;
  maxNewTokens: number;
  cache: boolean;
}

/**
 * G11: the request checked against the model, and the prompt's ids: refused when the prompt encodes to nothing
 * or leaves no position to generate into. The CLI asks before it prints the prompt, so a refused one is not shown.
 */
export function promptIds(m: LoadedModel, r: GenerateRequest): number[] {
  checkSampling(r);
  if (!Number.isInteger(r.maxNewTokens) || r.maxNewTokens < 1)
    throw new UserError("G11", `--max-new-tokens ${r.maxNewTokens} must be a whole number >= 1`);
  const prompt = m.tokenizer.encode(r.prompt, { add_special_tokens: false }).ids;
  if (prompt.length === 0)
    throw new UserError("G11", `--prompt ${JSON.stringify(r.prompt)} encodes to no tokens: give some text`);
  if (m.cfg.maxPositionEmbeddings - prompt.length < 1)
    throw new UserError(
      "G11",
      `the prompt is ${prompt.length} tokens, the model has ${m.cfg.maxPositionEmbeddings} positions: shorten it`,
    );
  return prompt;
}

/** Generates text from a loaded model on an engine's kernels; `onText` sees the text as it streams. */
export function generateText(
  m: LoadedModel,
  kernels: Kernels,
  r: GenerateRequest,
  onText: (s: string) => void = () => undefined,
): { ids: number[]; text: string } {
  const prompt = promptIds(m, r);
  const n = Math.min(r.maxNewTokens, m.cfg.maxPositionEmbeddings - prompt.length);
  const dec = streamingDecoder(m.tokenizer, onText);
  const o = { ...r, maxNewTokens: n, eosId: m.eosId, onToken: (id: number) => dec.push(id) };
  let ids: number[];
  if (r.cache) {
    ids = generateWithCache(new KvDecoder(m.cfg, kernels, m.params, prompt.length + n), prompt, o);
  } else {
    const model = new Llama(m.cfg, kernels, { gradCkpt: false });
    model.bindParams(m.params);
    ids = generateNoCache((seq) => lastLogits(model, seq, m.cfg.vocabSize), prompt, o);
  }
  return { ids, text: dec.end() };
}

/** The training forward's next-token logits for a sequence (the no-cache reference path). A one-token sequence
 *  is run as two tokens (the forward needs T >= 2); causality makes row 0 the same. */
export function lastLogits(model: Llama, seq: number[], V: number): Float32Array {
  const T = Math.max(2, seq.length);
  const ids = Int32Array.from(seq.length >= 2 ? seq : [seq[0], 0]);
  const all = model.logits(ids, 1, T);
  const row = seq.length - 1;
  return all.slice(row * V, (row + 1) * V);
}

// ---------------------------------------------------------------------------------------------
// the sample a training run logs at every checkpoint (G11)

export const SAMPLE_PROMPT = "The";
export const SAMPLE_TOKENS = 32;
let sampleEngine: Promise<Engine> | null = null;

/**
 * Greedy continuation of SAMPLE_PROMPT from the current weights (a view on the master weights, read between
 * steps), appended to <out>/samples.jsonl and returned as one log line. Never fails the run: an error becomes
 * the line.
 */
export async function sampleAtCheckpoint(o: {
  out: string;
  root: string;
  cfg: LlamaConfig;
  params: Float32Array;
  step: number;
  backend: BackendName;
}): Promise<string> {
  try {
    sampleEngine ??= initEngine(o.backend === "native" || o.backend === "auto" ? o.backend : "cpu");
    const { kernels } = await sampleEngine;
    const tokFile = path.join(o.root, "tokenizer.json");
    const { tk, eosText } = loadTokenizerFile(tokFile);
    const eosId = eosText !== null ? (tk.token_to_id(eosText) ?? o.cfg.eosTokenId) : o.cfg.eosTokenId;
    const m: LoadedModel = { cfg: o.cfg, params: o.params, tokenizer: tk, eosId, dir: o.out };
    const r = generateText(m, kernels, { ...GREEDY, prompt: SAMPLE_PROMPT, maxNewTokens: SAMPLE_TOKENS, cache: true });
    recordSample(o.out, {
      step: o.step,
      prompt: SAMPLE_PROMPT,
      text: r.text,
      decoding: `greedy, ${SAMPLE_TOKENS} tokens`,
    });
    return `sample @ step ${o.step}: ${JSON.stringify(SAMPLE_PROMPT + r.text)}`;
  } catch (e) {
    return `sample @ step ${o.step} failed (training goes on): ${(e as Error).message}`;
  }
}
