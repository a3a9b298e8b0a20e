/*
 * The GEMM's internal declarations, shared by its files (native/gemm/): the kernel descriptors and their tables,
 * the micro-kernels, the packing routines and buffers, the bf16 rounding. Nothing here is the addon's API: that is
 * native/gemm.h. Every symbol declared here is hidden (not exported from the addon).
 */
#ifndef TSTRAIN_GEMM_INTERNAL_H
#define TSTRAIN_GEMM_INTERNAL_H
#include "../gemm.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMM_X86 1
#include <immintrin.h>
#endif

#include "config.h"

#pragma GCC visibility push(hidden)

/* An MR x NR micro-kernel. acc = load ? C tile : 0; acc += a-sliver x b-sliver over kc; then the tile gets
 * acc, or (combine, only when the chain started in this call) acc combined with beta*C. */
typedef void (*ukr_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine,
                       float beta);

typedef struct {
  int mr, nr;     /* register tile */
  int64_t mc, kc; /* A block, K block (the A sliver mr x kc stays in L1 for a row of tiles) */
  int64_t nc;     /* B panel's widest (kc x nc: in L2 while the row tiles stream its slivers) */
  int64_t kone;   /* a K up to this runs as one block (C written once; kc x nc smaller to fit) */
  int64_t panel1; /* the B panel's floats at most where one panel holds all of N (A then packed once) */
  int64_t paneln; /* ... where N takes several panels */
  int64_t kslv;   /* the longest K whose A sliver (mr x K) fits half of L1 */
  ukr_fn ukr;
  const char *name, *detail;
} gemm_kernel;

/* The blocked product's kernels, by gemm_isa (frame.c); where the CPU is not x86-64 the avx2 and avx512 entries
 * run the portable kernel. Their blocks are set once from this CPU's caches (gemm_blocks_setup) before any product
 * reads them. */
extern gemm_kernel KERNELS[3];
/* frame.c: sets the kernels' blocks from this CPU's caches, once (every entry point calls it first) */
void gemm_blocks_setup(void);

/* kernels/portable.c: the portable micro-kernel (P_MR x P_NR), and the same with bf16's flushes written out (one
 * chain from 0 over kc; load, combine and beta ignored) */
void ukr_portable(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine, float beta);
void ukr_portable_bf16(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine,
                       float beta);

#ifdef GEMM_X86
/* The tile kernels behind the x86 micro-kernels, A and B read through strides (kernels/avx2.c, kernels/avx512.c):
 * the blocked product's packed slivers, or small products' operands in place (frame.c: direct()). */
typedef void (*tile_fn)(int64_t kc, const float *a, int64_t sa, const float *b, int64_t sb, float *c, int64_t ldc,
                        int load, float *t, float *d);
typedef void (*combine_fn)(const float *t, float *c, int64_t ldc, float beta);
typedef struct {
  int mr, nr;
  tile_fn strided, rows; /* d != NULL: each also lays the B rows it reads out in d */
  combine_fn combine;    /* a whole tile with beta != 0 */
  int64_t kc;            /* K block (0: K in one block) */
} direct_kernel;

/* By gemm_isa: the tile kernels and their direct() K block (frame.c; the portable entry is empty). */
extern const direct_kernel DIRECT[3];

/* kernels/avx2.c */
void tile_avx2(int64_t kc, const float *a, int64_t sa, const float *b, int64_t sb, float *c, int64_t ldc, int load,
               float *t, float *d);
void tile_avx2_rows(int64_t kc, const float *a, int64_t la, const float *b, int64_t sb, float *c, int64_t ldc, int load,
                    float *t, float *d);
void combine_avx2(const float *t, float *c, int64_t ldc, float beta);
void ukr_avx2(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine, float beta);

/* kernels/avx2.c, kernels/avx512.c: bf16's emulation fused into the tile (bf16.c's order). t (MR x NR, row major,
 * aligned to the vector: the tile's running sum) += nch chunks of 32 k of the packed slivers a and b (k in order,
 * rounded to bf16, zeros past K): per chunk the even k's chains and the odd k's from 0 in registers, the even ones
 * parked in e (as t), then t = t + (e + o). */
typedef void (*bf16_tile_fn)(int64_t nch, const float *a, const float *b, float *t, float *e);
void tile_avx2_bf16(int64_t nch, const float *a, const float *b, float *t, float *e);
void tile_avx512_bf16(int64_t nch, const float *a, const float *b, float *t, float *e);

/* kernels/avx512.c */
void tile_avx512(int64_t kc, const float *a, int64_t sa, const float *b, int64_t sb, float *c, int64_t ldc, int load,
                 float *t, float *d);
