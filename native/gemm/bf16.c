/*
 * bf16 products (gemm.h: gemm_bf16): the one order of summation (AMX's TDPBF16PS), its emulation on the fp32
 * micro-kernels, and the choice between it and the AMX kernel (kernels/amx.c).
 */
#include "internal.h"

#include <stdlib.h>

/* The order, TDPBF16PS's (AMX-BF16; measured on an Intel Xeon with AMX against its documented pseudo-code: 0
 * mismatches in 10^6 elements with every class of input, and 7-66 % for the orders it was told apart from): K is
 * padded with zeros to a multiple of 32 and cut into chunks of 32; in each chunk one chain runs over its 16 even k
 * and one over its 16 odd k, each from 0, e = ftz(fma(a[k], b[k], e)); then acc = ftz(acc + ftz(e + o)), acc from
 * 0 over the chunks in order; every input a denormal read as 0. Then C = acc, ftz(ftz(C) + acc) or
 * ftz(fma(beta, ftz(C), acc)). ftz is x86's flush: a result below 2^-126 once rounded to 24 bits with an unbounded
 * exponent (internal.h: fma_ftz; for a sum of two floats the same as flushing a denormal). The emulations run it on
 * the fp32 kernels' FMAs: the x86 ones (AVX2, AVX-512) fused into their tiles under the CPU's flush-to-zero and
 * denormals-are-zero modes, each chunk's even and odd chains in registers and acc = acc + (e + o) into the tile's
 * running sum in L1 (blocked_fused; kernels/avx2.c, kernels/avx512.c); the portable one on its micro-kernel on each
 * half chunk (K 16, from 0) with the flushes written out, adding the halves into the tile's acc itself (blocked_bf16).
 * The VDPBF16PS kernel (kernels/avx512bf16.c) and the AMX one compute the same order in hardware: the same bits. */

/* As pack_a / pack_b (alpha 1), every value rounded to bf16 and each chunk of 32 k laid out as its 16 even k then
 * its 16 odd k: kv values of k in a panel of kc (a multiple of 32, zeros past kv). */
static inline int64_t chunk_pos(int64_t p) { return (p & ~31) + ((p & 1) << 4) + ((p & 31) >> 1); }
static void pack_a_chunks(int mr, int ta, const float *A, int64_t lda, int64_t i0, int64_t p0, int64_t mc, int64_t kv,
                          int64_t kc, float *ap) {
  for (int64_t s = 0; s < mc; s += mr, ap += mr * kc) {
    const int64_t rows = mc - s < mr ? mc - s : mr;
    for (int64_t p = 0; p < kc; p++) {
      float *dst = ap + chunk_pos(p) * mr;
      for (int64_t r = 0; r < mr; r++)
        dst[r] = r < rows && p < kv ? bf16_round(ta ? A[(p0 + p) * lda + i0 + s + r] : A[(i0 + s + r) * lda + p0 + p])
                                    : 0.0f;
    }
  }
}
static void pack_b_chunks(int nr, int tb, const float *B, int64_t ldb, int64_t p0, int64_t j0, int64_t kv, int64_t kc,
                          int64_t nc, float *bp) {
  for (int64_t s = 0; s < nc; s += nr, bp += nr * kc) {
    const int64_t cols = nc - s < nr ? nc - s : nr;
    for (int64_t p = 0; p < kc; p++) {
      float *dst = bp + chunk_pos(p) * nr;
      for (int64_t j = 0; j < nr; j++)
        dst[j] = j < cols && p < kv ? bf16_round(tb ? B[(j0 + s + j) * ldb + p0 + p] : B[(p0 + p) * ldb + j0 + s + j])
                                    : 0.0f;
    }
  }
}

/* out[M,N] = acc (the chunks' sums, before any combine with C) on the portable micro-kernel: per tile and chunk, the
 * even and the odd half each as a K-16 chain from 0, then acc += e + o. */
