/**
 * Engine selection (P1): `--backend auto` takes the native engine when its addon loads (its matrix products on the
 * project's own GEMM, no BLAS needed), else tfjs, and says why and how to get the fast path; an explicit
 * `--backend native`, `--gemm openblas` or `--isa X` that cannot load is refused (UserError, exit 2) with the fix,
 * before any work. The no-BLAS machine is simulated in a child process with TSTRAIN_BLAS pointing at a library
 * that does not exist (the BLAS is process-wide once loaded). TSTRAIN_REQUIRE_OPENBLAS=1 makes the OpenBLAS
 * tests fail instead of skipping where OpenBLAS cannot load.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { initEngine } from "../src/model/backend";
import { bf16Support, loadNative, supportedIsas } from "../src/model/engine/native";
import { parseArgs } from "../src/config";

const DIST = path.join(__dirname, "..");
const native = loadNative();
const skipNoNative =
  "reason" in native && process.env.TSTRAIN_REQUIRE_NATIVE !== "1"
    ? `native engine unavailable here: ${native.reason}; fix: ${native.fix}`
    : false;
const blas = loadNative({ gemm: "openblas", isa: "auto" });
const skipNoBlas =
  "reason" in blas && process.env.TSTRAIN_REQUIRE_OPENBLAS !== "1"
    ? `OpenBLAS unavailable here: ${blas.reason}; fix: ${blas.fix}`
    : false;

/** Runs a script in a fresh node process whose BLAS search finds nothing; returns its JSON output. */
function withoutBlas(script: string): { status: number | null; out: unknown; stderr: string } {
  const r = spawnSync(process.execPath, ["-e", script], {
    cwd: DIST,
    encoding: "utf8",
    timeout: 120_000,
    env: { ...process.env, TSTRAIN_BLAS: "/nonexistent/libopenblas-missing.so.0" },
  });
  let out: unknown = null;
  try {
    out = JSON.parse(r.stdout.trim().split("\n").pop() ?? "null");
  } catch {
    out = r.stdout;
  }
  return { status: r.status, out, stderr: r.stderr };
}

test("--backend accepts native and refuses an unknown engine naming the choices", () => {
  assert.equal(parseArgs(["--backend", "native"]).config.backend, "native");
  assert.throws(() => parseArgs(["--backend", "natve"]), /native/);
});

