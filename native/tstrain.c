/*
 * tstrain's native CPU engine: the Kernels interface of src/model/kernels.ts in C, as a Node-API addon.
 *
 * The engine reads as llm.c does, over a few files (native/README.md): the matrix-product dispatch and the
 * deterministic helpers (engine.h), then the kernels as plain C functions, one forward and one backward per op side
 * by side (the maths only, on raw pointers and sizes: ops/rows.c, ops/attention.c), then the Node-API layer:
 * argument checks (napi.h, napi.c), engine setup (setup.c), and here a thin wrapper per kernel and the table of
 * exported names at the end.
 *
 * Matrix products run on the built-in GEMM (native/gemm/: one summation order on every CPU) or on a BLAS
 * (cblas_sgemm) found at RUN time with dlopen/dlsym (loadBlas): the addon has no link-time dependency on any
 * BLAS, so it builds where OpenBLAS is not installed. The other kernels are plain C that the compiler vectorises
 * (-O3, -ffp-contract=off, never -ffast-math: every kernel is deterministic, bit-identical run to run; sums
 * that need it run in double, in a fixed order).
 *
 * Every Float32Array / Int32Array is read in place through napi_get_typedarray_info (ArrayBuffer,
 * SharedArrayBuffer, subarray views alike): no copies. Each wrapper checks the arrays' types and that they are
 * long enough for the shapes it was given, and throws a RangeError/TypeError before any kernel touches memory.
 */
#include "napi.h"
#include "peak.h"

#include <stdio.h>

/* ------------------------------------------------------------------ the kernels' wrappers */
/* gemm(isa, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc[, calls]): the built-in GEMM on one
 * kernel with leading dimensions, whatever this thread's setGemm says (tests and the bench compare kernels with it).
 * With calls (the bench), the product runs that many times back to back and the call returns this thread's CPU
 * seconds for them: the time the products ran, as the trainer calls them from C, without the call from JS.
 * gemmBf16(...): the same on bf16 operands (gemm.h: gemm_bf16), alpha 1; isa "amx" is the AMX-BF16 kernel,
 * the others the emulation on that kernel. */
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
  const int hw = bf16 && strcmp(isa, "amx") == 0;
  const gemm_isa want = hw || strcmp(isa, "avx512") == 0 ? GEMM_ISA_AVX512
                        : strcmp(isa, "avx2") == 0       ? GEMM_ISA_AVX2
                        : strcmp(isa, "portable") == 0   ? GEMM_ISA_PORTABLE
                                                         : GEMM_ISA_AUTO;
  if (want == GEMM_ISA_AUTO && strcmp(isa, "auto") != 0) {
    throw_range(
        env, fn,
        bf16 ? "isa must be auto, amx, avx512, avx2 or portable" : "isa must be auto, avx512, avx2 or portable");
    return NULL;
  }
  if (!gemm_isa_supported(want == GEMM_ISA_AUTO ? gemm_best_isa() : want) || (hw && !gemm_bf16_hw_supported())) {
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

/* matmul(transA, transB, M, N, K, alpha, A, B, beta, C) */
static napi_value Matmul(napi_env env, napi_callback_info info) {
  static const char fn[] = "matmul";
  ARGS(10);
  NEED_BLAS();
  BOOL(0, transA);
  BOOL(1, transB);
  DIM(2, M);
  DIM(3, N);
  DIM(4, K);
  NUM(5, alpha);
  float *A, *Bm, *C;
  F32(6, A, M * K, "A");
  F32(7, Bm, K * N, "B");
  NUM(8, beta);
  F32(9, C, M * N, "C");
  if (gemm_bf16_mode && alpha != 1.0 && K > 0) {
    throw_range(env, fn, "bf16 products take alpha 1");
    return NULL;
  }
  if (matmul(transA, transB, M, N, K, (float)alpha, A, Bm, (float)beta, C)) GEMM_OOM();
  return NULL;
}

/* A Float32Array of any length (an embedding table, whose row count the ids are checked against); 0 if not. */
static int get_table(napi_env env, napi_value v, float **data, size_t *len, const char *fn, const char *name) {
  bool is = false;
  napi_typedarray_type t;
  void *d = NULL;
  if (napi_is_typedarray(env, v, &is) != napi_ok || !is ||
      napi_get_typedarray_info(env, v, &t, len, &d, NULL, NULL) != napi_ok || t != napi_float32_array) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a Float32Array", fn, name);
    napi_throw_type_error(env, NULL, msg);
    return 0;
  }
  *data = (float *)d;
  return 1;
}

