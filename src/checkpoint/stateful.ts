/**
 * The contract between the checkpoint manager (manager.ts) and every part of the run whose state a checkpoint
 * keeps (torchtitan's Stateful: state_dict() / load_state_dict()). Two kinds:
 *
 * - Stateful: its state is some fields of trainer_state.json; the part lists them with the one rule each must
 *   satisfy, gives their values now, and puts a checked saved state back (optim/optim-state.ts: optimizer
 *   steps, scaler, LR shape; data/cursor.ts: the data plan; state.ts: the log).
 * - TensorPart: its state is tensors, one safetensors file (tensor-parts.ts: the model's weights;
 *   optim/optim-state.ts: AdamW's moments). A tensor part has no live object: the tensors are written on the
 *   uploader's thread from the staging copy, so a part maps the flat arrays to the file's tensors and back.
 *
 * Types only (the owners, in layer 2, implement them).
 */
import type { LlamaConfig } from "../model/llama-config";
import type { StTensor } from "../model/safetensors";

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

/** The tensors of a checkpoint, flat fp32 in the parameter layout's order: the weights and AdamW's two moments. */
export interface CheckpointTensors {
  params: Float32Array;
  m: Float32Array;
  v: Float32Array;
}

/** A part whose state is the tensors of one safetensors file of the checkpoint. */
export interface TensorPart {
  /** The file, e.g. model.safetensors. */
  readonly file: string;
  /** Its tensors under their saved names, in the order they are written (which fixes the file's bytes). */
  stateDict(cfg: LlamaConfig, t: CheckpointTensors): StTensor[];
  /** Put the file's tensors back into `into`; a missing tensor is a UserError naming the file in `dir` (K2). */
  loadStateDict(cfg: LlamaConfig, saved: Map<string, StTensor>, into: CheckpointTensors, dir: string): void;
}

export const isWhole = (x: unknown): x is number => Number.isSafeInteger(x) && (x as number) >= 0;
export const isObject = (x: unknown): x is Record<string, unknown> =>
  typeof x === "object" && x !== null && !Array.isArray(x);
