/**
 * Test-only builders for the Hub tests: a checkpoint folder in the layout of src/checkpoint/names.ts with real (tiny)
 * safetensors, the pointer that names it, and a real LocalHub on an ephemeral loopback port.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { encodeSafetensors } from "../../src/model/safetensors";
import { checkpointRepoPath, type LogEntry, type TrainerState } from "../../src/checkpoint";
import * as os from "node:os";
import { before, after, beforeEach } from "node:test";
import { LocalHub, type LocalHubOptions } from "../../src/hub/server";
import { createHubClient, type HubClient, type HubClientOptions, type Pointer } from "../../src/hub/client";
import { publishCheckpoint, type PublishOptions } from "../../src/hub/cycle";

export interface FakeCheckpointOptions {
  step: number;
  seqLen?: number;
  seqsPerStep?: number;
  loss?: number;
  /** Values in model.safetensors (default 64) — raise it to make the file bigger. */
  modelValues?: number;
  fingerprint?: string;
  seed?: number;
}

/** A fake checkpoint folder on disk and its pointer (writeFakeCheckpoint). */
export type FakeCk = Pointer & { dir: string };

/** Writes ckpt-style files into dir: model/optimizer safetensors, trainer_state, cursor, config. */
export function writeFakeCheckpoint(dir: string, o: FakeCheckpointOptions): FakeCk {
  const seqLen = o.seqLen ?? 16;
  const sps = o.seqsPerStep ?? 8;
  const fingerprint = o.fingerprint ?? "f".repeat(64);
  const seed = o.seed ?? 20260919;
  const n = o.modelValues ?? 64;
  fs.mkdirSync(dir, { recursive: true });
  const w = new Float32Array(n).map((_, i) => Math.sin(i + o.step));
  fs.writeFileSync(
    path.join(dir, "model.safetensors"),
    encodeSafetensors([{ name: "model.embed_tokens.weight", dtype: "F32", shape: [n / 8, 8], data: w }]),
  );
  fs.writeFileSync(
    path.join(dir, "optimizer.safetensors"),
    encodeSafetensors([
      { name: "exp_avg.model.embed_tokens.weight", dtype: "F32", shape: [n], data: w.map((x) => x / 10) },
      { name: "exp_avg_sq.model.embed_tokens.weight", dtype: "F32", shape: [n], data: w.map((x) => x * x) },
    ]),
  );
  const state: TrainerState = {
    format: "tstrain-trainer-state/1",
    step: o.step,
    opt_steps: o.step,
    skipped_steps: 0,
    scaler: { scale: 65536, growthTracker: 0 },
    lr_shape: { warmup: 0, decayStart: 0, total: o.step },
    seqs_per_step: sps,
    log_history: [logEntry(o.step - 1, (o.loss ?? 3) + 0.1), logEntry(o.step, o.loss ?? 3)],
  };
  fs.writeFileSync(path.join(dir, "trainer_state.json"), JSON.stringify(state));
  fs.writeFileSync(
    path.join(dir, "cursor.json"),
    JSON.stringify({
      seq_len: seqLen,
      samples_consumed: o.step * sps,
      shuffle_seed: seed,
      dataset_files_sha: fingerprint,
      shuffle_perm_sha: "c".repeat(64),
      step: o.step,
    }),
  );
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify({ model_type: "llama", hidden_size: 8 }));
  return {
    dir,
    path_in_repo: checkpointRepoPath(o.step),
    step: o.step,
    samples_consumed: o.step * sps,
    tokens_consumed: o.step * sps * seqLen,
    fingerprint,
    seed,
  };
}

function logEntry(step: number, loss: number): LogEntry {
  return { step, loss, lr: 1e-3, grad_norm: 1, loss_scale: 65536, skipped_steps: 0, tok_per_s: 0, elapsed_s: 0 };
}

export function pointerOf(p: Pointer & { dir?: string }): Pointer {
  return {
    path_in_repo: p.path_in_repo,
    step: p.step,
    samples_consumed: p.samples_consumed,
    tokens_consumed: p.tokens_consumed,
    fingerprint: p.fingerprint,
    seed: p.seed,
  };
}

/**
 * publishCheckpoint of `ck` (its folder, its path in the repo, its pointer) with no prune and no disk guard, its
 * log lines into `lines`; `extra` overrides any option.
 */
export function publishNext(store: HubClient, ck: FakeCk, lines: string[] = [], extra: Partial<PublishOptions> = {}) {
  return publishCheckpoint(store, {
    localDir: ck.dir,
    pathInRepo: ck.path_in_repo,
    pointer: pointerOf(ck),
    prune: false,
    minFreeGb: 0,
    log: (l) => lines.push(l),
    ...extra,
  });
}

// ---- a LocalHub on loopback plus stores pointed at it ------------------------------------------

export interface TestHub {
  hub: LocalHub;
  url: string;
  /** A scratch directory for local checkpoints; removed by close(). */
  tmp: string;
  store(o?: Partial<HubClientOptions>): HubClient;
  close(): Promise<void>;
}

export async function startTestHub(
  o: Partial<LocalHubOptions> & { repo?: string; repoType?: "dataset" | "model" } = {},
): Promise<TestHub> {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-hub-"));
  const hub = new LocalHub({ dir: path.join(tmp, "hub"), ...o });
  const url = await hub.start();
  return {
    hub,
    url,
    tmp,
    store: (s = {}) =>
      createHubClient({
        hubUrl: url,
        repo: o.repo ?? "tester/run",
        repoType: o.repoType ?? "dataset",
        timeoutMs: 10_000,
        ...s,
      }),
    close: async () => {
      await hub.stop();
      fs.rmSync(tmp, { recursive: true, force: true });
    },
  };
}

/**
 * The suite hooks every Hub test file needs: one LocalHub for the file (started before its tests, stopped and its
 * folder removed after them), with any planted fault cleared before each test. `set` receives the hub once started.
 */
export function useTestHub(o: Parameters<typeof startTestHub>[0], set: (th: TestHub) => void): void {
  let th: TestHub | undefined;
  before(async () => {
    th = await startTestHub(o);
    set(th);
  });
  after(async () => {
    await th?.close();
  });
  beforeEach(() => th?.hub.clearFaults());
}
