/*
 * The AVX-512F micro-kernel: A5_MR x A5_NR = 8 x 32 (16 accumulators), in inline assembly; and the same tile for
 * the bf16 emulation (bf16.c's order fused into the k loop: tile_avx512_bf16).
 */
#include "../internal.h"
#ifdef GEMM_X86
#include "tile-asm.h"

/* In assembly (GCC's allocation of many accumulator intrinsics spills a B vector to the stack every k): zmm0-15
 * hold the 8 x 32 tile, zmm30-31 a row of the B sliver, zmm28-29 the broadcast A values. Per k: 2 loads of B,
 * 8 broadcasts of A, 16 FMAs, each C element c = fma(a, b, c) in k order. 8 rows divide every row count of the
 * model's products (64, 256, 576, 1536, 1024), so they need no edge tiles. The tile goes straight to C, or to `t`
 * when the caller combines it with beta*C. */
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
__attribute__((target("avx512f"))) void tile_avx512(int64_t kc, const float *a, int64_t sa, const float *b, int64_t sb,
                                                    float *c, int64_t ldc, int load, float *t, float *d) {
  const int64_t ldcb = ldc * 4, pf = 8 * sb;
  __asm__ volatile(
      T5_PROLOGUE T5_LOOPS(STRIDED) T5_EPILOGUE
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(kc), [d] "+r"(d)
      : [c] "r"(c), [ldcb] "r"(ldcb), [load] "r"(load), [t] "r"(t), [sa] "r"(sa), [sb] "r"(sb), [pf] "r"(pf)
      : T5_CLOBBERS);
}

/* A read in place from eight rows la bytes apart (row r at a + r*la), one float further each k. */
__attribute__((target("avx512f"))) void tile_avx512_rows(int64_t kc, const float *a, int64_t la, const float *b,
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
__attribute__((target("avx512f"))) void combine_avx512(const float *t, float *c, int64_t ldc, float beta) {
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

__attribute__((target("avx512f"))) void ukr_avx512(int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                                                   int load, int combine, float beta) {
  if (!combine || beta == 0.0f) {
    tile_avx512(kc, a, 4 * A5_MR, b, 4 * A5_NR, c, ldc, load, NULL, NULL);
    return;
  }
  float t[A5_MR * A5_NR] __attribute__((aligned(64)));
  tile_avx512(kc, a, 4 * A5_MR, b, 4 * A5_NR, c, ldc, load, t, NULL);
  combine_avx512(t, c, ldc, beta);
}

/* ---- bf16's emulation (bf16.c's order), fused, as tile_avx2_bf16 (kernels/avx2.c) on this tile: t (8 x 32, row
 * major, 64-byte aligned) gets nch chunks of 32 k from packed slivers in k order (a(r, p) at a + 32p + 4r, b(p, j) at
 * b + 128p + 4j, rounded to bf16, zeros past K); per chunk zmm0-15 run the 16 even k's chains from 0 and park them in
 * e (8 x 32, 64-byte aligned), then the 16 odd k's from 0, then t = t + (e + o). */
#define T5_ZERO                                                                                                        \
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
  "vpxord %%zmm15, %%zmm15, %%zmm15\n\t"
#define T5_HALF                                                                                                        \
  "mov $16, %[k]\n\t"                                                                                                  \
  "4:\n\t" T5_PAIR_STRIDED "jnz 4b\n\t"
/* clang-format off */
#define T5_PARK(R, OFF) "vmovaps %%zmm" R ", " OFF "(%[e])\n\t"
#define T5_MEET(R, OFF)                                                                                                \
  "vaddps " OFF "(%[e]), %%zmm" R ", %%zmm" R "\n\t"                                                                   \
  "vaddps " OFF "(%[t]), %%zmm" R ", %%zmm" R "\n\t"                                                                   \
  "vmovaps %%zmm" R ", " OFF "(%[t])\n\t"
#define T5_TILE(OP)                                                                                                    \
  OP("0", "0") OP("1", "64") OP("2", "128") OP("3", "192") OP("4", "256") OP("5", "320") OP("6", "384") OP("7", "448") \
      OP("8", "512") OP("9", "576") OP("10", "640") OP("11", "704") OP("12", "768") OP("13", "832") OP("14", "896")    \
      OP("15", "960")
/* clang-format on */
__attribute__((target("avx512f"))) void tile_avx512_bf16(int64_t nch, const float *a, const float *b, float *t,
                                                         float *e) {
  const int64_t sa = 2 * 4 * A5_MR, sb = 2 * 4 * A5_NR, pf = 8 * sb;
  int64_t k = 0;
  __asm__ volatile(
      "test %[n], %[n]\n\t"
      "jz 7f\n\t"
      "1:\n\t" T5_ZERO T5_HALF T5_TILE(T5_PARK)
      /* the odd k: one row after the chunk's start (the even pass ended 16 rows of 2 past it) */
      "sub $992, %[a]\n\t"
      "sub $3968, %[b]\n\t" T5_ZERO T5_HALF T5_TILE(T5_MEET)
      /* the next chunk: 32 rows after this one's start */
      "sub $32, %[a]\n\t"
      "sub $128, %[b]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "7:\n\t"
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(k), [n] "+r"(nch)
      : [t] "r"(t), [e] "r"(e), [sa] "r"(sa), [sb] "r"(sb), [pf] "r"(pf)
      : T5_CLOBBERS);
}
#endif