/* bf16Weights(params): the process's weights (gemm.h: gemm_bf16_weights): in bf16 the AMX kernel keeps each product's
 * weight operand packed until bf16WeightsChanged(), which a rank calls after every update of them. */
static napi_value Bf16Weights(napi_env env, napi_callback_info info) {
  static const char fn[] = "bf16Weights";
  ARGS(1);
  float *P;
  size_t n = 0;
  if (!get_table(env, argv[0], &P, &n, fn, "params")) return NULL;
  gemm_bf16_weights(P, (int64_t)n);
  return NULL;
}
static napi_value Bf16WeightsChanged(napi_env env, napi_callback_info info) {
  (void)env, (void)info;
  gemm_bf16_weights_changed();
  return NULL;
}
/* bf16WeightsPrepack(part, parts): remakes this thread's share of the stale weight copies
 * (gemm_bf16_weights_prepack). */
static napi_value Bf16WeightsPrepack(napi_env env, napi_callback_info info) {
  static const char fn[] = "bf16WeightsPrepack";
  ARGS(2);
  DIM(0, part);
  DIM(1, parts);
  gemm_bf16_weights_prepack((int)part, (int)parts);
  return NULL;
}

static int ids_in_rows(napi_env env, const int32_t *ids, int64_t N, int64_t V, const char *fn) {
  for (int64_t n = 0; n < N; n++)
    if (ids[n] < 0 || ids[n] >= V) return throw_range(env, fn, "an id is outside the embedding's rows");
  return 1;
}

/* embeddingForward(out, ids, E, N, D) */
static napi_value EmbeddingForward(napi_env env, napi_callback_info info) {
  static const char fn[] = "embeddingForward";
  ARGS(5);
  DIM(3, N);
  DIM(4, D);
  float *out;
  int32_t *ids;
  F32(0, out, N * D, "out");
  I32(1, ids, N, "ids");
  size_t elen = 0;
  float *E;
  if (!get_table(env, argv[2], &E, &elen, fn, "E")) return NULL;
  if (!ids_in_rows(env, ids, N, D > 0 ? (int64_t)elen / D : 0, fn)) return NULL;
  embedding_forward(out, ids, E, N, D);
  return NULL;
}

/* embeddingBackward(dE, ids, dout, N, D): dE[ids[n]] += dout[n] */
static napi_value EmbeddingBackward(napi_env env, napi_callback_info info) {
  static const char fn[] = "embeddingBackward";
  ARGS(5);
  DIM(3, N);
  DIM(4, D);
  size_t elen = 0;
  float *dE;
  if (!get_table(env, argv[0], &dE, &elen, fn, "dE")) return NULL;
  float *dout;
  int32_t *ids;
  I32(1, ids, N, "ids");
  F32(2, dout, N * D, "dout");
  if (!ids_in_rows(env, ids, N, D > 0 ? (int64_t)elen / D : 0, fn)) return NULL;
  embedding_backward(dE, ids, dout, N, D);
  return NULL;
}

/* rmsnormForward(out, rstd, x, w, N, D, eps) */
static napi_value RmsnormForward(napi_env env, napi_callback_info info) {
  static const char fn[] = "rmsnormForward";
  ARGS(7);
  DIM(4, N);
  DIM(5, D);
  NUM(6, eps);
  float *out, *rstd, *x, *w;
  F32(0, out, N * D, "out");
  F32(1, rstd, N, "rstd");
  F32(2, x, N * D, "x");
  F32(3, w, D, "w");
  rmsnorm_forward(out, rstd, x, w, N, D, eps);
  return NULL;
}

/* rmsnormBackward(dx, dw, dout, x, w, rstd, N, D) */
static napi_value RmsnormBackward(napi_env env, napi_callback_info info) {
  static const char fn[] = "rmsnormBackward";
  ARGS(8);
  DIM(6, N);
  DIM(7, D);
  float *dx, *dw, *dout, *x, *w, *rstd;
  F32(0, dx, N * D, "dx");
  F32(1, dw, D, "dw");
  F32(2, dout, N * D, "dout");
  F32(3, x, N * D, "x");
  F32(4, w, D, "w");
  F32(5, rstd, N, "rstd");
  rmsnorm_backward(dx, dw, dout, x, w, rstd, N, D);
  return NULL;
}

