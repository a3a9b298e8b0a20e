/**
 * The WGSL of the webgpu engine (webgpu.ts): one compute shader per kernel of the Kernels interface (kernels.ts).
 *
 * Every array is a read_write storage binding (WebGPU lets one buffer back several storage bindings of a
 * dispatch only when all of them are writable) of a range of a device mirror of a host array, with an element
 * offset (`o*`) into it in the shader's settings. Each shader declares its storage arrays and its settings by name
 * (shader()): the binding lines and the WGSL `struct P` are written from those lists, and the host passes the
 * settings as an object keyed by the same names (packParams), so no list of numbers has to match a field order.
 * float32 throughout. Deterministic by construction: no atomics, every sum runs in one fixed order (a thread's
 * own loop, or a workgroup's fixed tree), so the same inputs give the same bits on one device, run to run.
 * Elementwise kernels index a 1-D range over a 2-D grid (x * 256 per row of the grid; the host splits past 65535
 * workgroups); row kernels take one workgroup per row (rmsnormBackward one per block of rows). Column sums over
 * rows run in parallel blocks whose partials are summed in block order (rmsnormBackwardW), or per distinct token
 * (embeddingBackward), never one thread down all N rows. Attention is fused, FlashAttention-2's scheme as the native
 * engine's (native/ops/attention.c): tiles in workgroup memory, an online softmax, a backward that recomputes the
 * probabilities from the saved log-sum-exp; no buffer of T x T floats, each workgroup owning its outputs.
 */

/** Threads per workgroup of the elementwise and per-row kernels. */
export const WG = 256;
/** The matmul's output tile: TILE x TILE per workgroup of MT x MT threads, each 8 x 8 outputs (webgpu-wgsl's gemm). */
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

const idx = `fn flat(g: vec3u, n: vec3u) -> u32 { return g.x + g.y * n.x * ${WG}u; }`;
const row = `fn rowOf(w: vec3u, n: vec3u) -> u32 { return w.x + w.y * n.x; }`;

/** A shader setting's WGSL type: u32 (a size, a flag, an element offset) or f32 (a scale, eps, a value). */
export type ParamType = "u32" | "f32";
/** A shader's settings, by name, in the order of its WGSL `struct P`. */
export type ParamList = Readonly<Record<string, ParamType>>;
/** A dispatch's settings: one number per name of the shader's ParamList, no other. */
export type ParamValues<P extends ParamList = ParamList> = { readonly [K in keyof P]: number };

/** One compute shader: its storage arrays, its settings by name, and its WGSL, whose `struct P` is made from `params`. */
export interface Shader<P extends ParamList = ParamList> {
  /** Binding i is storage array bindings[i]: "name" (f32) or "name:type". */
  readonly bindings: readonly string[];
  /** The uniform `p` (binding bindings.length): struct P's fields, in this order, each 4 bytes. */
  readonly params: P;
  readonly code: string;
}

/**
 * A shader from its storage arrays, its settings and the rest of its WGSL: the binding lines and `struct P` are
 * written here from the two lists, so a setting's place in the uniform is its place in `params`, which
 * packParams reads too. Names are WGSL identifiers (never integer-like, so an object keeps their order).
 */
function shader<const P extends ParamList>(bindings: readonly string[], params: P, body: string): Shader<P> {
  const names = Object.keys(params);
  for (const n of [...names, ...bindings.map((b) => b.split(":")[0])])
    if (!/^[A-Za-z_]\w*$/.test(n)) throw new Error(`webgpu: ${JSON.stringify(n)} is no WGSL identifier`);
  const storage = bindings.map((b, i) => {
    const [name, type = "f32"] = b.split(":");
    return `@group(0) @binding(${i}) var<storage, read_write> ${name}: array<${type}>;`;
  });
  const struct = `struct P { ${names.map((n) => `${n}: ${params[n]}`).join(", ")} }`;
  const uniform = `@group(0) @binding(${bindings.length}) var<uniform> p: P;`;
  return { bindings, params, code: `${storage.join("\n")}\n${struct}\n${uniform}\n${body}` };
}

/**
 * The uniform buffer of one dispatch of `name`: each setting at 4 bytes times its place in the shader's params
 * (u32 or f32 as declared), the size rounded up to 16. Throws on a name the shader lacks, a name it has that
 * `values` lacks, and a u32 that is not an integer in [0, 2^32).
 */
