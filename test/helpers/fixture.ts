// The llama-tiny float64 reference (test/fixtures/llama-tiny), loaded once by HF names (M4, M7).
import * as fs from "node:fs";
import * as path from "node:path";
import { configFromHf, type LlamaConfig } from "../../src/model/llama-config";
import { paramLayout } from "../../src/model/layout";
import { readSafetensors, tensorsToFlat } from "../../src/model/safetensors";

export const FIX = path.join(__dirname, "..", "..", "..", "test", "fixtures", "llama-tiny");

export interface TinyReference {
  input_ids: number[][];
  loss: number;
  grad_global_norm: number;
  adamw: { lr: number; betas: [number, number]; eps: number; weight_decay: number; max_grad_norm: number };
}

export function loadTinyFixture() {
  const cfg: LlamaConfig = configFromHf(JSON.parse(fs.readFileSync(path.join(FIX, "config.json"), "utf8")));
  const ref = JSON.parse(fs.readFileSync(path.join(FIX, "reference.json"), "utf8")) as TinyReference;
  const layout = paramLayout(cfg);
  const weights = new Float32Array(layout.total);
  tensorsToFlat(cfg, readSafetensors(path.join(FIX, "model.safetensors")).tensors, weights);
  return {
    cfg,
    ref,
    layout,
    weights,
    B: ref.input_ids.length,
    T: ref.input_ids[0].length,
    ids: Int32Array.from(ref.input_ids.flat()),
  };
}
