/**
 * MPI across processes (A9): whether this process was started by an MPI launcher, the refusals that
 * keep a run from going wrong there, and the binding (native/mpi.c, build/Release/tstrain_mpi.node) that loads
 * libmpi at run time. Nothing here runs, and MPI is never loaded, unless `--dist mpi` is given.
 *
 * Every collective returns a promise and runs on a libuv pool thread (the JS thread stays free). They are queued
 * here so that exactly one is in flight at a time: every process issues the same collectives in the same order.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { UserError } from "../errors";

/** A9: the command that installs an MPI this trainer loads (Open MPI 4: libmpi.so.40). */
export const MPI_INSTALL = "apt-get install openmpi-bin";
/** Environment variable naming the libmpi to load instead of libmpi.so.40. */
export const MPI_LIB_ENV = "TSTRAIN_MPI_LIB";
/** The variables MPI launchers set to the job's process count (Open MPI's mpirun; MPICH/Hydra and Slurm's PMI). */
const LAUNCHER_SIZE_VARS = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"] as const;

/** The launcher's process count and the variable it came from, when this process was started by one with more than one process. */
export function launcherSize(env: NodeJS.ProcessEnv = process.env): { size: number; from: string } | null {
  for (const k of LAUNCHER_SIZE_VARS) {
    const n = Number(env[k]);
    if (Number.isSafeInteger(n) && n > 1) return { size: n, from: k };
  }
  return null;
}

/** The launch a resume command needs in front of `node dist/main.js`: Slurm's srun, or else Open MPI's mpirun. */
export function launchPrefix(size: number, env: NodeJS.ProcessEnv = process.env): string[] {
  const slurm = env.SLURM_STEP_ID !== undefined && env.OMPI_MCA_orte_hnp_uri === undefined;
  return slurm ? ["srun", "-n", String(size)] : ["mpirun", "-np", String(size)];
}

/**
 * A9: a process of a multi-process MPI job without `--dist mpi` would be one of H independent runs writing one
 * run folder and one Hub repo: refused before any work, with the job's command with the flag (run.ts gives the
 * advice the launcher, launchPrefix).
 */
export function refuseLaunchWithoutDist(dist: string, env: NodeJS.ProcessEnv = process.env): void {
  const l = launcherSize(env);
  if (!l || dist === "mpi") return;
  throw new UserError(
    "A9",
    `this process is one of ${l.size} started by an MPI launcher (${l.from}=${l.size}) but --dist is ${dist}: the ${l.size} processes would train ${l.size} separate runs into one --out and one Hub repo. Add --dist mpi: run `,
    { ways: [{ changes: [["--dist", "mpi"]], why: `one run of ${l.size} processes` }] },
  );
}

interface Binding {
  load(path: string): string | null;
  init(): { rank: number; size: number; provided: number };
  bcast(view: ArrayBufferView, root: number): Promise<void>;
  allgather(send: ArrayBufferView, recv: ArrayBufferView): Promise<void>;
  reduceScatterSum(send: Float64Array, recv: Float64Array): Promise<void>;
  barrier(): Promise<void>;
  finalize(): void;
  abort(code: number): void;
}

/** One initialised MPI world: this process's rank, the process count, and the collectives (queued, one at a time). */
export interface MpiWorld {
  readonly rank: number;
  readonly size: number;
  /** The library that was loaded (for the log). */
  readonly lib: string;
  bcast(view: ArrayBufferView, root: number): Promise<void>;
  allgather(send: ArrayBufferView, recv: ArrayBufferView): Promise<void>;
  /** MPI_Reduce_scatter_block in float64 with MPI_SUM: `recv` gets this process's block of the element-wise sum. */
  reduceScatterSum(send: Float64Array, recv: Float64Array): Promise<void>;
  barrier(): Promise<void>;
  finalize(): void;
  /** MPI_Abort: every process of the job ends (the launcher reports the code). */
  abort(code: number): never;
}

function bindingFile(): string | null {
  let d = __dirname;
  for (let i = 0; i < 6; i++) {
    if (fs.existsSync(path.join(d, "binding.gyp"))) return path.join(d, "build", "Release", "tstrain_mpi.node");
    const up = path.dirname(d);
    if (up === d) break;
    d = up;
  }
  return null;
}

/** The library to dlopen: TSTRAIN_MPI_LIB when set, else Open MPI's soname. */
export function mpiLibrary(env: NodeJS.ProcessEnv = process.env): string {
  return env[MPI_LIB_ENV] || "libmpi.so.40";
}

/** The binding with libmpi loaded, or a UserError (A9) saying what is missing and the command that installs it. */
export function loadMpi(env: NodeJS.ProcessEnv = process.env): { binding: Binding; lib: string } {
  const file = bindingFile();
  if (!file || !fs.existsSync(file)) {
    throw new UserError(
      "A9",
      `--dist mpi needs the MPI binding, which is not built (no build/Release/tstrain_mpi.node): install a C toolchain (apt-get install build-essential python3), then npm run build:native`,
    );
  }
  const req: (id: string) => unknown = require;
  const binding = req(file) as Binding;
  const lib = mpiLibrary(env);
  const why = binding.load(lib);
  if (why !== null) {
    const named = env[MPI_LIB_ENV] ? ` (${MPI_LIB_ENV}=${env[MPI_LIB_ENV]})` : "";
    throw new UserError(
      "A9",
      `--dist mpi needs an MPI library, and ${lib}${named} does not load: ${why.split("\n")[0]}. Install Open MPI with: ${MPI_INSTALL}${env[MPI_LIB_ENV] ? `, or point ${MPI_LIB_ENV} at its libmpi.so.40` : ""}`,
    );
  }
  return { binding, lib };
}

/** Load libmpi and MPI_Init_thread. Call once per process, only under --dist mpi. */
export function initMpi(env: NodeJS.ProcessEnv = process.env): MpiWorld {
  const { binding: b, lib } = loadMpi(env);
  const { rank, size, provided } = b.init();
  if (provided < 2) {
    b.abort(2);
    throw new Error(`MPI granted thread level ${provided}; this trainer needs MPI_THREAD_SERIALIZED or better`);
  }
  let chain: Promise<unknown> = Promise.resolve();
  const queue = <T>(f: () => Promise<T>): Promise<T> => {
    const p = chain.then(f);
    chain = p.catch(() => undefined);
    return p;
  };
  return {
    rank,
    size,
    lib,
    bcast: (view, root) => queue(() => b.bcast(view, root)),
    allgather: (send, recv) => queue(() => b.allgather(send, recv)),
    reduceScatterSum: (send, recv) => queue(() => b.reduceScatterSum(send, recv)),
    barrier: () => queue(() => b.barrier()),
    finalize: () => b.finalize(),
    abort: (code: number): never => {
      b.abort(code);
      process.exit(code);
    },
  };
}
