/**
 * The bench's `webgpu-attention` case: the webgpu engine's fused attention alone, one sequence of the frozen shape
 * (9 query heads over 3 kv heads of 64) at each of `--gemm-seqs`, on whatever adapter is here (without a GPU,
 * Mesa's llvmpipe). The forward, then the backward, each call timed to its settle (its outputs read back). With a
 * base (`--webgpu-base DIR`, a revision built by bench/native/build-base.sh), that tree's engine runs the same calls
 * on the same operands; the two trees take turns, one process each per round, so drift on a shared machine hits
 * them alike; each figure is the best call of every round. The base's outputs must match this tree's to 1e-4
 * (relative to each output's largest magnitude): a faster kernel that computes something else fails the case.
 *
 *   node dist/bench/webgpu-attention.js [--tree DIR] [--seq 256] [--calls 3] [--dump FILE]
 * prints `WEBGPU_ATTENTION {"fwd_ms":[...],"bwd_ms":[...],"adapter":"..."}`; --dump writes out, lse, dq, dk, dv
 * (float32, in that order) to FILE.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { arg } from "./args";
import { seededFloats } from "./seeded";
import { WEBGPU_ENGINE_FILES } from "./webgpu-step";

/** The frozen model's attention heads: query heads, kv heads, head size. */
const H = 9,
  K = 3,
  E = 64;

interface AttentionRun {
  fwd_ms: number[];
  bwd_ms: number[];
  adapter: string;
}

async function main(): Promise<void> {
  const tree = path.resolve(arg("--tree", path.join(__dirname, "..", "..")));
  const T = Number(arg("--seq", "256")),
    calls = Number(arg("--calls", "3")),
    dump = arg("--dump", "");
  const engine = WEBGPU_ENGINE_FILES.find((f) => fs.existsSync(path.join(tree, "dist", "src", "model", f)));
  if (!engine) throw new Error(`${tree}: no built webgpu engine (dist/src/model/${WEBGPU_ENGINE_FILES.join(" or ")})`);
  const { createWebgpuKernels } = require(path.join(tree, "dist", "src", "model", engine));
  const w = await createWebgpuKernels();
  if ("reason" in w) throw new Error(`webgpu: ${w.reason}; fix: ${w.fix}`);
  const k = w.kernels;
  const q = seededFloats(T * H * E, 1, 2),
    kk = seededFloats(T * K * E, 2, 2),
    v = seededFloats(T * K * E, 3, 2),
    dout = seededFloats(T * H * E, 4, 2);
  const out = new Float32Array(q.length),
    lse = new Float32Array(H * T),
    dq = new Float32Array(q.length),
    dk = new Float32Array(kk.length),
    dv = new Float32Array(kk.length);
  const run: AttentionRun = { fwd_ms: [], bwd_ms: [], adapter: k.name };
  // the first call compiles the pipelines: untimed
  for (let i = 0; i <= calls; i++) {
    const t0 = performance.now();
    k.attentionForward(out, lse, q, kk, v, 1, T, H, K, E);
    await k.settle([out, lse]);
    const t1 = performance.now();
    k.attentionBackward(dq, dk, dv, dout, q, kk, v, out, lse, 1, T, H, K, E);
    await k.settle([dq, dk, dv]);
    const t2 = performance.now();
    if (i === 0) continue;
    run.fwd_ms.push(t1 - t0);
    run.bwd_ms.push(t2 - t1);
  }
  k.dispose();
  if (dump) {
    const all = [out, lse, dq, dk, dv];
    fs.writeFileSync(dump, Buffer.concat(all.map((a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength))));
  }
  process.stdout.write(`WEBGPU_ATTENTION ${JSON.stringify(run)}\n`);
}

/** webgpu-attention.js on a built tree, in its own process. */
function attentionOn(tree: string, seq: number, calls: number, dump: string): AttentionRun {
  const script = path.join(__dirname, "webgpu-attention.js");
  const args = [script, "--tree", tree, "--seq", String(seq), "--calls", String(calls), "--dump", dump];
  const r = spawnSync(process.execPath, args, { encoding: "utf8", maxBuffer: 1 << 24 });
  const line = (r.stdout ?? "").split("\n").find((l) => l.startsWith("WEBGPU_ATTENTION "));
  if (r.status !== 0 || !line)
    throw new Error(
      `webgpu-attention on ${tree}: exit ${r.status}: ${(r.stderr ?? "").trim().split("\n").slice(-3).join(" | ")}`,
    );
  return JSON.parse(line.slice("WEBGPU_ATTENTION ".length)) as AttentionRun;
}

