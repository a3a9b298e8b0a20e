/** G4, M7: final/ = HF model folder + tokenizer files + cursor + run_summary.json, written aside and renamed. */
import * as fs from "node:fs";
import * as path from "node:path";
import { hfConfigJson } from "../model/llama-config";
import { writeSafetensors, flatToTensors } from "../model/safetensors";
import { saveCursor } from "../data/cursor";
import type { Coordinator } from "../actors/coordinator";
import { ADAMW_DEFAULTS, MAX_GRAD_NORM } from "../optim/optim";
import type { Reporter } from "../report";
import { FINAL_DIR } from "../checkpoint";
import { loadTokenizerFile } from "../generation";
import { vocabSha256 } from "../data/vocab-hash";
import { cursorAt, type Session } from "./setup";

export const TOKENIZER_FILES = [
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "vocab.json",
  "merges.txt",
] as const;

/** G4: the export of the weights as they are now. Never overwrites: an earlier final/ is moved aside. */
export function exportFinal(s: Session, coord: Coordinator, figures: Record<string, unknown>, rep: Reporter): string {
  const { cfg } = s;
  const exp = path.join(cfg.out, FINAL_DIR);
  if (fs.existsSync(exp)) {
    const old = `${exp}.previous-${Date.now()}`;
    fs.renameSync(exp, old);
    rep.say(`an earlier final/ was moved to ${old} (nothing is overwritten)`);
  }
  const tmp = `${exp}.partial-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  fs.mkdirSync(tmp, { recursive: true });
  writeSafetensors(path.join(tmp, "model.safetensors"), flatToTensors(s.model.config, coord.views.params), {
    format: "pt",
  });
  fs.writeFileSync(path.join(tmp, "config.json"), `${JSON.stringify(hfConfigJson(s.model.config), null, 1)}\n`);
  const shipped: string[] = [];
  for (const fn of TOKENIZER_FILES) {
    const src = path.join(s.data.root, fn);
    if (fs.existsSync(src)) {
      fs.copyFileSync(src, path.join(tmp, fn));
      shipped.push(fn);
    }
  }
  rep.say(
    `tokenizer files shipped with the export: ${shipped.length ? shipped.join(", ") : "NONE: the mix root has no tokenizer files"}`,
  );
  saveCursor(tmp, cursorAt(s, s.plan.endStep));
  const summary = { ...runSummary(s, coord, figures, shipped), tokenizer_vocab_sha256: shippedVocabSha(tmp, shipped) };
  fs.writeFileSync(path.join(tmp, "run_summary.json"), `${JSON.stringify(summary, null, 1)}\n`);
  fs.renameSync(tmp, exp);
  rep.say(`exported ${exp}`);
  return exp;
}

/** G11: the vocabulary hash of the shipped tokenizer.json (generate checks a tokenizer against it); null when none is shipped. */
function shippedVocabSha(dir: string, shipped: string[]): string | null {
  return shipped.includes("tokenizer.json")
    ? vocabSha256(loadTokenizerFile(path.join(dir, "tokenizer.json")).tk.get_vocab(true))
    : null;
}

/** run_summary.json: the session's figures, the data identity and the whole recipe, optimizer constants included. */
function runSummary(
  s: Session,
  coord: Coordinator,
  figures: Record<string, unknown>,
  shipped: string[],
): Record<string, unknown> {
  const { cfg } = s;
  return {
    ...figures,
    params: s.model.params,
    params_total: s.model.params.sum_numel,
    fingerprint: s.data.fingerprint,
    shuffle_perm_sha: s.data.permSha,
    samples_consumed: s.plan.endStep * s.plan.seqsPerStep,
    steps_planned: s.plan.stepsPlanned,
    seq_len: cfg.seqLen,
    micro_batch: cfg.microBatch,
    accum: cfg.accum,
    world: cfg.world,
    processes: cfg.hosts,
    tokens_per_step: s.plan.tokensPerStep,
    backend: coord.backendInfo.backend,
    grad_ckpt: cfg.gradCkpt,
    optim: cfg.optim,
    lr: cfg.lr,
    betas: [ADAMW_DEFAULTS.beta1, ADAMW_DEFAULTS.beta2],
    eps: ADAMW_DEFAULTS.eps,
    weight_decay: ADAMW_DEFAULTS.weightDecay,
    max_grad_norm: MAX_GRAD_NORM,
    warmup_frac: cfg.warmupFrac,
    decay_frac: cfg.decayFrac,
    warmup_steps: s.plan.lrShape.warmup,
    decay_start: s.plan.lrShape.decayStart,
    seed: cfg.seed,
    data_seed: cfg.dataSeed,
    tokenizer_files: shipped,
  };
}
