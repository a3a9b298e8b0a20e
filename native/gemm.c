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
#define A2_MR 6
#define A2_NR 16
__attribute__((target("avx2,fma"))) static void ukr_avx2(int64_t kc, const float *a, const float *b, float *c,
                                                          int64_t ldc, int load, int combine, float beta) {
  __m256 acc[A2_MR][2];
  for (int r = 0; r < A2_MR; r++) {
    acc[r][0] = load ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    acc[r][1] = load ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < kc; p++) {
    const __m256 b0 = _mm256_load_ps(b + p * A2_NR), b1 = _mm256_load_ps(b + p * A2_NR + 8);
    const float *ap = a + p * A2_MR;
#pragma GCC unroll 6
    for (int r = 0; r < A2_MR; r++) {
      const __m256 ar = _mm256_broadcast_ss(ap + r);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  const __m256 vb = _mm256_set1_ps(beta);
  for (int r = 0; r < A2_MR; r++)
    for (int h = 0; h < 2; h++) {
      float *cp = c + r * ldc + 8 * h;
      __m256 v = acc[r][h];
      if (combine && beta == 1.0f) v = _mm256_add_ps(_mm256_loadu_ps(cp), v);
      else if (combine && beta != 0.0f) v = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cp), v);
      _mm256_storeu_ps(cp, v);
    }
}

/* ------------------------------------------------------------------ AVX-512F: 12 x 32 (24 accumulators) */
/* In assembly (GCC's allocation of 24 accumulator intrinsics spills a B vector to the stack every k): zmm0-23
 * hold the 12 x 32 tile, zmm30-31 a row of the B sliver, zmm28-29 the broadcast A values. Per k: 2 loads of B,
 * 12 broadcasts of A, 24 FMAs, each C element c = fma(a, b, c) in k order. The tile goes to `t` (12 x 32, row
 * major); the caller combines it with C. */
#define A5_MR 12
#define A5_NR 32
__attribute__((target("avx512f"))) static void tile_avx512(int64_t kc, const float *a, const float *b,
                                                            const float *c, int64_t ldc, int load, float *t) {
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
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm16\n\t"
      "vmovups 64(%%rax), %%zmm17\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm18\n\t"
      "vmovups 64(%%rax), %%zmm19\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm20\n\t"
      "vmovups 64(%%rax), %%zmm21\n\t"
      "add %[ldcb], %%rax\n\t"
      "vmovups (%%rax), %%zmm22\n\t"
      "vmovups 64(%%rax), %%zmm23\n\t"
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
      "vpxord %%zmm16, %%zmm16, %%zmm16\n\t"
      "vpxord %%zmm17, %%zmm17, %%zmm17\n\t"
      "vpxord %%zmm18, %%zmm18, %%zmm18\n\t"
      "vpxord %%zmm19, %%zmm19, %%zmm19\n\t"
      "vpxord %%zmm20, %%zmm20, %%zmm20\n\t"
      "vpxord %%zmm21, %%zmm21, %%zmm21\n\t"
      "vpxord %%zmm22, %%zmm22, %%zmm22\n\t"
      "vpxord %%zmm23, %%zmm23, %%zmm23\n\t"
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
      "vbroadcastss 32(%[a]), %%zmm28\n\t"
      "vfmadd231ps %%zmm28, %%zmm30, %%zmm16\n\t"
      "vfmadd231ps %%zmm28, %%zmm31, %%zmm17\n\t"
      "vbroadcastss 36(%[a]), %%zmm29\n\t"
      "vfmadd231ps %%zmm29, %%zmm30, %%zmm18\n\t"
      "vfmadd231ps %%zmm29, %%zmm31, %%zmm19\n\t"
      "vbroadcastss 40(%[a]), %%zmm28\n\t"
      "vfmadd231ps %%zmm28, %%zmm30, %%zmm20\n\t"
      "vfmadd231ps %%zmm28, %%zmm31, %%zmm21\n\t"
      "vbroadcastss 44(%[a]), %%zmm29\n\t"
      "vfmadd231ps %%zmm29, %%zmm30, %%zmm22\n\t"
      "vfmadd231ps %%zmm29, %%zmm31, %%zmm23\n\t"
      "add $48, %[a]\n\t"
      "add $128, %[b]\n\t"
      "dec %[k]\n\t"
      "jnz 4b\n\t"
      "5:\n\t"
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
      "vmovaps %%zmm16, 1024(%[t])\n\t"
      "vmovaps %%zmm17, 1088(%[t])\n\t"
      "vmovaps %%zmm18, 1152(%[t])\n\t"
      "vmovaps %%zmm19, 1216(%[t])\n\t"
      "vmovaps %%zmm20, 1280(%[t])\n\t"
      "vmovaps %%zmm21, 1344(%[t])\n\t"
      "vmovaps %%zmm22, 1408(%[t])\n\t"
      "vmovaps %%zmm23, 1472(%[t])\n\t"
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(kc)
      : [c] "r"(c), [ldcb] "r"(ldcb), [load] "r"(load), [t] "r"(t)
      : "rax", "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", "zmm11",
        "zmm12", "zmm13", "zmm14", "zmm15", "zmm16", "zmm17", "zmm18", "zmm19", "zmm20", "zmm21", "zmm22", "zmm23",
        "zmm28", "zmm29", "zmm30", "zmm31", "memory", "cc");
}

