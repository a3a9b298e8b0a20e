/*
 * Engine setup, the Node-API calls that choose what the kernels run on: loadBlas (a BLAS found at run time with
 * dlopen), simd (which build of the C kernels runs) and setGemm (this thread's GEMM and precision); and the dispatch
 * state they set (engine.h). Compiled into both addons: the probes' (probes.c) keeps its own state, set by its own
 * setGemm.
 */
#include "napi.h"

#include <dlfcn.h>
#include <stdio.h>

/* ------------------------------------------------------------------ the dispatch state (engine.h) */
pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;
sgemm_fn blas_sgemm = NULL; /* process-wide: every worker thread's instance of the addon shares it */
char blas_path[1024];
char blas_config[512];
int blas_threads = -1;
__thread int gemm_kind = GEMM_BUILTIN;
__thread gemm_isa gemm_kernel = GEMM_ISA_AUTO;
__thread int gemm_bf16_mode = 0;
__thread int gemm_bf16_hw = 0;

/* ------------------------------------------------------------------ engine setup: loadBlas, simd, setGemm */
/* loadBlas(paths: string[]) */
/* Tries each path with dlopen; the first that has cblas_sgemm wins. Returns { ok, path, config, threads, tried }:
 * tried = one "path: reason" per failed candidate. Once loaded, later calls return the loaded library. */
napi_value LoadBlas(napi_env env, napi_callback_info info) {
  ARGS(1);
  uint32_t n = 0;
  bool is_arr = false;
  CHECK_NAPI(napi_is_array(env, argv[0], &is_arr));
  if (!is_arr) {
    napi_throw_type_error(env, NULL, "tstrain native loadBlas: expects an array of library paths");
    return NULL;
  }
  CHECK_NAPI(napi_get_array_length(env, argv[0], &n));
  char tried[8192];
  tried[0] = 0;
  pthread_mutex_lock(&blas_lock);
  for (uint32_t i = 0; i < n && !blas_sgemm; i++) {
    napi_value e;
    char path[1024];
    size_t len = 0;
    if (napi_get_element(env, argv[0], i, &e) != napi_ok ||
        napi_get_value_string_utf8(env, e, path, sizeof path, &len) != napi_ok || len == 0)
      continue;
    /* OpenBLAS sizes its thread pool when it loads: ask for one thread so no idle pool is started (each rank is
     * one thread; openblas_set_num_threads(1) below pins it in any case). The variable is put back afterwards
     * so child processes (the bench's PyTorch) inherit the environment they had. */
    const char *prev = getenv("OPENBLAS_NUM_THREADS");
    char *saved = prev ? strdup(prev) : NULL;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (saved) {
      setenv("OPENBLAS_NUM_THREADS", saved, 1);
      free(saved);
    } else unsetenv("OPENBLAS_NUM_THREADS");
    char reason[1700];
    if (!h) {
      const char *err = dlerror();
      if (err && strncmp(err, path, strlen(path)) == 0) snprintf(reason, sizeof reason, "%s", err);
      else snprintf(reason, sizeof reason, "%s: %s", path, err ? err : "dlopen failed");
    } else {
      sgemm_fn f = (sgemm_fn)dlsym(h, "cblas_sgemm");
      if (!f) {
        snprintf(reason, sizeof reason, "%s: loads but has no cblas_sgemm", path);
        dlclose(h);
      } else {
        set_threads_fn st = (set_threads_fn)dlsym(h, "openblas_set_num_threads");
        get_config_fn gc = (get_config_fn)dlsym(h, "openblas_get_config");
        get_threads_fn gt = (get_threads_fn)dlsym(h, "openblas_get_num_threads");
        if (st) st(1);
        blas_threads = gt ? gt() : -1;
        snprintf(blas_path, sizeof blas_path, "%s", path);
        if (gc) {
          const char *c = gc();
          snprintf(blas_config, sizeof blas_config, "%s", c ? c : "OpenBLAS");
        } else {
          snprintf(blas_config, sizeof blas_config, "a CBLAS without openblas_get_config (threads %s)",
                   st ? "pinned to 1" : "not pinned");
        }
        blas_sgemm = f; /* the handle stays open for the life of the process */
        reason[0] = 0;
      }
    }
    if (reason[0]) {
      size_t l = strlen(tried);
      snprintf(tried + l, sizeof tried - l, "%s%s", l ? "; " : "", reason);
    }
  }
  int ok = blas_sgemm != NULL;
  pthread_mutex_unlock(&blas_lock);
  napi_value obj, b, th;
  CHECK_NAPI(napi_create_object(env, &obj));
  napi_get_boolean(env, ok, &b);
  napi_set_named_property(env, obj, "ok", b);
  set_str(env, obj, "path", ok ? blas_path : "");
  set_str(env, obj, "config", ok ? blas_config : "");
  napi_create_int32(env, blas_threads, &th);
  napi_set_named_property(env, obj, "threads", th);
  set_str(env, obj, "tried", tried);
  return obj;
}