export function packParams(name: string, s: Shader, values: Readonly<Record<string, number>>): ArrayBuffer {
  const names = Object.keys(s.params);
  const extra = Object.keys(values).filter((n) => !Object.hasOwn(s.params, n));
  const missing = names.filter((n) => !Object.hasOwn(values, n));
  if (extra.length || missing.length)
    throw new Error(
      `webgpu: ${name} takes settings ${names.join(", ")}; ${[missing.length ? `missing ${missing.join(", ")}` : "", extra.length ? `unknown ${extra.join(", ")}` : ""].filter((x) => x).join("; ")}`,
    );
  const raw = new ArrayBuffer(Math.max(16, Math.ceil((names.length * 4) / 16) * 16));
  const u32 = new Uint32Array(raw),
    f32 = new Float32Array(raw);
  names.forEach((n, i) => {
    const v = values[n];
    if (typeof v !== "number") throw new TypeError(`webgpu: ${name} setting ${n} = ${String(v)} is no number`);
    if (s.params[n] === "f32") f32[i] = v;
    else if (!Number.isInteger(v) || v < 0 || v > 0xffffffff)
      throw new RangeError(`webgpu: ${name} setting ${n} = ${v} is no u32`);
    else u32[i] = v;
  });
  return raw;
}

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

const MM_BINDINGS = [...Array.from({ length: MM_BUFFERS }, (_, i) => `b${i}`), "part"];

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
 * computes one TILE x TILE output tile of one job's term over a range of K: 8 x 8 threads, each 8 x 8 outputs in
 * registers, A and B staged through padded shared tiles of BK rows. A job of one split (sp 1) finishes its tile
 * there, term after term; a split job (sp > 1) writes each term's partial sums over its K range into `part`, and
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
  const put: string[] = [];
  for (let i = 0; i < TM; i++)
    for (let h = 0; h < 2; h++)
      for (let q = 0; q < 4; q++)
        put.push(
          `put(jb, tm, t, s, m0 + ${i < 4 ? "" : "32u + "}ty * 4u + ${i & 3}u, n0 + ${h ? "32u + " : ""}tx * 4u + ${q}u, ${c(i, h)}.${"xyzw"[q]});`,
        );
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
${put.map((l) => `    ${l}`).join("\n")}
  }
}`,
  );
}

/** A split job's outputs: each term's partials summed in split order, then alpha, beta or add, term after term. */
const matmulReduce = shader(
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

const matmul_nn = gemm({ tA: 0, tB: 0 }, 1, 1);
const matmul_nt = gemm({ tA: 0, tB: 1 }, 1, 1);
const matmul_tn = gemm({ tA: 1, tB: 0 }, 1, 1);
const matmul_tt = gemm({ tA: 1, tB: 1 }, 1, 1);
const matmuls = gemm(null, MAX_JOBS, MAX_TERMS);

const embeddingForward = shader(
  ["out", "ids:i32", "E"],
  { n: "u32", D: "u32", oO: "u32", oI: "u32", oE: "u32" },
  `
${idx}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let i = flat(g, nw);
  if (i >= p.n) { return; }
  let t = i / p.D; let d = i % p.D;
  out[p.oO + i] = E[p.oE + u32(ids[p.oI + t]) * p.D + d];
}`,
);

/**
 * dE[ids[n], :] += dout[n, :] from the host's occurrence lists (webgpu.ts builds them from ids, CSR): csr holds the
 * U distinct tokens, then U+1 starts, then every row n grouped by token, in n order within a token. One thread per
 * (distinct token, column): it adds that token's rows in n order onto dE's value, one f32 rounding per add, the
 * reference's exact operations (js.ts). No two threads write one element: no atomics.
 */
const embeddingBackward = shader(
  ["dE", "csr:i32", "dout"],
  { n: "u32", U: "u32", D: "u32", oE: "u32", oC: "u32", oD: "u32" },
  `
${idx}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let i = flat(g, nw);
  if (i >= p.n) { return; }
  let u = i / p.D; let d = i % p.D;
  let at = p.oE + u32(csr[p.oC + u]) * p.D + d;
  let s0 = u32(csr[p.oC + p.U + u]);
  let s1 = u32(csr[p.oC + p.U + u + 1u]);
  let rows = p.oC + 2u * p.U + 1u;
  var acc = dE[at];
  for (var j = s0; j < s1; j++) { acc = acc + dout[p.oD + u32(csr[rows + j]) * p.D + d]; }
  dE[at] = acc;
}`,
);

/** A workgroup's fixed-order tree sum of red[0..WG) into red[0] (every thread calls it: it holds barriers). */
const treeSum = `
var<workgroup> red: array<f32, ${WG}>;
fn treeSum(l: u32) {
  for (var s = ${WG / 2}u; s > 0u; s = s >> 1u) {
    workgroupBarrier();
    if (l < s) { red[l] = red[l] + red[l + s]; }
  }
  workgroupBarrier();
}
fn treeMax(l: u32) {
  for (var s = ${WG / 2}u; s > 0u; s = s >> 1u) {
    workgroupBarrier();
    if (l < s) { red[l] = max(red[l], red[l + s]); }
  }
  workgroupBarrier();
}`;

const rmsnormForward = shader(
  ["out", "rstd", "x", "w"],
  { N: "u32", D: "u32", oO: "u32", oR: "u32", oX: "u32", oW: "u32", eps: "f32" },
  `
