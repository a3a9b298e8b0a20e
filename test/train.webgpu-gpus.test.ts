/**
 * One process, every GPU (A13), on this machine's software adapter (CI: Mesa 25's lavapipe; skipped with the reason
 * where no adapter opens, a failure under TSTRAIN_REQUIRE_WEBGPU=1), through `node dist/main.js --demo --backend
 * webgpu --max-steps 1` (one step of the demo, a small validation set):
 *  - with lavapipe alone: `--gpus 1` is refused with exit 2 before any work, with the list of the GPUs there and the
 *    command that works; that command (`--gpus 0`) runs, its two ranks sharing GPU 0 with a warning that gives the
 *    mapping, and the start line names each rank's GPU;
 *  - with two devices (lavapipe loaded twice, the copy renamed llvmpipX: test/helpers/webgpu.ts twoLavapipes): the
 *    list has both, and `--world 2 --gpus 1,0` opens GPU 1 on rank 0 and GPU 0 on rank 1, each rank's own adapter
 *    named on the start line; it ends with the same weights as the run on one device;
 *  - with two identical devices (lavapipe loaded twice, as is): both listed, and the start warns that they cannot be
 *    told apart.
 * test/model.webgpu-gpus.test.ts holds the same rules to lists of GPUs with PCI addresses, without an adapter.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { spawn, spawnSync } from "node:child_process";
import { tmpDir } from "./helpers/tmp";
import { twoLavapipes, webgpuRuns, REQUIRE_WEBGPU } from "./helpers/webgpu";

const MAIN = path.join(__dirname, "..", "main.js");
const DEVICE = path.join(__dirname, "..", "src", "model", "engine", "webgpu", "device.js");
const GPUS = path.join(__dirname, "..", "src", "model", "engine", "webgpu", "gpus.js");
const ROOT = path.join(tmpDir("webgpu-gpus-data"), "data");

/** The demo for one step on the webgpu engine, world 2, with `extra` flags and `env`: its exit code and output. */
function demo(extra: string[], env: NodeJS.ProcessEnv = {}, out = path.join(tmpDir("webgpu-gpus"), "run")) {
  const args = [MAIN, "--world", "2", "--demo", "--backend", "webgpu", "--max-steps", "1", "--log-every", "1"];
  args.push("--val-tokens", "512", "--no-sample", "--root", ROOT, "--out", out, ...extra);
  return new Promise<{ code: number | null; output: string; out: string }>((resolve) => {
    const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
    let output = "";
    child.stdout.on("data", (d: Buffer) => {
      output += d.toString();
    });
    child.stderr.on("data", (d: Buffer) => {
      output += d.toString();
    });
    child.on("close", (code) => resolve({ code, output, out }));
  });
}

/** The host's GPUs and a plan for `world` ranks, as a child process with `env` sees them (gpus.ts, once a process). */
function listed(env: NodeJS.ProcessEnv, world: number): { names: string[]; notes: string[] } {
  const code = `const l = require(${JSON.stringify(DEVICE)}).listWebgpuGpus();
const p = require(${JSON.stringify(GPUS)}).planGpus(l, ${world}, "", { rank: 0, size: 1 }, {});
console.log(JSON.stringify({ names: (l.gpus ?? []).map((g) => g.name), notes: p.notes, why: l.why }));`;
  const r = spawnSync(process.execPath, ["-e", code], { encoding: "utf8", env: { ...process.env, ...env } });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout.trim().split("\n").pop() ?? "{}") as { names: string[]; notes: string[] };
}

/** The start line's GPU of each rank: [its GPU in words, the adapter it opened]. */
function ranksOn(output: string): [string, string][] {
  const line = output.split("\n").find((l) => l.startsWith("backend: webgpu")) ?? "";
  const gpus = line.slice(line.indexOf("; GPUs: ") + "; GPUs: ".length);
  return [...gpus.matchAll(/rank (\d+) on (GPU \d+ .*?) \(opened: ([^)]*)\)/g)].map((m) => [m[2], m[3]]);
}

const weights = (out: string) =>
  createHash("sha256")
    .update(fs.readFileSync(path.join(out, "final", "model.safetensors")))
    .digest("hex");

// the run on lavapipe alone, shared by the tests (the first one to ask starts it)
let oneDevice: ReturnType<typeof demo> | null = null;

test("on lavapipe alone, --gpus 1 is refused before any work with the GPUs there, and the advised --gpus 0 runs, its ranks sharing GPU 0 with a warning (A13)", async (t) => {
  if (!webgpuRuns(t)) return;
  const out = path.join(tmpDir("webgpu-gpus-refused"), "run");
  const refused = await demo(["--gpus", "1"], {}, out);
  assert.equal(refused.code, 2, refused.output);
  const m =
    /^refused: --gpus 1: this host has no GPU 1; its GPUs: GPU 0 "llvmpipe [^"]*" \(no PCI address\); run node dist\/main\.js .* --gpus 0, or node dist\/main\.js (?:(?!--gpus).)* \(rank r takes GPU r\) \[A13\]$/m.exec(
      refused.output,
    );
  assert.ok(m, refused.output);
  assert.ok(!fs.existsSync(out), "nothing was done: no run folder");
  assert.ok(!fs.existsSync(ROOT), "nothing was done: no demo data");
  // the advised command
  oneDevice ??= demo(["--gpus", "0"]);
  const ok = await oneDevice;
  assert.equal(ok.code, 0, ok.output.slice(-3000));
  assert.match(
    ok.output,
    /^WARNING 2 ranks on 1 GPU: ranks share it: GPU 0 "llvmpipe [^"]*" \(no PCI address\) <- ranks 0, 1; each GPU's ranks take turns on it \(A13\)$/m,
  );
  const ranks = ranksOn(ok.output);
  assert.equal(ranks.length, 2, ok.output);
  for (const [gpu, opened] of ranks) {
    assert.match(gpu, /^GPU 0 "llvmpipe [^"]*" \(no PCI address\)$/);
    assert.match(opened, /^llvmpipe-/);
  }
});

