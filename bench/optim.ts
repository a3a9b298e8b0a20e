/**
 * Case 4: the optimizer's memory-bound passes alone, with the trainer's own functions (bench/optim-worker.ts), at
 * each parameter count, in one worker thread and split across `threads` worker threads as the ranks split them,
 * against a memory-bandwidth probe measured in the same rounds by the same threads:
 *
 *   fold        foldMicro: a micro-batch's float32 gradient into the rank's float64 slot (every rank, whole vector;
 *               later micro-batches: reads g and the slot, writes both (g zeroed): 24 B an element; the first: 16 B)
 *   reduce      reduceChunks64 over `world` float64 slots into the float32 gradient, with the chunks' sums of
 *               squares (each thread its chunks): reads 8 B per slot, writes 4 B
 *   update      adamwSliceSimd (the addon's C kernel where it loads, else wasm; the row's update_kernel): reads
 *               params, m, v, g and writes params, m, v: 28 B
 *   probe       the best of four over float64: a triad x = y + s*z in JS and in C (24 B), an in-place x += s*y in C
 *               (24 B, none of it a line read only to be overwritten) and a copy (TypedArray.set, a memmove: 16 B);
 *               the C ones need the probes addon (bench/native-probes.ts; without the engine, the JS two). The JS
 *               loops alone run well under what the memory moves for C (here 12 against 30 GB/s on one thread), so
 *               they are not the hardware's figure.
 *
 * Before each fold every thread's micro-batch gradient is refilled with gradient-like values (untimed), so that no
 * pass runs on zeros (foldMicro leaves g zeroed, as the trainer's backward then refills it), which the memory system
 * moves at other speeds. Each pass's GB/s counts those bytes (no write-allocate, as STREAM counts), and `*_of_bw` is its GB/s over the
 * probe's. Rounds alternate which of the two thread counts goes first, so drift hits both alike; each figure is the
 * median over the timed rounds. Times are each thread's time inside the call, the slowest thread's per phase.
 */