${row}
${treeSum}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(num_workgroups) nw: vec3u, @builtin(local_invocation_index) l: u32) {
  let n = rowOf(wg, nw);
  let live = n < p.N;
  let o = n * p.D;
  var ss = 0.0;
  if (live) { for (var d = l; d < p.D; d += ${WG}u) { let v = x[p.oX + o + d]; ss = ss + v * v; } }
  red[l] = ss;
  treeSum(l);
  let r = 1.0 / sqrt(red[0] / f32(p.D) + p.eps);
  if (!live) { return; }
  if (l == 0u) { rstd[p.oR + n] = r; }
  for (var d = l; d < p.D; d += ${WG}u) { out[p.oO + o + d] = x[p.oX + o + d] * r * w[p.oW + d]; }
}`,
);

/**
 * The rows of a block of rmsnormBackward: the rows of one workgroup, whose dw terms it sums into one partial.
 * ceil(N / RMS_BLOCKS) rows, so at most RMS_BLOCKS partials of D floats a call.
 */
export const RMS_BLOCKS = 512;
export function rmsnormRows(N: number): number {
  return Math.max(1, Math.ceil(N / RMS_BLOCKS));
}

/**
 * One workgroup per block of R rows (the last may hold fewer), the rows in order: dx += rstd * (dout*w - xhat *
 * mean(dout*w*xhat)), the mean by the fixed tree; then, one thread per column d, part[oP + block*D + d] = the sum
 * over the block's rows in n order of dout[n,d] * (x[n,d] * rstd[n]). rmsnormBackwardW adds the partials to dw.
 */
const rmsnormBackward = shader(
  ["dx", "part", "dout", "x", "w", "rstd"],
  { N: "u32", D: "u32", R: "u32", oDX: "u32", oP: "u32", oDO: "u32", oX: "u32", oW: "u32", oR: "u32" },
  `
${row}
${treeSum}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(num_workgroups) nw: vec3u, @builtin(local_invocation_index) l: u32) {
  let blk = rowOf(wg, nw);
  let n0 = blk * p.R;
  let n1 = min(n0 + p.R, p.N);
  for (var n = n0; n < n1; n++) {
    let o = n * p.D;
    let r = rstd[p.oR + n];
    var dot = 0.0;
    for (var d = l; d < p.D; d += ${WG}u) { dot = dot + dout[p.oDO + o + d] * w[p.oW + d] * (x[p.oX + o + d] * r); }
    red[l] = dot;
    treeSum(l);
    let mean = red[0] / f32(p.D);
    workgroupBarrier(); // every thread has read red[0] before the next row writes red
    for (var d = l; d < p.D; d += ${WG}u) {
      let at = p.oDX + o + d;
      dx[at] = dx[at] + r * (dout[p.oDO + o + d] * w[p.oW + d] - x[p.oX + o + d] * r * mean);
    }
  }
  if (n0 >= p.N) { return; }
  for (var d = l; d < p.D; d += ${WG}u) {
    var acc = 0.0;
    for (var n = n0; n < n1; n++) { acc = acc + dout[p.oDO + n * p.D + d] * (x[p.oX + n * p.D + d] * rstd[p.oR + n]); }
    part[p.oP + blk * p.D + d] = acc;
  }
}`,
);

/**
 * dw += the column sums of rmsnormBackward's partials, for S calls at once (webgpu.ts defers them to one dispatch):
 * set s = workgroup row y, its 4 words of `sets` at oT + 4s: dw's element in this binding, its partials' element
 * in `part`, their count nb, and D. One thread per (set, column d) adds the nb partials in block order, then that
 * sum to dw[d] (the reference adds its column sum to dw last, too).
 */
const rmsnormBackwardW = shader(
  ["dw", "part", "sets:u32"],
  { S: "u32", oT: "u32" },
  `
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) l: u32) {
  let s = wg.y;
  if (s >= p.S) { return; }
  let t = p.oT + 4u * s;
  let D = sets[t + 3u];
  let d = wg.x * ${WG}u + l;
  if (d >= D) { return; }
  let nb = sets[t + 2u];
  let o = sets[t + 1u] + d;
  var acc = 0.0;
  for (var b = 0u; b < nb; b++) { acc = acc + part[o + b * D]; }
  let at = sets[t] + d;
  dw[at] = dw[at] + acc;
}`,
);

/** One thread per rotated pair (b, t, head, i < E/2); sign -1 is the backward (the rotation by -angle). */
const rope = shader(
  ["x", "cs", "sn"],
  { n: "u32", T: "u32", nh: "u32", h: "u32", oX: "u32", oC: "u32", oS: "u32", sign: "f32" },
  `
