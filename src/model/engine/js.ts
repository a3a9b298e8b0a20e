/**
 * Plain-JS implementations of every non-matmul kernel of the Kernels interface (src/model/kernels.ts): the
 * reference the native C kernels are checked against, and the tfjs engine's non-matmul half.
 *
 * float32 storage, float64 (JS number) arithmetic inside each kernel: every sum, every dot product and every
 * reduction over a row runs in float64 and is rounded to float32 once, when stored. Loops run in a fixed order,
 * so every kernel is deterministic (M6, B1). Shapes as in kernels.ts: N tokens, D hidden, H/K query/kv heads,
 * E head_dim.
 */
import type { Kernels } from "../kernels";

export type NonMatmulKernels = Omit<Kernels, "name" | "matmul" | "dispose">;

// ------------------------------------------------------------------ embedding

function embeddingForward(out: Float32Array, ids: Int32Array, E: Float32Array, N: number, D: number): void {
  for (let n = 0; n < N; n++) out.set(E.subarray(ids[n] * D, (ids[n] + 1) * D), n * D);
}

function embeddingBackward(dE: Float32Array, ids: Int32Array, dout: Float32Array, N: number, D: number): void {
  for (let n = 0; n < N; n++) {
    const dst = ids[n] * D,
      src = n * D;
    for (let d = 0; d < D; d++) dE[dst + d] += dout[src + d];
  }
}

// ------------------------------------------------------------------ RMSNorm

function rmsnormForward(
  out: Float32Array,
  rstd: Float32Array,
  x: Float32Array,
  w: Float32Array,
  N: number,
  D: number,
  eps: number,
): void {
  for (let n = 0; n < N; n++) {
    const o = n * D;
    let ss = 0;
    for (let d = 0; d < D; d++) ss += x[o + d] * x[o + d];
    const r = 1 / Math.sqrt(ss / D + eps);
    rstd[n] = r;
    for (let d = 0; d < D; d++) out[o + d] = x[o + d] * r * w[d];
  }
}

/** xhat = x * rstd, dxhat = dout * w:  dx += rstd * (dxhat - xhat * mean(dxhat * xhat)),  dw += sum_n dout * xhat. */
function rmsnormBackward(
  dx: Float32Array,
  dw: Float32Array,
  dout: Float32Array,
  x: Float32Array,
  w: Float32Array,
  rstd: Float32Array,
  N: number,
  D: number,
): void {
  const dwAcc = new Float64Array(D);
  for (let n = 0; n < N; n++) {
    const o = n * D,
      r = rstd[n];
    let dot = 0; // sum_d dxhat * xhat
    for (let d = 0; d < D; d++) {
      const xh = x[o + d] * r;
      dot += dout[o + d] * w[d] * xh;
      dwAcc[d] += dout[o + d] * xh;
    }
    const mean = dot / D;
    for (let d = 0; d < D; d++) dx[o + d] += r * (dout[o + d] * w[d] - x[o + d] * r * mean);
  }
  for (let d = 0; d < D; d++) dw[d] += dwAcc[d];
}

// ------------------------------------------------------------------ RoPE

function ropeApply(
  x: Float32Array,
  cos: Float32Array,
  sin: Float32Array,
  B: number,
  T: number,
  nh: number,
  E: number,
  sign: 1 | -1,
): void {
  const h = E / 2;
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      const tab = t * h;
      for (let j = 0; j < nh; j++) {
        const o = ((b * T + t) * nh + j) * E;
        for (let i = 0; i < h; i++) {
          const c = cos[tab + i],
            s = sign * sin[tab + i];
          const a = x[o + i],
            z = x[o + i + h];
          x[o + i] = a * c - z * s;
          x[o + i + h] = z * c + a * s;
        }
      }
    }
  }
}

function ropeForward(
  x: Float32Array,
  cos: Float32Array,
  sin: Float32Array,
  B: number,
  T: number,
  nh: number,
  E: number,
): void {
  ropeApply(x, cos, sin, B, T, nh, E, 1);
}

/** The adjoint of a rotation by +angle is the rotation by -angle. */
function ropeBackward(
  dx: Float32Array,
  cos: Float32Array,
  sin: Float32Array,
  B: number,
  T: number,
  nh: number,
  E: number,
): void {
  ropeApply(dx, cos, sin, B, T, nh, E, -1);
}

// ------------------------------------------------------------------ causal attention (GQA)

