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
 * not 0) in fp32 and reloaded: exact. The file is built with -ffp-contract=off and without -ffast-math: every
 * FMA is written as one (fmaf, _mm512_fmadd_ps, _mm256_fmadd_ps), no other a*b+c is fused.
 *
 * Each kernel is compiled for its own target (function attributes), never -march=native: one binary runs on
 * every x86-64 CPU and picks its kernel at run time (gemm_best_isa).
 */
#include "gemm.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMM_X86 1
#include <immintrin.h>
#endif

/* An MR x NR micro-kernel. acc = load ? C tile : 0; acc += a-sliver x b-sliver over kc; then the tile gets
 * acc, or (combine, only when the chain started in this call) acc combined with beta*C. */
typedef void (*ukr_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine,
                       float beta);

typedef struct {
  int mr, nr;     /* register tile */
  int64_t mc, kc; /* A block, K block (the A sliver mr x kc stays in L1 for a row of tiles) */
  int64_t nc;     /* B panel (kc x nc, at most PANEL floats: in L2 while the row tiles stream its slivers) */
  int64_t kone;   /* a K up to this runs as one block (C written once; kc x nc smaller to fit) */
  ukr_fn ukr;
  const char *name, *detail;
} gemm_kernel;

/* ------------------------------------------------------------------ portable micro-kernel (any CPU) */
#define P_MR 4
#define P_NR 16
/* Plain C with fmaf. On x86-64 it is also compiled for FMA-capable CPUs (a clone chosen when the addon loads),
 * where fmaf is one instruction; elsewhere fmaf is libm's, slow but exact. Both compute the same bits. */
#ifdef GEMM_X86
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
static void
ukr_portable(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine, float beta) {
  /* two rows at a time: 2 x P_NR independent chains, a loop over j the compiler vectorises */
  for (int r = 0; r < P_MR; r += 2) {
    float acc0[P_NR], acc1[P_NR];
    for (int j = 0; j < P_NR; j++) {
      acc0[j] = load ? c[r * ldc + j] : 0.0f;
      acc1[j] = load ? c[(r + 1) * ldc + j] : 0.0f;
    }
    for (int64_t p = 0; p < kc; p++) {
      const float a0 = a[p * P_MR + r], a1 = a[p * P_MR + r + 1];
      const float *bp = b + p * P_NR;
      for (int j = 0; j < P_NR; j++) {
        acc0[j] = fmaf(a0, bp[j], acc0[j]);
        acc1[j] = fmaf(a1, bp[j], acc1[j]);
      }
    }
    for (int h = 0; h < 2; h++) {
      const float *acc = h ? acc1 : acc0;
      for (int j = 0; j < P_NR; j++) {
        float *cp = c + (r + h) * ldc + j;
        if (!combine || beta == 0.0f) *cp = acc[j];
        else if (beta == 1.0f) *cp = *cp + acc[j];
        else *cp = fmaf(beta, *cp, acc[j]);
      }
    }
  }
}

#ifdef GEMM_X86
/* ------------------------------------------------------------------ AVX2 + FMA: 6 x 16 (12 accumulators) */
/* In assembly, as the AVX-512 kernel (GCC keeps intrinsic accumulators in memory across the k loop): ymm0-11
 * hold the 6 x 16 tile, ymm12-13 a row of the B sliver, ymm14-15 the broadcast A values. Per k: 2 loads of B,
 * 6 broadcasts of A, 12 FMAs, each C element c = fma(a, b, c) in k order. As on AVX-512 (below), A and B are read
 * through strides: packed slivers, or the operands in place (tile_avx2_rows: A stored [M,K], six row pointers). */
#define A2_MR 6
#define A2_NR 16
#define T2_PROLOGUE                                                                                                    \
  "test %[load], %[load]\n\t"                                                                                          \
  "jz 2f\n\t"                                                                                                          \
  "mov %[c], %%rax\n\t"                                                                                                \
  "vmovups (%%rax), %%ymm0\n\t"                                                                                        \
  "vmovups 32(%%rax), %%ymm1\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%ymm2\n\t"                                                                                        \
  "vmovups 32(%%rax), %%ymm3\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%ymm4\n\t"                                                                                        \
  "vmovups 32(%%rax), %%ymm5\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%ymm6\n\t"                                                                                        \
  "vmovups 32(%%rax), %%ymm7\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%ymm8\n\t"                                                                                        \
  "vmovups 32(%%rax), %%ymm9\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%ymm10\n\t"                                                                                       \
  "vmovups 32(%%rax), %%ymm11\n\t"                                                                                     \
  "jmp 3f\n\t"                                                                                                         \
  "2:\n\t"                                                                                                             \
  "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"                                                                                  \
  "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"                                                                                  \
  "vxorps %%ymm2, %%ymm2, %%ymm2\n\t"                                                                                  \
  "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"                                                                                  \
  "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"                                                                                  \
  "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"                                                                                  \
  "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"                                                                                  \
  "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"                                                                                  \
  "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"                                                                                  \
  "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"                                                                                  \
  "vxorps %%ymm10, %%ymm10, %%ymm10\n\t"                                                                               \
  "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"                                                                               \
  "3:\n\t"                                                                                                             \
  "test %[k], %[k]\n\t"                                                                                                \
  "jz 5f\n\t"
#define T2_LOAD_B                                                                                                      \
  "vmovups (%[b]), %%ymm12\n\t"                                                                                        \
  "vmovups 32(%[b]), %%ymm13\n\t"                                                                                      \
  "prefetcht0 (%[b],%[pf])\n\t"
/* clang-format off */
#define T2_ROW(SRC, REG, ACC0, ACC1)                                                                                   \
  "vbroadcastss " SRC ", %%ymm" REG "\n\t"                                                                             \
  "vfmadd231ps %%ymm" REG ", %%ymm12, %%ymm" ACC0 "\n\t"                                                               \
  "vfmadd231ps %%ymm" REG ", %%ymm13, %%ymm" ACC1 "\n\t"
/* clang-format on */
#define T2_EPILOGUE                                                                                                    \
  "5:\n\t"                                                                                                             \
  "test %[t], %[t]\n\t"                                                                                                \
  "jz 6f\n\t"                                                                                                          \
  "vmovaps %%ymm0, 0(%[t])\n\t"                                                                                        \
  "vmovaps %%ymm1, 32(%[t])\n\t"                                                                                       \
  "vmovaps %%ymm2, 64(%[t])\n\t"                                                                                       \
  "vmovaps %%ymm3, 96(%[t])\n\t"                                                                                       \
  "vmovaps %%ymm4, 128(%[t])\n\t"                                                                                      \
  "vmovaps %%ymm5, 160(%[t])\n\t"                                                                                      \
  "vmovaps %%ymm6, 192(%[t])\n\t"                                                                                      \
  "vmovaps %%ymm7, 224(%[t])\n\t"                                                                                      \
  "vmovaps %%ymm8, 256(%[t])\n\t"                                                                                      \
  "vmovaps %%ymm9, 288(%[t])\n\t"                                                                                      \
  "vmovaps %%ymm10, 320(%[t])\n\t"                                                                                     \
  "vmovaps %%ymm11, 352(%[t])\n\t"                                                                                     \
  "jmp 7f\n\t"                                                                                                         \
  "6:\n\t"                                                                                                             \
  "mov %[c], %%rax\n\t"                                                                                                \
  "vmovups %%ymm0, (%%rax)\n\t"                                                                                        \
  "vmovups %%ymm1, 32(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%ymm2, (%%rax)\n\t"                                                                                        \
  "vmovups %%ymm3, 32(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%ymm4, (%%rax)\n\t"                                                                                        \
  "vmovups %%ymm5, 32(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%ymm6, (%%rax)\n\t"                                                                                        \
  "vmovups %%ymm7, 32(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%ymm8, (%%rax)\n\t"                                                                                        \
  "vmovups %%ymm9, 32(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%ymm10, (%%rax)\n\t"                                                                                       \
  "vmovups %%ymm11, 32(%%rax)\n\t"                                                                                     \
  "7:\n\t"                                                                                                             \
  "vzeroupper\n\t"
