/**
 * Case 4: gradient averaging plus the optimizer step alone, against parameter count. One "step" is
 * what the coordinator asks of the ranks after compute: reduce (average `world` gradient slots into
 * slot 0, unscale, sum of squares) then update (AdamW over params/m/v with the averaged gradient).
 * Run in one worker thread over [0, P), and split across `threads` worker threads by slice (as the
 * ranks do, each phase a barrier), alternating the two so drift hits both alike. Times are wall
 * clock from this thread, message round trips included (as the coordinator sees a phase).
 *
 * Shared-memory traffic per element (float32): reduce reads `world` slots and writes 1;
 * AdamW reads params, m, v, g and writes params, m, v (7 accesses).
 */
import { Worker } from "node:worker_threads";
import * as path from "node:path";
import { slices, ADAMW_DEFAULTS, type DecayRange } from "../src/optim/optim";
import { buildConfig } from "../src/model/llama-config";
import { paramLayout } from "../src/model/layout";
import type { OptimCmd, OptimReply } from "./optim-worker";
import type { BenchRow } from "./steps";
import { median, r, summarize } from "./stats";

export function parseCount(s: string): number {
  const m = /^(\d+(?:\.\d+)?)([kKmM]?)$/.exec(s.trim());
  if (!m) throw new Error(`--optim-sizes: ${JSON.stringify(s)} is not a count like 1M, 10M, 106M or 250000`);
  const mul = m[2].toLowerCase() === "m" ? 1e6 : m[2].toLowerCase() === "k" ? 1e3 : 1;
  return Math.round(Number(m[1]) * mul);
}

/** The frozen model's decay groups when P is its count (106M); one decayed range otherwise. */
function rangesFor(P: number): DecayRange[] {
  const frozen = paramLayout(buildConfig({ seqLen: 2 }));
  if (P === frozen.total) return frozen.entries.map((e) => ({ lo: e.offset, hi: e.offset + e.size, decay: e.decay }));
  return [{ lo: 0, hi: P, decay: true }];
}

class Pool {
  private readonly workers: Worker[] = [];
  constructor(n: number) {
    for (let i = 0; i < n; i++) this.workers.push(new Worker(path.join(__dirname, "optim-worker.js")));
  }
  get size(): number {
    return this.workers.length;
  }
  all(make: (i: number) => OptimCmd): Promise<OptimReply[]> {
    return Promise.all(
      this.workers.map(
        (w, i) =>
          new Promise<OptimReply>((resolve, reject) => {
            const onMsg = (m: OptimReply) => {
              w.off("error", onErr);
              resolve(m);
            };
            const onErr = (e: Error) => {
              w.off("message", onMsg);
              reject(e);
            };
            w.once("message", onMsg);
            w.once("error", onErr);
            w.postMessage(make(i));
          }),
      ),
    );
  }
  async close(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.terminate()));
  }
}

