/*
 * The fused causal attention's body (FlashAttention-2's scheme: ops/attention.c says how it works), written once and
 * compiled twice, as rows-isa.h is: by ops/attention.c as the engine runs it, and by probes.c as the bench's timed
 * copy. The includer defines
 *   ATT_FN(name)   the name of each of the two kernels (attention_forward, attention_backward),
 *   ATT_REST(stmt) each piece of work between two block products (transposes, softmax rows, row dots, the finish):
 *                  ops/attention.c runs stmt as it is; probes.c also adds up its time.
 * The two copies run the same operations in the same order: the same bits.
 */
#if !defined(ATT_FN) || !defined(ATT_REST)
#error "define ATT_FN and ATT_REST before including attention-fused.h"
#endif
#include "../engine.h"
#include "vmath.h"

/* The blocks: ATT_BQ query rows against ATT_FBK keys in the forward (its online softmax's order depends on ATT_FBK)
 * and ATT_BK keys in the backward (each dq sums over the key blocks in order). ATT_FBK is a multiple of ATT_BQ, so a
 * key block never starts past a query block's first row (each row sees at least one key of every block it meets);
 * ATT_BK is at most 64: the backward's dk and dv products have ATT_BK rows, which the GEMM runs without packing up
 * to 64. Both are multiples of VW. */
#define ATT_BQ 64
#define ATT_FBK 256
#define ATT_BK 64

/* x[T, E] (rows ld apart) times scale into xt[E, T] (keys, values), 16 rows at a time (each store a whole line). The
 * score and dP products then read both operands row by row (neither transposed): with at most DIRECT_MAX_M (64)
 * rows, as the forward's query blocks have, the x86 kernels read them in place without packing (gemm/frame.c
 * direct()). */
KERNEL_CLONES static void transpose_rows(const float *x, int64_t ld, int64_t T, int64_t E, float scale, float *xt) {
  int64_t t0 = 0;
  for (; t0 + 16 <= T; t0 += 16)
    for (int64_t e = 0; e < E; e++)
      for (int64_t t = 0; t < 16; t++) xt[e * T + t0 + t] = scale * x[(t0 + t) * ld + e];
  for (int64_t e = 0; e < E; e++)
    for (int64_t t = t0; t < T; t++) xt[e * T + t] = scale * x[t * ld + e];
}

/* ================================================================== fused */
/* Rows of a block as vectors of VW floats (GCC's vector extension: the same element-wise operations on every target,
 * in registers of the width the target has), for the row maxima and sums, whose order is fixed: lane j takes the
 * elements j, j + VW, ... in turn, then the lanes combine in index order. */
