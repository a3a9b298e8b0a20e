#!/usr/bin/env bash
# The frozen model's step on a GPU, one command, nothing fetched (a GPU machine may reach no registry):
#
#   bench/gpu.sh [OUT]        e.g. bench/gpu.sh bench/results/gpu
#
# Needs the tree as built here: node_modules (npm ci, with the optional `webgpu` package) and dist (npm run build).
# Runs the bench's webgpu case at the recipe's shape (seq 1024, micro-batch 4; SEQ=, MB=, CALLS= override) and
# prints the adapter, the probed fp32 FMA peak, tok/s and mfu_of_peak of one forward+backward, the device time per
# kernel family (timestamp queries), and the dispatches and bytes per optimizer step. About 3 minutes on an H200 by
# the estimate in docs/webgpu.md; timeout 600 s.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/gpu}
[ -e dist/bench/bench.js ] || {
  echo "gpu.sh: no build here: run npm ci && npm run build on a machine with the registry, then copy the tree" >&2
  exit 2
}
node -e 'const w = require("./dist/src/model/engine/webgpu/device").probeWebgpuSync(); console.log(w.name ?? `no adapter: ${w.reason}; fix: ${w.fix}`); if (!w.name) process.exit(2)'
timeout 600 node dist/bench/bench.js --cases webgpu --seq "${SEQ:-1024}" --micro-batch "${MB:-4}" --steps "${CALLS:-3}" --out "$out"
node -e '
const fs = require("fs"), p = require("path");
const dir = process.argv[1];
const f = p.join(dir, "latest.json");
const rows = JSON.parse(fs.readFileSync(f, "utf8")).rows ?? [];
const w = rows.find((r) => r.case === "webgpu");
if (!w) { console.error(`gpu.sh: no webgpu row in ${f}`); process.exit(1); }
console.log(`adapter: ${w.adapter}`);
console.log(`peak ${w.peak_gflops} GFLOP/s; fwd+bwd ${w.step_ms_median} ms at ${w.seq_len} x ${w.micro_batch}: ${w.tok_per_s} tok/s, mfu_of_peak ${w.mfu_of_peak}`);
for (const k of w.profile.kernels ?? []) console.log(`  ${k.kernel.padEnd(28)} ${String(k.calls).padStart(5)} calls ${k.device_ms.toFixed(1).padStart(9)} ms  ${(100 * k.share).toFixed(1)} %`);
const c = w.counts;
console.log(`per optimizer step (seq 1024 x 4, accum 8): ${c.dispatches_per_micro} dispatches/micro-batch; up ${JSON.stringify(c.up)} B, down ${JSON.stringify(c.down)} B; ${c.bytes_over_floor}x weights-up + gradient-down`);
' "$out"
