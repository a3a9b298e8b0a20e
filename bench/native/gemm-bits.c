/*
 * One hash of the bits of 4,734 products on each kernel this CPU runs (every transpose, alpha, beta 0, 1, 0.7 and
 * -1.5, padded leading dimensions, odd shapes 1-577 and the model's, attention's [T,T] blocks with lda 1024-2048):
 *
 *   gemm-bits GEMM.so      prints "<isa name> products 4734 hash <16 hex digits>" per kernel, then
 *                          "bf16-<name> products 4008 hash <16 hex digits>" per bf16 kernel (bf16_hashes)
 *
 * Every kernel gives the same hash (one order of summation), and a change to the GEMM (native/gemm/) that keeps the
 * bits keeps it.
 * Built and run by gemm-ab.sh, which compares two builds.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*sgemm_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                        float, float *, int64_t);
typedef int (*bf16_fn)(int, int, int, int, int64_t, int64_t, int64_t, const float *, int64_t, const float *, int64_t,
                       float, float *, int64_t);
static sgemm_fn sg;
static uint64_t h;
static uint32_t st;

static void mix(const void *p, size_t n) { /* FNV-1a */
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
}
static float rnd(void) {
  st = st * 1664525u + 1013904223u;
  return (float)(st >> 8) / 16777216.0f - 0.5f;
}

/* One product on fresh operands (seeded by `seed`, `off` floats past alignment), its C mixed into the hash. */
static void product(int isa, int ta, int tb, long M, long N, long K, float alpha, float beta, long lda, long ldb,
                    long ldc, int off, uint32_t seed) {
  const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
  float *A = malloc(4 * (na + 8)), *B = malloc(4 * (nb + 8)), *C = malloc(4 * (nc + 8));
  st = seed;
  for (size_t i = 0; i < na; i++) A[i + off] = rnd();
  for (size_t i = 0; i < nb; i++) B[i + off] = rnd();
  for (size_t i = 0; i < nc; i++) C[i + off] = rnd();
  sg(isa, ta, tb, M, N, K, alpha, A + off, lda, B + off, ldb, beta, C + off, ldc);
  for (long i = 0; i < M; i++) mix(C + off + i * ldc, 4 * (size_t)N);
  free(A), free(B), free(C);
}

/* bf16 (gemm_bf16, when the build has it): the emulation on each fp32 kernel this CPU runs ("bf16-<isa>", hw 0), the
 * AMX kernel where the CPU and OS have it ("bf16-amx", hw 1) and the VDPBF16PS kernel where the CPU has AVX512_BF16
 * and it passed its start-up self-check ("bf16-avx512bf16", hw 2, when the build has it), one hash each, all equal
 * (TDPBF16PS's order on every one): 4,008 products, a third of the odd shapes 1-577 (K across the chunks of 32 and the K blocks), every
 * transpose, beta 0, 1 and 0.7, padded leading dimensions, one A element in 97 denormal (read as 0). */
