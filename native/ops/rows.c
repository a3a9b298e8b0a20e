/*
 * The row-wise kernels: embedding, RMSNorm, RoPE, SwiGLU, cross-entropy, and the softmax pieces of the fused
 * attention (the maths only, on raw pointers and sizes; engine.h). Their bodies are ops/rows-isa.h, compiled here once
 * per instruction set (AVX-512, AVX2 + FMA, plain C) on vmath.h's exp and log; each call runs the copy of this
 * thread's built-in GEMM kernel (setGemm's isa; auto: the widest the CPU runs), so `--isa` chooses both, and every
 * copy gives the same bits.
 */
#include "../engine.h"
#include "vmath.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define ROWS_X86 1
#include <immintrin.h>
#endif

_Static_assert(LANES == 8, "the VACC forms below split the sums in 8 lanes");

/* ------------------------------------------------------------------ plain C: one lane */
#define ISA_FN(name) name##_portable
#define VW 1
typedef float vf;
#define VLOAD(p) (*(p))
#define VSTORE(p, v) (*(p) = (v))
#define VSET(a) ((float)(a))
#define VMAX(a, b) ((a) > (b) ? (a) : (b))
#define VMIN(a, b) ((a) < (b) ? (a) : (b))
#define VFMA(a, b, c) fmaf((a), (b), (c))
#define VADD(a, b) ((a) + (b))
#define VSUB(a, b) ((a) - (b))
#define VMUL(a, b) ((a) * (b))
#define VDIV(a, b) ((a) / (b))
#define VPOW2(n) pow2_f32(n)
#include "rows-isa.h" /* it #undefs the macros above at its end */

#ifdef ROWS_X86
/* ------------------------------------------------------------------ AVX2 + FMA: 8 lanes */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define ISA_FN(name) name##_avx2
#define VW 8
#define vf __m256
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#define VSET(a) _mm256_set1_ps((float)(a))
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define VMIN(a, b) _mm256_min_ps((a), (b))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm256_add_ps((a), (b))
#define VSUB(a, b) _mm256_sub_ps((a), (b))
#define VMUL(a, b) _mm256_mul_ps((a), (b))
#define VDIV(a, b) _mm256_div_ps((a), (b))
#define VPOW2(n)                                                                                                       \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23))
typedef struct {
  __m256d lo, hi; /* lanes 0-3, 4-7 */
} acc_avx2;
#define VACC acc_avx2
#define VACC_ZERO ((acc_avx2){_mm256_setzero_pd(), _mm256_setzero_pd()})
#define VACC_ADD(a, v)                                                                                                 \
  do {                                                                                                                 \
    (a).lo = _mm256_add_pd((a).lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));                                        \
    (a).hi = _mm256_add_pd((a).hi, _mm256_cvtps_pd(_mm256_extractf128_ps((v), 1)));                                    \
  } while (0)
#define VACC_STORE(p, a)                                                                                               \
  do {                                                                                                                 \
    _mm256_storeu_pd((p), (a).lo);                                                                                     \
    _mm256_storeu_pd((p) + 4, (a).hi);                                                                                 \
  } while (0)
#include "rows-isa.h" /* it #undefs the macros above at its end */
#pragma GCC pop_options

/* ------------------------------------------------------------------ AVX-512F: 16 lanes */
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#define ISA_FN(name) name##_avx512
#define VW 16
#define vf __m512
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VSET(a) _mm512_set1_ps((float)(a))
#define VMAX(a, b) _mm512_max_ps((a), (b))
#define VMIN(a, b) _mm512_min_ps((a), (b))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm512_add_ps((a), (b))
#define VSUB(a, b) _mm512_sub_ps((a), (b))
#define VMUL(a, b) _mm512_mul_ps((a), (b))
#define VDIV(a, b) _mm512_div_ps((a), (b))
#define VPOW2(n)                                                                                                       \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23))
#define VACC __m512d /* lanes 0-7: each vector's first 8 elements, then its last 8 */
#define VACC_ZERO _mm512_setzero_pd()
#define VACC_ADD(a, v)                                                                                                 \
  do {                                                                                                                 \
    (a) = _mm512_add_pd((a), _mm512_cvtps_pd(_mm512_castps512_ps256(v)));                                              \
    (a) = _mm512_add_pd((a), _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));       \
  } while (0)
#define VACC_STORE(p, a) _mm512_storeu_pd((p), (a))
#include "rows-isa.h" /* it #undefs the macros above at its end */
#pragma GCC pop_options
#endif

/* ------------------------------------------------------------------ dispatch: this thread's kernel */
static gemm_isa row_isa(void) { return gemm_kernel == GEMM_ISA_AUTO ? gemm_best_isa() : gemm_kernel; }