/* ropeForward / ropeBackward(x, cos, sin, B, T, nh, E): in place */
static napi_value rope(napi_env env, napi_callback_info info, int backward) {
  const char *fn = backward ? "ropeBackward" : "ropeForward";
  ARGS(7);
  DIM(3, B);
  DIM(4, T);
  DIM(5, nh);
  DIM(6, E);
  if (E % 2) {
    throw_range(env, fn, "E (head_dim) must be even");
    return NULL;
  }
  float *x, *cs, *sn;
  F32(0, x, B * T * nh * E, "x");
  F32(1, cs, T * (E / 2), "cos");
  F32(2, sn, T * (E / 2), "sin");
  if (backward) rope_backward(x, cs, sn, B, T, nh, E);
  else rope_forward(x, cs, sn, B, T, nh, E);
  return NULL;
}
static napi_value RopeForward(napi_env env, napi_callback_info info) { return rope(env, info, 0); }
static napi_value RopeBackward(napi_env env, napi_callback_info info) { return rope(env, info, 1); }

/* attentionForward(out, lse, q, k, v, B, T, H, K, E); attentionForwardUnfused(out, att, ...), att [B, H, T, T] */
static napi_value attention_fwd(napi_env env, napi_callback_info info, int unfused) {
  const char *fn = unfused ? "attentionForwardUnfused" : "attentionForward";
  ARGS(10);
  NEED_BLAS();
  DIM(5, B);
  DIM(6, T);
  DIM(7, H);
  DIM(8, K);
  DIM(9, E);
  if (K == 0 || H % K) {
    throw_range(env, fn, "H must be a multiple of K (GQA)");
    return NULL;
  }
  float *out, *saved, *q, *k, *v;
  F32(0, out, B * T * H * E, "out");
  F32(1, saved, unfused ? B * H * T * T : B * H * T, unfused ? "att" : "lse");
  F32(2, q, B * T * H * E, "q");
  F32(3, k, B * T * K * E, "k");
  F32(4, v, B * T * K * E, "v");
  if (unfused ? attention_forward_unfused(out, saved, q, k, v, B, T, H, K, E)
              : attention_forward(out, saved, q, k, v, B, T, H, K, E))
    GEMM_OOM();
  return NULL;
}
static napi_value AttentionForward(napi_env env, napi_callback_info info) { return attention_fwd(env, info, 0); }
static napi_value AttentionForwardUnfused(napi_env env, napi_callback_info info) { return attention_fwd(env, info, 1); }

/* attentionBackward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, E) */
static napi_value AttentionBackward(napi_env env, napi_callback_info info) {
  static const char fn[] = "attentionBackward";
  ARGS(14);
  NEED_BLAS();
  DIM(9, B);
  DIM(10, T);
  DIM(11, H);
  DIM(12, K);
  DIM(13, E);
  if (K == 0 || H % K) {
    throw_range(env, fn, "H must be a multiple of K (GQA)");
    return NULL;
  }
  float *dq, *dk, *dv, *dout, *q, *k, *v, *out, *lse;
  F32(0, dq, B * T * H * E, "dq");
  F32(1, dk, B * T * K * E, "dk");
  F32(2, dv, B * T * K * E, "dv");
  F32(3, dout, B * T * H * E, "dout");
  F32(4, q, B * T * H * E, "q");
  F32(5, k, B * T * K * E, "k");
  F32(6, v, B * T * K * E, "v");
  F32(7, out, B * T * H * E, "out");
  F32(8, lse, B * H * T, "lse");
  if (attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, E)) GEMM_OOM();
  return NULL;
}

/* attentionBackwardUnfused(dq, dk, dv, dout, q, k, v, att, B, T, H, K, E) */
static napi_value AttentionBackwardUnfused(napi_env env, napi_callback_info info) {
  static const char fn[] = "attentionBackwardUnfused";
  ARGS(13);
  NEED_BLAS();
  DIM(8, B);
  DIM(9, T);
  DIM(10, H);
  DIM(11, K);
  DIM(12, E);
  if (K == 0 || H % K) {
    throw_range(env, fn, "H must be a multiple of K (GQA)");
    return NULL;
  }
  float *dq, *dk, *dv, *dout, *q, *k, *v, *att;
  F32(0, dq, B * T * H * E, "dq");
  F32(1, dk, B * T * K * E, "dk");
  F32(2, dv, B * T * K * E, "dv");
  F32(3, dout, B * T * H * E, "dout");
  F32(4, q, B * T * H * E, "q");
  F32(5, k, B * T * K * E, "k");
  F32(6, v, B * T * K * E, "v");
  F32(7, att, B * H * T * T, "att");
  if (attention_backward_unfused(dq, dk, dv, dout, q, k, v, att, B, T, H, K, E)) GEMM_OOM();
  return NULL;
}

