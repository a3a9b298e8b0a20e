/*
 * tstrain's native CPU engine: the Kernels interface of src/model/kernels.ts in C, as a Node-API addon.
 *
 * The engine reads as llm.c does, over a few files (native/README.md): the matrix-product dispatch and the
 * deterministic helpers (engine.h), then the kernels as plain C functions, one forward and one backward per op side
 * by side (the maths only, on raw pointers and sizes: ops/rows.c, ops/attention.c, ops/optim.c), then the Node-API
 * layer: argument checks (napi.h, napi.c), engine setup (setup.c), and here a thin wrapper per kernel, in the model's
 * order (embedding, RMSNorm, the linears' products, RoPE, attention, SwiGLU, cross-entropy, then the optimizer's
 * fold, reduce and AdamW), and the table of exported names at the end. What the tests and the bench call besides the
 * kernels (a GEMM kernel by name, the row maths' copies, the core's peak, the bandwidth and attention timing probes)
 * is a second addon's, tstrain_probes (probes.c): the trainer never loads it.
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

#include <stdio.h>

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

/* ------------------------------------------------------------------ embedding */
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

/* ------------------------------------------------------------------ RMSNorm */
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

/* ------------------------------------------------------------------ the linears: matrix products, and in bf16 the weights' packed copies */
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

/* bf16Weights(params): the process's weights (gemm.h: gemm_bf16_weights): in bf16 the AMX and VDPBF16PS kernels
 * keep each product's weight operand packed until bf16WeightsChanged(), which a rank calls after every update of
 * them. */
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

/* ------------------------------------------------------------------ RoPE */
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

/* ------------------------------------------------------------------ attention */
/* attentionForward / attentionBackward: napi.c's checks around ops/attention.c's kernels */
static napi_value AttentionForward(napi_env env, napi_callback_info info) {
  return attention_forward_call(env, info, "attentionForward", attention_forward);
}
static napi_value AttentionBackward(napi_env env, napi_callback_info info) {
  return attention_backward_call(env, info, "attentionBackward", attention_backward);
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

/* ------------------------------------------------------------------ SwiGLU */
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

/* ------------------------------------------------------------------ cross-entropy */
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

/* ------------------------------------------------------------------ the optimizer: a micro-batch's gradient folded in, the ranks' sums reduced, AdamW */
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
      {"embeddingForward", NULL, EmbeddingForward, NULL, NULL, NULL, napi_default, NULL},
      {"embeddingBackward", NULL, EmbeddingBackward, NULL, NULL, NULL, napi_default, NULL},
      {"rmsnormForward", NULL, RmsnormForward, NULL, NULL, NULL, napi_default, NULL},
      {"rmsnormBackward", NULL, RmsnormBackward, NULL, NULL, NULL, napi_default, NULL},
      {"matmul", NULL, Matmul, NULL, NULL, NULL, napi_default, NULL},
      {"bf16Weights", NULL, Bf16Weights, NULL, NULL, NULL, napi_default, NULL},
      {"bf16WeightsChanged", NULL, Bf16WeightsChanged, NULL, NULL, NULL, napi_default, NULL},
      {"bf16WeightsPrepack", NULL, Bf16WeightsPrepack, NULL, NULL, NULL, napi_default, NULL},
      {"ropeForward", NULL, RopeForward, NULL, NULL, NULL, napi_default, NULL},
      {"ropeBackward", NULL, RopeBackward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionForward", NULL, AttentionForward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionBackward", NULL, AttentionBackward, NULL, NULL, NULL, napi_default, NULL},
      {"attentionCachedForward", NULL, AttentionCachedForward, NULL, NULL, NULL, napi_default, NULL},
      {"swigluForward", NULL, SwigluForward, NULL, NULL, NULL, napi_default, NULL},
      {"swigluBackward", NULL, SwigluBackward, NULL, NULL, NULL, napi_default, NULL},
      {"crossEntropy", NULL, CrossEntropy, NULL, NULL, NULL, napi_default, NULL},
      {"fold", NULL, Fold, NULL, NULL, NULL, napi_default, NULL},
      {"reduceChunks", NULL, ReduceChunks, NULL, NULL, NULL, napi_default, NULL},
      {"adamw", NULL, Adamw, NULL, NULL, NULL, napi_default, NULL},
  };
  if (napi_define_properties(env, exports, sizeof props / sizeof props[0], props) != napi_ok) return NULL;
  return exports;
}
