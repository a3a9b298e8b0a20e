/*
 * Packing (the same on every kernel; it only moves bits, or multiplies by alpha): A into MR-row slivers and B into
 * NR-column slivers (pack_a, pack_b), with AVX2 / AVX-512 transposes and row-wise copies where the CPU has them,
 * and the per-thread buffers they pack into.
 */
#include "internal.h"

#include <stdlib.h>

#include "transpose.h"

/* ------------------------------------------------------------------ per-thread packing buffers */
/* A thread-local buffer, freed by gemm_thread_release (the addon calls it when the thread's Node environment is
 * torn down). No pthread key destructor: Node unloads an addon when the last environment that loaded it ends,
 * and a destructor left behind in unloaded code crashes the next thread that exits. */
static __thread float *buf_p = NULL;
static __thread size_t buf_cap = 0;

static __thread float *ws_p = NULL; /* blocked()'s chains when beta != 0 (frame.c) */
static __thread size_t ws_cap = 0;

void gemm_thread_release(void) {
  free(buf_p);
  buf_p = NULL;
  buf_cap = 0;
  free(ws_p);
  ws_p = NULL;
  ws_cap = 0;
}

/* n floats, 64-byte aligned, in *p (capacity *cap), grown when too small and kept for the thread's next call. */
static float *grow(float **p, size_t *cap, size_t n) {
  if (*cap < n) {
    free(*p);
    *p = (float *)aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
    *cap = *p ? n : 0;
  }
  return *p;
}
/* the packing buffer */
float *scratch(size_t n) { return grow(&buf_p, &buf_cap, n); }
/* blocked()'s chains when beta != 0 (gemm_sgemm's bands keep n near WS_BAND) */
float *workspace(size_t n) { return grow(&ws_p, &ws_cap, n); }

/* ------------------------------------------------------------------ packing */
#ifdef GEMM_X86
/* 8 x 8 floats: rows src + x*ss (x = 0..7) to rows dst + y*ds, dst[y][x] = src[x][y]. Only moves bits. With
 * rows = 6, rows 6 and 7 are read as row 5 again (never past the sliver) and each output row of 8 is stored 6
 * floats after the one before, so the next store overwrites its last two: call it in increasing y, with 2 floats
 * of room after the destination. */
