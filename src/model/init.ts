/**
 * M5 initialisation: normal(0, 0.02) for the embedding and every projection, ones for the norm
 * weights, from one seed, identical on every rank and independent of any library version.
 *
 * The generator, fully specified so it can be re-implemented anywhere:
 *  - splitmix64 (Steele, Lea, Flood 2014) seeded with the seed as an unsigned 64-bit integer yields
 *    four 64-bit words; their low 32 bits form the xoshiro128** state (Blackman, Vigna 2018);
 *  - a uniform double in (0, 1] is (hi * 2^21 + (lo >>> 11) + 1) / 2^53, from two consecutive
 *    32-bit outputs hi then lo;
 *  - Box-Muller: from u1, u2, r = sqrt(-2 ln u1), z0 = r cos(2 pi u2), z1 = r sin(2 pi u2); z0 then
 *    z1 are consumed in order, the spare carrying over to the next tensor;
 *  - the stream walks the flat layout in order, skipping the norm weights (which take 1.0).
 *  Values are std * z rounded to float32.
 */
import type { LlamaConfig } from "./llama-config";
import { paramLayout } from "./layout";

const MASK64 = (1n << 64n) - 1n;

/** xoshiro128** seeded through splitmix64. */
export class Xoshiro128 {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;
  constructor(seed: number | bigint) {
    let x = BigInt.asUintN(64, BigInt(seed));
    const next = (): number => {
      x = (x + 0x9e3779b97f4a7c15n) & MASK64;
      let z = x;
      z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
      z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
      z = z ^ (z >> 31n);
      return Number(z & 0xffffffffn) | 0;
    };
    this.s0 = next();
    this.s1 = next();
    this.s2 = next();
    this.s3 = next();
    if ((this.s0 | this.s1 | this.s2 | this.s3) === 0) this.s0 = 1; // the all-zero state is a fixed point
  }
  /** Next unsigned 32-bit output. */
  nextU32(): number {
    const result = Math.imul(rotl(Math.imul(this.s1, 5), 7), 9) >>> 0;
    const t = this.s1 << 9;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3, 11);
    return result;
  }
  /** Uniform in (0, 1], 53 bits: never 0, so log(u) is finite. */
  nextUniform(): number {
    const hi = this.nextU32(),
      lo = this.nextU32() >>> 11;
    return (hi * 2097152 + lo + 1) / 9007199254740992;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/** Standard normals by Box-Muller, both outputs used, in a fixed order. */
export class NormalStream {
  private spare = 0;
  private hasSpare = false;
  constructor(private readonly rng: Xoshiro128) {}
  next(): number {
    if (this.hasSpare) {
      this.hasSpare = false;
      return this.spare;
    }
    const u1 = this.rng.nextUniform(),
      u2 = this.rng.nextUniform();
    const r = Math.sqrt(-2 * Math.log(u1)),
      th = 2 * Math.PI * u2;
    this.spare = r * Math.sin(th);
    this.hasSpare = true;
    return r * Math.cos(th);
  }
}

export const INIT_STD = 0.02;

export function initWeights(c: LlamaConfig, seed: number, out: Float32Array): void {
  const { entries, total } = paramLayout(c);
  if (out.length !== total)
    throw new RangeError(`initWeights: out has ${out.length} floats, the layout needs ${total}`);
  const z = new NormalStream(new Xoshiro128(seed));
  for (const e of entries) {
    const dst = out.subarray(e.offset, e.offset + e.size);
    if (e.shape.length === 1) {
      dst.fill(1);
      continue;
    } // norm weights: ones
    for (let i = 0; i < dst.length; i++) dst[i] = INIT_STD * z.next();
  }
}
