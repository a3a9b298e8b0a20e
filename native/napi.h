/*
 * The Node-API layer's shared pieces (napi.c, compiled into both addons): argument checks that throw a TypeError /
 * RangeError naming the kernel and the argument before any kernel touches memory, the macros every wrapper (tstrain.c,
 * setup.c, probes.c) is written with, and the fused attention's wrappers.
 */
#ifndef TSTRAIN_NAPI_H
#define TSTRAIN_NAPI_H
#define NAPI_VERSION 8
#include <node_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

#pragma GCC visibility push(hidden)

#define CHECK_NAPI(call)                                                                                               \
  do {                                                                                                                 \
    if ((call) != napi_ok) {                                                                                           \
      napi_throw_error(env, NULL, "tstrain native: a Node-API call failed (" #call ")");                               \
      return NULL;                                                                                                     \
    }                                                                                                                  \
  } while (0)

#define ARGS(n)                                                                                                        \
  size_t argc = (n);                                                                                                   \
  napi_value argv[(n) > 0 ? (n) : 1];                                                                                  \
  CHECK_NAPI(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));                                                    \
  if (argc < (n)) {                                                                                                    \
    napi_throw_type_error(env, NULL, "tstrain native: too few arguments");                                             \
    return NULL;                                                                                                       \
  }

#define NEED_BLAS()                                                                                                    \
  if (gemm_kind == GEMM_BLAS && !blas_sgemm) {                                                                         \
    throw_error(env, fn, "no BLAS loaded (call loadBlas first)");                                                      \
    return NULL;                                                                                                       \
  }
#define GEMM_OOM()                                                                                                     \
  do {                                                                                                                 \
    throw_error(env, fn, "out of memory for the GEMM's packing buffers");                                              \
    return NULL;                                                                                                       \
  } while (0)

#define F32(i, ptr, need, name)                                                                                        \
  if (!get_array(env, argv[i], napi_float32_array, (size_t)(need), (void **)&(ptr), fn, name)) return NULL
#define I32(i, ptr, need, name)                                                                                        \
  if (!get_array(env, argv[i], napi_int32_array, (size_t)(need), (void **)&(ptr), fn, name)) return NULL
#define DIM(i, var)                                                                                                    \
  int64_t var;                                                                                                         \
  if (!get_dim(env, argv[i], &var, fn, #var)) return NULL
#define NUM(i, var)                                                                                                    \
  double var;                                                                                                          \
  if (!get_num(env, argv[i], &var, fn, #var)) return NULL
#define BOOL(i, var)                                                                                                   \
  bool var;                                                                                                            \
  if (!get_bool(env, argv[i], &var, fn, #var)) return NULL

/* Each throws (a RangeError, an Error) "tstrain native <fn>: <what>" and returns 0. In every wrapper `fn` names the
 * kernel for the error messages (static const char fn[] = "...";). */
int throw_range(napi_env env, const char *fn, const char *what);
int throw_error(napi_env env, const char *fn, const char *what);
/* A typed array of the given type with at least `need` elements; returns 0 (and throws) otherwise. */
int get_array(napi_env env, napi_value v, napi_typedarray_type want, size_t need, void **data, const char *fn,
              const char *name);
/* A whole number in [0, 2^31): a dimension. */
int get_dim(napi_env env, napi_value v, int64_t *out, const char *fn, const char *name);
int get_num(napi_env env, napi_value v, double *out, const char *fn, const char *name);
int get_bool(napi_env env, napi_value v, bool *out, const char *fn, const char *name);
/* obj.key = s; returns obj */
napi_value set_str(napi_env env, napi_value obj, const char *key, const char *s);

/* A copy of the row and optimizer kernels by name: "avx512" | "avx2" | "portable", one this CPU runs. Returns 0 after
 * throwing. */
int isa_copy(napi_env env, const char *fn, const char *isa, gemm_isa *out);

/* napi.c: the attention wrappers' checks around a kernel of attention_forward's / attention_backward's signature
 * (the engine's in tstrain.c, or the timed copy in probes.c); fn names it in the errors */
typedef int (*attention_forward_fn)(float *out, float *lse, const float *q, const float *k, const float *v, int64_t B,
                                    int64_t T, int64_t H, int64_t K, int64_t E);
typedef int (*attention_backward_fn)(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                     const float *v, const float *out, const float *lse, int64_t B, int64_t T,
                                     int64_t H, int64_t K, int64_t E);
napi_value attention_forward_call(napi_env env, napi_callback_info info, const char *fn, attention_forward_fn kernel);
napi_value attention_backward_call(napi_env env, napi_callback_info info, const char *fn, attention_backward_fn kernel);

/* setup.c: loadBlas, simd, setGemm (both addons register loadBlas and setGemm: each has its own dispatch state) */
napi_value LoadBlas(napi_env env, napi_callback_info info);
napi_value Simd(napi_env env, napi_callback_info info);
napi_value SetGemm(napi_env env, napi_callback_info info);

#pragma GCC visibility pop
#endif
