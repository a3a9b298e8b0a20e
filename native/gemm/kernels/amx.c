/*
 * The AMX-BF16 kernel of gemm_bf16 (bf16.c): its packing into tiles and its blocked product.
 */
#include "../internal.h"
#ifdef GEMM_X86
#include <sys/syscall.h>
#include <unistd.h>

#include "../transpose.h"

/* ---- AMX-BF16: TDPBF16PS on 16 x 16 tiles of C, a 32 x 32 block of C in 4 tiles per step (2 A x 2 B tiles).
 * Packed A: per 16-row sliver and chunk, 16 rows x 32 bf16 (a row's 32 k in order, 64 bytes). Packed B: per
 * 16-column sliver and chunk, 16 rows of pairs x 16 columns, (b[2p][j], b[2p+1][j]) in one dword. */
/* The K block of a product: all of K when it is at most AMX_KC_ONE, else AMX_KC. */
static inline int64_t amx_kc(int64_t K) { return K <= AMX_KC_ONE ? (K + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK : AMX_KC; }
typedef struct {
  uint8_t palette, start;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) amx_config;

static int amx_ok = -1;
/* The CPU has AMX-TILE and AMX-BF16 and the kernel lets this process use the tile data (arch_prctl). */
int amx_supported(void) {
  if (amx_ok >= 0) return amx_ok;
  unsigned int a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  int ok = (d >> 22 & 1) && (d >> 24 & 1) && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  if (ok) ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  amx_ok = ok;
  return ok;
}

/* 32 floats to 32 bf16 (VCVTNE2PS2BF16: bf16_round's rule), in order. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static inline __m512i bf16x32(const float *x) {
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}
/* 16 floats of each of two rows to 16 dwords (bf16 of x[j]) | (bf16 of y[j]) << 16. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static inline __m512i bf16pairs(const float *x, const float *y) {
  const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(y), _mm512_loadu_ps(x));
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, v);
}
/* One dword of bf16 pairs from scalars (edges). */
static inline uint32_t pair_bits(float x, float y) { return bf16_bits(x) | bf16_bits(y) << 16; }

/* A[i0:i0+mc, p0:p0+kv] into 16-row slivers of chunks (rows past mc and k past kv zero), mc padded to 32. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void pack_a_amx(int ta, const float *A, int64_t lda,
                                                                              int64_t i0, int64_t p0, int64_t mc,
                                                                              int64_t kv, int64_t kc, uint16_t *ap) {
  const int64_t nch = kc / BF_CHUNK;
  uint32_t tmp[16 * 16] __attribute__((aligned(64)));
  for (int64_t s = 0; s < (mc + 31) / 32 * 32; s += 16)
    for (int64_t c = 0; c < nch; c++) {
      uint16_t *dst = ap + (s / 16 * nch + c) * 512;
      const int64_t p = c * BF_CHUNK, rows = mc - s < 16 ? (mc - s > 0 ? mc - s : 0) : 16;
      const int full = rows == 16 && p + BF_CHUNK <= kv;
      if (full && !ta) {
        for (int r = 0; r < 16; r++) _mm512_storeu_si512(dst + r * 32, bf16x32(A + (i0 + s + r) * lda + p0 + p));
      } else if (full) { /* A stored [K,M]: pair rows of 16 m, then a 16 x 16 dword transpose */
        for (int q = 0; q < 16; q++)
          _mm512_store_si512(tmp + q * 16,
                             bf16pairs(A + (p0 + p + 2 * q) * lda + i0 + s, A + (p0 + p + 2 * q + 1) * lda + i0 + s));
        transpose16((const float *)tmp, 16, (float *)dst, 16);
      } else {
        uint32_t *d32 = (uint32_t *)dst;
        for (int r = 0; r < 16; r++)
          for (int q = 0; q < 16; q++) {
            float x[2];
            for (int h = 0; h < 2; h++) {
              const int64_t k = p + 2 * q + h;
              x[h] = r < rows && k < kv ? (ta ? A[(p0 + k) * lda + i0 + s + r] : A[(i0 + s + r) * lda + p0 + k]) : 0.0f;
            }
            d32[r * 16 + q] = pair_bits(x[0], x[1]);
          }
      }
    }
}

