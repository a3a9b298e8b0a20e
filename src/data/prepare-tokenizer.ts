/**
 * `prepare`'s tokenizer (D2): the --tokenizer file loaded and checked before any tokenizing, and the facts the mix
 * records about it. The tokenizing itself runs in the pool's workers (tokenize-pool.ts, tokenize-worker.ts), each
 * loading the same file.
 */
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { UserError } from "../errors";

const TOKENIZER_SIDE_FILES = ["tokenizer_config.json", "special_tokens_map.json"];
const EOS_CANDIDATES = ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>"];

/** A tokenizer.json prepare writes a mix with: where it is, its vocabulary size and end-of-document token, the files
 *  copied beside the shards, and its sha256 (the manifest's tokenizer_sha256). */
export interface LoadedTokenizer {
  path: string;
  configPath: string | null;
  vocabSize: number;
  eosId: number;
  eosToken: string;
  files: string[];
  sha256: string;
}

/** Loads and checks `file` (a UserError naming `shownAs`, what is wrong and the fix, D2): it must parse, load in
 *  @huggingface/tokenizers and encode, and hold an end-of-document token (--eos-token, else tokenizer_config.json's
 *  eos_token, else the usual names). */
export function loadTokenizer(file: string, eosFlag: string | undefined, shownAs = file): LoadedTokenizer {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    throw new UserError(
      "D2",
      `cannot read --tokenizer ${shownAs} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}): pass the path of a Hugging Face tokenizer.json`,
    );
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new UserError(
      "D2",
      `--tokenizer ${shownAs} is not valid JSON (${(e as Error).message}): it must be a Hugging Face tokenizer.json; re-download or regenerate it`,
    );
  }
  const dir = path.dirname(file);
  const cfgPath = path.join(dir, "tokenizer_config.json");
  let cfg: Record<string, unknown> = {};
  let configPath: string | null = null;
  if (fs.existsSync(cfgPath)) {
    try {
      cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
      configPath = cfgPath;
    } catch (e) {
      throw new UserError(
        "D2",
        `${cfgPath} beside the tokenizer is not valid JSON (${(e as Error).message}): fix or remove it`,
      );
    }
  }
  let tk: Tokenizer;
  try {
    tk = new Tokenizer(json as object, cfg);
    tk.encode("prepare self-check: Hello, world! 123", { add_special_tokens: false });
  } catch (e) {
    throw new UserError(
      "D2",
      `--tokenizer ${shownAs} cannot be loaded by @huggingface/tokenizers (${(e as Error).message}): it must be a complete Hugging Face tokenizer.json (model, pre_tokenizer, decoder, added_tokens)`,
    );
  }
  let vocabSize = 0;
  for (const id of tk.get_vocab(true).values()) if (Number.isInteger(id) && id + 1 > vocabSize) vocabSize = id + 1;
  if (vocabSize < 1) throw new UserError("D2", `--tokenizer ${shownAs} has an empty vocabulary`);
  const cfgEos =
    typeof cfg.eos_token === "string" ? cfg.eos_token : (cfg.eos_token as { content?: unknown } | undefined)?.content;
  const tried = eosFlag !== undefined ? [eosFlag] : typeof cfgEos === "string" ? [cfgEos] : EOS_CANDIDATES;
  let eosToken = "";
  let eosId: number | undefined;
  for (const t of tried) {
    eosId = tk.token_to_id(t);
    if (eosId !== undefined) {
      eosToken = t;
      break;
    }
  }
  if (eosId === undefined) {
    throw new UserError(
      "D2",
      `--tokenizer ${shownAs} has no end-of-document token (looked for ${tried.join(", ")}): pass --eos-token NAME with a token from its vocabulary`,
    );
  }
  const files = ["tokenizer.json", ...TOKENIZER_SIDE_FILES.filter((f) => fs.existsSync(path.join(dir, f)))];
  return {
    path: file,
    configPath,
    vocabSize,
    eosId,
    eosToken,
    files,
    sha256: createHash("sha256").update(text).digest("hex"),
  };
}
