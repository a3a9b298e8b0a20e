/**
 * The coordinator's end of one rank (RankHandle, A2), one behaviour per test, against scripted rank threads: real
 * Worker threads running a few lines that misbehave on purpose (a reply of the wrong type, a message nobody asked
 * for, an uncaught error, an exit while a request is pending or while idle), which rank.js never does on its own.
 * Every way a rank can stop answering ends the request waiting on it with a RankFailure that names the rank, the
 * phase and the cause; nothing is left waiting, and a dead rank answers every later request with its first failure.
 * The real ranks' failures (a fault at a step, a failed start) are in train.coordinator.test.ts.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { once } from "node:events";
import { Worker } from "node:worker_threads";
import { RankFailure, RankHandle, type RankThread } from "../src/actors/coordinator";
import type { FromRank, ToRank } from "../src/actors/protocol";

/** A Worker thread running `body` (CommonJS, with `parentPort` in scope). */
function scripted(body: string): Worker {
  return new Worker(`const { parentPort } = require("node:worker_threads");\n${body}`, { eval: true });
}

/** A thread that answers each request type with the given reply (close with closed, as rank.js), and ignores the others. */
function answering(replies: Partial<Record<ToRank["type"], FromRank>>): Worker {
  const all = { close: { type: "closed", rank: 0 }, ...replies };
  return scripted(`const replies = ${JSON.stringify(all)};
parentPort.on("message", (m) => { if (replies[m.type]) parentPort.postMessage(replies[m.type]); });`);
}

/** The thread as RankHandle sees it, with every message posted to it and every terminate recorded. */
function recording(w: Worker): { thread: RankThread; posted: ToRank[]; terminated: () => number } {
  const posted: ToRank[] = [];
  let n = 0;
  const thread: RankThread = {
    // biome-ignore lint/suspicious/noExplicitAny: the Worker's own listener type
    on: (event: string, listener: (a: any) => void) => w.on(event, listener),
    postMessage: (m: ToRank) => {
      posted.push(m);
      w.postMessage(m);
    },
    terminate: () => {
      n++;
      return w.terminate();
    },
  };
  return { thread, posted, terminated: () => n };
}

const MEMORY: FromRank = {
  type: "memory",
  memory: { rank: 0, heapPeakBytes: 1, tfPeakBytes: 0, wasmHeapBytes: 0, arenaBytes: 2 },
};
const COMPUTE: ToRank = { type: "compute", step: 4, gradScale: 1 };
/** The thread's exit code (events.once would reject on the thread's 'error' event, which these tests provoke). */
const exitOf = (w: Worker): Promise<number> => new Promise((resolve) => w.once("exit", resolve));
const rejection = (p: Promise<unknown>): Promise<unknown> =>
  p.then(
    (v) => assert.fail(`resolved with ${JSON.stringify(v)}`),
    (e: unknown) => e,
  );

test("a request is answered by the reply of the type it expects; a second request while one is pending is refused, naming both, and the first still gets its reply (A2)", {
  timeout: 30_000,
}, async () => {
  const h = new RankHandle(0, answering({ memory: MEMORY }));
  try {
    const first = h.request({ type: "memory" }, "memory", "memory report");
    const e = await rejection(h.request(COMPUTE, "computed", "step 4 compute"));
    assert.ok(e instanceof Error && !(e instanceof RankFailure), `a plain Error, not ${String(e)}`);
    assert.equal(e.message, "rank 0: request compute while memory is pending");
    assert.deepEqual(await first, MEMORY);
    assert.deepEqual(
      await h.request({ type: "memory" }, "memory", "memory report"),
      MEMORY,
      "and the rank takes the next request",
    );
  } finally {
    await h.close();
  }
});

test("a reply of another type than the one asked for fails the request with a RankFailure naming the rank, the phase and both types (A2)", {
  timeout: 30_000,
}, async () => {
  const h = new RankHandle(2, answering({ compute: { type: "reduced", rank: 2, step: 4, ms: 1 }, memory: MEMORY }));
  try {
    const e = await rejection(h.request(COMPUTE, "computed", "step 4 compute"));
    assert.ok(e instanceof RankFailure, `a RankFailure, not ${String(e)}`);
    assert.equal(e.rank, 2);
    assert.equal(e.phase, "step 4 compute");
    assert.equal(e.message, "rank 2 failed during step 4 compute: protocol error: expected computed, got reduced");
    assert.deepEqual(
      await h.request({ type: "memory" }, "memory", "memory report"),
      MEMORY,
      "nothing is left pending: the next request is answered",
    );
  } finally {
    await h.close();
  }
});

test("a message the rank sends while no request is pending is ignored, and the next request gets its own reply (A2)", {
  timeout: 30_000,
}, async () => {
  // The thread announces itself unasked, then answers requests.
  const w = scripted(`parentPort.postMessage({ type: "ready", rank: 0, backend: "x", detail: "unasked" });
parentPort.on("message", (m) => {
  if (m.type === "memory") parentPort.postMessage(${JSON.stringify(MEMORY)});
  if (m.type === "close") parentPort.postMessage({ type: "closed", rank: 0 });
});`);
  const h = new RankHandle(0, w);
  try {
    const [unasked] = (await once(w, "message")) as [FromRank];
    assert.equal(unasked.type, "ready", "the unsolicited message arrived (and the handle heard it first)");
    assert.deepEqual(await h.request({ type: "memory" }, "memory", "memory report"), MEMORY);
  } finally {
    await h.close();
  }
});

