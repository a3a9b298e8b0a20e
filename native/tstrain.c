/*
 * tstrain's native CPU engine: the Kernels interface of src/model/kernels.ts in C, as a Node-API addon.
 *
 * The file reads top to bottom as llm.c does: the matrix-product dispatch and the deterministic helpers, then
 * the kernels as plain static C functions, one forward and one backward per op side by side (the maths only,
 * on raw pointers and sizes), then the Node-API layer: argument checks and a thin wrapper per kernel, and the
 * table of exported names at the end.
 *
 * Matrix products run on the built-in GEMM (native/gemm/: one summation order on every CPU) or on a BLAS
 * (cblas_sgemm) found at RUN time with dlopen/dlsym (loadBlas): the addon has no link-time dependency on any
 * BLAS, so it builds where OpenBLAS is not installed. The other kernels are plain C that the compiler vectorises
 * (-O3, -ffp-contract=off, never -ffast-math: every kernel is deterministic, bit-identical run to run; sums
 * that need it run in double, in a fixed order).
 *
 * Every Float32Array / Int32Array is read in place through napi_get_typedarray_info (ArrayBuffer,
 * SharedArrayBuffer, subarray views alike): no copies. Each wrapper checks the arrays' types and that they are
 * long enough for the shapes it was given, and throws a RangeError/TypeError before any kernel touches memory.
 */
#define NAPI_VERSION 8
#include <node_api.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "peak.h"

/* ------------------------------------------------------------------ matrix products: the built-in GEMM or a BLAS */
enum { CblasRowMajor = 101 };
enum { CblasNoTrans = 111, CblasTrans = 112 };
typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*set_threads_fn)(int);
typedef char *(*get_config_fn)(void);
typedef int (*get_threads_fn)(void);

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;
static sgemm_fn blas_sgemm = NULL; /* process-wide: every worker thread's instance of the addon shares it */
static char blas_path[1024];
static char blas_config[512];
static int blas_threads = -1;

/* Which GEMM this thread's products run on (setGemm): the built-in one (native/gemm/) on gemm_kernel, or the
 * BLAS loaded by loadBlas; and in which precision: fp32, or (built-in only) bf16 operands with fp32 accumulation
 * (gemm.h: gemm_bf16), on the AMX kernel when gemm_bf16_hw, else on gemm_kernel's emulation. Per thread,
 * so each rank (and a test comparing kernels) chooses for itself. */
enum { GEMM_BUILTIN = 0, GEMM_BLAS = 1 };
static __thread int gemm_kind = GEMM_BUILTIN;
static __thread gemm_isa gemm_kernel = GEMM_ISA_AUTO;
static __thread int gemm_bf16_mode = 0;
static __thread int gemm_bf16_hw = 0;

/* Returns 0, or -1 when the built-in GEMM could not allocate its packing buffers (C untouched). In bf16 every
 * product is called with alpha 1 (the model's linears, attention's products); matmul's wrapper refuses others. */
static inline int sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                        int ldb, float beta, float *c, int ldc) {
  if (gemm_bf16_mode) return gemm_bf16(gemm_kernel, gemm_bf16_hw, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
  if (gemm_kind == GEMM_BUILTIN) return gemm_sgemm(gemm_kernel, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  blas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
             ldb, beta, c, ldc);
  return 0;
}

/* ------------------------------------------------------------------ vectorisable helpers (deterministic) */
/* Reductions run in LANES independent partial sums combined in a fixed order, so the compiler vectorises
 * them without -ffast-math's reassociation and the result is the same on every run. */
#define LANES 8

/* The kernels below are compiled for three targets and the widest the CPU runs is picked when the addon loads
 * (x86-64: AVX-512, AVX2+FMA, baseline SSE2): the same operations in the same order on every one (no FMA
 * contraction, the reductions' fixed lanes), so the same bits; only the vector width differs. */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KERNEL_CLONES
#endif

static inline double sum_f64(const float *restrict x, int64_t n) {
  double acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) acc[j] += (double)x[i + j];
  double s = 0;
  for (int j = 0; j < LANES; j++) s += acc[j];
  for (; i < n; i++) s += (double)x[i];
  return s;
}

static inline double dot_f64(const float *restrict a, const float *restrict b, int64_t n) {
  double acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) acc[j] += (double)a[i + j] * (double)b[i + j];
  double s = 0;
  for (int j = 0; j < LANES; j++) s += acc[j];
  for (; i < n; i++) s += (double)a[i] * (double)b[i];
  return s;
}

/* sum_i (a_i * b_i) * c_i, the product a*b rounded to float first (as the kernels use it) */
static inline double dot3_f64(const float *restrict a, const float *restrict b, const float *restrict c, int64_t n) {
  double acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) acc[j] += (double)(a[i + j] * b[i + j]) * (double)c[i + j];
  double s = 0;
  for (int j = 0; j < LANES; j++) s += acc[j];
  for (; i < n; i++) s += (double)(a[i] * b[i]) * (double)c[i];
  return s;
}

