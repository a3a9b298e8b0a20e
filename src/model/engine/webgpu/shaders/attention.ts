/**
 * The fused attention's WGSL (framework.ts), FlashAttention-2's scheme as the native engine's
 * (native/ops/attention.c): the training forward, the cached forward (generation) and the backward.
 */
import { shader } from "./framework";

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
  // workgroup memory: each key tile writes kv[0, ATT_BK * E) (a zero past the keys) before the barrier that precedes
  // its reads (kv[u * E + e], u < ATT_BK, e < E), and every (row, key, thread) entry of part before the barrier that
  // precedes total(); a barrier ends each step before the next one's writes
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
export const attentionForward = shader(
  ["out:read_write", "lse:read_write", "q:read", "k:read", "v:read"],
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
export const attentionCachedForward = shader(
  ["out:read_write", "q:read", "k:read", "v:read"],
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
// workgroup memory: each tile writes X and Y over [0, ATT_BT * E) (a zero past the rows), and every (row, tile row,
// thread) entry of part and pd, before the barrier that precedes their reads; rowD and rowL[0, ATT_BT) are written
// by threads l < ATT_BT before that same barrier (the key-block branch, the only one that reads them); a barrier
// ends each tile before the next one's writes. The branch (key block or query block) is the workgroup's, uniform.
export const attentionBackward = shader(
  [
    "dq:read_write",
    "dk:read_write",
    "dv:read_write",
    "dout:read",
    "q:read",
    "k:read",
    "v:read",
    "out:read",
    "lse:read",
  ],
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
