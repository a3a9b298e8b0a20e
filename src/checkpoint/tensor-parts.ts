/**
 * The tensor parts of a checkpoint (stateful.ts, TensorPart), in the order their files are written: the
 * model's fp32 master weights (model.safetensors, HF names, M7) and AdamW's moments (optim/optim-state.ts).
 */
import { flatToTensors, tensorsToFlat } from "../model/safetensors";
import { MOMENTS_PART } from "../optim/optim-state";
import { MODEL_FILE } from "./names";
import type { TensorPart } from "./stateful";

/** The model's weights: model.safetensors, one tensor per parameter under its HF name. */
export const WEIGHTS_PART: TensorPart = {
  file: MODEL_FILE,
  stateDict: (cfg, t) => flatToTensors(cfg, t.params),
  loadStateDict: (cfg, saved, into) => tensorsToFlat(cfg, saved, into.params),
};

export const TENSOR_PARTS: readonly TensorPart[] = [WEIGHTS_PART, MOMENTS_PART];