static inline float max_f32(const float *restrict x, int64_t n) {
  float m = x[0];
  int64_t i = 1;
  if (n >= 2 * LANES) {
    float acc[LANES];
    for (int j = 0; j < LANES; j++) acc[j] = x[j];
    for (i = LANES; i + LANES <= n; i += LANES)
      for (int j = 0; j < LANES; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    m = acc[0];
    for (int j = 1; j < LANES; j++) m = acc[j] > m ? acc[j] : m;
  }
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

/* exp(x) in float, Cephes' expf polynomial (relative error ~2e-7), written so that loops over it vectorise
 * (libm's expf is a call the compiler cannot vectorise without -ffast-math). Inputs are clamped to
 * [-87, 88]: below, the result is ~1.6e-38 instead of a denormal or 0, which no sum here can see. */
static inline float exp_ps(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float sc;
  memcpy(&sc, &bits, sizeof sc);
  return y * sc;
}

/* ================================================================== the kernels (maths only) */
/* Each returns 0, or GEMM_NOMEM when the built-in GEMM (or a scratch buffer) could not be allocated. */
enum { GEMM_NOMEM = -1 };

/* ------------------------------------------------------------------ matmul: C = alpha * op(A) @ op(B) + beta * C */
static int matmul(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A, const float *B,
                  float beta, float *C) {
  if (M == 0 || N == 0) return 0;
  if (K == 0) { /* C = beta*C, with beta = 0 ignoring C's old contents */
    for (int64_t i = 0; i < M * N; i++) C[i] = beta == 0 ? 0.0f : beta * C[i];
    return 0;
  }
  return sgemm(transA, transB, (int)M, (int)N, (int)K, alpha, A, transA ? (int)M : (int)K, B, transB ? (int)K : (int)N,
               beta, C, (int)N)
             ? GEMM_NOMEM
             : 0;
}

/* -------------------------------------------------- embedding: out[n] = E[ids[n]]; dE[ids[n]] += dout[n] */
static void embedding_forward(float *out, const int32_t *ids, const float *E, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; n++) memcpy(out + n * D, E + (int64_t)ids[n] * D, (size_t)D * sizeof(float));
}

KERNEL_CLONES static void embedding_backward(float *dE, const int32_t *ids, const float *dout, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; n++) {
    float *dst = dE + (int64_t)ids[n] * D;
    const float *src = dout + n * D;
    for (int64_t i = 0; i < D; i++) dst[i] += src[i];
  }
}

/* ------------------------------------------------ RMSNorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) */
KERNEL_CLONES static void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t D,
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
KERNEL_CLONES static void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
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

static void rope_forward(float *x, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh, int64_t E) {
  rope_rotate(x, cs, sn, B, T, nh, E, 1.0f);
}

static void rope_backward(float *dx, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh, int64_t E) {
  rope_rotate(dx, cs, sn, B, T, nh, E, -1.0f);
}

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

KERNEL_CLONES static int attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                                           int64_t B, int64_t T, int64_t H, int64_t K, int64_t E) {
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
KERNEL_CLONES static int attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                            const float *k, const float *v, const float *att, int64_t B, int64_t T,
                                            int64_t H, int64_t K, int64_t E) {
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
static void attention_cached(float *out, const float *q, const float *kc, const float *vc, int64_t P, int64_t T,
                             int64_t H, int64_t K, int64_t E, float *sc, double *acc) {
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

/* ------------------------------------------------------------------ SwiGLU: out = silu(gate) * up */
KERNEL_CLONES static void swiglu_forward(float *out, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + exp_ps(-g[i])) * u[i];
}

KERNEL_CLONES static void swiglu_backward(float *dg, float *du, const float *dout, const float *g, const float *u,
                                          int64_t n) {
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
KERNEL_CLONES static double cross_entropy(float *lg, const int32_t *tg, int64_t rows, int64_t V, double gradScale) {
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

/* ================================================================== the Node-API layer */
/* ------------------------------------------------------------------ argument checks */
#define CHECK_NAPI(call)                                                                                               \
  do {                                                                                                                 \
    if ((call) != napi_ok) {                                                                                           \
      napi_throw_error(env, NULL, "tstrain native: a Node-API call failed (" #call ")");                               \
      return NULL;                                                                                                     \
    }                                                                                                                  \
  } while (0)

static int throw_range(napi_env env, const char *fn, const char *what) {
  char msg[300];
  snprintf(msg, sizeof msg, "tstrain native %s: %s", fn, what);
  napi_throw_range_error(env, NULL, msg);
  return 0;
}

/* A typed array of the given type with at least `need` elements; returns 0 (and throws) otherwise. */
static int get_array(napi_env env, napi_value v, napi_typedarray_type want, size_t need, void **data, const char *fn,
                     const char *name) {
  napi_typedarray_type t; /* napi_get_typedarray_info fails (napi_invalid_arg) on anything but a typed array */
  size_t len = 0;
  if (napi_get_typedarray_info(env, v, &t, &len, data, NULL, NULL) != napi_ok || t != want) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a %s", fn, name,
             want == napi_float32_array ? "Float32Array" : "Int32Array");
    napi_throw_type_error(env, NULL, msg);
    return 0;
  }
  if (len < need) {
    char msg[300];
    snprintf(msg, sizeof msg, "tstrain native %s: %s has %zu elements, the shapes need %zu", fn, name, len, need);
    napi_throw_range_error(env, NULL, msg);
    return 0;
  }
  if (need > 0 && *data == NULL) return throw_range(env, fn, "a detached array");
  return 1;
}

/* A whole number in [0, 2^31): a dimension. */
static int get_dim(napi_env env, napi_value v, int64_t *out, const char *fn, const char *name) {
  double d;
  if (napi_get_value_double(env, v, &d) != napi_ok || !(d >= 0 && d < 2147483648.0) || d != floor(d)) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a whole number in [0, 2^31)", fn, name);
    napi_throw_range_error(env, NULL, msg);
    return 0;
  }
  *out = (int64_t)d;
  return 1;
}

static int get_num(napi_env env, napi_value v, double *out, const char *fn, const char *name) {
  if (napi_get_value_double(env, v, out) != napi_ok) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a number", fn, name);
    napi_throw_type_error(env, NULL, msg);
    return 0;
  }
  return 1;
}

