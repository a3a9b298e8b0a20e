/*
 * tstrain's own single-precision GEMM, in BLIS' structure (Van Zee & van de Geijn, "BLIS: A Framework for
 * Rapidly Instantiating BLAS Functionality"): the K dimension in blocks of KC, B packed into KC x NC panels
 * (kept in L3/L2), A packed into MC x KC blocks (L2), and a register-blocked micro-kernel that multiplies an
 * MR x KC sliver of A by a KC x NR sliver of B (L1) into an MR x NR tile of C held in registers.
 *
 * One order of summation on every kernel: each C element is one chain of fused multiply-adds over k = 0..K-1,
 * started from 0, and combined with beta*C once at the end (gemm.h). The vector width only decides which
 * elements are computed side by side, never the order within one element, so AVX-512, AVX2 and the portable
 * C kernel give identical bits. A chain that crosses a KC block is stored to C (or to a workspace when beta is
 * not 0) in fp32 and reloaded: exact. Every file is built with -ffp-contract=off and without -ffast-math: every
 * FMA is written as one (fmaf, _mm512_fmadd_ps, _mm256_fmadd_ps), no other a*b+c is fused.
 *
 * Each kernel is compiled for its own target (function attributes), never -march=native: one binary runs on
 * every x86-64 CPU and picks its kernel at run time (gemm_best_isa).
 *
 * This file is the frame (BLIS' "framework" layer): the kernel tables, gemm_sgemm's choice between the two drivers
 * (direct() for small products read in place, blocked() for the rest) and the drivers themselves. The kernels are in
 * kernels/, the packing in pack.c, the block sizes in config.h, the bf16 products in bf16.c (native/README.md).
 */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* ------------------------------------------------------------------ the kernels */
gemm_kernel KERNELS[3] = {
    [GEMM_ISA_PORTABLE] = {.mr = P_MR,
                           .nr = P_NR,
                           .mc = P_MC,
                           .kc = P_KC,
                           .nc = P_NC,
                           .kone = P_KONE,
                           .ukr = ukr_portable,
                           .name = "portable",
                           .detail = "portable C 4x16"},
#ifdef GEMM_X86
    [GEMM_ISA_AVX2] = {.mr = A2_MR,
                       .nr = A2_NR,
                       .mc = 0, /* gemm_blocks_setup */
                       .kc = 0,
                       .nc = A2_NC,
                       .kone = A2_KONE,
                       .ukr = ukr_avx2,
                       .name = "avx2",
                       .detail = "AVX2+FMA 6x16"},
    [GEMM_ISA_AVX512] = {.mr = A5_MR,
                         .nr = A5_NR,
                         .mc = A5_MC,
                         .kc = A5_KC,
                         .nc = A5_NC,
                         .kone = A5_KONE,
                         .ukr = ukr_avx512,
                         .name = "avx512",
                         .detail = "AVX-512F 8x32"},
#else
    [GEMM_ISA_AVX2] = {.mr = P_MR,
                       .nr = P_NR,
                       .mc = P_MC,
                       .kc = P_KC,
                       .nc = P_NC,
                       .kone = P_KONE,
                       .ukr = ukr_portable,
                       .name = "avx2",
                       .detail = "(not on this CPU)"},
    [GEMM_ISA_AVX512] = {.mr = P_MR,
                         .nr = P_NR,
                         .mc = P_MC,
                         .kc = P_KC,
                         .nc = P_NC,
                         .kone = P_KONE,
                         .ukr = ukr_portable,
                         .name = "avx512",
                         .detail = "(not on this CPU)"},
#endif
};

