/** Backend selection (P1): auto falls through with a reason, explicit requests fail clearly. */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as path from "node:path";
import { Worker } from "node:worker_threads";
import * as tf from "@tensorflow/tfjs-core";
import { UserError } from "../src/errors";
import { initBackend } from "../src/model/backend";

function installed(pkg: string): boolean {
  try {
    require.resolve(pkg);
    return true;
  } catch {
    return false;
  }
}
const nodeTfInstalled = installed("@tensorflow/tfjs-node-gpu") || installed("@tensorflow/tfjs-node");

test("auto without tfjs-node falls back to wasm and says what it tried and why (P1)", {
  skip: nodeTfInstalled && "tfjs-node is installed here",
}, async () => {
  const r = await initBackend("auto");
  assert.equal(r.backend, "wasm");
  assert.equal(tf.getBackend(), "wasm");
  assert.match(r.detail, /@tensorflow\/tfjs-node-gpu: not installed/);
  assert.match(r.detail, /@tensorflow\/tfjs-node: not installed/);
  assert.match(r.detail, /SIMD/);
});

test("an explicit --backend tensorflow that cannot load is a UserError naming the fix (P1)", {
  skip: nodeTfInstalled && "tfjs-node is installed here",
}, async () => {
  await assert.rejects(initBackend("tensorflow"), (e: unknown) => {
    assert.ok(e instanceof UserError);
    assert.equal(e.rule, "P1");
    assert.match(e.message, /install @tensorflow\/tfjs-node-gpu or @tensorflow\/tfjs-node/);
    assert.match(e.message, /--backend wasm/);
    return true;
  });
});

test("wasm and cpu can be selected in turn in one thread and compute the same matMul", async () => {
  const a = [
      [1, 2],
      [3, 4],
    ],
    b = [
      [5, 6],
      [7, 8],
    ];
  const out: number[][] = [];
  for (const be of ["wasm", "cpu"] as const) {
    const r = await initBackend(be);
    assert.equal(r.backend, be);
    assert.equal(tf.getBackend(), be);
    out.push(Array.from(tf.tidy(() => tf.matMul(tf.tensor2d(a), tf.tensor2d(b))).dataSync()));
  }
  assert.deepEqual(out[0], [19, 22, 43, 50]);
  assert.deepEqual(out[1], out[0]);
});

test("each worker thread initialises its own wasm backend, loading the .wasm files from node_modules (A1)", async () => {
  const mod = path.join(__dirname, "..", "src", "model", "backend.js");
  const tfMod = require.resolve("@tensorflow/tfjs-core");
  const code = `
    const { parentPort } = require("node:worker_threads");
    const { initBackend } = require(${JSON.stringify(mod)});
    const tf = require(${JSON.stringify(tfMod)});
    initBackend("wasm").then((r) => {
      const v = tf.tidy(() => tf.sum(tf.tensor1d([1, 2, 3])).dataSync()[0]);
      parentPort.postMessage({ backend: r.backend, v });
    }, (e) => parentPort.postMessage({ error: String(e) }));`;
  const results = await Promise.all(
    [0, 1].map(
      () =>
        new Promise<{ backend?: string; v?: number; error?: string }>((resolve, reject) => {
          const w = new Worker(code, { eval: true });
          w.once("message", (m) => {
            resolve(m);
            void w.terminate();
          });
          w.once("error", reject);
        }),
    ),
  );
  for (const r of results) assert.deepEqual(r, { backend: "wasm", v: 6 });
});
