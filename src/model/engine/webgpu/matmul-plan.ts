/**
 * The webgpu engine's matrix products (engine.ts ties the engine together): DeferredKernels.matmuls planned into
 * dispatches. Jobs go into groups that fit one dispatch's settings (MAX_JOBS jobs of MAX_TERMS terms,
 * shaders/matmul.ts) and bindings (MM_BUFFERS distinct buffers, each bound once over the range its views span), a
 * group halved until it fits; a job of more terms than a dispatch holds runs its terms in slices. A product whose
 * output has few tiles and whose K is long is split along K: its splits' partial sums go into an engine-owned buffer
 * and matmul_reduce adds them in split order, so every output keeps one order of summation.
 */
import type { MatmulJob } from "../../kernels";
import { type GpuBuffer, type GpuDevice, USAGE } from "./device";
import type { Arena } from "./arena";
import { type Bound, grid, MAX_GROUPS, type Recorder } from "./recorder";
import { BK, MAX_JOBS, MAX_TERMS, MM_BUFFERS, mmField, TILE } from "./shaders/matmul";
import { type ParamsOf, SHADERS, type ShaderName } from "./shaders/catalog";

/** A product is split along K (matmuls) when its output has fewer tiles than this and K is at least SPLIT_MIN_K... */
const SPLIT_TILES = 32;
const SPLIT_MIN_K = 1024;
/** ...into enough splits for about this many workgroups, at most SPLIT_MAX, each at least SPLIT_MIN_K / 4 long. */
const SPLIT_GROUPS = 256;
const SPLIT_MAX = 16;

/** When the engine splits a product along K (matmuls): "auto" by its shape; "on" and "off" are tests'. */
export type SplitK = "auto" | "on" | "off";

/** Every setting of shader `name`: `v`'s, the rest 0 (a matmuls dispatch's unused job and term slots). */
function withZeros(name: ShaderName, v: Record<string, number>): Record<string, number> {
  const params = SHADERS[name].params;
  for (const n of Object.keys(v)) if (!Object.hasOwn(params, n)) throw new Error(`webgpu: ${name} has no setting ${n}`);
  return Object.fromEntries(Object.keys(params).map((n) => [n, v[n] ?? 0]));
}

export class MatmulPlan {
  /** The split products' partial sums, engine-owned. */
  private parts: GpuBuffer | null = null;
  /** The bindings a matmuls dispatch leaves unused, each a slice of this. */
  private spare: GpuBuffer | null = null;

  /** `splitK`: when a product is split along K: by its shape ("auto"), always (K > 64: a test's), or never. */
  constructor(
    private readonly device: GpuDevice,
    private readonly arena: Arena,
    private readonly rec: Recorder,
    private readonly splitK: SplitK,
  ) {}

  /** K splits of one product (matmuls): 1, unless its output has few tiles and its K is long (or the option says). */
  private splitsOf(M: number, N: number, K: number): { S: number; kc: number } {
    const tiles = Math.ceil(M / TILE) * Math.ceil(N / TILE);
    let S = 1;
    if (this.splitK === "on") S = Math.min(SPLIT_MAX, Math.ceil(K / (4 * BK)));
    else if (this.splitK === "auto" && tiles < SPLIT_TILES && K >= SPLIT_MIN_K)
      S = Math.min(SPLIT_MAX, Math.ceil(SPLIT_GROUPS / tiles), Math.floor(K / (SPLIT_MIN_K / 4)));
    if (S <= 1) return { S: 1, kc: Math.max(K, 1) };
    const kc = Math.ceil(Math.ceil(K / S) / BK) * BK;
    return { S: Math.ceil(K / kc), kc };
  }

  /** The partial sums' buffer of a split product (engine-owned, grown on demand), n floats of it as an operand. */
  private partsOf(n: number): Bound {
    this.arena.bindable(Math.max(4, n * 4));
    if (!this.parts || this.parts.size < n * 4) {
      if (this.parts) this.rec.retire(this.parts);
      this.parts = this.device.createBuffer({ size: Math.max(16, n * 4), usage: USAGE.STORAGE | USAGE.COPY_SRC });
    }
    return this.arena.own(this.parts, Math.max(1, n));
  }