#ifdef GEMM_X86
const direct_kernel DIRECT[3] = {
    [GEMM_ISA_PORTABLE] = {.mr = 0, .nr = 0, .strided = NULL, .rows = NULL, .combine = NULL, .kc = 0},
    [GEMM_ISA_AVX2] = {.mr = A2_MR,
                       .nr = A2_NR,
                       .strided = tile_avx2,
                       .rows = tile_avx2_rows,
                       .combine = combine_avx2,
                       .kc = A2_DIRECT_KC},
    [GEMM_ISA_AVX512] = {.mr = A5_MR,
                         .nr = A5_NR,
                         .strided = tile_avx512,
                         .rows = tile_avx512_rows,
                         .combine = combine_avx512,
                         .kc = A5_DIRECT_KC},
};
#endif

/* ------------------------------------------------------------------ the blocks, from this CPU's caches */
/* Read once (gemm_blocks_setup; every entry point calls it before a product reads a block size). Only the blocks
 * depend on them, never a chain: the same bits on any machine. */
/* Line one of cpu0's cache index i's FIELD in sysfs (Linux; the cores alike), into out; 0 where there is none */
static int cache_field(int i, const char *field, char *out, int n) {
  char path[96];
  snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, field);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  const int ok = fgets(out, n, f) != NULL;
  fclose(f);
  return ok;
}
/* This CPU's level-`level` data or unified cache: its bytes and ways, from sysfs; 0 where it says nothing */
static void sysfs_cache(int level, int64_t *bytes, int *ways) {
  char v[32];
  *bytes = 0, *ways = 0;
  for (int i = 0; cache_field(i, "level", v, sizeof v); i++) {
    if (atoi(v) != level || !cache_field(i, "type", v, sizeof v) ||
        (strncmp(v, "Data", 4) != 0 && strncmp(v, "Unified", 7) != 0))
      continue;
    if (cache_field(i, "size", v, sizeof v)) {
      char *end;
      const long n = strtol(v, &end, 10);
      *bytes = (int64_t)n * (*end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : 1);
    }
    if (cache_field(i, "ways_of_associativity", v, sizeof v)) *ways = atoi(v);
    return;
  }
}
static void set_blocks(void) {
  int64_t l1, l2;
  int w1, w2; /* L2's ways: unused (the rule takes fractions of L2) */
  sysfs_cache(1, &l1, &w1);
  sysfs_cache(2, &l2, &w2);
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
  if (l1 <= 0) l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), w1 = (int)sysconf(_SC_LEVEL1_DCACHE_ASSOC);
  if (l2 <= 0) l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  if (l1 <= 0) l1 = A2_L1, w1 = A2_L1_WAYS;
  if (w1 <= 1) w1 = A2_L1_WAYS;
  if (l2 <= 0) l2 = A2_L2;
  /* the AVX-512 and portable kernels: their measured sizes (config.h), the panels by L2 */
  int64_t paneln = l2 / 2 / (int64_t)sizeof(float);
  paneln = paneln < PANEL_MIN ? PANEL_MIN : paneln > PANEL ? PANEL : paneln;
  for (int i = 0; i < 3; i++) {
    KERNELS[i].panel1 = PANEL, KERNELS[i].paneln = paneln;
    KERNELS[i].kslv = l1 / 2 / ((int64_t)sizeof(float) * KERNELS[i].mr);
  }
#ifdef GEMM_X86
  /* AVX2: config.h's rule */
  gemm_kernel *k = &KERNELS[GEMM_ISA_AVX2];
  int64_t kc = l1 * (w1 - 1) / w1 / ((int64_t)sizeof(float) * (k->mr + k->nr)) / 32 * 32;
  kc = kc > A2_KC_MAX ? A2_KC_MAX : kc < 64 ? 64 : kc;
  const int64_t mc = l2 / 4 / ((int64_t)sizeof(float) * kc) / k->mr * k->mr;
  k->kc = kc;
  k->mc = mc < 4 * k->mr ? 4 * k->mr : mc;
  k->panel1 = l2 * 3 / 4 / (int64_t)sizeof(float);
  k->panel1 = k->panel1 > PANEL ? PANEL : k->panel1;
  k->paneln = l2 / 2 / (int64_t)sizeof(float);
  k->paneln = k->paneln > PANEL ? PANEL : k->paneln;
