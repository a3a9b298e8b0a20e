/*
 * The optimizer's memory-bound passes in C: AdamW, the fold of a micro-batch's gradient into a rank's float64 slot
 * (foldMicro) and the reduce (reduceChunks64), each the operations of its JS or wasm counterpart in their order.
 *
 * AdamW: src/optim/optim-simd.ts's adamwSliceSimd (the WebAssembly kernel) over the
 * shared weights, moments and gradient in place. The wasm kernel reads only its own memory, so it streams every
 * slice through private regions (copy in, compute, copy out); this one reads and writes the SharedArrayBuffers'
 * floats directly, so a step moves only the 28 bytes a parameter needs (read g, m, v, p; write m, v, p).
 *
 * The arithmetic is the wasm kernel's, operation for operation, in float32 (IEEE multiply, add, sqrt and divide,
 * each rounded once; -ffp-contract=off, so nothing fuses into an FMA). Every element is independent of the others,
 * so the vector width (the AVX-512, AVX or scalar loop, as optim_isa picks) changes nothing: the same bits as the
 * wasm kernel on every CPU (test/train.optim.test.ts holds the two to each other).
 */
#include "../engine.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define OPTIM_X86 1
#endif

/* The vector code this thread runs: its GEMM kernel's instruction set (setGemm; auto: the widest), as the row
 * kernels do, so `--isa portable` runs the scalar loops (the same bits either way) */
static inline gemm_isa optim_isa(gemm_isa isa) {
  if (isa == GEMM_ISA_AUTO) isa = gemm_kernel;
  return isa == GEMM_ISA_AUTO ? gemm_best_isa() : isa;
}

/* For i in [i0, n): gi = g * coef; m = b1 * m + b1c * gi; v = b2 * v + b2c * (gi * gi);
 * p = p * decay - step * (m / (sqrt(v) * ibc2 + eps)). Written out once per width: the compiler does not vectorise
 * a loop with sqrtf (its errno), and each vector operation is the scalar one on every lane. */
static void adamw_scalar(float *p, float *m, float *v, const float *g, int64_t i, int64_t n, const float h[9]) {
  const float decay = h[0], b1 = h[1], b1c = h[2], b2 = h[3], b2c = h[4], coef = h[5], ibc2 = h[6], eps = h[7],
              step = h[8];
  for (; i < n; i++) {
    const float gi = g[i] * coef;
    const float mi = b1 * m[i] + b1c * gi;
    const float vi = b2 * v[i] + b2c * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * (mi / (sqrtf(vi) * ibc2 + eps));
  }
}

#ifdef OPTIM_X86
#define ADAMW_BODY(W, V, LD, ST, SET, MUL, ADD, SUB, DIV, SQRT)                                                        \
  const V decay = SET(h[0]), b1 = SET(h[1]), b1c = SET(h[2]), b2 = SET(h[3]), b2c = SET(h[4]), coef = SET(h[5]),       \
          ibc2 = SET(h[6]), eps = SET(h[7]), step = SET(h[8]);                                                         \
  int64_t i = 0;                                                                                                       \
  for (; i + (W) <= n; i += (W)) {                                                                                     \
    const V gi = MUL(LD(g + i), coef);                                                                                 \
    const V mi = ADD(MUL(b1, LD(m + i)), MUL(b1c, gi));                                                                \
    const V vi = ADD(MUL(b2, LD(v + i)), MUL(b2c, MUL(gi, gi)));                                                       \
    ST(m + i, mi);                                                                                                     \
    ST(v + i, vi);                                                                                                     \
    ST(p + i, SUB(MUL(LD(p + i), decay), MUL(step, DIV(mi, ADD(MUL(SQRT(vi), ibc2), eps)))));                          \
  }                                                                                                                    \
  return i

__attribute__((target("avx512f"))) static int64_t adamw_avx512(float *p, float *m, float *v, const float *g, int64_t n,
                                                               const float h[9]) {
  ADAMW_BODY(16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_mul_ps, _mm512_add_ps, _mm512_sub_ps,
             _mm512_div_ps, _mm512_sqrt_ps);
}

__attribute__((target("avx"))) static int64_t adamw_avx(float *p, float *m, float *v, const float *g, int64_t n,
                                                        const float h[9]) {
  ADAMW_BODY(8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_sub_ps,
             _mm256_div_ps, _mm256_sqrt_ps);
}
#endif

void adamw_f32(float *restrict p, float *restrict m, float *restrict v, const float *restrict g, int64_t n,
               const float h[9], gemm_isa isa_arg) {
  int64_t i = 0;
#ifdef OPTIM_X86
  const gemm_isa isa = optim_isa(isa_arg);
  if (isa == GEMM_ISA_AVX512) i = adamw_avx512(p, m, v, g, n, h);
  else if (isa == GEMM_ISA_AVX2) i = adamw_avx(p, m, v, g, n, h);
#endif
  adamw_scalar(p, m, v, g, i, n, h);
}

/* ------------------------------------------------------------------ the micro-batch fold (A10) */
/* src/optim/optim.ts's foldMicro: acc = g (first) or acc += g, in double, and g = 0. Each element is one exact
 * conversion (and one add), so the order and the width change nothing. The first fold writes acc without reading
 * it: on x86 through streaming stores, which skip the read of each line a plain store would bring in first (24 bytes
 * of traffic an element become 16). */
#ifdef OPTIM_X86