#define T2_CLOBBERS                                                                                                    \
  "rax", "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9", "ymm10", "ymm11", "ymm12",    \
      "ymm13", "ymm14", "ymm15", "memory", "cc"

/* One k of the tile's rows: A strided (a(r, p) at a + p*sa + 4r; X = ",%[sa]": the next k) or from six row pointers
 * (a(r, p) at a + r*la + 4p; D = "4": the next k) */
/* clang-format off */
#define A6_STRIDED(ROW, R0, R1, X)                                                                                     \
  ROW("0(%[a]" X ")", R0, "0", "1") ROW("4(%[a]" X ")", R1, "2", "3") ROW("8(%[a]" X ")", R0, "4", "5")                \
      ROW("12(%[a]" X ")", R1, "6", "7") ROW("16(%[a]" X ")", R0, "8", "9") ROW("20(%[a]" X ")", R1, "10", "11")
#define A6_ROWS(ROW, R0, R1, D)                                                                                        \
  ROW(D "(%[a])", R0, "0", "1") ROW(D "(%[a],%[la],1)", R1, "2", "3") ROW(D "(%[a],%[la],2)", R0, "4", "5")            \
      ROW(D "(%[a],%[la3],1)", R1, "6", "7") ROW(D "(%[a4])", R0, "8", "9") ROW(D "(%[a4],%[la],1)", R1, "10", "11")
/* clang-format on */
#define T2_A_STRIDED(X) A6_STRIDED(T2_ROW, "14", "15", X)
#define T2_A_ROWS(D) A6_ROWS(T2_ROW, "14", "15", D)
/* One k (B loaded by the loop), and two k with their B loads (the loop's usual step: fewer pointer updates and loop
 * branches a k, 1-5 % faster on both kernels); the flags of the k count end each */
#define STEP_STRIDED                                                                                                   \
  "add %[sa], %[a]\n\t"                                                                                                \
  "add %[sb], %[b]\n\t"                                                                                                \
  "dec %[k]\n\t"
#define PAIR_STRIDED                                                                                                   \
  "lea (%[a],%[sa],2), %[a]\n\t"                                                                                       \
  "add %[sb], %[b]\n\t"                                                                                                \
  "sub $2, %[k]\n\t"
#define STEP_ROWS                                                                                                      \
  "add $4, %[a]\n\t"                                                                                                   \
  "add $4, %[a4]\n\t"                                                                                                  \
  "add %[sb], %[b]\n\t"                                                                                                \
  "dec %[k]\n\t"
#define PAIR_ROWS                                                                                                      \
  "add $8, %[a]\n\t"                                                                                                   \
  "add $8, %[a4]\n\t"                                                                                                  \
  "add %[sb], %[b]\n\t"                                                                                                \
  "sub $2, %[k]\n\t"
#define T2_K_STRIDED T2_A_STRIDED("") STEP_STRIDED
#define T2_K_ROWS T2_A_ROWS("") STEP_ROWS
#define TILE_PAIR(LOAD_B, A, NEXT, BUMP) LOAD_B A("") "add %[sb], %[b]\n\t" LOAD_B A(NEXT) BUMP
#define T2_PAIR_STRIDED TILE_PAIR(T2_LOAD_B, T2_A_STRIDED, ",%[sa]", PAIR_STRIDED)
#define T2_PAIR_ROWS TILE_PAIR(T2_LOAD_B, T2_A_ROWS, "4", PAIR_ROWS)
/* The k loop of every tile kernel, twice: with d == NULL in pairs of k (an odd k first); else one k at a time,
 * each B row read also stored to d, the next row right after it (small products: the first row tile of a column lays
 * out the sliver the others then read) */
#define TILE_LOOPS(LOAD_B, STORE_B, K_STEP, K_PAIR)                                                                    \
  "test %[d], %[d]\n\t"                                                                                                \
  "jnz 8f\n\t"                                                                                                         \
  "test $1, %[k]\n\t"                                                                                                  \
  "jz 4f\n\t" LOAD_B K_STEP                                                                                            \
  "jz 5f\n\t"                                                                                                          \
  "4:\n\t" K_PAIR                                                                                                      \
  "jnz 4b\n\t"                                                                                                         \
  "jmp 5f\n\t"                                                                                                         \
  "8:\n\t" LOAD_B STORE_B K_STEP "jnz 8b\n\t"
#define T2_STORE_B                                                                                                     \
  "vmovups %%ymm12, (%[d])\n\t"                                                                                        \
  "vmovups %%ymm13, 32(%[d])\n\t"                                                                                      \
  "add $64, %[d]\n\t"
#define T2_LOOPS(K) TILE_LOOPS(T2_LOAD_B, T2_STORE_B, T2_K_##K, T2_PAIR_##K)

/* a(r, p) at a + p*sa + 4r, b(p, j) at b + p*sb + 4j; t == NULL: the tile goes straight to C (ldc), else to t
 * (6 x 16, row major); d: see TILE_LOOPS */
__attribute__((target("avx2,fma"))) static void tile_avx2(int64_t kc, const float *a, int64_t sa, const float *b,
                                                          int64_t sb, float *c, int64_t ldc, int load, float *t,
                                                          float *d) {
  const int64_t ldcb = ldc * 4, pf = 8 * sb;
  __asm__ volatile(
      T2_PROLOGUE T2_LOOPS(STRIDED) T2_EPILOGUE
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(kc), [d] "+r"(d)
      : [c] "r"(c), [ldcb] "r"(ldcb), [load] "r"(load), [t] "r"(t), [sa] "r"(sa), [sb] "r"(sb), [pf] "r"(pf)
      : T2_CLOBBERS);
}

/* A read in place from six rows la bytes apart (row r at a + r*la), one float further each k. */
__attribute__((target("avx2,fma"))) static void tile_avx2_rows(int64_t kc, const float *a, int64_t la, const float *b,
                                                               int64_t sb, float *c, int64_t ldc, int load, float *t,
                                                               float *d) {
  const int64_t ldcb = ldc * 4, pf = 8 * sb, la3 = 3 * la;
  const float *a4 = (const float *)((const char *)a + 4 * la);
  __asm__ volatile(T2_PROLOGUE T2_LOOPS(ROWS) T2_EPILOGUE
                   : [a] "+r"(a), [a4] "+r"(a4), [b] "+r"(b), [k] "+r"(kc), [d] "+r"(d)
                   : [c] "r"(c), [ldcb] "r"(ldcb), [load] "r"(load), [t] "r"(t), [la] "r"(la), [la3] "r"(la3),
                     [sb] "r"(sb), [pf] "r"(pf)
                   : T2_CLOBBERS);
}

/* The tile in t (MR x 16) meets C: C = C + t (beta 1) or fma(beta, C, t). */
__attribute__((target("avx2,fma"))) static void combine_avx2(const float *t, float *c, int64_t ldc, float beta) {
  const __m256 vb = _mm256_set1_ps(beta);
  for (int r = 0; r < A2_MR; r++)
    for (int h = 0; h < 2; h++) {
      float *cp = c + r * ldc + 8 * h;
      __m256 x = _mm256_load_ps(t + r * A2_NR + 8 * h);
      if (beta == 1.0f) x = _mm256_add_ps(_mm256_loadu_ps(cp), x);
      else x = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cp), x);
      _mm256_storeu_ps(cp, x);
    }
}

