/*
 * The row kernels' bodies, written once on the V* operations and included by ops/rows.c once per instruction set
 * (AVX-512: 16 lanes, AVX2 + FMA: 8, plain C: 1), each under its own target, with ISA_FN(name) naming that copy.
 * Every lane runs the same IEEE operations in the same order (vmath.h's exp, the FMAs written out, no contraction);
 * a row's last partial vector runs through a zero-padded copy, so it takes the same path as the rest. Sums keep
 * LANES double partial sums, element i in lane i % LANES, combined in lane order, then the rest in order (engine.h's
 * sum_f64): the vector width never changes the order.
 *
 * The includer defines: ISA_FN, VW, vf, VLOAD, VSTORE, VSET, VMAX, VMIN, VFMA, VADD, VSUB, VMUL, VDIV, VPOW2, and
 * VACC (the LANES double partial sums) with VACC_ZERO, VACC_ADD(acc, v) (the VW floats of v, element j into lane
 * j % LANES, in element order) and VACC_STORE(double *, acc).
 */

/* out[0, VW) = exp(x[0, VW) - sub) */
static inline vf ISA_FN(vexp_sub)(vf x, float sub) {
  vf e;
  VEXP_BODY(e, VSUB(x, VSET(sub)));
  return e;
}

/* The first m (< VW) elements of src into a zero-padded vector's worth at dst */
static inline void ISA_FN(pad)(float *dst, const float *src, int64_t m) {
  for (int64_t j = 0; j < VW; j++) dst[j] = j < m ? src[j] : 0.0f;
}

/* out[i] = exp(x[i] - sub), i < n (out may be x) */
static void ISA_FN(exp_row)(float *out, const float *x, int64_t n, float sub) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) VSTORE(out + i, ISA_FN(vexp_sub)(VLOAD(x + i), sub));
  if (i < n) {
    float t[VW];
    ISA_FN(pad)(t, x + i, n - i);
    VSTORE(t, ISA_FN(vexp_sub)(VLOAD(t), sub));
    memcpy(out + i, t, (size_t)(n - i) * sizeof(float));
  }
}

/* x[i] = exp(x[i] - sub), i < n, and their sum in double in sum_f64's order, in one pass */
static double ISA_FN(exp_sum_row)(float *x, int64_t n, float sub) {
  double acc[LANES] = {0};
  int64_t i = 0;
#if VW > 1
  VACC a = VACC_ZERO;
  for (; i + VW <= n; i += VW) {
    const vf e = ISA_FN(vexp_sub)(VLOAD(x + i), sub);
    VSTORE(x + i, e);
    VACC_ADD(a, e);
  }
  VACC_STORE(acc, a);
#endif
  ISA_FN(exp_row)(x + i, x + i, n - i, sub);
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) acc[j] += (double)x[i + j];
  double s = 0;
  for (int j = 0; j < LANES; j++) s += acc[j];
  for (; i < n; i++) s += (double)x[i];
  return s;
}

#ifdef TSTRAIN_PROBES
/* out[i] = log(x[i]) (vmath.h's log_f64, on this copy's target): the probes addon's vmath only */
static void ISA_FN(log_row)(double *out, const double *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = log_f64(x[i]);
}
#endif

/* ------------------------------------------------------------------ embedding */
static void ISA_FN(embedding_backward)(float *dE, const int32_t *ids, const float *dout, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; n++) {
    float *dst = dE + (int64_t)ids[n] * D;
    const float *src = dout + n * D;
    for (int64_t i = 0; i < D; i++) dst[i] += src[i];
  }
}

/* ------------------------------------------------------------------ RMSNorm */
static void ISA_FN(rmsnorm_forward)(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t D,
                                    double eps) {
  for (int64_t n = 0; n < N; n++) {
    const float *xr = x + n * D;
    float *o = out + n * D;
    const double ss = dot_f64(xr, xr, D);
    const float r = (float)(1.0 / sqrt(ss / (double)D + eps));
    rstd[n] = r;
    for (int64_t i = 0; i < D; i++) o[i] = (xr[i] * r) * w[i];
  }
}

static void ISA_FN(rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                     const float *rstd, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; n++) {
    const float *xr = x + n * D, *g = dout + n * D;
    float *dxr = dx + n * D;
    const float r = rstd[n];
    const double dot = dot3_f64(g, w, xr, D); /* sum_i dout_i * w_i * x_i */
    /* dx_i = r * (dout_i w_i) - x_i * r^3 * dot / D; dw_i = dout_i * (x_i r), in the same pass */
    const float c = (float)((double)r * (double)r * (double)r * dot / (double)D);
    for (int64_t i = 0; i < D; i++) {
      dxr[i] += r * (g[i] * w[i]) - xr[i] * c;
      dw[i] += g[i] * (xr[i] * r);
    }
  }
}

/* ------------------------------------------------------------------ RoPE, in place on x[B, T, nh, E] */
static void ISA_FN(rope_rotate)(float *x, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh, int64_t E,
                                float sg) {
  const int64_t h = E / 2;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      const float *c = cs + t * h, *s = sn + t * h;
      for (int64_t j = 0; j < nh; j++) {
        float *p = x + ((b * T + t) * nh + j) * E;
        for (int64_t i = 0; i < h; i++) {
          const float x0 = p[i], x1 = p[i + h], si = sg * s[i];
          p[i] = x0 * c[i] - x1 * si;
          p[i + h] = x1 * c[i] + x0 * si;
        }
      }
    }
}

