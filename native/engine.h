/*
 * The native engine's internal declarations (native/tstrain.c, setup.c, napi.c, ops/): the matrix-product dispatch
 * (the built-in GEMM or a BLAS, per thread), the deterministic helpers the kernels share, and the kernels themselves
 * (ops/). Nothing here is exported from an addon but its Node-API table (tstrain.c; probes.c for the probes addon).
 */
#ifndef TSTRAIN_ENGINE_H
#define TSTRAIN_ENGINE_H
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"

#pragma GCC visibility push(hidden)

/* ------------------------------------------------------------------ matrix products: the built-in GEMM or a BLAS */
enum { CblasRowMajor = 101 };
enum { CblasNoTrans = 111, CblasTrans = 112 };
typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*set_threads_fn)(int);
typedef char *(*get_config_fn)(void);
typedef int (*get_threads_fn)(void);

/* The BLAS loadBlas found (setup.c), process-wide: every worker thread's instance of the addon shares it */
extern pthread_mutex_t blas_lock;
extern sgemm_fn blas_sgemm;
extern char blas_path[1024];
extern char blas_config[512];
extern int blas_threads;

/* Which GEMM this thread's products run on (setGemm): the built-in one (native/gemm/) on gemm_kernel, or the
 * BLAS loaded by loadBlas; and in which precision: fp32, or (built-in only) bf16 operands with fp32 accumulation
 * (gemm.h: gemm_bf16), on the AMX kernel when gemm_bf16_hw, else on gemm_kernel's emulation. Per thread,
 * so each rank (and a test comparing kernels) chooses for itself. */
enum { GEMM_BUILTIN = 0, GEMM_BLAS = 1 };
extern __thread int gemm_kind;
extern __thread gemm_isa gemm_kernel;
extern __thread int gemm_bf16_mode;
extern __thread int gemm_bf16_hw;

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

/* ================================================================== the kernels (maths only) */
/* Each returns 0, or GEMM_NOMEM when the built-in GEMM (or a scratch buffer) could not be allocated. */
enum { GEMM_NOMEM = -1 };

/* ------------------------------------------------------------------ matmul: C = alpha * op(A) @ op(B) + beta * C */
static inline int matmul(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         const float *B, float beta, float *C) {
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

/* ops/rows.c: embedding, RMSNorm, RoPE, SwiGLU, cross-entropy, and attention's softmax pieces; each runs the copy
 * (ops/rows-isa.h) of this thread's gemm_kernel (auto: the widest), all of them the same bits */
void embedding_forward(float *out, const int32_t *ids, const float *E, int64_t N, int64_t D);
void embedding_backward(float *dE, const int32_t *ids, const float *dout, int64_t N, int64_t D);
void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t D, double eps);
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                      int64_t N, int64_t D);
void rope_forward(float *x, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh, int64_t E);
void rope_backward(float *dx, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh, int64_t E);
void swiglu_forward(float *out, const float *g, const float *u, int64_t n);
void swiglu_backward(float *dg, float *du, const float *dout, const float *g, const float *u, int64_t n);
double cross_entropy(float *lg, const int32_t *tg, int64_t rows, int64_t V, double gradScale);
/* x[i] = exp(x[i] - sub) (ops/vmath.h's exp); the fused attention's backward row: p = exp(s - lse) into s and
 * ds = p * (dp - d) * scale, over c keys */
void exp_sub_row(float *x, int64_t n, float sub);
void softmax_grad_row(float *s, float *ds, const float *dp, int64_t c, float lse, float d, float scale);
#ifdef TSTRAIN_PROBES
/* vmath.h's exp and log alone on the copy of one instruction set (the probes addon's vmath, for the checks; binding.gyp
 * defines TSTRAIN_PROBES for that addon only) */
void vmath_exp(gemm_isa isa, float *out, const float *x, int64_t n);
void vmath_log(gemm_isa isa, double *out, const double *x, int64_t n);
#endif

/* ops/optim.c: AdamW over n floats in place, float32, the wasm kernel's operations in its order; h = decay, b1,
 * b1c, b2, b2c, coef, ibc2, eps, step (each a float, as the wasm kernel's splats) */
void adamw_f32(float *restrict p, float *restrict m, float *restrict v, const float *restrict g, int64_t n,
               const float h[9], gemm_isa isa);
/* ops/optim.c: a micro-batch's gradient into its float64 sum, acc = g (first) or acc += g, and g = 0 (foldMicro) */
void fold_f32(double *restrict acc, float *restrict g, int64_t n, int first, gemm_isa isa);
/* ops/optim.c: reduceChunks64 (the k float64 slots averaged into the float32 gradient, each chunk's sum of squares
 * over SQ_CHUNK floats: src/optim/optim.ts's SQ_CHUNK) */
#define SQ_CHUNK 4096
void reduce_chunks64(const double *const *slots, int k, float *restrict grad, double inv, int64_t P,
                     double *restrict sq, int64_t c0, int64_t c1);

/* ops/attention.c: causal attention (GQA), fused (the per-row log-sum-exp lse [B, H, T] kept for the backward;
 * the body in ops/attention-fused.h), and the cached form for generation */
int attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int64_t B, int64_t T,
                      int64_t H, int64_t K, int64_t E);
int attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                       const float *v, const float *out, const float *lse, int64_t B, int64_t T, int64_t H, int64_t K,
                       int64_t E);
void attention_cached(float *out, const float *q, const float *kc, const float *vc, int64_t P, int64_t T, int64_t H,
                      int64_t K, int64_t E, float *sc, double *acc);

#pragma GCC visibility pop
#endif