__attribute__((target("avx2,fma"))) static void ukr_avx2(int64_t kc, const float *a, const float *b, float *c,
                                                         int64_t ldc, int load, int combine, float beta) {
  if (!combine || beta == 0.0f) {
    tile_avx2(kc, a, 4 * A2_MR, b, 4 * A2_NR, c, ldc, load, NULL, NULL);
    return;
  }
  float t[A2_MR * A2_NR] __attribute__((aligned(32)));
  tile_avx2(kc, a, 4 * A2_MR, b, 4 * A2_NR, c, ldc, load, t, NULL);
  combine_avx2(t, c, ldc, beta);
}

/* ------------------------------------------------------------------ AVX-512F: 8 x 32 (16 accumulators) */
/* In assembly (GCC's allocation of many accumulator intrinsics spills a B vector to the stack every k): zmm0-15
 * hold the 8 x 32 tile, zmm30-31 a row of the B sliver, zmm28-29 the broadcast A values. Per k: 2 loads of B,
 * 8 broadcasts of A, 16 FMAs, each C element c = fma(a, b, c) in k order. 8 rows divide every row count of the
 * model's products (64, 256, 576, 1536, 1024), so they need no edge tiles. The tile goes straight to C, or to `t`
 * when the caller combines it with beta*C. */
#define A5_MR 8
#define A5_NR 32
/* The k loop reads A and B through strides, so the same kernel runs on packed slivers (sa = 32 bytes, sb = 128)
 * and straight from the operands where their layout allows (small products: no packing to amortise):
 *   tile_avx512:      a(r, p) at a + p*sa + 4r   (packed A, or A stored [K,M])
 *   tile_avx512_rows: a(r, p) at a + r*la + 4p   (A stored [M,K]: eight row pointers, la = lda in bytes)
 *   both:             b(p, j) at b + p*sb + 4j   (packed B, or B stored [K,N])                              */
#define T5_PROLOGUE                                                                                                    \
  "test %[load], %[load]\n\t"                                                                                          \
  "jz 2f\n\t"                                                                                                          \
  "mov %[c], %%rax\n\t"                                                                                                \
  "vmovups (%%rax), %%zmm0\n\t"                                                                                        \
  "vmovups 64(%%rax), %%zmm1\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%zmm2\n\t"                                                                                        \
  "vmovups 64(%%rax), %%zmm3\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%zmm4\n\t"                                                                                        \
  "vmovups 64(%%rax), %%zmm5\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%zmm6\n\t"                                                                                        \
  "vmovups 64(%%rax), %%zmm7\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%zmm8\n\t"                                                                                        \
  "vmovups 64(%%rax), %%zmm9\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%zmm10\n\t"                                                                                       \
  "vmovups 64(%%rax), %%zmm11\n\t"                                                                                     \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%zmm12\n\t"                                                                                       \
  "vmovups 64(%%rax), %%zmm13\n\t"                                                                                     \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups (%%rax), %%zmm14\n\t"                                                                                       \
  "vmovups 64(%%rax), %%zmm15\n\t"                                                                                     \
  "jmp 3f\n\t"                                                                                                         \
  "2:\n\t"                                                                                                             \
  "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"                                                                                  \
  "vpxord %%zmm1, %%zmm1, %%zmm1\n\t"                                                                                  \
  "vpxord %%zmm2, %%zmm2, %%zmm2\n\t"                                                                                  \
  "vpxord %%zmm3, %%zmm3, %%zmm3\n\t"                                                                                  \
  "vpxord %%zmm4, %%zmm4, %%zmm4\n\t"                                                                                  \
  "vpxord %%zmm5, %%zmm5, %%zmm5\n\t"                                                                                  \
  "vpxord %%zmm6, %%zmm6, %%zmm6\n\t"                                                                                  \
  "vpxord %%zmm7, %%zmm7, %%zmm7\n\t"                                                                                  \
  "vpxord %%zmm8, %%zmm8, %%zmm8\n\t"                                                                                  \
  "vpxord %%zmm9, %%zmm9, %%zmm9\n\t"                                                                                  \
  "vpxord %%zmm10, %%zmm10, %%zmm10\n\t"                                                                               \
  "vpxord %%zmm11, %%zmm11, %%zmm11\n\t"                                                                               \
  "vpxord %%zmm12, %%zmm12, %%zmm12\n\t"                                                                               \
  "vpxord %%zmm13, %%zmm13, %%zmm13\n\t"                                                                               \
  "vpxord %%zmm14, %%zmm14, %%zmm14\n\t"                                                                               \
  "vpxord %%zmm15, %%zmm15, %%zmm15\n\t"                                                                               \
  "3:\n\t"                                                                                                             \
  "test %[k], %[k]\n\t"                                                                                                \
  "jz 5f\n\t"
/* one row of the tile: broadcast a(r, p) (operand SRC), two FMAs into zmm ACC0, ACC1 */
/* clang-format off */
#define T5_ROW(SRC, REG, ACC0, ACC1)                                                                                   \
  "vbroadcastss " SRC ", %%zmm" REG "\n\t"                                                                             \
  "vfmadd231ps %%zmm" REG ", %%zmm30, %%zmm" ACC0 "\n\t"                                                               \
  "vfmadd231ps %%zmm" REG ", %%zmm31, %%zmm" ACC1 "\n\t"
/* clang-format on */
#define T5_LOAD_B                                                                                                      \
  "vmovups (%[b]), %%zmm30\n\t"                                                                                        \
  "vmovups 64(%[b]), %%zmm31\n\t"                                                                                      \
  "prefetcht0 (%[b],%[pf])\n\t"
#define T5_EPILOGUE                                                                                                    \
  "5:\n\t"                                                                                                             \
  "test %[t], %[t]\n\t"                                                                                                \
  "jz 6f\n\t"                                                                                                          \
  "vmovaps %%zmm0, 0(%[t])\n\t"                                                                                        \
  "vmovaps %%zmm1, 64(%[t])\n\t"                                                                                       \
  "vmovaps %%zmm2, 128(%[t])\n\t"                                                                                      \
  "vmovaps %%zmm3, 192(%[t])\n\t"                                                                                      \
  "vmovaps %%zmm4, 256(%[t])\n\t"                                                                                      \
  "vmovaps %%zmm5, 320(%[t])\n\t"                                                                                      \
  "vmovaps %%zmm6, 384(%[t])\n\t"                                                                                      \
  "vmovaps %%zmm7, 448(%[t])\n\t"                                                                                      \
  "vmovaps %%zmm8, 512(%[t])\n\t"                                                                                      \
  "vmovaps %%zmm9, 576(%[t])\n\t"                                                                                      \
  "vmovaps %%zmm10, 640(%[t])\n\t"                                                                                     \
  "vmovaps %%zmm11, 704(%[t])\n\t"                                                                                     \
  "vmovaps %%zmm12, 768(%[t])\n\t"                                                                                     \
  "vmovaps %%zmm13, 832(%[t])\n\t"                                                                                     \
  "vmovaps %%zmm14, 896(%[t])\n\t"                                                                                     \
  "vmovaps %%zmm15, 960(%[t])\n\t"                                                                                     \
  "jmp 7f\n\t"                                                                                                         \
  "6:\n\t"                                                                                                             \
  "mov %[c], %%rax\n\t"                                                                                                \
  "vmovups %%zmm0, (%%rax)\n\t"                                                                                        \
  "vmovups %%zmm1, 64(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%zmm2, (%%rax)\n\t"                                                                                        \
  "vmovups %%zmm3, 64(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%zmm4, (%%rax)\n\t"                                                                                        \
  "vmovups %%zmm5, 64(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%zmm6, (%%rax)\n\t"                                                                                        \
  "vmovups %%zmm7, 64(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%zmm8, (%%rax)\n\t"                                                                                        \
  "vmovups %%zmm9, 64(%%rax)\n\t"                                                                                      \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%zmm10, (%%rax)\n\t"                                                                                       \
  "vmovups %%zmm11, 64(%%rax)\n\t"                                                                                     \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%zmm12, (%%rax)\n\t"                                                                                       \
  "vmovups %%zmm13, 64(%%rax)\n\t"                                                                                     \
  "add %[ldcb], %%rax\n\t"                                                                                             \
  "vmovups %%zmm14, (%%rax)\n\t"                                                                                       \
  "vmovups %%zmm15, 64(%%rax)\n\t"                                                                                     \
  "7:\n\t"