test("with two devices (lavapipe loaded twice, the copy renamed), --world 2 --gpus 1,0 opens GPU 1 on rank 0 and GPU 0 on rank 1, with the bits of one device (A13)", async (t) => {
  if (!webgpuRuns(t)) return;
  const two = twoLavapipes(tmpDir("webgpu-gpus-lvp2"), true);
  if ("why" in two) {
    if (process.env[REQUIRE_WEBGPU] === "1") throw new Error(`${REQUIRE_WEBGPU}=1 but ${two.why}`);
    t.skip(two.why);
    return;
  }
  const env = { VK_DRIVER_FILES: two.driverFiles };
  const { names } = listed(env, 2);
  assert.deepEqual([...names].sort(), ["llvmpipX (LLVM 15.0.6, 256 bits)", "llvmpipe (LLVM 15.0.6, 256 bits)"].sort());
  const run = await demo(["--gpus", "1,0"], env);
  assert.equal(run.code, 0, run.output.slice(-3000));
  const ranks = ranksOn(run.output);
  assert.deepEqual(
    ranks.map(([gpu]) => gpu),
    [`GPU 1 "${names[1]}" (no PCI address)`, `GPU 0 "${names[0]}" (no PCI address)`],
  );
  // each rank's own adapter (Dawn's name: lowercase, "llvmpipx-llvm-...") is the GPU it was given
  assert.deepEqual(
    ranks.map(([, opened]) => opened.slice(0, 8)),
    [names[1].slice(0, 8).toLowerCase(), names[0].slice(0, 8).toLowerCase()],
  );
  assert.doesNotMatch(run.output, /WARNING .* ranks share/, "a GPU each: nothing shared");
  oneDevice ??= demo(["--gpus", "0"]);
  const one = await oneDevice;
  assert.equal(one.code, 0, one.output.slice(-3000));
  assert.equal(weights(run.out), weights(one.out), "the same final weights on two devices as on one");
});

test("the device-select variables the main thread sets reach a rank thread's Dawn instance, and none other's (A13)", (t) => {
  if (!webgpuRuns(t)) return;
  const two = twoLavapipes(tmpDir("webgpu-gpus-env"), true);
  if ("why" in two) {
    if (process.env[REQUIRE_WEBGPU] === "1") throw new Error(`${REQUIRE_WEBGPU}=1 but ${two.why}`);
    t.skip(two.why);
    return;
  }
  // a worker opens a device as a rank does; the main thread sets MESA_VK_DEVICE_SELECT=10005:0! around it (the
  // layer then shows the last device of that id alone), as the coordinator does around a rank's start
  const code = `const { Worker } = require("node:worker_threads");
const { withDeviceEnv } = require(${JSON.stringify(GPUS)});
const open = () => new Promise((resolve, reject) => {
  const w = new Worker(\`require(${JSON.stringify(DEVICE)}).openWebgpuDevice().then((d) => {
    const name = d.adapter ? d.adapter.info.device : d.reason;
    d.device?.destroy();
    require("node:worker_threads").parentPort.postMessage(name);
  })\`, { eval: true });
  w.once("message", (m) => { resolve(m); w.terminate(); });
  w.once("error", reject);
});
(async () => {
  const plain = await open();
  const restore = withDeviceEnv({ MESA_VK_DEVICE_SELECT: "10005:0!" });
  const chosen = await open();
  restore();
  const after = await open();
  console.log(JSON.stringify({ plain, chosen, after, left: process.env.MESA_VK_DEVICE_SELECT ?? null }));
})();`;
  const r = spawnSync(process.execPath, ["-e", code], {
    encoding: "utf8",
    env: { ...process.env, VK_DRIVER_FILES: two.driverFiles },
  });
  assert.equal(r.status, 0, r.stderr);
  const got = JSON.parse(r.stdout.trim().split("\n").pop() ?? "{}") as Record<string, string | null>;
  const { names } = listed({ VK_DRIVER_FILES: two.driverFiles }, 1);
  const dawnName = (n: string) => n.toLowerCase().replace(/[^a-z0-9]+/g, "-");
  // Dawn's first adapter without the variable (the layer's GPU 0); with it, the last device of that id (GPU 1)
  assert.equal(got.plain, dawnName(names[0]));
  assert.equal(got.chosen, dawnName(names[1]), "the variable set on the main thread reached the worker's instance");
  assert.equal(got.after, dawnName(names[0]), "and it was put back");
  assert.equal(got.left, null);
});

test("two identical devices without a PCI address (lavapipe loaded twice) are both listed, and the start warns they cannot be told apart (A13)", (t) => {
  if (!webgpuRuns(t)) return;
  const two = twoLavapipes(tmpDir("webgpu-gpus-twins"), false);
  if ("why" in two) {
    if (process.env[REQUIRE_WEBGPU] === "1") throw new Error(`${REQUIRE_WEBGPU}=1 but ${two.why}`);
    t.skip(two.why);
    return;
  }
  const { names, notes } = listed({ VK_DRIVER_FILES: two.driverFiles }, 2);
  assert.equal(names.length, 2);
  assert.equal(names[0], names[1]);
  assert.deepEqual(notes, [
    `WARNING GPU 0 and GPU 1 cannot be told apart ("${names[0]}", the same vendor:device id 10005:0, no PCI address): their ranks all open the first of them (A13)`,
  ]);
});