  /** DeferredKernels.matmuls: each group of jobs that fits one dispatch's settings and bindings as one (two when split). */
  run(jobs: readonly MatmulJob[]): void {
    const live: MatmulJob[] = [];
    for (const job of jobs) {
      if (job.terms.length === 0) throw new RangeError("matmuls: a job without terms");
      const { M, N } = job.terms[0];
      for (const t of job.terms) {
        if (t.M !== M || t.N !== N) throw new RangeError(`matmuls: a job's terms are ${M}x${N} and ${t.M}x${t.N}`);
        if (t.A.length < M * t.K || t.B.length < t.K * N)
          throw new RangeError(`matmul: A ${t.A.length}, B ${t.B.length} floats for M=${M} N=${N} K=${t.K}`);
      }
      if (job.C.length < M * N || (job.add && job.add.length < M * N))
        throw new RangeError(
          `matmul: C ${job.C.length}${job.add ? `, add ${job.add.length}` : ""} floats for M=${M} N=${N}`,
        );
      if (M > 0 && N > 0) live.push(job);
    }
    const run = (group: MatmulJob[]): void => {
      if (group.length === 0) return;
      if (group.length > MAX_JOBS || (!this.group(group) && group.length > 1)) {
        const half = Math.ceil(group.length / 2);
        run(group.slice(0, half));
        run(group.slice(half));
      }
    };
    const terms = (j: MatmulJob) => Math.ceil(j.terms.length / MAX_TERMS);
    for (const job of live)
      if (terms(job) > 1) {
        // a job of more terms than one dispatch holds: its first MAX_TERMS, then the rest added (beta 1)
        for (let i = 0; i < job.terms.length; i += MAX_TERMS)
          run([
            i === 0
              ? { ...job, terms: job.terms.slice(0, MAX_TERMS) }
              : { C: job.C, beta: 1, terms: job.terms.slice(i, i + MAX_TERMS) },
          ]);
      }
    run(live.filter((j) => terms(j) === 1));
  }