static int blocked_bf16(const gemm_kernel *g, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                        int64_t lda, const float *B, int64_t ldb, float *out, int64_t ldo) {
  const int mr = g->mr, nr = g->nr;
  const int64_t kcMax = g->kc / BF_CHUNK * BF_CHUNK > 0 ? g->kc / BF_CHUNK * BF_CHUNK : BF_CHUNK;
  const int64_t ncMax = ((N < g->nc ? N : g->nc) + nr - 1) / nr * nr;
  const int64_t mcMax = ((M < g->mc ? M : g->mc) + mr - 1) / mr * mr;
  const size_t bsize = (size_t)(((ncMax * kcMax) + 15) / 16 * 16);
  float *buf = scratch(bsize + (size_t)(mcMax * kcMax) + 16);
  if (!buf) return -1;
  float *bp = buf, *ap = buf + bsize;
  float e[BF_TILE_MAX], o[BF_TILE_MAX], acc[BF_TILE_MAX];
  for (int64_t jc = 0; jc < N; jc += g->nc) {
    const int64_t nc = N - jc < g->nc ? N - jc : g->nc;
    for (int64_t pc = 0; pc < K; pc += kcMax) {
      const int64_t kv = K - pc < kcMax ? K - pc : kcMax, kc = (kv + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK;
      pack_b_chunks(nr, tb, B, ldb, pc, jc, kv, kc, nc, bp);
      for (int64_t ic = 0; ic < M; ic += g->mc) {
        const int64_t mc = M - ic < g->mc ? M - ic : g->mc;
        pack_a_chunks(mr, ta, A, lda, ic, pc, mc, kv, kc, ap);
        for (int64_t jr = 0; jr < nc; jr += nr) {
          const int64_t cols = nc - jr < nr ? nc - jr : nr;
          for (int64_t ir = 0; ir < mc; ir += mr) {
            const int64_t rows = mc - ir < mr ? mc - ir : mr;
            float *cp = out + (ic + ir) * ldo + jc + jr;
            for (int64_t r = 0; r < mr; r++)
              for (int64_t j = 0; j < nr; j++)
                acc[r * nr + j] = pc > 0 && r < rows && j < cols ? cp[r * ldo + j] : 0.0f;
            for (int64_t c = 0; c < kc; c += BF_CHUNK) {
              g->ukr(BF_CHUNK / 2, ap + ir * kc + c * mr, bp + jr * kc + c * nr, e, nr, 0, 0, 0.0f);
              g->ukr(BF_CHUNK / 2, ap + ir * kc + (c + BF_CHUNK / 2) * mr, bp + jr * kc + (c + BF_CHUNK / 2) * nr, o,
                     nr, 0, 0, 0.0f);
              for (int i = 0; i < mr * nr; i++) acc[i] = ftz(acc[i] + ftz(e[i] + o[i]));
            }
            for (int64_t r = 0; r < rows; r++)
              for (int64_t j = 0; j < cols; j++) cp[r * ldo + j] = acc[r * nr + j];
          }
        }
      }
    }
  }
  return 0;
}

#ifdef GEMM_X86
/* ---- The x86 emulations, fused: the fp32 kernel's packing (k in order) with every value rounded to bf16, and its
 * tile running the chunks' even and odd chains in registers (kernels/avx2.c, kernels/avx512.c: *_bf16), the tile's
 * running sum in L1, meeting C once per K block. */

/* n floats in place (n a multiple of 8; of 16 on AVX-512), each rounded to bf16 as bf16_round does, under the
 * caller's denormals-are-zero mode (gemm_bf16 sets it): y = x * 1 is x, a signed 0 for a denormal, a NaN made quiet;
 * then y to nearest even on its top 16 bits, a NaN's low 16 bits cut off. The 1 is hidden from the compiler, which
 * would drop the multiply (x * 1 = x in IEEE arithmetic, without DAZ). */
__attribute__((target("avx2"))) static void round_bf16_avx2(float *x, int64_t n) {
  __m256 one = _mm256_set1_ps(1.0f);
  __asm__("" : "+x"(one));
  const __m256i hi = _mm256_set1_epi32((int)0xffff0000u), half = _mm256_set1_epi32(0x7fff), lsb = _mm256_set1_epi32(1);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 y = _mm256_mul_ps(_mm256_load_ps(x + i), one);
    const __m256i u = _mm256_castps_si256(y);
    const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, half), _mm256_and_si256(_mm256_srli_epi32(u, 16), lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    _mm256_store_si256((__m256i *)(x + i), _mm256_and_si256(_mm256_blendv_epi8(r, u, nan), hi));
  }
}
__attribute__((target("avx512f"))) static void round_bf16_avx512(float *x, int64_t n) {
  __m512 one = _mm512_set1_ps(1.0f);
  __asm__("" : "+v"(one));
  const __m512i hi = _mm512_set1_epi32((int)0xffff0000u), half = _mm512_set1_epi32(0x7fff), lsb = _mm512_set1_epi32(1);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 y = _mm512_mul_ps(_mm512_load_ps(x + i), one);
    const __m512i u = _mm512_castps_si512(y);
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, half), _mm512_and_si512(_mm512_srli_epi32(u, 16), lsb));
    const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    _mm512_store_si512(x + i, _mm512_and_si512(_mm512_mask_mov_epi32(r, nan, u), hi));
  }
}
/* w: the sliver's width (8 rows or 32 columns: the AVX-512 kernel's; n then a multiple of 16) */
static void round_bf16(float *x, int64_t n, int w) {
  if (w == A5_MR || w == A5_NR) round_bf16_avx512(x, n);
  else round_bf16_avx2(x, n);
}
/* Slivers of w floats a k packed kv k long, from p on, laid out again kcp long (kcp > kv), zeros past kv: the last
 * sliver first, each moved up (never onto one not moved yet) */
