/**
 * The wasm LM head's backward (JS scaling/transposes on heap views, dh as a sum over vocabulary blocks of 2048
 * rows) against the plain tfjs ops of the cpu backend, on a vocabulary of several blocks with a partial last one
 * and token chunks: loss, and every gradient within float rounding; and wasm run to run bit-identical.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { initBackend } from "../src/model/backend";
import { buildConfig } from "../src/model/config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { relErr } from "./helpers/numeric";
import { Llama } from "../src/model/llama";


test("the wasm LM-head backward over several vocabulary blocks matches the cpu backend's plain ops (M4)", async () => {
  const cfg = buildConfig({ seqLen: 12, layers: 1, hidden: 36, vocabSize: 5000 }); // 3 blocks: 2048, 2048, 904
  const { entries, total } = paramLayout(cfg);
  const w = new Float32Array(total);
  initWeights(cfg, 7, w);
  const B = 2, T = 12;
  const ids = new Int32Array(B * T);
  for (let i = 0; i < ids.length; i++) ids[i] = (i * 2654435761) % cfg.vocabSize;
  const run = async (backend: "wasm" | "cpu", headChunkTokens?: number) => {
    await initBackend(backend);
    const m = new Llama(cfg, { gradCkpt: true, headChunkTokens });
    m.setWeights(w);
    const g = new Float32Array(total);
    const loss = m.lossAndGrads(ids, B, T, 3, g);
    m.dispose();
    return { loss, g };
  };
  const cpu = await run("cpu");
  const wasm = await run("wasm");
  const wasm2 = await run("wasm");
  const chunked = await run("wasm", 7); // 24 tokens -> 4 token chunks, the last partial
  assert.equal(wasm2.loss, wasm.loss);
  assert.deepEqual(wasm2.g, wasm.g);
  for (const r of [wasm, chunked]) {
    assert.ok(Math.abs(r.loss - cpu.loss) / cpu.loss < 1e-6, `loss ${r.loss} vs ${cpu.loss}`);
    for (const e of entries) {
      const err = relErr(r.g.subarray(e.offset, e.offset + e.size), cpu.g.subarray(e.offset, e.offset + e.size));
      assert.ok(err < 1e-5, `${e.name}: rel err ${err}`);
    }
  }
});