test("auto picks the native engine on its own GEMM, and its backend line names the kernel", {
  skip: skipNoNative,
}, async () => {
  const e = await initEngine("auto");
  assert.equal(e.engine, "native");
  assert.match(e.detail, /^auto: native \(GEMM: built-in (avx512|avx2|portable), .* micro-kernel, fp32; C kernels/);
  const n = await initEngine("native");
  assert.equal(n.engine, "native");
  assert.equal(n.kernels, e.kernels);
});

test("without OpenBLAS the native engine still runs (built-in GEMM): auto and --backend native take it, no BLAS is loaded", {
  skip: skipNoNative,
}, () => {
  const r = withoutBlas(`
    const { initEngine } = require("./src/model/backend");
    Promise.all([initEngine("auto"), initEngine("native")]).then(([a, n]) => console.log(JSON.stringify({ a: a.engine, n: n.engine, detail: a.detail })),
      (err) => console.log(JSON.stringify({ error: String(err) })));`);
  const o = r.out as { a?: string; n?: string; detail?: string; error?: string };
  assert.equal(o.error, undefined, r.stderr);
  assert.equal(o.a, "native");
  assert.equal(o.n, "native");
  assert.match(o.detail!, /GEMM: built-in/);
  assert.doesNotMatch(o.detail!, /OpenBLAS|passed over/);
});

test("without OpenBLAS, --gemm openblas is a UserError (P1) naming the fix, and the CLI exits 2 before reading any data", {
  skip: skipNoNative,
}, () => {
  const r = withoutBlas(`
    const { initEngine } = require("./src/model/backend");
    initEngine("auto", { gemm: "openblas", isa: "auto" }).then(() => console.log(JSON.stringify({ ok: true })),
      (e) => console.log(JSON.stringify({ name: e.name, rule: e.rule, message: e.message })));`);
  const o = r.out as { name?: string; rule?: string; message?: string; ok?: boolean };
  assert.equal(o.ok, undefined, "--gemm openblas must refuse without a BLAS, not fall back to tfjs");
  assert.equal(o.rule, "P1");
  assert.match(
    o.message!,
    /--gemm openblas is not available: .*no BLAS found.*fix: apt-get install libopenblas0-pthread.*, or run the same command without --gemm \(the built-in GEMM\), or the same command with --backend wasm \(tfjs-wasm, slower\) \[P1\]$/,
  );

  // the CLI: a mix root that does not exist, so any data work would fail differently; the refusal comes first
  const cli = spawnSync(
    process.execPath,
    [path.join(DIST, "main.js"), "--gemm", "openblas", "--root", "/nonexistent/mix", "--dry-run"],
    {
      encoding: "utf8",
      timeout: 120_000,
      env: { ...process.env, TSTRAIN_BLAS: "/nonexistent/libopenblas-missing.so.0" },
    },
  );
  assert.equal(cli.status, 2, cli.stderr);
  assert.match(cli.stderr + cli.stdout, /--gemm openblas is not available/);
  assert.match(cli.stderr + cli.stdout, /TSTRAIN_BLAS=\/nonexistent\/libopenblas-missing\.so\.0/);
  assert.doesNotMatch(cli.stderr + cli.stdout, /no manifest at|\[D1\]/, "refused before the data is read");
});

test("with OpenBLAS, --gemm openblas runs the products on it and the backend line names it", {
  skip: skipNoBlas,
}, async () => {
  const e = await initEngine("auto", { gemm: "openblas", isa: "auto" });
  assert.equal(e.engine, "native");
  assert.match(e.detail, /^auto: native \(GEMM: .*OpenBLAS.* from .*1 thread; C kernels/);
});

test("an unknown --gemm or --isa is refused naming the choices; an --isa this CPU lacks is refused at start (P1, exit 2)", {
  skip: skipNoNative,
}, () => {
  assert.throws(() => parseArgs(["--gemm", "mkl"]), /--gemm "mkl" is not one of builtin, openblas/);
  assert.throws(
    () => parseArgs(["--isa", "neon"]),
    /--isa "neon" is not one of auto, amx, avx512bf16, avx512, avx2, portable/,
  );
  assert.equal(parseArgs(["--isa", "portable"]).config.isa, "portable");
  const missing = (["avx512", "avx2"] as const).find((i) => !supportedIsas().includes(i));
  if (!missing) return; // this CPU runs every kernel: the refusal is tested in model.gemm (loadNative's reason)
  const cli = spawnSync(
    process.execPath,
    [path.join(DIST, "main.js"), "--isa", missing, "--root", "/nonexistent/mix", "--dry-run"],
    { encoding: "utf8", timeout: 120_000 },
  );
  assert.equal(cli.status, 2, cli.stderr);
  assert.match(
    cli.stderr + cli.stdout,
    new RegExp(
      `--isa ${missing} is not available: .*this CPU has no ${missing}.*; run node dist/main\\.js .* \\(--isa auto, here \\w+\\)`,
    ),
  );
});

test("--precision bf16 is refused with a tfjs backend or OpenBLAS, and --isa amx without it, naming the fix; the CLI exits 2 before reading any data (P8)", () => {
  assert.throws(() => parseArgs(["--precision", "fp16"]), /--precision "fp16" is not one of fp32, bf16/);
  assert.equal(parseArgs([]).config.precision, "fp32", "fp32 unless asked");
  assert.equal(parseArgs(["--precision", "bf16"]).config.precision, "bf16");
  const cases: [string[], RegExp][] = [
    [
      ["--precision", "bf16", "--backend", "wasm"],
      /--precision bf16 runs on the native engine's own GEMM, and --backend wasm computes in fp32 only: run node dist\/main\.js .*--backend native \(bf16 on the native engine\), or node dist\/main\.js .* \(fp32\) \[P8\]/,
    ],
    [
      ["--precision", "bf16", "--gemm", "openblas"],
      /--precision bf16 runs on the built-in GEMM, not --gemm openblas: run node dist\/main\.js .* \(bf16 on the built-in GEMM\), or node dist\/main\.js (?:(?!--precision bf16).)*--gemm openblas(?:(?!--precision bf16).)* \(fp32 on --gemm openblas\) \[P8\]/,
    ],
    // what this CPU runs decides the fixes (cli.advice.test.ts runs them): refused at start, not by the parser
    [
      ["--isa", "amx"],
      "reason" in loadNative()
        ? /--isa amx is not available: .* \[P1\]/
        : /--isa amx is a bf16 kernel \(AMX-BF16\), and this run computes in fp32.*: run node dist\/main\.js .* --isa \w+ \(fp32 products\)/,
    ],
    [
      ["--isa", "avx512bf16"],
      "reason" in loadNative()
        ? /--isa avx512bf16 is not available: .* \[P1\]/
        : /--isa avx512bf16 is a bf16 kernel \(AVX512_BF16\), and this run computes in fp32.*: run node dist\/main\.js .* --isa \w+ \(fp32 products\)/,
    ],
  ];
  for (const [args, msg] of cases) {
    if (args[0] === "--isa")
      assert.equal(parseArgs(args).config.isa, args[1], "the parser leaves it to the engine check");
    else assert.throws(() => parseArgs(args), msg);
    const cli = spawnSync(
      process.execPath,
      [path.join(DIST, "main.js"), ...args, "--root", "/nonexistent/mix", "--dry-run"],
      {
        encoding: "utf8",
        timeout: 120_000,
      },
    );
    assert.equal(cli.status, 2, `${args.join(" ")}: ${cli.stderr}`);
    assert.match(cli.stderr + cli.stdout, msg);
    assert.doesNotMatch(cli.stderr + cli.stdout, /no manifest at|\[D1\]/, "refused before the data is read");
  }
});

test("--precision bf16 with --backend auto takes the native engine with bf16 products (P8)", {
  skip: skipNoNative,
}, async () => {
  const e = await initEngine("auto", { gemm: "builtin", isa: "auto", precision: "bf16" });
  assert.equal(e.engine, "native");
  // AMX where the CPU has it, else VDPBF16PS where it has AVX512_BF16, else the emulation on the fp32 kernel, which
  // the line says
  const g = bf16Support();
  assert.match(
    e.detail,
    g?.hw
      ? /built-in amx, .*bf16 products, fp32 accumulation/
      : g?.dp
        ? /built-in avx512bf16, AVX512_BF16 6x32 \(VDPBF16PS\) micro-kernel, bf16 products, fp32 accumulation/
        : /bf16 products \(TDPBF16PS emulated(: [^)]*)?\), fp32 accumulation/,
  );
});

test("the addon's build script never fails the install: without a compiler it exits 0 with one line naming the fix", () => {
  const script = path.join(DIST, "..", "scripts", "build-native.cjs");
  for (const env of [{ CC: "/nonexistent/cc" }, { TSTRAIN_SKIP_NATIVE: "1" }]) {
    const r = spawnSync(process.execPath, [script], {
      encoding: "utf8",
      timeout: 60_000,
      env: { ...process.env, ...env },
    });
    assert.equal(r.status, 0, r.stderr);
    const lines = r.stdout.trim().split("\n");
    assert.equal(lines.length, 1, r.stdout);
    assert.match(
      lines[0],
      /^tstrain: native engine not built \((no C compiler \(\/nonexistent\/cc\)|TSTRAIN_SKIP_NATIVE=1)\); the tfjs engine will be used\. Fast path: apt-get install build-essential python3 .*npm run build:native/,
    );
  }
});

/** What the bench's and the tests' probes addon registers (native/probes.c); the production addon registers none. */
const PROBE_EXPORTS = [
  "gemm",
  "gemmBf16",
  "gemmBf16Hw",
  "gemmPeak",
  "vmath",
  "streamProbe",
  "attentionForwardProfiled",
  "attentionBackwardProfiled",
  "attentionProfile",
];
/** The probes' and the peak's C names (native/probes.c, native/peak.c, ops/rows.c's vmath copies). */
const PROBE_SYMBOLS = [
  "gemm_fma_peak",
  "gemm_dp_peak",
  "gemm_bf16_peak",
  "gemm_thread_seconds",
  "attention_forward_profiled",
  "attention_backward_profiled",
  "vmath_exp",
  "vmath_log",
  "probes_define",
];

test("the production addon registers no probe and holds no probe or peak symbol; the probes addon holds them all", {
  skip: skipNoNative,
}, () => {
  const release = path.join(DIST, "..", "build", "Release");
  const load = (f: string) => Object.getOwnPropertyNames(require(path.join(release, f))); // napi_default: not enumerable
  const engine = load("tstrain_native.node"),
    probes = load("tstrain_probes.node");
  assert.ok(engine.includes("matmul") && engine.includes("setGemm"), engine.join(", "));
  assert.deepEqual(
    PROBE_EXPORTS.filter((x) => engine.includes(x)),
    [],
    "tstrain_native.node registers a probe",
  );
  assert.deepEqual(
    PROBE_EXPORTS.filter((x) => !probes.includes(x)),
    [],
    "tstrain_probes.node registers every probe",
  );
  // the symbols' names, dynamic or local (the property names are strings in the file too)
  const bytes = (f: string) => fs.readFileSync(path.join(release, f)).toString("latin1");
  const e = bytes("tstrain_native.node"),
    p = bytes("tstrain_probes.node");
  const holds = (file: string, names: string[]) => names.filter((n) => new RegExp(`\\b${n}\\b`).test(file));
  assert.deepEqual(holds(e, [...PROBE_SYMBOLS, "gemmPeak", "streamProbe", "attentionProfile"]), []);
  assert.deepEqual(
    holds(p, ["gemm_fma_peak", "gemm_dp_peak", "attention_forward_profiled", "gemmPeak", "streamProbe"]),
    ["gemm_fma_peak", "gemm_dp_peak", "attention_forward_profiled", "gemmPeak", "streamProbe"],
    "the search finds them where they are",
  );
});

test("production never loads the probes: no src/ file names them, and the bf16 start line leaves them unloaded", {
  skip: skipNoNative,
}, () => {
  const src = path.join(DIST, "..", "src");
  const named: string[] = [];
  const walk = (d: string) => {
    for (const x of fs.readdirSync(d, { withFileTypes: true })) {
      const f = path.join(d, x.name);
      if (x.isDirectory()) walk(f);
      else if (x.name.endsWith(".ts")) {
        const t = fs.readFileSync(f, "utf8");
        if (/["'](\.\.\/)+bench\/|tstrain_probes/.test(t)) named.push(path.relative(src, f));
      }
    }
  };
  walk(src);
  assert.deepEqual(named, [], "src/ imports bench/ or names the probes addon");
  if (!fs.existsSync("/proc/self/maps")) return; // the loaded-objects check is Linux's
  const script = `
    const { loadNative } = require("./src/model/engine/native");
    const { bf16Warning } = require("./src/run");
    const n = loadNative({ gemm: "builtin", isa: "auto", precision: "bf16" });
    const line = bf16Warning("bf16", "auto");
    const maps = require("node:fs").readFileSync("/proc/self/maps", "utf8");
    console.log(JSON.stringify({ kernels: "kernels" in n, line, engine: maps.includes("tstrain_native.node"), probes: maps.includes("tstrain_probes.node") }));`;
  const r = spawnSync(process.execPath, ["-e", script], { cwd: DIST, encoding: "utf8", timeout: 60_000 });
  assert.equal(r.status, 0, r.stderr);
  const got = JSON.parse(r.stdout.trim().split("\n").pop() ?? "{}");
  assert.equal(got.kernels, true, r.stdout);
  assert.equal(got.engine, true, "the engine is loaded");
  assert.equal(got.probes, false, `the start line loaded the probes addon: ${r.stdout}`);
});