static void spread(float *p, int64_t slivers, int w, int64_t kv, int64_t kcp) {
  for (int64_t s = slivers - 1; s >= 0; s--) {
    memmove(p + s * w * kcp, p + s * w * kv, (size_t)(w * kv) * sizeof(float));
    memset(p + s * w * kcp + w * kv, 0, (size_t)(w * (kcp - kv)) * sizeof(float));
  }
}
/* op(A)[i0 : i0 + mc, p0 : p0 + kv] into mr-row slivers of kcp k each (pack_a's layout; zeros past kv and mc),
 * rounded. The whole slivers apart from a last cut one, which pack_a's transposes and copies leave to its loops (A
 * stored [K,M]: attention's 64-row blocks) */
static void pack_a_bf16(int mr, int ta, const float *A, int64_t lda, int64_t i0, int64_t p0, int64_t mc, int64_t kv,
                        int64_t kcp, float *ap) {
  const int64_t slivers = (mc + mr - 1) / mr, whole = mc / mr * mr;
  if (whole) pack_a(mr, ta, A, lda, i0, p0, whole, kv, 1.0f, ap);
  if (mc > whole) pack_a(mr, ta, A, lda, i0 + whole, p0, mc - whole, kv, 1.0f, ap + whole * kv);
  if (kv < kcp) spread(ap, slivers, mr, kv, kcp);
  round_bf16(ap, slivers * mr * kcp, mr);
}
/* op(B)[p0 : p0 + kv, j0 : j0 + nc] into nr-column slivers of kcp k each (pack_b's layout), rounded */
static void pack_b_bf16(int nr, int tb, const float *B, int64_t ldb, int64_t p0, int64_t j0, int64_t kv, int64_t kcp,
                        int64_t nc, float *bp) {
  const int64_t slivers = (nc + nr - 1) / nr;
  pack_b(nr, tb, B, ldb, p0, j0, kv, nc, bp);
  if (kv < kcp) spread(bp, slivers, nr, kv, kcp);
  round_bf16(bp, slivers * nr * kcp, nr);
}

