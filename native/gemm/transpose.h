/*
 * The AVX-512 16 x 16 transpose: pack.c packs B stored [N,K] for the AVX-512 kernel with it, kernels/amx.c the
 * AMX tiles' pairs of bf16.
 */
#ifndef TSTRAIN_GEMM_TRANSPOSE_H
#define TSTRAIN_GEMM_TRANSPOSE_H
#include "internal.h"
#ifdef GEMM_X86
/* 16 x 16 floats, AVX-512: rows src + x*ss to rows dst + y*ds (dst[y][x] = src[x][y]), in 64 shuffles. */
__attribute__((target("avx512f"))) static inline void transpose16(const float *src, int64_t ss, float *dst,
                                                                  int64_t ds) {
  __m512 r[16], t[16];
  for (int x = 0; x < 16; x++) r[x] = _mm512_loadu_ps(src + x * ss);
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  /* r[4i + e], 128-bit lane L: element 4L + e of rows 4i .. 4i + 3 */
  for (int i = 0; i < 4; i++) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  /* output row 4L + e: lane j of it is lane L of r[4j + e] */
  for (int e = 0; e < 4; e++) {
    const __m512 x0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x44), x1 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xEE),
                 x2 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x44),
                 x3 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xEE);
    _mm512_storeu_ps(dst + e * ds, _mm512_shuffle_f32x4(x0, x2, 0x88));
    _mm512_storeu_ps(dst + (4 + e) * ds, _mm512_shuffle_f32x4(x0, x2, 0xDD));
    _mm512_storeu_ps(dst + (8 + e) * ds, _mm512_shuffle_f32x4(x1, x3, 0x88));
    _mm512_storeu_ps(dst + (12 + e) * ds, _mm512_shuffle_f32x4(x1, x3, 0xDD));
  }
}
#endif
#endif
