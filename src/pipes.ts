/**
 * O7: a reader that goes away ends no command. `node dist/main.js … | head -3`, `… 2>&1 | head`, or
 * `generate … | head -c 10` close the pipe the command writes to; every later write to it fails with EPIPE.
 * Without a listener that is an uncaught error: the process dies mid-work, and a training run leaves its lock
 * and a session start with no end. So every entry point calls `guardOutput()` first: from the first EPIPE on,
 * writes to that stream are dropped, the work goes on, and the exit code is the one it would have been.
 * A closed stdout is said once on stderr (when stderr is still open); a closed stderr is said nowhere.
 */

/** The streams whose reader went away. */
const closed = new WeakSet<NodeJS.WritableStream>();
/** What to do, once, when a stream's reader goes away. */
const onClose = new WeakMap<NodeJS.WritableStream, (() => void)[]>();
const guarded = new WeakSet<NodeJS.WritableStream>();

/** The codes of a write to a pipe whose reader went away (EPIPE), or of one after that (the stream destroyed). */
const GONE = new Set(["EPIPE", "ERR_STREAM_DESTROYED", "ERR_STREAM_WRITE_AFTER_END"]);

/** True once the stream's reader went away. */
export function isClosed(stream: NodeJS.WritableStream): boolean {
  return closed.has(stream);
}

/**
 * Guards a stream against its reader going away: an EPIPE marks it closed (later writes through `writeOpen` are
 * dropped; direct writes fail quietly), then runs `then` once. Any other error is still thrown.
 */
export function guardStream(stream: NodeJS.WritableStream, then?: () => void): void {
  if (then) {
    if (closed.has(stream)) then();
    else onClose.set(stream, [...(onClose.get(stream) ?? []), then]);
  }
  if (guarded.has(stream)) return;
  guarded.add(stream);
  stream.on("error", (e: NodeJS.ErrnoException) => {
    if (!GONE.has(e.code ?? "")) throw e;
    if (closed.has(stream)) return;
    closed.add(stream);
    for (const f of onClose.get(stream) ?? []) f();
    onClose.delete(stream);
  });
}

/** Writes to the stream unless its reader went away. */
export function writeOpen(stream: NodeJS.WritableStream, s: string): void {
  if (!closed.has(stream)) stream.write(s);
}

/**
 * Guards stdout and stderr (every entry point, first thing). `stdoutNote`: what to say on stderr when stdout's
 * reader goes away (e.g. where the log lines still go).
 */
export function guardOutput(stdoutNote?: string): void {
  guardStream(process.stderr);
  guardStream(
    process.stdout,
    stdoutNote
      ? () => writeOpen(process.stderr, `note: the output's reader closed it (EPIPE); ${stdoutNote}\n`)
      : undefined,
  );
}