__attribute__((target("avx512f"))) static void ukr_avx512(int64_t kc, const float *a, const float *b, float *c,
                                                           int64_t ldc, int load, int combine, float beta) {
  float t[A5_MR * A5_NR] __attribute__((aligned(64)));
  tile_avx512(kc, a, b, c, ldc, load, t);
  const __m512 vb = _mm512_set1_ps(beta);
  for (int r = 0; r < A5_MR; r++)
    for (int h = 0; h < 2; h++) {
      float *cp = c + r * ldc + 16 * h;
      __m512 x = _mm512_load_ps(t + r * A5_NR + 16 * h);
      if (combine && beta == 1.0f) x = _mm512_add_ps(_mm512_loadu_ps(cp), x);
      else if (combine && beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cp), x);
      _mm512_storeu_ps(cp, x);
    }
}
#endif

static const gemm_kernel KERNELS[3] = {
    {P_MR, P_NR, 128, 256, 2048, ukr_portable, "portable", "portable C 4x16"},
#ifdef GEMM_X86
    {A2_MR, A2_NR, 144, 256, 3072, ukr_avx2, "avx2", "AVX2+FMA 6x16"},
    {A5_MR, A5_NR, 384, 192, 3072, ukr_avx512, "avx512", "AVX-512F 12x32"},
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
static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;
typedef struct { float *p; size_t cap; } gemm_buf;
static void buf_free(void *v) {
  gemm_buf *b = (gemm_buf *)v;
  free(b->p);
  free(b);
}
static void buf_init(void) { pthread_key_create(&buf_key, buf_free); }

/* n floats, 64-byte aligned, kept for the thread's next call (freed when the thread ends). */
static float *scratch(size_t n) {
  pthread_once(&buf_once, buf_init);
  gemm_buf *b = (gemm_buf *)pthread_getspecific(buf_key);
  if (!b) {
    b = (gemm_buf *)calloc(1, sizeof *b);
    if (!b) return NULL;
    pthread_setspecific(buf_key, b);
  }
  if (b->cap < n) {
    free(b->p);
    b->p = (float *)aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
    b->cap = b->p ? n : 0;
  }
  return b->p;
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
  const int64_t kcMax = K < g->kc ? K : g->kc;
  const int64_t ncMax = ((N < g->nc ? N : g->nc) + nr - 1) / nr * nr;
  const int64_t mcMax = ((M < g->mc ? M : g->mc) + mr - 1) / mr * mr;
  const size_t bsize = (size_t)(((ncMax * kcMax) + 15) / 16 * 16);
  float *buf = scratch(bsize + (size_t)(mcMax * kcMax));
  if (!buf) return -1;
  float *bp = buf, *ap = buf + bsize;
  for (int64_t jc = 0; jc < N; jc += g->nc) {
    const int64_t nc = N - jc < g->nc ? N - jc : g->nc;
    for (int64_t pc = 0; pc < K; pc += g->kc) {
      const int64_t kc = K - pc < g->kc ? K - pc : g->kc;
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
static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
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
