/*
 * Causal attention (GQA): forward and backward on the GEMM in row blocks, and the cached form for generation
 * (engine.h).
 */
#include "../engine.h"

/* ------------------------------------------------------------------ causal attention (GQA) */
/* q[B, T, H, E], k and v [B, T, K, E] (query head hh reads kv head hh*K/H), att[B, H, T, T] the probabilities.
 * Row blocks of the causal products: a block of query rows [t0, t1) only meets keys [0, t1), so the products
 * skip (nearly) the upper triangle instead of computing it and throwing it away. */
#define ATT_BLOCK 64

/* x[T, E] (rows ld apart) into xt[E, T] (keys and values), and query rows times scale into xs[T, E]. The score and
 * datt products then read both operands row by row, which the GEMM runs without packing; the bits are those of the
 * transposed product with alpha = scale (each a = scale * q rounded to float, then the same chain of FMAs). */
KERNEL_CLONES static void transpose_rows(const float *x, int64_t ld, int64_t T, int64_t E, float *xt) {
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++) xt[e * T + t] = x[t * ld + e];
}
KERNEL_CLONES static void scale_rows(const float *x, int64_t ld, int64_t T, int64_t E, float scale, float *xs) {
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++) xs[t * E + e] = scale * x[t * ld + e];
}

KERNEL_CLONES int attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int64_t B,
                                    int64_t T, int64_t H, int64_t K, int64_t E) {
  if (T == 0 || E == 0) return 0;
  const float scale = (float)(1.0 / sqrt((double)E));
  const int ldq = (int)(H * E), ldk = (int)(K * E), lda = (int)T;
  /* kt: this kv head's keys as [E, T]; qs: this query head's rows times scale, [T, E] */
  float *kt = (float *)malloc((size_t)(2 * T * E) * sizeof(float));
  if (!kt) return GEMM_NOMEM;
  float *qs = kt + T * E;
  int oom = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t hh = 0; hh < H; hh++) {
      const int64_t j = hh * K / H;
      const float *qp = q + (b * T * H + hh) * E;
      const float *kp = k + (b * T * K + j) * E;
      const float *vp = v + (b * T * K + j) * E;
      float *ap = att + (b * H + hh) * T * T;
      float *op = out + (b * T * H + hh) * E;
      if (hh == 0 || j != (hh - 1) * K / H) transpose_rows(kp, ldk, T, E, kt);
      scale_rows(qp, ldq, T, E, scale, qs);
      for (int64_t t0 = 0; t0 < T; t0 += ATT_BLOCK) {
        const int64_t t1 = t0 + ATT_BLOCK < T ? t0 + ATT_BLOCK : T;
        /* scores[t0:t1, 0:t1] = (scale * q_rows) @ k^T */
        oom |=
            sgemm(0, 0, (int)(t1 - t0), (int)t1, (int)E, 1.0f, qs + t0 * E, (int)E, kt, (int)T, 0.0f, ap + t0 * T, lda);
        for (int64_t t = t0; t < t1; t++) {
          float *row = ap + t * T;
          const float mx = max_f32(row, t + 1);
          for (int64_t u = 0; u <= t; u++) row[u] = exp_ps(row[u] - mx);
          const double sum = sum_f64(row, t + 1);
          const float inv = (float)(1.0 / sum);
          for (int64_t u = 0; u <= t; u++) row[u] *= inv;
          for (int64_t u = t + 1; u < T; u++) row[u] = 0.0f;
        }
        /* out[t0:t1] = att[t0:t1, 0:t1] @ v[0:t1] */
        oom |= sgemm(0, 0, (int)(t1 - t0), (int)E, (int)t1, 1.0f, ap + t0 * T, lda, vp, ldk, 0.0f, op + t0 * ldq, ldq);
      }
    }
  free(kt);
  return oom ? GEMM_NOMEM : 0;
}

/* dq = dscores @ k, dk = dscores^T @ q, dv = att^T @ dout, with dscores = att * (datt - rowsum(att * datt)) *
 * scale and datt = dout @ v^T (dq, dk and dv are overwritten) */