/* Which build of the C kernels this CPU runs (the backend line). */
napi_value Simd(napi_env env, napi_callback_info info) {
  (void)info;
  const char *s =
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
      /* the KERNEL_CLONES target the loader picked (GCC's resolver tests the same levels) */
      __builtin_cpu_supports("x86-64-v4")   ? "AVX-512 (x86-64-v4)"
      : __builtin_cpu_supports("x86-64-v3") ? "AVX2+FMA (x86-64-v3)"
                                            : "SSE2 (x86-64)";
#elif defined(__ARM_NEON) || defined(__aarch64__)
      "NEON";
#else
      "scalar";
#endif
  napi_value v;
  napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &v);
  return v;
}

/* ------------------------------------------------------------------ setGemm(kind, isa, precision) */
/* Chooses this thread's GEMM: kind "builtin" (native/gemm/) with isa "auto" | "avx512" | "avx2" | "portable", or
 * "blas" (the library loadBlas found; isa ignored); precision "fp32" (default) or "bf16" (built-in only: gemm_bf16,
 * isa "amx" the AMX-BF16 kernel, "avx512bf16" the VDPBF16PS one, "auto" the first of those two the CPU has (the
 * VDPBF16PS one only once it passed its self-check), the others the emulation on their fp32 kernel: the same bits).
 * Throws a RangeError for an unknown name, an instruction set this CPU lacks, bf16 on a BLAS, or "blas" before a
 * BLAS is loaded. Returns { kind, isa, detail, best, supported, precision, bf16Check } (bf16Check: why VDPBF16PS
 * is not used, "" where it passed its self-check or the CPU has AMX). */