/* attentionProfile(on): turns this thread's timing of the fused attention's work between its block products on or
 * off and returns the milliseconds (wall) it took since the last call (the bench's split of attention into its
 * products and the rest) */
static napi_value AttentionProfile(napi_env env, napi_callback_info info) {
  static const char fn[] = "attentionProfile";
  ARGS(1);
  BOOL(0, on);
  napi_value v;
  napi_create_double(env, att_rest_ns / 1e6, &v);
  att_rest_ns = 0;
  att_prof = on;
  return v;
}

/* A copy of the row and optimizer kernels by name: "avx512" | "avx2" | "portable", one this CPU runs (vmath and the
 * optimizer kernels' isa argument). Returns 0 after throwing. */
static int isa_copy(napi_env env, const char *fn, const char *isa, gemm_isa *out) {
  const gemm_isa want = strcmp(isa, "avx512") == 0     ? GEMM_ISA_AVX512
                        : strcmp(isa, "avx2") == 0     ? GEMM_ISA_AVX2
                        : strcmp(isa, "portable") == 0 ? GEMM_ISA_PORTABLE
                                                       : GEMM_ISA_AUTO;
  if (want == GEMM_ISA_AUTO) return throw_range(env, fn, "isa must be avx512, avx2 or portable");
  if (!gemm_isa_supported(want)) return throw_range(env, fn, "this CPU does not have that instruction set");
  *out = want;
  return 1;
}

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

/* attentionCachedForward(out, q, kCache, vCache, P, T, H, K, E): T new positions against a cache of P + T */
static napi_value AttentionCachedForward(napi_env env, napi_callback_info info) {
  static const char fn[] = "attentionCachedForward";
  ARGS(9);
  DIM(4, P);
  DIM(5, T);
  DIM(6, H);
  DIM(7, K);
  DIM(8, E);
  if (K == 0 || H % K) {
    throw_range(env, fn, "H must be a multiple of K (GQA)");
    return NULL;
  }
  float *out, *q, *kc, *vc;
  F32(0, out, T * H * E, "out");
  F32(1, q, T * H * E, "q");
  F32(2, kc, (P + T) * K * E, "kCache");
  F32(3, vc, (P + T) * K * E, "vCache");
  if (T == 0 || H == 0 || E == 0) return NULL;
  float *sc = (float *)malloc((size_t)(P + T) * sizeof(float));
  double *acc = (double *)malloc((size_t)E * sizeof(double));
  if (sc && acc) attention_cached(out, q, kc, vc, P, T, H, K, E, sc, acc);
  const int oom = !sc || !acc;
  free(sc);
  free(acc);
  if (oom) throw_error(env, fn, "out of memory");
  return NULL;
}

/* The optional isa argument of the optimizer kernels (argv[i]): a copy's name as for vmath, for the tests that hold
 * every copy to the others; undefined: GEMM_ISA_AUTO, this thread's (setGemm). Returns 0 after throwing. */
static int optim_isa_arg(napi_env env, const char *fn, napi_value v, gemm_isa *out) {
  *out = GEMM_ISA_AUTO;
  napi_valuetype t;
  if (napi_typeof(env, v, &t) != napi_ok || t == napi_undefined) return 1;
  char isa[16] = {0};
  size_t len = 0;
  if (napi_get_value_string_utf8(env, v, isa, sizeof isa, &len) != napi_ok)
    return throw_range(env, fn, "isa must be a string");
  return isa_copy(env, fn, isa, out);
}

/* adamw(params, m, v, g, lo, hi, h, isa): AdamW over [lo, hi) of the four Float32Arrays (SharedArrayBuffer views: the
 * floats are read and written in place), h a Float32Array of the 9 hyperparameters (ops/optim.c) */
