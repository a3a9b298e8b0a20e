// A tiny exported model folder (model.safetensors, config.json and a tokenizer) for the generate tests.
import * as fs from "node:fs";
import * as path from "node:path";
import { buildConfig, hfConfigJson } from "../../src/model/llama-config";
import { initWeights } from "../../src/model/init";
import { paramLayout } from "../../src/model/layout";
import { flatToTensors, writeSafetensors } from "../../src/model/safetensors";
import { writeTinyTokenizer } from "../fixtures/data-synth";
import { corpusDocs } from "../fixtures/corpus-docs";
import { tmpDir } from "./tmp";

/** An exported model (2 layers, width 36, vocab 300, weights from `seed`) with its tokenizer, for generate. */
export function tinyModel(seed = 7): string {
  const dir = tmpDir("tstrain-tiny-model-");
  const cfg = buildConfig({ seqLen: 32, layers: 2, hidden: 36, vocabSize: 300 });
  const params = new Float32Array(paramLayout(cfg).total);
  initWeights(cfg, seed, params);
  writeSafetensors(path.join(dir, "model.safetensors"), flatToTensors(cfg, params), { format: "pt" });
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(hfConfigJson(cfg)));
  writeTinyTokenizer(
    dir,
    corpusDocs().filter((d) => d.length > 0),
  );
  return dir;
}
