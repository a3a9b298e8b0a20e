/**
 * The `attention` case of `npm run bench`: the fused attention kernel (native/ops/attention.c, FlashAttention-2's
 * scheme: lse [H,T] kept), one sequence of the frozen shape (9 query heads over 3 kv heads of 64) at each T, one
 * thread, in each precision, each call timed on the process's CPU clock (only this thread is busy), each figure its
 * best round. With a base (`--attention-base DIR`: an older revision built beside this one by
 * bench/native/build-base.sh, such as 2babbe7 with the unfused kernels the fused ones replaced, the whole [H,T,T]
 * probabilities kept), its own addon's attention (the unfused signature, on that revision's GEMM) takes turns with
 * the fused calls, round by round in fp32, so drift on a shared machine hits them alike: the fused kernel against the
 * base as it ran then. Two ratios: forward+backward once each, and the training step's count under gradient
 * checkpointing (on by default), where the base's forward ran twice (once more before the block's backward, to remake
 * att) and the fused one once (its out and lse kept).
 *
 *   node dist/bench/attention.js [--seqs 256,1024] [--rounds 9] [--precisions fp32,bf16] [--attention-base DIR]
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { loadNative, type Precision } from "../src/model/engine/native";
import { arg } from "./args";
import { seededFloats } from "./seeded";

export interface AttentionRow {
  seq: number;
  precision: Precision;
  fused_fwd_ms: number;
  fused_bwd_ms: number;
  /** what the fused kernel keeps for the backward (lse), MB */
  fused_saved_mb: number;
  /** with a base (fp32 rows): its revision, its own addon's timings, what it keeps (att) and the fused kernel's
   *  speedups over it: (base fwd + bwd) / (fused fwd + bwd), and (2 x base fwd + bwd) / (fused fwd + bwd), one block
   *  of a checkpointed step */
  base_rev?: string;
  base_fwd_ms?: number;
  base_bwd_ms?: number;
  base_saved_mb?: number;
  speedup_vs_base_fwd_bwd?: number;
  speedup_vs_base_ckpt_step?: number;
}

/** An older revision's attention, from its own addon: the unfused signature, the whole probabilities att [B,H,T,T]
 *  kept by the forward and read by the backward. */
export interface BaseAttention {
  rev: string;
  dir: string;
  forward(
    out: Float32Array,
    att: Float32Array,
    q: Float32Array,
    k: Float32Array,
    v: Float32Array,
    B: number,
    T: number,
    H: number,
    K: number,
    E: number,
  ): void;
  backward(
    dq: Float32Array,
    dk: Float32Array,
    dv: Float32Array,
    dout: Float32Array,
    q: Float32Array,
    k: Float32Array,
    v: Float32Array,
    att: Float32Array,
    B: number,
    T: number,
    H: number,
    K: number,
    E: number,
  ): void;
}

/** How to get a base: the build script prints the folder to pass to --attention-base. */
export const BUILD_BASE =
  'build a base with `bench/native/build-base.sh 2babbe7 "$(mktemp -d)"`, which prints the folder to pass';

/** The attention of the build in `dir` (bench/native/build-base.sh REV DIR), or an error naming what is missing
 * and the command that makes it. */
export function loadBaseAttention(dir: string): BaseAttention {
  const abs = path.resolve(dir),
    addon = path.join(abs, "build", "Release", "tstrain_native.node"),
    fix = BUILD_BASE;
  if (!fs.existsSync(addon)) throw new Error(`--attention-base ${JSON.stringify(dir)}: no ${addon}; ${fix}`);
  let a: Record<string, unknown>;
  try {
    a = require(addon) as Record<string, unknown>; // its functions are not enumerable (napi_default)
  } catch (e) {
    throw new Error(
      `--attention-base ${JSON.stringify(dir)}: ${addon} does not load (${(e as Error).message}); ${fix}`,
    );
  }
  const fwd = a.attentionForward,
    bwd = a.attentionBackward;
  // the unfused signature: attentionForward(out, att, q, k, v, B, T, H, K, E) and the backward with att, 13 arguments;
  // a fused build exports attentionProfile (before the probes had their own addon) or has the probes addon beside it
  if (
    typeof fwd !== "function" ||
    typeof bwd !== "function" ||
    "attentionForwardUnfused" in a ||
    "attentionProfile" in a ||
    fs.existsSync(path.join(abs, "build", "Release", "tstrain_probes.node"))
  )
    throw new Error(
      `--attention-base ${JSON.stringify(dir)}: ${addon} has no unfused attentionForward/attentionBackward (a revision before the fused kernel, such as 2babbe7, has them); ${fix}`,
    );
  const revFile = path.join(abs, ".base-rev");
  const rev = fs.existsSync(revFile) ? fs.readFileSync(revFile, "utf8").trim() : path.basename(abs);
  return {
    rev,
    dir: abs,
    forward: (...args) => void (fwd as (...x: unknown[]) => unknown)(...args),
    backward: (...args) => void (bwd as (...x: unknown[]) => unknown)(...args),
  };
}

