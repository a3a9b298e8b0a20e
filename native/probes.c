/*
 * The second addon, tstrain_probes.node: what the tests and the bench call besides the engine's kernels, kept out of
 * the production addon (tstrain_native.node, tstrain.c), which neither calls nor exports anything here. It is built
 * from this file, peak.c and its own copy of what they run on (the GEMM, the row kernels, napi.c, setup.c: the list
 * is binding.gyp's), so it keeps its own dispatch state: its setGemm chooses the GEMM its timed attention runs on.
 * bench/native-probes.ts loads it.
 *
 * - gemm / gemmBf16 / gemmBf16Hw: the built-in GEMM on one kernel by name, whatever this thread's setGemm says (the
 *   tests compare the kernels with it; the bench times products, bench/gemm-shapes.ts); bf16Weights: the weights
 *   whose packed copies gemmBf16 keeps, as a rank registers them;
 * - gemmPeak: the core's FMA / TDPBF16PS / VDPBF16PS peak (peak.c), against which the bench reads the GEMM's speed;
 * - vmath: the row kernels' exp and log on one instruction set's copy (test/model.vmath.test.ts);
 * - streamProbe: the bench's bandwidth probes (bench/optim.ts);
 * - attentionForwardProfiled / attentionBackwardProfiled / attentionProfile: a second copy of the fused attention
 *   (ops/attention-fused.h, the same operations, the same bits) that times its work between the block products, for
 *   the bench's split of a step into products and the rest (bench/kernel-profile.ts);
 * - setGemm / loadBlas (setup.c): this addon's own GEMM choice for the timed attention.
 */
#include "napi.h"
#include "peak.h"

#include <time.h>

/* ------------------------------------------------------------------ the GEMM on one kernel */
/* gemm(isa, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc[, calls]): the built-in GEMM on one
 * kernel with leading dimensions, whatever this thread's setGemm says (tests and the bench compare kernels with it).
 * With calls (the bench), the product runs that many times back to back and the call returns this thread's CPU
 * seconds for them: the time the products ran, as the trainer calls them from C, without the call from JS.
 * gemmBf16(...): the same on bf16 operands (gemm.h: gemm_bf16), alpha 1; isa "amx" is the AMX-BF16 kernel, "avx512bf16"
 * the VDPBF16PS one, the others the emulation on that kernel. */
