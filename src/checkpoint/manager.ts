/**
 * The checkpoint manager (torchtitan's CheckpointManager): it saves and restores a list of stateful parts
 * (stateful.ts), each defining its own state, validation and restore next to the code that owns it, and
 * the tensor parts (tensor-parts.ts: fp32 master weights, AdamW's moments) through save.ts and load.ts. The session builds one per run
 * (session/in-flight.ts, checkpointManagerOf) and calls it to save and to resume; the uploader calls
 * saveCheckpoint on its own thread (a manager does not cross threads: the documents and tensors do).
 */
import type { LlamaConfig } from "../model/llama-config";
import type { LrShape, OptimizerPosition } from "../optim/optim";
import { lrStateful, optimizerStateful, scalerStateful } from "../optim/optim-state";
import { dataStateful } from "../data/cursor";
import { readCheckpointFolder } from "./load";
import { writeCheckpointFolder } from "./save";
import type { CheckpointTensors, Stateful } from "./stateful";
import {
  assembleTrainerState,
  checkpointDocs,
  logStateful,
  restoreTrainerState,
  type CheckpointDocs,
  type LogEntry,
  type TrainerState,
} from "./state";

/** The parts of a training run's trainer state, in the order trainer_state.json holds them. */
export function trainerStateParts(o: {
  pos: OptimizerPosition;
  lrShape: LrShape;
  seqsPerStep: number;
  history: LogEntry[];
}): Stateful[] {
  return [
    optimizerStateful(o.pos),
    scalerStateful(o.pos),
    lrStateful(o.lrShape),
    dataStateful(o.seqsPerStep),
    logStateful(o.history),
  ];
}

export class CheckpointManager {
  constructor(
    private readonly parts: readonly Stateful[],
    private readonly other: {
      /** cursor.json of the checkpoint of `step` (data/cursor.ts, makeCursor). */
      cursorAt: (step: number) => unknown;
      /** config.json: the HF LlamaConfig. */
      hfConfig: unknown;
      /** run_config.json: the run config it was trained with. */
      runConfig: unknown;
    },
  ) {}

  /** The trainer state of the checkpoint of `step`, from the parts as they stand now (`loss`: that step's own). */
  trainerState(step: number, loss?: number): TrainerState {
    return assembleTrainerState(step, this.parts, loss);
  }

  /** Save, on the session's thread: the JSON documents of the checkpoint of `step` (K2), `loss` that step's loss. */
  documents(step: number, loss?: number): CheckpointDocs {
    return checkpointDocs({
      trainerState: this.trainerState(step, loss),
      cursor: this.other.cursorAt(step),
      hfConfig: this.other.hfConfig,
      runConfig: this.other.runConfig,
    });
  }

  /**
   * Resume: the folder's weights and moments into `into`, its trainer state (checked, K2) into the parts.
   * The folder was chosen and checked against the plan by the session's setup (manifest K7, cursor C3).
   */
  restore(dir: string, model: LlamaConfig, into: CheckpointTensors): TrainerState {
    const { state } = readCheckpointFolder(dir, model, into.params, into.m, into.v);
    restoreTrainerState(state, this.parts);
    return state;
  }
}

/** Save, on the uploader's thread: the folder of a checkpoint from its tensors and documents (atomic, K2/K7). */
export function saveCheckpoint(
  dir: string,
  model: LlamaConfig,
  tensors: CheckpointTensors,
  docs: CheckpointDocs,
): void {
  writeCheckpointFolder(dir, model, tensors.params, tensors.m, tensors.v, docs);
}
