/**
 * How many cores this process can actually get right now: `n` worker threads spin for `ms` and the
 * process's CPU time over that window is divided by the wall time. On an idle machine the answer is
 * ~n; on a shared one it says how much of the machine the other tenants left. Run at the start and
 * the end of a bench, it tells whether the scaling ratios measured the runtime or the neighbours.
 */
import { Worker } from "node:worker_threads";

const SPIN = `
const { parentPort, workerData } = require("node:worker_threads");
const end = Date.now() + workerData.ms;
let x = 0;
while (Date.now() < end) { for (let i = 0; i < 1e5; i++) x = (x * 1664525 + 1013904223) >>> 0; }
parentPort.postMessage(x);
`;

export async function coresAvailable(n: number, ms = 1000): Promise<number> {
  const workers = Array.from({ length: n }, () => new Worker(SPIN, { eval: true, workerData: { ms } }));
  // let the threads start before the window opens
  await new Promise((res) => setTimeout(res, 50));
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(workers.map((w) => new Promise((res) => w.once("message", res))));
  const wall = performance.now() - t0;
  const c = process.cpuUsage(c0);
  await Promise.all(workers.map((w) => w.terminate()));
  return Math.round(((c.user + c.system) / 1000 / wall) * 100) / 100;
}
