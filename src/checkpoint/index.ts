/**
 * The checkpoint module: the layout and names (names.ts), what each JSON document means and its one
 * parser (state.ts), the atomic write (write.ts) and the checked read (read.ts). It sits below the
 * actors, the Hub cycle and the session: it imports only src/errors.ts, src/model and src/data.
 *
 *   ckpt/checkpoint-{step}/ model.safetensors      fp32 master weights, HF names (M7)
 *                           optimizer.safetensors  exp_avg.{name}, exp_avg_sq.{name} (fp32)
 *                           trainer_state.json     step, optimizer steps, scaler, LR shape, log history
 *                           cursor.json            the data position (C1)
 *                           config.json            HF LlamaConfig
 *                           run_config.json        the validated run config it was trained with
 *                           manifest.json          size + sha256 of every other file (K7), written last
 *   latest.json                                    the Hub pointer at the newest verified checkpoint (R2)
 */
export * from "./names";
export * from "./state";
export * from "./save";
export * from "./load";