/** Largest |a - b| over two arrays of one length. */
function maxDiff(a: Float32Array, b: Float32Array): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

/** CPU milliseconds of one call of f. */
function cpuMs(f: () => void): number {
  const c0 = process.cpuUsage();
  f();
  const c = process.cpuUsage(c0);
  return (c.user + c.system) / 1000;
}

export function attentionBench(opts: {
  seqs: number[];
  rounds: number;
  precisions: Precision[];
  log: (m: string) => void;
  base?: BaseAttention;
}): AttentionRow[] {
  const H = 9,
    Kh = 3,
    E = 64;
  const rows: AttentionRow[] = [];
  for (const precision of opts.precisions)
    for (const T of opts.seqs) {
      const n = loadNative({ gemm: "builtin", isa: "auto", precision });
      if (!("kernels" in n)) throw new Error(`attention: the native engine does not load (${n.reason})`);
      const k = n.kernels;
      const q = seededFloats(T * H * E, 1, 2),
        kk = seededFloats(T * Kh * E, 2, 2),
        v = seededFloats(T * Kh * E, 3, 2),
        dout = seededFloats(T * H * E, 4, 2);
      const out = new Float32Array(T * H * E),
        lse = new Float32Array(H * T);
      const dq = new Float32Array(q.length),
        dk = new Float32Array(kk.length),
        dv = new Float32Array(v.length);
      const base = precision === "fp32" ? opts.base : undefined;
      const att = new Float32Array(base ? H * T * T : 0),
        bout = new Float32Array(base ? out.length : 0),
        bdq = new Float32Array(base ? dq.length : 0);
      const calls = [
        () => k.attentionForward(out, lse, q, kk, v, 1, T, H, Kh, E),
        () => k.attentionBackward(dq, dk, dv, dout, q, kk, v, out, lse, 1, T, H, Kh, E),
      ];
      if (base)
        calls.push(
          () => base.forward(bout, att, q, kk, v, 1, T, H, Kh, E),
          () => base.backward(bdq, dk, dv, dout, q, kk, v, att, 1, T, H, Kh, E),
        );
      for (const f of calls) f(); // untimed: pages touched, caches and GEMM buffers warm
      if (base) {
        // the base computes the same attention (out and dq after the fused calls and the base's, all from q, k, v)
        const d = Math.max(maxDiff(bout, out), maxDiff(bdq, dq));
        if (!(d < 1e-3))
          throw new Error(`attention T${T}: the base ${base.rev} (${base.dir}) differs from the fused kernel by ${d}`);
      }
      const best = calls.map(() => Infinity);
      for (let r = 0; r < opts.rounds; r++)
        for (let i = 0; i < calls.length; i++) best[i] = Math.min(best[i], cpuMs(calls[i]));
      const [ff, fb, bf, bb] = best;
      const row: AttentionRow = {
        seq: T,
        precision,
        fused_fwd_ms: round(ff),
        fused_bwd_ms: round(fb),
        fused_saved_mb: round((lse.length * 4) / 1e6, 3),
        ...(base && {
          base_rev: base.rev,
          base_fwd_ms: round(bf),
          base_bwd_ms: round(bb),
          base_saved_mb: round((att.length * 4) / 1e6),
          speedup_vs_base_fwd_bwd: round((bf + bb) / (ff + fb)),
          speedup_vs_base_ckpt_step: round((2 * bf + bb) / (ff + fb)),
        }),
      };
      opts.log(
        `attention T${T} ${precision}: fused ${row.fused_fwd_ms} + ${row.fused_bwd_ms} ms, keeps ${row.fused_saved_mb} MB${base ? `; base ${base.rev} ${row.base_fwd_ms} + ${row.base_bwd_ms} ms, keeps ${row.base_saved_mb} MB: ${row.speedup_vs_base_fwd_bwd}x forward+backward, ${row.speedup_vs_base_ckpt_step}x in a checkpointed step` : ""}`,
      );
      rows.push(row);
    }
  return rows;
}

const round = (x: number, d = 2): number => Math.round(x * 10 ** d) / 10 ** d;

if (require.main === module) {
  const seqs = arg("--seqs", "256,1024").split(",").map(Number),
    rounds = Number(arg("--rounds", "9")),
    precisions = arg("--precisions", "fp32").split(",") as Precision[],
    baseDir = arg("--attention-base", "");
  for (const x of [...seqs, rounds])
    if (!Number.isInteger(x) || x < 1) throw new RangeError(`attention bench: ${x} is not a positive integer`);
  for (const p of precisions)
    if (p !== "fp32" && p !== "bf16") throw new RangeError(`attention bench: precision ${p} is not fp32 or bf16`);
  const base = baseDir ? loadBaseAttention(baseDir) : undefined;
  const rows = attentionBench({ seqs, rounds, precisions, base, log: (m) => process.stdout.write(`${m}\n`) });
  for (const r of rows) process.stdout.write(`BENCH_JSON ${JSON.stringify({ case: "attention", ...r })}\n`);
}