test("an uncaught error in a rank's thread fails the pending request with a RankFailure naming the phase and the error's class and message, and every later request gets that same failure, not the exit that follows (A2)", {
  timeout: 30_000,
}, async () => {
  const w = scripted(`parentPort.on("message", () => { throw new TypeError("bad slice"); });`);
  const h = new RankHandle(1, w);
  try {
    const exited = exitOf(w);
    const e = await rejection(h.request(COMPUTE, "computed", "step 4 compute"));
    assert.ok(e instanceof RankFailure, `a RankFailure, not ${String(e)}`);
    assert.equal(e.message, "rank 1 failed during step 4 compute: TypeError: bad slice");
    assert.equal(await exited, 1, "the thread then exits with code 1");
    assert.equal(
      await rejection(h.request({ type: "memory" }, "memory", "memory report")),
      e,
      "a later request gets the first failure",
    );
  } finally {
    await h.close();
  }
});

test("an uncaught error in a rank's thread while no request is pending is a RankFailure of the 'idle' phase, which the next request gets (A2)", {
  timeout: 30_000,
}, async () => {
  const w = scripted(`throw new RangeError("no backend");`);
  const h = new RankHandle(3, w);
  try {
    assert.equal(await exitOf(w), 1);
    const e = await rejection(h.request({ type: "memory" }, "memory", "memory report"));
    assert.ok(e instanceof RankFailure, `a RankFailure, not ${String(e)}`);
    assert.equal(e.phase, "idle");
    assert.equal(e.message, "rank 3 failed during idle: RangeError: no backend");
  } finally {
    await h.close();
  }
});

test("a rank's thread that exits while a request is pending fails it with a RankFailure giving the exit code, even a clean 0 (A2)", {
  timeout: 30_000,
}, async () => {
  const h = new RankHandle(1, scripted(`parentPort.on("message", () => process.exit(0));`));
  try {
    const e = await rejection(
      h.request({ type: "update", step: 7, lr: 1e-3, coef: 1, t: 8 }, "updated", "step 7 update"),
    );
    assert.ok(e instanceof RankFailure, `a RankFailure, not ${String(e)}`);
    assert.equal(e.message, "rank 1 failed during step 7 update: worker thread exited with code 0");
    assert.equal(
      await rejection(h.request({ type: "memory" }, "memory", "memory report")),
      e,
      "a later request gets the same failure",
    );
  } finally {
    await h.close();
  }
});

test("a rank's thread that exits with a non-zero code while idle is a RankFailure of the 'idle' phase giving the code, which the next request gets (A2)", {
  timeout: 30_000,
}, async () => {
  const w = scripted(`process.exit(5);`);
  const h = new RankHandle(3, w);
  try {
    assert.equal(await exitOf(w), 5);
    const e = await rejection(h.request({ type: "memory" }, "memory", "memory report"));
    assert.ok(e instanceof RankFailure, `a RankFailure, not ${String(e)}`);
    assert.equal(e.rank, 3);
    assert.equal(e.phase, "idle");
    assert.equal(e.message, "rank 3 failed during idle: worker thread exited with code 5");
  } finally {
    await h.close();
  }
});

test("a rank's thread that ends cleanly while idle is not a failure, but every later request is refused: the rank has exited (A2)", {
  timeout: 30_000,
}, async () => {
  const w = scripted(`// nothing to wait for: the thread ends with code 0`);
  const h = new RankHandle(2, w);
  try {
    assert.equal(await exitOf(w), 0);
    const e = await rejection(h.request({ type: "memory" }, "memory", "memory report"));
    assert.ok(e instanceof Error && !(e instanceof RankFailure), `a plain Error, not ${String(e)}`);
    assert.equal(e.message, "rank 2 has exited");
  } finally {
    await h.close();
  }
});

test("closing a live rank asks it to close, then ends its thread; closing a dead one only ends the thread (A2)", {
  timeout: 30_000,
}, async () => {
  const live = recording(answering({ memory: MEMORY }));
  const h = new RankHandle(0, live.thread);
  assert.deepEqual(await h.request({ type: "memory" }, "memory", "memory report"), MEMORY);
  await h.close();
  assert.deepEqual(live.posted, [{ type: "memory" }, { type: "close" }]);
  assert.equal(live.terminated(), 1);

  const w = scripted(`process.exit(5);`);
  const gone = recording(w);
  const d = new RankHandle(0, gone.thread);
  assert.equal(await exitOf(w), 5);
  await d.close();
  assert.deepEqual(gone.posted, [], "nothing is posted to a thread that has exited");
  assert.equal(gone.terminated(), 1);
});

test("closing waits for the rank's closed (its engine let go) before it ends the thread, and ends a silent rank after the grace (A2)", {
  timeout: 30_000,
}, async () => {
  // a rank whose engine takes a while to let go: ending its thread before it answers would cut that short
  const slow = scripted(`parentPort.on("message", (m) => {
  if (m.type === "close") setTimeout(() => parentPort.postMessage({ type: "closed", rank: 0 }), 300);
});`);
  const events: string[] = [];
  slow.on("message", (m: FromRank) => events.push(m.type));
  const rec = recording(slow);
  const realTerminate = rec.thread.terminate;
  rec.thread.terminate = () => {
    events.push("terminate");
    return realTerminate();
  };
  await new RankHandle(0, rec.thread).close();
  assert.deepEqual(events, ["closed", "terminate"], "the thread is ended only once the rank has said closed");

  // a rank that never answers close is ended anyway, once the grace has passed
  const silent = recording(scripted(`parentPort.on("message", () => {});`));
  const t0 = performance.now();
  await new RankHandle(0, silent.thread).close(200);
  assert.equal(silent.terminated(), 1);
  assert.ok(performance.now() - t0 >= 150, "it waited for the grace");
});