#pragma GCC diagnostic ignored "-Wpsabi" /* vector values only in static inline functions of this file: no ABI */
#define VW 16
typedef float vfl __attribute__((vector_size(4 * VW)));
typedef int32_t vin __attribute__((vector_size(4 * VW)));
static inline vfl vload(const float *p) {
  vfl v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline vfl vsel(vin m, vfl a, vfl b) { return (vfl)(((vin)a & m) | ((vin)b & ~m)); }
static inline vin viota(int64_t u) {
  const vin iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return iota + (int32_t)u;
}

/* max of x[0, c) (c >= 1), in whole vectors: the elements from c on are read, not taken */
static inline float row_max(const float *x, int64_t c) {
  const vin n = (vin){0} + (int32_t)c;
  const vfl ninf = (vfl){0} - INFINITY;
  vfl acc = vsel(viota(0) < n, vload(x), ninf);
  for (int64_t u = VW; u < c; u += VW) {
    const vfl y = vsel(viota(u) < n, vload(x + u), ninf);
    acc = vsel(y > acc, y, acc);
  }
  float m = acc[0];
  for (int j = 1; j < VW; j++) m = acc[j] > m ? acc[j] : m;
  return m;
}

/* sum of x[0, n), n a multiple of VW, in float */
static inline float row_sum(const float *x, int64_t n) {
  vfl acc = vload(x);
  for (int64_t u = VW; u < n; u += VW) acc += vload(x + u);
  float s = acc[0];
  for (int j = 1; j < VW; j++) s += acc[j];
  return s;
}

/* One block of scores s[rows, kn] (rows ATT_FBK apart) of query rows t0.. against keys k0..: each row's visible
 * keys u <= t become p = exp(s - m') with m' = max(m, the row's max), the rest 0 (to the end of the last vector);
 * l = l * exp(m - m') + sum(p), and the row of o[rows, E] times exp(m - m') (first: m' = the row's max, l = sum(p);
 * o is overwritten next). */
KERNEL_CLONES static void online_softmax(float *s, int64_t rows, int64_t kn, int64_t t0, int64_t k0, float *m,
                                         double *l, float *o, int64_t E, int first) {
  const int64_t kv = (kn + VW - 1) / VW * VW;
  for (int64_t r = 0; r < rows; r++) {
    float *sr = s + r * ATT_FBK;
    const int64_t c = t0 + r - k0 + 1 < kn ? t0 + r - k0 + 1 : kn; /* visible keys: >= 1 (ATT_FBK % ATT_BQ == 0) */
    float mx = row_max(sr, c);
    if (!first && m[r] > mx) mx = m[r];
    exp_sub_row(sr, c, mx);
    for (int64_t u = c; u < kv; u++) sr[u] = 0.0f;
    const double sum = (double)row_sum(sr, kv);
    if (first) l[r] = sum;
    else {
      const float a = exp_f32(m[r] - mx); /* exactly 1 when the max did not move */
      l[r] = l[r] * (double)a + sum;
      if (a != 1.0f)
        for (int64_t e = 0; e < E; e++) o[r * E + e] *= a;
    }
    m[r] = mx;
  }
}

/* out[t] = o[t] / l, lse[t] = m + log(l), for the rows of a finished query block */
KERNEL_CLONES static void finish_rows(float *out, int64_t ldo, float *lse, const float *o, const float *m,
                                      const double *l, int64_t rows, int64_t E) {
  for (int64_t r = 0; r < rows; r++) {
    const float inv = (float)(1.0 / l[r]);
    for (int64_t e = 0; e < E; e++) out[r * ldo + e] = o[r * E + e] * inv;
    lse[r] = (float)((double)m[r] + log_f64(l[r]));
  }
}

int ATT_FN(attention_forward)(float *out, float *lse, const float *q, const float *k, const float *v, int64_t B,
                              int64_t T, int64_t H, int64_t K, int64_t E) {
  if (T == 0 || H == 0) return 0;
  if (E == 0) { /* every score is 0: the softmax over u <= t is uniform, out has no elements */
    for (int64_t bh = 0; bh < B * H; bh++)
      for (int64_t t = 0; t < T; t++) lse[bh * T + t] = (float)log_f64((double)(t + 1));
    return 0;
  }
  const float scale = (float)(1.0 / sqrt((double)E));
  const int ldq = (int)(H * E), ldk = (int)(K * E);
  /* kt: the kv head's keys times scale as [E, T]; s: a block of scores, then of probabilities [ATT_BQ, ATT_FBK];
   * o: a query block's output so far [ATT_BQ, E] */
  float *kt = (float *)malloc((size_t)(T * E + ATT_BQ * ATT_FBK + ATT_BQ * E) * sizeof(float));
  if (!kt) return GEMM_NOMEM;
  float *s = kt + T * E, *o = s + ATT_BQ * ATT_FBK;
  float m[ATT_BQ];
  double l[ATT_BQ];
  int oom = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t hh = 0; hh < H; hh++) {
      const int64_t j = hh * K / H;
      const float *vp = v + (b * T * K + j) * E, *qp = q + (b * T * H + hh) * E;
      if (hh == 0 || j != (hh - 1) * K / H) ATT_REST(transpose_rows(k + (b * T * K + j) * E, ldk, T, E, scale, kt));
      for (int64_t t0 = 0; t0 < T; t0 += ATT_BQ) {
        const int64_t rows = T - t0 < ATT_BQ ? T - t0 : ATT_BQ, t1 = t0 + rows;
        for (int64_t k0 = 0; k0 < t1; k0 += ATT_FBK) { /* key blocks up to the diagonal */
          const int64_t kn = t1 - k0 < ATT_FBK ? t1 - k0 : ATT_FBK;
          /* s = q rows @ (scale * k)^T, then p; o = p @ v (first block), else o * exp(m - m') + p @ v */
          oom |= sgemm(0, 0, (int)rows, (int)kn, (int)E, 1.0f, qp + t0 * ldq, ldq, kt + k0, (int)T, 0.0f, s, ATT_FBK);
          ATT_REST(online_softmax(s, rows, kn, t0, k0, m, l, o, E, k0 == 0));
          oom |= sgemm(0, 0, (int)rows, (int)E, (int)kn, 1.0f, s, ATT_FBK, vp + k0 * ldk, ldk, k0 == 0 ? 0.0f : 1.0f, o,
                       (int)E);
        }
        ATT_REST(
            finish_rows(out + (b * T * H + hh) * E + t0 * ldq, ldq, lse + (b * H + hh) * T + t0, o, m, l, rows, E));
      }
    }
  free(kt);
  return oom ? GEMM_NOMEM : 0;
}

/* One block of one head: from the recomputed scores s (rows ATT_BK apart) and dp = dout @ v^T, the probabilities
 * p = exp(s - lse) into s and dscores = p * (dp - D) * scale into ds over each row's visible keys u <= t, 0 for the
 * masked ones. */
KERNEL_CLONES static void softmax_grad(float *s, float *ds, const float *dp, int64_t rows, int64_t kn, int64_t t0,
                                       int64_t k0, const float *lse, const float *D, float scale) {
  for (int64_t r = 0; r < rows; r++) {
    float *sr = s + r * ATT_BK, *dr = ds + r * ATT_BK;
    const float *pr = dp + r * ATT_BK;
    const int64_t c = t0 + r - k0 + 1 < kn ? t0 + r - k0 + 1 : kn;
    softmax_grad_row(sr, dr, pr, c, lse[r], D[r], scale);
    for (int64_t u = c; u < kn; u++) sr[u] = dr[u] = 0.0f;
  }
}