#endif
}
static pthread_once_t blocks_once = PTHREAD_ONCE_INIT;
void gemm_blocks_setup(void) { pthread_once(&blocks_once, set_blocks); }

int gemm_isa_supported(gemm_isa isa) {
  if (isa == GEMM_ISA_PORTABLE) return 1;
#ifdef GEMM_X86
  __builtin_cpu_init();
  if (isa == GEMM_ISA_AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == GEMM_ISA_AVX512) return __builtin_cpu_supports("avx512f");
#endif
  return 0;
}

gemm_isa gemm_best_isa(void) {
  if (gemm_isa_supported(GEMM_ISA_AVX512)) return GEMM_ISA_AVX512;
  if (gemm_isa_supported(GEMM_ISA_AVX2)) return GEMM_ISA_AVX2;
  return GEMM_ISA_PORTABLE;
}

const char *gemm_isa_name(gemm_isa isa) { return isa <= GEMM_ISA_AVX512 ? KERNELS[isa].name : "auto"; }
const char *gemm_isa_detail(gemm_isa isa) { return isa <= GEMM_ISA_AVX512 ? KERNELS[isa].detail : "auto"; }

/* ------------------------------------------------------------------ small products, read in place */
/* A product with few rows (attention's per-head blocks) reads its packed panels too few times to pay for the copy,
 * so it runs straight from its operands: B stored [K,N] rows are the B sliver (stride ldb), A is read as stored
 * ([K,M]: the strided kernel; [M,K]: the row-pointer kernel), alpha is 1, and each tile runs the whole K in one
 * chain (A stored [K,M] on AVX2: in K blocks, see direct()), then meets beta*C. The last row and column tiles are
 * moved back to end at M and N (they overlap tiles already done, recomputing the same chains) and only their new
 * elements reach C. Same order, same bits.
 * B's rows in place are often a multiple of 1 or 4 KiB apart (attention's [E,T] keys, T = 256 or 1024), which maps
 * a column tile's every row to the same few L1 sets: the column's first row tile reads them in place and stores
 * each into a contiguous sliver as it goes (the stores ride along the FMAs), which the other row tiles read. A
 * separate copy before the tiles cost 5-10 % of these products (C harness, 64 x 64 x 256: 0.87 of the peak with
 * it, 0.95 with the copy folded into the first tile). */
