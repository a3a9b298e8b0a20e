/*
 * The VDPBF16PS kernel of gemm_bf16 (bf16.c; AVX512_BF16): the project's bf16 order (AMX's TDPBF16PS order) at the
 * dot-product instruction's rate, the same bits as the AMX kernel and the fp32 emulations.
 *
 * One VDPBF16PS lane is two chained FMAs into its accumulator, the high bf16 pair first, then the low pair; each is
 * rounded to nearest even, a denormal input is read as 0 and a tiny result is flushed by x86's rule (MXCSR ignored).
 * The order runs, per chunk of 32 k, one chain over the chunk's 16 even k and one over its 16 odd k, so one
 * VDPBF16PS is two consecutive steps of one chain. Each chain is packed as its own stream, the earlier k high:
 * dword m of the even stream holds (k = c + 4m, c + 4m + 2), of the odd stream (c + 4m + 1, c + 4m + 3). Each stream
 * has its own accumulators, from 0 every chunk, and then acc = acc + (e + o).
 *
 * Packed A (a DP_MR-row sliver): per chunk, per row, its 16 dwords (the even stream's 8, then the odd stream's 8).
 * Packed B (a DP_NR-column sliver): per chunk, per dword d of the 16, the DP_NR columns. B is packed whole, once per
 * call, or once per optimizer step for a weight (weights.c); A once per block of DP_MC rows (DP_MC_T where A is
 * stored [K,M]) and DP_KC of k.
 */
#include "../internal.h"
#ifdef GEMM_X86
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../transpose.h"

#define DPT __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define CHUNK_DW 16 /* dwords of one row (A) or one column (B) per chunk */

/* The k (within its chunk) that word w of a packed row's 16 dwords holds: dword d = w / 2 is step m = d % 8 of stream
 * h = d / 8 (0 even, 1 odd); its high word (w odd) holds k = 4m + h, its low word k = 4m + h + 2. */
static inline int k_of_word(int w) {
  const int d = w >> 1, h = d >> 3, m = d & 7;
  return 4 * m + h + ((w & 1) ? 0 : 2);
}
/* vpermw's index: a chunk's 32 bf16 in k order to its 16 dwords */
DPT static inline __m512i chunk_perm(void) {
  uint16_t ix[32];
  for (int w = 0; w < 32; w++) ix[w] = (uint16_t)k_of_word(w);
  return _mm512_loadu_si512(ix);
}
/* 32 floats (one chunk of k, in order) to the chunk's 16 dwords */
DPT static inline __m512i chunk_dwords(const float *x, __m512i perm) {
  const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
  return _mm512_permutexvar_epi16(perm, v);
}
/* 16 lanes of two rows: dword j = bf16(hi[j]) << 16 | bf16(lo[j]) */
DPT static inline __m512i pair_dwords(const float *hi, const float *lo) {
  const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo));
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, v);
}
/* One dword from scalars (edges): hi's bf16 high, lo's low */
static inline uint32_t dword_of(float hi, float lo) { return bf16_bits(hi) << 16 | bf16_bits(lo); }

/* ---- Packing */
/* op(A)[i0 : i0 + mc, p0 : p0 + kv] into slivers of DP_MR rows, nch chunks each (rows past mc and k past kv zero).
 * A row-major: row by row, each read once along its length. A stored [K,M]: per chunk, 16 rows at a time (dwords over
 * the rows, then a 16 x 16 transpose), the next chunk's 32 rows fetched meanwhile. */