/* lanes below n of 8 */
__attribute__((target("avx2"))) static inline __m256i lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* The tile's start (mr x nr): 0, or the sum a previous K block left in src (rows x cols of it; the rest 0) */
__attribute__((target("avx2"))) static void tile_in(int mr, int nr, float *t, const float *src, int64_t ld,
                                                    int64_t rows, int64_t cols) {
  for (int r = 0; r < mr; r++)
    for (int v = 0; v < nr; v += 8) {
      __m256 x = _mm256_setzero_ps();
      if (src && r < rows && v < cols)
        x = cols >= v + 8 ? _mm256_loadu_ps(src + r * ld + v) : _mm256_maskload_ps(src + r * ld + v, lanes(cols - v));
      _mm256_store_ps(t + r * nr + v, x);
    }
}
/* The tile's sum to dst (rows x cols of it): stored (mode 0), dst + sum (1: beta 1) or fma(beta, dst, sum) (2), under
 * the caller's flush-to-zero and denormals-are-zero modes: bf16.c's combine, ftz(ftz(C) + acc) and
 * ftz(fma(ftz(beta), ftz(C), acc)), bit for bit */
__attribute__((target("avx2,fma"))) static void tile_out(int nr, const float *t, float *dst, int64_t ld, int64_t rows,
                                                         int64_t cols, int mode, float beta) {
  const __m256 vb = _mm256_set1_ps(beta);
  for (int64_t r = 0; r < rows; r++)
    for (int v = 0; v < nr && v < cols; v += 8) {
      float *d = dst + r * ld + v;
      const int whole = cols >= v + 8;
      const __m256i m = lanes(cols - v);
      __m256 x = _mm256_load_ps(t + r * nr + v);
      if (mode) {
        const __m256 c = whole ? _mm256_loadu_ps(d) : _mm256_maskload_ps(d, m);
        x = mode == 1 ? _mm256_add_ps(c, x) : _mm256_fmadd_ps(vb, c, x);
      }
      if (whole) _mm256_storeu_ps(d, x);
      else _mm256_maskstore_ps(d, m, x);
    }
}

/* Chunks of 32 k per K block: K in one block where its A sliver fits half of L1 and B across all of N at most
 * A_WHOLE floats (blocked_fused packs that once, each A block running its panels): the tile's sum stays in L1
 * whatever K, so more K blocks would only meet C (or a workspace) again (the head's dE, TN 49152 x 576 x 341 on AVX2:
 * paired median time 0.93 against two blocks, a band of workspace each); or where K padded to whole chunks is at
 * most g->kone; else K in equal blocks of whole chunks, each at most g->kc of k (at least one chunk) */
static int64_t bf16_block_chunks(const gemm_kernel *g, int64_t N, int64_t K) {
  const int64_t nch = (K + BF_CHUNK - 1) / BF_CHUNK, most = g->kc / BF_CHUNK > 0 ? g->kc / BF_CHUNK : 1;
  const int64_t kp = nch * BF_CHUNK, np = (N + g->nr - 1) / g->nr * g->nr;
  if (kp <= g->kone || (kp <= g->kslv && kp * np <= A_WHOLE)) return nch;
  const int64_t blocks = (nch + most - 1) / most;
  return (nch + blocks - 1) / blocks;
}

/* One K block (kn chunks) of the tiles of C[ic : ic + mc, jc : jc + nc]: A's slivers at as (sliver s at as + s * mr *
 * ka), B's at bs (sliver s at bs + s * nr * kcp). Each tile's sum starts at 0 (first) or where the block before left
 * it (in C, or in w: M x N, row major), and goes back there, or meets C (last, mode: bf16.c's combine). */
