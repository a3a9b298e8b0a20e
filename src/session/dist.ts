/**
 * A session across the processes of an MPI job (--dist mpi, A9): process 0 (the leader) runs the session as one
 * process would (plan, resume, Hub, --out, checkpoints, validation, export) and drives the others (followers)
 * with one command at a time, broadcast from process 0: start (the plan's figures and the starting state), step,
 * verify (A11: compare a checksum of the weights and moments before a checkpoint is written), end (every process
 * finalizes MPI and exits with the leader's code). A follower writes nothing to disk: it builds its ranks, trains
 * the steps it is told to, and holds its own copy of the weights and moments, bit-identical to the leader's (A10).
 *
 * Agreement (A11): before any work, every process's run config and code version are compared with process 0's;
 * at the start command, the mix fingerprint too. A difference is refused on every process (exit 2), naming the
 * first differing setting and the process.
 *
 * Multi-host, module by module (`mpirun -np H node dist/main.js --dist mpi --world T`; paths under src/):
 *
 * START
 *   1. main.ts → run.ts runSession refuses a process that an MPI launcher started without --dist mpi
 *      (mpi/world.ts refuseLaunchWithoutDist, A9), then run.ts runMpi: mpi/world.ts initMpi loads the binding
 *      (native/mpi.c, which loads libmpi.so.40 at run time) and every process joins one DistLink (this file).
 *   2. agreement: this file's agreeOnConfig (the flags and the code version, A11); the followers then wait in
 *      follow() for process 0's commands.
 *   3. process 0 plans the run alone (session/setup.ts: resume, Hub, --out) and sends `start`: the plan's
 *      figures and the starting weights, moments and position (this file's start; the mix fingerprint is
 *      compared here too). Every process builds its own T ranks (actors/coordinator.ts, actors/rank.ts).
 *
 * EACH STEP
 *   4. session/loop.ts (its s.dist branches) sends `step` (this file's step); every process runs
 *      actors/coordinator.ts step with its ranks: jobLosses gathers every process's micro-batch losses and stop
 *      flag (mpi/world.ts allgather); reduce sums this process's slots into slot 0 (actors/rank.ts), then
 *      mpi/world.ts reduceScatterSum (float64, each element summed once, by its block's owner) and allgather
 *      (the float32 blocks), over native/mpi.c on libuv's thread pool. Every process then takes the same
 *      decision (optim/optim.ts decideStep) and applies the same AdamW.
 *   5. before every checkpoint and the export: `verify` (this file; called from session/loop.ts and
 *      session/finish.ts): the processes compare a sha256 of their weights and moments (stateChecksum) and stop
 *      on a difference (A11).
 *
 * END
 *   6. `end` carries process 0's exit code to every process (this file's end); a signal to any process stops
 *      the job at the next step (session/stop.ts, through the stop flag of step 4); a process that fails
 *      mid-step ends the job with MPI_Abort (run.ts runMpi).
 */
import * as crypto from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";
import { UserError } from "../errors";
import { activationBudget, nativeChoice, type RunConfig } from "../config";
import type { MpiWorld } from "../mpi/world";
import type { LlamaConfig } from "../model/llama-config";
import { readManifest } from "../data/manifest";
import { mixFingerprint } from "../data/fingerprint";
import { Coordinator } from "../actors/coordinator";
import { checksumReported } from "../actors/injected-faults";
import type { LrShape, OptimizerPosition } from "../optim/optim";
import { type BackendName, webgpuRanks } from "../model/backend";
import { stopRequested } from "./stop";

const CMD_START = 1,
  CMD_STEP = 2,
  CMD_VERIFY = 3,
  CMD_END = 4;
/** Bytes of one process's status in an agreement or verification round. */
const STATUS_BYTES = 1024;

/** What a follower needs from the leader's plan to train the same steps. */
export interface StartDoc {
  model: LlamaConfig;
  root: string;
  fingerprint: string;
  lrShape: LrShape;
  startStep: number;
  pos: OptimizerPosition;
}

/** The settings every process must share (A11): the config and the code that runs it. */
function agreementDoc(cfg: RunConfig): Record<string, unknown> {
  return { ...cfg, code: codeVersion() };
}

