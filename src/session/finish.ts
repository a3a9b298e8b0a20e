/**
 * The end of a session that trained to its end step: the segment-end check (G1), the final loss (G3), validation
 * (G2), memory (G6), the export and its push (G4), RUN_JSON (G5) and the report page.
 */
import * as path from "node:path";
import { UserError } from "../errors";
import type { Coordinator } from "../actors/coordinator";
import type { OptimizerPosition } from "../optim/optim";
import { FINAL_DIR, type LogEntry } from "../checkpoint";
import { fmtDuration } from "../duration";
import { writeRunReport, type Reporter } from "../report";
import { publishFinal, type PublishResult } from "../hub/cycle";
import { recordSessionEnd } from "./record";
import { pointerAt, type Session } from "./setup";
import { memoryReport, sampleNow, type MemoryReport, type MetricWindow } from "./metrics";
import type { CheckpointsInFlight } from "./in-flight";
import { validate, type Validation } from "./validate";
import { exportFinal } from "./export";

export interface RunResult {
  runJson: Record<string, unknown>;
  exported: string | null;
}

/** What the loop leaves for the end of the session. */
export interface LoopState {
  /** When the session began (before planning). */
  t0: number;
  pos: OptimizerPosition;
  history: LogEntry[];
  metrics: MetricWindow;
  checkpoints: CheckpointsInFlight;
  lastSample: string;
}

export async function finishSession(s: Session, coord: Coordinator, l: LoopState, rep: Reporter): Promise<RunResult> {
  const { cfg, plan } = s;
  const step = s.plan.endStep;
  const sessionSec = (performance.now() - l.t0) / 1000;
  const trainSec = l.metrics.trainSeconds();
  const tokThisRun = (step - s.start.startStep) * plan.tokensPerStep;
  const finalLoss = l.history.length ? l.history[l.history.length - 1].loss : l.metrics.lastLoss;
  const segment = step < plan.stepsPlanned;
  checkSegmentEnd(s, l.checkpoints, segment);
  rep.say(
    `TRAIN DONE step=${step}/${plan.stepsPlanned} elapsed=${fmtDuration(trainSec)} tokens_this_run=${tokThisRun.toLocaleString("en-US")} last_loss=${finalLoss}`,
  );
  if (!Number.isFinite(finalLoss))
    throw new UserError("G3", `final loss is not finite (${finalLoss}): not exporting anything`);
  const val = await validate(s, coord, segment, rep);
  const memJson = await memoryReport(coord, rep);
  const timing = {
    session_seconds: Math.round(sessionSec * 10) / 10,
    tok_per_s: Math.round(tokThisRun / Math.max(1e-9, trainSec)),
  };
  const pushed = segment
    ? null
    : await exportAndPublish(
        s,
        coord,
        {
          step,
          start_step: s.start.startStep,
          tokens_consumed: step * plan.tokensPerStep,
          tokens_this_run: tokThisRun,
          session_seconds: timing.session_seconds,
          tok_per_s: timing.tok_per_s,
          final_loss: finalLoss,
          prior_loss: s.start.priorLoss,
          val_loss: val.valLoss,
          val_ppl: val.ppl,
          val_error: val.valError,
          val_windows: s.data.nVal,
          memory: memJson,
        },
        rep,
      );
  const exported = pushed?.exported ?? null;
  if (segment)
    rep.say(
      `segment boundary reached at step ${step} of ${plan.stepsPlanned}: the verified checkpoint is the resume point, so no separate final push`,
    );
  const runJson = runJsonOf(s, coord, l, { finalLoss, segment, val, timing, memJson, exported });
  if (cfg.sample)
    rep.say(
      `final ${l.lastSample.startsWith(`sample @ step ${step}:`) ? l.lastSample : await sampleNow(s, coord, step)}`,
    );
  rep.say(`RUN_JSON ${JSON.stringify(runJson)}`);
  recordSessionEnd(s, {
    ended: segment ? "segment" : "complete",
    finalStep: step,
    seconds: sessionSec,
    outcomes: l.checkpoints.outcomes,
    final: pushed?.final ?? null,
  });
  rep.say(
    `report: file://${path.resolve(writeRunReport(cfg.out, runJson))} (chart: ${path.resolve(cfg.out, "loss.svg")})`,
  );
  return { runJson, exported };
}

