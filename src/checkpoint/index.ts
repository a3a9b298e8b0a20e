/**
 * The checkpoint module: it owns the checkpoint's lifecycle. A checkpoint is the run's stateful parts
 * (stateful.ts: each part defines its state, its one validator per field and its restore next to the code
 * that owns it), saved and restored by one manager (manager.ts). It sits below the actors, the Hub cycle
 * and the session: it imports only src/errors.ts, src/model, src/data and src/optim.
 *
 *   ckpt/checkpoint-{step}/ model.safetensors      fp32 master weights, HF names (M7)  (tensor-parts.ts)
 *                           optimizer.safetensors  exp_avg.{name}, exp_avg_sq.{name}  (optim/optim-state.ts)
 *                           trainer_state.json     format, step, then the parts' fields (state.ts):
 *                                                    optimizer  opt_steps, skipped_steps  (optim/optim-state.ts)
 *                                                    scaler     scaler                    (optim/optim-state.ts)
 *                                                    LR         lr_shape                  (optim/optim-state.ts)
 *                                                    data       seqs_per_step             (data/cursor.ts)
 *                                                    log        log_history               (state.ts)
 *                           cursor.json            the data position (C1, data/cursor.ts)
 *                           config.json            HF LlamaConfig
 *                           run_config.json        the validated run config it was trained with
 *                           manifest.json          size + sha256 of every other file (K7), written last
 *   latest.json                                    the Hub pointer at the newest verified checkpoint (R2)
 *
 * The lifecycle, file by file:
 *
 * SAVE (every --push-every-steps steps, and at the step a stop signal ends on: K1, O3)
 *   1. session/loop.ts asks session/in-flight.ts (CheckpointsInFlight.checkpoint) at the step boundary;
 *      its manager (checkpointManagerOf: the session's parts) gives the documents: manager.ts documents →
 *      state.ts assembleTrainerState (each part's stateDict, in order, checked with the reader's rules).
 *   2. actors/coordinator.ts stageWrite copies params | m | v into the one staging buffer and hands the job
 *      (documents + staging buffer) to the uploader's thread; training goes on.
 *   3. actors/uploader.ts write → manager.ts saveCheckpoint → save.ts writeCheckpointFolder: the tensor
 *      parts' files, the documents, manifest.json last, all in `<dir>.partial-<pid>` renamed into place (K2, K7).
 *
 * PUBLISH (with --hub-repo, on the uploader's thread, behind training: K3-K6)
 *   4. actors/uploader.ts publishLoop → hub/cycle.ts publishCheckpoint: one commit of the folder → verify
 *      every file against the Hub → latest.json (state.ts makePointer, pointerBytes) written and read back
 *      → prune. Transient Hub failures are retried with backoff (hub/retry.ts, K6).
 *   5. session/in-flight.ts takes the uploader's reports; a failed write (O5) or publication (K4) becomes
 *      the refusal that says what is saved and the command to continue.
 *
 * RESUME (--resume DIR or --resume auto: R1-R6)
 *   6. session/setup.ts finds the folder: --resume DIR proves it against its manifest (load.ts
 *      verifyCheckpointFolder, K7); --resume auto asks the Hub (hub/resume.ts resolveAutoResume: latest.json,
 *      proven, downloaded and verified). Then, before any work, it checks the folder against the plan: the
 *      cursor (data/cursor.ts validateResume, C3), the trainer state (load.ts readTrainerState → state.ts
 *      parseTrainerState: the parts' validators; optim/optim-state.ts checkHorizon, P5), the model's shape
 *      (M2) and the run config (P7).
 *   7. run.ts startingPoint → manager.ts restore: load.ts readCheckpointFolder (each tensor part's file into
 *      the shared views) → state.ts restoreTrainerState (every part's check, then every part's loadStateDict).
 */
export * from "./names";
export * from "./state";
export * from "./save";
export * from "./load";
export * from "./stateful";
export * from "./manager";
export * from "./tensor-parts";