static napi_value Adamw(napi_env env, napi_callback_info info) {
  static const char fn[] = "adamw";
  ARGS(8); /* isa: undefined for this thread's */
  gemm_isa isa;
  if (!optim_isa_arg(env, fn, argv[7], &isa)) return NULL;
  DIM(4, lo);
  DIM(5, hi);
  if (hi < lo) {
    throw_range(env, fn, "hi is below lo");
    return NULL;
  }
  float *p, *m, *v, *g, *h;
  F32(0, p, hi, "params");
  F32(1, m, hi, "m");
  F32(2, v, hi, "v");
  F32(3, g, hi, "g");
  F32(6, h, 9, "h");
  adamw_f32(p + lo, m + lo, v + lo, g + lo, hi - lo, h, isa);
  return NULL;
}

/* fold(acc, g, first, isa): acc = g (first) or acc += g over all of g, in float64, then g = 0 (ops/optim.c) */
static napi_value Fold(napi_env env, napi_callback_info info) {
  static const char fn[] = "fold";
  ARGS(4); /* isa: undefined for this thread's */
  BOOL(2, first);
  gemm_isa isa;
  if (!optim_isa_arg(env, fn, argv[3], &isa)) return NULL;
  float *g;
  double *acc;
  size_t n = 0;
  if (napi_get_typedarray_info(env, argv[1], NULL, &n, NULL, NULL, NULL) != napi_ok) n = 0;
  F32(1, g, n, "g");
  if (!get_array(env, argv[0], napi_float64_array, n, (void **)&acc, fn, "acc")) return NULL;
  fold_f32(acc, g, (int64_t)n, first, isa);
  return NULL;
}

/* reduceChunks(slots, grad, invScale, P, sq, c0, c1): reduceChunks64 (ops/optim.c); slots an array of 1 to 64
 * Float64Arrays of at least P elements */
static napi_value ReduceChunks(napi_env env, napi_callback_info info) {
  static const char fn[] = "reduceChunks";
  ARGS(7);
  NUM(2, inv);
  DIM(3, P);
  DIM(5, c0);
  DIM(6, c1);
  uint32_t k = 0;
  bool isArr = false;
  if (napi_is_array(env, argv[0], &isArr) != napi_ok || !isArr || napi_get_array_length(env, argv[0], &k) != napi_ok ||
      k < 1 || k > 64) {
    napi_throw_type_error(env, NULL, "tstrain native reduceChunks: slots must be an array of 1 to 64 Float64Arrays");
    return NULL;
  }
  const int64_t chunks = (P + SQ_CHUNK - 1) / SQ_CHUNK;
  if (c0 > c1 || c1 > chunks) {
    throw_range(env, fn, "the chunk range [c0, c1) is not within the vector's chunks");
    return NULL;
  }
  const double *sl[64];
  for (uint32_t r = 0; r < k; r++) {
    napi_value e;
    CHECK_NAPI(napi_get_element(env, argv[0], r, &e));
    if (!get_array(env, e, napi_float64_array, (size_t)P, (void **)&sl[r], fn, "a slot")) return NULL;
  }
  float *grad;
  double *sq;
  F32(1, grad, P, "grad");
  if (!get_array(env, argv[4], napi_float64_array, (size_t)c1, (void **)&sq, fn, "sq")) return NULL;
  reduce_chunks64(sl, (int)k, grad, inv, P, sq, c0, c1);
  return NULL;
}

/* streamProbe(kind, x, y, z, s): the bench's bandwidth probes over all of x (Float64Arrays): "triad" x = y + s * z,
 * "axpy" x += s * y (ops/optim.c) */
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

/* swigluForward(out, gate, up, n) */
static napi_value SwigluForward(napi_env env, napi_callback_info info) {
  static const char fn[] = "swigluForward";
  ARGS(4);
  DIM(3, n);
  float *out, *g, *u;
  F32(0, out, n, "out");
  F32(1, g, n, "gate");
  F32(2, u, n, "up");
  swiglu_forward(out, g, u, n);
  return NULL;
}

/* swigluBackward(dgate, dup, dout, gate, up, n) */
static napi_value SwigluBackward(napi_env env, napi_callback_info info) {
  static const char fn[] = "swigluBackward";
  ARGS(6);
  DIM(5, n);
  float *dg, *du, *dout, *g, *u;
  F32(0, dg, n, "dgate");
  F32(1, du, n, "dup");
  F32(2, dout, n, "dout");
  F32(3, g, n, "gate");
  F32(4, u, n, "up");
  swiglu_backward(dg, du, dout, g, u, n);
  return NULL;
}

