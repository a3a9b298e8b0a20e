/**
 * What the session reports while it trains: the live progress line every step (B5), the averaged log line and
 * metrics.jsonl entry every --log-every steps (G9), the samples (G11) and the peak memory of every rank at the end (G6).
 */
import type { LogEntry } from "../checkpoint";
import type { Coordinator, StepResult } from "../actors/coordinator";
import type { OptimizerPosition } from "../optim/optim";
import type { RankMemory } from "../actors/protocol";
import { fmtDuration } from "../duration";
import type { Reporter } from "../report";
import { sampleAtCheckpoint } from "../generation";
import type { Session } from "./setup";

/** The figures of the steps since the last log line, and the loss of the last step. */
export class MetricWindow {
  /** When training (not planning, not spawning) began. */
  readonly trainT0 = performance.now();
  lastLoss = Number.NaN;
  private loss = 0;
  private allreduceMs = 0;
  private device: { up: number; down: number; dispatches: number; hostMs: number } | null = null;
  private steps = 0;
  private tokens = 0;
  private t0 = performance.now();

  constructor(
    private readonly s: Session,
    private readonly history: LogEntry[],
    private readonly rep: Reporter,
  ) {}

  /** Seconds since training began. */
  trainSeconds(): number {
    return (performance.now() - this.trainT0) / 1000;
  }

  /** Step `done` has finished with `r`: the skip notice (P2), the progress line, and the log line when due (G9). */
  record(done: number, r: StepResult, pos: OptimizerPosition): void {
    const { s, rep } = this;
    const tokensPerStep = s.plan.tokensPerStep;
    this.lastLoss = r.loss;
    if (!r.applied)
      rep.say(
        `step ${done}: non-finite gradient -> step skipped (P2), ${pos.skipped} skipped so far, loss scale now ${pos.scaler.scale}`,
      );
    this.loss += r.loss;
    this.allreduceMs += r.allreduceMs;
    if (r.device) {
      this.device ??= { up: 0, down: 0, dispatches: 0, hostMs: 0 };
      this.device.up += r.device.up;
      this.device.down += r.device.down;
      this.device.hostMs += r.device.hostMsPerMicro;
      this.device.dispatches = r.device.dispatchesPerMicro;
    }
    this.steps++;
    this.tokens += tokensPerStep;
    const elapsedTrain = this.trainSeconds();
    const tokS = ((done - s.start.startStep) * tokensPerStep) / Math.max(1e-9, elapsedTrain);
    const eta = fmtDuration(((s.plan.endStep - done) * tokensPerStep) / Math.max(1e-9, tokS));
    const pct = Math.floor((100 * (done - s.start.startStep)) / Math.max(1, s.plan.endStep - s.start.startStep));
    rep.progress(
      `step ${done}/${s.plan.stepsPlanned} (${pct}% of this session) loss ${r.loss.toFixed(4)} lr ${r.lr.toExponential(2)} scale ${pos.scaler.scale} | ${tokS.toFixed(0)} tok/s | elapsed ${fmtDuration(elapsedTrain)} | ETA ${eta}`,
    );
    if (done % s.cfg.logEvery === 0 || done === s.plan.endStep) this.log(done, r, pos, elapsedTrain, eta);
  }

  private log(done: number, r: StepResult, pos: OptimizerPosition, elapsedTrain: number, eta: string): void {
    const winSec = (performance.now() - this.t0) / 1000;
    const e: LogEntry = {
      step: done,
      loss: this.loss / this.steps,
      lr: r.lr,
      grad_norm: r.gradNorm,
      loss_scale: pos.scaler.scale,
      skipped_steps: pos.skipped,
      tok_per_s: Math.round(this.tokens / Math.max(1e-9, winSec)),
      elapsed_s: Math.round(elapsedTrain * 10) / 10,
    };
    // A9: the combine across processes, per step, and its share of the window's wall time
    if (this.s.dist) e.allreduce_ms = Math.round((this.allreduceMs / this.steps) * 10) / 10;
    const share =
      e.allreduce_ms === undefined
        ? ""
        : ` allreduce_ms=${e.allreduce_ms} (${((100 * this.allreduceMs) / Math.max(1e-9, winSec * 1000)).toFixed(1)} % of the step)`;
    let traffic = "";
    if (this.device) {
      const mb = (b: number) => Math.round(b / this.steps / 1e5) / 10;
      e.h2d_mb = mb(this.device.up);
      e.d2h_mb = mb(this.device.down);
      e.dispatches_per_micro = this.device.dispatches;
      e.host_ms_per_micro = Math.round((this.device.hostMs / this.steps) * 10) / 10;
      traffic = ` h2d=${e.h2d_mb}MB d2h=${e.d2h_mb}MB dispatches/micro=${e.dispatches_per_micro} host_ms/micro=${e.host_ms_per_micro}`;
    }
    this.history.push(e);
    this.rep.metric(e);
    this.rep.curve(this.history);
    this.rep.say(
      `step ${done}/${this.s.plan.stepsPlanned} loss=${e.loss.toFixed(4)} lr=${e.lr.toExponential(3)} grad_norm=${e.grad_norm?.toFixed(4) ?? "skipped"} scale=${e.loss_scale} skipped=${e.skipped_steps} tok/s=${e.tok_per_s}${share}${traffic} elapsed=${fmtDuration(elapsedTrain)} eta=${eta}`,
    );
    this.loss = 0;
    this.allreduceMs = 0;
    this.device = null;
    this.steps = 0;
    this.tokens = 0;
    this.t0 = performance.now();
  }
}

/** The `memory` figures of RUN_JSON (G6). */
export interface MemoryReport {
  per_rank: Array<{
    rank: number;
    heap_mb: number;
    tf_tensors_mb: number;
    wasm_heap_mb: number;
    arena_mb: number;
    /** the activation arena exactly (M6: the start line's "activations:" size) */
    arena_bytes: number;
  }>;
  max_rank_mb: number;
  process_rss_mb: number;
}

/** G6: every rank's peak memory and this process's RSS, in MB, logged once at the end. */
export async function memoryReport(coord: Coordinator, rep: Reporter): Promise<MemoryReport> {
  const mem: RankMemory[] = await coord.memory();
  const rss = process.memoryUsage().rss;
  const memJson: MemoryReport = {
    per_rank: mem.map((m) => ({
      rank: m.rank,
      heap_mb: megabytes(m.heapPeakBytes),
      tf_tensors_mb: megabytes(m.tfPeakBytes),
      wasm_heap_mb: megabytes(m.wasmHeapBytes),
      arena_mb: megabytes(m.arenaBytes),
      arena_bytes: m.arenaBytes,
    })),
    max_rank_mb: Math.max(
      ...mem.map((m) => megabytes(m.heapPeakBytes + m.arenaBytes + Math.max(m.tfPeakBytes, m.wasmHeapBytes))),
    ),
    process_rss_mb: megabytes(rss),
  };
  rep.say(`memory: ${JSON.stringify(memJson)}`);
  return memJson;
}

function megabytes(n: number): number {
  return Math.round(n / 1e6);
}

/** G11: a short greedy sample from the current weights (read between steps), logged and kept for the report. */
export function sampleNow(s: Session, coord: Coordinator, step: number): Promise<string> {
  return sampleAtCheckpoint({
    out: s.cfg.out,
    root: s.data.root,
    cfg: s.model.config,
    params: coord.views.params,
    step,
    backend: s.cfg.backend,
  });
}