__attribute__((target("avx512f"))) static int64_t fold_first_avx512(double *acc, float *g, int64_t i, int64_t n) {
  const __m256 z = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    _mm512_stream_pd(acc + i, _mm512_cvtps_pd(_mm256_loadu_ps(g + i)));
    _mm256_storeu_ps(g + i, z);
  }
  _mm_sfence();
  return i;
}

__attribute__((target("avx"))) static int64_t fold_first_avx(double *acc, float *g, int64_t i, int64_t n) {
  const __m128 z = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    _mm256_stream_pd(acc + i, _mm256_cvtps_pd(_mm_loadu_ps(g + i)));
    _mm_storeu_ps(g + i, z);
  }
  _mm_sfence();
  return i;
}
#endif

KERNEL_CLONES static void fold_add(double *restrict acc, float *restrict g, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    acc[i] += (double)g[i];
    g[i] = 0.0f;
  }
}

void fold_f32(double *restrict acc, float *restrict g, int64_t n, int first, gemm_isa isa_arg) {
  if (!first) {
    fold_add(acc, g, n);
    return;
  }
  int64_t i = 0;
#ifdef OPTIM_X86
  for (; i < n && ((uintptr_t)(acc + i) & 63); i++) { /* to acc's first whole line: streaming stores need it */
    acc[i] = (double)g[i];
    g[i] = 0.0f;
  }
  const gemm_isa isa = optim_isa(isa_arg);
  if (isa == GEMM_ISA_AVX512) i = fold_first_avx512(acc, g, i, n);
  else if (isa == GEMM_ISA_AVX2) i = fold_first_avx(acc, g, i, n);
#endif
  for (; i < n; i++) {
    acc[i] = (double)g[i];
    g[i] = 0.0f;
  }
}

/* ------------------------------------------------------------------ the reduce (A10) */
/* src/optim/optim.ts's reduceChunks64 over chunks [c0, c1) of a P-vector (SQ_CHUNK floats each): grad[i] = (float)
 * ((slots[0][i] + slots[1][i] + ...) * inv), the slots added in order, and sq[c] = the chunk's sum of squares of
 * those floats in double in 4 lanes: element i of the chunk's whole quads into lane i % 4, the tail's 1-3 elements
 * into lanes 0, 1, 2, then (l0 + l1) + (l2 + l3). The JS loop's operations in its order: its bits.
 * For 1 or 2 slots on x86 with grad 16-byte aligned (a buffer's start is; a view one float in is not), the quads go
 * to grad through streaming stores, as the first fold's do: grad is only written here, and a plain store first reads
 * each line it overwrites (4 bytes an element less to move: 24 become 20 over 2 slots). The same values: the same
 * bits. */
static inline double fold_lanes(const float *x, int64_t i, int64_t hi, double s0, double s1, double s2, double s3) {
  if (i < hi) s0 += (double)x[i] * (double)x[i];
  if (i + 1 < hi) s1 += (double)x[i + 1] * (double)x[i + 1];
  if (i + 2 < hi) s2 += (double)x[i + 2] * (double)x[i + 2];
  return s0 + s1 + (s2 + s3);
}

/* a chunk's quad of elements as one vector: lane j holds element 4q + j, so the lanes are the sum's four lanes */
#pragma GCC diagnostic ignored "-Wpsabi" /* vector values only inside this file's static functions: no ABI */
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

KERNEL_CLONES void reduce_chunks64(const double *const *slots, int k, float *restrict grad, double inv, int64_t P,
                                   double *restrict sq, int64_t c0, int64_t c1) {
  const double *a = slots[0], *b = k > 1 ? slots[1] : slots[0];
  const v4d vinv = {inv, inv, inv, inv};
#ifdef OPTIM_X86
  const int stream = ((uintptr_t)grad & 15) == 0;
#endif
  for (int64_t c = c0; c < c1; c++) {
    const int64_t lo = c * SQ_CHUNK, hi = P < lo + SQ_CHUNK ? P : lo + SQ_CHUNK, end = lo + ((hi - lo) & ~(int64_t)3);
    v4d s = {0, 0, 0, 0};
    if (k <= 2) {
      for (int64_t i = lo; i < end; i += 4) {
        v4d y, z;
        memcpy(&y, a + i, sizeof y);
        if (k == 2) {
          memcpy(&z, b + i, sizeof z);
          y += z;
        }
        const v4f f = __builtin_convertvector(y * vinv, v4f);
#ifdef OPTIM_X86
        if (stream) _mm_stream_ps(grad + i, (__m128)f);
        else
#endif
          memcpy(grad + i, &f, sizeof f);
        const v4d x = __builtin_convertvector(f, v4d);
        s += x * x;
      }
      for (int64_t i = end; i < hi; i++) grad[i] = (float)((k == 1 ? a[i] : a[i] + b[i]) * inv);
    } else {
      for (int64_t i = lo; i < hi; i++) {
        double acc = a[i];
        for (int r = 1; r < k; r++) acc += slots[r][i];
        const float x = (float)(acc * inv);
        grad[i] = x;
        if (i < end) s[(i - lo) & 3] += (double)x * (double)x;
      }
    }
    sq[c] = fold_lanes(grad, end, hi, s[0], s[1], s[2], s[3]);
  }
#ifdef OPTIM_X86
  if (stream) _mm_sfence(); /* the streamed lines reach memory before the caller says the gradient is ready */
#endif
}
