/**
 * The bench's one seeded generator: operands and token ids that are the same on every run and every revision
 * compared (a 32-bit linear congruential generator, Numerical Recipes' constants: s = 1664525 s + 1013904223 mod 2^32;
 * each value is taken after a step, from the state's high bits).
 */
export class Seeded {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0;
  }

  /** Uniform in [0, 1). */
  uniform(): number {
    this.s = (Math.imul(this.s, 1664525) + 1013904223) >>> 0;
    return this.s / 4294967296;
  }

  /** n floats uniform in [-scale/2, scale/2). */
  floats(n: number, scale = 1): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = (this.uniform() - 0.5) * scale;
    return a;
  }

  /** n token ids uniform in [0, vocab). */
  ids(n: number, vocab: number): Int32Array {
    const a = new Int32Array(n);
    for (let i = 0; i < n; i++) a[i] = Math.floor(this.uniform() * vocab);
    return a;
  }
}

/** n floats uniform in [-scale/2, scale/2) from `seed`. */
export function seededFloats(n: number, seed: number, scale = 1): Float32Array {
  return new Seeded(seed).floats(n, scale);
}