static napi_value gemm_call(napi_env env, napi_callback_info info, int bf16) {
  const char *fn = bf16 ? "gemmBf16" : "gemm";
  size_t argc = 15;
  napi_value argv[15];
  CHECK_NAPI(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 14) {
    napi_throw_type_error(env, NULL, "tstrain native: too few arguments");
    return NULL;
  }
  double calls = 0;
  if (argc > 14 && (napi_get_value_double(env, argv[14], &calls) != napi_ok || !(calls >= 1 && calls <= 1e6))) {
    throw_range(env, fn, "calls must be a number from 1 to 1e6");
    return NULL;
  }
  char isa[32] = {0};
  size_t len = 0;
  if (napi_get_value_string_utf8(env, argv[0], isa, sizeof isa, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "tstrain native gemm: isa must be a string");
    return NULL;
  }
  const int hw = !bf16                            ? GEMM_BF16_EMULATED
                 : strcmp(isa, "amx") == 0        ? GEMM_BF16_AMX
                 : strcmp(isa, "avx512bf16") == 0 ? GEMM_BF16_DP
                                                  : GEMM_BF16_EMULATED;
  const gemm_isa want = hw || strcmp(isa, "avx512") == 0 ? GEMM_ISA_AVX512
                        : strcmp(isa, "avx2") == 0       ? GEMM_ISA_AVX2
                        : strcmp(isa, "portable") == 0   ? GEMM_ISA_PORTABLE
                                                         : GEMM_ISA_AUTO;
  if (want == GEMM_ISA_AUTO && strcmp(isa, "auto") != 0) {
    throw_range(env, fn,
                bf16 ? "isa must be auto, amx, avx512bf16, avx512, avx2 or portable"
                     : "isa must be auto, avx512, avx2 or portable");
    return NULL;
  }
  if (!gemm_isa_supported(want == GEMM_ISA_AUTO ? gemm_best_isa() : want) ||
      (hw == GEMM_BF16_AMX && !gemm_bf16_hw_supported()) || (hw == GEMM_BF16_DP && !gemm_bf16_dp_supported())) {
    throw_range(env, fn, "this CPU does not have that instruction set");
    return NULL;
  }
  BOOL(1, transA);
  BOOL(2, transB);
  DIM(3, M);
  DIM(4, N);
  DIM(5, K);
  NUM(6, alpha);
  DIM(8, lda);
  DIM(10, ldb);
  DIM(13, ldc);
  NUM(11, beta);
  const int64_t ar = transA ? K : M, ac = transA ? M : K, br = transB ? N : K, bc = transB ? K : N;
  if (lda < ac || ldb < bc || ldc < N || lda < 1 || ldb < 1 || ldc < 1) {
    throw_range(env, fn, "a leading dimension is smaller than its row");
    return NULL;
  }
  float *A, *Bm, *C;
  F32(7, A, ar > 0 ? (ar - 1) * lda + ac : 0, "A");
  F32(9, Bm, br > 0 ? (br - 1) * ldb + bc : 0, "B");
  F32(12, C, M > 0 ? (M - 1) * ldc + N : 0, "C");
  if (bf16 && alpha != 1.0) {
    throw_range(env, fn, "alpha must be 1");
    return NULL;
  }
  const double t0 = gemm_thread_seconds();
  for (int64_t i = 0; i < (calls >= 1 ? (int64_t)calls : 1); i++) {
    const int rc = bf16 ? gemm_bf16(want, hw, transA, transB, M, N, K, A, lda, Bm, ldb, (float)beta, C, ldc)
                        : gemm_sgemm(want, transA, transB, M, N, K, (float)alpha, A, lda, Bm, ldb, (float)beta, C, ldc);
    if (rc) GEMM_OOM();
  }
  if (calls < 1) return NULL;
  napi_value v;
  CHECK_NAPI(napi_create_double(env, gemm_thread_seconds() - t0, &v));
  return v;
}
static napi_value Gemm(napi_env env, napi_callback_info info) { return gemm_call(env, info, 0); }
static napi_value GemmBf16(napi_env env, napi_callback_info info) { return gemm_call(env, info, 1); }
/* gemmBf16Hw(): whether this CPU (and OS) has AMX-BF16 (the "amx" kernel of gemmBf16). */
static napi_value GemmBf16Hw(napi_env env, napi_callback_info info) {
  napi_value v;
  CHECK_NAPI(napi_get_boolean(env, gemm_bf16_hw_supported() != 0, &v));
  return v;
}

/* bf16Weights(params): the process's weights, whose products' B the AMX and VDPBF16PS kernels of gemmBf16 keep
 * packed (gemm.h: gemm_bf16_weights; an empty array forgets them) */
static napi_value Bf16Weights(napi_env env, napi_callback_info info) {
  ARGS(1);
  napi_typedarray_type t;
  size_t n = 0;
  void *P = NULL;
  if (napi_get_typedarray_info(env, argv[0], &t, &n, &P, NULL, NULL) != napi_ok || t != napi_float32_array) {
    napi_throw_type_error(env, NULL, "tstrain native bf16Weights: params must be a Float32Array");
    return NULL;
  }
  gemm_bf16_weights((const float *)P, (int64_t)n);
  return NULL;
}

/* ------------------------------------------------------------------ the core's peak */
/* gemmPeak(isa, iters): GFLOP/s of this core's register-only FMA loop for that kernel's instruction set;
 * "amx": the TDPBF16PS loop; "avx512bf16": the VDPBF16PS loop. */