function attentionForward(
  out: Float32Array,
  lse: Float32Array,
  q: Float32Array,
  k: Float32Array,
  v: Float32Array,
  B: number,
  T: number,
  H: number,
  K: number,
  E: number,
): void {
  const scale = 1 / Math.sqrt(E);
  const sc = new Float32Array(T),
    acc = new Float64Array(E);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      const j = Math.floor((h * K) / H);
      for (let t = 0; t < T; t++) {
        const qo = ((b * T + t) * H + h) * E;
        // float32 scores and their max (u <= t only: the causal mask)
        const mx = causalScores(sc, q, qo, k, b, t, T, K, j, E, scale);
        // softmax over u <= t (exp and sum in float64 from the float32 scores), probabilities rounded to float32
        let sum = 0;
        for (let u = 0; u <= t; u++) sum += Math.exp(sc[u] - mx);
        lse[(b * H + h) * T + t] = mx + Math.log(sum);
        for (let u = 0; u <= t; u++) sc[u] = Math.exp(sc[u] - mx) / sum;
        // out = p @ v
        acc.fill(0);
        for (let u = 0; u <= t; u++) {
          const p = sc[u],
            vo = ((b * T + u) * K + j) * E;
          for (let e = 0; e < E; e++) acc[e] += p * v[vo + e];
        }
        for (let e = 0; e < E; e++) out[qo + e] = acc[e];
      }
    }
  }
}

/** sc[u] = float32(q[qo..] . k[b,u,j,:] * scale) for u <= t (dot products in float64); returns their max. */
function causalScores(
  sc: Float32Array,
  q: Float32Array,
  qo: number,
  k: Float32Array,
  b: number,
  t: number,
  T: number,
  K: number,
  j: number,
  E: number,
  scale: number,
): number {
  let mx = -Infinity;
  for (let u = 0; u <= t; u++) {
    const ko = ((b * T + u) * K + j) * E;
    let s = 0;
    for (let e = 0; e < E; e++) s += q[qo + e] * k[ko + e];
    sc[u] = s * scale;
    if (sc[u] > mx) mx = sc[u];
  }
  return mx;
}

/** Cached attention (kernels.ts contract): new position t of T attends to cache rows u <= P+t. */
function attentionCachedForward(
  out: Float32Array,
  q: Float32Array,
  kCache: Float32Array,
  vCache: Float32Array,
  P: number,
  T: number,
  H: number,
  K: number,
  E: number,
): void {
  const scale = 1 / Math.sqrt(E),
    sc = new Float32Array(P + T),
    acc = new Float64Array(E);
  for (let t = 0; t < T; t++) {
    const last = P + t; // the newest position this query sees
    for (let h = 0; h < H; h++) {
      const j = Math.floor((h * K) / H),
        qo = (t * H + h) * E;
      // float32 scores and their max
      let mx = -Infinity;
      for (let u = 0; u <= last; u++) {
        const ko = (u * K + j) * E;
        let s = 0;
        for (let e = 0; e < E; e++) s += q[qo + e] * kCache[ko + e];
        sc[u] = s * scale;
        if (sc[u] > mx) mx = sc[u];
      }
      // softmax in float64 from the float32 scores, probabilities rounded to float32
      let sum = 0;
      for (let u = 0; u <= last; u++) sum += Math.exp(sc[u] - mx);
      for (let u = 0; u <= last; u++) sc[u] = Math.exp(sc[u] - mx) / sum;
      acc.fill(0);
      for (let u = 0; u <= last; u++) {
        const p = sc[u],
          vo = (u * K + j) * E;
        for (let e = 0; e < E; e++) acc[e] += p * vCache[vo + e];
      }
      for (let e = 0; e < E; e++) out[qo + e] = acc[e];
    }
  }
}

/**
 * p = exp(s - lse) from the recomputed float32 scores; dv[u] = sum_t p[t,u] dout[t];  dP[t,u] = dout[t] . v[u];
 * dS = p * (dP - D) / sqrt(E) with D = dout[t] . out[t];  dq[t] = sum_u dS[t,u] k[u];  dk[u] = sum_t dS[t,u] q[t]
 * (dk, dv summed over the kv head's query heads).
 */