DPT static void pack_a_dp(int ta, const float *A, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kv,
                          int64_t nch, uint32_t *ap) {
  const __m512i perm = chunk_perm();
  const int64_t rows = (mc + DP_MR - 1) / DP_MR * DP_MR, full = kv / 32 < nch ? kv / 32 : nch;
  uint32_t tmp[16 * 16] __attribute__((aligned(64))), out[16 * 16] __attribute__((aligned(64)));
#define A_SLOT(i, c) (ap + (((i) / DP_MR) * nch + (c)) * (DP_MR * CHUNK_DW) + ((i) % DP_MR) * CHUNK_DW)
  /* the scalar edge: row i (zeros past mc), chunk c (zeros past kv) */
#define A_EDGE(i, c)                                                                                                   \
  do {                                                                                                                 \
    uint32_t *dst = A_SLOT(i, c);                                                                                      \
    for (int d = 0; d < 16; d++) {                                                                                     \
      const int64_t k = (c)*32 + 4 * (d & 7) + (d >> 3);                                                               \
      float x[2] = {0.0f, 0.0f};                                                                                       \
      for (int h = 0; h < 2; h++)                                                                                      \
        if ((i) < mc && k + 2 * h < kv)                                                                                \
          x[h] = ta ? A[(p0 + k + 2 * h) * lda + i0 + (i)] : A[(i0 + (i)) * lda + p0 + k + 2 * h];                     \
      dst[d] = dword_of(x[0], x[1]);                                                                                   \
    }                                                                                                                  \
  } while (0)
  if (!ta) {
    for (int64_t i = 0; i < mc; i++) {
      const float *src = A + (i0 + i) * lda + p0;
      if (i + 1 < mc) /* the next row's run, on its way while this one converts */
        for (int64_t q = 0; q < full * 2; q++) _mm_prefetch((const char *)(src + lda + q * 16), _MM_HINT_T0);
      for (int64_t c = 0; c < full; c++) _mm512_storeu_si512(A_SLOT(i, c), chunk_dwords(src + c * 32, perm));
      for (int64_t c = full; c < nch; c++) A_EDGE(i, c);
    }
  } else
    for (int64_t c = 0; c < nch; c++) {
      int64_t i = 0;
      if (c < full)
        for (; i + 16 <= mc; i += 16) {
          const float *src = A + (p0 + c * 32) * lda + i0 + i;
          for (int d = 0; d < 16; d++) {
            const int64_t k = 4 * (d & 7) + (d >> 3);
            _mm512_store_si512(tmp + d * 16, pair_dwords(src + k * lda, src + (k + 2) * lda));
          }
          transpose16((const float *)tmp, 16, (float *)out, 16);
          for (int r = 0; r < 16; r++) _mm512_storeu_si512(A_SLOT(i + r, c), _mm512_load_si512(out + r * 16));
        }
      for (; i < mc; i++) A_EDGE(i, c);
    }
  for (int64_t i = mc; i < rows; i++)
    for (int64_t c = 0; c < nch; c++) A_EDGE(i, c);
#undef A_EDGE
#undef A_SLOT
}

size_t dp_packed_b_size(int64_t N, int64_t K) {
  return (size_t)((N + DP_NR - 1) / DP_NR) * (size_t)((K + 31) / 32) * (CHUNK_DW * DP_NR);
}
/* op(B) [K,N] whole into slivers of DP_NR columns, every chunk of K (columns past N and k past K zero). B stored
 * [K,N]: per chunk and dword, the two rows it pairs read along N. B stored [N,K] (the forward's weights, packed once
 * per step): per sliver and chunk, 16 columns' 32 k at a time, then a 16 x 16 transpose. */
DPT void dp_pack_b_whole(int tb, const float *B, int64_t ldb, int64_t N, int64_t K, uint32_t *bp) {
  const __m512i perm = chunk_perm();
  const int64_t nch = (K + 31) / 32, nsl = (N + DP_NR - 1) / DP_NR, full = K / 32, nfull = N / 16 * 16;
  uint32_t tmp[16 * 16] __attribute__((aligned(64)));
#define B_AT(j, c, d) (bp + (((j) / DP_NR) * nch + (c)) * (CHUNK_DW * DP_NR) + (d)*DP_NR + (j) % DP_NR)
  /* the scalar edge: 16 columns from j (zeros past N), chunk c (zeros past K) */
#define B_EDGE(j, c)                                                                                                   \
  do {                                                                                                                 \
    for (int d = 0; d < 16; d++) {                                                                                     \
      const int64_t k = (c)*32 + 4 * (d & 7) + (d >> 3);                                                               \
      for (int q = 0; q < 16; q++) {                                                                                   \
        float x[2] = {0.0f, 0.0f};                                                                                     \
        for (int h = 0; h < 2; h++)                                                                                    \
          if ((j) + q < N && k + 2 * h < K)                                                                            \
            x[h] = tb ? B[((j) + q) * ldb + k + 2 * h] : B[(k + 2 * h) * ldb + (j) + q];                               \
        B_AT((j) + q, c, d)[0] = dword_of(x[0], x[1]);                                                                 \
      }                                                                                                                \
    }                                                                                                                  \
  } while (0)
  for (int64_t c = 0; c < nch; c++) {
    if (c < full && !tb)
      for (int d = 0; d < 16; d++) {
        const int64_t k = c * 32 + 4 * (d & 7) + (d >> 3);
        const float *hi = B + k * ldb, *lo = B + (k + 2) * ldb;
        for (int64_t j = 0; j < nfull; j += 16) _mm512_storeu_si512(B_AT(j, c, d), pair_dwords(hi + j, lo + j));
      }
    else if (c < full)
      for (int64_t j = 0; j < nfull; j += 16) {
        for (int q = 0; q < 16; q++) _mm512_store_si512(tmp + q * 16, chunk_dwords(B + (j + q) * ldb + c * 32, perm));
        transpose16((const float *)tmp, 16, (float *)B_AT(j, c, 0), DP_NR);
      }
    for (int64_t j = c < full ? nfull : 0; j < nsl * DP_NR; j += 16) B_EDGE(j, c);
  }
#undef B_EDGE
#undef B_AT
}