#ifdef GEMM_X86
static int direct(const direct_kernel *d, int ta, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  const int mr = d->mr, nr = d->nr;
  float t[A5_MR * A5_NR] __attribute__((aligned(64)));
  /* A stored [K,M]: K in equal blocks of at most d->kc (0: one block), so that the column tile's B rows stay in L1;
   * the blocks before the last continue each chain in w (M x N), the last meets beta*C. (A stored [M,K], attention's
   * att v at T = 1024, ran 4 % slower in blocks: its rows of A in place stream well.) */
  const int64_t kblocks = ta && d->kc && K > d->kc ? (K + d->kc - 1) / d->kc : 1, kcMax = (K + kblocks - 1) / kblocks;
  /* the column tile's B rows, laid out when more than one row tile reads them; A stored [K,M] with rows a page or
   * more apart (attention's dk and dv at T >= 1024: [T,T] blocks) copied dense first, one contiguous row of M after
   * another: in place, each k of every tile is a line on a page of its own (C harness: 0.31 of the peak in place,
   * 0.60 copied, for 64 x 64 x 1024 with the model's leading dimensions; rows 1 KiB apart run faster in place) */
  const int copy_a = ta && lda >= 1024 && lda != M;
  /* AVX2: A copied into the tiles' 6-row slivers instead (the last one the rows that end at M), each read front to
   * back. With the K blocks, C harness on an AVX2-only Zen 3, 64 x 64 x 1024 with the model's leading dimensions:
   * median time 0.85 of the one-block dense copy's (0.54 -> 0.61 of the peak in that run; the run's noise moves
   * both by 0.1) */
  const int sliv_a = copy_a && mr == 6;
  const size_t nb = M > mr || copy_a ? (size_t)(kcMax * nr + (copy_a ? kcMax * (M + mr) : 0)) : 0;
  float *bb = nb || kblocks > 1 ? scratch(nb + (kblocks > 1 ? (size_t)(M * N) : 0)) : NULL;
  if ((nb || kblocks > 1) && !bb) return -1;
  float *const ad = bb ? bb + kcMax * nr : NULL, *const w = bb ? bb + nb : NULL;
  if (M <= mr) bb = NULL;
  for (int64_t pc = 0; pc < K; pc += kcMax) {
    const int64_t kc = K - pc < kcMax ? K - pc : kcMax;
    const int first = pc == 0, last = pc + kc == K;
    const float *Ab = ta ? A + pc * lda : A + pc, *Bb = B + pc * ldb;
    int64_t la = lda;
    if (sliv_a) {
      pack_rowwise_avx2(6, Ab, lda, kc, M - M % 6, ad);
      if (M % 6) pack_rowwise_avx2(6, Ab + M - 6, lda, kc, 6, ad + (M - M % 6) * kc);
    } else if (copy_a) {
      for (int64_t p = 0; p < kc; p++) memcpy(ad + p * M, Ab + p * lda, (size_t)M * sizeof(float));
      Ab = ad;
      la = M;
    }
    for (int64_t j = 0; j < N; j += nr) {
      const int64_t jr = j + nr <= N ? j : N - nr;
      const int j0 = (int)(j - jr); /* the tile's first column not done yet */
      for (int64_t i = 0; i < M; i += mr) {
        const int64_t ir = i + mr <= M ? i : M - mr;
        const int r0 = (int)(i - ir);
        const int whole = r0 == 0 && j0 == 0;
        /* the chain's tile: in C (one block), else in w; through t where it meets beta*C or has elements done */
        float *cp = C + ir * ldc + jr, *const wp = w + ir * N + jr, *const tp = kblocks > 1 ? wp : cp;
        const int64_t ldt = kblocks > 1 ? N : ldc;
        float *to = whole && (!last || (kblocks == 1 && beta == 0.0f)) ? NULL : t;
        /* the first row tile reads B in place and lays its rows out in bb for the others */
        const float *at = sliv_a ? ad + i * kc : ta ? Ab + ir : Ab + ir * la;
        const int64_t sa = sliv_a ? 4 * mr : 4 * la;
        if (bb && i > 0) (ta ? d->strided : d->rows)(kc, at, sa, bb, 4 * nr, tp, ldt, !first, to, NULL);
        else (ta ? d->strided : d->rows)(kc, at, sa, Bb + jr, 4 * ldb, tp, ldt, !first, to, bb);
        if (!to) continue;
        if (!last) { /* an edge tile's new elements continue in w */
          for (int r = r0; r < mr; r++) memcpy(wp + r * N + j0, t + r * nr + j0, (size_t)(nr - j0) * sizeof(float));
          continue;
        }
        if (whole && beta != 0.0f) {
          d->combine(t, cp, ldc, beta);
          continue;
        }
        for (int r = r0; r < mr; r++)
          for (int c = j0; c < nr; c++) {
            float *x = cp + r * ldc + c;
            const float s = t[r * nr + c];
            *x = beta == 0.0f ? s : beta == 1.0f ? *x + s : fmaf(beta, *x, s);
          }
      }
    }
  }
  return 0;
}
#endif

/* ------------------------------------------------------------------ the blocked product */
/* One MR x NR tile at the edge of C: through a full-size tile buffer, so the kernel runs unchanged. */
static void edge_tile(const gemm_kernel *g, int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                      int64_t rows, int64_t cols, int load, int combine, float beta) {
  float tile[16 * 64] __attribute__((aligned(64)));
  const int nr = g->nr;
  const int need_c = load || (combine && beta != 0.0f);
  for (int64_t r = 0; r < g->mr; r++)
    for (int64_t j = 0; j < nr; j++) tile[r * nr + j] = need_c && r < rows && j < cols ? c[r * ldc + j] : 0.0f;
  g->ukr(kc, a, b, tile, nr, load, combine, beta);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) c[r * ldc + j] = tile[r * nr + j];
}