static int get_bool(napi_env env, napi_value v, bool *out, const char *fn, const char *name) {
  if (napi_get_value_bool(env, v, out) != napi_ok) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a boolean", fn, name);
    napi_throw_type_error(env, NULL, msg);
    return 0;
  }
  return 1;
}

#define ARGS(n)                                                                                                        \
  size_t argc = (n);                                                                                                   \
  napi_value argv[(n) > 0 ? (n) : 1];                                                                                  \
  CHECK_NAPI(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));                                                    \
  if (argc < (n)) {                                                                                                    \
    napi_throw_type_error(env, NULL, "tstrain native: too few arguments");                                             \
    return NULL;                                                                                                       \
  }

/* In every wrapper `fn` names the kernel for the error messages (static const char fn[] = "...";). */
static int throw_error(napi_env env, const char *fn, const char *what) {
  char msg[300];
  snprintf(msg, sizeof msg, "tstrain native %s: %s", fn, what);
  napi_throw_error(env, NULL, msg);
  return 0;
}
#define NEED_BLAS()                                                                                                    \
  if (gemm_kind == GEMM_BLAS && !blas_sgemm) {                                                                         \
    throw_error(env, fn, "no BLAS loaded (call loadBlas first)");                                                      \
    return NULL;                                                                                                       \
  }
#define GEMM_OOM()                                                                                                     \
  do {                                                                                                                 \
    throw_error(env, fn, "out of memory for the GEMM's packing buffers");                                              \
    return NULL;                                                                                                       \
  } while (0)

#define F32(i, ptr, need, name)                                                                                        \
  if (!get_array(env, argv[i], napi_float32_array, (size_t)(need), (void **)&(ptr), fn, name)) return NULL
#define I32(i, ptr, need, name)                                                                                        \
  if (!get_array(env, argv[i], napi_int32_array, (size_t)(need), (void **)&(ptr), fn, name)) return NULL
