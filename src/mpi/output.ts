/**
 * The output of a process under Open MPI's mpirun (O3, A9): mpirun reads each process's stdout through a pty and,
 * once signalled itself, stops reading it and kills the job on a timer. These helpers keep a stop from blocking on
 * a full pty, drop what mpirun never takes, and warn when its timer is too short to save a checkpoint.
 */

/**
 * O3 under Open MPI's mpirun: each process's stdout is a pty, and mpirun, signalled itself, stops reading it until
 * it has killed the job. A full pty (about 18 KB) would block this thread's next write, and the SIGTERM mpirun sends
 * T s later could never be handled: the stop would save nothing. Writes are queued instead (Node's TTY handle made
 * non-blocking), and process 0, at its end, leaves what mpirun has not taken 2 s later (dropUnreadOutput).
 */
export function unblockStdout(): void {
  const handle = (process.stdout as unknown as { _handle?: { setBlocking?: (on: boolean) => void } })._handle;
  if (process.stdout.isTTY) handle?.setBlocking?.(false);
}

/** The output mpirun has not taken within 2 s of the end is dropped (process.exit keeps main's exit code). */
export function dropUnreadOutput(): void {
  if (process.stdout.writableLength > 0) setTimeout(() => process.exit(), 2000).unref();
}

/**
 * O3 under Open MPI's mpirun: signalled itself, mpirun sends its processes SIGCONT at once, SIGTERM
 * T = odls_base_sigkill_timeout seconds later (default 1) and SIGKILL T seconds after that: the
 * processes have T seconds to finish the step and save. SIGUSR2 to mpirun reaches them at once.
 */
export function sigkillWarning(env: NodeJS.ProcessEnv = process.env): string | null {
  if (!env.OMPI_COMM_WORLD_SIZE) return null;
  const t = Number(env.OMPI_MCA_odls_base_sigkill_timeout ?? 1);
  if (t >= 60) return null;
  return `WARNING a SIGTERM to mpirun reaches the processes ${t} s later and is followed by SIGKILL ${t} s after that (odls_base_sigkill_timeout=${t}), too soon to finish the step and save the checkpoint a stop saves (O3): launch with mpirun --mca odls_base_sigkill_timeout 600 ..., and stop a job with kill -USR2 <mpirun's pid>, which mpirun passes on at once`;
}