#ifdef GEMM_X86
/* One tile with A read in place (mr rows of A stored [M,K], lda apart, from ar) by the row-pointer kernel, B from
 * its packed sliver: whole tiles straight to C (or through t when the chain meets beta*C here), a tile cut by N's
 * or M's edge through a full-size tile buffer (cut by M: the mr rows that end at M, only the rows from r0 on new,
 * as direct() does; not with the workspace, whose tiles start at multiples of mr). The same chains as the packed
 * kernel: the same bits (the LM head's 341-row products at seq 1024, paired median time 0.94-0.96 against A
 * packed). */
static void rows_tile(const direct_kernel *d, int64_t kc, const float *ar, int64_t lda, const float *bs, float *c,
                      int64_t ldc, int r0, int64_t cols, int load, int combine, float beta) {
  float t[A5_MR * A5_NR] __attribute__((aligned(64)));
  const int mr = d->mr, nr = d->nr, mix = combine && beta != 0.0f;
  if (cols == nr && r0 == 0) {
    d->rows(kc, ar, 4 * lda, bs, 4 * nr, c, ldc, load, mix ? t : NULL, NULL);
    if (mix) d->combine(t, c, ldc, beta);
    return;
  }
  /* cut by M's edge: ar is the mr rows that end at M, C's rows from r0 on are the tile's new ones (c their first);
   * the rows before r0 are recomputed chains of the tile above, left out */
  float tile[A5_MR * A5_NR] __attribute__((aligned(64)));
  c -= r0 * ldc;
  for (int r = 0; r < mr; r++)
    for (int j = 0; j < nr; j++) tile[r * nr + j] = (load || mix) && r >= r0 && j < cols ? c[r * ldc + j] : 0.0f;
  d->rows(kc, ar, 4 * lda, bs, 4 * nr, tile, nr, load, mix ? t : NULL, NULL);
  if (mix) d->combine(t, tile, nr, beta);
  for (int r = r0; r < mr; r++)
    for (int j = 0; j < cols; j++) c[r * ldc + j] = tile[r * nr + j];
}
#endif

/* A finished chain tile t (mr x nr, row major) meets C: C = C + t (beta 1) or fma(beta, C, t), rows x cols of it. */
static void meet(const gemm_kernel *g, const float *t, float *c, int64_t ldc, int64_t rows, int64_t cols, float beta) {
#ifdef GEMM_X86
  const combine_fn vec = DIRECT[g - KERNELS].combine;
  if (vec && rows == g->mr && cols == g->nr) {
    vec(t, c, ldc, beta);
    return;
  }
#endif
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) {
      float *x = c + r * ldc + j;
      const float s = t[r * g->nr + j];
      *x = beta == 1.0f ? *x + s : fmaf(beta, *x, s);
    }
}

/* K in equal blocks of at most g->kc (K = 256 on a 192 block: 2 x 128, not 192 + 64), so no block is a short tail
 * that pays a full tile's load and store for little work; a K up to g->kone in one. The order of summation does not
 * change. */
static int64_t k_blocks(const gemm_kernel *g, int64_t K) { return K <= g->kone ? 1 : (K + g->kc - 1) / g->kc; }
/* The width of blocked()'s B panels for N columns and a K block of kc (the bf16 emulation's too): N in equal blocks,
 * each panel (kc x nc) small enough to stay in L2: one panel of at most g->panel1 floats where it holds all of N (A
 * is then read or packed once), else g->paneln (the LM head's logits: 2-3 % on a Zen 4's 1 MB L2, against PANEL); a
 * multiple of nr. */
