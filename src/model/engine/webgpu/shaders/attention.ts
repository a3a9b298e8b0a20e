/**
 * The fused attention's WGSL (framework.ts), FlashAttention-2's scheme as the native engine's
 * (native/ops/attention.c): the training forward, the cached forward (generation) and the backward.
 *
 * One thread per row: a thread holds its whole row (q and the output accumulator in the forward; k, v, dk and dv,
 * or q, dout and dq, in the backward) in registers, as vec4s. The head size E is a pipeline constant (WGSL
 * `override`, given at pipeline creation: one pipeline per head size, recorder.ts), so the loops over a row have a
 * bound the shader compiler knows and unrolls, and those arrays, only ever indexed by such a loop, stay in
 * registers. The other side's rows pass through workgroup memory in tiles of vec4s, and every thread of a workgroup
 * reads the same vec4 of a tile at the same time (its address depends on loop counters only): a broadcast on a GPU,
 * one load for all the lanes of a SIMD vector on llvmpipe. The causal mask selects, it does not branch, so those
 * reads stay in uniform control flow. Device memory is read and written an element at a time in loops that stay
 * rolled (tileIn, rowIn, rowOut): coalesced, and few sites, which keeps the shaders quick to compile on llvmpipe.
 */
import { shader } from "./framework";

/** Rows (query rows in the forward and for dq, keys for dk and dv) of a workgroup: one thread each. */
export const ATT_BQ = 64;
/**
 * Keys per tile of the forward; rows per tile of the backward's inner loop (the other side's rows). Both are
 * halved past head size 64 (pipeline constants BK and BT), so the tiles fit 16 KiB of workgroup memory at E 128.
 */
const ATT_BK = 32;
const ATT_BT = 16;
/** The largest head size the fused attention takes (its tiles in workgroup memory are sized for it). */
export const ATT_EMAX = 128;
/** Bytes of workgroup memory at head size E: the forward's K and V tiles; the backward's three tiles and lse. */
function attBytes(E: number): number {
  const e4 = Math.ceil(E / 4),
    bt = E > 64 ? ATT_BT / 2 : ATT_BT;
  return Math.max(2 * (E > 64 ? ATT_BK / 2 : ATT_BK) * e4 * 16, 3 * bt * e4 * 16 + bt * 4);
}
if (ATT_BQ > 256 || attBytes(ATT_EMAX) > 16384 || attBytes(64) > 16384)
  throw new Error(`webgpu: attention's tiles need ${ATT_BQ} threads, ${attBytes(ATT_EMAX)} B`);

/**
 * The head size E (a pipeline constant: the engine's attention calls give it) and what follows from it: E4 vec4s a
 * row (the last one zero past E), EM4 the register arrays' length (their used part is E4), the forward's tile BK
 * keys and the backward's BT rows.
 */
const headSize = `
override E: u32;
override E4: u32 = (E + 3u) / 4u;
const EM4 = ${ATT_EMAX / 4}u;
override BK: u32 = select(${ATT_BK}u, ${ATT_BK / 2}u, E > 64u);
override BT: u32 = select(${ATT_BT}u, ${ATT_BT / 2}u, E > 64u);`;

/** A tile's destination in workgroup memory: its array, its first vec4 there, and the value of element e of row r. */
interface TileDst {
  buf: string;
  at: string;
  val: string;
}

/**
 * WGSL: rows [0, n) of a tile into workgroup memory, an element at a time (the loads from device memory in one
 * loop: a few sites, coalesced). A row is 4 E4 slots; slot x of the tile is component x % 4 of its vec4 x / 4, and
 * element e of row r is slot 4 E4 r + e, zero for e >= E (`val` is read only where e < E). `pre` are statements
 * before the values (r, e and inE = e < E in scope). With `R`, the vec4s of rows [n, R) are zeroed after, so what
 * the threads read of the tile is always written.
 */