${idx}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let id = flat(g, nw);
  if (id >= p.n) { return; }
  let i = id % p.h;
  let bt = id / (p.h * p.nh);
  let t = bt % p.T;
  let o = p.oX + (id / p.h) * 2u * p.h;
  let c = cs[p.oC + t * p.h + i];
  let s = p.sign * sn[p.oS + t * p.h + i];
  let a = x[o + i];
  let z = x[o + i + p.h];
  x[o + i] = a * c - z * s;
  x[o + i + p.h] = z * c + a * s;
}`,
);

/** Fused attention's tiles (FlashAttention-2's scheme, native/ops/attention.c's design): the query rows of a workgroup. */
export const ATT_BQ = 16;
/** Keys per tile of the forward; rows per tile of the backward's inner loop (the other side's rows). */
const ATT_BK = 16;
const ATT_BT = 8;
/** Threads per row: each holds every ATT_TPR-th element of the row's head vector (e = c + ATT_TPR * i). */
const ATT_TPR = 4;
/** The largest head size the fused attention takes (its tiles in workgroup memory are sized for it). */
export const ATT_EMAX = 128;
const ATT_NE = ATT_EMAX / ATT_TPR;
const ATT_WG = ATT_BQ * ATT_TPR;
// workgroup memory: the forward's tile and partial dot products, the backward's two tiles, partials and row values
const ATT_BYTES =
  4 *
  Math.max(
    ATT_BK * ATT_EMAX + ATT_BQ * ATT_BK * ATT_TPR,
    2 * ATT_BT * ATT_EMAX + 2 * ATT_BQ * ATT_BT * ATT_TPR + 2 * ATT_BT,
  );
if (ATT_WG > 256 || ATT_BYTES > 16384)
  throw new Error(`webgpu: attention's tiles need ${ATT_WG} threads, ${ATT_BYTES} B`);

/** A row's total of its ATT_TPR threads' partial dot products at part[o..o+TPR), in thread order. */
const attTotal = `
fn total(o: u32) -> f32 { return ((part[o] + part[o + 1u]) + part[o + 2u]) + part[o + 3u]; }`;

/**
 * rope on q [B,T,H,E] and k [B,T,K,E] in one dispatch, the same operations per pair: threads [0, nq) rotate q's
 * pairs, [nq, nq + nk) k's.
 */
const ropeQK = shader(
  ["q", "k", "cs", "sn"],
  {
    nq: "u32",
    nk: "u32",
    T: "u32",
    H: "u32",
    K: "u32",
    h: "u32",
    oQ: "u32",
    oK: "u32",
    oC: "u32",
    oS: "u32",
    sign: "f32",
  },
  `
${idx}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let at = flat(g, nw);
  if (at >= p.nq + p.nk) { return; }
  let isK = at >= p.nq;
  let id = select(at, at - p.nq, isK);
  let nh = select(p.H, p.K, isK);
  let i = id % p.h;
  let t = (id / (p.h * nh)) % p.T;
  let o = (id / p.h) * 2u * p.h + i;
  let c = cs[p.oC + t * p.h + i];
  let s = p.sign * sn[p.oS + t * p.h + i];
  if (isK) {
    let a = k[p.oK + o];
    let z = k[p.oK + o + p.h];
    k[p.oK + o] = a * c - z * s;
    k[p.oK + o + p.h] = z * c + a * s;
  } else {
    let a = q[p.oQ + o];
    let z = q[p.oQ + o + p.h];
    q[p.oQ + o] = a * c - z * s;
    q[p.oQ + o + p.h] = z * c + a * s;
  }
}`,
);

/**
 * The fused causal forward, shared by the training forward and the cached forward so that both run the same
 * operations. A workgroup owns ATT_BQ query rows of one (sequence, head); ATT_TPR threads per row, each holding
 * its slice of q and of the output accumulator. Key tiles of ATT_BK rows, from key 0 to the block's last visible
 * key, go through workgroup memory (K, then V in the same place); each thread's partial dot products meet in
 * `part` and every thread of a row sums them in the same order, so the row's threads agree on the scores. The
 * online softmax keeps a running max m and sum l (both rescaled by exp(m_old - m_new) when m grows); a key past
 * the row's position (u > P + t) adds nothing. The output is acc / l; the row's log-sum-exp is m + log(l).
 * `at` names: b (the sequence), P (the keys before query row 0), QR(t) (q's row index), KR(u) (the cache's).
 */