int64_t panel_cols(const gemm_kernel *g, int64_t N, int64_t kc) {
  const int nr = g->nr;
  const int64_t ncOne = g->panel1 / kc / nr * nr;
  int64_t ncCap = N <= ncOne ? ncOne : g->paneln / kc / nr * nr;
  ncCap = ncCap < nr ? nr : ncCap > g->nc ? g->nc : ncCap;
  const int64_t nblocks = (N + ncCap - 1) / ncCap;
  return ((N + nblocks - 1) / nblocks + nr - 1) / nr * nr;
}

/* C = op(A) op(B) + beta*C. K-blocks after the first continue the chains where the one before left them: in C when
 * beta is 0 or K is one block (which meets beta*C in the kernel's store), else in a workspace of whole tiles (each
 * mr x nr tile contiguous) whose last block meets beta*C tile by tile, so C is read and written once.
 * Within a block, a row of tiles at a time: the A sliver (mr x kc) stays in L1 while the B slivers stream from the
 * packed panel (L2), and C is written along its rows. On the AVX-512 kernel, A stored [M,K] with alpha 1 is not
 * packed: its sliver is read in place by the row-pointer kernel (in L1 after the first tile of the
 * row). */
static int blocked(const gemm_kernel *g, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                   int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  const int mr = g->mr, nr = g->nr;
  const int64_t kblocks = k_blocks(g, K), kcMax = (K + kblocks - 1) / kblocks;
  const int64_t ncMax = panel_cols(g, N, kcMax);
  const int64_t mcMax = ((M < g->mc ? M : g->mc) + mr - 1) / mr * mr;
  const size_t bsize = (size_t)(((ncMax * kcMax) + 15) / 16 * 16);
  float *buf = scratch(bsize + (size_t)(mcMax * kcMax) + 16); /* + 16: transpose8's overhang (6 rows) */
  if (!buf) return -1;
  float *bp = buf, *ap = buf + bsize;
  const int64_t ntiles = (N + nr - 1) / nr; /* a row of workspace tiles */
  float *w = NULL;
  if (beta != 0.0f && kblocks > 1 && !(w = workspace((size_t)(((M + mr - 1) / mr) * ntiles * mr * nr)))) return -1;
#ifdef GEMM_X86
  /* the AVX2 kernel reads packed A faster than A in place (an AVX2-only Zen 3: 4-8 % on the model's products) */
  const direct_kernel *rows = !ta && alpha == 1.0f && M >= mr && (M % mr == 0 || !w) && g == &KERNELS[GEMM_ISA_AVX512]
                                  ? &DIRECT[g - KERNELS]
                                  : NULL;
  if (rows && !rows->rows) rows = NULL;
#else
  const void *rows = NULL;
#endif
  for (int64_t jc = 0; jc < N; jc += ncMax) {
    const int64_t nc = N - jc < ncMax ? N - jc : ncMax;
    for (int64_t pc = 0; pc < K; pc += kcMax) {
      const int64_t kc = K - pc < kcMax ? K - pc : kcMax;
      const int load = pc > 0, combine = pc == 0 && pc + kc == K, last = pc + kc == K;
      pack_b(nr, tb, B, ldb, pc, jc, kc, nc, bp);
      for (int64_t ic = 0; ic < M; ic += g->mc) {
        const int64_t mc = M - ic < g->mc ? M - ic : g->mc;
        if (!rows) pack_a(mr, ta, A, lda, ic, pc, mc, kc, alpha, ap);
        for (int64_t ir = 0; ir < mc; ir += mr) {
          const int64_t nrows = mc - ir < mr ? mc - ir : mr;
          const float *as = ap + ir * kc;
#ifdef GEMM_X86
          /* A's sliver in place; a last row tile cut by M's edge reads the mr rows that end at M (rows_tile) */
          const int64_t r0 = nrows < mr ? mr - nrows : 0;
          const float *ar = rows ? A + (ic + ir - r0) * lda + pc : NULL;
#endif
          for (int64_t jr = 0; jr < nc; jr += nr) {
            const int64_t cols = nc - jr < nr ? nc - jr : nr;
            const float *bs = bp + jr * kc;
            float *cp = C + (ic + ir) * ldc + jc + jr;
#ifdef GEMM_X86
            /* the next tile's C, when this K block continues its chains in C, or when this tile's chain meets
             * beta*C: fetched while this one runs (C is often a gradient, cold from memory; AVX-512, paired median
             * time 0.94 on the LM head's dE += dlogits^T h) */
            const int meets = beta != 0.0f && (w ? last : combine) && g != &KERNELS[GEMM_ISA_PORTABLE];
            if ((load && !w) || meets) {
              const float *next = jr + nr < nc ? cp + nr : ir + mr < mc ? cp - jr + mr * ldc : NULL;
              for (int r = 0; next && r < mr; r++) {
                _mm_prefetch((const char *)(next + r * ldc), _MM_HINT_T0);
                _mm_prefetch((const char *)(next + r * ldc + nr - 1), _MM_HINT_T0);
              }
            }
#endif
            if (w) { /* the whole tile's chain in the workspace (packed A and B are zero past the edges) */
              float *wt = w + (((ic + ir) / mr) * ntiles + (jc + jr) / nr) * mr * nr;
              if (!rows) g->ukr(kc, as, bs, wt, nr, load, 0, 0.0f);
#ifdef GEMM_X86
              else rows->rows(kc, ar, 4 * lda, bs, 4 * nr, wt, nr, load, NULL, NULL);
#endif
              if (last) meet(g, wt, cp, ldc, nrows, cols, beta);
              continue;
            }
#ifdef GEMM_X86
            if (rows) {
              rows_tile(rows, kc, ar, lda, bs, cp, ldc, (int)r0, cols, load, combine, beta);
              continue;
            }
#endif
            if (nrows == mr && cols == nr) g->ukr(kc, as, bs, cp, ldc, load, combine, beta);
            else edge_tile(g, kc, as, bs, cp, ldc, nrows, cols, load, combine, beta);
          }
        }
      }
    }
  }
  return 0;
}