function tileIn(n: string, dsts: TileDst[], pre = "", R = ""): string {
  const load = dsts.map(
    (d, a) => `var v${a} = 0.0;
      if (inE) { v${a} = ${d.val}; }
      ${d.buf}[${d.at} + x / 4u][x % 4u] = v${a};`,
  );
  const zero = dsts.map((d) => `${d.buf}[${d.at} + x] = vec4f(0.0);`);
  return `
    for (var x = l; x < ${n} * 4u * E4; x += ${ATT_BQ}u) {
      let r = x / (4u * E4);
      let e = x % (4u * E4);
      let inE = e < E;
      ${pre}
      ${load.join("\n      ")}
    }${
      R
        ? `
    for (var x = ${n} * E4 + l; x < ${R} * E4; x += ${ATT_BQ}u) {
      ${zero.join("\n      ")}
    }`
        : ""
    }`;
}

/**
 * WGSL: the thread's own row of a source into `row`, element e read by `src` (a function of the WGSL variable e),
 * zeros past E and where `live` is false. The loop's bound is the setting n4 (= E4), which the shader compiler
 * cannot see, so the loads from device memory stay in one rolled loop (a few sites; unrolled, E4 of them make
 * llvmpipe's compile of the shader minutes long); `row` is the function-scope array such a loop fills.
 */
function rowIn(src: (e: string) => string, live: string): string {
  return `
  for (var i = 0u; i < p.n4; i++) {
    var w = vec4f(0.0);
    for (var c = 0u; c < 4u; c++) {
      let e = 4u * i + c;
      if (${live} && e < E) { w[c] = ${src("e")}; }
    }
    row[i] = w;
  }`;
}

/** WGSL: the reverse of rowIn: `row` into the thread's own row of a destination (element e: `dst`), if `live`. */
function rowOut(dst: (e: string) => string, live: string): string {
  return `
  for (var i = 0u; i < p.n4; i++) {
    let w = row[i];
    for (var c = 0u; c < 4u; c++) {
      let e = 4u * i + c;
      if (${live} && e < E) { ${dst("e")} = w[c]; }
    }
  }`;
}

/**
 * The fused causal forward, shared by the training forward and the cached forward so that both run the same
 * operations. A workgroup owns ATT_BQ query rows of one (sequence, head), a thread each, holding q and the output
 * accumulator (read and written through `row`: rowIn, rowOut). Key tiles of BK rows, from key 0 to the
 * block's last visible key, go through workgroup memory (K, then V, in kv). Each thread walks a tile's keys 4 at a
 * time, a vec4 of scores, in a loop the compiler leaves rolled (its bound is the tile's key count); the online
 * softmax keeps a running max m and sum l, and each group of 4 rescales l and the accumulator by exp(m_old - m_new)
 * once. Unrolling the tile's 32 keys instead (a score array in registers, one rescale a tile) made llvmpipe's
 * compile of a forward 37 s at head size 24 and over a minute at 64; the group of 4 costs one multiply a vec4 of the
 * row per 4 keys. A key past the row's position (u > P + t) adds nothing (its weight is selected
 * to 0). The output is acc / l; the row's log-sum-exp is m + log(l). `at` names: b (the sequence), P (the keys
 * before query row 0), QR(t) and KR(u), functions of a row's variable: q's row index and the cache's.
 */
