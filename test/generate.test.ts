// Generation (G11): the KV-cache decoder against the training forward, on every engine; decoding options; the CLI.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { buildConfig, hfConfigJson } from "../src/model/llama-config";
import { initWeights } from "../src/model/init";
import { paramLayout } from "../src/model/layout";
import { KvCache, Llama } from "../src/model/llama";
import type { Kernels } from "../src/model/kernels";
import { jsKernels } from "../src/model/engine/js";
import { flatToTensors, writeSafetensors } from "../src/model/safetensors";
import { generateNoCache, generateWithCache, GREEDY, KvDecoder, pickToken, seededRandom } from "../src/model/decode";
import { lastLogits, loadModelDir } from "../src/generation";
import { ENGINES, useEngine } from "./helpers/engines";
import { maxAbs, maxAbsDiff } from "./helpers/numeric";
import { tmpDir } from "./helpers/tmp";
import { advisedCommands, assertAdviceRuns } from "./helpers/cli";
import { tinyRun } from "./helpers/run";
import { writeTinyTokenizer } from "./fixtures/data-synth";
import { corpusDocs, corpusJsonl } from "./fixtures/corpus-docs";

const GENERATE = path.join(__dirname, "..", "generate.js");
// a small model (hidden 144: 9 query heads over 3 kv heads, as buildConfig derives them as buildConfig derives them), 3 layers, vocab 300
const cfg = buildConfig({ seqLen: 48, layers: 3, hidden: 144, vocabSize: 300 });
const params = new Float32Array(paramLayout(cfg).total);
initWeights(cfg, 1234, params);
// sharpen the model: init weights (std 0.02) give near-uniform logits, where a 1e-7 rounding could flip an
// argmax, and a greedy loop on one token; x6 on the embedding and every projection gives varied continuations
for (const e of paramLayout(cfg).entries) {
  if (e.name.endsWith("embed_tokens.weight") || e.name.includes("_proj."))
    for (let i = e.offset; i < e.offset + e.size; i++) params[i] *= 6;
}
const prompt = [5, 17, 42, 7, 99];

for (const engine of ENGINES) {
  test(`on ${engine}, the KV-cache decoder's logits at every position equal the training forward's (G11)`, async (t) => {
    const e = await useEngine(t, engine);
    if (!e) return;
    const model = new Llama(cfg, e.kernels, { gradCkpt: false });
    model.bindParams(params);
    const T = 40,
      V = cfg.vocabSize;
    const rnd = seededRandom(9);
    const ids = Int32Array.from({ length: T }, () => Math.floor(rnd() * V));
    const full = model.logits(ids, 1, T);
    const dec = new KvDecoder(cfg, e.kernels, params, T);
    const scale = maxAbs(full);
    assert.ok(scale > 1, `logits are not flat (max |logit| ${scale})`);
    for (let p = 0; p < T; p++) {
      const got = dec.step(ids[p]);
      const { diff, at } = maxAbsDiff(got, full.subarray(p * V, (p + 1) * V));
      assert.ok(diff <= 1e-5 * scale, `position ${p}: max |diff| ${diff} at vocab ${at} (scale ${scale})`);
    }
    assert.equal(dec.pos, T);
  });

  test(`on ${engine}, generation with the KV cache equals generation without it, token for token, greedy and sampled (G11)`, async (t) => {
    const e = await useEngine(t, engine);
    if (!e) return;
    const model = new Llama(cfg, e.kernels, { gradCkpt: false });
    model.bindParams(params);
    const full = (seq: number[]) => lastLogits(model, seq, cfg.vocabSize);
    for (const o of [
      { ...GREEDY },
      { temperature: 0.9, topK: 40, topP: 0.95, seed: 7 },
      { temperature: 1.3, topK: 0, topP: 1, seed: 11 },
    ]) {
      const opts = { ...o, maxNewTokens: 30, eosId: null };
      const dec = new KvDecoder(cfg, e.kernels, params, prompt.length + 30);
      const a = generateWithCache(dec, prompt, opts);
      const b = generateNoCache(full, prompt, opts);
      assert.equal(a.length, 30);
      assert.deepEqual(a, b, `${JSON.stringify(o)}: cached vs uncached`);
      assert.ok(new Set(a).size > 10, "the continuation is varied, not a loop on a few tokens");
    }
    // a one-token prompt works on both paths
    const dec = new KvDecoder(cfg, e.kernels, params, 11);
    assert.deepEqual(
      generateWithCache(dec, [3], { ...GREEDY, maxNewTokens: 10, eosId: null }),
      generateNoCache(full, [3], { ...GREEDY, maxNewTokens: 10, eosId: null }),
    );
  });
}

