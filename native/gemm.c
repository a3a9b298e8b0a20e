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
  int64_t mc, kc; /* A block (L2), K block (the B sliver kc x nr stays in L1) */
  int64_t nc;     /* B panel (L3) */
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
static void ukr_portable(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine,
                         float beta) {
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
 * 6 broadcasts of A, 12 FMAs, each C element c = fma(a, b, c) in k order. */
#define A2_MR 6
#define A2_NR 16
__attribute__((target("avx2,fma"))) static void tile_avx2(int64_t kc, const float *a, const float *b, float *c,
                                                          int64_t ldc, int load, float *t) {
  /* t == NULL: the tile goes straight to C (ldc); else to t (6 x 16, row major) */
  const int64_t ldcb = ldc * 4;
  __asm__ volatile(
      "test %[load], %[load]\n\t"
      "jz 2f\n\t"
      "mov %[c], %%rax\n\t"
      "vmovups (%%rax), %%ymm0\n\t"
      "vmovups 32(%%rax), %%ymm1\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%ymm2\n\t"
      "vmovups 32(%%rax), %%ymm3\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%ymm4\n\t"
      "vmovups 32(%%rax), %%ymm5\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%ymm6\n\t"
      "vmovups 32(%%rax), %%ymm7\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%ymm8\n\t"
      "vmovups 32(%%rax), %%ymm9\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%ymm10\n\t"
      "vmovups 32(%%rax), %%ymm11\n\t"
      "jmp 3f\n\t"
      "2:\n\t"
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
      "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"
      "vxorps %%ymm2, %%ymm2, %%ymm2\n\t"
      "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"
      "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"
      "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"
      "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"
      "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"
      "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"
      "vxorps %%ymm10, %%ymm10, %%ymm10\n\t"
      "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"
      "3:\n\t"
      "test %[k], %[k]\n\t"
      "jz 5f\n\t"
      "4:\n\t"
      "vmovaps (%[b]), %%ymm12\n\t"
      "vmovaps 32(%[b]), %%ymm13\n\t"
      "prefetcht0 512(%[b])\n\t"
      "vbroadcastss 0(%[a]), %%ymm14\n\t"
      "vfmadd231ps %%ymm14, %%ymm12, %%ymm0\n\t"
      "vfmadd231ps %%ymm14, %%ymm13, %%ymm1\n\t"
      "vbroadcastss 4(%[a]), %%ymm15\n\t"
      "vfmadd231ps %%ymm15, %%ymm12, %%ymm2\n\t"
      "vfmadd231ps %%ymm15, %%ymm13, %%ymm3\n\t"
      "vbroadcastss 8(%[a]), %%ymm14\n\t"
      "vfmadd231ps %%ymm14, %%ymm12, %%ymm4\n\t"
      "vfmadd231ps %%ymm14, %%ymm13, %%ymm5\n\t"
      "vbroadcastss 12(%[a]), %%ymm15\n\t"
      "vfmadd231ps %%ymm15, %%ymm12, %%ymm6\n\t"
      "vfmadd231ps %%ymm15, %%ymm13, %%ymm7\n\t"
      "vbroadcastss 16(%[a]), %%ymm14\n\t"
      "vfmadd231ps %%ymm14, %%ymm12, %%ymm8\n\t"
      "vfmadd231ps %%ymm14, %%ymm13, %%ymm9\n\t"
      "vbroadcastss 20(%[a]), %%ymm15\n\t"
      "vfmadd231ps %%ymm15, %%ymm12, %%ymm10\n\t"
      "vfmadd231ps %%ymm15, %%ymm13, %%ymm11\n\t"
      "add $24, %[a]\n\t"
      "add $64, %[b]\n\t"
      "dec %[k]\n\t"
      "jnz 4b\n\t"
      "5:\n\t"
      "test %[t], %[t]\n\t"
      "jz 6f\n\t"
      "vmovaps %%ymm0, 0(%[t])\n\t"
      "vmovaps %%ymm1, 32(%[t])\n\t"
      "vmovaps %%ymm2, 64(%[t])\n\t"
      "vmovaps %%ymm3, 96(%[t])\n\t"
      "vmovaps %%ymm4, 128(%[t])\n\t"
      "vmovaps %%ymm5, 160(%[t])\n\t"
      "vmovaps %%ymm6, 192(%[t])\n\t"
      "vmovaps %%ymm7, 224(%[t])\n\t"
      "vmovaps %%ymm8, 256(%[t])\n\t"
      "vmovaps %%ymm9, 288(%[t])\n\t"
      "vmovaps %%ymm10, 320(%[t])\n\t"
      "vmovaps %%ymm11, 352(%[t])\n\t"
      "jmp 7f\n\t"
      "6:\n\t"
      "mov %[c], %%rax\n\t"
      "vmovups %%ymm0, (%%rax)\n\t"
      "vmovups %%ymm1, 32(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%ymm2, (%%rax)\n\t"
      "vmovups %%ymm3, 32(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%ymm4, (%%rax)\n\t"
      "vmovups %%ymm5, 32(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%ymm6, (%%rax)\n\t"
      "vmovups %%ymm7, 32(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%ymm8, (%%rax)\n\t"
      "vmovups %%ymm9, 32(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%ymm10, (%%rax)\n\t"
      "vmovups %%ymm11, 32(%%rax)\n\t"
      "7:\n\t"
      "vzeroupper\n\t"
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(kc)
      : [c] "r"(c), [ldcb] "r"(ldcb), [load] "r"(load), [t] "r"(t)
      : "rax", "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9", "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "ymm15", "memory", "cc");
}

__attribute__((target("avx2,fma"))) static void ukr_avx2(int64_t kc, const float *a, const float *b, float *c,
                                                          int64_t ldc, int load, int combine, float beta) {
  if (!combine || beta == 0.0f) {
    tile_avx2(kc, a, b, c, ldc, load, NULL);
    return;
  }
  float t[A2_MR * A2_NR] __attribute__((aligned(32)));
  tile_avx2(kc, a, b, c, ldc, load, t);
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

/* ------------------------------------------------------------------ AVX-512F: 8 x 32 (16 accumulators) */
/* In assembly (GCC's allocation of many accumulator intrinsics spills a B vector to the stack every k): zmm0-15
 * hold the 8 x 32 tile, zmm30-31 a row of the B sliver, zmm28-29 the broadcast A values. Per k: 2 loads of B,
 * 8 broadcasts of A, 16 FMAs, each C element c = fma(a, b, c) in k order. 8 rows divide every row count of the
 * model's products (64, 256, 576, 1536, 1024), so they need no edge tiles. The tile goes straight to C, or to `t`
 * when the caller combines it with beta*C. */
#define A5_MR 8
#define A5_NR 32
__attribute__((target("avx512f"))) static void tile_avx512(int64_t kc, const float *a, const float *b, float *c,
                                                            int64_t ldc, int load, float *t) {
  /* t == NULL: the tile goes straight to C (ldc); else to t (MR x 32, row major) */
  const int64_t ldcb = ldc * 4;
  __asm__ volatile(
      "test %[load], %[load]\n\t"
      "jz 2f\n\t"
      "mov %[c], %%rax\n\t"
      "vmovups (%%rax), %%zmm0\n\t"
      "vmovups 64(%%rax), %%zmm1\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm2\n\t"
      "vmovups 64(%%rax), %%zmm3\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm4\n\t"
      "vmovups 64(%%rax), %%zmm5\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm6\n\t"
      "vmovups 64(%%rax), %%zmm7\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm8\n\t"
      "vmovups 64(%%rax), %%zmm9\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm10\n\t"
      "vmovups 64(%%rax), %%zmm11\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm12\n\t"
      "vmovups 64(%%rax), %%zmm13\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm14\n\t"
      "vmovups 64(%%rax), %%zmm15\n\t"
      "jmp 3f\n\t"
      "2:\n\t"
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
      "vpxord %%zmm1, %%zmm1, %%zmm1\n\t"
      "vpxord %%zmm2, %%zmm2, %%zmm2\n\t"
      "vpxord %%zmm3, %%zmm3, %%zmm3\n\t"
      "vpxord %%zmm4, %%zmm4, %%zmm4\n\t"
      "vpxord %%zmm5, %%zmm5, %%zmm5\n\t"
      "vpxord %%zmm6, %%zmm6, %%zmm6\n\t"
      "vpxord %%zmm7, %%zmm7, %%zmm7\n\t"
      "vpxord %%zmm8, %%zmm8, %%zmm8\n\t"
      "vpxord %%zmm9, %%zmm9, %%zmm9\n\t"
      "vpxord %%zmm10, %%zmm10, %%zmm10\n\t"
      "vpxord %%zmm11, %%zmm11, %%zmm11\n\t"
      "vpxord %%zmm12, %%zmm12, %%zmm12\n\t"
      "vpxord %%zmm13, %%zmm13, %%zmm13\n\t"
      "vpxord %%zmm14, %%zmm14, %%zmm14\n\t"
      "vpxord %%zmm15, %%zmm15, %%zmm15\n\t"
      "3:\n\t"
      "test %[k], %[k]\n\t"
      "jz 5f\n\t"
      "4:\n\t"
      "vmovaps (%[b]), %%zmm30\n\t"
      "vmovaps 64(%[b]), %%zmm31\n\t"
      "prefetcht0 1024(%[b])\n\t"
      "vbroadcastss 0(%[a]), %%zmm28\n\t"
      "vfmadd231ps %%zmm28, %%zmm30, %%zmm0\n\t"
      "vfmadd231ps %%zmm28, %%zmm31, %%zmm1\n\t"
      "vbroadcastss 4(%[a]), %%zmm29\n\t"
      "vfmadd231ps %%zmm29, %%zmm30, %%zmm2\n\t"
      "vfmadd231ps %%zmm29, %%zmm31, %%zmm3\n\t"
      "vbroadcastss 8(%[a]), %%zmm28\n\t"
      "vfmadd231ps %%zmm28, %%zmm30, %%zmm4\n\t"
      "vfmadd231ps %%zmm28, %%zmm31, %%zmm5\n\t"
      "vbroadcastss 12(%[a]), %%zmm29\n\t"
      "vfmadd231ps %%zmm29, %%zmm30, %%zmm6\n\t"
      "vfmadd231ps %%zmm29, %%zmm31, %%zmm7\n\t"
      "vbroadcastss 16(%[a]), %%zmm28\n\t"
      "vfmadd231ps %%zmm28, %%zmm30, %%zmm8\n\t"
      "vfmadd231ps %%zmm28, %%zmm31, %%zmm9\n\t"
      "vbroadcastss 20(%[a]), %%zmm29\n\t"
      "vfmadd231ps %%zmm29, %%zmm30, %%zmm10\n\t"
      "vfmadd231ps %%zmm29, %%zmm31, %%zmm11\n\t"
      "vbroadcastss 24(%[a]), %%zmm28\n\t"
      "vfmadd231ps %%zmm28, %%zmm30, %%zmm12\n\t"
      "vfmadd231ps %%zmm28, %%zmm31, %%zmm13\n\t"
      "vbroadcastss 28(%[a]), %%zmm29\n\t"
      "vfmadd231ps %%zmm29, %%zmm30, %%zmm14\n\t"
      "vfmadd231ps %%zmm29, %%zmm31, %%zmm15\n\t"
      "add $32, %[a]\n\t"
      "add $128, %[b]\n\t"
      "dec %[k]\n\t"
      "jnz 4b\n\t"
      "5:\n\t"
      "test %[t], %[t]\n\t"
      "jz 6f\n\t"
      "vmovaps %%zmm0, 0(%[t])\n\t"
      "vmovaps %%zmm1, 64(%[t])\n\t"
      "vmovaps %%zmm2, 128(%[t])\n\t"
      "vmovaps %%zmm3, 192(%[t])\n\t"
      "vmovaps %%zmm4, 256(%[t])\n\t"
      "vmovaps %%zmm5, 320(%[t])\n\t"
      "vmovaps %%zmm6, 384(%[t])\n\t"
      "vmovaps %%zmm7, 448(%[t])\n\t"
      "vmovaps %%zmm8, 512(%[t])\n\t"
      "vmovaps %%zmm9, 576(%[t])\n\t"
      "vmovaps %%zmm10, 640(%[t])\n\t"
      "vmovaps %%zmm11, 704(%[t])\n\t"
      "vmovaps %%zmm12, 768(%[t])\n\t"
      "vmovaps %%zmm13, 832(%[t])\n\t"
      "vmovaps %%zmm14, 896(%[t])\n\t"
      "vmovaps %%zmm15, 960(%[t])\n\t"
      "jmp 7f\n\t"
      "6:\n\t"
      "mov %[c], %%rax\n\t"
      "vmovups %%zmm0, (%%rax)\n\t"
      "vmovups %%zmm1, 64(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%zmm2, (%%rax)\n\t"
      "vmovups %%zmm3, 64(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%zmm4, (%%rax)\n\t"
      "vmovups %%zmm5, 64(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%zmm6, (%%rax)\n\t"
      "vmovups %%zmm7, 64(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%zmm8, (%%rax)\n\t"
      "vmovups %%zmm9, 64(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%zmm10, (%%rax)\n\t"
      "vmovups %%zmm11, 64(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%zmm12, (%%rax)\n\t"
      "vmovups %%zmm13, 64(%%rax)\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups %%zmm14, (%%rax)\n\t"
      "vmovups %%zmm15, 64(%%rax)\n\t"
      "7:\n\t"
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(kc)
      : [c] "r"(c), [ldcb] "r"(ldcb), [load] "r"(load), [t] "r"(t)
      : "rax", "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", "zmm11", "zmm12", "zmm13", "zmm14", "zmm15", "zmm28", "zmm29", "zmm30", "zmm31", "memory", "cc");
}

__attribute__((target("avx512f"))) static void ukr_avx512(int64_t kc, const float *a, const float *b, float *c,
                                                           int64_t ldc, int load, int combine, float beta) {
  if (!combine || beta == 0.0f) {
    tile_avx512(kc, a, b, c, ldc, load, NULL);
    return;
  }
  float t[A5_MR * A5_NR] __attribute__((aligned(64)));
  tile_avx512(kc, a, b, c, ldc, load, t);
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
#endif

static const gemm_kernel KERNELS[3] = {
    {P_MR, P_NR, 128, 256, 2048, ukr_portable, "portable", "portable C 4x16"},
#ifdef GEMM_X86
    {A2_MR, A2_NR, 144, 256, 3072, ukr_avx2, "avx2", "AVX2+FMA 6x16"},
    {A5_MR, A5_NR, 384, 192, 3072, ukr_avx512, "avx512", "AVX-512F 8x32"},
#else
    {P_MR, P_NR, 128, 256, 2048, ukr_portable, "avx2", "(not on this CPU)"},
    {P_MR, P_NR, 128, 256, 2048, ukr_portable, "avx512", "(not on this CPU)"},
#endif
};

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

void gemm_thread_release(void) {
  free(buf_p);
  buf_p = NULL;
  buf_cap = 0;
}

/* n floats, 64-byte aligned, kept for the thread's next call. */
static float *scratch(size_t n) {
  if (buf_cap < n) {
    free(buf_p);
    buf_p = (float *)aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
    buf_cap = buf_p ? n : 0;
  }
  return buf_p;
}

/* ------------------------------------------------------------------ packing (the same on every kernel) */
/* A[i0:i0+mc, p0:p0+kc] (times alpha) into MR-row slivers: sliver s holds a[s*MR + r, p] at s*MR*kc + p*MR + r;
 * rows past mc are 0. */
static void pack_a(int mr, int ta, const float *A, int64_t lda, int64_t i0, int64_t p0, int64_t mc, int64_t kc,
                   float alpha, float *ap) {
  for (int64_t s = 0; s < mc; s += mr, ap += mr * kc) {
    const int64_t rows = mc - s < mr ? mc - s : mr;
    if (ta) { /* A stored [K,M]: a row of the sliver is contiguous in A */
      for (int64_t p = 0; p < kc; p++) {
        const float *src = A + (p0 + p) * lda + i0 + s;
        float *dst = ap + p * mr;
        int64_t r = 0;
        for (; r < rows; r++) dst[r] = alpha == 1.0f ? src[r] : alpha * src[r];
        for (; r < mr; r++) dst[r] = 0.0f;
      }
    } else { /* A stored [M,K]: read each row along k */
      for (int64_t r = 0; r < mr; r++) {
        if (r >= rows) {
          for (int64_t p = 0; p < kc; p++) ap[p * mr + r] = 0.0f;
          continue;
        }
        const float *src = A + (i0 + s + r) * lda + p0;
        for (int64_t p = 0; p < kc; p++) ap[p * mr + r] = alpha == 1.0f ? src[p] : alpha * src[p];
      }
    }
  }
}

/* B[p0:p0+kc, j0:j0+nc] into NR-column slivers: sliver s holds b[p, s*NR + j] at s*NR*kc + p*NR + j; columns past
 * nc are 0. */
static void pack_b(int nr, int tb, const float *B, int64_t ldb, int64_t p0, int64_t j0, int64_t kc, int64_t nc,
                   float *bp) {
  for (int64_t s = 0; s < nc; s += nr, bp += nr * kc) {
    const int64_t cols = nc - s < nr ? nc - s : nr;
    if (!tb) { /* B stored [K,N]: a row of the sliver is contiguous */
      for (int64_t p = 0; p < kc; p++) {
        const float *src = B + (p0 + p) * ldb + j0 + s;
        float *dst = bp + p * nr;
        int64_t j = 0;
        for (; j < cols; j++) dst[j] = src[j];
        for (; j < nr; j++) dst[j] = 0.0f;
      }
    } else { /* B stored [N,K]: read each column along k */
      for (int64_t j = 0; j < nr; j++) {
        if (j >= cols) {
          for (int64_t p = 0; p < kc; p++) bp[p * nr + j] = 0.0f;
          continue;
        }
        const float *src = B + (j0 + s + j) * ldb + p0;
        for (int64_t p = 0; p < kc; p++) bp[p * nr + j] = src[p];
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

/* C = op(A) op(B) (+ beta*C when the whole K fits one block); K-blocks after the first continue C's chains. */
static int blocked(const gemm_kernel *g, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  const int mr = g->mr, nr = g->nr;
  /* K in equal blocks of at most g->kc (K = 256 on a 192 block: 2 x 128, not 192 + 64), so no block is a short
   * tail that pays a full tile's load and store for little work. The order of summation does not change. */
  const int64_t kblocks = (K + g->kc - 1) / g->kc, kcMax = (K + kblocks - 1) / kblocks;
  const int64_t ncMax = ((N < g->nc ? N : g->nc) + nr - 1) / nr * nr;
  const int64_t mcMax = ((M < g->mc ? M : g->mc) + mr - 1) / mr * mr;
  const size_t bsize = (size_t)(((ncMax * kcMax) + 15) / 16 * 16);
  float *buf = scratch(bsize + (size_t)(mcMax * kcMax));
  if (!buf) return -1;
  float *bp = buf, *ap = buf + bsize;
  for (int64_t jc = 0; jc < N; jc += g->nc) {
    const int64_t nc = N - jc < g->nc ? N - jc : g->nc;
    for (int64_t pc = 0; pc < K; pc += kcMax) {
      const int64_t kc = K - pc < kcMax ? K - pc : kcMax;
      const int load = pc > 0, combine = pc == 0 && pc + kc == K;
      pack_b(nr, tb, B, ldb, pc, jc, kc, nc, bp);
      for (int64_t ic = 0; ic < M; ic += g->mc) {
        const int64_t mc = M - ic < g->mc ? M - ic : g->mc;
        pack_a(mr, ta, A, lda, ic, pc, mc, kc, alpha, ap);
        for (int64_t jr = 0; jr < nc; jr += nr) {
          const int64_t cols = nc - jr < nr ? nc - jr : nr;
          const float *bs = bp + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += mr) {
            const int64_t rows = mc - ir < mr ? mc - ir : mr;
            float *cp = C + (ic + ir) * ldc + jc + jr;
            const float *as = ap + ir * kc;
            if (rows == mr && cols == nr) g->ukr(kc, as, bs, cp, ldc, load, combine, beta);
            else edge_tile(g, kc, as, bs, cp, ldc, rows, cols, load, combine, beta);
          }
        }
      }
    }
  }
  return 0;
}

int gemm_sgemm(gemm_isa isa, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
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
  if (beta == 0.0f || K <= g->kc) return blocked(g, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  /* beta != 0 and K spans several blocks: the chains run in a workspace, then meet beta*C once. */
  float *w = (float *)malloc((size_t)(M * N) * sizeof(float));
  if (!w) return -1;
  if (blocked(g, ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, w, N)) {
    free(w);
    return -1;
  }
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      float *cp = C + i * ldc + j;
      const float s = w[i * N + j];
      *cp = beta == 1.0f ? *cp + s : fmaf(beta, *cp, s);
    }
  free(w);
  return 0;
}

/* ------------------------------------------------------------------ the core's FMA peak */
#include <time.h>
/* This thread's CPU time: the time the probe actually ran, whatever else the machine is doing. */
static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#ifdef GEMM_X86
/* 12 independent FMA chains on registers only (enough to cover the FMA latency on both FMA ports). */
#define PEAK_BODY(V, FMA, SET1, STORE, W)                                                                         \
  V x[12];                                                                                                      \
  const V m = SET1(0.999999f), d = SET1(1e-7f);                                                                 \
  for (int i = 0; i < 12; i++) x[i] = SET1((float)i);                                                           \
  const double t0 = seconds();                                                                                  \
  for (int64_t it = 0; it < iters; it++) {                                                                      \
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) x[i] = FMA(x[i], m, d);                               \
  }                                                                                                             \
  const double dt = seconds() - t0;                                                                             \
  float sink[16];                                                                                               \
  for (int i = 1; i < 12; i++) x[0] = FMA(x[0], m, x[i]);                                                       \
  STORE(sink, x[0]);                                                                                            \
  *out = sink[0];                                                                                               \
  return dt > 0 ? (double)iters * 12 * 2 * W / dt / 1e9 : 0;

__attribute__((target("avx512f"))) static double peak_avx512(int64_t iters, float *out) {
  PEAK_BODY(__m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_storeu_ps, 16)
}
__attribute__((target("avx2,fma"))) static double peak_avx2(int64_t iters, float *out) {
  PEAK_BODY(__m256, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_storeu_ps, 8)
}
#endif

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
    const double t0 = seconds();
    for (int64_t it = 0; it < iters; it++)
      for (int i = 0; i < 12; i++) x[i] = fmaf(x[i], 0.999999f, 1e-7f);
    const double dt = seconds() - t0;
    out = x[0] + x[11];
    g = dt > 0 ? (double)iters * 12 * 2 / dt / 1e9 : 0;
  }
  sink = out;
  (void)sink;
  return g;
}