#define T5_CLOBBERS                                                                                                    \
  "rax", "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", "zmm11", "zmm12",    \
      "zmm13", "zmm14", "zmm15", "zmm28", "zmm29", "zmm30", "zmm31", "memory", "cc"

/* One k of the tile's rows, A strided or from eight row pointers (as T2_A_STRIDED, T2_A_ROWS: the first six rows) */
#define T5_A_STRIDED(X)                                                                                                \
  A6_STRIDED(T5_ROW, "28", "29", X)                                                                                    \
  T5_ROW("24(%[a]" X ")", "28", "12", "13") T5_ROW("28(%[a]" X ")", "29", "14", "15")
#define T5_A_ROWS(D)                                                                                                   \
  A6_ROWS(T5_ROW, "28", "29", D)                                                                                       \
  T5_ROW(D "(%[a4],%[la],2)", "28", "12", "13") T5_ROW(D "(%[a4],%[la3],1)", "29", "14", "15")
#define T5_K_STRIDED T5_A_STRIDED("") STEP_STRIDED
#define T5_K_ROWS T5_A_ROWS("") STEP_ROWS
#define T5_PAIR_STRIDED TILE_PAIR(T5_LOAD_B, T5_A_STRIDED, ",%[sa]", PAIR_STRIDED)
#define T5_PAIR_ROWS TILE_PAIR(T5_LOAD_B, T5_A_ROWS, "4", PAIR_ROWS)
#define T5_STORE_B                                                                                                     \
  "vmovups %%zmm30, (%[d])\n\t"                                                                                        \
  "vmovups %%zmm31, 64(%[d])\n\t"                                                                                      \
  "add $128, %[d]\n\t"
#define T5_LOOPS(K) TILE_LOOPS(T5_LOAD_B, T5_STORE_B, T5_K_##K, T5_PAIR_##K)

/* t == NULL: the tile goes straight to C (ldc); else to t (MR x 32, row major); d: see TILE_LOOPS */
__attribute__((target("avx512f"))) static void tile_avx512(int64_t kc, const float *a, int64_t sa, const float *b,
                                                           int64_t sb, float *c, int64_t ldc, int load, float *t,
                                                           float *d) {
  const int64_t ldcb = ldc * 4, pf = 8 * sb;
  __asm__ volatile(
      T5_PROLOGUE T5_LOOPS(STRIDED) T5_EPILOGUE
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(kc), [d] "+r"(d)
      : [c] "r"(c), [ldcb] "r"(ldcb), [load] "r"(load), [t] "r"(t), [sa] "r"(sa), [sb] "r"(sb), [pf] "r"(pf)
      : T5_CLOBBERS);
}

/* A read in place from eight rows la bytes apart (row r at a + r*la), one float further each k. */
__attribute__((target("avx512f"))) static void tile_avx512_rows(int64_t kc, const float *a, int64_t la, const float *b,
                                                                int64_t sb, float *c, int64_t ldc, int load, float *t,
                                                                float *d) {
  const int64_t ldcb = ldc * 4, pf = 8 * sb, la3 = 3 * la;
  const float *a4 = (const float *)((const char *)a + 4 * la);
  __asm__ volatile(T5_PROLOGUE T5_LOOPS(ROWS) T5_EPILOGUE
                   : [a] "+r"(a), [a4] "+r"(a4), [b] "+r"(b), [k] "+r"(kc), [d] "+r"(d)
                   : [c] "r"(c), [ldcb] "r"(ldcb), [load] "r"(load), [t] "r"(t), [la] "r"(la), [la3] "r"(la3),
                     [sb] "r"(sb), [pf] "r"(pf)
                   : T5_CLOBBERS);
}

/* The tile in t (MR x 32) meets C: C = C + t (beta 1) or fma(beta, C, t). */
__attribute__((target("avx512f"))) static void combine_avx512(const float *t, float *c, int64_t ldc, float beta) {
  const __m512 vb = _mm512_set1_ps(beta);
  for (int r = 0; r < A5_MR; r++)
    for (int h = 0; h < 2; h++) {
      float *cp = c + r * ldc + 16 * h;
      __m512 x = _mm512_load_ps(t + r * A5_NR + 16 * h);
      if (beta == 1.0f) x = _mm512_add_ps(_mm512_loadu_ps(cp), x);
      else x = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cp), x);
      _mm512_storeu_ps(cp, x);
    }
}

__attribute__((target("avx512f"))) static void ukr_avx512(int64_t kc, const float *a, const float *b, float *c,
                                                          int64_t ldc, int load, int combine, float beta) {
  if (!combine || beta == 0.0f) {
    tile_avx512(kc, a, 4 * A5_MR, b, 4 * A5_NR, c, ldc, load, NULL, NULL);
    return;
  }
  float t[A5_MR * A5_NR] __attribute__((aligned(64)));
  tile_avx512(kc, a, 4 * A5_MR, b, 4 * A5_NR, c, ldc, load, t, NULL);
  combine_avx512(t, c, ldc, beta);
}

#endif

static const gemm_kernel KERNELS[3] = {
    {P_MR, P_NR, 128, 256, 2048, 0, ukr_portable, "portable", "portable C 4x16"},
#ifdef GEMM_X86
    {A2_MR, A2_NR, 144, 256, 3072, 0, ukr_avx2, "avx2", "AVX2+FMA 6x16"},
    {A5_MR, A5_NR, 192, 384, 3072, 640, ukr_avx512, "avx512", "AVX-512F 8x32"},
#else
    {P_MR, P_NR, 128, 256, 2048, 0, ukr_portable, "avx2", "(not on this CPU)"},
    {P_MR, P_NR, 128, 256, 2048, 0, ukr_portable, "avx512", "(not on this CPU)"},
#endif
};

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
#define DIRECT_MAX_M 64
typedef void (*tile_fn)(int64_t kc, const float *a, int64_t sa, const float *b, int64_t sb, float *c, int64_t ldc,
                        int load, float *t, float *d);
typedef void (*combine_fn)(const float *t, float *c, int64_t ldc, float beta);
typedef struct {
  int mr, nr;
  tile_fn strided, rows; /* d != NULL: each also lays the B rows it reads out in d */
  combine_fn combine;    /* a whole tile with beta != 0 */
  int64_t kc;            /* K block (0: K in one block) */
} direct_kernel;

static float *scratch(size_t n);
static void pack_rowwise_avx2(int w, const float *src, int64_t ld, int64_t kc, int64_t n, float *dst);
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

static const direct_kernel DIRECT[3] = {
    {0, 0, NULL, NULL, NULL, 0},
    {A2_MR, A2_NR, tile_avx2, tile_avx2_rows, combine_avx2, 256},
    {A5_MR, A5_NR, tile_avx512, tile_avx512_rows, combine_avx512, 0},
};
#endif

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

/* ------------------------------------------------------------------ per-thread packing buffers */
/* A thread-local buffer, freed by gemm_thread_release (the addon calls it when the thread's Node environment is
 * torn down). No pthread key destructor: Node unloads an addon when the last environment that loaded it ends,
 * and a destructor left behind in unloaded code crashes the next thread that exits. */
static __thread float *buf_p = NULL;
static __thread size_t buf_cap = 0;

static __thread float *ws_p = NULL; /* blocked()'s chains when beta != 0 (see there) */
static __thread size_t ws_cap = 0;
#define WS_BAND ((int64_t)1 << 20) /* floats (4 MB): gemm_sgemm's bands of C when beta != 0 over several K blocks */

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
static float *scratch(size_t n) { return grow(&buf_p, &buf_cap, n); }
/* blocked()'s chains when beta != 0 (gemm_sgemm's bands keep n near WS_BAND) */
static float *workspace(size_t n) { return grow(&ws_p, &ws_cap, n); }