/** Float64 cached attention: new position t of T (absolute P+t), query head h, kv head floor(h*K/H), over u <= P+t. */
function refCachedAttention(
  q: Float32Array,
  kc: Float32Array,
  vc: Float32Array,
  P: number,
  T: number,
  H: number,
  K: number,
  E: number,
): Float64Array {
  const out = new Float64Array(T * H * E);
  for (let t = 0; t < T; t++)
    for (let h = 0; h < H; h++) {
      const j = Math.floor((h * K) / H),
        sc: number[] = [];
      for (let u = 0; u <= P + t; u++) {
        let s = 0;
        for (let e = 0; e < E; e++) s += q[(t * H + h) * E + e] * kc[(u * K + j) * E + e];
        sc.push(s / Math.sqrt(E));
      }
      const mx = Math.max(...sc),
        ex = sc.map((x) => Math.exp(x - mx)),
        sum = ex.reduce((a, b) => a + b, 0);
      for (let u = 0; u <= P + t; u++)
        for (let e = 0; e < E; e++) out[(t * H + h) * E + e] += (ex[u] / sum) * vc[(u * K + j) * E + e];
    }
  return out;
}

for (const engine of ENGINES) {
  test(`on ${engine}, the cached-attention kernel equals the JS reference and float64: GQA, a cache of past positions, several new ones (G11)`, async (t) => {
    const e = await useEngine(t, engine);
    if (!e) return;
    const rnd = seededRandom(21);
    const r = (n: number, scale: number) => Float32Array.from({ length: n }, () => (rnd() * 2 - 1) * scale);
    for (const [P, T, H, K, E] of [
      [0, 1, 1, 1, 4],
      [0, 5, 4, 2, 6],
      [7, 1, 9, 3, 16],
      [37, 3, 6, 2, 8],
      [70, 4, 4, 1, 5],
    ] as const) {
      const what = `P${P} T${T} H${H} K${K} E${E}`,
        S = P + T + 3; // rows past P+T-1 hold NaN: the kernel must not read them
      const q = r(T * H * E, 2),
        kc = r(S * K * E, 2),
        vc = r(S * K * E, 1);
      kc.fill(NaN, (P + T) * K * E);
      vc.fill(NaN, (P + T) * K * E);
      const got = new Float32Array(T * H * E).fill(NaN),
        want = new Float32Array(T * H * E).fill(NaN);
      e.kernels.attentionCachedForward(got, q, kc, vc, P, T, H, K, E);
      jsKernels.attentionCachedForward(want, q, kc, vc, P, T, H, K, E);
      const ref = refCachedAttention(q, kc, vc, P, T, H, K, E);
      const vsJs = maxAbsDiff(got, want),
        vs64 = maxAbsDiff(got, ref);
      assert.ok(vsJs.diff <= 1e-6, `${what}: max |${engine} - js| ${vsJs.diff} at ${vsJs.at}`);
      assert.ok(vs64.diff <= 2e-5, `${what}: max |${engine} - float64| ${vs64.diff} at ${vs64.at}`);
      if (P === 0) {
        // with nothing cached before, it is the training kernel's attention of one sequence
        const out = new Float32Array(T * H * E),
          lse = new Float32Array(H * T);
        e.kernels.attentionForward(out, lse, q, kc.subarray(0, T * K * E), vc.subarray(0, T * K * E), 1, T, H, K, E);
        const d = maxAbsDiff(got, out);
        assert.ok(d.diff <= 1e-5, `${what}: max |cached - attentionForward| ${d.diff} at ${d.at}`);
      }
    }
  });

  test(`on ${engine}, the model's cached forward takes a prompt in one pass, then one token at a time, with the training forward's logits (G11)`, async (t) => {
    const e = await useEngine(t, engine);
    if (!e) return;
    const model = new Llama(cfg, e.kernels, { gradCkpt: false });
    model.bindParams(params);
    const T = 16,
      V = cfg.vocabSize,
      rnd = seededRandom(13);
    const ids = Int32Array.from({ length: T }, () => Math.floor(rnd() * V));
    const full = model.logits(ids, 1, T),
      scale = maxAbs(full);
    const cache = new KvCache(cfg, T);
    const got = new Float32Array(T * V);
    got.set(model.forwardCached(ids.subarray(0, 7), cache), 0); // the prompt: 7 new positions at once
    for (let p = 7; p < T; p++) got.set(model.forwardCached(ids.subarray(p, p + 1), cache), p * V);
    assert.equal(cache.length, T);
    const { diff, at } = maxAbsDiff(got, full);
    assert.ok(diff <= 1e-5 * scale, `max |diff| ${diff} at ${at} (position ${Math.floor(at / V)}, scale ${scale})`);
    assert.throws(() => model.forwardCached(ids.subarray(0, 1), cache), /reached the model's 16 positions/);
    cache.reset();
    assert.throws(() => model.forwardCached(Int32Array.of(3, V), cache), /token id 300 is outside the vocabulary/);
    assert.equal(cache.length, 0, "a refused pass leaves the cache as it was");
  });
}

test("generation runs training's forward ops through the kernel interface, attention only as attentionCachedForward (G11)", async () => {
  const e = await useEngine({ skip: () => undefined } as never, "cpu");
  const counting = (calls: Map<string, number>): Kernels =>
    new Proxy(e!.kernels, {
      get(target, prop, recv) {
        const v = Reflect.get(target, prop, recv);
        if (typeof v !== "function") return v;
        return (...args: unknown[]) => {
          calls.set(String(prop), (calls.get(String(prop)) ?? 0) + 1);
          return (v as (...a: unknown[]) => unknown).apply(target, args);
        };
      },
    });
  const L = cfg.numLayers;
  const dec = new Map<string, number>(),
    fwd = new Map<string, number>();
  new KvDecoder(cfg, counting(dec), params, 4).step(5);
  const model = new Llama(cfg, counting(fwd), { gradCkpt: false, headChunkTokens: 2 });
  model.bindParams(params);
  model.logits(Int32Array.of(5, 6), 1, 2); // one head chunk, as one decoder step has
  assert.equal(dec.get("attentionCachedForward"), L, "one cached attention per layer");
  assert.equal(dec.get("attentionForward"), undefined, "the decoder runs no other attention");
  assert.equal(fwd.get("attentionForward"), L);
  dec.delete("attentionCachedForward");
  fwd.delete("attentionForward");
  // every other op the training forward calls, the same number of times: embedding, 2L+1 norms, 7L+1 products,
  // 2L RoPE, L SwiGLU
  assert.deepEqual(Object.fromEntries([...dec].sort()), Object.fromEntries([...fwd].sort()));
  assert.equal(dec.get("matmul"), 7 * L + 1);
  assert.equal(dec.get("rmsnormForward"), 2 * L + 1);
});

test("a layer's weights are named in one place, src/model/layout.ts (one forward pass)", () => {
  const src = path.join(__dirname, "..", "..", "src");
  const files = (fs.readdirSync(src, { recursive: true }) as string[]).filter((f) => f.endsWith(".ts"));
  assert.ok(files.length > 20, `found the sources (${files.length} files under ${src})`);
  const naming: string[] = [];
  for (const f of files) {
    const text = fs.readFileSync(path.join(src, f), "utf8");
    // an HF per-layer tensor name, or a field list of a layer's weights
    if (/_proj\.weight|input_layernorm|post_attention_layernorm|(?<!\.)\b(wq|wGate|inputNorm)\s*:/.test(text))
      naming.push(f.split(path.sep).join("/"));
  }
  assert.deepEqual(naming, ["model/layout.ts"]);
});

test("decoding: greedy is the argmax, top-k 1 is greedy, a seed repeats, EOS stops and is not emitted (G11)", async () => {
  const logits = Float32Array.from([0.1, 2.5, -1, 2.4, 0]);
  assert.equal(pickToken(logits, GREEDY, seededRandom(0)), 1);
  const r = seededRandom(5);
  for (let i = 0; i < 20; i++) assert.equal(pickToken(logits, { temperature: 1, topK: 1, topP: 1, seed: 0 }, r), 1);
  // top-p 0.5 over {1: 2.5, 3: 2.4, ...}: token 1 alone has p ~ 0.46 < 0.5, so {1, 3} remain
  const seen = new Set<number>();
  for (let i = 0; i < 200; i++) seen.add(pickToken(logits, { temperature: 1, topK: 0, topP: 0.5, seed: 0 }, r));
  assert.deepEqual([...seen].sort(), [1, 3]);
  const draw = (seed: number): number[] => {
    const g = seededRandom(seed);
    return Array.from({ length: 50 }, () => pickToken(logits, { temperature: 1, topK: 0, topP: 1, seed }, g));
  };
  assert.deepEqual(draw(3), draw(3));
  assert.notDeepEqual(draw(3), draw(4));
  const e = await useEngine({ skip: () => undefined } as never, "cpu");
  const dec = new KvDecoder(cfg, e!.kernels, params, 40);
  const free = generateWithCache(dec, prompt, { ...GREEDY, maxNewTokens: 20, eosId: null });
  const stopAt = free[4];
  const stopped = generateWithCache(dec, prompt, { ...GREEDY, maxNewTokens: 20, eosId: stopAt });
  assert.deepEqual(stopped, free.slice(0, free.indexOf(stopAt)));
});

test("node dist/generate.js prints the prompt and its continuation from a final/ folder, and refuses bad options (G11)", () => {
  const dir = tmpDir("gen-final");
  writeSafetensors(path.join(dir, "model.safetensors"), flatToTensors(cfg, params), { format: "pt" });
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(hfConfigJson(cfg)));
  const tk = writeTinyTokenizer(
    dir,
    corpusDocs().filter((d) => d.length > 0),
  );
  assert.equal(path.dirname(tk), dir);
  const r = spawnSync(
    process.execPath,
    [GENERATE, "--model", dir, "--prompt", "The", "--max-new-tokens", "12", "--backend", "cpu"],
    { encoding: "utf8" },
  );
  assert.equal(r.status, 0, r.stderr);
  assert.ok(r.stdout.startsWith("The") && r.stdout.trim().length > 3, `stdout: ${JSON.stringify(r.stdout)}`);
  assert.match(r.stderr, /generate: \d+ tokens in/);
  const s1 = spawnSync(
    process.execPath,
    [
      GENERATE,
      "--model",
      dir,
      "--prompt",
      "The",
      "--max-new-tokens",
      "12",
      "--backend",
      "cpu",
      "--temperature",
      "0.8",
      "--top-k",
      "50",
      "--seed",
      "4",
    ],
    { encoding: "utf8" },
  );
  const s2 = spawnSync(
    process.execPath,
    [
      GENERATE,
      "--model",
      dir,
      "--prompt",
      "The",
      "--max-new-tokens",
      "12",
      "--backend",
      "cpu",
      "--temperature",
      "0.8",
      "--top-k",
      "50",
      "--seed",
      "4",
      "--no-cache",
    ],
    { encoding: "utf8" },
  );
  assert.equal(s1.status, 0, s1.stderr);
  assert.equal(s1.stdout, s2.stdout, "a seed gives the same text with and without the cache");
  const bad = spawnSync(process.execPath, [GENERATE, "--model", dir, "--prompt", "The", "--top-p", "1.5"], {
    encoding: "utf8",
  });
  assert.equal(bad.status, 2);
  assert.match(
    bad.stderr,
    /--top-p 1\.5 must be in \(0, 1\] \(1 = off\): run node dist\/generate\.js .* --top-p 1 \(off\), or node dist\/generate\.js .* --top-p 0\.9 \(the 90% most likely\) \[G11\]/,
  );
  for (const r of assertAdviceRuns(bad.stderr, { min: 2 })) assert.match(r.stdout, /^The/, r.cmd);
  const empty = tmpDir("gen-empty");
  const none = spawnSync(process.execPath, [GENERATE, "--model", empty, "--prompt", "The"], { encoding: "utf8" });
  assert.equal(none.status, 2);
  assert.match(
    none.stderr,
    /holds no config\.json \+ model\.safetensors: name an exported final\/ folder or a checkpoint folder/,
  );
});

