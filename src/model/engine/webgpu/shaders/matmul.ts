/**
 * The matrix products' WGSL (framework.ts): gemm, its four single-product pipelines (the transposes compile-time
 * constants), `matmuls` (several jobs of several terms in one dispatch) and matmul_reduce (a split product's
 * partial sums added in split order). The engine plans the jobs and splits (../matmul-plan.ts).
 */
import { type ParamList, type ParamType, shader, idx, WG } from "./framework";

/** The matmul's output tile: TILE x TILE per workgroup of MT x MT threads, each 8 x 8 outputs (gemm, below). */
export const TILE = 64;
/** The matmul's threads per side of its workgroup: each thread holds TM x TM outputs, two 4-wide halves a side. */
const MT = 8;
/** Outputs per thread per side: rows ty*4+i and 32+ty*4+i (i < 4), columns alike, so each shared read is conflict-free. */
const TM = TILE / MT;
/** The matmul's K step: the shared tiles are BK x TILE of A and of B, each row padded by one vec4 against bank conflicts. */
export const BK = 16;
/** A padded shared row, in vec4s. */
const ROW = TILE / 4 + 1;
/** The most jobs of one matmuls dispatch, and terms of one job (the uniform holds each one's settings by name). */
export const MAX_JOBS = 4;
export const MAX_TERMS = 3;
/** Float storage arrays a matmuls dispatch binds (b0..b7, each a distinct device buffer), besides its partial sums. */
export const MM_BUFFERS = 8;
if (TM !== 8 || (MT * MT * 16) % (TILE * BK) !== 0 || TILE % 8 !== 0)
  throw new Error(`webgpu: TILE ${TILE} with ${MT} x ${MT} threads gives no 8 x 8 per thread`);

/** One product's transposes as compile-time constants (a pipeline per pair), or null: each term's from the uniform. */
type Transposes = { tA: 0 | 1; tB: 0 | 1 } | null;

/** A job's settings (matmuls) by field: F its first workgroup, T its output tiles, X its column tiles, sp its K splits. */
const JOB_FIELDS = ["F", "T", "X", "sp", "M", "N", "nt", "bC", "oC", "ad", "bD", "oD"] as const;
/** A term's settings: K, its splits S of kc each, alpha, beta (the job's beta for term 0, 1 after), operands, partials' offset. */
const TERM_FIELDS = ["K", "S", "kc", "al", "be", "bA", "oA", "bB", "oB", "pO"] as const;
/** The reduce pass's job and term settings: F, E its first and past-last element of the grid, MN its outputs. */
const RJOB_FIELDS = ["F", "E", "MN", "nt", "bC", "oC", "ad", "bD", "oD"] as const;
const RTERM_FIELDS = ["S", "al", "be", "pO"] as const;
const F32_FIELDS = new Set(["al", "be"]);

/** The uniform's field of job j (and term t): `M0`, `K1_2`. */
export function mmField(name: string, j: number, t?: number): string {
  return t === undefined ? `${name}${j}` : `${name}${j}_${t}`;
}

function gemmParamList(jobs: number, terms: number, perTerm: readonly string[], perJob: readonly string[]): ParamList {
  const p: Record<string, ParamType> = { jobs: "u32" };
  for (let j = 0; j < jobs; j++) {
    for (const f of perJob) p[mmField(f, j)] = F32_FIELDS.has(f) ? "f32" : "u32";
    for (let t = 0; t < terms; t++) for (const f of perTerm) p[mmField(f, j, t)] = F32_FIELDS.has(f) ? "f32" : "u32";
  }
  return p;
}

/** WGSL: struct `name` of `fields` and fn `fnName(j[, t])` returning it from the uniform's fields by a switch. */
function fieldsFn(
  struct: string,
  fields: readonly string[],
  fnName: string,
  jobs: number,
  terms: number | null,
): string {
  const decl = `struct ${struct} { ${fields.map((f) => `${f}: ${F32_FIELDS.has(f) ? "f32" : "u32"}`).join(", ")} }`;
  const cases: string[] = [];
  for (let j = 0; j < jobs; j++)
    for (let t = 0; t < (terms ?? 1); t++) {
      const i = terms === null ? j : j * terms + t;
      const args = fields.map((f) => `p.${terms === null ? mmField(f, j) : mmField(f, j, t)}`).join(", ");
      cases.push(`    case ${i}u: { return ${struct}(${args}); }`);
    }
  const last = cases.pop()!.replace(/case \d+u:/, "default:");
  const sig = terms === null ? `${fnName}(j: u32)` : `${fnName}(j: u32, t: u32)`;
  const key = terms === null ? "j" : `j * ${terms}u + t`;
  return `${decl}
fn ${sig} -> ${struct} {
  switch ${key} {
${[...cases, last].join("\n")}
  }
}`;
}