typedef struct {
  const gemm_kernel *g;
  bf16_tile_fn tile;
  int64_t N;
  float *C, *w;
  int64_t ldc;
  int mode;
  float beta;
} fused_job;
static void fused_tiles(const fused_job *j, int64_t ic, int64_t mc, int64_t jc, int64_t nc, const float *as, int64_t ka,
                        const float *bs, int64_t kcp, int64_t kn, int first, int last) {
  const int mr = j->g->mr, nr = j->g->nr;
  float t[A5_MR * A5_NR] __attribute__((aligned(64))), e[A5_MR * A5_NR] __attribute__((aligned(64)));
  for (int64_t ir = 0; ir < mc; ir += mr) {
    const int64_t rows = mc - ir < mr ? mc - ir : mr;
    for (int64_t jr = 0; jr < nc; jr += nr) {
      const int64_t cols = nc - jr < nr ? nc - jr : nr;
      float *cp = j->C + (ic + ir) * j->ldc + jc + jr, *wp = j->w ? j->w + (ic + ir) * j->N + jc + jr : NULL;
      /* the sum's home this block (C, or w before the last block), and the next tile's, on its way while this one
       * runs (C is often a gradient, cold from memory: as blocked() fetches it) */
      float *home = wp && !last ? wp : cp;
      const int64_t ld = wp && !last ? j->N : j->ldc;
      const float *next = jr + nr < nc ? home + nr : ir + mr < mc ? home - jr + mr * ld : NULL;
      for (int r = 0; next && r < mr; r++) {
        _mm_prefetch((const char *)(next + r * ld), _MM_HINT_T0);
        _mm_prefetch((const char *)(next + r * ld + nr - 1), _MM_HINT_T0);
      }
      tile_in(mr, nr, t, first ? NULL : wp ? wp : cp, wp ? j->N : j->ldc, rows, cols);
      j->tile(kn, as + ir * ka, bs + jr * kcp, t, e);
      tile_out(nr, t, home, ld, rows, cols, last ? j->mode : 0, j->beta);
    }
  }
}

/* C (M x N) = the chunks' sums (beta 0), C + sums (beta 1) or fma(beta, C, sums), on g's tile fused with the order,
 * in blocked()'s blocks. K in blocks of whole chunks: each block after the first continues the tile's sum from where
 * the one before left it, in C, or in w (M x N, row major) when given (beta != 0 over several blocks), and the last
 * one meets C. Where N takes one B panel, blocked()'s loops. Where it takes several, each operand packed (and
 * rounded) once, not once per panel: A whole where it is at most A_WHOLE floats (the LM head's logits: 220 panels of N
 * on the AVX-512 kernel), else B's K block across all of N where that is at most A_WHOLE floats, each A block then
 * running every panel of it (a linear's N = 1536; 576 on the AVX-512 kernel, K in one block). */