test("generate --model on a path that does not exist says so, and names the checkpoints that do (G11)", () => {
  const run = tmpDir("gen-missing");
  const missing = spawnSync(process.execPath, [GENERATE, "--model", path.join(run, "final"), "--prompt", "The"], {
    encoding: "utf8",
  });
  assert.equal(missing.status, 2, missing.stderr);
  assert.match(
    missing.stderr,
    /^generate: --model \S+\/final does not exist\. Name an exported final\/ folder or a checkpoint folder/,
  );
  assert.doesNotMatch(missing.stderr, /holds no config\.json/);
  for (const n of [270, 300]) fs.mkdirSync(path.join(run, "ckpt", `checkpoint-${n}`), { recursive: true });
  const pruned = spawnSync(
    process.execPath,
    [GENERATE, "--model", path.join(run, "ckpt", "checkpoint-150"), "--prompt", "The"],
    { encoding: "utf8" },
  );
  assert.equal(pruned.status, 2, pruned.stderr);
  assert.match(
    pruned.stderr,
    /--model \S+checkpoint-150 does not exist\. \S+\/ckpt holds checkpoint-270, checkpoint-300 \(only the newest checkpoints stay on disk\); e\.g\. --model \S+\/ckpt\/checkpoint-300 \[G11\]/,
  );
});