/* B[p0:p0+kv, j0:j0+nc] into 16-column slivers of chunks (pairs of k per dword), nc padded to 32. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void pack_b_amx(int tb, const float *B, int64_t ldb,
                                                                              int64_t p0, int64_t j0, int64_t kv,
                                                                              int64_t kc, int64_t nc, uint16_t *bp) {
  const int64_t nch = kc / BF_CHUNK;
  uint32_t tmp[16 * 16] __attribute__((aligned(64)));
  for (int64_t s = 0; s < (nc + 31) / 32 * 32; s += 16)
    for (int64_t c = 0; c < nch; c++) {
      uint32_t *dst = (uint32_t *)(bp + (s / 16 * nch + c) * 512);
      const int64_t p = c * BF_CHUNK, cols = nc - s < 16 ? (nc - s > 0 ? nc - s : 0) : 16;
      const int full = cols == 16 && p + BF_CHUNK <= kv;
      if (full && !tb) {
        for (int q = 0; q < 16; q++)
          _mm512_storeu_si512(dst + q * 16,
                              bf16pairs(B + (p0 + p + 2 * q) * ldb + j0 + s, B + (p0 + p + 2 * q + 1) * ldb + j0 + s));
      } else if (full) { /* B stored [N,K]: each column's 32 k are its 16 pairs; a 16 x 16 dword transpose */
        for (int j = 0; j < 16; j++) _mm512_store_si512(tmp + j * 16, bf16x32(B + (j0 + s + j) * ldb + p0 + p));
        transpose16((const float *)tmp, 16, (float *)dst, 16);
      } else {
        for (int q = 0; q < 16; q++)
          for (int j = 0; j < 16; j++) {
            float x[2];
            for (int h = 0; h < 2; h++) {
              const int64_t k = p + 2 * q + h;
              x[h] = j < cols && k < kv ? (tb ? B[(j0 + s + j) * ldb + p0 + k] : B[(p0 + k) * ldb + j0 + s + j]) : 0.0f;
            }
            dst[q * 16 + j] = pair_bits(x[0], x[1]);
          }
      }
    }
}

