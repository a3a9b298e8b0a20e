/** G2: the validation pass at the horizon; a failure is recorded in RUN_JSON, not thrown. Segments skip it (G1). */
import type { Coordinator } from "../actors/coordinator";
import type { Reporter } from "../report";
import type { Session } from "./setup";
import { fmtDuration } from "../duration";
import { ProgressRhythm } from "../progress";

export interface Validation {
  valLoss: number | null;
  ppl: number | null;
  valError: string | null;
}

export async function validate(s: Session, coord: Coordinator, segment: boolean, rep: Reporter): Promise<Validation> {
  if (segment) {
    rep.say(`validation skipped: segment ended at step ${s.plan.endStep} of ${s.plan.stepsPlanned} (G1)`);
    return { valLoss: null, ppl: null, valError: null };
  }
  // The pass is one request to the ranks: say what it covers, and that it is still running.
  rep.say(
    `validation: ${s.data.nVal.toLocaleString("en-US")} held-out windows of ${s.cfg.seqLen} tokens on ${s.cfg.world} rank(s)`,
  );
  const t0 = performance.now();
  const stopBeat = new ProgressRhythm(undefined, t0).every(() =>
    rep.say(`validation: still running, ${fmtDuration((performance.now() - t0) / 1000)} so far`),
  );
  try {
    const valLoss = await coord.evaluate(s.data.nVal);
    if (!Number.isFinite(valLoss)) throw new Error(`validation loss is ${valLoss}`);
    const ppl = Math.exp(Math.min(20, valLoss));
    rep.say(`validation loss=${valLoss.toFixed(4)} ppl=${ppl.toFixed(2)} over ${s.data.nVal} held-out windows`);
    return { valLoss, ppl, valError: null };
  } catch (e) {
    const valError = `${(e as Error).name}: ${String((e as Error).message).slice(0, 300)}`;
    rep.say(`validation failed: ${valError}`);
    return { valLoss: null, ppl: null, valError };
  } finally {
    stopBeat();
  }
}