/** G1: a segment (a session that stops before the horizon) must end on a checkpoint, verified on the Hub when there is one. */
function checkSegmentEnd(s: Session, ckpts: CheckpointsInFlight, segment: boolean): void {
  const step = s.plan.endStep;
  if (segment && s.hub && !ckpts.published.has(step)) {
    throw new UserError(
      "G1",
      `segment ended at step ${step} but no checkpoint was pushed and verified for it (pushed: ${[...ckpts.published].sort((a, b) => a - b).join(", ") || "none"}); the next session would re-read this interval`,
    );
  }
  if (segment && !s.hub && !ckpts.outcomes.some((o) => o.step === step)) {
    throw new UserError(
      "G1",
      `segment ended at step ${step} but no local checkpoint was written for it; the next session could not resume there`,
    );
  }
}

/** G4: final/ written locally, then (with a Hub) published, verified and named by latest.json. */
async function exportAndPublish(
  s: Session,
  coord: Coordinator,
  figures: Record<string, unknown>,
  rep: Reporter,
): Promise<{ exported: string; final: PublishResult | null }> {
  await s.dist?.verify(s.plan.endStep, coord); // every process holds the same weights and moments, or nothing is exported (A11)
  const exported = exportFinal(s, coord, figures, rep);
  let final: PublishResult | null = null;
  if (s.hub) {
    const step = s.plan.endStep;
    const r = await publishFinal(s.hub, {
      localDir: exported,
      pathInRepo: FINAL_DIR,
      pointer: pointerAt(s, step, FINAL_DIR),
      log: rep.say,
      giveUpMs: s.cfg.hubRetryMinutes * 60_000,
    });
    if (!r.ok)
      throw new UserError(
        "K4",
        `final/ did not verify on the Hub: ${JSON.stringify(r.verify)}; the local export is kept at ${exported}`,
      );
    rep.say(`latest.json rolled to the completed run: final at step ${step}`);
    final = r;
  }
  return { exported, final };
}

interface EndFigures {
  finalLoss: number;
  segment: boolean;
  val: Validation;
  timing: { session_seconds: number; tok_per_s: number };
  memJson: MemoryReport;
  exported: string | null;
}

/** G5: the one RUN_JSON line. */
function runJsonOf(s: Session, coord: Coordinator, l: LoopState, f: EndFigures): Record<string, unknown> {
  const { cfg, plan } = s;
  const step = s.plan.endStep;
  return {
    final_step: step,
    steps_planned: plan.stepsPlanned,
    start_step: s.start.startStep,
    segment_stop: f.segment,
    final_loss: f.finalLoss,
    prior_loss: s.start.priorLoss,
    val_loss: f.val.valLoss,
    val_ppl: f.val.ppl,
    val_error: f.val.valError,
    val_skipped: f.segment,
    val_windows: s.data.nVal,
    tokens_consumed: step * plan.tokensPerStep,
    tok_per_s: f.timing.tok_per_s,
    session_seconds: f.timing.session_seconds,
    world: cfg.world,
    processes: cfg.hosts,
    micro_batch: cfg.microBatch,
    accum: cfg.accum,
    seq_len: cfg.seqLen,
    params: s.model.params.sum_numel,
    backend: coord.backendInfo.backend,
    precision: cfg.precision,
    grad_ckpt: cfg.gradCkpt,
    skipped_steps: l.pos.skipped,
    loss_scale: l.pos.scaler.scale,
    checkpoints: l.checkpoints.outcomes.map((o) => o.step),
    memory: f.memJson,
    exported: f.exported,
  };
}