/* D[t] = rowsum(dout * out) of one head (= sum_u p * dp, the softmax backward's row term) */
KERNEL_CLONES static void row_dots(float *D, const float *dout, const float *out, int64_t ld, int64_t T, int64_t E) {
  for (int64_t t = 0; t < T; t++) D[t] = (float)dot_f64(dout + t * ld, out + t * ld, E);
}

/* dq = dS @ k, dk = dS^T @ q, dv = P^T @ dout (overwritten), with P = exp(S - lse), S = q (scale k)^T,
 * dS = P * (dP - D) * scale, dP = dout @ v^T and D = rowsum(dout * out), a key block at a time: per (sequence, kv
 * head), key block and query head: S and dP of all the query rows from the diagonal down, one product each, then
 * P and dS, then dq += dS @ k in one product (dq sums over the key blocks in order), then the key block's dv and dk
 * in one product over all those rows (the query heads added in order). */
int ATT_FN(attention_backward)(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                               const float *v, const float *out, const float *lse, int64_t B, int64_t T, int64_t H,
                               int64_t K, int64_t E) {
  if (T == 0 || E == 0 || H == 0) {
    memset(dk, 0, (size_t)(B * T * K * E) * sizeof(float));
    memset(dv, 0, (size_t)(B * T * K * E) * sizeof(float));
    return 0;
  }
  const float scale = (float)(1.0 / sqrt((double)E));
  const int64_t R = H / K;
  const int ldq = (int)(H * E), ldk = (int)(K * E);
  /* kt, vt: the kv head's keys times scale and values as [E, T]; D [R, T]; pc, dc: one query head's P and dS of a
   * key block, [T, ATT_BK] each (row t - k0); dp likewise */
  const size_t n = (size_t)(2 * T * E + R * T + 3 * T * ATT_BK);
  float *kt = (float *)malloc(n * sizeof(float));
  if (!kt) return GEMM_NOMEM;
  float *vt = kt + T * E, *D = vt + T * E, *pc = D + R * T, *dc = pc + T * ATT_BK, *dp = dc + T * ATT_BK;
  int oom = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < K; j++) {
      const float *kp = k + (b * T * K + j) * E;
      float *dkp = dk + (b * T * K + j) * E, *dvp = dv + (b * T * K + j) * E;
      ATT_REST(transpose_rows(kp, ldk, T, E, scale, kt); transpose_rows(v + (b * T * K + j) * E, ldk, T, E, 1.0f, vt));
      for (int64_t i = 0; i < R; i++) {
        const int64_t o = (b * T * H + j * R + i) * E;
        ATT_REST(row_dots(D + i * T, dout + o, out + o, ldq, T, E));
      }
      for (int64_t k0 = 0; k0 < T; k0 += ATT_BK) {
        const int64_t kn = T - k0 < ATT_BK ? T - k0 : ATT_BK;
        for (int64_t i = 0; i < R; i++) {
          const int64_t hh = j * R + i;
          const float *qh = q + (b * T * H + hh) * E, *doh = dout + (b * T * H + hh) * E;
          float *dqh = dq + (b * T * H + hh) * E;
          const int rows = (int)(T - k0); /* the query rows from the diagonal down, in one product each */
          /* s = q rows @ (scale * k)^T (the forward's scores, bit for bit), dp = dout rows @ v^T */
          oom |= sgemm(0, 0, rows, (int)kn, (int)E, 1.0f, qh + k0 * ldq, ldq, kt + k0, (int)T, 0.0f, pc, ATT_BK);
          oom |= sgemm(0, 0, rows, (int)kn, (int)E, 1.0f, doh + k0 * ldq, ldq, vt + k0, (int)T, 0.0f, dp, ATT_BK);
          ATT_REST(softmax_grad(pc, dc, dp, rows, kn, k0, k0, lse + (b * H + hh) * T + k0, D + i * T + k0, scale));
          /* dq[k0:T] (+)= dS @ k[k0 block] */
          oom |= sgemm(0, 0, rows, (int)E, (int)kn, 1.0f, dc, ATT_BK, kp + k0 * ldk, ldk, k0 == 0 ? 0.0f : 1.0f,
                       dqh + k0 * ldq, ldq);
          /* dv[k0 block] (+)= P^T @ dout[k0:T], dk[k0 block] (+)= dS^T @ q[k0:T], this query head's */
          oom |= sgemm(1, 0, (int)kn, (int)E, (int)(T - k0), 1.0f, pc, ATT_BK, doh + k0 * ldq, ldq,
                       i == 0 ? 0.0f : 1.0f, dvp + k0 * ldk, ldk);
          oom |= sgemm(1, 0, (int)kn, (int)E, (int)(T - k0), 1.0f, dc, ATT_BK, qh + k0 * ldq, ldq, i == 0 ? 0.0f : 1.0f,
                       dkp + k0 * ldk, ldk);
        }
      }
    }
  free(kt);
  return oom ? GEMM_NOMEM : 0;
}