/* ------------------------------------------------------------------ packing (the same on every kernel) */
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
 * model's x W^T at seq 256). */
__attribute__((target("avx2"))) static int64_t pack_cols_avx2(int nr, const float *src, int64_t ld, int64_t kc,
                                                              float *dst) {
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    if (!(p & 15))
      for (int j = 0; j < nr; j++) _mm_prefetch((const char *)(src + (j + nr) * ld + p), _MM_HINT_T0);
    for (int j = 0; j < nr; j += 8) transpose8(src + j * ld + p, ld, dst + p * nr + j, nr, 8);
  }
  return p;
}
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
/* B [N,K] with NR 32 (the AVX-512 kernel): 16 x 16 transposes. */
__attribute__((target("avx512f"))) static int64_t pack_cols32_avx512(const float *src, int64_t ld, int64_t kc,
                                                                     float *dst) {
  int64_t p = 0;
  for (; p + 16 <= kc; p += 16)
    for (int j = 0; j < 32; j += 16) transpose16(src + j * ld + p, ld, dst + p * 32 + j, 32);
  return p;
}
static int fast_pack = -1; /* AVX2 transposes, where the CPU has them (same bits as the loops) */
#endif

#ifdef GEMM_X86
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
__attribute__((target("avx2"))) static void pack_rowwise_avx2(int w, const float *src, int64_t ld, int64_t kc,
                                                              int64_t n, float *dst) {
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
static void pack_a(int mr, int ta, const float *A, int64_t lda, int64_t i0, int64_t p0, int64_t mc, int64_t kc,
                   float alpha, float *ap) {
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
static void pack_b(int nr, int tb, const float *B, int64_t ldb, int64_t p0, int64_t j0, int64_t kc, int64_t nc,
                   float *bp) {
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
 * edge through a full-size tile buffer. The same chains as the packed kernel: the same bits. */
static void rows_tile(const direct_kernel *d, int64_t kc, const float *ar, int64_t lda, const float *bs, float *c,
                      int64_t ldc, int64_t cols, int load, int combine, float beta) {
  float t[A5_MR * A5_NR] __attribute__((aligned(64)));
  const int mr = d->mr, nr = d->nr, mix = combine && beta != 0.0f;
  if (cols == nr) {
    d->rows(kc, ar, 4 * lda, bs, 4 * nr, c, ldc, load, mix ? t : NULL, NULL);
    if (mix) d->combine(t, c, ldc, beta);
    return;
  }
  float tile[A5_MR * A5_NR] __attribute__((aligned(64)));
  for (int r = 0; r < mr; r++)
    for (int j = 0; j < nr; j++) tile[r * nr + j] = (load || mix) && j < cols ? c[r * ldc + j] : 0.0f;
  d->rows(kc, ar, 4 * lda, bs, 4 * nr, tile, nr, load, mix ? t : NULL, NULL);
  if (mix) d->combine(t, tile, nr, beta);
  for (int r = 0; r < mr; r++)
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
#define PANEL ((int64_t)1 << 18) /* floats (1 MB): blocked()'s packed B panel, kept in L2 */
/* C = op(A) op(B) + beta*C. K-blocks after the first continue the chains where the one before left them: in C when
 * beta is 0 or K is one block (which meets beta*C in the kernel's store), else in a workspace of whole tiles (each
 * mr x nr tile contiguous) whose last block meets beta*C tile by tile, so C is read and written once.
 * Within a block, a row of tiles at a time: the A sliver (mr x kc) stays in L1 while the B slivers stream from the
 * packed panel (L2), and C is written along its rows. On the AVX-512 kernel, A stored [M,K] with alpha 1 and whole
 * row tiles is not packed: its sliver is read in place by the row-pointer kernel (in L1 after the first tile of the
 * row). */
static int blocked(const gemm_kernel *g, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                   int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  const int mr = g->mr, nr = g->nr;
  const int64_t kblocks = k_blocks(g, K), kcMax = (K + kblocks - 1) / kblocks;
  /* N in equal blocks too, each B panel (kc x nc) at most PANEL floats, so that it stays in L2 */
  int64_t ncCap = PANEL / kcMax / nr * nr;
  ncCap = ncCap < nr ? nr : ncCap > g->nc ? g->nc : ncCap;
  const int64_t nblocks = (N + ncCap - 1) / ncCap, ncMax = ((N + nblocks - 1) / nblocks + nr - 1) / nr * nr;
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
  const direct_kernel *rows =
      !ta && alpha == 1.0f && M % mr == 0 && g == &KERNELS[GEMM_ISA_AVX512] ? &DIRECT[g - KERNELS] : NULL;
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
          const float *ar = rows ? A + (ic + ir) * lda + pc : NULL; /* A's sliver in place */
#endif
          for (int64_t jr = 0; jr < nc; jr += nr) {
            const int64_t cols = nc - jr < nr ? nc - jr : nr;
            const float *bs = bp + jr * kc;
            float *cp = C + (ic + ir) * ldc + jc + jr;
#ifdef GEMM_X86
            /* the next tile's C, when this K block continues its chains in C, or (the AVX2 kernel) when this tile's
             * chain meets beta*C: fetched while this one runs (C is often a gradient, cold from memory) */
            const int meets = beta != 0.0f && (w ? last : combine) && g == &KERNELS[GEMM_ISA_AVX2];
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
              rows_tile(rows, kc, ar, lda, bs, cp, ldc, cols, load, combine, beta);
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

/* ------------------------------------------------------------------ bf16 products (gemm.h: gemm_bf16) */
/* x rounded to bf16 as VCVTNE2PS2BF16 does (checked against it on every class of input): a denormal x is a signed
 * 0, the rest rounds to nearest even (a normal x never rounds to a bf16 denormal), a NaN stays a quiet NaN. The
 * top 16 bits of the float this returns are the bf16. */
static inline float bf16_round(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) u = (u | 0x00400000u) & 0xffff0000u;
  else if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  else u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}
static inline float ftz(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  memcpy(&x, &u, 4);
  return x;
}
static inline uint32_t bf16_bits(float x) {
  uint32_t u;
  x = bf16_round(x);
  memcpy(&u, &x, 4);
  return u >> 16;
}

/* The order, TDPBF16PS's (AMX-BF16; measured on an Intel Xeon with AMX against its documented pseudo-code: 0
 * mismatches in 10^6 elements with every class of input, and 7-66 % for the orders it was told apart from): K is
 * padded with zeros to a multiple of 32 and cut into chunks of 32; in each chunk one chain runs over its 16 even k
 * and one over its 16 odd k, each from 0, e = ftz(fma(a[k], b[k], e)); then acc = ftz(acc + ftz(e + o)), acc from
 * 0 over the chunks in order; every input a denormal read as 0. Then C = acc, ftz(ftz(C) + acc) or
 * ftz(fma(beta, ftz(C), acc)). The emulations run an fp32 micro-kernel on each half chunk (K 16, from 0) under
 * the CPU's flush-to-zero and denormals-are-zero modes (the portable one with the flushes written out), and add
 * the halves into the tile's acc themselves: the same bits. */
#define BF_CHUNK 32

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

/* The portable kernel with the flushes written out (no CPU mode to rely on): one chain from 0 over kc. */
static void ukr_portable_bf16(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine,
                              float beta) {
  (void)load, (void)combine, (void)beta;
  for (int r = 0; r < P_MR; r++) {
    float acc[P_NR];
    for (int j = 0; j < P_NR; j++) acc[j] = 0.0f;
    for (int64_t p = 0; p < kc; p++) {
      const float av = a[p * P_MR + r];
      const float *bv = b + p * P_NR;
      for (int j = 0; j < P_NR; j++) acc[j] = ftz(fmaf(av, bv[j], acc[j]));
    }
    for (int j = 0; j < P_NR; j++) c[r * ldc + j] = acc[j];
  }
}

#define BF_TILE_MAX (12 * 32) /* the largest register tile, mr x nr */
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

#ifdef GEMM_X86
/* ---- AMX-BF16: TDPBF16PS on 16 x 16 tiles of C, a 32 x 32 block of C in 4 tiles per step (2 A x 2 B tiles).
 * Packed A: per 16-row sliver and chunk, 16 rows x 32 bf16 (a row's 32 k in order, 64 bytes). Packed B: per
 * 16-column sliver and chunk, 16 rows of pairs x 16 columns, (b[2p][j], b[2p+1][j]) in one dword. */
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_KC 512
#define AMX_KC_ONE 2048 /* a K up to this runs as one block: each tile's sum is whole and meets C in the tile's store */
/* The K block of a product: all of K when it is at most AMX_KC_ONE, else AMX_KC. */
static inline int64_t amx_kc(int64_t K) { return K <= AMX_KC_ONE ? (K + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK : AMX_KC; }
#define AMX_MC 256
#define AMX_NC 1024
typedef struct {
  uint8_t palette, start;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) amx_config;

static int amx_ok = -1;
/* The CPU has AMX-TILE and AMX-BF16 and the kernel lets this process use the tile data (arch_prctl). */
static int amx_supported(void) {
  if (amx_ok >= 0) return amx_ok;
  unsigned int a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  int ok = (d >> 22 & 1) && (d >> 24 & 1) && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  if (ok) ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  amx_ok = ok;
  return ok;
}

/* 32 floats to 32 bf16 (VCVTNE2PS2BF16: bf16_round's rule), in order. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static inline __m512i bf16x32(const float *x) {
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}
/* 16 floats of each of two rows to 16 dwords (bf16 of x[j]) | (bf16 of y[j]) << 16. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static inline __m512i bf16pairs(const float *x, const float *y) {
  const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(y), _mm512_loadu_ps(x));
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, v);
}
/* One dword of bf16 pairs from scalars (edges). */
static inline uint32_t pair_bits(float x, float y) { return bf16_bits(x) | bf16_bits(y) << 16; }

/* A[i0:i0+mc, p0:p0+kv] into 16-row slivers of chunks (rows past mc and k past kv zero), mc padded to 32. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void pack_a_amx(int ta, const float *A, int64_t lda,
                                                                              int64_t i0, int64_t p0, int64_t mc,
                                                                              int64_t kv, int64_t kc, uint16_t *ap) {
  const int64_t nch = kc / BF_CHUNK;
  uint32_t tmp[16 * 16] __attribute__((aligned(64)));
  for (int64_t s = 0; s < (mc + 31) / 32 * 32; s += 16)
    for (int64_t c = 0; c < nch; c++) {
      uint16_t *dst = ap + (s / 16 * nch + c) * 512;
      const int64_t p = c * BF_CHUNK, rows = mc - s < 16 ? (mc - s > 0 ? mc - s : 0) : 16;
      const int full = rows == 16 && p + BF_CHUNK <= kv;
      if (full && !ta) {
        for (int r = 0; r < 16; r++) _mm512_storeu_si512(dst + r * 32, bf16x32(A + (i0 + s + r) * lda + p0 + p));
      } else if (full) { /* A stored [K,M]: pair rows of 16 m, then a 16 x 16 dword transpose */
        for (int q = 0; q < 16; q++)
          _mm512_store_si512(tmp + q * 16,
                             bf16pairs(A + (p0 + p + 2 * q) * lda + i0 + s, A + (p0 + p + 2 * q + 1) * lda + i0 + s));
        transpose16((const float *)tmp, 16, (float *)dst, 16);
      } else {
        uint32_t *d32 = (uint32_t *)dst;
        for (int r = 0; r < 16; r++)
          for (int q = 0; q < 16; q++) {
            float x[2];
            for (int h = 0; h < 2; h++) {
              const int64_t k = p + 2 * q + h;
              x[h] = r < rows && k < kv ? (ta ? A[(p0 + k) * lda + i0 + s + r] : A[(i0 + s + r) * lda + p0 + k]) : 0.0f;
            }
            d32[r * 16 + q] = pair_bits(x[0], x[1]);
          }
      }
    }
}

/* B[p0:p0+kv, j0:j0+nc] into 16-column slivers of chunks (pairs of k per dword), nc padded to 32. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void pack_b_amx(int tb, const float *B, int64_t ldb,
                                                                              int64_t p0, int64_t j0, int64_t kv,
                                                                              int64_t kc, int64_t nc, uint16_t *bp) {
  const int64_t nch = kc / BF_CHUNK;
  uint32_t tmp[16 * 16] __attribute__((aligned(64)));
  for (int64_t s = 0; s < (nc + 31) / 32 * 32; s += 16)
    for (int64_t c = 0; c < nch; c++) {
      uint32_t *dst = (uint32_t *)(bp + (s / 16 * nch + c) * 512);
      const int64_t p = c * BF_CHUNK, cols = nc - s < 16 ? (nc - s > 0 ? nc - s : 0) : 16;
      const int full = cols == 16 && p + BF_CHUNK <= kv;
      if (full && !tb) {
        for (int q = 0; q < 16; q++)
          _mm512_storeu_si512(dst + q * 16,
                              bf16pairs(B + (p0 + p + 2 * q) * ldb + j0 + s, B + (p0 + p + 2 * q + 1) * ldb + j0 + s));
      } else if (full) { /* B stored [N,K]: each column's 32 k are its 16 pairs; a 16 x 16 dword transpose */
        for (int j = 0; j < 16; j++) _mm512_store_si512(tmp + j * 16, bf16x32(B + (j0 + s + j) * ldb + p0 + p));
        transpose16((const float *)tmp, 16, (float *)dst, 16);
      } else {
        for (int q = 0; q < 16; q++)
          for (int j = 0; j < 16; j++) {
            float x[2];
            for (int h = 0; h < 2; h++) {
              const int64_t k = p + 2 * q + h;
              x[h] = j < cols && k < kv ? (tb ? B[(j0 + s + j) * ldb + p0 + k] : B[(p0 + k) * ldb + j0 + s + j]) : 0.0f;
            }
            dst[q * 16 + j] = pair_bits(x[0], x[1]);
          }
      }
    }
}