  /**
   * One matmuls dispatch (and its reduce, when a job is split) for up to MAX_JOBS jobs of up to MAX_TERMS terms:
   * false, recording nothing, when their operands need more than MM_BUFFERS bindings.
   */
  private group(group: MatmulJob[]): boolean {
    // the operands' device ranges, each distinct buffer bound once over the range its views span (b0..b7)
    const views: { a: Float32Array; mode: "r" | "w" | "rw" }[] = [];
    for (const job of group) {
      for (const t of job.terms) views.push({ a: t.A, mode: "r" }, { a: t.B, mode: "r" });
      if (job.add) views.push({ a: job.add, mode: "r" });
    }
    const outs = group.map((job) => ({ a: job.C, mode: (job.beta === 0 || job.add ? "w" : "rw") as "w" | "rw" }));
    const all = [...views, ...outs]; // bound as matmul bound them: its inputs, then its output
    const table: { buffer: GpuBuffer; lo: number; hi: number }[] = [];
    const place = (b: Bound): void => {
      const same = table.filter((x) => x.buffer === b.buffer);
      for (const x of same) {
        const lo = Math.min(x.lo, b.offset),
          hi = Math.max(x.hi, b.offset + b.size);
        if (hi - lo <= this.arena.maxBinding) {
          x.lo = lo;
          x.hi = hi;
          return;
        }
      }
      table.push({ buffer: b.buffer, lo: b.offset, hi: b.offset + b.size });
    };
    // what bind() would give, without binding (an upload) before the group is known to fit
    const probe = (a: Float32Array): Bound | null => {
      const m = this.arena.mirrorOf(a, false);
      if (!m) return null;
      const dev = a.byteOffset - m.start,
        offset = Math.floor(dev / this.arena.align) * this.arena.align;
      return { buffer: m.gpu, offset, size: Math.max(4, dev + a.byteLength - offset), elem: 0 };
    };
    // a view not mirrored yet: one binding per host buffer (a plain ArrayBuffer is mirrored whole), or per view
    const unknown = new Set<unknown>();
    for (const { a } of all) {
      const b = probe(a);
      if (b) place(b);
      else unknown.add(a.buffer instanceof SharedArrayBuffer ? a : a.buffer);
    }
    if (table.length + unknown.size > MM_BUFFERS) return false;
    table.length = 0;
    const bound = new Map<Float32Array, Bound>();
    for (const v of all) {
      const b = bound.get(v.a) ?? this.arena.bind(v.a, v.mode);
      bound.set(v.a, b);
      place(b);
    }
    if (table.length > MM_BUFFERS) throw new Error("webgpu: matmuls needs more bindings than it probed");
    const at = (a: Float32Array): { b: number; o: number } => {
      const x = bound.get(a)!;
      const i = table.findIndex((t) => t.buffer === x.buffer && t.lo <= x.offset && x.offset + x.size <= t.hi);
      return { b: i, o: (x.offset - table[i].lo) / 4 + x.elem };
    };
    // each job's workgroups, splits and partial sums
    const v: Record<string, number> = { jobs: group.length };
    const r: Record<string, number> = { jobs: 0 };
    const split: number[] = [];
    let groups = 0,
      partial = 0,
      elems = 0;
    const single = group.length === 1 && group[0].terms.length === 1;
    group.forEach((job, j) => {
      const { M, N } = job.terms[0];
      const X = Math.ceil(N / TILE),
        T = Math.ceil(M / TILE) * X;
      const s = job.terms.map((t) => this.splitsOf(M, N, t.K));
      const sp = Math.max(...s.map((x) => x.S));
      const c = at(job.C),
        d = job.add ? at(job.add) : c;
      Object.assign(v, {
        [mmField("F", j)]: groups,
        [mmField("T", j)]: T,
        [mmField("X", j)]: X,
        [mmField("sp", j)]: sp,
        [mmField("M", j)]: M,
        [mmField("N", j)]: N,
        [mmField("nt", j)]: job.terms.length,
        [mmField("bC", j)]: c.b,
        [mmField("oC", j)]: c.o,
        [mmField("ad", j)]: job.add ? 1 : 0,
        [mmField("bD", j)]: d.b,
        [mmField("oD", j)]: d.o,
      });
      groups += T * sp;
      const rj = split.length;
      if (sp > 1) {
        split.push(j);
        Object.assign(r, {
          [mmField("F", rj)]: elems,
          [mmField("E", rj)]: elems + M * N,
          [mmField("MN", rj)]: M * N,
          [mmField("nt", rj)]: job.terms.length,
          [mmField("bC", rj)]: c.b,
          [mmField("oC", rj)]: c.o,
          [mmField("ad", rj)]: job.add ? 1 : 0,
          [mmField("bD", rj)]: d.b,
          [mmField("oD", rj)]: d.o,
        });
        elems += M * N;
      }
      job.terms.forEach((t, i) => {
        const a = at(t.A),
          b = at(t.B);
        const be = i > 0 || job.add ? 1 : job.beta;
        const pO = sp > 1 ? partial : 0;
        if (sp > 1) partial += s[i].S * M * N;
        if (!single) Object.assign(v, { [mmField("tA", j, i)]: t.tA ? 1 : 0, [mmField("tB", j, i)]: t.tB ? 1 : 0 });
        Object.assign(v, {
          [mmField("K", j, i)]: t.K,
          [mmField("S", j, i)]: s[i].S,
          [mmField("kc", j, i)]: s[i].kc,
          [mmField("al", j, i)]: t.alpha,
          [mmField("be", j, i)]: be,
          [mmField("bA", j, i)]: a.b,
          [mmField("oA", j, i)]: a.o,
          [mmField("bB", j, i)]: b.b,
          [mmField("oB", j, i)]: b.o,
          [mmField("pO", j, i)]: pO,
        });
        if (sp > 1)
          Object.assign(r, {
            [mmField("S", rj, i)]: s[i].S,
            [mmField("al", rj, i)]: t.alpha,
            [mmField("be", rj, i)]: be,
            [mmField("pO", rj, i)]: pO,
          });
      });
    });
    r.jobs = split.length;
    const name: ShaderName = single
      ? (`matmul_${group[0].terms[0].tA ? "t" : "n"}${group[0].terms[0].tB ? "t" : "n"}` as ShaderName)
      : "matmuls";
    const ops: Bound[] = table.map((t) => ({ buffer: t.buffer, offset: t.lo, size: t.hi - t.lo, elem: 0 }));
    // the unused bindings: disjoint slices of a small engine-owned buffer (writable bindings may not overlap)
    this.spare ??= this.device.createBuffer({ size: this.arena.align * MM_BUFFERS, usage: USAGE.STORAGE });
    for (let i = ops.length; i < MM_BUFFERS; i++)
      ops.push({ buffer: this.spare, offset: i * this.arena.align, size: 16, elem: 0 });
    ops.push(this.partsOf(partial));
    const x = Math.min(groups, MAX_GROUPS);
    this.rec.dispatch(name as "matmuls", ops, withZeros(name, v) as ParamsOf<"matmuls">, [x, Math.ceil(groups / x)]);
    if (split.length > 0)
      this.rec.dispatch("matmul_reduce", ops, withZeros("matmul_reduce", r) as ParamsOf<"matmul_reduce">, grid(elems));
    return true;
  }
}