function flashForward(at: { b: string; P: string; QR: string; KR: string }, lse: string): string {
  return `
var<workgroup> kv: array<f32, ${ATT_BK * ATT_EMAX}>;
var<workgroup> part: array<f32, ${ATT_BQ * ATT_BK * ATT_TPR}>;
${attTotal}
@compute @workgroup_size(${ATT_WG})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) l: u32) {
  let r = l / ${ATT_TPR}u;
  let c = l % ${ATT_TPR}u;
  let ne = (p.E + ${ATT_TPR - 1}u) / ${ATT_TPR}u;
  let q0 = wg.x * ${ATT_BQ}u;
  let h = wg.y % p.H;
  let b = ${at.b};
  let j = (h * p.K) / p.H;
  let t = q0 + r;
  let live = t < p.T;
  let last = ${at.P} + t;
  let qo = p.oQ + (${at.QR}) * p.E;
  var qr: array<f32, ${ATT_NE}>;
  var acc: array<f32, ${ATT_NE}>;
  for (var i = 0u; i < ne; i++) {
    let e = c + ${ATT_TPR}u * i;
    qr[i] = 0.0;
    acc[i] = 0.0;
    if (live && e < p.E) { qr[i] = q[qo + e]; }
  }
  var m = -0x1.fffffep+127f;
  var lsum = 0.0;
  let nkeys = min(${at.P} + q0 + ${ATT_BQ}u, ${at.P} + p.T);
  for (var u0 = 0u; u0 < nkeys; u0 += ${ATT_BK}u) {
    let n = min(${ATT_BK}u, nkeys - u0) * p.E;
    for (var x = l; x < ${ATT_BK}u * p.E; x += ${ATT_WG}u) {
      kv[x] = 0.0;
      if (x < n) { let u = u0 + x / p.E; kv[x] = k[p.oK + (${at.KR}) * p.E + x % p.E]; }
    }
    workgroupBarrier();
    for (var u = 0u; u < ${ATT_BK}u; u++) {
      var s = 0.0;
      for (var i = 0u; i < ne; i++) {
        let e = c + ${ATT_TPR}u * i;
        if (e < p.E) { s = s + qr[i] * kv[u * p.E + e]; }
      }
      part[(r * ${ATT_BK}u + u) * ${ATT_TPR}u + c] = s;
    }
    workgroupBarrier();
    for (var x = l; x < ${ATT_BK}u * p.E; x += ${ATT_WG}u) {
      kv[x] = 0.0;
      if (x < n) { let u = u0 + x / p.E; kv[x] = v[p.oV + (${at.KR}) * p.E + x % p.E]; }
    }
    workgroupBarrier();
    var sc: array<f32, ${ATT_BK}>;
    var mx = m;
    for (var u = 0u; u < ${ATT_BK}u; u++) {
      sc[u] = total((r * ${ATT_BK}u + u) * ${ATT_TPR}u) * p.scale;
      if (u0 + u <= last) { mx = max(mx, sc[u]); }
    }
    let alpha = exp(m - mx);
    lsum = lsum * alpha;
    for (var i = 0u; i < ne; i++) { acc[i] = acc[i] * alpha; }
    for (var u = 0u; u < ${ATT_BK}u; u++) {
      if (u0 + u <= last) {
        let pu = exp(sc[u] - mx);
        lsum = lsum + pu;
        for (var i = 0u; i < ne; i++) {
          let e = c + ${ATT_TPR}u * i;
          if (e < p.E) { acc[i] = acc[i] + pu * kv[u * p.E + e]; }
        }
      }
    }
    m = mx;
    workgroupBarrier();
  }
  if (!live) { return; }
  let oo = p.oO + (${at.QR}) * p.E;
  for (var i = 0u; i < ne; i++) {
    let e = c + ${ATT_TPR}u * i;
    if (e < p.E) { out[oo + e] = acc[i] / lsum; }
  }
  ${lse ? `if (c == 0u) { ${lse} = m + log(lsum); }` : ""}
}`;
}

/**
 * Training forward, out [B,T,H,E] and lse [B,H,T]: a workgroup per ATT_BQ query rows of one (b, h), the grid
 * [ceil(T / ATT_BQ), B * H].
 */
const attentionForward = shader(
  ["out", "lse", "q", "k", "v"],
  { T: "u32", H: "u32", K: "u32", E: "u32", oO: "u32", oL: "u32", oQ: "u32", oK: "u32", oV: "u32", scale: "f32" },
  flashForward(
    { b: "wg.y / p.H", P: "0u", QR: "(b * p.T + t) * p.H + h", KR: "(b * p.T + u) * p.K + j" },
    "lse[p.oL + (b * p.H + h) * p.T + t]",
  ),
);

/**
 * Cached forward (generation): new position t of T, absolute P + t, against cache rows u <= P + t; q and out
 * [T,H,E], the cache [rows,K,E]. A workgroup per ATT_BQ new rows of one head, the grid [ceil(T / ATT_BQ), H].
 */