/* ---- The micro-kernel: t (DP_MR x DP_NR, the tile's running sum) += nch chunks of a sliver of A times one of B.
 * The last chunk runs me steps of its even stream and mo of its odd one (8 and 8 but where K ends inside it: the
 * steps left out would only add products of the zero padding, fma(0, 0, e) = e, which changes nothing in the sum: at
 * most an e of -0 would become +0, and acc, which starts at +0, is never -0, so acc + (e + o) has the same bits). */
DPT static inline void chunk_dp(const uint32_t *a, const uint32_t *b, float *t, int me, int mo) {
  __m512 e[DP_MR][2], o[DP_MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < DP_MR; r++) e[r][0] = e[r][1] = o[r][0] = o[r][1] = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int m = 0; m < 8; m++) {
    if (m < me) {
      const __m512bh b0 = (__m512bh)_mm512_load_si512(b + m * DP_NR),
                     b1 = (__m512bh)_mm512_load_si512(b + m * DP_NR + 16);
#pragma GCC unroll 6
      for (int r = 0; r < DP_MR; r++) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * CHUNK_DW + m]);
        e[r][0] = _mm512_dpbf16_ps(e[r][0], av, b0);
        e[r][1] = _mm512_dpbf16_ps(e[r][1], av, b1);
      }
    }
    if (m < mo) {
      const __m512bh c0 = (__m512bh)_mm512_load_si512(b + (8 + m) * DP_NR),
                     c1 = (__m512bh)_mm512_load_si512(b + (8 + m) * DP_NR + 16);
#pragma GCC unroll 6
      for (int r = 0; r < DP_MR; r++) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * CHUNK_DW + 8 + m]);
        o[r][0] = _mm512_dpbf16_ps(o[r][0], av, c0);
        o[r][1] = _mm512_dpbf16_ps(o[r][1], av, c1);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < DP_MR; r++)
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      float *tp = t + r * DP_NR + 16 * h;
      _mm512_store_ps(tp, _mm512_add_ps(_mm512_load_ps(tp), _mm512_add_ps(e[r][h], o[r][h])));
    }
}
DPT static void ukr_dp(int64_t nch, const uint32_t *a, const uint32_t *b, float *t, int me, int mo) {
  for (int64_t ch = 0; ch + 1 < nch; ch++, a += DP_MR * CHUNK_DW, b += CHUNK_DW * DP_NR) chunk_dp(a, b, t, 8, 8);
  if (me == 8 && mo == 8) chunk_dp(a, b, t, 8, 8);
  else chunk_dp(a, b, t, me, mo);
}

/* The tile's start: 0, or the sum a previous K block left in src (rows x cols of it; the rest 0) */
DPT static inline void tile_in(float *t, const float *src, int64_t ld, int64_t rows, int64_t cols) {
  const __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  for (int r = 0; r < DP_MR; r++) {
    const int on = src && r < rows;
    _mm512_store_ps(t + r * DP_NR, on ? _mm512_maskz_loadu_ps(m0, src + r * ld) : _mm512_setzero_ps());
    _mm512_store_ps(t + r * DP_NR + 16, on ? _mm512_maskz_loadu_ps(m1, src + r * ld + 16) : _mm512_setzero_ps());
  }
}
/* The tile's sum to dst: stored (mode 0), dst + sum (1: beta 1) or fma(beta, dst, sum) (2), under the caller's
 * flush-to-zero and denormals-are-zero modes (bf16.c's combine, bit for bit). */
