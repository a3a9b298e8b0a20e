/**
 * Data budget checks made before step 1 (D6, D7).
 */
import { type FlagChange, UserError } from "../errors";

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
export function checkNoWrap(
  o: {
    nWindows: number;
    startStep: number;
    stepsPlanned: number;
    seqsPerStep: number;
    seqLen: number;
  },
  /** the flags that make this run fit its mix (fitToMix), when some do */
  fit: readonly FlagChange[] | null = null,
): { available: number; needed: number; marginPct: number } {
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
    const why = `dataset too small for the plan: ${Math.max(0, available).toLocaleString("en-US")} windows available from sample ${startSample.toLocaleString("en-US")}, ${needed.toLocaleString("en-US")} needed for ${stepsPlanned - startStep} steps x ${S} sequences (${(needed * seqLen).toLocaleString("en-US")} tokens); short by ${short.toLocaleString("en-US")} windows (${(short * seqLen).toLocaleString("en-US")} tokens). The mix covers at most ${maxSteps} steps at this geometry, and the epoch never wraps: `;
    throw fit
      ? new UserError("D6", `${why}run `, { ways: [{ changes: fit, why: "what the mix holds" }] })
      : new UserError(
          "D6",
          `${why}${startStep > 0 ? "resume on the mix the run was trained on" : "rebuild the mix larger"}`,
        );
  }
  const marginPct = needed === 0 ? Infinity : (100 * available) / needed - 100;
  return { available, needed, marginPct };
}

/** D7: n_val = min(max(1, valTokens // seqLen), valTotal // seqLen); refuses with no val data or no full window. */
export function valWindowCount(
  valTokensFlag: number,
  valTotalTokens: number,
  seqLen: number,
  /** the flags that make this run fit its mix (fitToMix), when some do */
  fit: readonly FlagChange[] | null = null,
): number {
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
    const why = `the val shards hold ${valTotalTokens} tokens, less than one window of seq_len ${seqLen}: `;
    throw fit
      ? new UserError("D7", `${why}run `, { ways: [{ changes: fit, why: "what the mix holds" }] })
      : new UserError("D7", `${why}rebuild the mix with a larger --val-fraction`);
  }
  return Math.min(Math.max(1, Math.floor(valTokensFlag / seqLen)), avail);
}

/**
 * D6, D7: the flags that make a fresh run fit its mix, when it does not: the longest --seq-len (a power of 2) whose
 * window the held-out shards hold at least one of and the training split one step of, a --micro-batch (with
 * --accum 1) whose step the split holds, and the --max-steps it covers without wrapping; only the flags that change
 * (`[["--micro-batch", "1"], ["--max-steps", "6"]]`). null when the run fits, or nothing does (a world larger than
 * the split's windows: rebuild the mix larger). A resume keeps its geometry and horizon (C3, P5): never fitted.
 */
export function fitToMix(o: {
  trainTokens: number;
  valTokens: number;
  seqLen: number;
  microBatch: number;
  accum: number;
  /** ranks a micro-batch runs on: world x MPI processes */
  ranks: number;
  tokens: number;
  maxSteps: number;
}): FlagChange[] | null {
  const steps = (L: number, S: number, maxSteps: number) => maxSteps || Math.floor(o.tokens / (S * L));
  const fits = (L: number, m: number, a: number, maxSteps: number) => {
    const n = Math.floor(o.trainTokens / L);
    const S = m * a * o.ranks;
    const k = steps(L, S, maxSteps);
    return Math.floor(o.valTokens / L) >= 1 && S <= n && k >= 1 && k * S <= n;
  };
  if (fits(o.seqLen, o.microBatch, o.accum, o.maxSteps)) return null;
  let L = o.seqLen;
  const room = (l: number) => Math.floor(o.valTokens / l) >= 1 && Math.floor(o.trainTokens / l) >= o.ranks;
  if (!room(L)) {
    L = 2 ** Math.floor(Math.log2(L));
    while (L >= 2 && !room(L)) L /= 2;
    if (L < 2) return null;
  }
  const n = Math.floor(o.trainTokens / L);
  let [m, a] = [o.microBatch, o.accum];
  if (m * a * o.ranks > n) {
    a = 1;
    m = Math.min(m, Math.floor(n / o.ranks));
  }
  const S = m * a * o.ranks;
  const most = Math.floor(n / S);
  const planned = steps(L, S, o.maxSteps);
  const maxSteps = planned < 1 || planned > most ? most : o.maxSteps;
  const flags: FlagChange[] = [];
  if (L !== o.seqLen) flags.push(["--seq-len", String(L)]);
  if (m !== o.microBatch) flags.push(["--micro-batch", String(m)]);
  if (a !== o.accum) flags.push(["--accum", String(a)]);
  if (maxSteps !== o.maxSteps) flags.push(["--max-steps", String(maxSteps)]);
  return flags.length && fits(L, m, a, maxSteps) ? flags : null;
}
