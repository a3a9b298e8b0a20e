/*
 * Causal attention (GQA) of the native engine: kernels.ts attentionForward / attentionBackward, fused in
 * FlashAttention-2's scheme (Dao, 2023) on the CPU, and the cached form for generation (attentionCachedForward).
 *
 * q[B, T, H, E], k and v [B, T, K, E]; query head hh reads kv head j = hh*K/H (the R = H/K query heads of a group
 * share it). For each (sequence, query head) the forward runs blocks of ATT_BQ queries against blocks of ATT_FBK
 * keys with an online softmax (a running max m and sum l per row; the output rescaled when m grows), and keeps
 * only the output and the per-row log-sum-exp lse = m + log(l) [B, H, T]: the [T, T] scores never exist whole.
 * The backward recomputes each block's probabilities from lse, P = exp(S - lse), and accumulates dq, dk and dv
 * block by block. Blocks above the causal diagonal are never computed; on the diagonal the masked entries are 0.
 *
 * Every block product runs on this thread's GEMM (engine.h sgemm: the built-in GEMM's chain of FMAs, the same bits
 * on every instruction set; in bf16 its operands rounded to bf16 at the GEMM, as for every product; with
 * `--gemm openblas`, the BLAS's, whose bits are its own). Everything
 * between the products is plain C in one order, compiled for every target (KERNEL_CLONES, -ffp-contract=off),
 * with ops/vmath.h's exp and log (the rows of exponentials on ops/rows.c's copy of this thread's instruction set):
 * the same bits on every CPU. The order of the online softmax depends on the block sizes, so they are constants,
 * the same on every instruction set.
 *
 * The fused kernels' body is ops/attention-fused.h, compiled here as the engine runs it; probes.c compiles a second
 * copy that times their work between the block products, for the bench (its attentionProfile).
 */
#include "../engine.h"
#include "vmath.h"

#define ATT_FN(name) name
#define ATT_REST(stmt)                                                                                                 \
  do {                                                                                                                 \
    stmt;                                                                                                              \
  } while (0)
#include "attention-fused.h"

/* ------------------------------------------------------------------ cached attention (generation, forward only) */
/* kernels.ts attentionCachedForward: new position t of T (absolute P+t) and query head h attend to cache rows
 * u <= P+t of kv head j = h*K/H. The arithmetic is the JS reference's (src/model/engine/js.ts): dot products in
 * double, in e order; scores rounded to float; the softmax in double from the float scores; probabilities rounded
 * to float; the weighted sum of values in double. sc holds P+T floats, acc E doubles (the caller's scratch). */
void attention_cached(float *out, const float *q, const float *kc, const float *vc, int64_t P, int64_t T, int64_t H,
                      int64_t K, int64_t E, float *sc, double *acc) {
  const double scale = 1.0 / sqrt((double)E);
  for (int64_t t = 0; t < T; t++) {
    const int64_t last = P + t;
    for (int64_t h = 0; h < H; h++) {
      const int64_t j = h * K / H;
      const float *qh = q + (t * H + h) * E;
      float mx = -INFINITY;
      for (int64_t u = 0; u <= last; u++) {
        const float *ku = kc + (u * K + j) * E;
        double s = 0;
        for (int64_t e = 0; e < E; e++) s += (double)qh[e] * (double)ku[e];
        sc[u] = (float)(s * scale);
        if (sc[u] > mx) mx = sc[u];
      }
      double sum = 0;
      for (int64_t u = 0; u <= last; u++) sum += exp((double)sc[u] - (double)mx);
      for (int64_t u = 0; u <= last; u++) sc[u] = (float)(exp((double)sc[u] - (double)mx) / sum);
      for (int64_t e = 0; e < E; e++) acc[e] = 0;
      for (int64_t u = 0; u <= last; u++) {
        const double p = (double)sc[u];
        const float *vu = vc + (u * K + j) * E;
        for (int64_t e = 0; e < E; e++) acc[e] += p * (double)vu[e];
      }
      float *oh = out + (t * H + h) * E;
      for (int64_t e = 0; e < E; e++) oh[e] = (float)acc[e];
    }
  }
}