/* B packed whole, block after block in blocked_amx's order (jc, then pc): what a weight's cache entry holds. */
static size_t amx_packed_b_size(int64_t N, int64_t K) {
  size_t n = 0;
  for (int64_t jc = 0; jc < N; jc += AMX_NC) {
    const int64_t nc = N - jc < AMX_NC ? N - jc : AMX_NC;
    for (int64_t pc = 0; pc < K; pc += amx_kc(K)) {
      const int64_t kv = K - pc < amx_kc(K) ? K - pc : amx_kc(K);
      n += (size_t)((nc + 31) / 32 * 32) * (size_t)((kv + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK);
    }
  }
  return n; /* in bf16 values */
}
static void amx_pack_b_whole(int tb, const float *B, int64_t ldb, int64_t N, int64_t K, uint16_t *dst) {
  for (int64_t jc = 0; jc < N; jc += AMX_NC) {
    const int64_t nc = N - jc < AMX_NC ? N - jc : AMX_NC;
    for (int64_t pc = 0; pc < K; pc += amx_kc(K)) {
      const int64_t kv = K - pc < amx_kc(K) ? K - pc : amx_kc(K), kc = (kv + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK;
      pack_b_amx(tb, B, ldb, pc, jc, kv, kc, nc, dst);
      dst += (nc + 31) / 32 * 32 * kc;
    }
  }
}

/* out[M,N] = acc on AMX (as blocked_bf16); packed: B already packed whole (amx_pack_b_whole), or NULL. With beta != 0
 * (K in one block only: the caller's check) each tile's whole sum meets out's old value as gemm_bf16 combines them:
 * ftz(ftz(C) + acc), or ftz(fma(beta, ftz(C), acc)). */
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16"))) static int blocked_amx(
    int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
    const uint16_t *packed, float beta, float *out, int64_t ldo) {
  const int64_t kcMax = amx_kc(K);
  const int64_t ncMax = ((N < AMX_NC ? N : AMX_NC) + 31) / 32 * 32, mcMax = ((M < AMX_MC ? M : AMX_MC) + 31) / 32 * 32;
  const size_t bsize = (size_t)(ncMax * kcMax) / 2, asize = (size_t)(mcMax * kcMax) / 2; /* floats: 2 bf16 each */
  float *buf = scratch(bsize + asize);
  if (!buf) return -1;
  uint16_t *bp = (uint16_t *)buf, *ap = (uint16_t *)(buf + bsize);
  amx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  float ct[32 * 32] __attribute__((aligned(64)));
  for (int64_t jc = 0; jc < N; jc += AMX_NC) {
    const int64_t nc = N - jc < AMX_NC ? N - jc : AMX_NC;
    for (int64_t pc = 0; pc < K; pc += kcMax) {
      const int64_t kv = K - pc < kcMax ? K - pc : kcMax, kc = (kv + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK;
      const int64_t nch = kc / BF_CHUNK;
      if (packed) {
        bp = (uint16_t *)packed;
        packed += (nc + 31) / 32 * 32 * kc;
      } else {
        pack_b_amx(tb, B, ldb, pc, jc, kv, kc, nc, bp);
      }
      for (int64_t ic = 0; ic < M; ic += AMX_MC) {
        const int64_t mc = M - ic < AMX_MC ? M - ic : AMX_MC;
        pack_a_amx(ta, A, lda, ic, pc, mc, kv, kc, ap);
        for (int64_t jr = 0; jr < nc; jr += 32) {
          const int64_t cols = nc - jr < 32 ? nc - jr : 32;
          for (int64_t ir = 0; ir < mc; ir += 32) {
            const int64_t rows = mc - ir < 32 ? mc - ir : 32;
            float *cp = out + (ic + ir) * ldo + jc + jr;
            const int whole = rows == 32 && cols == 32;
            if (pc == 0) {
              _tile_zero(0);
              _tile_zero(1);
              _tile_zero(2);
              _tile_zero(3);
            } else {
              float *src = cp;
              int64_t ld = ldo;
              if (!whole) {
                for (int64_t r = 0; r < 32; r++)
                  for (int64_t j = 0; j < 32; j++) ct[r * 32 + j] = r < rows && j < cols ? cp[r * ldo + j] : 0.0f;
                src = ct;
                ld = 32;
              }
              _tile_loadd(0, src, ld * 4);
              _tile_loadd(1, src + 16, ld * 4);
              _tile_loadd(2, src + 16 * ld, ld * 4);
              _tile_loadd(3, src + 16 * ld + 16, ld * 4);
            }
            const uint16_t *a0 = ap + (ir / 16) * nch * 512, *a1 = a0 + nch * 512;
            const uint16_t *b0 = bp + (jr / 16) * nch * 512, *b1 = b0 + nch * 512;
            for (int64_t c = 0; c < nch; c++) {
              _tile_loadd(4, a0 + c * 512, 64);
              _tile_loadd(6, b0 + c * 512, 64);
              _tile_loadd(5, a1 + c * 512, 64);
              _tile_loadd(7, b1 + c * 512, 64);
              _tile_dpbf16ps(0, 4, 6);
              _tile_dpbf16ps(1, 4, 7);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
            const int direct = whole && beta == 0.0f;
            float *dst = direct ? cp : ct;
            const int64_t ld = direct ? ldo : 32;
            _tile_stored(0, dst, ld * 4);
            _tile_stored(1, dst + 16, ld * 4);
            _tile_stored(2, dst + 16 * ld, ld * 4);
            _tile_stored(3, dst + 16 * ld + 16, ld * 4);
            if (!direct)
              for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < cols; j++) {
                  float *c = cp + r * ldo + j;
                  const float x = ct[r * 32 + j];
                  *c = beta == 0.0f ? x : beta == 1.0f ? ftz(ftz(*c) + x) : ftz(fmaf(beta, ftz(*c), x));
                }
          }
        }
      }
    }
  }
  _tile_release();
  return 0;
}

/* ---- The weights' packed copies (gemm_bf16_weights): a product whose B lies in the registered range is packed once
 * per generation (the range's contents changed: gemm_bf16_weights_changed) and its copy shared by every thread of
 * the process (the ranks multiply against the same weights). A thread that finds an entry being packed waits. */
#define WCACHE_MAX 1024
typedef struct {
  const float *B;
  int tb;
  int64_t N, K, ldb, gen;
  uint16_t *buf;
  size_t cap;
  int packing;
} wcache_entry;
static pthread_mutex_t wc_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wc_cond = PTHREAD_COND_INITIALIZER;
static wcache_entry wc[WCACHE_MAX];
static int wc_n = 0;
static const float *w_lo = NULL, *w_hi = NULL;
static int64_t w_gen = 1;

/* Every call makes the kept copies stale, the same range again included: a new buffer may lie where the old one
 * did (a second run in the same process) with other contents. (The copies' buffers are kept for reuse: another
 * thread may still be reading one.) */
void gemm_bf16_weights(const float *base, int64_t n) {
  pthread_mutex_lock(&wc_lock);
  w_lo = n > 0 ? base : NULL;
  w_hi = n > 0 ? base + n : NULL;
  w_gen++;
  pthread_mutex_unlock(&wc_lock);
}
void gemm_bf16_weights_changed(void) {
  pthread_mutex_lock(&wc_lock);
  w_gen++;
  pthread_mutex_unlock(&wc_lock);
}

/* Packs this generation's copy of every kept entry i with i % parts == part that is stale and not being packed: the
 * ranks call it at the start of a compute phase, each with its own part, so the weights' copies are remade side by
 * side instead of by whichever thread meets each first while the others wait. */
void gemm_bf16_weights_prepack(int part, int parts) {
  if (parts < 1 || part < 0) return;
  pthread_mutex_lock(&wc_lock);
  for (int i = part; i < wc_n; i += parts) {
    wcache_entry *e = &wc[i];
    if (e->packing || e->gen == w_gen || !e->buf || !w_lo) continue;
    const float *last = e->B + (e->tb ? (e->N - 1) * e->ldb + e->K : (e->K - 1) * e->ldb + e->N);
    if (e->B < w_lo || last > w_hi) continue;
    e->packing = 1;
    const int64_t gen = w_gen;
    pthread_mutex_unlock(&wc_lock);
    amx_pack_b_whole(e->tb, e->B, e->ldb, e->N, e->K, e->buf);
    pthread_mutex_lock(&wc_lock);
    e->packing = 0;
    e->gen = gen;
    pthread_cond_broadcast(&wc_cond);
  }
  pthread_mutex_unlock(&wc_lock);
}

/* B's packed copy when B is a registered weight (packing it now if this generation has none), else NULL. */
static const uint16_t *weight_packed(int tb, const float *B, int64_t ldb, int64_t N, int64_t K) {
  const float *last = B + (tb ? (N - 1) * ldb + K : (K - 1) * ldb + N);
  if (!w_lo || B < w_lo || last > w_hi) return NULL;
  pthread_mutex_lock(&wc_lock);
  if (!w_lo || B < w_lo || last > w_hi) {
    pthread_mutex_unlock(&wc_lock);
    return NULL;
  }
  wcache_entry *e = NULL;
  for (;;) {
    e = NULL;
    for (int i = 0; i < wc_n; i++)
      if (wc[i].B == B && wc[i].tb == tb && wc[i].N == N && wc[i].K == K && wc[i].ldb == ldb) e = &wc[i];
    if (!e || !e->packing) break;
    pthread_cond_wait(&wc_cond, &wc_lock);
  }
  if (e && e->gen == w_gen) {
    pthread_mutex_unlock(&wc_lock);
    return e->buf;
  }
  if (!e) {
    if (wc_n == WCACHE_MAX) {
      pthread_mutex_unlock(&wc_lock);
      return NULL;
    }
    e = &wc[wc_n++];
    memset(e, 0, sizeof *e);
    e->B = B, e->tb = tb, e->N = N, e->K = K, e->ldb = ldb;
  }
  const size_t need = amx_packed_b_size(N, K);
  if (e->cap < need) {
    free(e->buf);
    e->buf = (uint16_t *)aligned_alloc(64, (need * 2 + 63) / 64 * 64);
    e->cap = e->buf ? need : 0;
  }
  if (!e->buf) {
    pthread_mutex_unlock(&wc_lock);
    return NULL;
  }
  e->packing = 1;
  const int64_t gen = w_gen;
  pthread_mutex_unlock(&wc_lock);
  amx_pack_b_whole(tb, B, ldb, N, K, e->buf);
  pthread_mutex_lock(&wc_lock);
  e->packing = 0;
  e->gen = gen;
  pthread_cond_broadcast(&wc_cond);
  pthread_mutex_unlock(&wc_lock);
  return e->buf;
}
#else
void gemm_bf16_weights(const float *base, int64_t n) { (void)base, (void)n; }
void gemm_bf16_weights_changed(void) {}
void gemm_bf16_weights_prepack(int part, int parts) { (void)part, (void)parts; }
#endif

static const gemm_kernel PORTABLE_BF16 = {
    P_MR, P_NR, 128, 256, 2048, 0, ukr_portable_bf16, "portable", "portable C 4x16"};

int gemm_bf16_hw_supported(void) {
#ifdef GEMM_X86
  return amx_supported();
#else
  return 0;
#endif
}

int gemm_bf16(gemm_isa isa, int hw, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return 0;
  if (isa == GEMM_ISA_AUTO) isa = gemm_best_isa();
  hw = hw && gemm_bf16_hw_supported();
  const gemm_kernel *e = isa == GEMM_ISA_PORTABLE ? &PORTABLE_BF16 : &KERNELS[isa];
#ifdef GEMM_X86
  const unsigned int csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040); /* flush-to-zero, denormals-are-zero: the hardware's modes, for the emulations */
#endif
  int rc = 0;
#ifdef GEMM_X86
  /* AMX with K in one block: each tile's sum meets C in place (no workspace) */
  if (hw && beta != 0.0f && K > 0 && K <= AMX_KC_ONE) {
    rc = blocked_amx(ta, tb, M, N, K, A, lda, B, ldb, weight_packed(tb, B, ldb, N, K), beta, C, ldc);
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
  else if (hw) rc = blocked_amx(ta, tb, M, N, K, A, lda, B, ldb, weight_packed(tb, B, ldb, N, K), 0.0f, out, ldo);
#endif
  else rc = blocked_bf16(e, ta, tb, M, N, K, A, lda, B, ldb, out, ldo);
  if (w && !rc)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        float *cp = C + i * ldc + j;
        const float x = w[i * N + j];
        *cp = beta == 1.0f ? ftz(ftz(*cp) + x) : ftz(fmaf(beta, ftz(*cp), x));
      }
  free(w);
#ifdef GEMM_X86
  _mm_setcsr(csr);
#endif
  return rc;
}

/* ------------------------------------------------------------------ the core's FMA peak */
#include <time.h>
/* This thread's CPU time: the time the probe actually ran, whatever else the machine is doing. */
double gemm_thread_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#ifdef GEMM_X86
/* 12 independent FMA chains on registers only (enough to cover the FMA latency on both FMA ports). */
#define PEAK_BODY(V, FMA, SET1, STORE, W)                                                                              \
  V x[12];                                                                                                             \
  const V m = SET1(0.999999f), d = SET1(1e-7f);                                                                        \
  for (int i = 0; i < 12; i++) x[i] = SET1((float)i);                                                                  \
  const double t0 = gemm_thread_seconds();                                                                             \
  for (int64_t it = 0; it < iters; it++) {                                                                             \
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) x[i] = FMA(x[i], m, d);                                      \
  }                                                                                                                    \
  const double dt = gemm_thread_seconds() - t0;                                                                        \
  float sink[16];                                                                                                      \
  for (int i = 1; i < 12; i++) x[0] = FMA(x[0], m, x[i]);                                                              \
  STORE(sink, x[0]);                                                                                                   \
  *out = sink[0];                                                                                                      \
  return dt > 0 ? (double)iters * 12 * 2 * W / dt / 1e9 : 0;

