/**
 * The run's own account of its sessions (B5): a "start" line in <out>/sessions.jsonl when a session begins
 * training, an "end" line with how it ended, its time, its checkpoints and every Hub publication (stage
 * times, retries) when it ends. report.html reads them to show the whole run, not only its last session.
 */
import type { CheckpointOutcome } from "../actors/protocol";
import type { PublishResult } from "../hub/cycle";
import { recordSessionEvent, type HubPublication, type SessionEvent } from "../report";
import type { Session } from "./setup";

let current: string | null = null;

export function recordSessionStart(s: Session): void {
  current = `${process.pid}-${Date.now()}`;
  recordSessionEvent(s.cfg.out, {
    event: "start",
    session: current,
    at: new Date().toISOString(),
    start_step: s.start.startStep,
    steps_planned: s.plan.stepsPlanned,
    resumed_from: s.start.resumeDir,
  });
}

function publication(r: PublishResult): HubPublication {
  const r1 = (x: number) => Math.round(x * 10) / 10;
  return {
    step: r.step,
    path: r.pathInRepo,
    ok: r.ok,
    upload_s: r1(r.uploadSeconds),
    verify_s: r1(r.verifySeconds),
    total_s: r1(r.pushVerifySeconds),
    retries: r.retries,
  };
}

export function recordSessionEnd(
  s: Session,
  o: {
    ended: Extract<SessionEvent, { event: "end" }>["ended"];
    finalStep: number;
    seconds: number;
    outcomes: CheckpointOutcome[];
    final?: PublishResult | null;
  },
): void {
  if (!current) return;
  const hub = o.outcomes.filter((c) => c.published).map((c) => publication(c.published!));
  if (o.final) hub.push(publication(o.final));
  recordSessionEvent(s.cfg.out, {
    event: "end",
    session: current,
    at: new Date().toISOString(),
    final_step: o.finalStep,
    ended: o.ended,
    seconds: Math.round(o.seconds * 10) / 10,
    checkpoints: o.outcomes.map((c) => c.step),
    hub,
  });
  current = null;
}