static int blocked_fused(const gemm_kernel *g, bf16_tile_fn tile, int ta, int tb, int64_t M, int64_t N, int64_t K,
                         const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                         float *w) {
  const int mr = g->mr, nr = g->nr;
  const int64_t nch = (K + BF_CHUNK - 1) / BF_CHUNK, per = bf16_block_chunks(g, N, K), kcMax = per * BF_CHUNK;
  const int64_t ncMax = panel_cols(g, N, kcMax), mcMax = ((M < g->mc ? M : g->mc) + mr - 1) / mr * mr;
  const int64_t kp = nch * BF_CHUNK, mp = (M + mr - 1) / mr * mr, np = (N + nr - 1) / nr * nr;
  const int awhole = ncMax < N && mp * kp <= A_WHOLE, bwhole = ncMax < N && !awhole && kcMax * np <= A_WHOLE;
  const size_t bsize = (size_t)(((bwhole ? np : ncMax) * kcMax + 15) / 16 * 16);
  /* + 16: transpose8's overhang (6 rows) */
  float *buf = scratch(bsize + (size_t)(awhole ? mp * kp : mcMax * kcMax) + 16);
  if (!buf) return -1;
  float *bp = buf, *ap = buf + bsize;
  const fused_job j = {.g = g,
                       .tile = tile,
                       .N = N,
                       .C = C,
                       .w = w,
                       .ldc = ldc,
                       .mode = beta == 0.0f   ? 0
                               : beta == 1.0f ? 1
                                              : 2,
                       .beta = beta};
  if (awhole) pack_a_bf16(mr, ta, A, lda, 0, 0, M, K, kp, ap);
  for (int64_t jc = 0; jc < N; jc += bwhole ? N : ncMax) {
    const int64_t nc = N - jc < ncMax ? N - jc : ncMax;
    for (int64_t c0 = 0; c0 < nch; c0 += per) {
      const int64_t kn = nch - c0 < per ? nch - c0 : per, p0 = c0 * BF_CHUNK, kcp = kn * BF_CHUNK;
      const int64_t kv = K - p0 < kcp ? K - p0 : kcp;
      const int first = c0 == 0, last = c0 + kn >= nch;
      pack_b_bf16(nr, tb, B, ldb, p0, jc, kv, kcp, bwhole ? N : nc, bp);
      for (int64_t ic = 0; ic < M; ic += g->mc) {
        const int64_t mc = M - ic < g->mc ? M - ic : g->mc;
        if (!awhole) pack_a_bf16(mr, ta, A, lda, ic, p0, mc, kv, kcp, ap);
        const float *as = awhole ? ap + ic * kp + p0 * mr : ap;
        if (!bwhole) fused_tiles(&j, ic, mc, jc, nc, as, awhole ? kp : kcp, bp, kcp, kn, first, last);
        else /* every panel of B's block, this A block's slivers in L2 */
          for (int64_t jw = 0; jw < N; jw += ncMax)
            fused_tiles(&j, ic, mc, jw, N - jw < ncMax ? N - jw : ncMax, as, kcp, bp + jw * kcp, kcp, kn, first, last);
      }
    }
  }
  return 0;
}
#endif

/* The portable kernel of the emulation: the flushes written out (the CPU's modes are x86's) */
static const gemm_kernel PORTABLE_BF16 = {.mr = P_MR,
                                          .nr = P_NR,
                                          .mc = P_MC,
                                          .kc = P_KC,
                                          .nc = P_NC,
                                          .kone = P_KONE,
                                          .panel1 = PANEL,
                                          .paneln = PANEL,
                                          .kslv = 0,
                                          .ukr = ukr_portable_bf16,
                                          .name = "portable",
                                          .detail = "portable C 4x16"};

int gemm_bf16_hw_supported(void) {
#ifdef GEMM_X86
  return amx_supported();
#else
  return 0;
#endif
}
int gemm_bf16_dp_supported(void) {
#ifdef GEMM_X86
  return dp_supported();
#else
  return 0;
#endif
}
const char *gemm_bf16_dp_status(void) {
#ifdef GEMM_X86
  return dp_status();
#else
  return "the CPU is not x86-64";
#endif
}

