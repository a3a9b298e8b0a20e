/**
 * Test-only fault injection, all of it: the tests set an environment variable, and a real run never does.
 *
 *   TSTRAIN_FAULT="rank:step:kind"          one rank of this process misbehaves (rank.ts calls the three checks below):
 *     throw    the rank throws at `step`, before its first micro-batch
 *     exit     the rank's thread exits at `step`
 *     refuse   the rank raises a refusal (UserError) at `step`, as a check inside a rank would (A1)
 *     nan      a NaN in that step's gradient (the step is skipped, P2)
 *     diverge  loss and gradient NaN from `step` on, as a diverged model would
 *     val      the rank's validation pass throws (G2); `step` is not read
 *   TSTRAIN_MPI_FAULT="process:step:checksum"  that process of an MPI job reports a different weights checksum at that
 *                                              step's verification, as a diverged process would (A11; session/dist.ts)
 *
 * The checkpoint writer's faults are test/helpers/ckpt-fault.ts (preloaded, the trainer knows nothing of it), and the
 * local Hub's are hub/server/faults.ts.
 */
import { UserError } from "../errors";

export type FaultKind = "throw" | "exit" | "nan" | "diverge" | "val" | "refuse";
export interface RankFault {
  rank: number;
  step: number;
  kind: FaultKind;
}

/** TSTRAIN_FAULT parsed; null when unset. A malformed value is refused (G10). */
export function faultFromEnv(v = process.env.TSTRAIN_FAULT): RankFault | null {
  if (!v) return null;
  const m = /^(\d+):(\d+):(throw|exit|nan|diverge|val|refuse)$/.exec(v);
  if (!m)
    throw new UserError("G10", `TSTRAIN_FAULT=${JSON.stringify(v)} is not rank:step:throw|exit|nan|diverge|val|refuse`);
  return { rank: Number(m[1]), step: Number(m[2]), kind: m[3] as FaultKind };
}

/** Before each micro-batch of `step` on `rank`: throw, exit or refuse when the fault says so. */
export function faultBeforeMicroBatch(f: RankFault | null, rank: number, step: number): void {
  if (!f || f.rank !== rank || f.step !== step) return;
  if (f.kind === "throw") throw new Error(`injected fault: rank ${f.rank} throws at step ${step} (TSTRAIN_FAULT)`);
  if (f.kind === "exit") process.exit(3);
  if (f.kind === "refuse")
    throw new UserError("A1", `injected refusal: rank ${f.rank} refuses at step ${step} (TSTRAIN_FAULT)`);
}

/** After the micro-batches of `step` on `rank`: a NaN into its gradient slot (and its losses, for diverge). */
export function faultAfterCompute(
  f: RankFault | null,
  rank: number,
  step: number,
  slot: Float64Array,
  losses: number[],
): void {
  if (!f || f.rank !== rank) return;
  if (!((f.kind === "nan" && f.step === step) || (f.kind === "diverge" && step >= f.step))) return;
  slot[0] = Number.NaN;
  if (f.kind === "diverge") losses.fill(Number.NaN);
}

/** At the start of `rank`'s validation pass: throw when the fault says so. */
export function faultAtValidation(f: RankFault | null, rank: number): void {
  if (f && f.kind === "val" && f.rank === rank)
    throw new Error(`injected fault: rank ${f.rank} fails validation (TSTRAIN_FAULT)`);
}

/** TSTRAIN_MPI_FAULT parsed; process -1 (no process) when unset or malformed. */
export function mpiFaultFromEnv(v = process.env.TSTRAIN_MPI_FAULT): { process: number; step: number } {
  const m = v ? /^(\d+):(\d+):checksum$/.exec(v) : null;
  return m ? { process: Number(m[1]), step: Number(m[2]) } : { process: -1, step: -1 };
}

const mpiFault = mpiFaultFromEnv();

/** The checksum process `rank` of the MPI job reports at `step`: its own, or a wrong one when the fault says so. */
export function checksumReported(rank: number, step: number, mine: string): string {
  return mpiFault.step === step && mpiFault.process === rank ? "corrupted-by-TSTRAIN_MPI_FAULT" : mine;
}