DPT static inline void tile_out(const float *t, float *dst, int64_t ld, int64_t rows, int64_t cols, int mode,
                                float beta) {
  const __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
  const __m512 vb = _mm512_set1_ps(beta);
  for (int64_t r = 0; r < rows; r++)
    for (int h = 0; h < 2; h++) {
      const __mmask16 m = h ? m1 : m0;
      float *cp = dst + r * ld + 16 * h;
      __m512 x = _mm512_load_ps(t + r * DP_NR + 16 * h);
      if (mode == 1) x = _mm512_add_ps(_mm512_maskz_loadu_ps(m, cp), x);
      else if (mode == 2) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cp), x);
      _mm512_mask_storeu_ps(cp, m, x);
    }
}

/* C = the chunks' sum (beta 0), C + sum (beta 1) or fma(beta, C, sum), on VDPBF16PS. bw: B packed whole
 * (dp_pack_b_whole), or NULL to pack it here. The caller sets flush-to-zero and denormals-are-zero. */
DPT int blocked_dp(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                   int64_t ldb, const uint32_t *bw, float beta, float *C, int64_t ldc) {
  const int64_t nch = (K + 31) / 32, kcc = nch * 32 <= DP_KONE ? nch : DP_KC / 32;
  const int64_t mcb = ta ? DP_MC_T : DP_MC; /* A stored [K,M]: taller blocks, longer runs along its rows */
  const size_t asize = (size_t)(mcb / DP_MR) * (size_t)kcc * (DP_MR * CHUNK_DW);
  uint32_t *buf = (uint32_t *)scratch(asize + (bw ? 0 : dp_packed_b_size(N, K)));
  if (!buf) return -1;
  uint32_t *ap = buf;
  const uint32_t *bp = bw;
  if (!bw) {
    dp_pack_b_whole(tb, B, ldb, N, K, buf + asize);
    bp = buf + asize;
  }
  /* with beta != 0 over several K blocks, the blocks' sums wait in a band of mcb rows until the last block */
  float *w = NULL;
  if (beta != 0.0f && nch > kcc && !(w = workspace((size_t)mcb * (size_t)N))) return -1;
  const int mode = beta == 0.0f ? 0 : beta == 1.0f ? 1 : 2;
  float t[DP_MR * DP_NR] __attribute__((aligned(64)));
  for (int64_t ic = 0; ic < M; ic += mcb) {
    const int64_t mc = M - ic < mcb ? M - ic : mcb;
    for (int64_t c0 = 0; c0 < nch; c0 += kcc) {
      const int64_t kn = nch - c0 < kcc ? nch - c0 : kcc, p0 = c0 * 32, kv = K - p0 < kn * 32 ? K - p0 : kn * 32;
      const int first = c0 == 0, last = c0 + kn >= nch;
      /* the last chunk's steps that hold any k < K (rest = its k below K): even dword m holds 4m, odd 4m + 1 */
      const int rest = (int)(kv - (kn - 1) * 32), me = (rest + 3) / 4, mo = rest / 4 + (rest % 4 > 1);
      pack_a_dp(ta, A, lda, ic, mc, p0, kv, kn, ap);
      for (int64_t jr = 0; jr < N; jr += DP_NR) {
        const int64_t cols = N - jr < DP_NR ? N - jr : DP_NR;
        const uint32_t *bs = bp + ((jr / DP_NR) * nch + c0) * (CHUNK_DW * DP_NR);
        /* the next sliver of B into L2 while this one runs, a few lines per tile */
        const char *bnext = jr + DP_NR < N ? (const char *)(bs + nch * (CHUNK_DW * DP_NR)) : NULL;
        const int64_t blines = kn * (CHUNK_DW * DP_NR) * 4 / 64, tiles = (mc + DP_MR - 1) / DP_MR;
        const int64_t per = (blines + tiles - 1) / tiles;
        for (int64_t ir = 0; ir < mc; ir += DP_MR) {
          const int64_t rows = mc - ir < DP_MR ? mc - ir : DP_MR;
          float *cp = C + (ic + ir) * ldc + jr, *wp = w ? w + ir * N + jr : NULL;
          if (last || !wp) /* the C tile this block reads or writes, on its way while the chunks run */
            for (int64_t r = 0; r < rows; r++) {
              _mm_prefetch((const char *)(cp + r * ldc), _MM_HINT_T0);
              _mm_prefetch((const char *)(cp + r * ldc + 16), _MM_HINT_T0);
            }
          if (bnext)
            for (int64_t q = (ir / DP_MR) * per, e = q + per < blines ? q + per : blines; q < e; q++)
              _mm_prefetch(bnext + q * 64, _MM_HINT_T1);
          tile_in(t, first ? NULL : wp ? wp : cp, wp ? N : ldc, rows, cols);
          ukr_dp(kn, ap + (ir / DP_MR) * kn * (DP_MR * CHUNK_DW), bs, t, me, mo);
          if (last) tile_out(t, cp, ldc, rows, cols, mode, beta);
          else tile_out(t, wp ? wp : cp, wp ? N : ldc, rows, cols, 0, 0.0f);
        }
      }
    }
  }
  return 0;
}

