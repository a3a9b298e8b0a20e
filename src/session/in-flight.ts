/**
 * The checkpoints a session has handed over and not yet seen land (K1-K6, B3, O5). The coordinator copies the
 * weights into one staging buffer and the uploader writes, publishes and verifies behind training; this keeps
 * the account: the write in progress (the staging copy is single), what the uploader reported, the first failure
 * and the step it belongs to, and turns a failure into the refusal that says what is saved and what to run next.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { UserError } from "../errors";
import { hfConfigJson } from "../model/llama-config";
import type { Coordinator } from "../actors/coordinator";
import type { OptimizerPosition } from "../optim/optim";
import type { CheckpointOutcome, UploaderEvent, WriteOutcome } from "../actors/protocol";
import {
  CheckpointManager,
  MANIFEST_FILE,
  checkpointDir,
  checkpointRepoPath,
  checkpointRoot,
  listCheckpointFolders,
  trainerStateParts,
  type LogEntry,
} from "../checkpoint";
import type { Reporter } from "../report";
import { cursorAt, pointerAt, type Session } from "./setup";
import { resumeCommand } from "./stop";
import { runConfigDoc } from "./resume-config";

/** The session's checkpoint manager: its position, schedule, data plan and log, the documents beside them. */
export function checkpointManagerOf(s: Session, pos: OptimizerPosition, history: LogEntry[]): CheckpointManager {
  return new CheckpointManager(
    trainerStateParts({ pos, lrShape: s.plan.lrShape, seqsPerStep: s.plan.seqsPerStep, history }),
    { cursorAt: (step) => cursorAt(s, step), hfConfig: hfConfigJson(s.model.config), runConfig: runConfigDoc(s.cfg) },
  );
}

export class CheckpointsInFlight {
  /** Every checkpoint the uploader finished with, by step. */
  readonly outcomes: CheckpointOutcome[] = [];
  /** Steps whose checkpoint is published and verified (or, without a Hub, written). */
  readonly published = new Set<number>();
  private readonly staged = new Set<number>();
  private writing: Promise<WriteOutcome> | null = null;
  private writeError: unknown = null;
  private uploadError: unknown = null;
  private failedStep = -1;
  /** The write in progress has settled (this.writing is kept until waited on). */
  private written = true;
  private waitsSaid = 0;
  private readonly manager: CheckpointManager;

  constructor(
    private readonly s: Session,
    private readonly coord: Coordinator,
    pos: OptimizerPosition,
    history: LogEntry[],
    private readonly events: UploaderEvent[],
    private readonly rep: Reporter,
  ) {
    this.manager = checkpointManagerOf(s, pos, history);
  }

  /** A write or a publication has failed: the loop stops at this step boundary. */
  get failed(): boolean {
    return Boolean(this.uploadError || this.writeError);
  }

  /** Take what the uploader reported since the last look (K6: publishing runs behind training). */
  absorb(): void {
    for (const e of this.events.splice(0)) {
      if (e.type === "published") this.landed(e.outcome);
      else if (!this.uploadError) {
        this.uploadError = Object.assign(new Error(e.error.message), e.error);
        this.failedStep = e.step;
      }
    }
  }

  /** K1: the checkpoint of step `done`, after the previous write has finished; false when something failed meanwhile. */
  async checkpoint(done: number, loss: number): Promise<boolean> {
    if (this.writing && !this.written) {
      // The ranks stand still until the previous folder is on disk: say why once, and each time how long.
      const t = performance.now();
      await this.waitWrite();
      const secs = ((performance.now() - t) / 1000).toFixed(1);
      this.rep.say(
        this.waitsSaid++ === 0
          ? `checkpoint ${done}: the ranks waited ${secs}s for checkpoint ${[...this.staged].pop()} to be written: the weights are copied into one staging buffer, which is free again only once the previous folder is on disk (a slow disk makes training wait here; later waits are one short line each)`
          : `checkpoint ${done}: the ranks waited ${secs}s for the previous checkpoint's write`,
      );
    }
    this.absorb();
    if (this.failed) return false;
    this.stage(done, loss);
    return true;
  }

  /** O3: the checkpoint of the step a signal stopped on, unless it is the resume point or already handed over. */
  async checkpointOnStop(step: number, loss: number): Promise<void> {
    if (step > this.s.start.startStep && !this.staged.has(step)) {
      await this.waitWrite();
      this.stage(step, loss);
    }
  }

  /** Everything handed to the uploader is written and published (or publishing failed for good). */
  async drain(why: string): Promise<void> {
    await this.waitWrite();
    this.rep.say(`waiting for the checkpoint uploads to finish (${why})`);
    const d = await this.coord.drainUploads();
    this.absorb();
    // The drain's account is authoritative (events travel on their own channel and may lag).
    for (const o of d.outcomes) if (!this.outcomes.some((x) => x.step === o.step)) this.landed(o);
    this.outcomes.sort((a, b) => a.step - b.step);
    if (d.failure) {
      this.uploadError = Object.assign(new Error(d.failure.error.message), d.failure.error);
      this.failedStep = d.failure.step;
    }
    if (this.s.hub && d.head) await this.s.hub.followHead(d.head); // K8: the uploader's commits are this run's own
  }

