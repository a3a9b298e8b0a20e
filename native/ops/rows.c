/*
 * The row-wise kernels: embedding, RMSNorm, RoPE, SwiGLU, cross-entropy, one forward and one backward per op side by
 * side (the maths only, on raw pointers and sizes; engine.h).
 */
#include "../engine.h"

/* -------------------------------------------------- embedding: out[n] = E[ids[n]]; dE[ids[n]] += dout[n] */
void embedding_forward(float *out, const int32_t *ids, const float *E, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; n++) memcpy(out + n * D, E + (int64_t)ids[n] * D, (size_t)D * sizeof(float));
}

KERNEL_CLONES void embedding_backward(float *dE, const int32_t *ids, const float *dout, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; n++) {
    float *dst = dE + (int64_t)ids[n] * D;
    const float *src = dout + n * D;
    for (int64_t i = 0; i < D; i++) dst[i] += src[i];
  }
}

/* ------------------------------------------------ RMSNorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) */
KERNEL_CLONES void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t D,
                                   double eps) {
  for (int64_t n = 0; n < N; n++) {
    const float *xr = x + n * D;
    float *o = out + n * D;
    const double ss = dot_f64(xr, xr, D);
    float r = (float)(1.0 / sqrt(ss / (double)D + eps));
    rstd[n] = r;
    for (int64_t i = 0; i < D; i++) o[i] = (xr[i] * r) * w[i];
  }
}

/* dx += the input gradient, dw += the weight gradient (both accumulate) */
KERNEL_CLONES void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                    const float *rstd, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; n++) {
    const float *xr = x + n * D, *g = dout + n * D;
    float *dxr = dx + n * D;
    const float r = rstd[n];
    const double dot = dot3_f64(g, w, xr, D); /* sum_i dout_i * w_i * x_i */
    /* dx_i = r * (dout_i w_i) - x_i * r^3 * dot / D */
    const float c = (float)((double)r * (double)r * (double)r * dot / (double)D);
    for (int64_t i = 0; i < D; i++) {
      dxr[i] += r * (g[i] * w[i]) - xr[i] * c;
      dw[i] += g[i] * (xr[i] * r);
    }
  }
}

/* ------------------------------------------------------------------ RoPE, in place on x[B, T, nh, E] */
/* The forward rotates each (i, i + E/2) pair by +theta_t,i; the backward (its adjoint) by -theta_t,i. */
KERNEL_CLONES static void rope_rotate(float *x, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh,
                                      int64_t E, float sg) {
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

void rope_forward(float *x, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh, int64_t E) {
  rope_rotate(x, cs, sn, B, T, nh, E, 1.0f);
}

void rope_backward(float *dx, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh, int64_t E) {
  rope_rotate(dx, cs, sn, B, T, nh, E, -1.0f);
}

/* ------------------------------------------------------------------ SwiGLU: out = silu(gate) * up */
KERNEL_CLONES void swiglu_forward(float *out, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + exp_ps(-g[i])) * u[i];
}

KERNEL_CLONES void swiglu_backward(float *dg, float *du, const float *dout, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float x = g[i], sig = 1.0f / (1.0f + exp_ps(-x)), d = dout[i];
    /* read everything before writing: dgate/dup may alias dout in a caller that works in place */
    const float up = u[i];
    du[i] = d * (x * sig);
    dg[i] = d * up * (sig * (1.0f + x * (1.0f - sig)));
  }
}

/* ------------------------------------------------------------------ cross-entropy (forward and backward in one) */
/* Returns the summed loss over rows whose target is >= 0 (target -1: ignored). With gradScale > 0 the logits are
 * replaced by gradScale * (softmax - onehot) (ignored rows: 0); with gradScale = 0 they are left as they are. */
KERNEL_CLONES double cross_entropy(float *lg, const int32_t *tg, int64_t rows, int64_t V, double gradScale) {
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
    if (gradScale > 0) {
      for (int64_t i = 0; i < V; i++) x[i] = exp_ps(x[i] - mx);
      sum = sum_f64(x, V);
      const double k = gradScale / sum;
      for (int64_t i = 0; i < V; i++) x[i] = (float)((double)x[i] * k);
      x[t] = (float)((double)x[t] - gradScale);
    } else { /* evaluation: the logits stay as they are; exp in blocks through a small buffer */
      float e[1024];
      for (int64_t i0 = 0; i0 < V; i0 += 1024) {
        const int64_t m = V - i0 < 1024 ? V - i0 : 1024;
        for (int64_t i = 0; i < m; i++) e[i] = exp_ps(x[i0 + i] - mx);
        sum += sum_f64(e, m);
      }
    }
    loss += (double)mx + log(sum) - xt;
  }
  return loss;
}
