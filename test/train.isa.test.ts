/**
 * The same bits on every x86-64 machine: `node dist/main.js --world 2 --demo` with each built-in GEMM kernel this
 * CPU runs forced in turn (--isa avx512, avx2, portable) ends with the same final/model.safetensors, byte for byte,
 * with OpenBLAS hidden (TSTRAIN_BLAS points nowhere: the built-in GEMM needs no BLAS, so the native engine runs).
 * The demo's hash is also pinned (DEMO_SHA256): a machine whose kernels or compiler round differently fails here,
 * and so does a change of results that was not meant (update the constant only for a change that is meant, and say
 * so in the commit). With TSTRAIN_REQUIRE_NATIVE=1 an addon that does not load fails this test.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { spawn } from "node:child_process";
import { loadNative, supportedIsas } from "../src/model/engine/native";
import { DEMO_SHA256 } from "./helpers/demo";

const MAIN = path.join(__dirname, "..", "main.js");
const native = loadNative();
const skip =
  "reason" in native && process.env.TSTRAIN_REQUIRE_NATIVE !== "1"
    ? `native engine unavailable here: ${native.reason}`
    : false;

function runDemo(cwd: string, out: string, isa: string): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    const env = { ...process.env, TSTRAIN_BLAS: "/nonexistent/hidden-libopenblas.so.0" };
    const child = spawn(process.execPath, [MAIN, "--world", "2", "--demo", "--isa", isa, "--out", out], {
      cwd,
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout.on("data", (d: Buffer) => {
      output += d.toString();
    });
    child.stderr.on("data", (d: Buffer) => {
      output += d.toString();
    });
    child.on("close", (code) => resolve({ code, output }));
  });
}

test("the demo ends with the same final weights, byte for byte, on every GEMM kernel this CPU runs, without OpenBLAS", {
  skip,
  timeout: 1_800_000,
}, async () => {
  const cwd = fs.mkdtempSync(path.join(os.tmpdir(), "tstrain-isa-"));
  try {
    const isas = supportedIsas();
    assert.ok(isas.includes("portable"), `kernels here: ${isas.join(", ")}`);
    const hashes: Record<string, string> = {};
    for (const isa of isas) {
      const out = path.join(cwd, `run-${isa}`);
      const r = await runDemo(cwd, out, isa);
      assert.equal(r.code, 0, `--isa ${isa}: exit ${r.code}\n${r.output.slice(-3000)}`);
      const line = r.output.split("\n").find((l) => l.startsWith("backend: ")) ?? "";
      assert.match(
        line,
        new RegExp(`native \\(GEMM: built-in ${isa}, `),
        `--isa ${isa} ran the native engine on that kernel`,
      );
      const runJson = JSON.parse(
        r.output
          .split("\n")
          .find((l) => l.startsWith("RUN_JSON "))!
          .slice("RUN_JSON ".length),
      ) as { backend: string; final_step: number };
      assert.equal(runJson.backend, "native");
      assert.equal(runJson.final_step, 300);
      hashes[isa] = createHash("sha256")
        .update(fs.readFileSync(path.join(out, "final", "model.safetensors")))
        .digest("hex");
      console.log(`# --isa ${isa}: final/model.safetensors sha256 ${hashes[isa]}`);
    }
    for (const isa of isas) assert.equal(hashes[isa], hashes[isas[0]], `--isa ${isa} differs from --isa ${isas[0]}`);
    assert.equal(hashes[isas[0]], DEMO_SHA256, "the demo's weights differ from the pinned hash (DEMO_SHA256)");
  } finally {
    fs.rmSync(cwd, { recursive: true, force: true });
  }
});