const attentionCachedForward = shader(
  ["out", "q", "k", "v"],
  { P: "u32", T: "u32", H: "u32", K: "u32", E: "u32", oO: "u32", oQ: "u32", oK: "u32", oV: "u32", scale: "f32" },
  flashForward({ b: "0u", P: "p.P", QR: "t * p.H + h", KR: "u * p.K + j" }, ""),
);

/**
 * The fused backward in one dispatch, P recomputed from the forward's lse (P = exp(S - lse)), nothing of size
 * T x T anywhere; D_t = dout[t] . out[t] is recomputed where it is needed. Two kinds of workgroup, by index:
 *  - the first B * K * ceil(T / ATT_BQ) own ATT_BQ key rows of one kv head j of one sequence b: each thread holds
 *    its slices of k[u], v[u], dk[u] and dv[u]; the query heads h of j's group (h*K/H = j), in h order, and for
 *    each their query rows t >= the block's first key, in tiles of ATT_BT rows of q and dout through workgroup
 *    memory: dv[u] += P[t,u] dout[t], dk[u] += dS[t,u] q[t], dS = P (dout[t] . v[u] - D_t) scale;
 *  - the rest own ATT_BQ query rows of one (b, h): their slices of q[t], dout[t] and dq[t]; key tiles of ATT_BT
 *    rows of k and v up to the block's last query: dq[t] += dS[t,u] k[u].
 * Every output is written once by its owner (overwritten), summed in that fixed order: no atomics. The grid is a
 * 1-D range of workgroups over [x, y].
 */
