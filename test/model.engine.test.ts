/**
 * Engine selection (P1, issue 11): `--backend auto` takes the native engine when its addon loads and a BLAS is
 * found, else tfjs, and says why and how to get the fast path; an explicit `--backend native` that cannot load
 * is refused (UserError, exit 2) with the fix, before any work. The no-BLAS machine is simulated in a child
 * process with TSTRAIN_BLAS pointing at a library that does not exist (the BLAS is process-wide once loaded).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { initEngine } from "../src/model/backend";
import { loadNative } from "../src/model/engine/native";
import { parseArgs } from "../src/config";

const DIST = path.join(__dirname, "..");
const native = loadNative();
const skipNoNative = "reason" in native && process.env.TSTRAIN_REQUIRE_NATIVE !== "1"
  ? `native engine unavailable here: ${native.reason}; fix: ${native.fix}` : false;

/** Runs a script in a fresh node process whose BLAS search finds nothing; returns its JSON output. */
function withoutBlas(script: string): { status: number | null; out: unknown; stderr: string } {
  const r = spawnSync(process.execPath, ["-e", script], {
    cwd: DIST, encoding: "utf8", timeout: 120_000, env: { ...process.env, TSTRAIN_BLAS: "/nonexistent/libopenblas-missing.so.0" },
  });
  let out: unknown = null;
  try { out = JSON.parse(r.stdout.trim().split("\n").pop() ?? "null"); } catch { out = r.stdout; }
  return { status: r.status, out, stderr: r.stderr };
}

test("--backend accepts native and refuses an unknown engine naming the choices", () => {
  assert.equal(parseArgs(["--backend", "native"]).config.backend, "native");
  assert.throws(() => parseArgs(["--backend", "natve"]), /native/);
});

test("auto picks the native engine when it loads, and its backend line names the BLAS and the thread count", { skip: skipNoNative }, async () => {
  const e = await initEngine("auto");
  assert.equal(e.engine, "native");
  assert.match(e.detail, /^auto: native \(.*from .*1 thread; C kernels/);
  const n = await initEngine("native");
  assert.equal(n.engine, "native");
  assert.equal(n.kernels, e.kernels);
});

test("without a BLAS, auto falls back to tfjs-wasm and the backend line says why and how to get the fast path", () => {
  const r = withoutBlas(`
    const { initEngine } = require("./src/model/backend");
    initEngine("auto").then((e) => console.log(JSON.stringify({ engine: e.engine, detail: e.detail, name: e.kernels.name })),
      (err) => console.log(JSON.stringify({ error: String(err) })));`);
  const o = r.out as { engine?: string; detail?: string; error?: string };
  assert.equal(o.error, undefined, r.stderr);
  assert.notEqual(o.engine, "native");
  assert.match(o.detail!, /native engine passed over: (no BLAS found \(TSTRAIN_BLAS=\/nonexistent\/libopenblas-missing\.so\.0|the addon is not built)/);
  assert.match(o.detail!, /fast path: (apt-get install libopenblas0-pthread|npm run build:native)/);
});

test("without a BLAS, --backend native is a UserError (P1) naming the fix, and the CLI exits 2 before reading any data", () => {
  const r = withoutBlas(`
    const { initEngine } = require("./src/model/backend");
    initEngine("native").then(() => console.log(JSON.stringify({ ok: true })),
      (e) => console.log(JSON.stringify({ name: e.name, rule: e.rule, message: e.message })));`);
  const o = r.out as { name?: string; rule?: string; message?: string; ok?: boolean };
  assert.equal(o.ok, undefined, "initEngine('native') must refuse without a BLAS");
  assert.equal(o.rule, "P1");
  assert.match(o.message!, /--backend native is not available: .*fix: (apt-get install libopenblas0-pthread|npm run build:native)/);

  // the CLI: a mix root that does not exist, so any data work would fail differently; the refusal comes first
  const cli = spawnSync(process.execPath, [path.join(DIST, "main.js"), "--backend", "native", "--root", "/nonexistent/mix", "--dry-run"], {
    encoding: "utf8", timeout: 120_000, env: { ...process.env, TSTRAIN_BLAS: "/nonexistent/libopenblas-missing.so.0" },
  });
  assert.equal(cli.status, 2, cli.stderr);
  assert.match(cli.stderr + cli.stdout, /--backend native is not available/);
  assert.match(cli.stderr + cli.stdout, /TSTRAIN_BLAS=\/nonexistent\/libopenblas-missing\.so\.0/);
  assert.doesNotMatch(cli.stderr + cli.stdout, /nonexistent\/mix/);
});

test("the addon's build script never fails the install: without a compiler it exits 0 with one line naming the fix", () => {
  const script = path.join(DIST, "..", "scripts", "build-native.cjs");
  for (const env of [{ CC: "/nonexistent/cc" }, { TSTRAIN_SKIP_NATIVE: "1" }]) {
    const r = spawnSync(process.execPath, [script], { encoding: "utf8", timeout: 60_000, env: { ...process.env, ...env } });
    assert.equal(r.status, 0, r.stderr);
    const lines = r.stdout.trim().split("\n");
    assert.equal(lines.length, 1, r.stdout);
    assert.match(lines[0]!, /^tstrain: native engine not built \((no C compiler \(\/nonexistent\/cc\)|TSTRAIN_SKIP_NATIVE=1)\); the tfjs engine will be used\. Fast path: apt-get install build-essential python3 .*npm run build:native/);
  }
});