function flashForward(
  at: { b: string; P: string; QR: (t: string) => string; KR: (u: string) => string },
  lse: string,
): string {
  const V = "BK * E4"; // the V tile's place in kv
  return `${headSize}
var<workgroup> kv: array<vec4f, 2u * BK * E4>;
@compute @workgroup_size(${ATT_BQ})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) l: u32) {
  let q0 = wg.x * ${ATT_BQ}u;
  let h = wg.y % p.H;
  let b = ${at.b};
  let j = (h * p.K) / p.H;
  let t = q0 + l;
  let last = ${at.P} + t;
  let live = t < p.T;
  var row: array<vec4f, EM4>;
  var qr: array<vec4f, EM4>;
  var acc: array<vec4f, EM4>;
  ${rowIn((e) => `q[p.oQ + (${at.QR("t")}) * E + ${e}]`, "live")}
  for (var i = 0u; i < E4; i++) {
    qr[i] = row[i];
    acc[i] = vec4f(0.0);
  }
  var m = -0x1.fffffep+127f;
  var lsum = 0.0;
  let nkeys = min(${at.P} + q0 + ${ATT_BQ}u, ${at.P} + p.T);
  for (var u0 = 0u; u0 < nkeys; u0 += BK) {
    // the tile's keys and values, zeros past the last
    let n = min(BK, nkeys - u0);
    ${tileIn(
      "n",
      [
        { buf: "kv", at: "0u", val: "k[p.oK + ko]" },
        { buf: "kv", at: V, val: "v[p.oV + ko]" },
      ],
      `let ko = (${at.KR("u0 + r")}) * E + e;`,
      "BK",
    )}
    workgroupBarrier();
    // the tile's live keys in groups of 4, a vec4 of scores (rows past n are zeros, read and masked)
    for (var u = 0u; u < n; u += 4u) {
      let k1 = u * E4;
      var s = vec4f(0.0);
      for (var i = 0u; i < E4; i++) {
        let x = qr[i];
        s = s + vec4f(dot(x, kv[k1 + i]), dot(x, kv[k1 + E4 + i]), dot(x, kv[k1 + 2u * E4 + i]), dot(x, kv[k1 + 3u * E4 + i]));
      }
      let sc = s * p.scale;
      let on = vec4u(u0 + u) + vec4u(0u, 1u, 2u, 3u) <= vec4u(last);
      let mx = max(max(max(m, select(m, sc.x, on.x)), max(select(m, sc.y, on.y), select(m, sc.z, on.z))), select(m, sc.w, on.w));
      let alpha = exp(m - mx);
      let pu = select(vec4f(0.0), exp(sc - vec4f(mx)), on);
      lsum = (((lsum * alpha + pu.x) + pu.y) + pu.z) + pu.w;
      for (var i = 0u; i < E4; i++) {
        let w = k1 + ${V} + i;
        acc[i] = (((acc[i] * alpha + pu.x * kv[w]) + pu.y * kv[w + E4]) + pu.z * kv[w + 2u * E4]) + pu.w * kv[w + 3u * E4];
      }
      m = mx;
    }
    workgroupBarrier();
  }
  if (!live) { return; }
  for (var i = 0u; i < E4; i++) { row[i] = acc[i] / lsum; }
  ${rowOut((e) => `out[p.oO + (${at.QR("t")}) * E + ${e}]`, "live")}
  ${lse ? `${lse} = m + log(lsum);` : ""}
}`;
}

/**
 * Training forward, out [B,T,H,E] and lse [B,H,T]: a workgroup per ATT_BQ query rows of one (b, h), the grid
 * [ceil(T / ATT_BQ), B * H]. Pipeline constant: E.
 */
export const attentionForward = shader(
  ["out:read_write", "lse:read_write", "q:read", "k:read", "v:read"],
  { T: "u32", H: "u32", K: "u32", n4: "u32", oO: "u32", oL: "u32", oQ: "u32", oK: "u32", oV: "u32", scale: "f32" },
  flashForward(
    { b: "wg.y / p.H", P: "0u", QR: (t) => `(b * p.T + ${t}) * p.H + h`, KR: (u) => `(b * p.T + ${u}) * p.K + j` },
    "lse[p.oL + (b * p.H + h) * p.T + t]",
  ),
);

/**
 * Cached forward (generation): new position t of T, absolute P + t, against cache rows u <= P + t; q and out
 * [T,H,E], the cache [rows,K,E]. A workgroup per ATT_BQ new rows of one head, the grid [ceil(T / ATT_BQ), H].
 * Pipeline constant: E.
 */
export const attentionCachedForward = shader(
  ["out:read_write", "q:read", "k:read", "v:read"],
  { P: "u32", T: "u32", H: "u32", K: "u32", n4: "u32", oO: "u32", oQ: "u32", oK: "u32", oV: "u32", scale: "f32" },
  flashForward({ b: "0u", P: "p.P", QR: (t) => `(${t}) * p.H + h`, KR: (u) => `(${u}) * p.K + j` }, ""),
);