/**
 * b0..b7 are read_write: each job's C is one of them, chosen by the uniform (st() writes any), so none is only read
 * by the shader; `part` holds a split product's partial sums (written by gemm, read by matmul_reduce).
 */
const MM_BINDINGS = [...Array.from({ length: MM_BUFFERS }, (_, i) => `b${i}:read_write`), "part:read_write"];

/** WGSL: the float operand i of binding b (one of b0..b7, chosen by a uniform index), read and written. */
const mmAccess = `
fn ld(b: u32, i: u32) -> f32 {
  switch b {
${Array.from({ length: MM_BUFFERS - 1 }, (_, i) => `    case ${i}u: { return b${i}[i]; }`).join("\n")}
    default: { return b${MM_BUFFERS - 1}[i]; }
  }
}
fn st(b: u32, i: u32, v: f32) {
  switch b {
${Array.from({ length: MM_BUFFERS - 1 }, (_, i) => `    case ${i}u: { b${i}[i] = v; }`).join("\n")}
    default: { b${MM_BUFFERS - 1}[i] = v; }
  }
}
// C = alpha acc + beta old, rounded as one matmul call rounds; beta 0 never reads old (a NaN there is ignored)
fn epi(al: f32, acc: f32, be: f32, b: u32, i: u32) -> f32 {
  var r = al * acc;
  if (be != 0.0) { r = r + be * ld(b, i); }
  return r;
}`;

/**
 * The matrix product, cblas_sgemm's row-major contract: each job's C = (add, or beta C) + sum of its terms
 * alpha op(A) op(B), term after term, rounded as separate matmul calls round (kernels.ts: matmuls). A workgroup
 * computes one TILE x TILE output tile of one job over its split's range of K, term after term: 8 x 8 threads,
 * each 8 x 8 outputs in registers, A and B staged through padded shared tiles of BK rows. A job of one split (sp 1)
 * finishes its tile there; a split job (sp > 1) writes each term's partial sums over its K range into `part`, and
 * matmul_reduce adds them in split order. Every output sums its k in order within a split: deterministic.
 * `tr` fixes the transposes at compile time (matmul_nn ...), else each term's come from the uniform (matmuls).
 */