/* B packed whole, block after block in blocked_amx's order (jc, then pc): what a weight's cache entry holds. */
size_t amx_packed_b_size(int64_t N, int64_t K) {
  size_t n = 0;
  for (int64_t jc = 0; jc < N; jc += AMX_NC) {
    const int64_t nc = N - jc < AMX_NC ? N - jc : AMX_NC;
    for (int64_t pc = 0; pc < K; pc += amx_kc(K)) {
      const int64_t kv = K - pc < amx_kc(K) ? K - pc : amx_kc(K);
      n += (size_t)((nc + 31) / 32 * 32) * (size_t)((kv + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK);
    }
  }
  return n; /* in bf16 values */
}
void amx_pack_b_whole(int tb, const float *B, int64_t ldb, int64_t N, int64_t K, uint16_t *dst) {
  for (int64_t jc = 0; jc < N; jc += AMX_NC) {
    const int64_t nc = N - jc < AMX_NC ? N - jc : AMX_NC;
    for (int64_t pc = 0; pc < K; pc += amx_kc(K)) {
      const int64_t kv = K - pc < amx_kc(K) ? K - pc : amx_kc(K), kc = (kv + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK;
      pack_b_amx(tb, B, ldb, pc, jc, kv, kc, nc, dst);
      dst += (nc + 31) / 32 * 32 * kc;
    }
  }
}

/* out[M,N] = acc on AMX (as blocked_bf16); packed: B already packed whole (amx_pack_b_whole), or NULL. With beta != 0
 * (K in one block only: the caller's check) each tile's whole sum meets out's old value as gemm_bf16 combines them:
 * ftz(ftz(C) + acc), or ftz(fma(beta, ftz(C), acc)). */
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16"))) int blocked_amx(
    int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
    const uint16_t *packed, float beta, float *out, int64_t ldo) {
  const int64_t kcMax = amx_kc(K);
  const int64_t ncMax = ((N < AMX_NC ? N : AMX_NC) + 31) / 32 * 32, mcMax = ((M < AMX_MC ? M : AMX_MC) + 31) / 32 * 32;
  const size_t bsize = (size_t)(ncMax * kcMax) / 2, asize = (size_t)(mcMax * kcMax) / 2; /* floats: 2 bf16 each */
  float *buf = scratch(bsize + asize);
  if (!buf) return -1;
  uint16_t *bp = (uint16_t *)buf, *ap = (uint16_t *)(buf + bsize);
  amx_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  float ct[32 * 32] __attribute__((aligned(64)));
  for (int64_t jc = 0; jc < N; jc += AMX_NC) {
    const int64_t nc = N - jc < AMX_NC ? N - jc : AMX_NC;
    for (int64_t pc = 0; pc < K; pc += kcMax) {
      const int64_t kv = K - pc < kcMax ? K - pc : kcMax, kc = (kv + BF_CHUNK - 1) / BF_CHUNK * BF_CHUNK;
      const int64_t nch = kc / BF_CHUNK;
      if (packed) {
        bp = (uint16_t *)packed;
        packed += (nc + 31) / 32 * 32 * kc;
      } else {
        pack_b_amx(tb, B, ldb, pc, jc, kv, kc, nc, bp);
      }
      for (int64_t ic = 0; ic < M; ic += AMX_MC) {
        const int64_t mc = M - ic < AMX_MC ? M - ic : AMX_MC;
        pack_a_amx(ta, A, lda, ic, pc, mc, kv, kc, ap);
        for (int64_t jr = 0; jr < nc; jr += 32) {
          const int64_t cols = nc - jr < 32 ? nc - jr : 32;
          for (int64_t ir = 0; ir < mc; ir += 32) {
            const int64_t rows = mc - ir < 32 ? mc - ir : 32;
            float *cp = out + (ic + ir) * ldo + jc + jr;
            const int whole = rows == 32 && cols == 32;
            if (pc == 0) {
              _tile_zero(0);
              _tile_zero(1);
              _tile_zero(2);
              _tile_zero(3);
            } else {
              float *src = cp;
              int64_t ld = ldo;
              if (!whole) {
                for (int64_t r = 0; r < 32; r++)
                  for (int64_t j = 0; j < 32; j++) ct[r * 32 + j] = r < rows && j < cols ? cp[r * ldo + j] : 0.0f;
                src = ct;
                ld = 32;
              }
              _tile_loadd(0, src, ld * 4);
              _tile_loadd(1, src + 16, ld * 4);
              _tile_loadd(2, src + 16 * ld, ld * 4);
              _tile_loadd(3, src + 16 * ld + 16, ld * 4);
            }
            const uint16_t *a0 = ap + (ir / 16) * nch * 512, *a1 = a0 + nch * 512;
            const uint16_t *b0 = bp + (jr / 16) * nch * 512, *b1 = b0 + nch * 512;
            for (int64_t c = 0; c < nch; c++) {
              _tile_loadd(4, a0 + c * 512, 64);
              _tile_loadd(6, b0 + c * 512, 64);
              _tile_loadd(5, a1 + c * 512, 64);
              _tile_loadd(7, b1 + c * 512, 64);
              _tile_dpbf16ps(0, 4, 6);
              _tile_dpbf16ps(1, 4, 7);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
            const int direct = whole && beta == 0.0f;
            float *dst = direct ? cp : ct;
            const int64_t ld = direct ? ldo : 32;
            _tile_stored(0, dst, ld * 4);
            _tile_stored(1, dst + 16, ld * 4);
            _tile_stored(2, dst + 16 * ld, ld * 4);
            _tile_stored(3, dst + 16 * ld + 16, ld * 4);
            if (!direct)
              for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < cols; j++) {
                  float *c = cp + r * ldo + j;
                  const float x = ct[r * 32 + j];
                  *c = beta == 0.0f ? x : beta == 1.0f ? ftz(ftz(*c) + x) : ftz(fmaf(beta, ftz(*c), x));
                }
          }
        }
      }
    }
  }
  _tile_release();
  return 0;
}
#endif