int gemm_sgemm(gemm_isa isa, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
               const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return 0;
  if (K <= 0) { /* the chain is empty: s = 0 */
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        float *cp = C + i * ldc + j;
        *cp = beta == 0.0f ? 0.0f : beta == 1.0f ? *cp + 0.0f : fmaf(beta, *cp, 0.0f);
      }
    return 0;
  }
  gemm_blocks_setup();
  const gemm_kernel *g = &KERNELS[isa == GEMM_ISA_AUTO ? gemm_best_isa() : isa];
#ifdef GEMM_X86
  if (fast_pack < 0) fast_pack = gemm_isa_supported(GEMM_ISA_AVX2);
  if (g != &KERNELS[GEMM_ISA_PORTABLE] && !tb && alpha == 1.0f && M <= DIRECT_MAX_M && M >= g->mr && N >= g->nr)
    return direct(&DIRECT[g - KERNELS], ta, M, N, K, A, lda, B, ldb, beta, C, ldc);
#endif
  const int64_t kblocks = k_blocks(g, K);
  if (beta == 0.0f || kblocks == 1) return blocked(g, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  /* beta != 0 over several K blocks: C in bands of rows whose workspace (blocked) is at most about WS_BAND floats,
   * kept from call to call, instead of one the size of C (113 MB for the LM head's dE, fresh pages every call). B is
   * packed again per band: K x N against band x N x K of work. The model's other products fit one band. */
  const int64_t np = (N + g->nr - 1) / g->nr * g->nr;
  int64_t band = WS_BAND / np / g->mr * g->mr;
  if (band < 4 * g->mr) band = 4 * g->mr;
  for (int64_t i = 0; i < M; i += band) {
    const int64_t m = M - i < band ? M - i : band;
    if (blocked(g, ta, tb, m, N, K, alpha, ta ? A + i : A + i * lda, lda, B, ldb, beta, C + i * ldc, ldc)) return -1;
  }
  return 0;
}
