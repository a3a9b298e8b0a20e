/**
 * The demo's pinned result, and the run that checks it on one built-in GEMM kernel.
 *
 * DEMO_SHA256 is the sha256 of `node dist/main.js --world 2 --demo`'s final/model.safetensors (every default), on
 * every kernel and machine, and of any split of the same global batch (`mpirun -np 2 ... --dist mpi --world 1
 * --demo`). Change it only with a change of results that is meant, and say so in the commit.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { spawn } from "node:child_process";
import { bf16Support, loadNative, supportedIsas } from "../../src/model/engine/native";

export const DEMO_SHA256 = "ef9980615583a1b6fbd27f30167806870d854bcb1f686a8958d843924866b172";
/** The same demo with `--precision bf16` (P8): its own pinned weights, on the AMX kernel and every emulation. */
export const DEMO_BF16_SHA256 = "29af018a54b57b89d752396068f735cd1d6079bb59e1d72f6c8fba02004476e1";

const MAIN = path.join(__dirname, "..", "..", "main.js");

function runDemo(
  cwd: string,
  out: string,
  isa: string,
  precision: "fp32" | "bf16",
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    const env = { ...process.env, TSTRAIN_BLAS: "/nonexistent/hidden-libopenblas.so.0" };
    const args = [MAIN, "--world", "2", "--demo", "--isa", isa, "--out", out, "--precision", precision];
    const child = spawn(process.execPath, args, {
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

/**
 * One test: the whole demo on the built-in GEMM's `isa` kernel, OpenBLAS hidden (TSTRAIN_BLAS points nowhere: the
 * built-in GEMM needs no BLAS, so the native engine runs), ends with DEMO_SHA256 (with `--precision bf16`:
 * DEMO_BF16_SHA256; isa "amx" is the AMX-BF16 kernel, "avx512bf16" the VDPBF16PS one). One file per kernel (test/train.isa-*.test.ts),
 * so that each whole demo has the test runner's per-file time to itself on a busy machine. Skipped, saying why,
 * where the native engine does not load (a failure under TSTRAIN_REQUIRE_NATIVE=1) or this CPU lacks the
 * instruction set.
 */
export function demoOnKernel(
  isa: "amx" | "avx512bf16" | "avx512" | "avx2" | "portable",
  precision: "fp32" | "bf16" = "fp32",
): void {
  const native = loadNative();
  const has =
    isa === "amx"
      ? (bf16Support()?.hw ?? false)
      : isa === "avx512bf16"
        ? (bf16Support()?.dp ?? false)
        : supportedIsas().includes(isa);
  const skip =
    "reason" in native
      ? process.env.TSTRAIN_REQUIRE_NATIVE === "1"
        ? false
        : `native engine unavailable here: ${native.reason}`
      : !has
        ? `this CPU has no ${isa} (it runs: ${supportedIsas().join(", ")}${isa === "avx512bf16" ? `; ${bf16Support()?.check}` : ""})`
        : false;
  const pinned = precision === "bf16" ? DEMO_BF16_SHA256 : DEMO_SHA256;
  const what = precision === "bf16" ? "DEMO_BF16_SHA256" : "DEMO_SHA256";
  test(`the demo${precision === "bf16" ? " in bf16" : ""} on the built-in ${isa} kernel, without OpenBLAS, ends with the pinned final weights (${what})`, {
    skip,
    timeout: 1_800_000,
  }, async () => {
    const cwd = fs.mkdtempSync(path.join(os.tmpdir(), `tstrain-isa-${isa}-`));
    try {
      const out = path.join(cwd, "run");
      const r = await runDemo(cwd, out, isa, precision);
      assert.equal(r.code, 0, `--isa ${isa}: exit ${r.code}\n${r.output.slice(-3000)}`);
      const line = r.output.split("\n").find((l) => l.startsWith("backend: ")) ?? "";
      assert.match(
        line,
        new RegExp(
          `native \\(GEMM: built-in ${isa}, .*, ${precision === "bf16" ? "bf16 products.*" : "fp32"}; C kernels`,
        ),
        `--isa ${isa} ran the native engine on that kernel, in ${precision}`,
      );
      const runJson = JSON.parse(
        r.output
          .split("\n")
          .find((l) => l.startsWith("RUN_JSON "))
          ?.slice("RUN_JSON ".length) ?? "{}",
      ) as {
        backend?: string;
        precision?: string;
        final_step?: number;
      };
      assert.equal(runJson.backend, "native");
      assert.equal(runJson.precision, precision);
      assert.equal(runJson.final_step, 300);
      const hash = createHash("sha256")
        .update(fs.readFileSync(path.join(out, "final", "model.safetensors")))
        .digest("hex");
      console.log(`# --isa ${isa} --precision ${precision}: final/model.safetensors sha256 ${hash}`);
      assert.equal(hash, pinned, `--isa ${isa}: the demo's weights differ from the pinned hash (${what})`);
    } finally {
      fs.rmSync(cwd, { recursive: true, force: true });
    }
  });
}
