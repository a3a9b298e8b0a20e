/**
 * What every case of one bench run shares: the model, the data root, the batch geometry, the backend
 * and the seeds. Built once, so the single-thread loop, the actor runtime, the `--benchmark`
 * subprocess and the torch anchor all see the same shape.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { buildConfig, countParams, type LlamaConfig } from "../src/model/llama-config";
import type { BackendName } from "../src/model/backend";
import { ensureDemoMix } from "../src/data/demo";
import { readManifest } from "../src/data/manifest";
import { mixFingerprint } from "../src/data/fingerprint";
import { PackedTokenStore } from "../src/data/token-store";
import { permSha } from "../src/data/permutation";
import { writeSyntheticMix } from "../src/data/synthetic";
import type { LrShape } from "../src/optim/optim";

export type ModelName = "small" | "demo" | "frozen";

/** Layer count and width per --model; vocab 4096 = the demo tokenizer's, 0 = the frozen 49,152. */
export const MODELS: Record<
  ModelName,
  { layers?: number; hidden?: number; vocab?: number; data: "demo" | "synthetic"; note: string }
> = {
  small: {
    layers: 4,
    hidden: 216,
    vocab: 4096,
    data: "demo",
    note: "4 layers, width 216 (GQA 9/3, ffn 576), vocab 4096: ~2.9M params",
  },
  demo: {
    layers: 4,
    hidden: 144,
    vocab: 4096,
    data: "demo",
    note: "the --demo model: 4 layers, width 144, vocab 4096: ~1.4M params",
  },
  frozen: { data: "synthetic", note: "the frozen 106M shape (M1), buildConfig({seqLen})" },
};

export interface Shape {
  modelName: ModelName;
  model: LlamaConfig;
  params: number;
  seqLen: number;
  microBatch: number;
  accum: number;
  backend: BackendName;
  gradCkpt: boolean;
  /** M6: GB a rank's activations may take; 0 = half the machine's memory over the ranks (activationBudget). */
  activationBudgetGb: number;
  seed: number;
  dataSeed: number;
  /** The mix root every case reads (the demo mix, or a synthetic mix in a temp dir). */
  root: string;
  /** For --demo subprocesses: the folder ensureDemoMix was given (root = demoDir/mix). */
  demoDir: string | null;
  dataKind: "demo" | "synthetic";
  fingerprint: string;
  nWindows: number;
  lrShape: LrShape;
  lr: number;
}

export const DEFAULT_SEED = 20260919;

/** The bench's scratch space: a fresh temp dir per run; the demo mix is cached across runs. */
export function scratchDir(): string {
  // not "tstrain-*": other tooling cleans those names in the shared /tmp
  return fs.mkdtempSync(path.join(os.tmpdir(), "tsbench-run-"));
}

export async function buildShape(o: {
  model: ModelName;
  seqLen: number;
  microBatch: number;
  accum: number;
  backend: BackendName;
  gradCkpt: boolean;
  /** M6: GB a rank's activations may take; 0 = half the machine's memory over the ranks (activationBudget). */
  activationBudgetGb: number;
  scratch: string;
  windowsNeeded: number;
  log: (s: string) => void;
}): Promise<Shape> {
  const spec = MODELS[o.model];
  const model = buildConfig({ seqLen: o.seqLen, layers: spec.layers, hidden: spec.hidden, vocabSize: spec.vocab });
  let root: string,
    demoDir: string | null = null;
  if (spec.data === "demo") {
    demoDir = path.join(os.tmpdir(), "tsbench-demo-mix");
    const t0 = performance.now();
    try {
      root = await ensureDemoMix(demoDir, { log: () => undefined });
    } catch (e) {
      // a half-built cache (an interrupted earlier run, a cleaned /tmp) is rebuilt once from scratch
      o.log(`demo mix build failed (${(e as Error).message.split("\n")[0]}); rebuilding ${demoDir} once`);
      fs.rmSync(demoDir, { recursive: true, force: true });
      root = await ensureDemoMix(demoDir, { log: () => undefined });
    }
    const sec = (performance.now() - t0) / 1000;
    if (sec > 2) o.log(`built the demo mix in ${sec.toFixed(0)} s (cached in ${demoDir} for later runs)`);
  } else {
    const trainTokens = Math.max(64 * 1024, Math.ceil(o.windowsNeeded * 1.25) * o.seqLen);
    root = writeSyntheticMix({
      vocab: model.vocabSize,
      trainTokens,
      valTokens: 4 * o.seqLen,
      shards: 2,
      seed: 7,
      dir: path.join(o.scratch, "mix"),
    }).root;
  }
  const manifest = readManifest(root);
  if (manifest.vocab_size > model.vocabSize)
    throw new Error(`mix vocab ${manifest.vocab_size} > model vocab ${model.vocabSize}`);
  const store = PackedTokenStore.open(root, manifest, "train");
  const nWindows = store.numWindows(o.seqLen);
  store.close();
  if (nWindows < o.windowsNeeded) {
    throw new Error(
      `the ${spec.data} mix has ${nWindows} windows of ${o.seqLen} tokens; this bench needs ${o.windowsNeeded}. Use fewer --steps, a smaller --micro-batch/--accum or a shorter --seq.`,
    );
  }
  return {
    modelName: o.model,
    model,
    params: countParams(model).sum_numel,
    seqLen: o.seqLen,
    microBatch: o.microBatch,
    accum: o.accum,
    backend: o.backend,
    gradCkpt: o.gradCkpt,
    activationBudgetGb: o.activationBudgetGb,
    seed: DEFAULT_SEED,
    dataSeed: DEFAULT_SEED,
    root,
    demoDir,
    dataKind: spec.data,
    fingerprint: mixFingerprint(root, manifest),
    nWindows,
    // the LR factor is constant and small after warmup: the bench measures cost, not convergence
    lrShape: { warmup: 100, decayStart: 1_000_000, total: 1_000_000 },
    lr: 6e-4,
  };
}

export function permShaOf(s: Shape): string {
  return permSha(s.nWindows, s.dataSeed);
}

export function tokensPerStep(s: Shape, world: number): number {
  return s.microBatch * world * s.accum * s.seqLen;
}
