/**
 * The contract between the checkpoint manager (manager.ts) and every part of the run whose state a checkpoint
 * keeps (torchtitan's Stateful: state_dict() / load_state_dict()). A part's state is some fields of
 * trainer_state.json; the part lists them with the one rule each must satisfy, gives their values now, and
 * puts a checked saved state back. The part is defined next to the code that owns the state (src/optim/
 * optim-state.ts: optimizer position, scaler, LR shape; src/data/cursor.ts: the data position); the
 * manager composes them. Types only: this file imports nothing, so the owners (layer 2) can implement it.
 */

/** One field of trainer_state.json and the rule its value must satisfy; `ok` sees the whole document. */
export interface FieldRule {
  field: string;
  /** What the value must be, as a refusal quotes it ("must be a whole number >= 0"). */
  must: string;
  ok: (t: Record<string, unknown>) => boolean;
}

/** A part of the run with state a checkpoint keeps. */
export interface Stateful<S extends object = object> {
  /** What the part is, for messages. */
  readonly name: string;
  /** Its fields of trainer_state.json, in the order they are written, each with its one validator. */
  readonly fields: readonly FieldRule[];
  /** Its state now: exactly its own fields, in `fields` order. */
  stateDict(): S;
  /**
   * Refuse, with a UserError naming the rule, a saved state (its fields already passed `fields`) that cannot
   * apply to this run. Every part's check runs before any part is restored.
   */
  check?(state: S): void;
  /** Put a checked saved state back. */
  loadStateDict(state: S): void;
}

export const isWhole = (x: unknown): x is number => Number.isSafeInteger(x) && (x as number) >= 0;
export const isObject = (x: unknown): x is Record<string, unknown> =>
  typeof x === "object" && x !== null && !Array.isArray(x);