__attribute__((target("avx512f"))) static double peak_avx512(int64_t iters, float *out) {
  PEAK_BODY(__m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_storeu_ps, 16)
}
__attribute__((target("avx2,fma"))) static double peak_avx2(int64_t iters, float *out) {
  PEAK_BODY(__m256, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_storeu_ps, 8)
}
#endif

#ifdef GEMM_X86
/* TDPBF16PS on 6 independent 16 x 16 accumulator tiles (each instruction: 16 x 16 x 32 products, 2 flops each). */
__attribute__((target("amx-tile,amx-bf16"))) static double peak_amx(int64_t iters, float *out) {
  amx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  uint32_t in[16 * 16];
  for (int i = 0; i < 256; i++) in[i] = 0x3f803f80u; /* 1.0, 1.0 */
  _tile_loadconfig(&cfg);
  _tile_loadd(6, in, 64);
  _tile_loadd(7, in, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  const double t0 = gemm_thread_seconds();
  for (int64_t it = 0; it < iters; it++) {
    _tile_dpbf16ps(0, 6, 7);
    _tile_dpbf16ps(1, 6, 7);
    _tile_dpbf16ps(2, 6, 7);
    _tile_dpbf16ps(3, 6, 7);
    _tile_dpbf16ps(4, 6, 7);
    _tile_dpbf16ps(5, 6, 7);
  }
  const double dt = gemm_thread_seconds() - t0;
  float sink[256];
  _tile_stored(0, sink, 64);
  *out = sink[0];
  _tile_release();
  return dt > 0 ? (double)iters * 6 * 16 * 16 * 32 * 2 / dt / 1e9 : 0;
}
#endif

double gemm_bf16_peak(int64_t iters) {
  (void)iters; /* unused where the CPU is not x86-64 */
  volatile float sink = 0;
  float out = 0;
  double g = 0;
#ifdef GEMM_X86
  if (gemm_bf16_hw_supported()) g = peak_amx(iters / 8 > 0 ? iters / 8 : 1, &out);
#endif
  sink = out;
  (void)sink;
  return g;
}

double gemm_fma_peak(gemm_isa isa, int64_t iters) {
  volatile float sink = 0;
  float out = 0;
  double g = 0;
  if (isa == GEMM_ISA_AUTO) isa = gemm_best_isa();
  if (!gemm_isa_supported(isa)) return 0;
#ifdef GEMM_X86
  if (isa == GEMM_ISA_AVX512) g = peak_avx512(iters, &out);
  else if (isa == GEMM_ISA_AVX2) g = peak_avx2(iters, &out);
#endif
  if (isa == GEMM_ISA_PORTABLE) { /* scalar fmaf chains, as the portable kernel runs them */
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = (float)i;
    const double t0 = gemm_thread_seconds();
    for (int64_t it = 0; it < iters; it++)
      for (int i = 0; i < 12; i++) x[i] = fmaf(x[i], 0.999999f, 1e-7f);
    const double dt = gemm_thread_seconds() - t0;
    out = x[0] + x[11];
    g = dt > 0 ? (double)iters * 12 * 2 / dt / 1e9 : 0;
  }
  sink = out;
  (void)sink;
  return g;
}