let codeHash: string | null = null;
/** A digest of the compiled trainer: every .js under dist/src, its path and its bytes (16 hex digits). */
export function codeVersion(): string {
  if (codeHash) return codeHash;
  const h = crypto.createHash("sha256");
  const top = path.join(__dirname, "..");
  const walk = (d: string): void => {
    for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const f = path.join(d, e.name);
      if (e.isDirectory()) walk(f);
      else if (e.name.endsWith(".js")) h.update(path.relative(top, f)).update(fs.readFileSync(f));
    }
  };
  walk(top);
  codeHash = h.digest("hex").slice(0, 16);
  return codeHash;
}

/** The first setting in which `mine` differs from `theirs`, as "--flag X (process 0: Y)", or null. */
export function firstDifference(mine: Record<string, unknown>, theirs: Record<string, unknown>): string | null {
  const keys = [...new Set([...Object.keys(theirs), ...Object.keys(mine)])];
  for (const k of keys) {
    const a = JSON.stringify(mine[k]),
      b = JSON.stringify(theirs[k]);
    if (a === b) continue;
    const name = k === "code" ? "code version" : `--${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
    return `${name} ${a ?? "unset"} (process 0: ${b ?? "unset"})`;
  }
  return null;
}

const enc = new TextEncoder(),
  dec = new TextDecoder();

/** The MPI side of a session: the leader's commands and the rounds every process takes part in. */
export class DistLink {
  private readonly cmd = new Int32Array(4);
  /** A collective of a step is under way: a failure now must abort the job (the others wait inside it). */
  inStep = false;
  /** The last failure came from a round every process took part in: every process throws it; no command follows. */
  allKnow = false;

  constructor(readonly mpi: MpiWorld) {}

  get leader(): boolean {
    return this.mpi.rank === 0;
  }

  /** Bytes broadcast from process 0 (its `data`; the others' argument is ignored). */
  private async bcastBytes(data: Uint8Array | null): Promise<Uint8Array> {
    const n = new Int32Array([data?.length ?? 0]);
    await this.mpi.bcast(n, 0);
    const buf = this.leader ? data! : new Uint8Array(n[0]);
    await this.mpi.bcast(buf, 0);
    return buf;
  }

  /** Every process's status string (at most STATUS_BYTES of UTF-8), in process order. */
  private async allStatuses(mine: string): Promise<string[]> {
    const send = new Uint8Array(STATUS_BYTES);
    send.set(enc.encode(mine).subarray(0, STATUS_BYTES));
    const recv = new Uint8Array(STATUS_BYTES * this.mpi.size);
    await this.mpi.allgather(send, recv);
    const out: string[] = [];
    for (let p = 0; p < this.mpi.size; p++)
      out.push(dec.decode(recv.subarray(p * STATUS_BYTES, (p + 1) * STATUS_BYTES)).replace(/\0+$/, ""));
    return out;
  }

  /** A round in which each process reports "" (agrees) or a difference; refused on every process when one differs (A11). */
  private async agreeOn(what: string, difference: string | null): Promise<void> {
    const all = await this.allStatuses(difference ?? "");
    const p = all.findIndex((s) => s !== "");
    if (p < 0) return;
    this.allKnow = true;
    throw new UserError(
      "A11",
      `process ${p} of ${this.mpi.size} disagrees with process 0 on the ${what}: ${all[p]}. Start every process with the same flags and the same build (the same mpirun command line)`,
    );
  }

  /** A11, before any work: every process's config and code version against process 0's. */
  async agreeOnConfig(cfg: RunConfig): Promise<void> {
    const mine = agreementDoc(cfg);
    const theirs = JSON.parse(
      dec.decode(await this.bcastBytes(this.leader ? enc.encode(JSON.stringify(mine)) : null)),
    ) as Record<string, unknown>;
    await this.agreeOn("run config", this.leader ? null : firstDifference(mine, theirs));
  }

  private async command(op: number, arg = 0): Promise<void> {
    this.cmd.set([op, arg, 0, 0]);
    await this.mpi.bcast(this.cmd, 0);
  }

  // ------------------------------------------------------------------ the leader's side

  /** Leader: the plan's figures, the mix agreement (A11), then the starting weights and moments (resume or init). */
  async start(doc: StartDoc, coord: Coordinator): Promise<void> {
    await this.command(CMD_START);
    await this.bcastBytes(enc.encode(JSON.stringify(doc)));
    await this.agreeOn("mix", null);
    await this.sendState(coord);
  }

  private async sendState(coord: Coordinator): Promise<void> {
    for (const v of [coord.views.params, coord.views.m, coord.views.v]) await this.mpi.bcast(v, 0);
  }

  /** Leader: the followers run step `step` with it. */
  async step(step: number): Promise<void> {
    await this.command(CMD_STEP, step);
  }

  /** A11, before checkpoint `step` is written: every process's weights and moments against process 0's. */
  async verify(step: number, coord: Coordinator): Promise<string> {
    await this.command(CMD_VERIFY, step);
    return this.compareWeights(step, coord);
  }

  /** The checksum every process holds at `step`; throws on every process when one differs. */
  private async compareWeights(step: number, coord: Coordinator): Promise<string> {
    const mine = stateChecksum(coord);
    const all = await this.allStatuses(checksumReported(this.mpi.rank, step, mine));
    const p = all.findIndex((s) => s !== all[0]);
    if (p < 0) return all[0];
    this.allKnow = true;
    throw new Error(
      `at step ${step} the weights of process ${p} (checksum ${all[p]}) differ from process 0's (${all[0]}): the processes have diverged; nothing of step ${step} is written or published (A11)`,
    );
  }

  /** Leader: every process ends with `code` (the followers finalize MPI and exit). */
  async end(code: number): Promise<void> {
    await this.command(CMD_END, code);
  }

  // ------------------------------------------------------------------ a follower's side

  /** Follower: obey the leader until it ends the job; returns the exit code. Writes nothing to disk. */
  async follow(cfg: RunConfig, backend: BackendName): Promise<number> {
    let coord: Coordinator | null = null;
    let pos: OptimizerPosition | null = null;
    let lrShape: LrShape | null = null;
    try {
      for (;;) {
        await this.mpi.bcast(this.cmd, 0);
        const [op, arg] = [this.cmd[0], this.cmd[1]];
        if (op === CMD_END) return arg;
        if (op === CMD_START) {
          const doc = JSON.parse(dec.decode(await this.bcastBytes(null))) as StartDoc;
          const fp = mixFingerprint(doc.root, readManifest(doc.root));
          await this.agreeOn(
            "mix",
            fp === doc.fingerprint
              ? null
              : `mix fingerprint ${fp.slice(0, 16)} of ${doc.root} (process 0: ${doc.fingerprint.slice(0, 16)})`,
          );
          coord = await this.followerRanks(cfg, backend, doc);
          ({ pos, lrShape } = doc);
        } else if (op === CMD_STEP) {
          this.inStep = true;
          await coord!.step(arg, pos!, cfg.lr, lrShape!);
          this.inStep = false;
        } else if (op === CMD_VERIFY) {
          await this.compareWeights(arg, coord!);
        } else throw new Error(`unknown command ${op} from process 0`);
      }
    } finally {
      await coord?.close();
    }
  }

  private async followerRanks(cfg: RunConfig, backend: BackendName, doc: StartDoc): Promise<Coordinator> {
    const coord = Coordinator.create({
      world: cfg.world,
      model: doc.model,
      gradCkpt: cfg.gradCkpt,
      activationBudgetBytes: activationBudget(cfg).bytes,
      backend,
      native: nativeChoice(cfg),
      gpus: webgpuRanks(backend, cfg.world, cfg.gpus),
      fold: cfg.webgpuFold,
      fault: null,
      mpi: this.mpi,
      stopAsked: () => stopRequested() !== null, // O3: a signal to this process stops the job at process 0's next step
      data: {
        root: doc.root,
        seqLen: cfg.seqLen,
        dataSeed: cfg.dataSeed,
        microBatch: cfg.microBatch,
        accum: cfg.accum,
        nVal: 0,
      },
    });
    for (const v of [coord.views.params, coord.views.m, coord.views.v]) await this.mpi.bcast(v, 0);
    await coord.spawn();
    return coord;
  }
}

/** A checksum of this process's weights and AdamW moments (A11). */
export function stateChecksum(coord: Coordinator): string {
  const h = crypto.createHash("sha256");
  for (const v of [coord.views.params, coord.views.m, coord.views.v])
    h.update(new Uint8Array(v.buffer, v.byteOffset, v.byteLength));
  return h.digest("hex").slice(0, 32);
}
