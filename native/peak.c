/*
 * The bench's peak probes (peak.h), kept out of the GEMM: the addon exports them as gemmPeak for the bench (bench.ts,
 * gemm-shapes.ts) and bench/native/gemm-ab.c measures each pair of products against them. They use only gemm.h.
 */
#include "peak.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMM_X86 1
#include <immintrin.h>
#endif

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
/* AMX's tile configuration (palette 1: 8 tiles of 16 rows x 64 bytes) */
typedef struct {
  uint8_t palette, start;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) amx_config;

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

/* VDPBF16PS on 24 independent register-only chains (each instruction: 16 lanes x 2 products, 2 flops each): twice
 * its 6-cycle latency at 2 a cycle. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static double peak_dp(int64_t iters, float *out) {
  __m512 x[24];
  const __m512bh m = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), d = (__m512bh)_mm512_set1_epi32(0x33d633d6);
  for (int i = 0; i < 24; i++) x[i] = _mm512_set1_ps((float)i);
  const double t0 = gemm_thread_seconds();
  for (int64_t it = 0; it < iters; it++) {
    _Pragma("GCC unroll 24") for (int i = 0; i < 24; i++) x[i] = _mm512_dpbf16_ps(x[i], m, d);
  }
  const double dt = gemm_thread_seconds() - t0;
  float sink[16];
  for (int i = 1; i < 24; i++) x[0] = _mm512_add_ps(x[0], x[i]);
  _mm512_storeu_ps(sink, x[0]);
  *out = sink[0];
  return dt > 0 ? (double)iters * 24 * 64 / dt / 1e9 : 0;
}
double gemm_dp_peak(int64_t iters) {
  (void)iters;
  volatile float sink = 0;
  float out = 0;
  double g = 0;
#ifdef GEMM_X86
  if (gemm_bf16_dp_supported()) g = peak_dp(iters, &out);
#endif
  sink = out;
  (void)sink;
  return g;
}

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