KERNEL_CLONES int attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                     const float *v, const float *att, int64_t B, int64_t T, int64_t H, int64_t K,
                                     int64_t E) {
  memset(dk, 0, (size_t)(B * T * K * E) * sizeof(float));
  memset(dv, 0, (size_t)(B * T * K * E) * sizeof(float));
  if (T == 0 || E == 0) {
    memset(dq, 0, (size_t)(B * T * H * E) * sizeof(float));
    return 0;
  }
  /* ds: dscores [T, T]; vt: this kv head's values as [E, T] */
  float *ds = (float *)malloc((size_t)(T * T + T * E) * sizeof(float));
  if (!ds) return GEMM_NOMEM;
  float *vt = ds + T * T;
  const float scale = (float)(1.0 / sqrt((double)E));
  const int ldq = (int)(H * E), ldk = (int)(K * E), lda = (int)T;
  int oom = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t hh = 0; hh < H; hh++) {
      const int64_t j = hh * K / H;
      const float *qp = q + (b * T * H + hh) * E, *dop = dout + (b * T * H + hh) * E;
      const float *kp = k + (b * T * K + j) * E, *vp = v + (b * T * K + j) * E;
      const float *ap = att + (b * H + hh) * T * T;
      float *dqp = dq + (b * T * H + hh) * E, *dkp = dk + (b * T * K + j) * E, *dvp = dv + (b * T * K + j) * E;
      if (hh == 0 || j != (hh - 1) * K / H) transpose_rows(vp, ldk, T, E, vt);
      for (int64_t t0 = 0; t0 < T; t0 += ATT_BLOCK) {
        const int64_t t1 = t0 + ATT_BLOCK < T ? t0 + ATT_BLOCK : T;
        /* datt[t0:t1, 0:t1] = dout_rows @ v^T */
        oom |=
            sgemm(0, 0, (int)(t1 - t0), (int)t1, (int)E, 1.0f, dop + t0 * ldq, ldq, vt, (int)T, 0.0f, ds + t0 * T, lda);
        /* dscores = att * (datt - sum_u att*datt) * scale, over u <= t; 0 above the diagonal */
        for (int64_t t = t0; t < t1; t++) {
          const float *ar = ap + t * T;
          float *dr = ds + t * T;
          const float d = (float)dot_f64(ar, dr, t + 1);
          for (int64_t u = 0; u <= t; u++) dr[u] = ar[u] * (dr[u] - d) * scale;
          for (int64_t u = t + 1; u < t1; u++) dr[u] = 0.0f;
        }
        /* dq[t0:t1] = dscores[t0:t1, 0:t1] @ k[0:t1] */
        oom |= sgemm(0, 0, (int)(t1 - t0), (int)E, (int)t1, 1.0f, ds + t0 * T, lda, kp, ldk, 0.0f, dqp + t0 * ldq, ldq);
      }
      /* key/value block [u0, u1) gets contributions from query rows t >= u0 only:
       *   dv[u0:u1] += att[u0:T, u0:u1]^T @ dout[u0:T],   dk[u0:u1] += dscores[u0:T, u0:u1]^T @ q[u0:T] */
      for (int64_t u0 = 0; u0 < T; u0 += ATT_BLOCK) {
        const int64_t u1 = u0 + ATT_BLOCK < T ? u0 + ATT_BLOCK : T;
        oom |= sgemm(1, 0, (int)(u1 - u0), (int)E, (int)(T - u0), 1.0f, ap + u0 * T + u0, lda, dop + u0 * ldq, ldq,
                     1.0f, dvp + u0 * ldk, ldk);
        oom |= sgemm(1, 0, (int)(u1 - u0), (int)E, (int)(T - u0), 1.0f, ds + u0 * T + u0, lda, qp + u0 * ldq, ldq, 1.0f,
                     dkp + u0 * ldk, ldk);
      }
    }
  free(ds);
  return oom ? GEMM_NOMEM : 0;
}

/* ------------------------------------------------------------------ cached attention (generation, forward only) */
/* kernels.ts attentionCachedForward: new position t of T (absolute P+t) and query head h attend to cache rows
 * u <= P+t of kv head j = h*K/H. The arithmetic is the JS reference's (src/model/engine/js.ts): dot products in
 * double, in e order; scores rounded to float; the softmax in double from the float scores; probabilities rounded
 * to float; the weighted sum of values in double. sc holds P+T floats, acc E doubles (the caller's scratch). */
void attention_cached(float *out, const float *q, const float *kc, const float *vc, int64_t P, int64_t T, int64_t H,
                      int64_t K, int64_t E, float *sc, double *acc) {
  const double scale = 1.0 / sqrt((double)E);
  for (int64_t t = 0; t < T; t++) {
    const int64_t last = P + t;
    for (int64_t h = 0; h < H; h++) {
      const int64_t j = h * K / H;
      const float *qh = q + (t * H + h) * E;
      float mx = -INFINITY;
      for (int64_t u = 0; u <= last; u++) {
        const float *ku = kc + (u * K + j) * E;
        double s = 0;
        for (int64_t e = 0; e < E; e++) s += (double)qh[e] * (double)ku[e];
        sc[u] = (float)(s * scale);
        if (sc[u] > mx) mx = sc[u];
      }
      double sum = 0;
      for (int64_t u = 0; u <= last; u++) sum += exp((double)sc[u] - (double)mx);
      for (int64_t u = 0; u <= last; u++) sc[u] = (float)(exp((double)sc[u] - (double)mx) / sum);
      for (int64_t e = 0; e < E; e++) acc[e] = 0;
      for (int64_t u = 0; u <= last; u++) {
        const double p = (double)sc[u];
        const float *vu = vc + (u * K + j) * E;
        for (int64_t e = 0; e < E; e++) acc[e] += p * (double)vu[e];
      }
      float *oh = out + (t * H + h) * E;
      for (int64_t e = 0; e < E; e++) oh[e] = (float)acc[e];
    }
  }
}
