/*
 * The weights' packed copies for the AMX and VDPBF16PS kernels (gemm.h: gemm_bf16_weights*), shared by every thread.
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

#ifdef GEMM_X86
/* ---- The weights' packed copies (gemm_bf16_weights): a product whose B lies in the registered range is packed once
 * per generation (the range's contents changed: gemm_bf16_weights_changed) and its copy shared by every thread of
 * the process (the ranks multiply against the same weights). A thread that finds an entry being packed waits. */
typedef struct {
  const float *B;
  int layout, tb;
  int64_t N, K, ldb, gen;
  void *buf;
  size_t cap;
  int packing;
} wcache_entry;
static pthread_mutex_t wc_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wc_cond = PTHREAD_COND_INITIALIZER;
static wcache_entry wc[WCACHE_MAX];
static int wc_n = 0;
static const float *w_lo = NULL, *w_hi = NULL;
static int64_t w_gen = 1;

/* Every call makes the kept copies stale, the same range again included: a new buffer may lie where the old one
 * did (a second run in the same process) with other contents. (The copies' buffers are kept for reuse: another
 * thread may still be reading one.) */
void gemm_bf16_weights(const float *base, int64_t n) {
  pthread_mutex_lock(&wc_lock);
  w_lo = n > 0 ? base : NULL;
  w_hi = n > 0 ? base + n : NULL;
  w_gen++;
  pthread_mutex_unlock(&wc_lock);
}
void gemm_bf16_weights_changed(void) {
  pthread_mutex_lock(&wc_lock);
  w_gen++;
  pthread_mutex_unlock(&wc_lock);
}

/* The bytes of a packed copy in a kernel's layout, and the packing */
static size_t packed_bytes(int layout, int64_t N, int64_t K) {
  return layout == GEMM_BF16_DP ? dp_packed_b_size(N, K) * 4 : amx_packed_b_size(N, K) * 2;
}
static void pack_whole(int layout, int tb, const float *B, int64_t ldb, int64_t N, int64_t K, void *buf) {
  if (layout == GEMM_BF16_DP) dp_pack_b_whole(tb, B, ldb, N, K, (uint32_t *)buf);
  else amx_pack_b_whole(tb, B, ldb, N, K, (uint16_t *)buf);
}

/* Packs this generation's copy of every kept entry i with i % parts == part that is stale and not being packed: the
 * ranks call it at the start of a compute phase, each with its own part, so the weights' copies are remade side by
 * side instead of by whichever thread meets each first while the others wait. */
void gemm_bf16_weights_prepack(int part, int parts) {
  if (parts < 1 || part < 0) return;
  pthread_mutex_lock(&wc_lock);
  for (int i = part; i < wc_n; i += parts) {
    wcache_entry *e = &wc[i];
    if (e->packing || e->gen == w_gen || !e->buf || !w_lo) continue;
    const float *last = e->B + (e->tb ? (e->N - 1) * e->ldb + e->K : (e->K - 1) * e->ldb + e->N);
    if (e->B < w_lo || last > w_hi) continue;
    e->packing = 1;
    const int64_t gen = w_gen;
    pthread_mutex_unlock(&wc_lock);
    pack_whole(e->layout, e->tb, e->B, e->ldb, e->N, e->K, e->buf);
    pthread_mutex_lock(&wc_lock);
    e->packing = 0;
    e->gen = gen;
    pthread_cond_broadcast(&wc_cond);
  }
  pthread_mutex_unlock(&wc_lock);
}

/* B's packed copy when B is a registered weight (packing it now if this generation has none), else NULL. */
const void *weight_packed(int layout, int tb, const float *B, int64_t ldb, int64_t N, int64_t K) {
  const float *last = B + (tb ? (N - 1) * ldb + K : (K - 1) * ldb + N);
  if (!w_lo || B < w_lo || last > w_hi) return NULL;
  pthread_mutex_lock(&wc_lock);
  if (!w_lo || B < w_lo || last > w_hi) {
    pthread_mutex_unlock(&wc_lock);
    return NULL;
  }
  wcache_entry *e = NULL;
  for (;;) {
    e = NULL;
    for (int i = 0; i < wc_n; i++)
      if (wc[i].B == B && wc[i].layout == layout && wc[i].tb == tb && wc[i].N == N && wc[i].K == K && wc[i].ldb == ldb)
        e = &wc[i];
    if (!e || !e->packing) break;
    pthread_cond_wait(&wc_cond, &wc_lock);
  }
  if (e && e->gen == w_gen) {
    pthread_mutex_unlock(&wc_lock);
    return e->buf;
  }
  if (!e) {
    if (wc_n == WCACHE_MAX) {
      pthread_mutex_unlock(&wc_lock);
      return NULL;
    }
    e = &wc[wc_n++];
    memset(e, 0, sizeof *e);
    e->B = B, e->layout = layout, e->tb = tb, e->N = N, e->K = K, e->ldb = ldb;
  }
  const size_t need = packed_bytes(layout, N, K);
  if (e->cap < need) {
    free(e->buf);
    e->buf = aligned_alloc(64, (need + 63) / 64 * 64);
    e->cap = e->buf ? need : 0;
  }
  if (!e->buf) {
    pthread_mutex_unlock(&wc_lock);
    return NULL;
  }
  e->packing = 1;
  const int64_t gen = w_gen;
  pthread_mutex_unlock(&wc_lock);
  pack_whole(layout, tb, B, ldb, N, K, e->buf);
  pthread_mutex_lock(&wc_lock);
  e->packing = 0;
  e->gen = gen;
  pthread_cond_broadcast(&wc_cond);
  pthread_mutex_unlock(&wc_lock);
  return e->buf;
}
#else
void gemm_bf16_weights(const float *base, int64_t n) { (void)base, (void)n; }
void gemm_bf16_weights_changed(void) {}
void gemm_bf16_weights_prepack(int part, int parts) { (void)part, (void)parts; }
#endif