/* ------------------------------------------------------------------ SwiGLU: out = silu(gate) * up */
/* out = g / (1 + exp(-g)) * u, one vector */
static inline void ISA_FN(swiglu_f1)(float *out, const float *g, const float *u) {
  const vf x = VLOAD(g), e = ISA_FN(vexp_sub)(VSUB(VSET(0), x), 0.0f);
  VSTORE(out, VMUL(VDIV(x, VADD(VSET(1), e)), VLOAD(u)));
}

static void ISA_FN(swiglu_forward)(float *out, const float *g, const float *u, int64_t n) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) ISA_FN(swiglu_f1)(out + i, g + i, u + i);
  if (i < n) {
    float tg[VW], tu[VW], to[VW];
    ISA_FN(pad)(tg, g + i, n - i);
    ISA_FN(pad)(tu, u + i, n - i);
    ISA_FN(swiglu_f1)(to, tg, tu);
    memcpy(out + i, to, (size_t)(n - i) * sizeof(float));
  }
}

/* sig = 1 / (1 + exp(-g)): du = dout * (g sig), dg = (dout u) (sig (1 + g (1 - sig))), one vector; everything read
 * before anything is written (dg / du may alias dout) */
static inline void ISA_FN(swiglu_b1)(float *dg, float *du, const float *dout, const float *g, const float *u) {
  const vf x = VLOAD(g), d = VLOAD(dout), up = VLOAD(u), one = VSET(1);
  const vf sig = VDIV(one, VADD(one, ISA_FN(vexp_sub)(VSUB(VSET(0), x), 0.0f)));
  VSTORE(du, VMUL(d, VMUL(x, sig)));
  VSTORE(dg, VMUL(VMUL(d, up), VMUL(sig, VADD(one, VMUL(x, VSUB(one, sig))))));
}

static void ISA_FN(swiglu_backward)(float *dg, float *du, const float *dout, const float *g, const float *u,
                                    int64_t n) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) ISA_FN(swiglu_b1)(dg + i, du + i, dout + i, g + i, u + i);
  if (i < n) {
    float tg[VW], tu[VW], td[VW], rg[VW], ru[VW];
    ISA_FN(pad)(tg, g + i, n - i);
    ISA_FN(pad)(tu, u + i, n - i);
    ISA_FN(pad)(td, dout + i, n - i);
    ISA_FN(swiglu_b1)(rg, ru, td, tg, tu);
    memcpy(dg + i, rg, (size_t)(n - i) * sizeof(float));
    memcpy(du + i, ru, (size_t)(n - i) * sizeof(float));
  }
}

/* ------------------------------------------------------------------ cross-entropy (forward and backward in one) */
static double ISA_FN(cross_entropy)(float *lg, const int32_t *tg, int64_t rows, int64_t V, double gradScale) {
  double loss = 0;
  for (int64_t r = 0; r < rows; r++) {
    float *x = lg + r * V;
    const int32_t t = tg[r];
    if (t < 0) {
      if (gradScale > 0) memset(x, 0, (size_t)V * sizeof(float));
      continue;
    }
    if (V == 0) continue;
    const float mx = max_f32(x, V);
    const double xt = x[t];
    double sum = 0;
    if (gradScale > 0) { /* the exp and its sum in one pass, then the scaling in double */
      sum = ISA_FN(exp_sum_row)(x, V, mx);
      const double k = gradScale / sum;
      for (int64_t i = 0; i < V; i++) x[i] = (float)((double)x[i] * k);
      x[t] = (float)((double)x[t] - gradScale);
    } else { /* evaluation: the logits stay as they are; exp in blocks through a small buffer */
      float e[1024];
      for (int64_t i0 = 0; i0 < V; i0 += 1024) {
        const int64_t m = V - i0 < 1024 ? V - i0 : 1024;
        memcpy(e, x + i0, (size_t)m * sizeof(float));
        sum += ISA_FN(exp_sum_row)(e, m, mx);
      }
    }
    loss += (double)mx + log_f64(sum) - xt;
  }
  return loss;
}

/* ------------------------------------------------------------------ attention's softmax pieces (ops/attention.c) */
/* p = exp(s - lse) into s and ds = p (dp - d) scale, over one row's c visible keys */
static inline void ISA_FN(softmax_grad_1)(float *s, float *ds, const float *dp, float lse, float d, float scale) {
  const vf p = ISA_FN(vexp_sub)(VLOAD(s), lse);
  VSTORE(s, p);
  VSTORE(ds, VMUL(VMUL(p, VSUB(VLOAD(dp), VSET(d))), VSET(scale)));
}

static void ISA_FN(softmax_grad_row)(float *s, float *ds, const float *dp, int64_t c, float lse, float d, float scale) {
  int64_t u = 0;
  for (; u + VW <= c; u += VW) ISA_FN(softmax_grad_1)(s + u, ds + u, dp + u, lse, d, scale);
  if (u < c) {
    float ts[VW], td[VW], tp[VW];
    ISA_FN(pad)(ts, s + u, c - u);
    ISA_FN(pad)(tp, dp + u, c - u);
    ISA_FN(softmax_grad_1)(ts, td, tp, lse, d, scale);
    memcpy(s + u, ts, (size_t)(c - u) * sizeof(float));
    memcpy(ds + u, td, (size_t)(c - u) * sizeof(float));
  }
}

/* the macros the including file defined for this copy: undefined, so the next copy defines its own */
#undef ISA_FN
#undef VW
#undef vf
#undef VLOAD
#undef VSTORE
#undef VSET
#undef VMAX
#undef VMIN
#undef VFMA
#undef VADD
#undef VSUB
#undef VMUL
#undef VDIV
#undef VPOW2
#undef VACC
#undef VACC_ZERO
#undef VACC_ADD
#undef VACC_STORE