napi_value SetGemm(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  CHECK_NAPI(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  char kind[32] = {0}, isa[32] = {0}, prec[32] = "fp32";
  size_t len = 0;
  if (argc < 2 || napi_get_value_string_utf8(env, argv[0], kind, sizeof kind, &len) != napi_ok ||
      napi_get_value_string_utf8(env, argv[1], isa, sizeof isa, &len) != napi_ok ||
      (argc > 2 && napi_get_value_string_utf8(env, argv[2], prec, sizeof prec, &len) != napi_ok)) {
    napi_throw_type_error(env, NULL, "tstrain native setGemm: expects two or three strings (kind, isa, precision)");
    return NULL;
  }
  const int bf16 = strcmp(prec, "bf16") == 0;
  if (!bf16 && strcmp(prec, "fp32") != 0) {
    throw_range(env, "setGemm", "precision must be fp32 or bf16");
    return NULL;
  }
  const gemm_isa best = gemm_best_isa();
  int hw = 0;
  if (strcmp(kind, "blas") == 0) {
    if (bf16) {
      throw_range(env, "setGemm", "bf16 runs on the built-in GEMM only");
      return NULL;
    }
    if (!blas_sgemm) {
      throw_range(env, "setGemm", "no BLAS loaded (call loadBlas first)");
      return NULL;
    }
    gemm_kind = GEMM_BLAS;
  } else if (strcmp(kind, "builtin") == 0) {
    gemm_isa want;
    if (strcmp(isa, "auto") == 0) {
      want = best;
      hw = !bf16                      ? GEMM_BF16_EMULATED
           : gemm_bf16_hw_supported() ? GEMM_BF16_AMX
           : gemm_bf16_dp_supported() ? GEMM_BF16_DP
                                      : GEMM_BF16_EMULATED;
    } else if (strcmp(isa, "amx") == 0 && bf16) {
      if (!gemm_bf16_hw_supported()) {
        throw_range(env, "setGemm", "this CPU does not have that instruction set");
        return NULL;
      }
      want = GEMM_ISA_AVX512;
      hw = GEMM_BF16_AMX;
    } else if (strcmp(isa, "avx512bf16") == 0 && bf16) {
      if (!gemm_bf16_dp_supported()) {
        char msg[300];
        snprintf(msg, sizeof msg, "VDPBF16PS cannot be used here: %s", gemm_bf16_dp_status());
        throw_range(env, "setGemm", msg);
        return NULL;
      }
      want = GEMM_ISA_AVX512;
      hw = GEMM_BF16_DP;
    } else if (strcmp(isa, "avx512") == 0) want = GEMM_ISA_AVX512;
    else if (strcmp(isa, "avx2") == 0) want = GEMM_ISA_AVX2;
    else if (strcmp(isa, "portable") == 0) want = GEMM_ISA_PORTABLE;
    else {
      throw_range(env, "setGemm",
                  bf16 ? "isa must be auto, amx, avx512bf16, avx512, avx2 or portable"
                       : "isa must be auto, avx512, avx2 or portable");
      return NULL;
    }
    if (!gemm_isa_supported(want)) {
      throw_range(env, "setGemm", "this CPU does not have that instruction set");
      return NULL;
    }
    gemm_kind = GEMM_BUILTIN;
    gemm_kernel = want;
  } else {
    throw_range(env, "setGemm", "kind must be builtin or blas");
    return NULL;
  }
  gemm_bf16_mode = bf16;
  gemm_bf16_hw = hw;
  napi_value obj, sup;
  CHECK_NAPI(napi_create_object(env, &obj));
  set_str(env, obj, "kind", gemm_kind == GEMM_BLAS ? "blas" : "builtin");
  set_str(env, obj, "isa",
          gemm_kind == GEMM_BLAS ? ""
          : hw == GEMM_BF16_AMX  ? "amx"
          : hw == GEMM_BF16_DP   ? "avx512bf16"
                                 : gemm_isa_name(gemm_kernel));
  set_str(env, obj, "detail",
          gemm_kind == GEMM_BLAS ? blas_config
          : hw == GEMM_BF16_AMX  ? "AMX-BF16 32x32 (TDPBF16PS)"
          : hw == GEMM_BF16_DP   ? "AVX512_BF16 6x32 (VDPBF16PS)"
                                 : gemm_isa_detail(gemm_kernel));
  set_str(env, obj, "bf16Check", bf16 && !gemm_bf16_hw_supported() ? gemm_bf16_dp_status() : "");
  set_str(env, obj, "best", gemm_isa_name(best));
  set_str(env, obj, "precision", bf16 ? "bf16" : "fp32");
  CHECK_NAPI(napi_create_array(env, &sup));
  uint32_t n = 0;
  if (bf16 && gemm_bf16_hw_supported()) {
    napi_value v;
    napi_create_string_utf8(env, "amx", NAPI_AUTO_LENGTH, &v);
    napi_set_element(env, sup, n++, v);
  }
  if (bf16 && gemm_bf16_dp_supported()) {
    napi_value v;
    napi_create_string_utf8(env, "avx512bf16", NAPI_AUTO_LENGTH, &v);
    napi_set_element(env, sup, n++, v);
  }
  for (int i = GEMM_ISA_AVX512; i >= GEMM_ISA_PORTABLE; i--)
    if (gemm_isa_supported((gemm_isa)i)) {
      napi_value v;
      napi_create_string_utf8(env, gemm_isa_name((gemm_isa)i), NAPI_AUTO_LENGTH, &v);
      napi_set_element(env, sup, n++, v);
    }
  napi_set_named_property(env, obj, "supported", sup);
  return obj;
}
