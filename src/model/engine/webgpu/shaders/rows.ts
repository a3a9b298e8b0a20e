/**
 * The row and elementwise kernels' WGSL (framework.ts): embedding, RMSNorm (its weight gradient deferred to
 * rmsnormBackwardW), RoPE (one array, or q and k at once), SwiGLU, cross-entropy, copy and fill.
 */
import { idx, row, shader, WG } from "./framework";

export const embeddingForward = shader(
  ["out:read_write", "ids:read:i32", "E:read"],
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
 * dE[ids[n], :] += dout[n, :] from the host's occurrence lists (engine.ts builds them from ids, CSR): csr holds the
 * U distinct tokens, then U+1 starts, then every row n grouped by token, in n order within a token. One thread per
 * (distinct token, column): it adds that token's rows in n order onto dE's value, one f32 rounding per add, the
 * reference's exact operations (js.ts). No two threads write one element: no atomics.
 */
export const embeddingBackward = shader(
  ["dE:read_write", "csr:read:i32", "dout:read"],
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

/**
 * A workgroup's fixed-order tree sum of red[0..WG) into red[0] (every thread calls it: it holds barriers). Workgroup
 * memory: each of the WG threads writes its own red[l] before calling it, and the tree reads red[] only after a
 * barrier, so no element is read before it is written (no zeroing needed).
 */
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

export const rmsnormForward = shader(
  ["out:read_write", "rstd:read_write", "x:read", "w:read"],
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
export const rmsnormBackward = shader(
  ["dx:read_write", "part:read_write", "dout:read", "x:read", "w:read", "rstd:read"],
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
 * dw += the column sums of rmsnormBackward's partials, for S calls at once (engine.ts defers them to one dispatch):
 * set s = workgroup row y, its 4 words of `sets` at oT + 4s: dw's element in this binding, its partials' element
 * in `part`, their count nb, and D. One thread per (set, column d) adds the nb partials in block order, then that
 * sum to dw[d] (the reference adds its column sum to dw last, too).
 */
export const rmsnormBackwardW = shader(
  ["dw:read_write", "part:read", "sets:read:u32"],
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
export const rope = shader(
  ["x:read_write", "cs:read", "sn:read"],
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

/**
 * rope on q [B,T,H,E] and k [B,T,K,E] in one dispatch, the same operations per pair: threads [0, nq) rotate q's
 * pairs, [nq, nq + nk) k's.
 */
export const ropeQK = shader(
  ["q:read_write", "k:read_write", "cs:read", "sn:read"],
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

export const swigluForward = shader(
  ["out:read_write", "gate:read", "up:read"],
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

export const swigluBackward = shader(
  ["dgate:read_write", "dup:read_write", "dout:read", "gate:read", "up:read"],
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
export const crossEntropy = shader(
  ["x:read_write", "tg:read:i32", "loss:read_write"],
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

export const copy = shader(
  ["dst:read_write", "src:read"],
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

export const fill = shader(
  ["dst:read_write"],
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