int gemm_bf16(gemm_isa isa, int hw, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return 0;
  gemm_blocks_setup();
  if (isa == GEMM_ISA_AUTO) isa = gemm_best_isa();
  hw = hw == GEMM_BF16_AMX  ? (gemm_bf16_hw_supported() ? GEMM_BF16_AMX : GEMM_BF16_EMULATED)
       : hw == GEMM_BF16_DP ? (gemm_bf16_dp_supported() ? GEMM_BF16_DP : GEMM_BF16_EMULATED)
                            : GEMM_BF16_EMULATED;
  const gemm_kernel *e = isa == GEMM_ISA_PORTABLE ? &PORTABLE_BF16 : &KERNELS[isa];
#ifdef GEMM_X86
  /* flush-to-zero, denormals-are-zero: the hardware's modes, for the x86 emulations; the portable one writes its
   * flushes out and runs with both off, as it runs on a CPU without them */
  const unsigned int csr = _mm_getcsr();
  _mm_setcsr(e == &PORTABLE_BF16 ? csr & ~0x8040u : csr | 0x8040u);
#endif
  int rc = 0;
#ifdef GEMM_X86
  /* AMX with K in one block: each tile's sum meets C in place (no workspace) */
  if (hw == GEMM_BF16_DP && K > 0) { /* its blocks meet C themselves (a band of workspace over several K blocks) */
    rc = blocked_dp(ta, tb, M, N, K, A, lda, B, ldb, (const uint32_t *)weight_packed(GEMM_BF16_DP, tb, B, ldb, N, K),
                    beta, C, ldc);
    _mm_setcsr(csr);
    return rc;
  }
  if (hw == GEMM_BF16_AMX && beta != 0.0f && K > 0 && K <= AMX_KC_ONE) {
    rc = blocked_amx(ta, tb, M, N, K, A, lda, B, ldb, (const uint16_t *)weight_packed(GEMM_BF16_AMX, tb, B, ldb, N, K),
                     beta, C, ldc);
    _mm_setcsr(csr);
    return rc;
  }
  /* the x86 emulations: the order fused into the fp32 kernel's tile; with beta != 0 over several K blocks, C in bands
   * of rows whose blocks' sums wait in a workspace (about WS_BAND floats) until the last block meets C */
  if (hw == GEMM_BF16_EMULATED && e != &PORTABLE_BF16 && K > 0) {
    if (fast_pack < 0) fast_pack = gemm_isa_supported(GEMM_ISA_AVX2);
    const bf16_tile_fn tile = e == &KERNELS[GEMM_ISA_AVX512] ? tile_avx512_bf16 : tile_avx2_bf16;
    if (beta == 0.0f || bf16_block_chunks(e, N, K) * BF_CHUNK >= K)
      rc = blocked_fused(e, tile, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, NULL);
    else {
      int64_t band = WS_BAND / N / e->mr * e->mr;
      if (band < 4 * e->mr) band = 4 * e->mr;
      float *w = workspace((size_t)((band < M ? band : M) * N));
      if (!w) rc = -1;
      for (int64_t i = 0; !rc && i < M; i += band)
        rc = blocked_fused(e, tile, ta, tb, M - i < band ? M - i : band, N, K, ta ? A + i : A + i * lda, lda, B, ldb,
                           beta, C + i * ldc, ldc, w);
    }
    _mm_setcsr(csr);
    return rc;
  }
#endif
  /* the portable emulation: the chunks' sum in out (C itself when beta is 0), then C = acc or acc combined with
   * beta*C once */
  float *w = beta == 0.0f ? NULL : (float *)malloc((size_t)(M * N) * sizeof(float));
  float *out = w ? w : C;
  const int64_t ldo = w ? N : ldc;
  if (beta != 0.0f && !w) rc = -1;
  else if (K <= 0)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) out[i * ldo + j] = 0.0f;
#ifdef GEMM_X86
  else if (hw == GEMM_BF16_AMX)
    rc = blocked_amx(ta, tb, M, N, K, A, lda, B, ldb, (const uint16_t *)weight_packed(GEMM_BF16_AMX, tb, B, ldb, N, K),
                     0.0f, out, ldo);
#endif
  else rc = blocked_bf16(e, ta, tb, M, N, K, A, lda, B, ldb, out, ldo);
  if (w && !rc)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        float *cp = C + i * ldc + j;
        const float x = w[i * N + j];
        *cp = beta == 1.0f ? ftz(ftz(*cp) + x) : fma_ftz(ftz(beta), ftz(*cp), x);
      }
  free(w);
#ifdef GEMM_X86
  _mm_setcsr(csr);
#endif
  return rc;
}
