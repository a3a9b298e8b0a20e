/*
 * The element-wise maths of the row kernels (ops/rows.c, ops/rows-isa.h) and the fused attention: one exp for floats
 * and one log for doubles, each a fixed sequence of IEEE operations (explicit FMAs, no contraction, no libm), so every
 * instruction set gives the same bits.
 *
 * exp(x), float: x clamped to [EXP_LO, EXP_HI]; n = round(x / ln 2) (x * log2(e) + 1.5 * 2^23 in one FMA, then the
 * shift taken off); r = x - n ln 2 in two FMAs (ln 2 split in C1 + C2, C1 exact in 9 bits); Cephes' expf polynomial
 * in r by Horner (FMAs); y = p r^2 + r (FMA), + 1; times 2^n built in the exponent bits. VEXP_BODY writes it once on
 * the V* operations: ops/rows-isa.h instantiates it on AVX-512 (16 lanes), AVX2 (8) and plain C (1), with the same
 * operations in the same order. Measured (test/model.vmath.test.ts: [-87, 88] on a 2^-12 grid, the clamps'
 * neighbourhoods, 100,000 random floats): under 1 ulp from float64 exp (0.995 at worst); below EXP_LO the result is
 * exp(-87) ~ 1.6e-38 instead of a denormal or 0 (no sum here sees it), above EXP_HI it is exp(88) ~ 1.65e38.
 *
 * log(x), double (cross-entropy's log of the row sum, attention's log-sum-exp): fdlibm's e_log.c (x = 2^k (1 + f),
 * 1 + f in [sqrt(2)/2, sqrt(2)), s = f / (2 + f), log(1 + f) = f - f^2/2 + s (f^2/2 + R(s^2)), R its minimax
 * polynomial) in Horner form on fma(); scalar (it runs once per row), so every target calls the same code (fma is
 * correctly rounded, in hardware or in libm). Measured: at most 1 ulp from Math.log (itself within 1 ulp) on the
 * test's 140,000 doubles, denormals to 1e300.
 */
#ifndef TSTRAIN_VMATH_H
#define TSTRAIN_VMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EXP_LO (-87.0f)
#define EXP_HI 88.0f
#define EXP_L2E 1.44269504088896341f
#define EXP_SHIFT 12582912.0f /* 1.5 * 2^23: t = x log2(e) + SHIFT holds round(x log2(e)) in its low bits */
#define EXP_C1 0.693359375f
#define EXP_C2 (-2.12194440e-4f)
#define EXP_P0 1.9875691500E-4f
#define EXP_P1 1.3981999507E-3f
#define EXP_P2 8.3334519073E-3f
#define EXP_P3 4.1665795894E-2f
#define EXP_P4 1.6666665459E-1f
#define EXP_P5 5.0000001201E-1f

/* The exp on the V* operations of the including file (vf, VSET, VMAX, VMIN, VFMA, VSUB, VMUL, VADD, VPOW2): x a vf
 * expression evaluated once, the result assigned to out. */
#define VEXP_BODY(out, xin)                                                                                            \
  do {                                                                                                                 \
    vf x_ = VMIN(VMAX((xin), VSET(EXP_LO)), VSET(EXP_HI));                                                             \
    const vf t_ = VFMA(x_, VSET(EXP_L2E), VSET(EXP_SHIFT));                                                            \
    const vf n_ = VSUB(t_, VSET(EXP_SHIFT));                                                                           \
    vf r_ = VFMA(n_, VSET(-EXP_C1), x_);                                                                               \
    r_ = VFMA(n_, VSET(-EXP_C2), r_);                                                                                  \
    vf p_ = VSET(EXP_P0);                                                                                              \
    p_ = VFMA(p_, r_, VSET(EXP_P1));                                                                                   \
    p_ = VFMA(p_, r_, VSET(EXP_P2));                                                                                   \
    p_ = VFMA(p_, r_, VSET(EXP_P3));                                                                                   \
    p_ = VFMA(p_, r_, VSET(EXP_P4));                                                                                   \
    p_ = VFMA(p_, r_, VSET(EXP_P5));                                                                                   \
    const vf y_ = VADD(VFMA(p_, VMUL(r_, r_), r_), VSET(1));                                                           \
    (out) = VMUL(y_, VPOW2(n_));                                                                                       \
  } while (0)

/* The scalar form (the portable lanes, tails, single values): the same body on floats. a > b ? a : b is MAXPS's
 * rule (the second operand when either is NaN), a < b ? a : b MINPS's. */
static inline float pow2_f32(float n) { /* 2^n for an integral n in [-126, 127] */
  const int32_t bits = ((int32_t)n + 127) * (1 << 23);
  float s;
  memcpy(&s, &bits, sizeof s);
  return s;
}
static inline float exp_f32(float xin) {
  typedef float vf;
#define VSET(a) ((float)(a))
#define VMAX(a, b) ((a) > (b) ? (a) : (b))
#define VMIN(a, b) ((a) < (b) ? (a) : (b))
#define VFMA(a, b, c) fmaf((a), (b), (c))
#define VSUB(a, b) ((a) - (b))
#define VMUL(a, b) ((a) * (b))
#define VADD(a, b) ((a) + (b))
#define VPOW2(n) pow2_f32(n)
  float out;
  VEXP_BODY(out, xin);
  return out;
#undef VSET
#undef VMAX
#undef VMIN
#undef VFMA
#undef VSUB
#undef VMUL
#undef VADD
#undef VPOW2
}

/* log(x) for a double: fdlibm's algorithm and coefficients, Horner on fma(); log(0) = -inf, log(+inf) = +inf,
 * negative or NaN: NaN; denormals scaled by 2^54 first. */
static inline double log_f64(double x) {
  static const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10,
                      Lg1 = 6.666666666666735130e-01, Lg2 = 3.999999999940941908e-01, Lg3 = 2.857142874366239149e-01,
                      Lg4 = 2.222219843214978396e-01, Lg5 = 1.818357216161805012e-01, Lg6 = 1.531383769920937332e-01,
                      Lg7 = 1.479819860511658591e-01;
  if (!(x > 0)) return x == 0 ? -INFINITY : NAN;
  if (x == INFINITY) return x;
  int k = 0;
  if (x < 2.2250738585072014e-308) { /* denormal */
    x *= 18014398509481984.0;        /* 2^54 */
    k = -54;
  }
  uint64_t b;
  memcpy(&b, &x, sizeof b);
  k += (int)(b >> 52) - 1023;
  b &= 0x000fffffffffffffULL;
  /* the mantissa 1 + f in [sqrt(2)/2, sqrt(2)): halve it (exponent - 1) when above sqrt(2) */
  const uint64_t i = (b + (0x95f64ULL << 32)) & 0x0010000000000000ULL; /* fdlibm's test, on the high word */
  b |= i ^ 0x3ff0000000000000ULL;
  k += (int)(i >> 52);
  double m;
  memcpy(&m, &b, sizeof m);
  const double f = m - 1.0, s = f / (2.0 + f), z = s * s, w = z * z;
  const double t1 = w * fma(w, fma(w, Lg6, Lg4), Lg2), t2 = z * fma(w, fma(w, fma(w, Lg7, Lg5), Lg3), Lg1);
  const double R = t2 + t1, hfsq = 0.5 * f * f, dk = (double)k;
  return dk * ln2_hi - ((hfsq - fma(s, hfsq + R, dk * ln2_lo)) - f);
}

#endif