export async function runOptimCase(o: {
  sizes: number[];
  world: number;
  threads: number;
  warmup: number;
  steps: number;
  log: (s: string) => void;
}): Promise<BenchRow[]> {
  const maxP = Math.max(...o.sizes);
  const f32 = () => new SharedArrayBuffer(maxP * 4);
  const bufs = { params: f32(), m: f32(), v: f32(), slots: Array.from({ length: o.world }, f32) };
  const params = new Float32Array(bufs.params),
    m = new Float32Array(bufs.m),
    v = new Float32Array(bufs.v);
  const slots = bufs.slots.map((b) => new Float32Array(b));
  // Plausible values: weights ~0.02, grads ~1e-3 * scale-ish, moments small and positive.
  for (let i = 0; i < maxP; i++) {
    const u = ((i * 2654435761) >>> 0) / 4294967296 - 0.5;
    params[i] = 0.04 * u;
    m[i] = 1e-4 * u;
    v[i] = 1e-8 * (1 + u);
    for (let s = 0; s < o.world; s++) slots[s][i] = 65536 * 1e-3 * (u + 0.01 * s);
  }
  // Both modes run in worker threads of their own (a fresh isolate each, as a rank is), so the JIT
  // state of this thread (which also ran SingleThreadTrainer on plain arrays) cannot colour either figure.
  const single = new Pool(1);
  const pool = new Pool(o.threads);
  const rows: BenchRow[] = [];
  const hyper = { lr: 6e-4, ...ADAMW_DEFAULTS };
  try {
    await single.all(() => ({ op: "init", init: bufs }));
    await pool.all(() => ({ op: "init", init: bufs }));
    for (const P of o.sizes) {
      const ranges = rangesFor(P);
      const invScale = 1 / (o.world * 65536);
      // reduce writes slot 0 in place; slot 0 converges to a fixed point ~ slot1/(2*65536), far from
      // denormals, so every step does the same arithmetic on normal floats.
      const one = { reduce: [] as number[], update: [] as number[], total: [] as number[] };
      const split = { reduce: [] as number[], update: [] as number[], total: [] as number[] };
      let t = 1;
      const step = async (p: Pool, acc: typeof one, keep: boolean) => {
        const parts = slices(P, p.size);
        const a = performance.now();
        const rr = await p.all((i) => ({ op: "reduce", P, lo: parts[i][0], hi: parts[i][1], invScale }));
        const b = performance.now();
        const norm = Math.sqrt(rr.reduce((x, y) => x + y.sumSq, 0));
        await p.all((i) => ({
          op: "update",
          P,
          lo: parts[i][0],
          hi: parts[i][1],
          ranges,
          lr: hyper.lr,
          coef: Math.min(1, 1 / (norm + 1e-6)),
          t: t++,
        }));
        const c = performance.now();
        if (keep) {
          acc.reduce.push(b - a);
          acc.update.push(c - b);
          acc.total.push(c - a);
        }
      };
      for (let k = 0; k < o.warmup + o.steps; k++) {
        const keep = k >= o.warmup;
        // alternate which goes first, so neither always runs on a cache the other just warmed
        if (k % 2 === 0) {
          await step(single, one, keep);
          await step(pool, split, keep);
        } else {
          await step(pool, split, keep);
          await step(single, one, keep);
        }
      }
      const reduceBytes = P * (o.world + 1) * 4,
        updateBytes = P * 7 * 4;
      for (const [label, xs, threads] of [
        ["optim-1thread", one, 1],
        [`optim-${pool.size}threads`, split, pool.size],
      ] as const) {
        const tot = summarize(xs.total),
          red = median(xs.reduce),
          upd = median(xs.update);
        const row: BenchRow = {
          case: label,
          backend: "js",
          world: o.world,
          params: P,
          seq_len: null,
          micro_batch: null,
          step_ms_median: r(tot.median),
          tok_per_s: null,
          threads,
          step_ms_p25: r(tot.p25),
          step_ms_p75: r(tot.p75),
          steps_timed: tot.n,
          reduce_ms_median: r(red),
          update_ms_median: r(upd),
          reduce_gb_per_s: r(reduceBytes / (red / 1000) / 1e9, 2),
          update_gb_per_s: r(updateBytes / (upd / 1000) / 1e9, 2),
          total_gb_per_s: r((reduceBytes + updateBytes) / (tot.median / 1000) / 1e9, 2),
          bytes_per_step: reduceBytes + updateBytes,
        };
        rows.push(row);
        o.log(
          `  ${label.padEnd(15)} P=${(P / 1e6).toFixed(1)}M: ${row.step_ms_median} ms (reduce ${row.reduce_ms_median} ms ${row.reduce_gb_per_s} GB/s, adamw ${row.update_ms_median} ms ${row.update_gb_per_s} GB/s)`,
        );
      }
    }
  } finally {
    await single.close();
    await pool.close();
  }
  return rows;
}
