/*
 * The Node-API layer's shared pieces (napi.h), compiled into both addons (binding.gyp): the argument checks, and the
 * fused attention's wrappers, which check the arguments around the kernel they are given: the engine's (tstrain.c)
 * or the bench's timed copy (probes.c).
 */
#include "napi.h"

#include <stdio.h>

int throw_range(napi_env env, const char *fn, const char *what) {
  char msg[300];
  snprintf(msg, sizeof msg, "tstrain native %s: %s", fn, what);
  napi_throw_range_error(env, NULL, msg);
  return 0;
}

/* A typed array of the given type with at least `need` elements; returns 0 (and throws) otherwise. */
int get_array(napi_env env, napi_value v, napi_typedarray_type want, size_t need, void **data, const char *fn,
              const char *name) {
  napi_typedarray_type t; /* napi_get_typedarray_info fails (napi_invalid_arg) on anything but a typed array */
  size_t len = 0;
  if (napi_get_typedarray_info(env, v, &t, &len, data, NULL, NULL) != napi_ok || t != want) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a %s", fn, name,
             want == napi_float32_array   ? "Float32Array"
             : want == napi_float64_array ? "Float64Array"
                                          : "Int32Array");
    napi_throw_type_error(env, NULL, msg);
    return 0;
  }
  if (len < need) {
    char msg[300];
    snprintf(msg, sizeof msg, "tstrain native %s: %s has %zu elements, the shapes need %zu", fn, name, len, need);
    napi_throw_range_error(env, NULL, msg);
    return 0;
  }
  if (need > 0 && *data == NULL) return throw_range(env, fn, "a detached array");
  return 1;
}

/* A whole number in [0, 2^31): a dimension. */
int get_dim(napi_env env, napi_value v, int64_t *out, const char *fn, const char *name) {
  double d;
  if (napi_get_value_double(env, v, &d) != napi_ok || !(d >= 0 && d < 2147483648.0) || d != floor(d)) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a whole number in [0, 2^31)", fn, name);
    napi_throw_range_error(env, NULL, msg);
    return 0;
  }
  *out = (int64_t)d;
  return 1;
}

int get_num(napi_env env, napi_value v, double *out, const char *fn, const char *name) {
  if (napi_get_value_double(env, v, out) != napi_ok) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a number", fn, name);
    napi_throw_type_error(env, NULL, msg);
    return 0;
  }
  return 1;
}

int get_bool(napi_env env, napi_value v, bool *out, const char *fn, const char *name) {
  if (napi_get_value_bool(env, v, out) != napi_ok) {
    char msg[200];
    snprintf(msg, sizeof msg, "tstrain native %s: %s must be a boolean", fn, name);
    napi_throw_type_error(env, NULL, msg);
    return 0;
  }
  return 1;
}

/* In every wrapper `fn` names the kernel for the error messages (static const char fn[] = "...";). */
int throw_error(napi_env env, const char *fn, const char *what) {
  char msg[300];
  snprintf(msg, sizeof msg, "tstrain native %s: %s", fn, what);
  napi_throw_error(env, NULL, msg);
  return 0;
}

napi_value set_str(napi_env env, napi_value obj, const char *key, const char *s) {
  napi_value v;
  napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &v);
  napi_set_named_property(env, obj, key, v);
  return obj;
}

/* A copy of the row and optimizer kernels by name: "avx512" | "avx2" | "portable", one this CPU runs (vmath and the
 * optimizer kernels' isa argument). Returns 0 after throwing. */
int isa_copy(napi_env env, const char *fn, const char *isa, gemm_isa *out) {
  const gemm_isa want = strcmp(isa, "avx512") == 0     ? GEMM_ISA_AVX512
                        : strcmp(isa, "avx2") == 0     ? GEMM_ISA_AVX2
                        : strcmp(isa, "portable") == 0 ? GEMM_ISA_PORTABLE
                                                       : GEMM_ISA_AUTO;
  if (want == GEMM_ISA_AUTO) return throw_range(env, fn, "isa must be avx512, avx2 or portable");
  if (!gemm_isa_supported(want)) return throw_range(env, fn, "this CPU does not have that instruction set");
  *out = want;
  return 1;
}

/* ------------------------------------------------------------------ the fused attention's wrappers */
/* attentionForward(out, lse, q, k, v, B, T, H, K, E) on kernel: attention_forward (ops/attention.c, from tstrain.c),
 * or the timed copy (probes.c) */
napi_value attention_forward_call(napi_env env, napi_callback_info info, const char *fn, attention_forward_fn kernel) {
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
  float *out, *lse, *q, *k, *v;
  F32(0, out, B * T * H * E, "out");
  F32(1, lse, B * H * T, "lse");
  F32(2, q, B * T * H * E, "q");
  F32(3, k, B * T * K * E, "k");
  F32(4, v, B * T * K * E, "v");
  if (kernel(out, lse, q, k, v, B, T, H, K, E)) GEMM_OOM();
  return NULL;
}

/* attentionBackward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, E) on kernel: attention_backward
 * (ops/attention.c, from tstrain.c), or the timed copy (probes.c) */
napi_value attention_backward_call(napi_env env, napi_callback_info info, const char *fn,
                                   attention_backward_fn kernel) {
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
  if (kernel(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, E)) GEMM_OOM();
  return NULL;
}
