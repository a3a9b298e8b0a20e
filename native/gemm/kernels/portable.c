/*
 * The portable micro-kernel (any CPU), P_MR x P_NR (config.h), and its bf16 emulation's twin.
 */
#include "../internal.h"

/* Plain C with fmaf. On x86-64 it is also compiled for FMA-capable CPUs (a clone chosen when the addon loads),
 * where fmaf is one instruction; elsewhere fmaf is libm's, slow but exact. Both compute the same bits. */
#ifdef GEMM_X86
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void ukr_portable(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine,
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

/* The portable kernel with the flushes written out, by x86's rule (fma_ftz; no CPU mode to rely on): one chain from 0
 * over kc. */
void ukr_portable_bf16(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load, int combine,
                       float beta) {
  (void)load, (void)combine, (void)beta;
  for (int r = 0; r < P_MR; r++) {
    float acc[P_NR];
    for (int j = 0; j < P_NR; j++) acc[j] = 0.0f;
    for (int64_t p = 0; p < kc; p++) {
      const float av = a[p * P_MR + r];
      const float *bv = b + p * P_NR;
      for (int j = 0; j < P_NR; j++) acc[j] = fma_ftz(av, bv[j], acc[j]);
    }
    for (int j = 0; j < P_NR; j++) c[r * ldc + j] = acc[j];
  }
}
