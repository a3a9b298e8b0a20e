/**
 * Data budget checks made before step 1 (D6, D7).
 */
import { UserError } from "../errors";

/** D1: a mix with fewer tokens than --tokens is worth a warning (the no-wrap check decides). */
export function mixTokenWarning(totalTokens: number, tokensTarget: number): string | null {
  if (totalTokens >= tokensTarget) return null;
  return `WARNING mix has ${totalTokens.toLocaleString("en-US")} tokens < target ${tokensTarget.toLocaleString("en-US")} (--tokens) [D1]`;
}

/**
 * D6: the epoch never wraps. From start step s0 to the horizon the run reads
 * needed = (stepsPlanned - s0) * S windows, starting at permutation index s0 * S; the split offers
 * available = nWindows - s0 * S of them. Refuses when needed > available, naming the shortfall.
 * marginPct = 100 * available / needed - 100 (Infinity when nothing is needed).
 */
export function checkNoWrap(o: {
  nWindows: number;
  startStep: number;
  stepsPlanned: number;
  seqsPerStep: number;
  seqLen: number;
}): { available: number; needed: number; marginPct: number } {
  const { nWindows, startStep, stepsPlanned, seqsPerStep: S, seqLen } = o;
  for (const [k, v] of Object.entries(o)) {
    if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`checkNoWrap: ${k}=${v} must be a whole number >= 0`);
  }
  if (S < 1 || seqLen < 1) throw new RangeError(`checkNoWrap: seqsPerStep and seqLen must be >= 1`);
  if (startStep > stepsPlanned) {
    throw new UserError(
      "D6",
      `resume point step ${startStep} is beyond the planned horizon of ${stepsPlanned} steps: the horizon never changes on resume (P5); keep --tokens/--max-steps as the run started`,
    );
  }
  const startSample = startStep * S;
  const available = nWindows - startSample;
  const needed = (stepsPlanned - startStep) * S;
  if (needed > available) {
    const short = needed - Math.max(0, available);
    const maxSteps = Math.floor(nWindows / S);
    throw new UserError(
      "D6",
      `dataset too small for the plan: ${Math.max(0, available).toLocaleString("en-US")} windows available from sample ${startSample.toLocaleString("en-US")}, ${needed.toLocaleString("en-US")} needed for ${stepsPlanned - startStep} steps x ${S} sequences (${(needed * seqLen).toLocaleString("en-US")} tokens); short by ${short.toLocaleString("en-US")} windows (${(short * seqLen).toLocaleString("en-US")} tokens). The mix covers at most ${maxSteps} steps at this geometry: lower --tokens/--max-steps or rebuild the mix larger; the epoch never wraps`,
    );
  }
  const marginPct = needed === 0 ? Infinity : (100 * available) / needed - 100;
  return { available, needed, marginPct };
}

/** D7: n_val = min(max(1, valTokens // seqLen), valTotal // seqLen); refuses with no val data or no full window. */
export function valWindowCount(valTokensFlag: number, valTotalTokens: number, seqLen: number): number {
  if (!Number.isSafeInteger(seqLen) || seqLen < 1)
    throw new RangeError(`valWindowCount: seqLen ${seqLen} must be a positive integer`);
  if (!Number.isSafeInteger(valTokensFlag) || valTokensFlag < 0)
    throw new UserError("D7", `--val-tokens ${valTokensFlag} must be a whole number >= 0`);
  if (!Number.isSafeInteger(valTotalTokens) || valTotalTokens <= 0) {
    throw new UserError(
      "D7",
      `the mix has no val tokens (val_total_tokens=${valTotalTokens}): validation needs held-out val shards; rebuild the mix with node dist/prepare.js --val-fraction F (F > 0)`,
    );
  }
  const avail = Math.floor(valTotalTokens / seqLen);
  if (avail === 0) {
    throw new UserError(
      "D7",
      `the val shards hold ${valTotalTokens} tokens, less than one window of seq_len ${seqLen}: rebuild the mix with a larger --val-fraction or lower --seq-len`,
    );
  }
  return Math.min(Math.max(1, Math.floor(valTokensFlag / seqLen)), avail);
}