const attentionBackward = shader(
  ["dq", "dk", "dv", "dout", "q", "k", "v", "out", "lse"],
  {
    B: "u32",
    T: "u32",
    H: "u32",
    K: "u32",
    E: "u32",
    oDQ: "u32",
    oDK: "u32",
    oDV: "u32",
    oDO: "u32",
    oQ: "u32",
    oK: "u32",
    oV: "u32",
    oO: "u32",
    oL: "u32",
    scale: "f32",
  },
  `
var<workgroup> X: array<f32, ${ATT_BT * ATT_EMAX}>;
var<workgroup> Y: array<f32, ${ATT_BT * ATT_EMAX}>;
var<workgroup> part: array<f32, ${ATT_BQ * ATT_BT * ATT_TPR}>;
var<workgroup> pd: array<f32, ${ATT_BQ * ATT_BT * ATT_TPR}>;
var<workgroup> rowL: array<f32, ${ATT_BT}>;
var<workgroup> rowD: array<f32, ${ATT_BT}>;
${attTotal}
fn totalD(o: u32) -> f32 { return ((pd[o] + pd[o + 1u]) + pd[o + 2u]) + pd[o + 3u]; }
@compute @workgroup_size(${ATT_WG})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(num_workgroups) nw: vec3u, @builtin(local_invocation_index) l: u32) {
  let g = wg.x + wg.y * nw.x;
  let nb = (p.T + ${ATT_BQ - 1}u) / ${ATT_BQ}u;
  let nkv = p.B * p.K * nb;
  if (g >= nkv + p.B * p.H * nb) { return; }
  let r = l / ${ATT_TPR}u;
  let c = l % ${ATT_TPR}u;
  let ne = (p.E + ${ATT_TPR - 1}u) / ${ATT_TPR}u;
  if (g < nkv) {
    // ---- dk, dv of ATT_BQ keys of kv head j
    let k0 = (g % nb) * ${ATT_BQ}u;
    let j = (g / nb) % p.K;
    let b = g / (nb * p.K);
    let u = k0 + r;
    let live = u < p.T;
    let ko = ((b * p.T + u) * p.K + j) * p.E;
    var kr: array<f32, ${ATT_NE}>;
    var vr: array<f32, ${ATT_NE}>;
    var ak: array<f32, ${ATT_NE}>;
    var av: array<f32, ${ATT_NE}>;
    for (var i = 0u; i < ne; i++) {
      let e = c + ${ATT_TPR}u * i;
      kr[i] = 0.0;
      vr[i] = 0.0;
      ak[i] = 0.0;
      av[i] = 0.0;
      if (live && e < p.E) { kr[i] = k[p.oK + ko + e]; vr[i] = v[p.oV + ko + e]; }
    }
    for (var h = 0u; h < p.H; h++) {
      if ((h * p.K) / p.H != j) { continue; }
      for (var t0 = k0; t0 < p.T; t0 += ${ATT_BT}u) {
        let n = min(${ATT_BT}u, p.T - t0) * p.E;
        for (var x = l; x < ${ATT_BT}u * p.E; x += ${ATT_WG}u) {
          X[x] = 0.0;
          Y[x] = 0.0;
          if (x < n) {
            let qo = ((b * p.T + t0 + x / p.E) * p.H + h) * p.E + x % p.E;
            X[x] = q[p.oQ + qo];
            Y[x] = dout[p.oDO + qo];
          }
        }
        workgroupBarrier();
        if (l < ${ATT_BT}u) {
          var dd = 0.0;
          var lx = 0.0;
          if (t0 + l < p.T) {
            let qo = ((b * p.T + t0 + l) * p.H + h) * p.E;
            for (var e = 0u; e < p.E; e++) { dd = dd + dout[p.oDO + qo + e] * out[p.oO + qo + e]; }
            lx = lse[p.oL + (b * p.H + h) * p.T + t0 + l];
          }
          rowD[l] = dd;
          rowL[l] = lx;
        }
        for (var t = 0u; t < ${ATT_BT}u; t++) {
          var s = 0.0;
          var dp = 0.0;
          for (var i = 0u; i < ne; i++) {
            let e = c + ${ATT_TPR}u * i;
            if (e < p.E) { s = s + kr[i] * X[t * p.E + e]; dp = dp + vr[i] * Y[t * p.E + e]; }
          }
          let o = (r * ${ATT_BT}u + t) * ${ATT_TPR}u + c;
          part[o] = s;
          pd[o] = dp;
        }
        workgroupBarrier();
        for (var t = 0u; t < ${ATT_BT}u; t++) {
          if (t0 + t < p.T && u <= t0 + t) {
            let o = (r * ${ATT_BT}u + t) * ${ATT_TPR}u;
            let pr = exp(total(o) * p.scale - rowL[t]);
            let ds = pr * (totalD(o) - rowD[t]) * p.scale;
            for (var i = 0u; i < ne; i++) {
              let e = c + ${ATT_TPR}u * i;
              if (e < p.E) { av[i] = av[i] + pr * Y[t * p.E + e]; ak[i] = ak[i] + ds * X[t * p.E + e]; }
            }
          }
        }
        workgroupBarrier();
      }
    }
    if (!live) { return; }
    for (var i = 0u; i < ne; i++) {
      let e = c + ${ATT_TPR}u * i;
      if (e < p.E) { dk[p.oDK + ko + e] = ak[i]; dv[p.oDV + ko + e] = av[i]; }
    }
  } else {
    // ---- dq of ATT_BQ query rows of (b, h)
    let gq = g - nkv;
    let q0 = (gq % nb) * ${ATT_BQ}u;
    let h = (gq / nb) % p.H;
    let b = gq / (nb * p.H);
    let j = (h * p.K) / p.H;
    let t = q0 + r;
    let live = t < p.T;
    let qo = ((b * p.T + t) * p.H + h) * p.E;
    var qr: array<f32, ${ATT_NE}>;
    var gr: array<f32, ${ATT_NE}>;
    var aq: array<f32, ${ATT_NE}>;
    var dd = 0.0;
    var lx = 0.0;
    for (var i = 0u; i < ne; i++) {
      let e = c + ${ATT_TPR}u * i;
      qr[i] = 0.0;
      gr[i] = 0.0;
      aq[i] = 0.0;
      if (live && e < p.E) { qr[i] = q[p.oQ + qo + e]; gr[i] = dout[p.oDO + qo + e]; }
    }
    if (live) {
      for (var e = 0u; e < p.E; e++) { dd = dd + dout[p.oDO + qo + e] * out[p.oO + qo + e]; }
      lx = lse[p.oL + (b * p.H + h) * p.T + t];
    }
    let nkeys = min(q0 + ${ATT_BQ}u, p.T);
    for (var u0 = 0u; u0 < nkeys; u0 += ${ATT_BT}u) {
      let n = min(${ATT_BT}u, nkeys - u0) * p.E;
      for (var x = l; x < ${ATT_BT}u * p.E; x += ${ATT_WG}u) {
        X[x] = 0.0;
        Y[x] = 0.0;
        if (x < n) {
          let ko = ((b * p.T + u0 + x / p.E) * p.K + j) * p.E + x % p.E;
          X[x] = k[p.oK + ko];
          Y[x] = v[p.oV + ko];
        }
      }
      workgroupBarrier();
      for (var u = 0u; u < ${ATT_BT}u; u++) {
        var s = 0.0;
        var dp = 0.0;
        for (var i = 0u; i < ne; i++) {
          let e = c + ${ATT_TPR}u * i;
          if (e < p.E) { s = s + qr[i] * X[u * p.E + e]; dp = dp + gr[i] * Y[u * p.E + e]; }
        }
        let o = (r * ${ATT_BT}u + u) * ${ATT_TPR}u + c;
        part[o] = s;
        pd[o] = dp;
      }
      workgroupBarrier();
      for (var u = 0u; u < ${ATT_BT}u; u++) {
        if (u0 + u <= t) {
          let o = (r * ${ATT_BT}u + u) * ${ATT_TPR}u;
          let ds = exp(total(o) * p.scale - lx) * (totalD(o) - dd) * p.scale;
          for (var i = 0u; i < ne; i++) {
            let e = c + ${ATT_TPR}u * i;
            if (e < p.E) { aq[i] = aq[i] + ds * X[u * p.E + e]; }
          }
        }
      }
      workgroupBarrier();
    }
    if (!live) { return; }
    for (var i = 0u; i < ne; i++) {
      let e = c + ${ATT_TPR}u * i;
      if (e < p.E) { dq[p.oDQ + qo + e] = aq[i]; }
    }
  }
}`,
);

