/*
 * The optimizer's AdamW pass in C: src/optim/optim-simd.ts's adamwSliceSimd (the WebAssembly kernel) over the
 * shared weights, moments and gradient in place. The wasm kernel reads only its own memory, so it streams every
 * slice through private regions (copy in, compute, copy out); this one reads and writes the SharedArrayBuffers'
 * floats directly, so a step moves only the 28 bytes a parameter needs (read g, m, v, p; write m, v, p).
 *
 * The arithmetic is the wasm kernel's, operation for operation, in float32 (IEEE multiply, add, sqrt and divide,
 * each rounded once; -ffp-contract=off, so nothing fuses into an FMA). Every element is independent of the others,
 * so the vector width the compiler picks for each KERNEL_CLONES target changes nothing: the same bits as the wasm
 * kernel on every CPU (test/train.optim.test.ts holds the two to each other).
 */
#include "../engine.h"

/* For i < n: gi = g * coef; m = b1 * m + b1c * gi; v = b2 * v + b2c * (gi * gi);
 * p = p * decay - step * (m / (sqrt(v) * ibc2 + eps)) */
KERNEL_CLONES void adamw_f32(float *restrict p, float *restrict m, float *restrict v, const float *restrict g,
                             int64_t n, const float h[9]) {
  const float decay = h[0], b1 = h[1], b1c = h[2], b2 = h[3], b2c = h[4], coef = h[5], ibc2 = h[6], eps = h[7],
              step = h[8];
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i] * coef;
    const float mi = b1 * m[i] + b1c * gi;
    const float vi = b2 * v[i] + b2c * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * (mi / (sqrtf(vi) * ibc2 + eps));
  }
}