/* ---- The start-up self-check: VDPBF16PS against its emulation (the high pair's FMA, then the low pair's, under
 * flush-to-zero and denormals-are-zero) on crafted lanes: cancellation, ties, the window just below 2^-126 where
 * x86's flush differs from IEEE's, denormals, signed zeros, infinities, NaN, and random lanes of every magnitude.
 * The emulations' order rests on these semantics; a CPU that computes the instruction otherwise runs them instead. */
#define CHECK_LANES 512
static int dp_ok = 0;
static char dp_why[200] = "";
static pthread_once_t dp_once = PTHREAD_ONCE_INIT;

static inline float f_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t u_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
/* The lanes: acc, then the high pair (a, b) and the low pair, as bf16 bits */
static void check_lanes(float *acc, uint32_t *a, uint32_t *b) {
  static const uint16_t special[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x0001, 0x8040,
                                     0x0080, 0x8080, 0x3f80, 0xbf80, 0x7f7f, 0x00ff, 0x3f81, 0x4000, 0xc000};
  const int ns = (int)(sizeof special / sizeof special[0]);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < CHECK_LANES; i++) {
    uint16_t ah, bh, al, bl;
    uint32_t acc_bits;
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t r1 = (uint32_t)(s >> 32), r2 = (uint32_t)s;
    switch (i % 8) {
      case 0: /* random, every magnitude and sign */
        ah = (uint16_t)r1, bh = (uint16_t)(r1 >> 16), al = (uint16_t)r2, bl = (uint16_t)(r2 >> 16);
        acc_bits = r1 ^ (r2 << 7);
        break;
      case 1: { /* cancellation: acc is minus the high product, the low pair small */
        ah = (uint16_t)(0x3c00 + (r1 & 0x7ff)), bh = (uint16_t)(0x3c00 + ((r1 >> 11) & 0x7ff));
        const float p = f_of((uint32_t)ah << 16) * f_of((uint32_t)bh << 16);
        acc_bits = u_of(-p) ^ (r2 & 3);
        al = (uint16_t)(0x3000 + (r2 >> 20 & 0x3ff)), bl = (uint16_t)(0x3000 + (r2 >> 8 & 0x3ff)) | 0x8000;
        break;
      }
      case 2: /* ties: acc near 1, products of 2^-12-ish that land on half an ulp */
        acc_bits = 0x3f800000u + (r1 & 7);
        ah = (uint16_t)(0x39800000u >> 16), bh = ah;
        al = (uint16_t)(0x39800000u >> 16) | (uint16_t)(r2 & 1 ? 0x8000 : 0), bl = ah;
        break;
      case 3: { /* the window below 2^-126: 2^-126 (+ a few ulp) plus a product of -q * 2^-151 and its neighbours */
        acc_bits = 0x00800000u + (r1 & 3);
        const int q = 1 + (int)(r2 % 6);
        ah = (uint16_t)(0x8000 | ((127 - 75) << 7)); /* -2^-75 */
        bh = (uint16_t)(((127 - 76) << 7) | (q & 1 ? 0x40 : 0x00) | (q & 2 ? 0x20 : 0) | (q & 4 ? 0x10 : 0));
        al = (r2 >> 8) & 1 ? 0 : ah, bl = (r2 >> 9) & 1 ? 0 : bh;
        break;
      }
      case 4: /* denormal and tiny inputs and accumulators */
        acc_bits = (r1 & 0x807fffffu) | (r1 & 0x100 ? 0x00800000u : 0);
        ah = (uint16_t)(r2 & 0x807f), bh = (uint16_t)(0x0080 + (r2 >> 16 & 0xff));
        al = (uint16_t)(0x2000 + (r1 >> 16 & 0x1fff)), bl = (uint16_t)(0x0100 + (r2 >> 24));
        break;
      case 5: /* specials against specials and randoms */
        ah = special[r1 % ns], bh = (uint16_t)(r1 & 4 ? special[(r1 >> 8) % ns] : r2);
        al = special[(r2 >> 4) % ns], bl = (uint16_t)(r2 & 8 ? special[(r2 >> 12) % ns] : r1 >> 16);
        acc_bits = r2 & 0x10 ? (uint32_t)special[(r2 >> 20) % ns] << 16 | (r1 & 0xffff) : r1;
        break;
      case 6: /* overflow and near-overflow */
        ah = (uint16_t)(0x7f00 | (r1 & 0x7f)), bh = (uint16_t)(0x4000 | (r1 >> 8 & 0xff));
        al = (uint16_t)(0xff00 | (r2 & 0x7f)), bl = (uint16_t)(0x4000 | (r2 >> 8 & 0xff));
        acc_bits = 0x7f000000u | (r1 >> 9);
        break;
      default: /* ordinary training magnitudes */
        ah = (uint16_t)(0x3800 + (r1 & 0x3ff)) ^ (uint16_t)(r1 & 0x8000), bh = (uint16_t)(0x3a00 + (r1 >> 16 & 0x3ff));
        al = (uint16_t)(0x3800 + (r2 & 0x3ff)) ^ (uint16_t)(r2 & 0x8000), bl = (uint16_t)(0x3a00 + (r2 >> 16 & 0x3ff));
        acc_bits = 0x3e000000u + (r2 >> 8);
        break;
    }
    acc[i] = f_of(acc_bits);
    a[i] = (uint32_t)ah << 16 | al;
    b[i] = (uint32_t)bh << 16 | bl;
  }
}
DPT static void check_hw(const float *acc, const uint32_t *a, const uint32_t *b, float *out) {
  for (int i = 0; i < CHECK_LANES; i += 16)
    _mm512_storeu_ps(out + i, _mm512_dpbf16_ps(_mm512_loadu_ps(acc + i), (__m512bh)_mm512_loadu_si512(a + i),
                                               (__m512bh)_mm512_loadu_si512(b + i)));
}
__attribute__((target("fma"))) static float check_emulate(float acc, uint32_t a, uint32_t b) {
  const float r = _mm_cvtss_f32(
      _mm_fmadd_ss(_mm_set_ss(f_of(a & 0xffff0000u)), _mm_set_ss(f_of(b & 0xffff0000u)), _mm_set_ss(acc)));
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(f_of(a << 16)), _mm_set_ss(f_of(b << 16)), _mm_set_ss(r)));
}
static void dp_check(void) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw")) {
    snprintf(dp_why, sizeof dp_why, "the CPU has no AVX512_BF16");
    return;
  }
  float acc[CHECK_LANES], hw[CHECK_LANES], em[CHECK_LANES];
  uint32_t a[CHECK_LANES], b[CHECK_LANES];
  check_lanes(acc, a, b);
  const unsigned int csr = _mm_getcsr();
  _mm_setcsr(csr & ~0x8040u); /* the instruction ignores MXCSR: run it with the modes off */
  check_hw(acc, a, b, hw);
  _mm_setcsr(csr | 0x8040u);
  for (int i = 0; i < CHECK_LANES; i++) em[i] = check_emulate(acc[i], a[i], b[i]);
  _mm_setcsr(csr);
  /* read by the self-check's test only: plants one wrong expectation to show the fallback */
  const char *plant = getenv("TSTRAIN_TEST_BF16_SELFCHECK");
  if (plant && strcmp(plant, "mismatch") == 0) em[CHECK_LANES / 2] = f_of(u_of(em[CHECK_LANES / 2]) ^ 1u);
  for (int i = 0; i < CHECK_LANES; i++)
    if (u_of(hw[i]) != u_of(em[i])) {
      snprintf(dp_why, sizeof dp_why,
               "VDPBF16PS failed the start-up self-check (lane %d: acc 0x%08x, pairs 0x%08x x 0x%08x gave 0x%08x, "
               "the emulation 0x%08x)",
               i, u_of(acc[i]), a[i], b[i], u_of(hw[i]), u_of(em[i]));
      return;
    }
  dp_ok = 1;
}
int dp_supported(void) {
  pthread_once(&dp_once, dp_check);
  return dp_ok;
}
const char *dp_status(void) {
  pthread_once(&dp_once, dp_check);
  return dp_why;
}
#endif