test("a model folder whose config.json is damaged is refused naming the file (K2), not a parse crash", () => {
  const dir = tmpDir("gen-badcfg");
  fs.writeFileSync(path.join(dir, "config.json"), "{ not json");
  fs.writeFileSync(path.join(dir, "model.safetensors"), Buffer.alloc(16));
  assert.throws(
    () => loadModelDir(dir),
    (e: unknown) =>
      (e as Error).name === "UserError" &&
      /checkpoint config\.json at .*config\.json is not valid JSON/.test((e as Error).message) &&
      (e as { rule?: string }).rule === "K2",
  );
});

test("generate --tokenizer with a file that is not a tokenizer is refused, exit 2, naming the path (G11)", () => {
  const dir = tmpDir("gen-nottok");
  writeSafetensors(path.join(dir, "model.safetensors"), flatToTensors(cfg, params), { format: "pt" });
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(hfConfigJson(cfg)));
  const notTok = path.join(dir, "config.json"); // valid JSON, not a tokenizer: what a slip of the tab key gives
  const r = spawnSync(
    process.execPath,
    [GENERATE, "--model", dir, "--tokenizer", notTok, "--prompt", "The", "--backend", "cpu"],
    { encoding: "utf8" },
  );
  assert.equal(r.status, 2, r.stderr);
  assert.match(
    r.stderr,
    new RegExp(
      `^generate: the tokenizer ${notTok.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} cannot be loaded by @huggingface/tokenizers .*it is not a complete Hugging Face tokenizer\\.json.*\\[G11\\]\\n$`,
      "s",
    ),
  );
  assert.doesNotMatch(r.stderr, /internal error|\n\s+at /);
});