const swigluForward = shader(
  ["out", "gate", "up"],
  { n: "u32", oO: "u32", oG: "u32", oU: "u32" },
  `
${idx}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let i = flat(g, nw);
  if (i >= p.n) { return; }
  let x = gate[p.oG + i];
  out[p.oO + i] = (x / (1.0 + exp(-x))) * up[p.oU + i];
}`,
);

const swigluBackward = shader(
  ["dgate", "dup", "dout", "gate", "up"],
  { n: "u32", oDG: "u32", oDU: "u32", oDO: "u32", oG: "u32", oU: "u32" },
  `
${idx}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let i = flat(g, nw);
  if (i >= p.n) { return; }
  let x = gate[p.oG + i];
  let sg = 1.0 / (1.0 + exp(-x));
  let d = dout[p.oDO + i];
  dup[p.oDU + i] = d * x * sg;
  dgate[p.oDG + i] = d * up[p.oU + i] * sg * (1.0 + x * (1.0 - sg));
}`,
);

/**
 * One workgroup per row: max and sum of exp by fixed trees, the row's loss (logsumexp - row[target], 0 for
 * target -1) into loss[row], and with gs > 0 the row overwritten by (softmax - onehot) * gs (zeros for target -1).
 */
const crossEntropy = shader(
  ["x", "tg:i32", "loss"],
  { rows: "u32", V: "u32", oX: "u32", oT: "u32", oL: "u32", gs: "f32" },
  `
${row}
${treeSum}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(num_workgroups) nw: vec3u, @builtin(local_invocation_index) l: u32) {
  let r = rowOf(wg, nw);
  let live = r < p.rows;
  var y = -1;
  if (live) { y = tg[p.oT + r]; }
  let o = p.oX + r * p.V;
  var xy = 0.0;
  var mx = -0x1.fffffep+127f;
  if (live) {
    if (y >= 0) { xy = x[o + u32(y)]; }
    for (var i = l; i < p.V; i += ${WG}u) { mx = max(mx, x[o + i]); }
  }
  red[l] = mx;
  treeMax(l);
  let m = red[0];
  workgroupBarrier();
  var s = 0.0;
  if (live) { for (var i = l; i < p.V; i += ${WG}u) { s = s + exp(x[o + i] - m); } }
  red[l] = s;
  treeSum(l);
  let sum = red[0];
  if (!live) { return; }
  if (l == 0u) { loss[p.oL + r] = select(0.0, m + log(sum) - xy, y >= 0); }
  if (p.gs > 0.0) {
    let inv = 1.0 / sum;
    for (var i = l; i < p.V; i += ${WG}u) {
      var gv = 0.0;
      if (y >= 0) { gv = exp(x[o + i] - m) * inv * p.gs; if (i == u32(y)) { gv = (exp(xy - m) * inv - 1.0) * p.gs; } }
      x[o + i] = gv;
    }
  }
}`,
);

const copy = shader(
  ["dst", "src"],
  { n: "u32", oD: "u32", oS: "u32" },
  `
${idx}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let i = flat(g, nw);
  if (i >= p.n) { return; }
  dst[p.oD + i] = src[p.oS + i];
}`,
);

const fill = shader(
  ["dst"],
  { n: "u32", oD: "u32", value: "f32" },
  `
${idx}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
  let i = flat(g, nw);
  if (i >= p.n) { return; }
  dst[p.oD + i] = p.value;
}`,
);

/** Every shader by name; each has one entry point, `main`. */
export const SHADERS = {
  matmul_nn,
  matmul_nt,
  matmul_tn,
  matmul_tt,
  matmuls,
  matmul_reduce: matmulReduce,
  embeddingForward,
  embeddingBackward,
  rmsnormForward,
  rmsnormBackward,
  rmsnormBackwardW,
  rope,
  ropeQK,
  attentionForward,
  attentionCachedForward,
  attentionBackward,
  swigluForward,
  swigluBackward,
  crossEntropy,
  copy,
  fill,
} as const;

export type ShaderName = keyof typeof SHADERS;
/** The settings a dispatch of shader N takes, by name. */
export type ParamsOf<N extends ShaderName> = ParamValues<(typeof SHADERS)[N]["params"]>;