function gemm(tr: Transposes, jobs: number, terms: number) {
  const termFields = tr ? TERM_FIELDS : (["tA", "tB", ...TERM_FIELDS] as const);
  const params = gemmParamList(jobs, terms, termFields, JOB_FIELDS);
  const loads = (TILE * BK) / (MT * MT);
  const c = (i: number, h: number) => `c${2 * i + h}`;
  const fma: string[] = [];
  for (let i = 0; i < TM; i++)
    for (let h = 0; h < 2; h++) fma.push(`${c(i, h)} = ${c(i, h)} + a${i >> 2}.${"xyzw"[i & 3]} * b${h};`);
  return shader(
    MM_BINDINGS,
    params,
    `
${fieldsFn("Job", JOB_FIELDS, "job", jobs, null)}
${fieldsFn("Term", termFields, "term", jobs, terms)}
${mmAccess}
fn put(jb: Job, tm: Term, t: u32, s: u32, m: u32, n: u32, acc: f32) {
  if (m >= jb.M || n >= jb.N) { return; }
  let e = m * jb.N + n;
  if (jb.sp > 1u) { part[tm.pO + s * jb.M * jb.N + e] = acc; return; }
  var b = jb.bC; var o = jb.oC + e;
  if (t == 0u && jb.ad == 1u) { b = jb.bD; o = jb.oD + e; }
  st(jb.bC, jb.oC + e, epi(tm.al, acc, tm.be, b, o));
}
// workgroup memory: each K step's loads write every element of As and Bs that the step reads (the 64 threads' loads
// cover the BK x TILE tiles, a zero past the shape; each row's padding vec4 is neither written nor read), then a
// barrier, then the reads; a barrier again before the next step's writes
var<workgroup> As: array<vec4<f32>, ${BK * ROW}>;
var<workgroup> Bs: array<vec4<f32>, ${BK * ROW}>;
@compute @workgroup_size(${MT}, ${MT})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(num_workgroups) nw: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let w = wg.x + wg.y * nw.x;
  var j = 0u;
  for (; j < p.jobs; j++) {
    let f = job(j);
    if (w >= f.F && w < f.F + f.T * f.sp) { break; }
  }
  if (j >= p.jobs) { return; }
  let jb = job(j);
  let local = w - jb.F;
  let tile = local % jb.T;
  let s = local / jb.T;
  let m0 = (tile / jb.X) * ${TILE}u;
  let n0 = (tile % jb.X) * ${TILE}u;
  let tx = lid.x; let ty = lid.y;
  let tid = ty * ${MT}u + tx;
  for (var t = 0u; t < jb.nt; t++) {
    let tm = term(j, t);
    if (s >= tm.S) { continue; }
    let TA = ${tr ? `${tr.tA}u` : "tm.tA"};
    let TB = ${tr ? `${tr.tB}u` : "tm.tB"};
    let k0 = s * tm.kc;
    let k1 = min(tm.K, k0 + tm.kc);
${Array.from({ length: 2 * TM }, (_, i) => `    var c${i} = vec4<f32>(0.0);`).join("\n")}
    for (var kb = k0; kb < k1; kb += ${BK}u) {
      for (var r = 0u; r < ${loads}u; r++) {
        let e = tid + r * ${MT * MT}u;
        var kk: u32; var mm: u32;
        if (TA == 1u) { mm = e % ${TILE}u; kk = e / ${TILE}u; } else { kk = e % ${BK}u; mm = e / ${BK}u; }
        let m = m0 + mm; let k = kb + kk;
        var v = 0.0;
        if (m < jb.M && k < k1) { v = ld(tm.bA, tm.oA + select(m * tm.K + k, k * jb.M + m, TA == 1u)); }
        As[kk * ${ROW}u + mm / 4u][mm % 4u] = v;
        var nn: u32; var kq: u32;
        if (TB == 1u) { kq = e % ${BK}u; nn = e / ${BK}u; } else { nn = e % ${TILE}u; kq = e / ${TILE}u; }
        let n = n0 + nn; let k2 = kb + kq;
        var u = 0.0;
        if (n < jb.N && k2 < k1) { u = ld(tm.bB, tm.oB + select(k2 * jb.N + n, n * tm.K + k2, TB == 1u)); }
        Bs[kq * ${ROW}u + nn / 4u][nn % 4u] = u;
      }
      workgroupBarrier();
      let kn = min(${BK}u, k1 - kb);
      for (var kk = 0u; kk < kn; kk++) {
        let a0 = As[kk * ${ROW}u + ty];
        let a1 = As[kk * ${ROW}u + ${MT}u + ty];
        let b0 = Bs[kk * ${ROW}u + tx];
        let b1 = Bs[kk * ${ROW}u + ${MT}u + tx];
${fma.map((l) => `        ${l}`).join("\n")}
      }
      workgroupBarrier();
    }
    // the 8 x 8 outputs in one rolled loop: one put site (64 inlined ones made llvmpipe's compile a minute long)
    var cs = array<vec4<f32>, ${2 * TM}>(${Array.from({ length: 2 * TM }, (_, i) => `c${i}`).join(", ")});
    for (var q = 0u; q < ${4 * 2 * TM}u; q++) {
      let i = q / 8u; // c(i, h) = cs[2 i + h], component q % 4
      let h = (q / 4u) % 2u;
      put(jb, tm, t, s, m0 + (i / 4u) * 32u + ty * 4u + i % 4u, n0 + h * 32u + tx * 4u + q % 4u, cs[2u * i + h][q % 4u]);
    }
  }
}`,
  );
}

/** A split job's outputs: each term's partials summed in split order, then alpha, beta or add, term after term. */
export const matmulReduce = shader(
  MM_BINDINGS,
  gemmParamList(MAX_JOBS, MAX_TERMS, RTERM_FIELDS, RJOB_FIELDS),
  `
${idx}
${fieldsFn("Job", RJOB_FIELDS, "job", MAX_JOBS, null)}
${fieldsFn("Term", RTERM_FIELDS, "term", MAX_JOBS, MAX_TERMS)}
${mmAccess}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let i = flat(g, nw);
  var j = 0u;
  for (; j < p.jobs; j++) {
    if (i < job(j).E) { break; }
  }
  if (j >= p.jobs) { return; }
  let jb = job(j);
  if (i < jb.F) { return; }
  let e = i - jb.F;
  for (var t = 0u; t < jb.nt; t++) {
    let tm = term(j, t);
    var acc = part[tm.pO + e];
    for (var s = 1u; s < tm.S; s++) { acc = acc + part[tm.pO + s * jb.MN + e]; }
    var b = jb.bC; var o = jb.oC + e;
    if (t == 0u && jb.ad == 1u) { b = jb.bD; o = jb.oD + e; }
    st(jb.bC, jb.oC + e, epi(tm.al, acc, tm.be, b, o));
  }
}`,
);

export const matmul_nn = gemm({ tA: 0, tB: 0 }, 1, 1);
export const matmul_nt = gemm({ tA: 0, tB: 1 }, 1, 1);
export const matmul_tn = gemm({ tA: 1, tB: 0 }, 1, 1);
export const matmul_tt = gemm({ tA: 1, tB: 1 }, 1, 1);
export const matmuls = gemm(null, MAX_JOBS, MAX_TERMS);
