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
 * exponent (internal.h: fma_ftz; for a sum of two floats the same as flushing a denormal). The emulations run an
 * fp32 micro-kernel on each half chunk (K 16, from 0) under the CPU's flush-to-zero and denormals-are-zero modes (the
 * portable one with the flushes written out), and add the halves into the tile's acc themselves; the VDPBF16PS
 * kernel (kernels/avx512bf16.c) and the AMX one compute the same order in hardware: the same bits. */

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

/* out[M,N] = acc (the chunks' sums, before any combine with C) on an fp32 micro-kernel: per tile and chunk, the
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

/* The portable kernel of the emulation: the flushes written out (the CPU's modes are x86's) */
static const gemm_kernel PORTABLE_BF16 = {.mr = P_MR,
                                          .nr = P_NR,
                                          .mc = P_MC,
                                          .kc = P_KC,
                                          .nc = P_NC,
                                          .kone = P_KONE,
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
#endif
  /* the chunks' sum in out (C itself when beta is 0), then C = acc or acc combined with beta*C once */
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
