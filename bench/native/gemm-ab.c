/*
 * Paired A/B timing of two builds of the GEMM (native/gemm/ and native/peak.c: shared objects exporting gemm.h and
 * peak.h), one thread:
 *
 *   gemm-ab OLD.so NEW.so SPEC...      SPEC = TATB:MxNxK:beta[:lda/ldb/ldc], e.g. NT:256x1536x576:0
 *
 * For each product, OLD and NEW run alternately (the order flipped every sample) on the same operands, each sample
 * timed on this thread's CPU clock, with the core's register-only FMA peak probed before every pair. It prints
 * each build's best fraction of the peak and the median of the pairs' NEW/OLD time ratios: on a shared machine
 * the best-of figures move by a tenth of the peak from one run to the next, the paired median far less.
 * Environment: ISA (0 portable, 1 avx2, 2 avx512; default the widest this CPU runs), N (pairs, 41),
 * COLD=1 (A and B flushed from the caches before each call, as weights and activations arrive in a training
 * step), COLDC=1 (C too), BF16=1 (the bf16 products, gemm_bf16, on the ISA kernel's emulation: against the same
 * FMA peak). Built and run by gemm-ab.sh.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*sgemm_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                        float, float *, int64_t);
typedef double (*seconds_fn)(void);
typedef double (*peak_fn)(int, int64_t);
typedef int (*best_fn)(void);
typedef int (*bf16_fn)(int, int, int, int, int64_t, int64_t, int64_t, const float *, int64_t, const float *, int64_t,
                       float, float *, int64_t);

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void flush(const float *p, size_t n) {
#if defined(__x86_64__)
  for (size_t i = 0; i < n; i += 16) __builtin_ia32_clflush(p + i);
  __builtin_ia32_mfence();
#else
  (void)p, (void)n;
#endif
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s OLD.so NEW.so TATB:MxNxK:beta[:lda/ldb/ldc]...\n", argv[0]);
    return 2;
  }
  sgemm_fn sg[2];
  bf16_fn bg[2];
  seconds_fn secs = NULL;
  peak_fn peak = NULL;
  int isa = -1;
  for (int l = 0; l < 2; l++) {
    void *h = dlopen(argv[1 + l], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      fprintf(stderr, "%s\n", dlerror());
      return 1;
    }
    sg[l] = (sgemm_fn)dlsym(h, "gemm_sgemm");
    bg[l] = (bf16_fn)dlsym(h, "gemm_bf16");
    secs = (seconds_fn)dlsym(h, "gemm_thread_seconds");
    peak = (peak_fn)dlsym(h, "gemm_fma_peak");
    if (isa < 0) isa = ((best_fn)dlsym(h, "gemm_best_isa"))();
  }
  if (getenv("ISA")) isa = atoi(getenv("ISA"));
  const int pairs = getenv("N") ? atoi(getenv("N")) : 41, cold = getenv("COLD") != NULL,
            coldc = getenv("COLDC") != NULL, bf16 = getenv("BF16") != NULL;
  double lsum = 0;
  int nshapes = 0;
  printf("isa %d%s, %d pairs%s%s\n", isa, bf16 ? " bf16 (emulated)" : "", pairs,
         cold ? ", A and B flushed before each call" : "", coldc ? ", C flushed too" : "");
  for (int ai = 3; ai < argc; ai++) {
    char ta, tb;
    long M, N, K, lda = 0, ldb = 0, ldc = 0;
    float beta;
    if (sscanf(argv[ai], "%c%c:%ldx%ldx%ld:%f:%ld/%ld/%ld", &ta, &tb, &M, &N, &K, &beta, &lda, &ldb, &ldc) < 6) {
      fprintf(stderr, "bad product %s (TATB:MxNxK:beta[:lda/ldb/ldc])\n", argv[ai]);
      return 2;
    }
    const int TA = ta == 'T', TB = tb == 'T';
    if (!lda) lda = TA ? M : K;
    if (!ldb) ldb = TB ? K : N;
    if (!ldc) ldc = N;
    const size_t na = (size_t)(TA ? K : M) * lda, nb = (size_t)(TB ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = aligned_alloc(64, 4 * na + 64), *B = aligned_alloc(64, 4 * nb + 64), *C = aligned_alloc(64, 4 * nc + 64);
    for (size_t i = 0; i < na; i++) A[i] = (float)((i * 2654435761u) % 1000) / 1000 - 0.5f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)((i * 40503u) % 1000) / 1000 - 0.5f;
    memset(C, 0, 4 * nc);
    const double flops = 2.0 * M * N * K;
    int reps = cold ? 1 : (int)(2e8 / flops);
    if (reps < 1) reps = 1;
    double *t[2] = {malloc(8 * pairs), malloc(8 * pairs)}, *r = malloc(8 * pairs), bp = 0;
    for (int s = 0; s < pairs; s++) {
      const double p = peak(isa, 300000);
      if (p > bp) bp = p;
      for (int o = 0; o < 2; o++) {
        const int l = (s & 1) ? 1 - o : o;
        if (cold) flush(A, na), flush(B, nb);
        if (coldc) flush(C, nc);
        const double t0 = secs();
        for (int k = 0; k < reps; k++)
          if (bf16) bg[l](isa, 0, TA, TB, M, N, K, A, lda, B, ldb, beta, C, ldc);
          else sg[l](isa, TA, TB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
        t[l][s] = (secs() - t0) / reps;
      }
      r[s] = t[1][s] / t[0][s];
    }
    qsort(r, pairs, 8, cmp);
    qsort(t[0], pairs, 8, cmp);
    qsort(t[1], pairs, 8, cmp);
    printf("%-30s peak %6.1f GFLOP/s  best of peak: old %.3f new %.3f  median new/old time %.3f\n", argv[ai], bp,
           flops / t[0][0] / 1e9 / bp, flops / t[1][0] / 1e9 / bp, r[pairs / 2]);
    lsum += __builtin_log(r[pairs / 2]);
    nshapes++;
    free(A), free(B), free(C), free(t[0]), free(t[1]), free(r);
  }
  printf("geometric mean of the medians, new/old time: %.3f over %d products\n", __builtin_exp(lsum / nshapes),
         nshapes);
  return 0;
}
