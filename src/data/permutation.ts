/**
 * The training-window permutation (D4, D5): a keyed bijection over [0, n) that needs no O(n)
 * array, is specified here down to the bit, and so does not depend on any library version.
 *
 * Algorithm `tstrain-feistel4-fmix32-v1`:
 *   1. Domain. b = the smallest EVEN bit count with 2^b >= n and b >= 2; h = b / 2. The permutation
 *      acts on [0, 2^b), split as x = L * 2^h + R with L, R in [0, 2^h). n <= 2^52 (so h <= 26).
 *   2. Keys. D = SHA-256 of the ASCII text `tstrain-perm-v1|n=<n>|seed=<seed>` (decimal integers).
 *      Round key pair j (j = 0..3): K[j] = uint32 little-endian at byte 4j of D,
 *      M[j] = uint32 little-endian at byte 16 + 4j of D.
 *   3. Round function F_j(R), all uint32 arithmetic (Math.imul, >>> 0):
 *        x = R xor K[j];  x = (x xor (x >>> 16)) * 0x85ebca6b;  x = x xor M[j];
 *        x = (x xor (x >>> 13)) * 0xc2b2ae35;  x = x xor (x >>> 16);  F = x mod 2^h.
 *   4. One encryption E(x): four Feistel rounds, for j = 0..3: (L, R) <- (R, L xor F_j(R));
 *      result L * 2^h + R. Each round is invertible, so E is a bijection on [0, 2^b).
 *   5. Cycle walking: at(i) = E(i), then E again while the value is >= n. Because E is a bijection
 *      on the larger domain, the walk restricted to [0, n) is a bijection on [0, n); since
 *      2^b < 4n (for n >= 2), the expected walk is under 4 encryptions.
 *
 * at(i) is O(1) for any i (D5: a resume at sample s starts at at(s) with no replay).
 *
 * Identity (`shuffle_perm_sha`, D4): SHA-256 (hex) of the bytes
 *   `tstrain-feistel4-fmix32-v1\nn=<n>\nseed=<seed>\n` followed by at(0), at(1), … at(min(n, 1024) - 1)
 *   each as an unsigned 64-bit little-endian integer. A change to any step of the algorithm changes
 *   the first indices, and so the sha: a resumed run onto a different order is refused (C3).
 */
import { createHash } from "node:crypto";
import { UserError } from "../errors";

export const PERM_ALGORITHM = "tstrain-feistel4-fmix32-v1";
/** Largest window count the permutation accepts: keeps every value an exact double. */
export const MAX_PERM_N = 2 ** 52;
const ROUNDS = 4;
const SHA_PREFIX_INDICES = 1024;

function checkArgs(n: number, seed: number): void {
  if (!Number.isSafeInteger(n) || n < 1 || n > MAX_PERM_N) {
    throw new UserError(
      "D4",
      `window permutation needs a whole window count in [1, 2^52], got n=${n}: the mix holds no full window at this seq_len; lower --seq-len or build a larger mix`,
    );
  }
  if (!Number.isSafeInteger(seed) || seed < 0) {
    throw new UserError("D4", `--data-seed must be a non-negative whole number (got ${seed})`);
  }
}

export class WindowPermutation {
  readonly n: number;
  readonly seed: number;
  /** Half-width h in bits; the Feistel domain is [0, 2^(2h)). */
  readonly halfBits: number;
  private readonly half: number; // 2^h
  private readonly mask: number; // 2^h - 1 (h <= 26, so a 32-bit mask works)
  private readonly k = new Uint32Array(ROUNDS);
  private readonly m = new Uint32Array(ROUNDS);

  constructor(n: number, seed: number) {
    checkArgs(n, seed);
    this.n = n;
    this.seed = seed;
    let bits = 2;
    while (2 ** bits < n) bits += 2;
    this.halfBits = bits / 2;
    this.half = 2 ** this.halfBits;
    this.mask = this.half - 1;
    const d = createHash("sha256").update(`tstrain-perm-v1|n=${n}|seed=${seed}`, "ascii").digest();
    for (let j = 0; j < ROUNDS; j++) {
      this.k[j] = d.readUInt32LE(4 * j);
      this.m[j] = d.readUInt32LE(16 + 4 * j);
    }
  }

  private round(j: number, r: number): number {
    let x = (r ^ this.k[j]) >>> 0;
    x = Math.imul(x ^ (x >>> 16), 0x85ebca6b) >>> 0;
    x = (x ^ this.m[j]) >>> 0;
    x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35) >>> 0;
    x = (x ^ (x >>> 16)) >>> 0;
    return x & this.mask;
  }

  private encrypt(x: number): number {
    let l = Math.floor(x / this.half);
    let r = x - l * this.half;
    for (let j = 0; j < ROUNDS; j++) {
      const t = r;
      r = (l ^ this.round(j, r)) & this.mask;
      l = t;
    }
    return l * this.half + r;
  }

  /** The window visited at permutation index i, 0 <= i < n. O(1) expected. */
  at(i: number): number {
    if (!Number.isSafeInteger(i) || i < 0 || i >= this.n) {
      throw new RangeError(`WindowPermutation.at: index ${i} outside [0, ${this.n})`);
    }
    let y = this.encrypt(i);
    while (y >= this.n) y = this.encrypt(y);
    return y;
  }
}

/** `shuffle_perm_sha` (D4): identifies the visit order from (algorithm, n, seed). */
export function permSha(n: number, seed: number): string {
  const p = new WindowPermutation(n, seed);
  const count = Math.min(n, SHA_PREFIX_INDICES);
  const buf = Buffer.alloc(8 * count);
  for (let i = 0; i < count; i++) buf.writeBigUInt64LE(BigInt(p.at(i)), 8 * i);
  return createHash("sha256").update(`${PERM_ALGORITHM}\nn=${n}\nseed=${seed}\n`, "ascii").update(buf).digest("hex");
}