static napi_value GemmPeak(napi_env env, napi_callback_info info) {
  ARGS(2);
  char isa[32] = {0};
  size_t len = 0;
  double iters = 0;
  if (napi_get_value_string_utf8(env, argv[0], isa, sizeof isa, &len) != napi_ok ||
      napi_get_value_double(env, argv[1], &iters) != napi_ok || !(iters >= 1)) {
    napi_throw_type_error(env, NULL, "tstrain native gemmPeak: expects (isa, iters >= 1)");
    return NULL;
  }
  gemm_isa want = strcmp(isa, "avx512") == 0     ? GEMM_ISA_AVX512
                  : strcmp(isa, "avx2") == 0     ? GEMM_ISA_AVX2
                  : strcmp(isa, "portable") == 0 ? GEMM_ISA_PORTABLE
                                                 : GEMM_ISA_AUTO;
  napi_value v;
  CHECK_NAPI(napi_create_double(env,
                                strcmp(isa, "amx") == 0          ? gemm_bf16_peak((int64_t)iters)
                                : strcmp(isa, "avx512bf16") == 0 ? gemm_dp_peak((int64_t)iters)
                                                                 : gemm_fma_peak(want, (int64_t)iters),
                                &v));
  return v;
}

/* ------------------------------------------------------------------ the row maths' copies */
/* vmath(fn, isa, x, out): out = exp(x) (fn "exp", Float32Arrays) or log(x) (fn "log", Float64Arrays) on the copy of
 * the row kernels' maths (ops/vmath.h) for isa "avx512" | "avx2" | "portable" (one this CPU runs): the checks
 * that every copy gives the same bits */
static napi_value Vmath(napi_env env, napi_callback_info info) {
  static const char fn[] = "vmath";
  ARGS(4);
  char what[8] = {0}, isa[16] = {0};
  size_t len = 0;
  if (napi_get_value_string_utf8(env, argv[0], what, sizeof what, &len) != napi_ok ||
      napi_get_value_string_utf8(env, argv[1], isa, sizeof isa, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "tstrain native vmath: expects (fn, isa, x, out) with fn and isa strings");
    return NULL;
  }
  const int is_exp = strcmp(what, "exp") == 0;
  if (!is_exp && strcmp(what, "log") != 0) {
    throw_range(env, fn, "fn must be exp or log");
    return NULL;
  }
  gemm_isa want = GEMM_ISA_AUTO;
  if (!isa_copy(env, fn, isa, &want)) return NULL;
  void *x, *out;
  size_t n = 0;
  napi_typedarray_type ty;
  napi_value ab;
  size_t off;
  if (napi_get_typedarray_info(env, argv[2], &ty, &n, &x, &ab, &off) != napi_ok ||
      ty != (is_exp ? napi_float32_array : napi_float64_array)) {
    napi_throw_type_error(env, NULL,
                          is_exp ? "tstrain native vmath: x must be a Float32Array for exp"
                                 : "tstrain native vmath: x must be a Float64Array for log");
    return NULL;
  }
  if (!get_array(env, argv[3], is_exp ? napi_float32_array : napi_float64_array, n, &out, fn, "out")) return NULL;
  if (is_exp) vmath_exp(want, (float *)out, (const float *)x, (int64_t)n);
  else vmath_log(want, (double *)out, (const double *)x, (int64_t)n);
  return NULL;
}

/* ------------------------------------------------------------------ the bench's bandwidth probes */
/* x = y + s * z (STREAM's triad: 24 bytes an element counted, the store's line read first not) and x += s * y
 * (in place: 24 bytes, every one moved), over [0, n) */
KERNEL_CLONES static void stream_triad(double *restrict x, const double *restrict y, const double *restrict z, double s,
                                       int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = y[i] + s * z[i];
}

KERNEL_CLONES static void stream_axpy(double *restrict x, const double *restrict y, double s, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] += s * y[i];
}

/* streamProbe(kind, x, y, z, s): the bench's bandwidth probes over all of x (Float64Arrays): "triad" x = y + s * z,
 * "axpy" x += s * y */
