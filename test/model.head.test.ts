/**
 * The engines agree: on a 3-kv-head GQA shape (9 query heads, head_dim 22) with a vocabulary the LM head
 * covers in several token chunks, every engine's loss and every gradient match tfjs-wasm's within float rounding
 * (1e-5 relative), with the head chunked or not. tfjs-wasm is the reference: its matmul is XNNPACK's, the rest
 * is the plain-JS kernels (src/model/engine/js.ts); native is OpenBLAS + C.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { buildConfig } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { Llama } from "../src/model/llama";
import { relErr } from "./helpers/numeric";
import { ENGINES, useEngine } from "./helpers/engines";

const cfg = buildConfig({ seqLen: 12, layers: 2, hidden: 198, vocabSize: 5000 });
const { entries, total } = paramLayout(cfg);
const w = new Float32Array(total);
initWeights(cfg, 7, w);
const B = 2,
  T = 12;
const ids = Int32Array.from({ length: B * T }, (_, i) => (i * 2654435761) % cfg.vocabSize);

const results = new Map<string, { loss: number; g: Float32Array; logits: Float32Array }>();

for (const engine of ENGINES) {
  for (const headChunkTokens of [undefined, 7]) {
    // 24 tokens -> 4 chunks, the last partial
    test(`on ${engine} (head chunk ${headChunkTokens ?? "default"}), a 3-kv-head GQA model matches tfjs-wasm's loss and every gradient within 1e-5 (M4)`, async (t) => {
      assert.equal(cfg.numKvHeads, 3);
      const e = await useEngine(t, engine);
      if (!e) return;
      const m = new Llama(cfg, e.kernels, { gradCkpt: true, headChunkTokens });
      m.bindParams(w);
      const g = new Float32Array(total);
      const r = { loss: m.lossAndGrads(ids, B, T, 3, g), g, logits: m.logits(ids, B, T) };
      results.set(`${engine}/${headChunkTokens}`, r);
      const want = results.get("wasm/undefined");
      assert.ok(want, "the tfjs-wasm reference ran first");
      assert.ok(Math.abs(r.loss - want.loss) / want.loss < 1e-6, `loss ${r.loss} vs ${want.loss}`);
      assert.ok(relErr(r.logits, want.logits) < 1e-5, `logits rel err ${relErr(r.logits, want.logits)}`);
      let worst = 0,
        at = "";
      for (const en of entries) {
        const err = relErr(g.subarray(en.offset, en.offset + en.size), want.g.subarray(en.offset, en.offset + en.size));
        assert.ok(err < 1e-5, `${en.name}: rel err ${err}`);
        if (err > worst) {
          worst = err;
          at = en.name;
        }
      }
      console.log(
        `# GQA ${engine} chunk=${headChunkTokens ?? "default"} vs tfjs-wasm: loss ${(Math.abs(r.loss - want.loss) / want.loss).toExponential(2)}, worst gradient ${worst.toExponential(2)} (${at})`,
      );
    });
  }
}
