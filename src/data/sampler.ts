/**
 * Which window each (step, rank, micro, row) reads (D6, P6).
 *
 * The rule, in one place:
 *   S = seqs_per_step = microBatch * world * accum.
 *   Step s owns permutation indices [s*S, (s+1)*S).
 *   Within step s, row `row` of micro-batch `micro` on rank `rank` reads permutation index
 *     p = s*S + (micro*world + rank)*microBatch + row,
 *   and the window perm.at(p).
 * So micro-batch m of every rank is a contiguous block of world*microBatch indices, ranks interleave
 * inside it, and any world/accum split with the same S reads the same windows in the same global
 * (permutation-index) order. Indices are never reused and never wrap: p >= n is refused (D6).
 */
import { UserError } from "../errors";
import type { WindowPermutation } from "./permutation";
import type { PackedTokenStore } from "./token-store";

export interface Geometry {
  world: number;
  accum: number;
  microBatch: number;
  seqLen: number;
}

function positiveInt(name: string, v: number): void {
  if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`Geometry.${name} must be a positive integer, got ${v}`);
}

export function checkGeometry(g: Geometry): void {
  positiveInt("world", g.world);
  positiveInt("accum", g.accum);
  positiveInt("microBatch", g.microBatch);
  positiveInt("seqLen", g.seqLen);
}

export function seqsPerStep(g: Geometry): number {
  checkGeometry(g);
  return g.microBatch * g.world * g.accum;
}

export function permIndex(step: number, rank: number, micro: number, row: number, g: Geometry): number {
  const S = seqsPerStep(g);
  if (!Number.isSafeInteger(step) || step < 0)
    throw new RangeError(`permIndex: step ${step} must be a whole number >= 0`);
  if (!Number.isSafeInteger(rank) || rank < 0 || rank >= g.world)
    throw new RangeError(`permIndex: rank ${rank} outside [0, world=${g.world})`);
  if (!Number.isSafeInteger(micro) || micro < 0 || micro >= g.accum)
    throw new RangeError(`permIndex: micro ${micro} outside [0, accum=${g.accum})`);
  if (!Number.isSafeInteger(row) || row < 0 || row >= g.microBatch)
    throw new RangeError(`permIndex: row ${row} outside [0, microBatch=${g.microBatch})`);
  return step * S + (micro * g.world + rank) * g.microBatch + row;
}

/** The training stream: windows of the permutation, split across ranks and micro-batches by permIndex. */
export class TrainStream {
  readonly store: PackedTokenStore;
  readonly perm: WindowPermutation;
  readonly g: Geometry;

  constructor(store: PackedTokenStore, perm: WindowPermutation, g: Geometry) {
    checkGeometry(g);
    const n = store.numWindows(g.seqLen);
    if (perm.n !== n) {
      throw new UserError(
        "D4",
        `the permutation covers ${perm.n} windows but the train split holds ${n} windows of ${g.seqLen} tokens: build the permutation from store.numWindows(seqLen)`,
      );
    }
    this.store = store;
    this.perm = perm;
    this.g = g;
  }

  /** The window index for one row; refuses (D6) rather than wrap into a second epoch. */
  windowFor(step: number, rank: number, micro: number, row: number): number {
    const p = permIndex(step, rank, micro, row, this.g);
    if (p >= this.perm.n) {
      throw new UserError(
        "D6",
        `step ${step} needs permutation index ${p} but the train split has only ${this.perm.n} windows: the epoch never wraps; plan fewer steps (checkNoWrap refuses this before step 1)`,
      );
    }
    return this.perm.at(p);
  }

  /** Micro-batch `micro` of rank `rank` at step `step`: microBatch rows of seqLen tokens, row-major. */
  readMicroBatch(step: number, rank: number, micro: number, out?: Int32Array): Int32Array {
    const { microBatch, seqLen } = this.g;
    const buf = out ?? new Int32Array(microBatch * seqLen);
    if (buf.length < microBatch * seqLen)
      throw new RangeError(`readMicroBatch: out has ${buf.length} slots, needs ${microBatch * seqLen}`);
    for (let row = 0; row < microBatch; row++) {
      this.store.readWindow(this.windowFor(step, rank, micro, row), seqLen, buf, row * seqLen);
    }
    return buf;
  }
}

/** Validation stream (D7): the val split's first nVal windows, in order, never shuffled. */
export class ValStream {
  readonly store: PackedTokenStore;
  readonly seqLen: number;
  readonly nVal: number;

  constructor(store: PackedTokenStore, seqLen: number, nVal: number) {
    const avail = store.numWindows(seqLen);
    if (!Number.isSafeInteger(nVal) || nVal < 1 || nVal > avail) {
      throw new UserError(
        "D7",
        `validation asks for ${nVal} windows of ${seqLen} tokens but the val split holds ${avail}; use valWindowCount() to size it`,
      );
    }
    this.store = store;
    this.seqLen = seqLen;
    this.nVal = nVal;
  }

  read(index: number, out?: Int32Array): Int32Array {
    if (!Number.isSafeInteger(index) || index < 0 || index >= this.nVal)
      throw new RangeError(`ValStream.read: index ${index} outside [0, nVal=${this.nVal})`);
    const buf = out ?? new Int32Array(this.seqLen);
    this.store.readWindow(index, this.seqLen, buf, 0);
    return buf;
  }
}
