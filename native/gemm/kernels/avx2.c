/*
 * The AVX2 + FMA micro-kernel: A2_MR x A2_NR = 6 x 16 (12 accumulators), in inline assembly; and the same tile for
 * the bf16 emulation (bf16.c's order fused into the k loop: tile_avx2_bf16).
 */
#include "../internal.h"
#ifdef GEMM_X86
#include "tile-asm.h"

/* In assembly, as the AVX-512 kernel (GCC keeps intrinsic accumulators in memory across the k loop): ymm0-11
 * hold the 6 x 16 tile, ymm12-13 a row of the B sliver, ymm14-15 the broadcast A values. Per k: 2 loads of B,
 * 6 broadcasts of A, 12 FMAs, each C element c = fma(a, b, c) in k order. As on AVX-512 (kernels/avx512.c), A and
 * B are read through strides: packed slivers, or the operands in place (tile_avx2_rows: A stored [M,K], six row
 * pointers). */
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

#define T2_A_STRIDED(X) A6_STRIDED(T2_ROW, "14", "15", X)
#define T2_A_ROWS(D) A6_ROWS(T2_ROW, "14", "15", D)
#define T2_K_STRIDED T2_A_STRIDED("") STEP_STRIDED
#define T2_K_ROWS T2_A_ROWS("") STEP_ROWS
#define T2_PAIR_STRIDED TILE_PAIR(T2_LOAD_B, T2_A_STRIDED, ",%[sa]", PAIR_STRIDED)
#define T2_PAIR_ROWS TILE_PAIR(T2_LOAD_B, T2_A_ROWS, "4", PAIR_ROWS)
#define T2_STORE_B                                                                                                     \
  "vmovups %%ymm12, (%[d])\n\t"                                                                                        \
  "vmovups %%ymm13, 32(%[d])\n\t"                                                                                      \
  "add $64, %[d]\n\t"
#define T2_LOOPS(K) TILE_LOOPS(T2_LOAD_B, T2_STORE_B, T2_K_##K, T2_PAIR_##K)

/* a(r, p) at a + p*sa + 4r, b(p, j) at b + p*sb + 4j; t == NULL: the tile goes straight to C (ldc), else to t
 * (6 x 16, row major); d: see TILE_LOOPS */
__attribute__((target("avx2,fma"))) void tile_avx2(int64_t kc, const float *a, int64_t sa, const float *b, int64_t sb,
                                                   float *c, int64_t ldc, int load, float *t, float *d) {
  const int64_t ldcb = ldc * 4, pf = 8 * sb;
  __asm__ volatile(
      T2_PROLOGUE T2_LOOPS(STRIDED) T2_EPILOGUE
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(kc), [d] "+r"(d)
      : [c] "r"(c), [ldcb] "r"(ldcb), [load] "r"(load), [t] "r"(t), [sa] "r"(sa), [sb] "r"(sb), [pf] "r"(pf)
      : T2_CLOBBERS);
}

/* A read in place from six rows la bytes apart (row r at a + r*la), one float further each k. */
__attribute__((target("avx2,fma"))) void tile_avx2_rows(int64_t kc, const float *a, int64_t la, const float *b,
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
__attribute__((target("avx2,fma"))) void combine_avx2(const float *t, float *c, int64_t ldc, float beta) {
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

__attribute__((target("avx2,fma"))) void ukr_avx2(int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                                                  int load, int combine, float beta) {
  if (!combine || beta == 0.0f) {
    tile_avx2(kc, a, 4 * A2_MR, b, 4 * A2_NR, c, ldc, load, NULL, NULL);
    return;
  }
  float t[A2_MR * A2_NR] __attribute__((aligned(32)));
  tile_avx2(kc, a, 4 * A2_MR, b, 4 * A2_NR, c, ldc, load, t, NULL);
  combine_avx2(t, c, ldc, beta);
}

/* ---- bf16's emulation (bf16.c's order), fused: t (6 x 16, row major, 32-byte aligned: the tile's running sum) gets
 * nch chunks of 32 k from packed slivers in k order (a(r, p) at a + 24p + 4r, b(p, j) at b + 64p + 4j, every value
 * already rounded to bf16, zeros past K). Per chunk, ymm0-11 run the 16 even k's chains from 0 (rows 48 and 128 bytes
 * apart: every other k) and park them in e (6 x 16, 32-byte aligned, in L1), then the 16 odd k's chains from 0, then
 * each vector becomes t + (e + o) and is stored back to t: acc = acc + (e + o), the order, every sum rounded once
 * under the caller's flush-to-zero and denormals-are-zero modes. So a chunk costs the fp32 kernel's 32 k plus 24 adds
 * and 24 stores in L1, where the kernel run on each half chunk stored and reloaded two whole tiles and added them in
 * a scalar loop (paired median time 0.40-0.54 of that on the model's linear products at seq 1024, from 0.34-0.52 of
 * the AVX2 peak to 0.76-0.90; a Zen 5, the machine loaded; BF16=1 ISA=1 bench/native/gemm-ab.sh). */
#define T2_ZERO                                                                                                        \
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
  "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"
/* 16 k of one chain (every other k of the chunk), two at a time */
#define T2_HALF                                                                                                        \
  "mov $16, %[k]\n\t"                                                                                                  \
  "4:\n\t" T2_PAIR_STRIDED "jnz 4b\n\t"
/* clang-format off */
#define T2_PARK(R, OFF) "vmovaps %%ymm" R ", " OFF "(%[e])\n\t"
/* the chunk's sum into the tile: o + e (= e + o), then t + that (= acc + (e + o)) */
#define T2_MEET(R, OFF)                                                                                                \
  "vaddps " OFF "(%[e]), %%ymm" R ", %%ymm" R "\n\t"                                                                   \
  "vaddps " OFF "(%[t]), %%ymm" R ", %%ymm" R "\n\t"                                                                   \
  "vmovaps %%ymm" R ", " OFF "(%[t])\n\t"
#define T2_TILE(OP)                                                                                                    \
  OP("0", "0") OP("1", "32") OP("2", "64") OP("3", "96") OP("4", "128") OP("5", "160") OP("6", "192") OP("7", "224")   \
      OP("8", "256") OP("9", "288") OP("10", "320") OP("11", "352")
/* clang-format on */
__attribute__((target("avx2,fma"))) void tile_avx2_bf16(int64_t nch, const float *a, const float *b, float *t,
                                                        float *e) {
  const int64_t sa = 2 * 4 * A2_MR, sb = 2 * 4 * A2_NR, pf = 8 * sb;
  int64_t k = 0;
  __asm__ volatile(
      "test %[n], %[n]\n\t"
      "jz 7f\n\t"
      "1:\n\t" T2_ZERO T2_HALF T2_TILE(T2_PARK)
      /* the odd k: one row after the chunk's start (the even pass ended 16 rows of 2 past it) */
      "sub $744, %[a]\n\t"
      "sub $1984, %[b]\n\t" T2_ZERO T2_HALF T2_TILE(T2_MEET)
      /* the next chunk: 32 rows after this one's start */
      "sub $24, %[a]\n\t"
      "sub $64, %[b]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "7:\n\t"
      "vzeroupper\n\t"
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(k), [n] "+r"(nch)
      : [t] "r"(t), [e] "r"(e), [sa] "r"(sa), [sb] "r"(sb), [pf] "r"(pf)
      : "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9", "ymm10", "ymm11", "ymm12",
        "ymm13", "ymm14", "ymm15", "memory", "cc");
}
#endif