static napi_value StreamProbe(napi_env env, napi_callback_info info) {
  static const char fn[] = "streamProbe";
  ARGS(5);
  char kind[8] = {0};
  size_t kl = 0;
  if (napi_get_value_string_utf8(env, argv[0], kind, sizeof kind, &kl) != napi_ok ||
      (strcmp(kind, "triad") != 0 && strcmp(kind, "axpy") != 0)) {
    napi_throw_type_error(env, NULL, "tstrain native streamProbe: kind must be \"triad\" or \"axpy\"");
    return NULL;
  }
  NUM(4, s);
  size_t n = 0;
  if (napi_get_typedarray_info(env, argv[1], NULL, &n, NULL, NULL, NULL) != napi_ok) n = 0;
  double *x, *y, *z;
  if (!get_array(env, argv[1], napi_float64_array, n, (void **)&x, fn, "x")) return NULL;
  if (!get_array(env, argv[2], napi_float64_array, n, (void **)&y, fn, "y")) return NULL;
  if (!get_array(env, argv[3], napi_float64_array, n, (void **)&z, fn, "z")) return NULL;
  if (kind[0] == 't') stream_triad(x, y, z, s, (int64_t)n);
  else stream_axpy(x, y, s, (int64_t)n);
  return NULL;
}

/* ------------------------------------------------------------------ the fused attention, timed */
/* The wall time of the timed copy's work between its block products (transposes, softmax rows, row dots, the
 * finish), added up per thread until attentionProfile reads it, on the vDSO's cheap clock (a CPU-time clock is a
 * system call, ~1 us, at ~100,000 regions a step) */
static __thread double att_rest_ns = 0;
static inline double mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}
#define ATT_FN(name) name##_profiled
#define ATT_REST(stmt)                                                                                                 \
  do {                                                                                                                 \
    const double t0_ = mono_ns();                                                                                      \
    stmt;                                                                                                              \
    att_rest_ns += mono_ns() - t0_;                                                                                    \
  } while (0)
#include "ops/attention-fused.h"

/* attentionForwardProfiled / attentionBackwardProfiled: attentionForward / attentionBackward's arguments, checks
 * and bits, on the timed copy */
static napi_value AttentionForwardProfiled(napi_env env, napi_callback_info info) {
  return attention_forward_call(env, info, "attentionForwardProfiled", attention_forward_profiled);
}
static napi_value AttentionBackwardProfiled(napi_env env, napi_callback_info info) {
  return attention_backward_call(env, info, "attentionBackwardProfiled", attention_backward_profiled);
}

/* attentionProfile(): the milliseconds (wall) this thread's timed copy spent between its block products since the
 * last call */
static napi_value AttentionProfile(napi_env env, napi_callback_info info) {
  (void)info;
  napi_value v;
  CHECK_NAPI(napi_create_double(env, att_rest_ns / 1e6, &v));
  att_rest_ns = 0;
  return v;
}

/* ------------------------------------------------------------------ module */
/* When this thread's Node environment ends (a worker thread exits), its GEMM buffers go with it. */
static void release_thread_buffers(void *arg) {
  (void)arg;
  gemm_thread_release();
}

NAPI_MODULE_INIT() {
  if (napi_add_env_cleanup_hook(env, release_thread_buffers, NULL) != napi_ok) return NULL;
  napi_property_descriptor props[] = {
      {"loadBlas", NULL, LoadBlas, NULL, NULL, NULL, napi_default, NULL},
      {"setGemm", NULL, SetGemm, NULL, NULL, NULL, napi_default, NULL},
      {"gemm", NULL, Gemm, NULL, NULL, NULL, napi_default, NULL},
      {"gemmBf16", NULL, GemmBf16, NULL, NULL, NULL, napi_default, NULL},
      {"gemmBf16Hw", NULL, GemmBf16Hw, NULL, NULL, NULL, napi_default, NULL},
      {"bf16Weights", NULL, Bf16Weights, NULL, NULL, NULL, napi_default, NULL},
      {"gemmPeak", NULL, GemmPeak, NULL, NULL, NULL, napi_default, NULL},
      {"vmath", NULL, Vmath, NULL, NULL, NULL, napi_default, NULL},
      {"streamProbe", NULL, StreamProbe, NULL, NULL, NULL, napi_default, NULL},
      {"attentionForwardProfiled", NULL, AttentionForwardProfiled, NULL, NULL, NULL, napi_default, NULL},
      {"attentionBackwardProfiled", NULL, AttentionBackwardProfiled, NULL, NULL, NULL, napi_default, NULL},
      {"attentionProfile", NULL, AttentionProfile, NULL, NULL, NULL, napi_default, NULL},
  };
  if (napi_define_properties(env, exports, sizeof props / sizeof props[0], props) != napi_ok) return NULL;
  return exports;
}