/* crossEntropy(logits, targets, rows, V, gradScale): the summed loss; the logits become gradients when gradScale > 0 */
static napi_value CrossEntropy(napi_env env, napi_callback_info info) {
  static const char fn[] = "crossEntropy";
  ARGS(5);
  DIM(2, rows);
  DIM(3, V);
  NUM(4, gradScale);
  float *lg;
  int32_t *tg;
  F32(0, lg, rows * V, "logits");
  I32(1, tg, rows, "targets");
  if (!(gradScale >= 0) || !isfinite(gradScale)) {
    throw_range(env, fn, "gradScale must be finite and >= 0");
    return NULL;
  }
  for (int64_t r = 0; r < rows; r++)
    if (tg[r] < -1 || tg[r] >= V) {
      throw_range(env, fn, "a target is outside [-1, V)");
      return NULL;
    }
  napi_value ret;
  CHECK_NAPI(napi_create_double(env, cross_entropy(lg, tg, rows, V, gradScale), &ret));
  return ret;
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
      {"simd", NULL, Simd, NULL, NULL, NULL, napi_default, NULL},
      {"setGemm", NULL, SetGemm, NULL, NULL, NULL, napi_default, NULL},
      {"gemmPeak", NULL, GemmPeak, NULL, NULL, NULL, napi_default, NULL},
      {"gemm", NULL, Gemm, NULL, NULL, NULL, napi_default, NULL},
      {"gemmBf16", NULL, GemmBf16, NULL, NULL, NULL, napi_default, NULL},
      {"gemmBf16Hw", NULL, GemmBf16Hw, NULL, NULL, NULL, napi_default, NULL},
      {"matmul", NULL, Matmul, NULL, NULL, NULL, napi_default, NULL},
      {"bf16Weights", NULL, Bf16Weights, NULL, NULL, NULL, napi_default, NULL},
      {"bf16WeightsChanged", NULL, Bf16WeightsChanged, NULL, NULL, NULL, napi_default, NULL},
      {"bf16WeightsPrepack", NULL, Bf16WeightsPrepack, NULL, NULL, NULL, napi_default, NULL},
      {"embeddingForward", NULL, EmbeddingForward, NULL, NULL, NULL, napi_default, NULL},
      {"embeddingBackward", NULL, EmbeddingBackward, NULL, NULL, NULL, napi_default, NULL},
      {"rmsnormForward", NULL, RmsnormForward, NULL, NULL, NULL, napi_default, NULL},
      {"rmsnormBackward", NULL, RmsnormBackward, NULL, NULL, NULL, napi_default, NULL},
      {"ropeForward", NULL, RopeForward, NULL, NULL, NULL, napi_default, NULL},
      {"ropeBackward", NULL, RopeBackward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionForward", NULL, AttentionForward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionBackward", NULL, AttentionBackward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionForwardUnfused", NULL, AttentionForwardUnfused, NULL, NULL, NULL, napi_default, NULL},
      {"attentionBackwardUnfused", NULL, AttentionBackwardUnfused, NULL, NULL, NULL, napi_default, NULL},
      {"attentionCachedForward", NULL, AttentionCachedForward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionProfile", NULL, AttentionProfile, NULL, NULL, NULL, napi_default, NULL},
      {"vmath", NULL, Vmath, NULL, NULL, NULL, napi_default, NULL},
      {"adamw", NULL, Adamw, NULL, NULL, NULL, napi_default, NULL},
      {"fold", NULL, Fold, NULL, NULL, NULL, napi_default, NULL},
      {"reduceChunks", NULL, ReduceChunks, NULL, NULL, NULL, napi_default, NULL},
      {"streamProbe", NULL, StreamProbe, NULL, NULL, NULL, napi_default, NULL},
      {"swigluForward", NULL, SwigluForward, NULL, NULL, NULL, napi_default, NULL},
      {"swigluBackward", NULL, SwigluBackward, NULL, NULL, NULL, napi_default, NULL},
      {"crossEntropy", NULL, CrossEntropy, NULL, NULL, NULL, napi_default, NULL},
  };
  if (napi_define_properties(env, exports, sizeof props / sizeof props[0], props) != napi_ok) return NULL;
  return exports;
}