test("the export records its tokenizer's vocabulary hash, and generate refuses a tokenizer with other ids (same size, shuffled) unless --allow-other-tokenizer (G11)", {
  timeout: 180_000,
}, () => {
  const work = tmpDir("gen-tokid");
  const tok = writeTinyTokenizer(
    path.join(work, "tok"),
    corpusDocs().filter((d) => d.length > 0),
  );
  fs.writeFileSync(path.join(work, "c.jsonl"), corpusJsonl());
  const run = (file: string, args: string[]) =>
    spawnSync(process.execPath, [path.join(__dirname, "..", file), ...args], { encoding: "utf8", timeout: 150_000 });
  const mix = path.join(work, "mix");
  const p = run("prepare.js", [
    "--input",
    path.join(work, "c.jsonl"),
    "--tokenizer",
    tok,
    "--out",
    mix,
    "--workers",
    "1",
    "--val-fraction",
    "0.05",
  ]);
  assert.equal(p.status, 0, p.stderr);
  const t = run(
    "main.js",
    tinyRun(mix, path.join(work, "run"), ["--vocab-size", "320", "--max-steps", "4", "--backend", "wasm"]),
  );
  assert.equal(t.status, 0, t.stderr);
  const final = path.join(work, "run", "final");
  const recorded = JSON.parse(fs.readFileSync(path.join(final, "run_summary.json"), "utf8")).tokenizer_vocab_sha256;
  assert.match(recorded, /^[0-9a-f]{64}$/);
  const gen = (extra: string[]) =>
    run("generate.js", ["--model", final, "--prompt", "The", "--max-new-tokens", "4", "--backend", "cpu", ...extra]);
  assert.equal(gen([]).status, 0, "its own tokenizer");
  // The same tokenizer written differently (indented, keys in another order) is the same vocabulary.
  const j = JSON.parse(fs.readFileSync(tok, "utf8"));
  const same = path.join(work, "same", "tokenizer.json");
  fs.mkdirSync(path.dirname(same));
  fs.writeFileSync(same, JSON.stringify({ model: j.model, ...j }, null, 2));
  assert.equal(gen(["--tokenizer", same]).status, 0, "the same vocabulary, formatted otherwise");
  // Same tokens, same size, ids shuffled among the ordinary tokens (the added tokens keep theirs).
  const special = new Set((j.added_tokens as { id: number }[]).map((a) => a.id));
  const ids = Object.values(j.model.vocab as Record<string, number>)
    .filter((id) => !special.has(id))
    .sort((a, b) => a - b);
  const shuffledId = new Map(ids.map((id, i) => [id, ids[ids.length - 1 - i]]));
  for (const k of Object.keys(j.model.vocab))
    if (shuffledId.has(j.model.vocab[k])) j.model.vocab[k] = shuffledId.get(j.model.vocab[k]);
  const other = path.join(work, "shuffled", "tokenizer.json");
  fs.mkdirSync(path.dirname(other));
  fs.writeFileSync(other, JSON.stringify(j));
  const refused = gen(["--tokenizer", other]);
  assert.equal(refused.status, 2, refused.stderr);
  assert.match(
    refused.stderr,
    new RegExp(
      `the tokenizer \\S+shuffled/tokenizer\\.json is not the one \\S+final was trained with: its vocabulary hash is [0-9a-f]{16}…, run_summary\\.json records ${recorded.slice(0, 16)}… .*: run node dist/generate\\.js .* \\(the model's own tokenizer: .*\\), or node dist/generate\\.js .* --allow-other-tokenizer \\(if its ids are known to match\\) \\[G11\\]`,
    ),
  );
  assert.equal(refused.stdout, "", "nothing generated");
  // the advice, as printed: without --tokenizer (the export's own), or with --allow-other-tokenizer
  assert.doesNotMatch(advisedCommands(refused.stderr)[0], /--tokenizer/);
  assertAdviceRuns(refused.stderr, { min: 2 });
  // A checkpoint folder records nothing itself: the tokenizer of the mix root its run_config.json names is the record.
  const ckpt = path.join(work, "run", "ckpt", "checkpoint-4");
  const genCk = (extra: string[]) =>
    run("generate.js", ["--model", ckpt, "--prompt", "The", "--max-new-tokens", "4", "--backend", "cpu", ...extra]);
  assert.equal(genCk([]).status, 0, "the mix root's tokenizer");
  const ckRefused = genCk(["--tokenizer", other]);
  assert.equal(ckRefused.status, 2, ckRefused.stderr);
  assert.match(
    ckRefused.stderr,
    /is not the one \S+checkpoint-4 was trained with: its vocabulary hash is [0-9a-f]{16}…, the run's mix root \(\S+mix\/tokenizer\.json\) has [0-9a-f]{16}…/,
  );
  assertAdviceRuns(ckRefused.stderr, { min: 2 }); // the mix root's tokenizer, or this one allowed
  // A shuffled tokenizer put into the export itself is refused the same way; no --tokenizer to drop, so one way.
  fs.copyFileSync(other, path.join(final, "tokenizer.json"));
  const own = gen([]);
  assert.equal(own.status, 2);
  assert.equal(advisedCommands(own.stderr).length, 1, own.stderr);
  assertAdviceRuns(own.stderr);
});