static void bf16_hashes(void *lib, int (*supported)(int), const char *(*name)(int)) {
  const bf16_fn bf = (bf16_fn)dlsym(lib, "gemm_bf16");
  int (*hw_ok)(void) = (int (*)(void))dlsym(lib, "gemm_bf16_hw_supported");
  int (*dp_ok)(void) = (int (*)(void))dlsym(lib, "gemm_bf16_dp_supported"); /* NULL before the VDPBF16PS kernel */
  if (!bf || !hw_ok) return;
  static const int dims[] = {1, 7, 16, 31, 33, 64, 65, 97, 192, 577};
  const int nd = sizeof dims / sizeof *dims;
  for (int run = 0; run < 5; run++) {
    /* 0-2: the emulation on that fp32 kernel; 3: the AMX kernel (GEMM_BF16_AMX), 4: the VDPBF16PS one (GEMM_BF16_DP) */
    const int isa = run < 3 ? run : 3, hw = run < 3 ? 0 : run - 2;
    if (hw == 0 ? !supported(isa) : hw == 1 ? !hw_ok() : !dp_ok || !dp_ok()) continue;
    h = 1469598103934665603ull;
    long count = 0;
    for (int i = 0; i < nd * nd * nd; i++) {
      if ((i * 7919) % 3) continue;
      const long M = dims[i % nd], N = dims[(i / nd) % nd], K = dims[i / nd / nd];
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
          for (int v = 0; v < 3; v++, count++) {
            const long pad = v == 2 ? 3 : 0, lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            const float beta = v == 0 ? 0.0f : v == 1 ? 1.0f : 0.7f;
            const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
            float *A = malloc(4 * na + 64), *B = malloc(4 * nb + 64), *C = malloc(4 * nc + 64);
            st = (uint32_t)(i * 131 + ta * 7 + tb * 3 + v);
            for (size_t j = 0; j < na; j++) A[j] = rnd() * (j % 97 == 0 ? 1e-38f : 1.0f);
            for (size_t j = 0; j < nb; j++) B[j] = rnd();
            for (size_t j = 0; j < nc; j++) C[j] = rnd();
            bf(isa, hw, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
            for (long r = 0; r < M; r++) mix(C + r * ldc, 4 * (size_t)N);
            free(A), free(B), free(C);
          }
    }
    char label[32];
    snprintf(label, sizeof label, "bf16-%s", hw == 1 ? "amx" : hw == 2 ? "avx512bf16" : name(isa));
    printf("%-8s products %ld hash %016llx\n", label, count, (unsigned long long)h);
  }
}

int main(int argc, char **argv) {
  void *lib = argc == 2 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
  if (!lib) {
    fprintf(stderr, "usage: %s GEMM.so (%s)\n", argv[0], argc == 2 ? dlerror() : "no library");
    return 2;
  }
  sg = (sgemm_fn)dlsym(lib, "gemm_sgemm");
  int (*supported)(int) = (int (*)(int))dlsym(lib, "gemm_isa_supported");
  const char *(*name)(int) = (const char *(*)(int))dlsym(lib, "gemm_isa_name");
  static const int dims[] = {1, 6, 7, 16, 17, 63, 65, 96, 145, 192, 257, 577};
  static const int model[][3] = {{256, 576, 576},  {256, 1536, 576},  {256, 576, 1536}, {576, 576, 256},
                                 {1536, 576, 256}, {576, 1536, 1024}, {64, 256, 64},    {64, 64, 256},
                                 {64, 64, 1024},   {341, 1536, 576},  {1024, 576, 576}};
  const int nd = sizeof dims / sizeof *dims, nm = sizeof model / sizeof *model;
  for (int isa = 0; isa < 3; isa++) {
    if (!supported(isa)) continue;
    h = 1469598103934665603ull;
    long count = 0;
    for (int i = 0; i < nd * nd * nd + nm; i++) {
      long M, N, K;
      if (i < nd * nd * nd) {
        if ((i * 7919) % 5) continue; /* a fifth of the odd shapes */
        M = dims[i % nd], N = dims[(i / nd) % nd], K = dims[i / nd / nd];
      } else M = model[i - nd * nd * nd][0], N = model[i - nd * nd * nd][1], K = model[i - nd * nd * nd][2];
      const int idx = i < nd * nd * nd ? i : i - nd * nd * nd;
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
          for (int v = 0; v < 3; v++, count++) {
            const long pad = v == 2 ? 3 : 0;
            product(isa, ta, tb, M, N, K, v == 1 ? 0.5f : 1.0f,
                    v == 0   ? 0.0f
                    : v == 1 ? 1.0f
                             : 0.7f,
                    (ta ? M : K) + pad, (tb ? K : N) + pad, N + pad, v, (uint32_t)(idx * 131 + ta * 7 + tb * 3 + v));
          }
    }
    /* attention's blocks: A = att^T from [T,T] rows (lda 1024-2048) or A stored [M,K] */
    static const int ms[] = {7, 16, 58, 61, 64}, ks[] = {64, 255, 256, 300, 1024, 1100}, ls[] = {1024, 1040, 2048};
    for (int a = 0; a < 5; a++)
      for (int b = 0; b < 6; b++)
        for (int c = 0; c < 3; c++)
          for (int v = 0; v < 5; v++, count++) {
            const int ta = v != 2;
            const long K = ks[b];
            product(isa, ta, 0, ms[a], (a & 1) ? 64 : 37, K, 1.0f,
                    v == 0   ? 1.0f
                    : v == 1 ? 0.0f
                    : v == 3 ? -1.5f
                             : 0.7f,
                    ta ? ls[c] : K + 5, 576, 192, 0, (uint32_t)(a * 1000 + b * 100 + c * 10 + v));
          }
    printf("%-8s products %ld hash %016llx\n", name(isa), count, (unsigned long long)h);
  }
  bf16_hashes(lib, supported, name);
  return 0;
}
