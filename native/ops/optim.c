/*
 * The optimizer's AdamW pass in C: src/optim/optim-simd.ts's adamwSliceSimd (the WebAssembly kernel) over the
 * shared weights, moments and gradient in place. The wasm kernel reads only its own memory, so it streams every
 * slice through private regions (copy in, compute, copy out); this one reads and writes the SharedArrayBuffers'
 * floats directly, so a step moves only the 28 bytes a parameter needs (read g, m, v, p; write m, v, p).
 *
 * The arithmetic is the wasm kernel's, operation for operation, in float32 (IEEE multiply, add, sqrt and divide,
 * each rounded once; -ffp-contract=off, so nothing fuses into an FMA). Every element is independent of the others,
 * so the vector width the compiler picks for each KERNEL_CLONES target changes nothing: the same bits as the wasm
 * kernel on every CPU (test/train.optim.test.ts holds the two to each other).
 */
#include "../engine.h"

/* For i < n: gi = g * coef; m = b1 * m + b1c * gi; v = b2 * v + b2c * (gi * gi);
 * p = p * decay - step * (m / (sqrt(v) * ibc2 + eps)) */
KERNEL_CLONES void adamw_f32(float *restrict p, float *restrict m, float *restrict v, const float *restrict g,
                             int64_t n, const float h[9]) {
  const float decay = h[0], b1 = h[1], b1c = h[2], b2 = h[3], b2c = h[4], coef = h[5], ibc2 = h[6], eps = h[7],
              step = h[8];
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i] * coef;
    const float mi = b1 * m[i] + b1c * gi;
    const float vi = b2 * v[i] + b2c * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * (mi / (sqrtf(vi) * ibc2 + eps));
  }
}

/* ------------------------------------------------------------------ the micro-batch fold (A10) */
/* src/optim/optim.ts's foldMicro: acc = g (first) or acc += g, in double, and g = 0. Each element is one exact
 * conversion (and one add), so the order and the width change nothing. The first fold writes acc without reading
 * it: on x86 through streaming stores, which skip the read of each line a plain store would bring in first (24 bytes
 * of traffic an element become 16). */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define FOLD_X86 1

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

void fold_f32(double *restrict acc, float *restrict g, int64_t n, int first) {
  if (!first) {
    fold_add(acc, g, n);
    return;
  }
  int64_t i = 0;
#ifdef FOLD_X86
  for (; i < n && ((uintptr_t)(acc + i) & 63); i++) { /* to acc's first whole line: streaming stores need it */
    acc[i] = (double)g[i];
    g[i] = 0.0f;
  }
  if (__builtin_cpu_supports("avx512f")) i = fold_first_avx512(acc, g, i, n);
  else if (__builtin_cpu_supports("avx")) i = fold_first_avx(acc, g, i, n);
#endif
  for (; i < n; i++) {
    acc[i] = (double)g[i];
    g[i] = 0.0f;
  }
}