/** The largest difference of two dumps' outputs, each relative to the larger of its own largest magnitudes. */
function dumpDiff(a: string, b: string, seq: number): number {
  const x = new Float32Array(fs.readFileSync(a).buffer.slice(0)),
    y = new Float32Array(fs.readFileSync(b).buffer.slice(0));
  const n = seq * H * E,
    nk = seq * K * E;
  const sizes = [n, H * seq, n, nk, nk];
  let at = 0,
    worst = 0;
  for (const len of sizes) {
    let d = 0,
      m = 0;
    for (let i = at; i < at + len; i++) {
      d = Math.max(d, Math.abs(x[i] - y[i]));
      m = Math.max(m, Math.abs(x[i]), Math.abs(y[i]));
    }
    worst = Math.max(worst, Number.isFinite(d) ? d / Math.max(m, 1e-30) : Infinity);
    at += len;
  }
  return worst;
}

export interface WebgpuAttentionRow {
  seq: number;
  heads: string;
  adapter: string;
  fwd_ms: number;
  bwd_ms: number;
  fwd_bwd_ms: number;
  base_rev?: string;
  base_fwd_ms?: number;
  base_bwd_ms?: number;
  base_fwd_bwd_ms?: number;
  /** (base fwd + bwd) / (this tree's fwd + bwd), each the best of its calls */
  speedup_vs_base_fwd_bwd?: number;
  /** the largest difference of the two trees' outputs, relative to each output's largest magnitude */
  base_max_rel_diff?: number;
}

/** Each of `seqs`, `rounds` rounds of `calls` calls, this tree and the base (if any) taking turns. */
export function webgpuAttentionBench(o: {
  seqs: number[];
  rounds: number;
  calls: number;
  base?: { dir: string; rev: string };
  log: (s: string) => void;
}): WebgpuAttentionRow[] {
  const root = path.join(__dirname, "..", "..");
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tsbench-webgpu-attention-"));
  const rows: WebgpuAttentionRow[] = [];
  try {
    for (const seq of o.seqs) {
      const mine: AttentionRun[] = [],
        theirs: AttentionRun[] = [];
      for (let r = 0; r < o.rounds; r++) {
        // alternate who goes first
        const order = r % 2 === 0 ? ["this", "base"] : ["base", "this"];
        for (const who of order) {
          if (who === "this") mine.push(attentionOn(root, seq, o.calls, path.join(tmp, "this.f32")));
          else if (o.base) theirs.push(attentionOn(o.base.dir, seq, o.calls, path.join(tmp, "base.f32")));
        }
      }
      const best = (runs: AttentionRun[], f: "fwd_ms" | "bwd_ms") => Math.min(...runs.flatMap((x) => x[f]));
      const r2 = (x: number) => +x.toFixed(2);
      const row: WebgpuAttentionRow = {
        seq,
        heads: `${H}/${K}x${E}`,
        adapter: mine[0].adapter,
        fwd_ms: r2(best(mine, "fwd_ms")),
        bwd_ms: r2(best(mine, "bwd_ms")),
        fwd_bwd_ms: r2(best(mine, "fwd_ms") + best(mine, "bwd_ms")),
      };
      if (o.base) {
        const diff = dumpDiff(path.join(tmp, "this.f32"), path.join(tmp, "base.f32"), seq);
        if (!(diff <= 1e-4))
          throw new Error(`webgpu-attention T${seq}: the base ${o.base.rev} differs from this tree by ${diff}`);
        const bf = best(theirs, "fwd_ms"),
          bb = best(theirs, "bwd_ms");
        Object.assign(row, {
          base_rev: o.base.rev,
          base_fwd_ms: r2(bf),
          base_bwd_ms: r2(bb),
          base_fwd_bwd_ms: r2(bf + bb),
          speedup_vs_base_fwd_bwd: +((bf + bb) / (row.fwd_ms + row.bwd_ms)).toFixed(3),
          base_max_rel_diff: +diff.toExponential(2),
        });
      }
      o.log(
        `webgpu-attention T${seq} ${row.heads} on ${row.adapter}: fwd ${row.fwd_ms} + bwd ${row.bwd_ms} ms${o.base ? `; base ${o.base.rev} ${row.base_fwd_ms} + ${row.base_bwd_ms} ms: ${row.speedup_vs_base_fwd_bwd}x forward+backward` : ""}`,
      );
      rows.push(row);
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  return rows;
}

// a process of its own (webgpuAttentionBench starts it); bench.ts imports only the function
if (require.main === module)
  main().catch((e) => {
    process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(1);
  });