#define DIM(i, var)                                                                                                    \
  int64_t var;                                                                                                         \
  if (!get_dim(env, argv[i], &var, fn, #var)) return NULL
#define NUM(i, var)                                                                                                    \
  double var;                                                                                                          \
  if (!get_num(env, argv[i], &var, fn, #var)) return NULL
#define BOOL(i, var)                                                                                                   \
  bool var;                                                                                                            \
  if (!get_bool(env, argv[i], &var, fn, #var)) return NULL

/* ------------------------------------------------------------------ engine setup: loadBlas, simd, setGemm, gemmPeak */
/* loadBlas(paths: string[]) */
/* Tries each path with dlopen; the first that has cblas_sgemm wins. Returns { ok, path, config, threads, tried }:
 * tried = one "path: reason" per failed candidate. Once loaded, later calls return the loaded library. */
static napi_value set_str(napi_env env, napi_value obj, const char *key, const char *s) {
  napi_value v;
  napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &v);
  napi_set_named_property(env, obj, key, v);
  return obj;
}

static napi_value LoadBlas(napi_env env, napi_callback_info info) {
  ARGS(1);
  uint32_t n = 0;
  bool is_arr = false;
  CHECK_NAPI(napi_is_array(env, argv[0], &is_arr));
  if (!is_arr) {
    napi_throw_type_error(env, NULL, "tstrain native loadBlas: expects an array of library paths");
    return NULL;
  }
  CHECK_NAPI(napi_get_array_length(env, argv[0], &n));
  char tried[8192];
  tried[0] = 0;
  pthread_mutex_lock(&blas_lock);
  for (uint32_t i = 0; i < n && !blas_sgemm; i++) {
    napi_value e;
    char path[1024];
    size_t len = 0;
    if (napi_get_element(env, argv[0], i, &e) != napi_ok ||
        napi_get_value_string_utf8(env, e, path, sizeof path, &len) != napi_ok || len == 0)
      continue;
    /* OpenBLAS sizes its thread pool when it loads: ask for one thread so no idle pool is started (each rank is
     * one thread; openblas_set_num_threads(1) below pins it in any case). The variable is put back afterwards
     * so child processes (the bench's PyTorch) inherit the environment they had. */
    const char *prev = getenv("OPENBLAS_NUM_THREADS");
    char *saved = prev ? strdup(prev) : NULL;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (saved) {
      setenv("OPENBLAS_NUM_THREADS", saved, 1);
      free(saved);
    } else unsetenv("OPENBLAS_NUM_THREADS");
    char reason[1700];
    if (!h) {
      const char *err = dlerror();
      if (err && strncmp(err, path, strlen(path)) == 0) snprintf(reason, sizeof reason, "%s", err);
      else snprintf(reason, sizeof reason, "%s: %s", path, err ? err : "dlopen failed");
    } else {
      sgemm_fn f = (sgemm_fn)dlsym(h, "cblas_sgemm");
      if (!f) {
        snprintf(reason, sizeof reason, "%s: loads but has no cblas_sgemm", path);
        dlclose(h);
      } else {
        set_threads_fn st = (set_threads_fn)dlsym(h, "openblas_set_num_threads");
        get_config_fn gc = (get_config_fn)dlsym(h, "openblas_get_config");
        get_threads_fn gt = (get_threads_fn)dlsym(h, "openblas_get_num_threads");
        if (st) st(1);
        blas_threads = gt ? gt() : -1;
        snprintf(blas_path, sizeof blas_path, "%s", path);
        if (gc) {
          const char *c = gc();
          snprintf(blas_config, sizeof blas_config, "%s", c ? c : "OpenBLAS");
        } else {
          snprintf(blas_config, sizeof blas_config, "a CBLAS without openblas_get_config (threads %s)",
                   st ? "pinned to 1" : "not pinned");
        }
        blas_sgemm = f; /* the handle stays open for the life of the process */
        reason[0] = 0;
      }
    }
    if (reason[0]) {
      size_t l = strlen(tried);
      snprintf(tried + l, sizeof tried - l, "%s%s", l ? "; " : "", reason);
    }
  }
  int ok = blas_sgemm != NULL;
  pthread_mutex_unlock(&blas_lock);
  napi_value obj, b, th;
  CHECK_NAPI(napi_create_object(env, &obj));
  napi_get_boolean(env, ok, &b);
  napi_set_named_property(env, obj, "ok", b);
  set_str(env, obj, "path", ok ? blas_path : "");
  set_str(env, obj, "config", ok ? blas_config : "");
  napi_create_int32(env, blas_threads, &th);
  napi_set_named_property(env, obj, "threads", th);
  set_str(env, obj, "tried", tried);
  return obj;
}

/* Which build of the C kernels this CPU runs (the backend line). */
static napi_value Simd(napi_env env, napi_callback_info info) {
  (void)info;
  const char *s =
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
      /* the KERNEL_CLONES target the loader picked (GCC's resolver tests the same levels) */
      __builtin_cpu_supports("x86-64-v4")   ? "AVX-512 (x86-64-v4)"
      : __builtin_cpu_supports("x86-64-v3") ? "AVX2+FMA (x86-64-v3)"
                                            : "SSE2 (x86-64)";
#elif defined(__ARM_NEON) || defined(__aarch64__)
      "NEON";
#else
      "scalar";
#endif
  napi_value v;
  napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &v);
  return v;
}

/* ------------------------------------------------------------------ setGemm(kind, isa, precision) */
/* Chooses this thread's GEMM: kind "builtin" (native/gemm/) with isa "auto" | "avx512" | "avx2" | "portable", or
 * "blas" (the library loadBlas found; isa ignored); precision "fp32" (default) or "bf16" (built-in only: gemm_bf16,
 * isa "amx" the AMX-BF16 kernel, "auto" that kernel where the CPU has it, the others the emulation on
 * their fp32 kernel: the same bits). Throws a RangeError for an unknown name, an instruction set this CPU lacks,
 * bf16 on a BLAS, or "blas" before a BLAS is loaded. Returns { kind, isa, detail, best, supported, precision }. */
static napi_value SetGemm(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  CHECK_NAPI(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  char kind[32] = {0}, isa[32] = {0}, prec[32] = "fp32";
  size_t len = 0;
  if (argc < 2 || napi_get_value_string_utf8(env, argv[0], kind, sizeof kind, &len) != napi_ok ||
      napi_get_value_string_utf8(env, argv[1], isa, sizeof isa, &len) != napi_ok ||
      (argc > 2 && napi_get_value_string_utf8(env, argv[2], prec, sizeof prec, &len) != napi_ok)) {
    napi_throw_type_error(env, NULL, "tstrain native setGemm: expects two or three strings (kind, isa, precision)");
    return NULL;
  }
  const int bf16 = strcmp(prec, "bf16") == 0;
  if (!bf16 && strcmp(prec, "fp32") != 0) {
    throw_range(env, "setGemm", "precision must be fp32 or bf16");
    return NULL;
  }
  const gemm_isa best = gemm_best_isa();
  int hw = 0;
  if (strcmp(kind, "blas") == 0) {
    if (bf16) {
      throw_range(env, "setGemm", "bf16 runs on the built-in GEMM only");
      return NULL;
    }
    if (!blas_sgemm) {
      throw_range(env, "setGemm", "no BLAS loaded (call loadBlas first)");
      return NULL;
    }
    gemm_kind = GEMM_BLAS;
  } else if (strcmp(kind, "builtin") == 0) {
    gemm_isa want;
    if (strcmp(isa, "auto") == 0) {
      want = best;
      hw = bf16 && gemm_bf16_hw_supported();
    } else if (strcmp(isa, "amx") == 0 && bf16) {
      if (!gemm_bf16_hw_supported()) {
        throw_range(env, "setGemm", "this CPU does not have that instruction set");
        return NULL;
      }
      want = GEMM_ISA_AVX512;
      hw = 1;
    } else if (strcmp(isa, "avx512") == 0) want = GEMM_ISA_AVX512;
    else if (strcmp(isa, "avx2") == 0) want = GEMM_ISA_AVX2;
    else if (strcmp(isa, "portable") == 0) want = GEMM_ISA_PORTABLE;
    else {
      throw_range(
          env, "setGemm",
          bf16 ? "isa must be auto, amx, avx512, avx2 or portable" : "isa must be auto, avx512, avx2 or portable");
      return NULL;
    }
    if (!gemm_isa_supported(want)) {
      throw_range(env, "setGemm", "this CPU does not have that instruction set");
      return NULL;
    }
    gemm_kind = GEMM_BUILTIN;
    gemm_kernel = want;
  } else {
    throw_range(env, "setGemm", "kind must be builtin or blas");
    return NULL;
  }
  gemm_bf16_mode = bf16;
  gemm_bf16_hw = hw;
  napi_value obj, sup;
  CHECK_NAPI(napi_create_object(env, &obj));
  set_str(env, obj, "kind", gemm_kind == GEMM_BLAS ? "blas" : "builtin");
  set_str(env, obj, "isa", gemm_kind == GEMM_BLAS ? "" : hw ? "amx" : gemm_isa_name(gemm_kernel));
  set_str(env, obj, "detail",
          gemm_kind == GEMM_BLAS ? blas_config
          : hw                   ? "AMX-BF16 32x32 (TDPBF16PS)"
                                 : gemm_isa_detail(gemm_kernel));
  set_str(env, obj, "best", gemm_isa_name(best));
  set_str(env, obj, "precision", bf16 ? "bf16" : "fp32");
  CHECK_NAPI(napi_create_array(env, &sup));
  uint32_t n = 0;
  if (bf16 && gemm_bf16_hw_supported()) {
    napi_value v;
    napi_create_string_utf8(env, "amx", NAPI_AUTO_LENGTH, &v);
    napi_set_element(env, sup, n++, v);
  }
  for (int i = GEMM_ISA_AVX512; i >= GEMM_ISA_PORTABLE; i--)
    if (gemm_isa_supported((gemm_isa)i)) {
      napi_value v;
      napi_create_string_utf8(env, gemm_isa_name((gemm_isa)i), NAPI_AUTO_LENGTH, &v);
      napi_set_element(env, sup, n++, v);
    }
  napi_set_named_property(env, obj, "supported", sup);
  return obj;
}

/* gemmPeak(isa, iters): GFLOP/s of this core's register-only FMA loop for that kernel's instruction set (bench);
 * "amx": the TDPBF16PS loop. */
static napi_value GemmPeak(napi_env env, napi_callback_info info) {
  ARGS(2);
  char isa[32] = {0};
  size_t len = 0;
  double iters = 0;
  if (napi_get_value_string_utf8(env, argv[0], isa, sizeof isa, &len) != napi_ok ||
      napi_get_value_double(env, argv[1], &iters) != napi_ok || !(iters >= 1)) {
    napi_throw_type_error(env, NULL, "tstrain native gemmPeak: expects (isa, iters >= 1)");
    return NULL;
  }
  gemm_isa want = strcmp(isa, "avx512") == 0     ? GEMM_ISA_AVX512
                  : strcmp(isa, "avx2") == 0     ? GEMM_ISA_AVX2
                  : strcmp(isa, "portable") == 0 ? GEMM_ISA_PORTABLE
                                                 : GEMM_ISA_AUTO;
  napi_value v;
  CHECK_NAPI(napi_create_double(
      env, strcmp(isa, "amx") == 0 ? gemm_bf16_peak((int64_t)iters) : gemm_fma_peak(want, (int64_t)iters), &v));
  return v;
}

/* ------------------------------------------------------------------ the kernels' wrappers */
/* gemm(isa, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc[, calls]): the built-in GEMM on one
 * kernel with leading dimensions, whatever this thread's setGemm says (tests and the bench compare kernels with it).
 * With calls (the bench), the product runs that many times back to back and the call returns this thread's CPU
 * seconds for them: the time the products ran, as the trainer calls them from C, without the call from JS.
 * gemmBf16(...): the same on bf16 operands (gemm.h: gemm_bf16), alpha 1; isa "amx" is the AMX-BF16 kernel,
 * the others the emulation on that kernel. */
static napi_value gemm_call(napi_env env, napi_callback_info info, int bf16) {
  const char *fn = bf16 ? "gemmBf16" : "gemm";
  size_t argc = 15;
  napi_value argv[15];
  CHECK_NAPI(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 14) {
    napi_throw_type_error(env, NULL, "tstrain native: too few arguments");
    return NULL;
  }
  double calls = 0;
  if (argc > 14 && (napi_get_value_double(env, argv[14], &calls) != napi_ok || !(calls >= 1 && calls <= 1e6))) {
    throw_range(env, fn, "calls must be a number from 1 to 1e6");
    return NULL;
  }
  char isa[32] = {0};
  size_t len = 0;
  if (napi_get_value_string_utf8(env, argv[0], isa, sizeof isa, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "tstrain native gemm: isa must be a string");
    return NULL;
  }
  const int hw = bf16 && strcmp(isa, "amx") == 0;
  const gemm_isa want = hw || strcmp(isa, "avx512") == 0 ? GEMM_ISA_AVX512
                        : strcmp(isa, "avx2") == 0       ? GEMM_ISA_AVX2
                        : strcmp(isa, "portable") == 0   ? GEMM_ISA_PORTABLE
                                                         : GEMM_ISA_AUTO;
  if (want == GEMM_ISA_AUTO && strcmp(isa, "auto") != 0) {
    throw_range(
        env, fn,
        bf16 ? "isa must be auto, amx, avx512, avx2 or portable" : "isa must be auto, avx512, avx2 or portable");
    return NULL;
  }
  if (!gemm_isa_supported(want == GEMM_ISA_AUTO ? gemm_best_isa() : want) || (hw && !gemm_bf16_hw_supported())) {
    throw_range(env, fn, "this CPU does not have that instruction set");
    return NULL;
  }
  BOOL(1, transA);
  BOOL(2, transB);
  DIM(3, M);
  DIM(4, N);
  DIM(5, K);
  NUM(6, alpha);
  DIM(8, lda);
  DIM(10, ldb);
  DIM(13, ldc);
  NUM(11, beta);
  const int64_t ar = transA ? K : M, ac = transA ? M : K, br = transB ? N : K, bc = transB ? K : N;
  if (lda < ac || ldb < bc || ldc < N || lda < 1 || ldb < 1 || ldc < 1) {
    throw_range(env, fn, "a leading dimension is smaller than its row");
    return NULL;
  }
  float *A, *Bm, *C;
  F32(7, A, ar > 0 ? (ar - 1) * lda + ac : 0, "A");
  F32(9, Bm, br > 0 ? (br - 1) * ldb + bc : 0, "B");
  F32(12, C, M > 0 ? (M - 1) * ldc + N : 0, "C");
  if (bf16 && alpha != 1.0) {
    throw_range(env, fn, "alpha must be 1");
    return NULL;
  }
  const double t0 = gemm_thread_seconds();
  for (int64_t i = 0; i < (calls >= 1 ? (int64_t)calls : 1); i++) {
    const int rc = bf16 ? gemm_bf16(want, hw, transA, transB, M, N, K, A, lda, Bm, ldb, (float)beta, C, ldc)
                        : gemm_sgemm(want, transA, transB, M, N, K, (float)alpha, A, lda, Bm, ldb, (float)beta, C, ldc);
    if (rc) GEMM_OOM();
  }
  if (calls < 1) return NULL;
  napi_value v;
  CHECK_NAPI(napi_create_double(env, gemm_thread_seconds() - t0, &v));
  return v;
}
static napi_value Gemm(napi_env env, napi_callback_info info) { return gemm_call(env, info, 0); }
static napi_value GemmBf16(napi_env env, napi_callback_info info) { return gemm_call(env, info, 1); }
/* gemmBf16Hw(): whether this CPU (and OS) has AMX-BF16 (the "amx" kernel of gemmBf16). */
static napi_value GemmBf16Hw(napi_env env, napi_callback_info info) {
  napi_value v;
  CHECK_NAPI(napi_get_boolean(env, gemm_bf16_hw_supported() != 0, &v));
  return v;
}

/* matmul(transA, transB, M, N, K, alpha, A, B, beta, C) */
static napi_value Matmul(napi_env env, napi_callback_info info) {
  static const char fn[] = "matmul";
  ARGS(10);
  NEED_BLAS();
  BOOL(0, transA);
  BOOL(1, transB);
  DIM(2, M);
  DIM(3, N);
  DIM(4, K);
  NUM(5, alpha);
  float *A, *Bm, *C;
  F32(6, A, M * K, "A");
  F32(7, Bm, K * N, "B");
  NUM(8, beta);
  F32(9, C, M * N, "C");
  if (gemm_bf16_mode && alpha != 1.0 && K > 0) {
    throw_range(env, fn, "bf16 products take alpha 1");
    return NULL;
  }
  if (matmul(transA, transB, M, N, K, (float)alpha, A, Bm, (float)beta, C)) GEMM_OOM();
  return NULL;
}

/* A Float32Array of any length (an embedding table, whose row count the ids are checked against); 0 if not. */
static int get_table(napi_env env, napi_value v, float **data, size_t *len, const char *fn, const char *name) {
  bool is = false;
  napi_typedarray_type t;
  void *d = NULL;
  if (napi_is_typedarray(env, v, &is) != napi_ok || !is ||
      napi_get_typedarray_info(env, v, &t, len, &d, NULL, NULL) != napi_ok || t != napi_float32_array) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a Float32Array", fn, name);
    napi_throw_type_error(env, NULL, msg);
    return 0;
  }
  *data = (float *)d;
  return 1;
}

/* bf16Weights(params): the process's weights (gemm.h: gemm_bf16_weights): in bf16 the AMX kernel keeps each product's
 * weight operand packed until bf16WeightsChanged(), which a rank calls after every update of them. */
static napi_value Bf16Weights(napi_env env, napi_callback_info info) {
  static const char fn[] = "bf16Weights";
  ARGS(1);
  float *P;
  size_t n = 0;
  if (!get_table(env, argv[0], &P, &n, fn, "params")) return NULL;
  gemm_bf16_weights(P, (int64_t)n);
  return NULL;
}
static napi_value Bf16WeightsChanged(napi_env env, napi_callback_info info) {
  (void)env, (void)info;
  gemm_bf16_weights_changed();
  return NULL;
}
/* bf16WeightsPrepack(part, parts): remakes this thread's share of the stale weight copies
 * (gemm_bf16_weights_prepack). */
static napi_value Bf16WeightsPrepack(napi_env env, napi_callback_info info) {
  static const char fn[] = "bf16WeightsPrepack";
  ARGS(2);
  DIM(0, part);
  DIM(1, parts);
  gemm_bf16_weights_prepack((int)part, (int)parts);
  return NULL;
}

static int ids_in_rows(napi_env env, const int32_t *ids, int64_t N, int64_t V, const char *fn) {
  for (int64_t n = 0; n < N; n++)
    if (ids[n] < 0 || ids[n] >= V) return throw_range(env, fn, "an id is outside the embedding's rows");
  return 1;
}

/* embeddingForward(out, ids, E, N, D) */
static napi_value EmbeddingForward(napi_env env, napi_callback_info info) {
  static const char fn[] = "embeddingForward";
  ARGS(5);
  DIM(3, N);
  DIM(4, D);
  float *out;
  int32_t *ids;
  F32(0, out, N * D, "out");
  I32(1, ids, N, "ids");
  size_t elen = 0;
  float *E;
  if (!get_table(env, argv[2], &E, &elen, fn, "E")) return NULL;
  if (!ids_in_rows(env, ids, N, D > 0 ? (int64_t)elen / D : 0, fn)) return NULL;
  embedding_forward(out, ids, E, N, D);
  return NULL;
}

/* embeddingBackward(dE, ids, dout, N, D): dE[ids[n]] += dout[n] */
static napi_value EmbeddingBackward(napi_env env, napi_callback_info info) {
  static const char fn[] = "embeddingBackward";
  ARGS(5);
  DIM(3, N);
  DIM(4, D);
  size_t elen = 0;
  float *dE;
  if (!get_table(env, argv[0], &dE, &elen, fn, "dE")) return NULL;
  float *dout;
  int32_t *ids;
  I32(1, ids, N, "ids");
  F32(2, dout, N * D, "dout");
  if (!ids_in_rows(env, ids, N, D > 0 ? (int64_t)elen / D : 0, fn)) return NULL;
  embedding_backward(dE, ids, dout, N, D);
  return NULL;
}

/* rmsnormForward(out, rstd, x, w, N, D, eps) */
static napi_value RmsnormForward(napi_env env, napi_callback_info info) {
  static const char fn[] = "rmsnormForward";
  ARGS(7);
  DIM(4, N);
  DIM(5, D);
  NUM(6, eps);
  float *out, *rstd, *x, *w;
  F32(0, out, N * D, "out");
  F32(1, rstd, N, "rstd");
  F32(2, x, N * D, "x");
  F32(3, w, D, "w");
  rmsnorm_forward(out, rstd, x, w, N, D, eps);
  return NULL;
}

/* rmsnormBackward(dx, dw, dout, x, w, rstd, N, D) */
static napi_value RmsnormBackward(napi_env env, napi_callback_info info) {
  static const char fn[] = "rmsnormBackward";
  ARGS(8);
  DIM(6, N);
  DIM(7, D);
  float *dx, *dw, *dout, *x, *w, *rstd;
  F32(0, dx, N * D, "dx");
  F32(1, dw, D, "dw");
  F32(2, dout, N * D, "dout");
  F32(3, x, N * D, "x");
  F32(4, w, D, "w");
  F32(5, rstd, N, "rstd");
  rmsnorm_backward(dx, dw, dout, x, w, rstd, N, D);
  return NULL;
}

/* ropeForward / ropeBackward(x, cos, sin, B, T, nh, E): in place */
static napi_value rope(napi_env env, napi_callback_info info, int backward) {
  const char *fn = backward ? "ropeBackward" : "ropeForward";
  ARGS(7);
  DIM(3, B);
  DIM(4, T);
  DIM(5, nh);
  DIM(6, E);
  if (E % 2) {
    throw_range(env, fn, "E (head_dim) must be even");
    return NULL;
  }
  float *x, *cs, *sn;
  F32(0, x, B * T * nh * E, "x");
  F32(1, cs, T * (E / 2), "cos");
  F32(2, sn, T * (E / 2), "sin");
  if (backward) rope_backward(x, cs, sn, B, T, nh, E);
  else rope_forward(x, cs, sn, B, T, nh, E);
  return NULL;
}
static napi_value RopeForward(napi_env env, napi_callback_info info) { return rope(env, info, 0); }
static napi_value RopeBackward(napi_env env, napi_callback_info info) { return rope(env, info, 1); }

/* attentionForward(out, att, q, k, v, B, T, H, K, E) */
static napi_value AttentionForward(napi_env env, napi_callback_info info) {
  static const char fn[] = "attentionForward";
  ARGS(10);
  NEED_BLAS();
  DIM(5, B);
  DIM(6, T);
  DIM(7, H);
  DIM(8, K);
  DIM(9, E);
  if (K == 0 || H % K) {
    throw_range(env, fn, "H must be a multiple of K (GQA)");
    return NULL;
  }
  float *out, *att, *q, *k, *v;
  F32(0, out, B * T * H * E, "out");
  F32(1, att, B * H * T * T, "att");
  F32(2, q, B * T * H * E, "q");
  F32(3, k, B * T * K * E, "k");
  F32(4, v, B * T * K * E, "v");
  if (attention_forward(out, att, q, k, v, B, T, H, K, E)) GEMM_OOM();
  return NULL;
}

/* attentionBackward(dq, dk, dv, dout, q, k, v, att, B, T, H, K, E) */
static napi_value AttentionBackward(napi_env env, napi_callback_info info) {
  static const char fn[] = "attentionBackward";
  ARGS(13);
  NEED_BLAS();
  DIM(8, B);
  DIM(9, T);
  DIM(10, H);
  DIM(11, K);
  DIM(12, E);
  if (K == 0 || H % K) {
    throw_range(env, fn, "H must be a multiple of K (GQA)");
    return NULL;
  }
  float *dq, *dk, *dv, *dout, *q, *k, *v, *att;
  F32(0, dq, B * T * H * E, "dq");
  F32(1, dk, B * T * K * E, "dk");
  F32(2, dv, B * T * K * E, "dv");
  F32(3, dout, B * T * H * E, "dout");
  F32(4, q, B * T * H * E, "q");
  F32(5, k, B * T * K * E, "k");
  F32(6, v, B * T * K * E, "v");
  F32(7, att, B * H * T * T, "att");
  if (attention_backward(dq, dk, dv, dout, q, k, v, att, B, T, H, K, E)) GEMM_OOM();
  return NULL;
}

/* attentionCachedForward(out, q, kCache, vCache, P, T, H, K, E): T new positions against a cache of P + T */
static napi_value AttentionCachedForward(napi_env env, napi_callback_info info) {
  static const char fn[] = "attentionCachedForward";
  ARGS(9);
  DIM(4, P);
  DIM(5, T);
  DIM(6, H);
  DIM(7, K);
  DIM(8, E);
  if (K == 0 || H % K) {
    throw_range(env, fn, "H must be a multiple of K (GQA)");
    return NULL;
  }
  float *out, *q, *kc, *vc;
  F32(0, out, T * H * E, "out");
  F32(1, q, T * H * E, "q");
  F32(2, kc, (P + T) * K * E, "kCache");
  F32(3, vc, (P + T) * K * E, "vCache");
  if (T == 0 || H == 0 || E == 0) return NULL;
  float *sc = (float *)malloc((size_t)(P + T) * sizeof(float));
  double *acc = (double *)malloc((size_t)E * sizeof(double));
  if (sc && acc) attention_cached(out, q, kc, vc, P, T, H, K, E, sc, acc);
  const int oom = !sc || !acc;
  free(sc);
  free(acc);
  if (oom) throw_error(env, fn, "out of memory");
  return NULL;
}

/* swigluForward(out, gate, up, n) */
static napi_value SwigluForward(napi_env env, napi_callback_info info) {
  static const char fn[] = "swigluForward";
  ARGS(4);
  DIM(3, n);
  float *out, *g, *u;
  F32(0, out, n, "out");
  F32(1, g, n, "gate");
  F32(2, u, n, "up");
  swiglu_forward(out, g, u, n);
  return NULL;
}

/* swigluBackward(dgate, dup, dout, gate, up, n) */
static napi_value SwigluBackward(napi_env env, napi_callback_info info) {
  static const char fn[] = "swigluBackward";
  ARGS(6);
  DIM(5, n);
  float *dg, *du, *dout, *g, *u;
  F32(0, dg, n, "dgate");
  F32(1, du, n, "dup");
  F32(2, dout, n, "dout");
  F32(3, g, n, "gate");
  F32(4, u, n, "up");
  swiglu_backward(dg, du, dout, g, u, n);
  return NULL;
}

/* crossEntropy(logits, targets, rows, V, gradScale): the summed loss; the logits become gradients when gradScale > 0 */
static napi_value CrossEntropy(napi_env env, napi_callback_info info) {
  static const char fn[] = "crossEntropy";
  ARGS(5);
  DIM(2, rows);
  DIM(3, V);
  NUM(4, gradScale);
  float *lg;
  int32_t *tg;
  F32(0, lg, rows * V, "logits");
  I32(1, tg, rows, "targets");
  if (!(gradScale >= 0) || !isfinite(gradScale)) {
    throw_range(env, fn, "gradScale must be finite and >= 0");
    return NULL;
  }
  for (int64_t r = 0; r < rows; r++)
    if (tg[r] < -1 || tg[r] >= V) {
      throw_range(env, fn, "a target is outside [-1, V)");
      return NULL;
    }
  napi_value ret;
  CHECK_NAPI(napi_create_double(env, cross_entropy(lg, tg, rows, V, gradScale), &ret));
  return ret;
}

/* ------------------------------------------------------------------ module */
/* When this thread's Node environment ends (a worker thread exits), its GEMM buffers go with it. */
static void release_thread_buffers(void *arg) {
  (void)arg;
  gemm_thread_release();
}

NAPI_MODULE_INIT() {
  if (napi_add_env_cleanup_hook(env, release_thread_buffers, NULL) != napi_ok) return NULL;
  napi_property_descriptor props[] = {
      {"loadBlas", NULL, LoadBlas, NULL, NULL, NULL, napi_default, NULL},
      {"simd", NULL, Simd, NULL, NULL, NULL, napi_default, NULL},
      {"setGemm", NULL, SetGemm, NULL, NULL, NULL, napi_default, NULL},
      {"gemmPeak", NULL, GemmPeak, NULL, NULL, NULL, napi_default, NULL},
      {"gemm", NULL, Gemm, NULL, NULL, NULL, napi_default, NULL},
      {"gemmBf16", NULL, GemmBf16, NULL, NULL, NULL, napi_default, NULL},
      {"gemmBf16Hw", NULL, GemmBf16Hw, NULL, NULL, NULL, napi_default, NULL},
      {"matmul", NULL, Matmul, NULL, NULL, NULL, napi_default, NULL},
      {"bf16Weights", NULL, Bf16Weights, NULL, NULL, NULL, napi_default, NULL},
      {"bf16WeightsChanged", NULL, Bf16WeightsChanged, NULL, NULL, NULL, napi_default, NULL},
      {"bf16WeightsPrepack", NULL, Bf16WeightsPrepack, NULL, NULL, NULL, napi_default, NULL},
      {"embeddingForward", NULL, EmbeddingForward, NULL, NULL, NULL, napi_default, NULL},
      {"embeddingBackward", NULL, EmbeddingBackward, NULL, NULL, NULL, napi_default, NULL},
      {"rmsnormForward", NULL, RmsnormForward, NULL, NULL, NULL, napi_default, NULL},
      {"rmsnormBackward", NULL, RmsnormBackward, NULL, NULL, NULL, napi_default, NULL},
      {"ropeForward", NULL, RopeForward, NULL, NULL, NULL, napi_default, NULL},
      {"ropeBackward", NULL, RopeBackward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionForward", NULL, AttentionForward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionBackward", NULL, AttentionBackward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionCachedForward", NULL, AttentionCachedForward, NULL, NULL, NULL, napi_default, NULL},
      {"swigluForward", NULL, SwigluForward, NULL, NULL, NULL, napi_default, NULL},
      {"swigluBackward", NULL, SwigluBackward, NULL, NULL, NULL, napi_default, NULL},
      {"crossEntropy", NULL, CrossEntropy, NULL, NULL, NULL, napi_default, NULL},
  };
  if (napi_define_properties(env, exports, sizeof props / sizeof props[0], props) != napi_ok) return NULL;
  return exports;
}