import { Worker } from "node:worker_threads";
import * as path from "node:path";
import { chunkCount, chunkSlices, slices, ADAMW_DEFAULTS, type DecayRange } from "../src/optim/optim";
import { buildConfig } from "../src/model/llama-config";
import { paramLayout } from "../src/model/layout";
import { adamwKernel } from "../src/optim/optim-simd";
import { streamProbe } from "./native-probes";
import type { OptimCmd, OptimReply, OptimWorkerInit } from "./optim-worker";
import type { BenchRow } from "./steps";
import { median, r } from "./stats";

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
  const sab = (bytes: number) => new SharedArrayBuffer(maxP * bytes);
  const threads = Math.max(o.threads, 1);
  const bufs: OptimWorkerInit = {
    params: sab(4),
    m: sab(4),
    v: sab(4),
    slots: Array.from({ length: Math.max(o.world, threads) }, () => sab(8)),
    micro: Array.from({ length: Math.max(o.world, threads) }, () => sab(4)),
    grad: sab(4),
    sq: new SharedArrayBuffer(chunkCount(maxP) * 8),
    probe: sab(8),
  };
  const params = new Float32Array(bufs.params),
    m = new Float32Array(bufs.m),
    v = new Float32Array(bufs.v);
  const slots = bufs.slots.map((b) => new Float64Array(b));
  // Plausible values: weights ~0.02, moments small and positive, slots a loss-scaled gradient sum.
  for (let i = 0; i < maxP; i++) {
    const u = ((i * 2654435761) >>> 0) / 4294967296 - 0.5;
    params[i] = 0.04 * u;
    m[i] = 1e-4 * u;
    v[i] = 1e-8 * (1 + u);
    for (let s = 0; s < slots.length; s++) slots[s][i] = 65536 * 1e-3 * (u + 0.01 * s);
  }
  // Both thread counts run in worker threads of their own (a fresh isolate each, as a rank is).
  const single = new Pool(1);
  const pool = new Pool(threads);
  const rows: BenchRow[] = [];
  const hyper = { lr: 6e-4, ...ADAMW_DEFAULTS };
  type Phase = "triad" | "copy" | "ctriad" | "axpy" | "foldFirst" | "fold" | "reduce" | "update";
  const PHASES: Phase[] = ["triad", "copy", "ctriad", "axpy", "foldFirst", "fold", "reduce", "update"];
  const cProbes = streamProbe() !== null; // the C probes need the probes addon; without the engine the JS ones alone
  try {
    await single.all(() => ({ op: "init", init: bufs }));
    await pool.all(() => ({ op: "init", init: bufs }));
    for (const P of o.sizes) {
      const ranges = rangesFor(P);
      const invScale = 1 / (o.world * 65536);
      const times = new Map<Pool, Record<Phase, number[]>>(
        [single, pool].map((p) => [
          p,
          Object.fromEntries(PHASES.map((x) => [x, [] as number[]])) as Record<Phase, number[]>,
        ]),
      );
      let t = 1;
      const slowest = (rs: OptimReply[]) => Math.max(...rs.map((x) => x.ms));
      const round = async (p: Pool, keep: boolean) => {
        // each thread's micro-batch gradient refilled before each fold (untimed), as the backward refills it
        const fill = () => p.all((i) => ({ op: "fill", P, thread: i, salt: t * 7 + i }));
        const parts = slices(P, p.size),
          chunks = chunkSlices(P, p.size),
          at = times.get(p)!;
        const got: Record<Phase, number> = {
          triad: slowest(await p.all((i) => ({ op: "triad", lo: parts[i][0], hi: parts[i][1] }))),
          copy: slowest(await p.all((i) => ({ op: "copy", lo: parts[i][0], hi: parts[i][1] }))),
          ctriad: cProbes ? slowest(await p.all((i) => ({ op: "ctriad", lo: parts[i][0], hi: parts[i][1] }))) : NaN,
          axpy: cProbes ? slowest(await p.all((i) => ({ op: "axpy", lo: parts[i][0], hi: parts[i][1] }))) : NaN,
          foldFirst: await fill().then(async () =>
            slowest(await p.all((i) => ({ op: "fold", P, thread: i, first: true }))),
          ),
          fold: await fill().then(async () =>
            slowest(await p.all((i) => ({ op: "fold", P, thread: i, first: false }))),
          ),
          reduce: slowest(
            await p.all((i) => ({ op: "reduce", P, c0: chunks[i][0], c1: chunks[i][1], invScale: invScale })),
          ),
          update: slowest(
            await p.all((i) => ({
              op: "update",
              P,
              lo: parts[i][0],
              hi: parts[i][1],
              ranges,
              lr: hyper.lr,
              coef: 0.5,
              t: t++,
            })),
          ),
        };
        if (keep) for (const x of PHASES) at[x].push(got[x]);
      };
      for (let k = 0; k < o.warmup + o.steps; k++) {
        const keep = k >= o.warmup;
        // alternate which goes first, so neither always runs on a cache the other just warmed
        for (const p of k % 2 === 0 ? [single, pool] : [pool, single]) await round(p, keep);
      }
      for (const [label, p] of [
        ["optim-1thread", single],
        [`optim-${pool.size}threads`, pool],
      ] as const) {
        const at = times.get(p)!,
          n = p.size;
        const ms = (x: Phase) => median(at[x]);
        const gbs = (bytes: number, x: Phase) => bytes / (ms(x) / 1000) / 1e9;
        const bytes: Record<Phase, number> = {
          triad: 24 * P,
          copy: 16 * P,
          ctriad: 24 * P,
          axpy: 24 * P,
          foldFirst: 16 * P * n, // every rank folds its whole gradient
          fold: 24 * P * n,
          reduce: (8 * o.world + 4) * P,
          update: 28 * P,
        };
        const probes = (["triad", "copy", "ctriad", "axpy"] as const).filter(
          (x) => cProbes || x === "triad" || x === "copy",
        );
        const bw = Math.max(...probes.map((x) => gbs(bytes[x], x)));
        const pass = (x: Phase, key: string) => ({
          [`${key}_ms_median`]: r(ms(x)),
          [`${key}_gb_per_s`]: r(gbs(bytes[x], x), 2),
          [`${key}_of_bw`]: r(gbs(bytes[x], x) / bw, 3),
        });
        const row: BenchRow = {
          case: label,
          backend: "js",
          world: o.world,
          params: P,
          seq_len: null,
          micro_batch: null,
          step_ms_median: r(ms("reduce") + ms("update")),
          tok_per_s: null,
          threads: n,
          steps_timed: at.update.length,
          bw_probe_gb_per_s: r(bw, 2),
          triad_gb_per_s: r(gbs(bytes.triad, "triad"), 2),
          copy_gb_per_s: r(gbs(bytes.copy, "copy"), 2),
          c_triad_gb_per_s: cProbes ? r(gbs(bytes.ctriad, "ctriad"), 2) : null,
          c_axpy_gb_per_s: cProbes ? r(gbs(bytes.axpy, "axpy"), 2) : null,
          ...pass("foldFirst", "fold_first"),
          ...pass("fold", "fold"),
          ...pass("reduce", "reduce"),
          ...pass("update", "update"),
          update_kernel: adamwKernel(),
        };
        rows.push(row);
        o.log(
          `  ${label.padEnd(15)} P=${(P / 1e6).toFixed(1)}M: probe ${row.bw_probe_gb_per_s} GB/s; fold ${row.fold_ms_median} ms ${row.fold_gb_per_s} GB/s (${row.fold_of_bw}), first fold ${row.fold_first_gb_per_s} GB/s (${row.fold_first_of_bw}), reduce ${row.reduce_ms_median} ms ${row.reduce_gb_per_s} GB/s (${row.reduce_of_bw}), adamw (${row.update_kernel}) ${row.update_ms_median} ms ${row.update_gb_per_s} GB/s (${row.update_of_bw})`,
        );
      }
    }
  } finally {
    await single.close();
    await pool.close();
  }
  return rows;
}