  /** After the drain: a failed write (O5) or publication (K4) becomes the refusal that says what to run next. */
  throwIfFailed(): void {
    if (this.writeError) throw this.writeRefusal(this.writeError as Error & { code?: string });
    if (this.uploadError) throw this.uploadRefusal(this.uploadError as Error);
  }

  private landed(o: CheckpointOutcome): void {
    this.outcomes.push(o);
    if (o.published?.ok || !this.s.hub) this.published.add(o.step);
  }

  private async waitWrite(): Promise<void> {
    if (!this.writing) return;
    await this.writing.catch(() => undefined);
    this.writing = null;
  }

  private stage(done: number, loss: number): void {
    const { s } = this;
    const pathInRepo = checkpointRepoPath(done);
    this.staged.add(done);
    const w: Promise<WriteOutcome> = this.coord.stageWrite({
      step: done,
      dir: checkpointDir(s.cfg.out, done),
      docs: this.manager.documents(done, loss),
      publish: s.hub ? { pathInRepo, pointer: pointerAt(s, done, pathInRepo), loss } : null,
    });
    w.catch((e) => {
      // A failed write (ENOSPC ...) is this step's; any other rejection repeats the publishing failure the drain reports.
      if ((e as Error)?.name === "CheckpointWriteError") {
        this.writeError = this.writeError ?? e;
        this.failedStep = done;
      } else if (!this.uploadError) {
        this.uploadError = e;
        this.failedStep = done;
      }
    });
    this.writing = w;
    this.written = false;
    w.then(
      () => {
        this.written = true;
      },
      () => {
        this.written = true;
      },
    );
  }

  private writeRefusal(e: Error & { code?: string }): UserError {
    const { s } = this;
    const out = s.cfg.out;
    // The error crossed a thread: only its name and message survive, so read the code from the message.
    e.code = e.code ?? /\((ENOSPC|EDQUOT|EROFS|EACCES)\)/.exec(e.message)?.[1];
    const noSpace = e.code === "ENOSPC" || e.code === "EDQUOT";
    const last = [...this.published].sort((a, b) => a - b).pop();
    const where =
      last === undefined
        ? "no checkpoint of this session is saved yet"
        : s.hub
          ? `checkpoint ${last} is verified on the Hub (latest.json points at it)`
          : `checkpoint ${last} is saved in ${checkpointRoot(out)}`;
    const next = s.hub
      ? resumeCommand("auto", noSpace ? ["--prune"] : [])
      : last !== undefined
        ? resumeCommand(checkpointDir(out, last))
        : null;
    return new UserError(
      "O5",
      `${e.message}. Training stopped at step ${this.failedStep}; ${where}. ` +
        (noSpace
          ? `Free space under ${path.resolve(out)}${s.hub ? ", or let the run make room by removing local copies already verified on the Hub (--prune)" : ""}`
          : "Fix the folder") +
        (next ? `, then continue with: ${next}` : ", then run the same command again"),
    );
  }

  /** The newest complete local checkpoint of this session that the Hub does not hold verified: the best resume point. */
  private newerLocalCopy(): { step: number; dir: string } | null {
    const onHub = Math.max(this.s.start.startStep, ...this.published);
    const local = listCheckpointFolders(checkpointRoot(this.s.cfg.out)).filter(
      (c) => c.step > onHub && fs.existsSync(path.join(c.dir, MANIFEST_FILE)),
    );
    const newest = local[local.length - 1];
    return newest ? { step: newest.step, dir: newest.dir } : null;
  }

  private uploadRefusal(e: Error): UserError {
    const msg = e.message.replace(/ \[(K\d|R\d)\]$/, "").replace(/\.$/, "");
    const ruleOf = (e as { rule?: string }).rule ?? /\[(K\d)\]$/.exec(e.message)?.[1] ?? "K4";
    // The local copy is the better resume point only when the Hub does not hold that checkpoint verified: not
    // after a mismatch (K4: the advised --resume auto ignores the failed folder), not when only the pointer
    // failed (--resume auto rolls forward onto the verified folder, on any machine, R5).
    const pointerOnly = / is verified on the Hub at .* but latest\.json could not be moved to it/.test(e.message);
    const local = e.name === "CheckpointVerifyError" || pointerOnly ? null : this.newerLocalCopy();
    const advice =
      e.name === "ConcurrentWriterError"
        ? ""
        : local
          ? ` Continue from the local copy of checkpoint ${local.step} with: ${resumeCommand(local.dir)} (--resume auto would restart from the Hub's last verified checkpoint and redo the steps since)`
          : ` Continue with: ${resumeCommand("auto")}${e.name === "CheckpointVerifyError" ? " (it resumes from the last verified checkpoint; the failed folder is ignored and overwritten)" : ""}`;
    return new UserError(
      ruleOf,
      `checkpoint ${this.failedStep} failed: ${msg}. Training stopped at the next step boundary; the local copy is kept and latest.json was not moved past verified bytes.${advice}`,
    );
  }
}
