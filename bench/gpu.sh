#!/usr/bin/env bash
# The GPU rank as it trains, one command, nothing fetched (a GPU machine may reach no registry):
#
#   bench/gpu.sh [--software] [OUT]        e.g. bench/gpu.sh bench/results/gpu   (default OUT: bench-out/gpu)
#
# Needs the tree as built here: node_modules (npm ci, with the optional `webgpu` package) and dist (npm run build).
# Runs bench/gpu-rank.ts: the actor runtime on the webgpu engine, whole optimizer steps at the recipe's shape (seq
# 1024, micro-batch 4) of 8 micro-batches each, the fold on the device, the overlap, the reduce and AdamW; prints the
# adapter, the probed fp32 FMA peak, tok/s and mfu_of_peak, bytes up and down per step, dispatches and host
# milliseconds per micro-batch, the device time per shader of one micro-batch, the frozen step's counted bytes and
# dispatches, and with several GPUs the same at --world GPUS with the ratio to world 1; writes OUT/gpu.json.
# SEQ=, MB=, ACCUM= (at least 8), STEPS= (timed, 3), LAYERS=, HIDDEN=, VOCAB=, GPUS= (nvidia-smi's count, else 1)
# override. A software adapter (llvmpipe: the CPU) is refused unless --software, which measures it at a small shape.
# Within 5 minutes on a data-centre GPU by the estimate in docs/webgpu.md; it stops timing at 540 s and prints what it
# measured; timeout 600 s.
set -euo pipefail
cd "$(dirname "$0")/.."
software=()
out=bench-out/gpu
for a in "$@"; do
  case "$a" in
    --software) software=(--software) ;;
    -*)
      echo "gpu.sh: unknown flag $a (usage: bench/gpu.sh [--software] [OUT])" >&2
      exit 2
      ;;
    *) out=$a ;;
  esac
done
[ -e dist/bench/gpu-rank.js ] || {
  echo "gpu.sh: no build here: run npm ci && npm run build on a machine with the registry, then copy the tree" >&2
  exit 2
}
gpus=${GPUS:-$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)}
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || gpus=1
args=(--out "$out" --gpus "$gpus")
for v in SEQ:--seq MB:--micro-batch ACCUM:--accum STEPS:--steps LAYERS:--layers HIDDEN:--hidden VOCAB:--vocab; do
  name=${v%%:*}
  if [ -n "${!name:-}" ]; then args+=("${v#*:}" "${!name}"); fi
done
exec timeout 600 node dist/bench/gpu-rank.js "${software[@]}" "${args[@]}"
