/**
 * The training loop, nanoGPT style: one optimizer step, then the named things that happen between steps
 * (the metrics, the checkpoint, a signal, the segment end), then validation and export once it ends.
 */
import type { Coordinator, StepResult } from "../actors/coordinator";
import type { OptimizerPosition } from "../optim/optim";
import type { UploaderEvent } from "../actors/protocol";
import { checkpointDir, checkpointRoot, type LogEntry } from "../checkpoint";
import type { Reporter } from "../report";
import type { Session } from "./setup";
import { MetricWindow, sampleNow } from "./metrics";
import { CheckpointsInFlight } from "./in-flight";
import { finishSession, type RunResult } from "./finish";
import { requestStop, resumeCommand, RunStopped, setPhase, stopRequested } from "./stop";
import { recordSessionEnd } from "./record";

/** Steps startStep+1 .. endStep; `events` is where the uploader's reports arrive (K6). */
export async function trainLoop(
  s: Session,
  coord: Coordinator,
  pos: OptimizerPosition,
  history: LogEntry[],
  rep: Reporter,
  t0: number,
  events: UploaderEvent[],
): Promise<RunResult> {
  const { cfg, plan } = s;
  const checkpoints = new CheckpointsInFlight(s, coord, pos, history, events, rep);
  const metrics = new MetricWindow(s, history, rep);
  let lastSample = "";
  let stoppedAt = -1;
  let lastDone = s.start.startStep;
  setPhase("training");
  for (let step = s.start.startStep; step < s.plan.endStep; step++) {
    checkpoints.absorb();
    if (checkpoints.failed) break;
    if (stopRequested()) {
      stoppedAt = step;
      if (s.dist) await verifyOrDrain(s, coord, checkpoints, step);
      await checkpointOnSignal(s, checkpoints, step, metrics.lastLoss, rep);
      break;
    }
    const r = await stepOrDrain(coord, checkpoints, step, pos, s);
    if (r.stopAsked && !stopRequested()) requestStop("a signal to another process of the job"); // any process's signal stops the whole job here (O3)
    const done = step + 1;
    metrics.record(done, r, pos);
    lastDone = done;
    if (done % plan.ckptEvery === 0) {
      if (s.dist)
        rep.say(
          `step ${done}: weights and moments identical on all ${s.dist.mpi.size} processes (sha256 ${await verifyOrDrain(s, coord, checkpoints, done)}) (A11)`,
        );
      if (!(await checkpoints.checkpoint(done, metrics.lastLoss))) break;
      if (cfg.sample) rep.say((lastSample = await sampleNow(s, coord, done)));
    }
  }
  if (stoppedAt < 0 && !checkpoints.failed) {
    setPhase("finishing"); // a signal from here lets the run finish (O3)
    if (stopRequested())
      rep.say(
        `${stopRequested()} came during the last step: the run finishes instead (the last checkpoint, the validation and the export)`,
      );
  }
  await checkpoints.drain("end of the session");
  if (checkpoints.failed || stoppedAt >= 0) {
    recordSessionEnd(s, {
      ended: checkpoints.failed ? "failed" : "stopped",
      finalStep: lastDone,
      seconds: (performance.now() - t0) / 1000,
      outcomes: checkpoints.outcomes,
    });
  }
  checkpoints.throwIfFailed();
  if (stoppedAt >= 0) throw stoppedBySignal(s, stoppedAt);
  return finishSession(s, coord, { t0, pos, history, metrics, checkpoints, lastSample }, rep);
}

/** One optimizer step. When a rank fails, the checkpoints handed over hold the last good steps: let them land, then stop. */
async function stepOrDrain(
  coord: Coordinator,
  checkpoints: CheckpointsInFlight,
  step: number,
  pos: OptimizerPosition,
  s: Session,
): Promise<StepResult> {
  try {
    if (!s.dist) return await coord.step(step, pos, s.cfg.lr, s.plan.lrShape);
    await s.dist.step(step); // A9: every process runs this step with its ranks
    s.dist.inStep = true;
    const r = await coord.step(step, pos, s.cfg.lr, s.plan.lrShape);
    s.dist.inStep = false;
    return r;
  } catch (e) {
    await checkpoints.drain(`step ${step + 1} failed: ${e instanceof Error ? e.message : String(e)}`);
    throw e;
  }
}

/**
 * A11: every process holds the same weights and moments at `step` (the checksum they agree on), or the run stops; the
 * checkpoints already handed over (agreed at their own step) land first.
 */
async function verifyOrDrain(
  s: Session,
  coord: Coordinator,
  checkpoints: CheckpointsInFlight,
  step: number,
): Promise<string> {
  try {
    return await s.dist!.verify(step, coord);
  } catch (e) {
    await checkpoints.drain(`the processes disagree at step ${step}`);
    throw e;
  }
}

/** O3: the step in progress has finished; save it and publish it, then stop. */
async function checkpointOnSignal(
  s: Session,
  checkpoints: CheckpointsInFlight,
  step: number,
  loss: number,
  rep: Reporter,
): Promise<void> {
  rep.say(
    `${stopRequested()}: stopping after step ${step}; writing${s.hub ? " and publishing" : ""} a checkpoint at step ${step} first (a second signal exits at once)`,
  );
  await checkpoints.checkpointOnStop(step, loss);
}

/** O3: what a signal's stop leaves, and the command that resumes. */
function stoppedBySignal(s: Session, stoppedAt: number): RunStopped {
  const saved = stoppedAt > s.start.startStep;
  const cmd = saved ? (s.hub ? resumeCommand("auto") : resumeCommand(checkpointDir(s.cfg.out, stoppedAt))) : null;
  return new RunStopped(
    saved
      ? `stopped by ${stopRequested()} at step ${stoppedAt}: checkpoint ${stoppedAt} is ${s.hub ? "published and verified on the Hub" : `saved in ${checkpointRoot(s.cfg.out)}`}. Resume with: ${cmd}`
      : `stopped by ${stopRequested()} before any step of this session finished: nothing new to save. Run the same command again to start.`,
    stoppedAt,
  );
}