__attribute__((target("avx2"))) static inline void transpose8(const float *src, int64_t ss, float *dst, int64_t ds,
                                                              int rows) {
  const int64_t s6 = rows == 8 ? 6 * ss : 5 * ss, s7 = rows == 8 ? 7 * ss : 5 * ss;
  __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ss), r2 = _mm256_loadu_ps(src + 2 * ss),
         r3 = _mm256_loadu_ps(src + 3 * ss), r4 = _mm256_loadu_ps(src + 4 * ss), r5 = _mm256_loadu_ps(src + 5 * ss),
         r6 = _mm256_loadu_ps(src + s6), r7 = _mm256_loadu_ps(src + s7);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
         t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
         t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
         u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
         u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
         u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(dst + ds, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(dst + 2 * ds, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(dst + 3 * ds, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(dst + 4 * ds, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(dst + 5 * ds, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(dst + 6 * ds, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(dst + 7 * ds, _mm256_permute2f128_ps(u3, u7, 0x31));
}

/* A [M,K] with MR 8 or 6, alpha 1: each sliver is MR x kc transposed, 8 k at a time (the k that remain: the
 * caller's loop). With MR 6 (the AVX2 kernel) the next sliver's rows are fetched a line per row every 16 k, as
 * pack_cols_avx2 does (AVX2-only Zen 3, paired median time 0.96-0.99 on x W^T and dy W at seq 256, operands
 * cold or warm). */
__attribute__((target("avx2"))) static int64_t pack_rows_avx2(int mr, const float *src, int64_t ld, int64_t kc,
                                                              float *dst) {
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    if (mr == 6 && !(p & 15))
      for (int r = 0; r < 6; r++) _mm_prefetch((const char *)(src + (r + 6) * ld + p), _MM_HINT_T0);
    transpose8(src + p, ld, dst + p * mr, mr, mr);
  }
  return p;
}
/* B [N,K] with NR 16 or 32: each 8-column group of the sliver is transposed the same way. The next sliver's rows
 * (the next nr rows of B) are fetched a line per row every 16 k while this one is transposed: each row is a short
 * stream (kc floats) that the hardware prefetcher barely starts on, and B is usually a weight, cold from memory
 * (AVX2-only Zen 3, B and A flushed from the caches before each call, paired median time 0.95-0.99 on the
 * model's x W^T at seq 256). Into L2 (T1), not L1: a sliver ahead is 16 KB (AVX2, kc 256) to 73 KB (AVX-512, kc
 * 576), half of L1 or more beside the A sliver and the packed output, so lines fetched into L1 were evicted before
 * their transpose read them (Zen 4, against T0: paired median time 0.94-0.96 on the LM head's logits, NT 256/341 x
 * 49152 x 576, on both kernels; the packing alone 14 -> 7.5 ms of 113 MB). */
__attribute__((target("avx2"))) static int64_t pack_cols_avx2(int nr, const float *src, int64_t ld, int64_t kc,
                                                              float *dst) {
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    if (!(p & 15))
      for (int j = 0; j < nr; j++) _mm_prefetch((const char *)(src + (j + nr) * ld + p), _MM_HINT_T1);
    for (int j = 0; j < nr; j += 8) transpose8(src + j * ld + p, ld, dst + p * nr + j, nr, 8);
  }
  return p;
}
/* B [N,K] with NR 32 (the AVX-512 kernel): 16 x 16 transposes, the next sliver fetched into L2 as above. */
__attribute__((target("avx512f"))) static int64_t pack_cols32_avx512(const float *src, int64_t ld, int64_t kc,
                                                                     float *dst) {
  int64_t p = 0;
  for (; p + 16 <= kc; p += 16) {
    for (int j = 0; j < 32; j++) _mm_prefetch((const char *)(src + (j + 32) * ld + p), _MM_HINT_T1);
    for (int j = 0; j < 32; j += 16) transpose16(src + j * ld + p, ld, dst + p * 32 + j, 32);
  }
  return p;
}
int fast_pack = -1; /* AVX2 transposes, where the CPU has them (same bits as the loops) */
#endif

#ifdef GEMM_X86
/* K rows of NR floats, ld apart, into a contiguous sliver (pack_b's B stored [K,N]) */
__attribute__((target("avx512f"))) static void copy_rows32(const float *src, int64_t ld, int64_t K, float *dst) {
  for (int64_t p = 0; p < K; p++) {
    _mm512_storeu_ps(dst + 32 * p, _mm512_loadu_ps(src + p * ld));
    _mm512_storeu_ps(dst + 32 * p + 16, _mm512_loadu_ps(src + p * ld + 16));
  }
}
__attribute__((target("avx2"))) static void copy_rows16(const float *src, int64_t ld, int64_t K, float *dst) {
  for (int64_t p = 0; p < K; p++) {
    _mm256_storeu_ps(dst + 16 * p, _mm256_loadu_ps(src + p * ld));
    _mm256_storeu_ps(dst + 16 * p + 8, _mm256_loadu_ps(src + p * ld + 8));
  }
}
__attribute__((target("avx2"))) static void copy_rows8(const float *src, int64_t ld, int64_t K, float *dst) {
  for (int64_t p = 0; p < K; p++) _mm256_storeu_ps(dst + 8 * p, _mm256_loadu_ps(src + p * ld));
}

/* kc rows of src (ld apart), n floats each (n a multiple of w = 8 or 32), into slivers of w columns: row p's columns
 * s .. s+w-1 go to dst + s*kc + p*w. Each source row is read once, front to back (the LM head's operands stream
 * from memory; sliver by sliver, each row would be visited once per sliver, on a different page every row). */
__attribute__((target("avx512f"))) static void pack_rowwise(int w, const float *src, int64_t ld, int64_t kc, int64_t n,
                                                            float *dst) {
  /* rows in groups of 8: a sliver's 8 x w floats of a group are contiguous (whole cache lines), so each line of the
   * copy is complete before it can leave L1 (slivers lie kc*w*4 bytes apart, often a multiple of 4 KiB: one set) */
  for (int64_t p0 = 0; p0 < kc; p0 += 8) {
    const int64_t pe = p0 + 8 < kc ? p0 + 8 : kc;
    int64_t s = 0;
    if (w == 32)
      for (; s < n; s += 32)
        for (int64_t p = p0; p < pe; p++) {
          const float *r = src + p * ld + s;
          float *d = dst + s * kc + p * 32;
          _mm512_storeu_ps(d, _mm512_loadu_ps(r));
          _mm512_storeu_ps(d + 16, _mm512_loadu_ps(r + 16));
        }
    else {
      for (; s + 16 <= n; s += 16)
        for (int64_t p = p0; p < pe; p++) {
          const __m512d x = _mm512_castps_pd(_mm512_loadu_ps(src + p * ld + s));
          float *d = dst + s * kc + p * 8;
          _mm256_storeu_ps(d, _mm256_castpd_ps(_mm512_castpd512_pd256(x)));
          _mm256_storeu_ps(d + 8 * kc, _mm256_castpd_ps(_mm512_extractf64x4_pd(x, 1)));
        }
      for (; s < n; s += 8)
        for (int64_t p = p0; p < pe; p++) _mm256_storeu_ps(dst + s * kc + p * 8, _mm256_loadu_ps(src + p * ld + s));
    }
  }
}
/* The same on AVX2, for its kernel's slivers: w = 16 (B) or 6 (A stored [K,M]; n a multiple of 6). A 6-float row of
 * a sliver moves as 8 floats, the 2 past it overwritten by the next row's store; the sliver's last row as 6 (a masked
 * store), and the last sliver's rows are read masked (never past the matrix). */
__attribute__((target("avx2"))) void pack_rowwise_avx2(int w, const float *src, int64_t ld, int64_t kc, int64_t n,
                                                       float *dst) {
  const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
  for (int64_t p0 = 0; p0 < kc; p0 += 8) {
    const int64_t pe = p0 + 8 < kc ? p0 + 8 : kc;
    if (w == 16) {
      for (int64_t s = 0; s < n; s += 16)
        for (int64_t p = p0; p < pe; p++) {
          const float *r = src + p * ld + s;
          float *d = dst + s * kc + p * 16;
          _mm256_storeu_ps(d, _mm256_loadu_ps(r));
          _mm256_storeu_ps(d + 8, _mm256_loadu_ps(r + 8));
        }
      continue;
    }
    for (int64_t s = 0; s < n; s += 6) {
      const int tail = s + 6 == n;
      for (int64_t p = p0; p < pe; p++) {
        const float *r = src + p * ld + s;
        const __m256 x = tail ? _mm256_maskload_ps(r, six) : _mm256_loadu_ps(r);
        float *d = dst + s * kc + p * 6;
        if (p + 1 < kc) _mm256_storeu_ps(d, x);
        else _mm256_maskstore_ps(d, six, x);
      }
    }
  }
}
#endif

/* A[i0:i0+mc, p0:p0+kc] (times alpha) into MR-row slivers: sliver s holds a[s*MR + r, p] at s*MR*kc + p*MR + r;
 * rows past mc are 0. */
void pack_a(int mr, int ta, const float *A, int64_t lda, int64_t i0, int64_t p0, int64_t mc, int64_t kc, float alpha,
            float *ap) {
#ifdef GEMM_X86
  if (ta && fast_pack && mr == 8 && mc % 8 == 0 && alpha == 1.0f) { /* the AVX-512 kernel's 8-row slivers */
    pack_rowwise(8, A + p0 * lda + i0, lda, kc, mc, ap);
    return;
  }
  if (ta && fast_pack && mr == 6 && mc % 6 == 0 && alpha == 1.0f) { /* the AVX2 kernel's */
    pack_rowwise_avx2(6, A + p0 * lda + i0, lda, kc, mc, ap);
    return;
  }
#endif
  for (int64_t s = 0; s < mc; s += mr, ap += mr * kc) {
    const int64_t rows = mc - s < mr ? mc - s : mr;
    if (ta) { /* A stored [K,M]: a row of the sliver is contiguous in A */
#ifdef GEMM_X86
      if (fast_pack && mr == 8 && rows == 8 && alpha == 1.0f) {
        copy_rows8(A + p0 * lda + i0 + s, lda, kc, ap);
        continue;
      }
#endif
      for (int64_t p = 0; p < kc; p++) {
        const float *src = A + (p0 + p) * lda + i0 + s;
        float *dst = ap + p * mr;
        int64_t r = 0;
        if (alpha == 1.0f)
          for (; r < rows; r++) dst[r] = src[r];
        else
          for (; r < rows; r++) dst[r] = alpha * src[r];
        for (; r < mr; r++) dst[r] = 0.0f;
      }
    } else { /* A stored [M,K]: read each row along k */
      int64_t p0f = 0;
#ifdef GEMM_X86
      if (fast_pack && (mr == 8 || mr == 6) && rows == mr && alpha == 1.0f)
        p0f = pack_rows_avx2(mr, A + (i0 + s) * lda + p0, lda, kc, ap);
#endif
      for (int64_t r = 0; r < mr; r++) {
        if (r >= rows) {
          for (int64_t p = p0f; p < kc; p++) ap[p * mr + r] = 0.0f;
          continue;
        }
        const float *src = A + (i0 + s + r) * lda + p0;
        if (alpha == 1.0f)
          for (int64_t p = p0f; p < kc; p++) ap[p * mr + r] = src[p];
        else
          for (int64_t p = p0f; p < kc; p++) ap[p * mr + r] = alpha * src[p];
      }
    }
  }
}

/* B[p0:p0+kc, j0:j0+nc] into NR-column slivers: sliver s holds b[p, s*NR + j] at s*NR*kc + p*NR + j; columns past
 * nc are 0. */
void pack_b(int nr, int tb, const float *B, int64_t ldb, int64_t p0, int64_t j0, int64_t kc, int64_t nc, float *bp) {
#ifdef GEMM_X86
  if (!tb && fast_pack && nr == 32 && nc % 32 == 0) { /* the AVX-512 kernel's 32-column slivers */
    pack_rowwise(32, B + p0 * ldb + j0, ldb, kc, nc, bp);
    return;
  }
  if (!tb && fast_pack && nr == 16 && nc % 16 == 0) {
    pack_rowwise_avx2(16, B + p0 * ldb + j0, ldb, kc, nc, bp);
    return;
  }
#endif
  for (int64_t s = 0; s < nc; s += nr, bp += nr * kc) {
    const int64_t cols = nc - s < nr ? nc - s : nr;
    if (!tb) { /* B stored [K,N]: a row of the sliver is contiguous */
#ifdef GEMM_X86
      if (fast_pack && cols == nr && (nr == 32 || nr == 16)) {
        if (nr == 32) copy_rows32(B + p0 * ldb + j0 + s, ldb, kc, bp);
        else copy_rows16(B + p0 * ldb + j0 + s, ldb, kc, bp);
        continue;
      }
#endif
      for (int64_t p = 0; p < kc; p++) {
        const float *src = B + (p0 + p) * ldb + j0 + s;
        float *dst = bp + p * nr;
        if (cols == nr) {
          memcpy(dst, src, (size_t)nr * sizeof(float));
          continue;
        }
        int64_t j = 0;
        for (; j < cols; j++) dst[j] = src[j];
        for (; j < nr; j++) dst[j] = 0.0f;
      }
    } else { /* B stored [N,K]: read each column along k */
      int64_t p0f = 0;
#ifdef GEMM_X86
      if (fast_pack && cols == nr && nr == 32) p0f = pack_cols32_avx512(B + (j0 + s) * ldb + p0, ldb, kc, bp);
      else if (fast_pack && cols == nr && nr % 8 == 0) p0f = pack_cols_avx2(nr, B + (j0 + s) * ldb + p0, ldb, kc, bp);
#endif
      for (int64_t j = 0; j < nr; j++) {
        if (j >= cols) {
          for (int64_t p = p0f; p < kc; p++) bp[p * nr + j] = 0.0f;
          continue;
        }
        const float *src = B + (j0 + s + j) * ldb + p0;
        for (int64_t p = p0f; p < kc; p++) bp[p * nr + j] = src[p];
      }
    }
  }
}