function attentionBackward(
  dq: Float32Array,
  dk: Float32Array,
  dv: Float32Array,
  dout: Float32Array,
  q: Float32Array,
  k: Float32Array,
  v: Float32Array,
  out: Float32Array,
  lse: Float32Array,
  B: number,
  T: number,
  H: number,
  K: number,
  E: number,
): void {
  const scale = 1 / Math.sqrt(E);
  const dkAcc = new Float64Array(T * K * E),
    dvAcc = new Float64Array(T * K * E); // one sequence's dk, dv
  const sc = new Float32Array(T),
    acc = new Float64Array(E);
  for (let b = 0; b < B; b++) {
    dkAcc.fill(0);
    dvAcc.fill(0);
    for (let h = 0; h < H; h++) {
      const j = Math.floor((h * K) / H);
      for (let t = 0; t < T; t++) {
        const qo = ((b * T + t) * H + h) * E,
          x = lse[(b * H + h) * T + t];
        causalScores(sc, q, qo, k, b, t, T, K, j, E, scale);
        let d = 0; // D = dout . out
        for (let e = 0; e < E; e++) d += dout[qo + e] * out[qo + e];
        acc.fill(0);
        for (let u = 0; u <= t; u++) {
          const vo = ((b * T + u) * K + j) * E;
          let dp = 0;
          for (let e = 0; e < E; e++) dp += dout[qo + e] * v[vo + e];
          const p = Math.exp(sc[u] - x),
            ds = p * (dp - d) * scale;
          const ko = ((b * T + u) * K + j) * E,
            lo = (u * K + j) * E;
          for (let e = 0; e < E; e++) {
            acc[e] += ds * k[ko + e];
            dkAcc[lo + e] += ds * q[qo + e];
            dvAcc[lo + e] += p * dout[qo + e];
          }
        }
        for (let e = 0; e < E; e++) dq[qo + e] = acc[e];
      }
    }
    const o = b * T * K * E;
    for (let i = 0; i < T * K * E; i++) {
      dk[o + i] = dkAcc[i];
      dv[o + i] = dvAcc[i];
    }
  }
}

// ------------------------------------------------------------------ SwiGLU

function swigluForward(out: Float32Array, gate: Float32Array, up: Float32Array, n: number): void {
  for (let i = 0; i < n; i++) {
    const g = gate[i];
    out[i] = (g / (1 + Math.exp(-g))) * up[i];
  }
}

/** silu'(g) = sg * (1 + g * (1 - sg)), sg = sigmoid(g). */
function swigluBackward(
  dgate: Float32Array,
  dup: Float32Array,
  dout: Float32Array,
  gate: Float32Array,
  up: Float32Array,
  n: number,
): void {
  for (let i = 0; i < n; i++) {
    const g = gate[i],
      sg = 1 / (1 + Math.exp(-g)),
      d = dout[i];
    dup[i] = d * g * sg;
    dgate[i] = d * up[i] * sg * (1 + g * (1 - sg));
  }
}

// ------------------------------------------------------------------ cross-entropy

function crossEntropy(logits: Float32Array, targets: Int32Array, rows: number, V: number, gradScale: number): number {
  let loss = 0;
  for (let r = 0; r < rows; r++) {
    const o = r * V,
      y = targets[r];
    if (y < 0) {
      if (gradScale > 0) logits.fill(0, o, o + V);
      continue;
    }
    const xy = logits[o + y];
    let mx = -Infinity;
    for (let i = 0; i < V; i++) if (logits[o + i] > mx) mx = logits[o + i];
    let sum = 0;
    if (gradScale > 0) {
      // exp once per logit: kept in place (float32) for the gradient
      for (let i = 0; i < V; i++) {
        const e = Math.exp(logits[o + i] - mx);
        logits[o + i] = e;
        sum += e;
      }
      const inv = 1 / sum;
      for (let i = 0; i < V; i++) logits[o + i] = logits[o + i] * inv * gradScale;
      logits[o + y] = (Math.exp(xy - mx) * inv - 1) * gradScale;
    } else {
      for (let i = 0; i < V; i++) sum += Math.exp(logits[o + i] - mx);
    }
    loss += mx + Math.log(sum) - xy;
  }
  return loss;
}

export const jsKernels: NonMatmulKernels = {
  embeddingForward,
  embeddingBackward,
  rmsnormForward,
  rmsnormBackward,
  ropeForward,
  ropeBackward,
  attentionForward,
  attentionBackward,
  attentionCachedForward,
  swigluForward,
  swigluBackward,
  crossEntropy,
};
