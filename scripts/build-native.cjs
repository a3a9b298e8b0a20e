#!/usr/bin/env node
// Builds the native CPU engine (native/*.c and native/gemm/ -> build/Release/tstrain_native.node; the sources are
// listed in binding.gyp, the layout in native/README.md), the bench's and the tests' probes (native/probes.c,
// native/peak.c and their own copy of the GEMM -> build/Release/tstrain_probes.node, which the trainer never loads)
// and the MPI binding (native/mpi.c -> build/Release/tstrain_mpi.node) with npm's own node-gyp against the local Node
// headers. Runs as the package's
// `install` script during `npm ci`, and by hand as `npm run build:native`. It NEVER fails the install: without a C
// toolchain, Node headers or node-gyp it prints one line saying how to get the fast path and exits 0 (the trainer
// then runs on tfjs). No network: node-gyp is never allowed to download headers (--nodedir points at headers on
// disk, or the build is skipped). BLAS is not linked: the matrix products run on the project's own GEMM
// (native/gemm/); OpenBLAS, only for `--gemm openblas`, is found at run time (dlopen), so this builds without
// OpenBLAS installed.
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const { spawnSync } = require("node:child_process");

const root = path.join(__dirname, "..");
const logFile = path.join(root, "build", "native-build.log");
const FIX = "apt-get install build-essential python3 (a C toolchain), then `npm run build:native`";

function skip(reason) {
  process.stdout.write(
    `tstrain: native engine not built (${reason}); the tfjs engine will be used. Fast path: ${FIX}\n`,
  );
  process.exit(0);
}

function has(cmd, args) {
  const r = spawnSync(cmd, args, { stdio: "ignore", timeout: 20_000 });
  return r.status === 0;
}

if (process.env.TSTRAIN_SKIP_NATIVE === "1") skip("TSTRAIN_SKIP_NATIVE=1");

// node-gyp: the one npm runs lifecycle scripts with, else npm's bundled copy beside this node, else a local one.
const gypCandidates = [
  process.env.npm_config_node_gyp,
  path.join(
    path.dirname(process.execPath),
    "..",
    "lib",
    "node_modules",
    "npm",
    "node_modules",
    "node-gyp",
    "bin",
    "node-gyp.js",
  ),
  path.join(root, "node_modules", "node-gyp", "bin", "node-gyp.js"),
].filter(Boolean);
const gyp = gypCandidates.find((p) => fs.existsSync(p));
if (!gyp) skip("node-gyp not found (npm's bundled copy is missing)");

// headers on disk only: npm's nodedir setting, else the prefix this node was installed under.
const nodedirCandidates = [process.env.npm_config_nodedir, path.join(path.dirname(process.execPath), "..")].filter(
  Boolean,
);
const nodedir = nodedirCandidates.find((d) => fs.existsSync(path.join(d, "include", "node", "node_api.h")));
if (!nodedir) skip("no Node headers on disk (include/node/node_api.h); set `npm config set nodedir <prefix>`");

const cc = process.env.CC || "cc";
if (!has(cc, ["--version"])) skip(`no C compiler (${cc})`);
if (!has("make", ["--version"])) skip("no make");
const python = process.env.npm_config_python || process.env.PYTHON || "python3";
if (!has(python, ["--version"])) skip(`no ${python} (node-gyp needs it)`);

const args = [gyp, "rebuild", `--nodedir=${path.resolve(nodedir)}`, `--python=${python}`];
const r = spawnSync(process.execPath, args, {
  cwd: root,
  encoding: "utf8",
  timeout: 300_000,
  env: { ...process.env, npm_config_nodedir: path.resolve(nodedir) },
});
fs.mkdirSync(path.dirname(logFile), { recursive: true }); // `rebuild` removed build/ first
fs.writeFileSync(logFile, `$ node ${args.join(" ")}\n${r.stdout ?? ""}${r.stderr ?? ""}`);
const built = path.join(root, "build", "Release", "tstrain_native.node");
// `rebuild` starts from an empty build/: the engine is there only if this run made it (a later target may still fail)
if (!fs.existsSync(built)) {
  const why = r.error ? r.error.message : `node-gyp exited ${r.status}`;
  skip(`${why}; log: ${path.relative(process.cwd(), logFile)}`);
}
// The MPI binding is another target of binding.gyp: libmpi is dlopened at run time, so it builds without MPI.
const mpiBuilt = path.join(root, "build", "Release", "tstrain_mpi.node");
if (!fs.existsSync(mpiBuilt))
  process.stdout.write(
    `tstrain: the MPI binding was not built (see ${path.relative(process.cwd(), logFile)}); --dist mpi will be refused\n`,
  );
// The probes (bench/native-probes.ts loads them): the trainer runs without them; the bench's GEMM, peak and profile
// cases and their tests refuse, naming this script.
const probesBuilt = path.join(root, "build", "Release", "tstrain_probes.node");
if (!fs.existsSync(probesBuilt))
  process.stdout.write(
    `tstrain: the bench's probes were not built (see ${path.relative(process.cwd(), logFile)}); the bench's native probes will be refused\n`,
  );
process.stdout.write(
  `tstrain: native engine built (${path.relative(root, built)}); matrix products on its own GEMM (OpenBLAS only with --gemm openblas)\n`,
);