/**
 * The fused backward in one dispatch, P recomputed from the forward's lse (P = exp(S - lse)), nothing of size
 * T x T anywhere. Two kinds of workgroup, by index, a thread per row:
 *  - the first B * K * ceil(T / ATT_BQ) own ATT_BQ key rows of one kv head j of one sequence b: each thread holds
 *    k[u], v[u], dk[u] and dv[u]; the query heads h of j's group (h*K/H = j), in h order, and for each their query
 *    rows t >= the block's first key, in tiles of BT rows of q and dout through workgroup memory: dv[u] += P[t,u]
 *    dout[t], dk[u] += dS[t,u] q[t], dS = P (dout[t] . v[u] - D_t) scale. D_t = dout[t] . out[t] is the sum of
 *    the tile's products dout * out (Wd), which the threads that load the tile compute as they load it;
 *  - the rest own ATT_BQ query rows of one (b, h): each thread holds q[t], dout[t] and dq[t], and computes its
 *    row's D_t once; key tiles of BT rows of k and v up to the block's last query: dq[t] += dS[t,u] k[u].
 * Every output is written once by its owner (overwritten), summed in that fixed order: no atomics. The grid is a
 * 1-D range of workgroups over [x, y]. Pipeline constant: E.
 */
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
    n4: "u32",
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
  `${headSize}
var<workgroup> XY: array<vec4f, 2u * BT * E4>;
var<workgroup> Wd: array<vec4f, BT * E4>;
var<workgroup> rowL: array<f32, BT>;
@compute @workgroup_size(${ATT_BQ})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(num_workgroups) nw: vec3u, @builtin(local_invocation_index) l: u32) {
  let g = wg.x + wg.y * nw.x;
  let nb = (p.T + ${ATT_BQ - 1}u) / ${ATT_BQ}u;
  let nkv = p.B * p.K * nb;
  if (g >= nkv + p.B * p.H * nb) { return; }
  let Y = BT * E4; // Y's place in XY
  if (g < nkv) {
    // ---- dk, dv of ATT_BQ keys of kv head j
    let k0 = (g % nb) * ${ATT_BQ}u;
    let j = (g / nb) % p.K;
    let b = g / (nb * p.K);
    let u = k0 + l;
    let live = u < p.T;
    let ko = ((b * p.T + u) * p.K + j) * E;
    var row: array<vec4f, EM4>;
    var kr: array<vec4f, EM4>;
    var vr: array<vec4f, EM4>;
    var ak: array<vec4f, EM4>;
    var av: array<vec4f, EM4>;
    ${rowIn((e) => `k[p.oK + ko + ${e}]`, "live")}
    for (var i = 0u; i < E4; i++) { kr[i] = row[i]; }
    ${rowIn((e) => `v[p.oV + ko + ${e}]`, "live")}
    for (var i = 0u; i < E4; i++) {
      vr[i] = row[i];
      ak[i] = vec4f(0.0);
      av[i] = vec4f(0.0);
    }
    for (var h = 0u; h < p.H; h++) {
      if ((h * p.K) / p.H != j) { continue; }
      for (var t0 = k0; t0 < p.T; t0 += BT) {
        // q and dout rows t0.. into XY and dout * out into Wd (zeros past T); lse into rowL
        let n = min(BT, p.T - t0);
        ${tileIn(
          "n",
          [
            { buf: "XY", at: "0u", val: "q[p.oQ + qo]" },
            { buf: "XY", at: "Y", val: "go" },
            { buf: "Wd", at: "0u", val: "go * out[p.oO + qo]" },
          ],
          "let qo = ((b * p.T + t0 + r) * p.H + h) * E + e;\n      var go = 0.0;\n      if (inE) { go = dout[p.oDO + qo]; }",
          "BT",
        )}
        if (l < BT) {
          var lx = 0.0;
          if (t0 + l < p.T) { lx = lse[p.oL + (b * p.H + h) * p.T + t0 + l]; }
          rowL[l] = lx;
        }
        workgroupBarrier();
        for (var t = 0u; t < n; t++) {
          var dt = 0.0;
          var s = 0.0;
          var dp = 0.0;
          for (var i = 0u; i < E4; i++) {
            let w = Wd[t * E4 + i];
            dt = dt + ((w.x + w.y) + (w.z + w.w));
            s = s + dot(kr[i], XY[t * E4 + i]);
            dp = dp + dot(vr[i], XY[Y + t * E4 + i]);
          }
          let pr = select(0.0, exp(s * p.scale - rowL[t]), t0 + t < p.T && u <= t0 + t);
          let ds = pr * (dp - dt) * p.scale;
          for (var i = 0u; i < E4; i++) {
            av[i] = av[i] + pr * XY[Y + t * E4 + i];
            ak[i] = ak[i] + ds * XY[t * E4 + i];
          }
        }
        workgroupBarrier();
      }
    }
    if (!live) { return; }
    for (var i = 0u; i < E4; i++) { row[i] = ak[i]; }
    ${rowOut((e) => `dk[p.oDK + ko + ${e}]`, "live")}
    for (var i = 0u; i < E4; i++) { row[i] = av[i]; }
    ${rowOut((e) => `dv[p.oDV + ko + ${e}]`, "live")}
  } else {
    // ---- dq of ATT_BQ query rows of (b, h)
    let gq = g - nkv;
    let q0 = (gq % nb) * ${ATT_BQ}u;
    let h = (gq / nb) % p.H;
    let b = gq / (nb * p.H);
    let j = (h * p.K) / p.H;
    let t = q0 + l;
    let live = t < p.T;
    let qo = ((b * p.T + t) * p.H + h) * E;
    var row: array<vec4f, EM4>;
    var qr: array<vec4f, EM4>;
    var gr: array<vec4f, EM4>;
    var aq: array<vec4f, EM4>;
    ${rowIn((e) => `q[p.oQ + qo + ${e}]`, "live")}
    for (var i = 0u; i < E4; i++) { qr[i] = row[i]; }
    ${rowIn((e) => `dout[p.oDO + qo + ${e}]`, "live")}
    for (var i = 0u; i < E4; i++) {
      gr[i] = row[i];
      aq[i] = vec4f(0.0);
    }
    // D_t = dout[t] . out[t], once per row
    ${rowIn((e) => `out[p.oO + qo + ${e}]`, "live")}
    var dd = 0.0;
    for (var i = 0u; i < E4; i++) { dd = dd + dot(gr[i], row[i]); }
    var lx = 0.0;
    if (live) { lx = lse[p.oL + (b * p.H + h) * p.T + t]; }
    let nkeys = min(q0 + ${ATT_BQ}u, p.T);
    for (var u0 = 0u; u0 < nkeys; u0 += BT) {
      // k and v rows u0.. into XY, zeros past the block's last query
      let n = min(BT, nkeys - u0);
      ${tileIn(
        "n",
        [
          { buf: "XY", at: "0u", val: "k[p.oK + ko]" },
          { buf: "XY", at: "Y", val: "v[p.oV + ko]" },
        ],
        "let ko = ((b * p.T + u0 + r) * p.K + j) * E + e;",
        "BT",
      )}
      workgroupBarrier();
      for (var u = 0u; u < n; u++) {
        var s = 0.0;
        var dp = 0.0;
        for (var i = 0u; i < E4; i++) {
          s = s + dot(qr[i], XY[u * E4 + i]);
          dp = dp + dot(gr[i], XY[Y + u * E4 + i]);
        }
        let ds = select(0.0, exp(s * p.scale - lx) * (dp - dd) * p.scale, u0 + u <= t);
        for (var i = 0u; i < E4; i++) { aq[i] = aq[i] + ds * XY[u * E4 + i]; }
      }
      workgroupBarrier();
    }
    if (!live) { return; }
    for (var i = 0u; i < E4; i++) { row[i] = aq[i]; }
    ${rowOut((e) => `dq[p.oDQ + qo + ${e}]`, "live")}
  }
}`,
);