#ifdef ROWS_X86
#define DISPATCH(isa, fn, ...)                                                                                         \
  switch (isa) {                                                                                                       \
    case GEMM_ISA_AVX512: fn##_avx512(__VA_ARGS__); break;                                                             \
    case GEMM_ISA_AVX2: fn##_avx2(__VA_ARGS__); break;                                                                 \
    default: fn##_portable(__VA_ARGS__);                                                                               \
  }
#define DISPATCH_RET(isa, fn, ...)                                                                                     \
  switch (isa) {                                                                                                       \
    case GEMM_ISA_AVX512: return fn##_avx512(__VA_ARGS__);                                                             \
    case GEMM_ISA_AVX2: return fn##_avx2(__VA_ARGS__);                                                                 \
    default: return fn##_portable(__VA_ARGS__);                                                                        \
  }
#else
#define DISPATCH(isa, fn, ...)                                                                                         \
  (void)(isa);                                                                                                         \
  fn##_portable(__VA_ARGS__)
#define DISPATCH_RET(isa, fn, ...)                                                                                     \
  (void)(isa);                                                                                                         \
  return fn##_portable(__VA_ARGS__)
#endif

/* -------------------------------------------------- embedding: out[n] = E[ids[n]]; dE[ids[n]] += dout[n] */
void embedding_forward(float *out, const int32_t *ids, const float *E, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; n++) memcpy(out + n * D, E + (int64_t)ids[n] * D, (size_t)D * sizeof(float));
}

void embedding_backward(float *dE, const int32_t *ids, const float *dout, int64_t N, int64_t D) {
  DISPATCH(row_isa(), embedding_backward, dE, ids, dout, N, D);
}

/* ------------------------------------------------ RMSNorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) */
void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t D, double eps) {
  DISPATCH(row_isa(), rmsnorm_forward, out, rstd, x, w, N, D, eps);
}

/* dx += the input gradient, dw += the weight gradient (both accumulate) */
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                      int64_t N, int64_t D) {
  DISPATCH(row_isa(), rmsnorm_backward, dx, dw, dout, x, w, rstd, N, D);
}

/* ------------------------------------------------------------------ RoPE, in place on x[B, T, nh, E] */
/* The forward rotates each (i, i + E/2) pair by +theta_t,i; the backward (its adjoint) by -theta_t,i. */
void rope_forward(float *x, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh, int64_t E) {
  DISPATCH(row_isa(), rope_rotate, x, cs, sn, B, T, nh, E, 1.0f);
}

void rope_backward(float *dx, const float *cs, const float *sn, int64_t B, int64_t T, int64_t nh, int64_t E) {
  DISPATCH(row_isa(), rope_rotate, dx, cs, sn, B, T, nh, E, -1.0f);
}

/* ------------------------------------------------------------------ SwiGLU: out = silu(gate) * up */
void swiglu_forward(float *out, const float *g, const float *u, int64_t n) {
  DISPATCH(row_isa(), swiglu_forward, out, g, u, n);
}

void swiglu_backward(float *dg, float *du, const float *dout, const float *g, const float *u, int64_t n) {
  DISPATCH(row_isa(), swiglu_backward, dg, du, dout, g, u, n);
}

/* ------------------------------------------------------------------ cross-entropy (forward and backward in one) */
/* Returns the summed loss over rows whose target is >= 0 (target -1: ignored). With gradScale > 0 the logits are
 * replaced by gradScale * (softmax - onehot) (ignored rows: 0); with gradScale = 0 they are left as they are. */
double cross_entropy(float *lg, const int32_t *tg, int64_t rows, int64_t V, double gradScale) {
  DISPATCH_RET(row_isa(), cross_entropy, lg, tg, rows, V, gradScale);
}

/* ------------------------------------------------------------------ attention's softmax pieces */
void exp_sub_row(float *x, int64_t n, float sub) { DISPATCH(row_isa(), exp_row, x, x, n, sub); }

void softmax_grad_row(float *s, float *ds, const float *dp, int64_t c, float lse, float d, float scale) {
  DISPATCH(row_isa(), softmax_grad_row, s, ds, dp, c, lse, d, scale);
}

/* ------------------------------------------------------------------ the maths alone, on a chosen copy */
#ifdef TSTRAIN_PROBES /* the probes addon's vmath (binding.gyp defines it there only) */
void vmath_exp(gemm_isa isa, float *out, const float *x, int64_t n) { DISPATCH(isa, exp_row, out, x, n, 0.0f); }

void vmath_log(gemm_isa isa, double *out, const double *x, int64_t n) { DISPATCH(isa, log_row, out, x, n); }
#endif