void tile_avx512_rows(int64_t kc, const float *a, int64_t la, const float *b, int64_t sb, float *c, int64_t ldc,
                      int load, float *t, float *d);
void combine_avx512(const float *t, float *c, int64_t ldc, float beta);
void ukr_avx512(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine, float beta);

/* kernels/amx.c: whether this process may run AMX-BF16; out[M,N] = acc on AMX (bf16.c's order); B packed whole as
 * blocked_amx reads it (weights.c keeps such copies) */
int amx_supported(void);
int blocked_amx(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                int64_t ldb, const uint16_t *packed, float beta, float *out, int64_t ldo);
size_t amx_packed_b_size(int64_t N, int64_t K);
void amx_pack_b_whole(int tb, const float *B, int64_t ldb, int64_t N, int64_t K, uint16_t *dst);

/* kernels/avx512bf16.c: whether VDPBF16PS is there and passed the start-up self-check (and why not); C from the
 * chunks' sums on it (bf16.c's order and combine; B packed whole by dp_pack_b_whole, or NULL) */
int dp_supported(void);
const char *dp_status(void);
int blocked_dp(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
               int64_t ldb, const uint32_t *bw, float beta, float *C, int64_t ldc);
size_t dp_packed_b_size(int64_t N, int64_t K);
void dp_pack_b_whole(int tb, const float *B, int64_t ldb, int64_t N, int64_t K, uint32_t *dst);

/* weights.c: B's packed copy in a kernel's layout (GEMM_BF16_AMX: uint16_t, GEMM_BF16_DP: uint32_t) when B is a
 * registered weight (packing it now if this generation has none), else NULL */
const void *weight_packed(int layout, int tb, const float *B, int64_t ldb, int64_t N, int64_t K);

/* pack.c: whether the AVX2 transposes run (set by gemm_sgemm on its first call; same bits as the loops), and the
 * row-wise copy into AVX2 slivers (direct() lays out A stored [K,M] with it) */
extern int fast_pack;
void pack_rowwise_avx2(int w, const float *src, int64_t ld, int64_t kc, int64_t n, float *dst);
#endif

/* frame.c: the width of the B panels of a product N columns wide, for a K block of kc (a multiple of g->nr) */
int64_t panel_cols(const gemm_kernel *g, int64_t N, int64_t kc);

/* pack.c: this thread's packing buffer and blocked()'s workspace (n floats, 64-byte aligned, kept for the thread's
 * next call; NULL when out of memory), and the packing of A and B into slivers */
float *scratch(size_t n);
float *workspace(size_t n);
void pack_a(int mr, int ta, const float *A, int64_t lda, int64_t i0, int64_t p0, int64_t mc, int64_t kc, float alpha,
            float *ap);
void pack_b(int nr, int tb, const float *B, int64_t ldb, int64_t p0, int64_t j0, int64_t kc, int64_t nc, float *bp);

/* bf16 rounding (bf16.c's order; kernels/amx.c packs by the same rule) */
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
/* x, or a signed 0 when x is denormal */
static inline float ftz(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  memcpy(&x, &u, 4);
  return x;
}
/* fma(a, b, c) flushed as x86 flushes it under flush-to-zero (for a, b, c normal or 0): a result whose magnitude,
 * rounded to 24 bits with an unbounded exponent, is below 2^-126 is a signed 0. That differs from flushing the IEEE
 * result when the exact value lies in [2^-126 - 2^-150, 2^-126 - 2^-151): IEEE rounds it up to 2^-126 (normal, kept),
 * x86 to 2^-126 - 2^-150 (tiny, flushed). So where fmaf gives 2^-126 the exact value decides: a*b is exact in double
 * (48 bits) and s + t = a*b + c exactly (TwoSum). */
static inline float fma_ftz(float a, float b, float c) {
  float r = fmaf(a, b, c);
  uint32_t u;
  memcpy(&u, &r, 4);
  if ((u & 0x7fffffffu) == 0x00800000u) {
    const double p = (double)a * (double)b, cd = (double)c, s = p + cd, bb = s - p;
    const double t = (p - (s - bb)) + (cd - bb), lim = 0x1p-126 - 0x1p-151, as = fabs(s);
    if (as < lim || (as == lim && (s > 0 ? t < 0 : t > 0))) u &= 0x80000000u;
  } else if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  memcpy(&r, &u, 4);
  return r;
}
static inline uint32_t bf16_bits(float x) {
  uint32_t u;
  x = bf16_round(x);
  memcpy(&u, &x, 4);
  return u >> 16;
}

#pragma GCC visibility pop
#endif
