#!/usr/bin/env bash
# Same bits? Faster? Two versions of the GEMM (native/gemm/) side by side, one thread:
#
#   bench/native/gemm-ab.sh OLD [NEW] [PRODUCT...]
#
# OLD and NEW: git revisions, or "." for the working tree (NEW defaults to "."). PRODUCT: TATB:MxNxK:beta
# [:lda/ldb/ldc] (default: the frozen model's 44 products at seq 256 and 1024, as the bench's gemm case runs them).
# Each version is built as the addon builds the GEMM (binding.gyp's flags): native/gemm/**/*.c and native/peak.c, or
# native/gemm.c alone in a revision from before the split into native/gemm/ (either side may be either layout).
# gemm-bits then hashes 4,734 products on every kernel this CPU runs (a difference is reported and fails the
# script), and gemm-ab times the products in pairs (environment: ISA, N, COLD, COLDC; see gemm-ab.c). Run nothing
# else meanwhile.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
here="$root/bench/native"
old=${1:?usage: bench/native/gemm-ab.sh OLD [NEW] [PRODUCT...]}
shift
new=.
if [ $# -gt 0 ] && [[ $1 != *:*x*x* ]]; then new=$1; shift; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-O3 -ffp-contract=off -fno-fast-math -fno-trapping-math -std=c11 -D_GNU_SOURCE -fPIC -shared)

build() { # REV NAME: NAME.so from REV's GEMM sources (its native/ tree, as git has it or the working tree)
  mkdir -p "$work/$2"
  if [ "$1" = . ]; then cp -R "$root/native/." "$work/$2/"; else git -C "$root" archive "$1" native | tar -x -C "$work/$2" --strip-components=1; fi
  local src=("$work/$2/gemm.c")
  if [ ! -e "${src[0]}" ]; then
    mapfile -t src < <(find "$work/$2/gemm" -name '*.c' | sort)
    [ -e "$work/$2/peak.c" ] && src+=("$work/$2/peak.c")
  fi
  cc "${flags[@]}" "${src[@]}" -o "$work/$2.so" -lm -lpthread
}
build "$old" old
build "$new" new
cc -O2 -std=c11 -D_GNU_SOURCE "$here/gemm-bits.c" -o "$work/bits" -ldl
cc -O2 -std=c11 -D_GNU_SOURCE "$here/gemm-ab.c" -o "$work/ab" -ldl -lm

"$work/bits" "$work/old.so" >"$work/old.bits"
"$work/bits" "$work/new.so" >"$work/new.bits"
# each kernel's hash against the same kernel's (by label: a kernel one side lacks, such as VDPBF16PS before it was
# written, is listed and not compared)
same=yes
awk 'NR == FNR { old[$1] = $5; next }
  { seen[$1] = 1; d = !($1 in old) ? "(new only)" : old[$1] == $5 ? "same" : "DIFFERENT"; if (d == "DIFFERENT") bad = 1
    printf "bits %-15s old %-16s new %s %s\n", $1, ($1 in old ? old[$1] : "-"), $5, d }
  END { for (l in old) if (!(l in seen)) printf "bits %-15s old %s new %-16s (old only)\n", l, old[l], "-"; exit bad }' \
  "$work/old.bits" "$work/new.bits" || same=no

if [ $# -eq 0 ]; then # the frozen model's products (bench/gemm-shapes.ts), seq 256 then 1024
  set -- NT:256x576x576:0 NT:256x576x576:1 NT:256x192x576:0 NT:256x1536x576:0 NT:256x576x1536:1 \
    NT:256x49152x576:0 NN:256x576x576:0 NN:256x576x192:1 NN:256x576x1536:0 NN:256x576x1536:1 NN:256x1536x576:0 \
    NN:256x576x49152:0 TN:576x576x256:1 TN:192x576x256:1 TN:1536x576x256:1 TN:576x1536x256:1 TN:49152x576x256:1 \
    NN:64x256x64:0:576/256/256 NN:64x64x256:1:256/192/64 NN:256x64x64:0:576/256/64 NN:192x64x64:1:64/192/576 \
    TN:64x64x256:1:64/576/192 \
    NT:1024x576x576:0 NT:1024x576x576:1 NT:1024x192x576:0 NT:1024x1536x576:0 NT:1024x576x1536:1 \
    NT:341x49152x576:0 NN:1024x576x576:0 NN:1024x576x192:1 NN:1024x576x1536:0 NN:1024x576x1536:1 \
    NN:1024x1536x576:0 NN:341x576x49152:0 TN:576x576x1024:1 TN:192x576x1024:1 TN:1536x576x1024:1 \
    TN:576x1536x1024:1 TN:49152x576x341:1 NN:64x256x64:0:576/1024/256 NN:64x64x256:1:256/192/64 \
    NN:1024x64x64:0:576/1024/64 NN:960x64x64:1:64/192/576 TN:64x64x1024:1:64/576/192
fi
"$work/ab" "$work/old.so" "$work/new.so" "$@"
[ "$same" = yes ] || { echo "gemm-ab: the two versions give different bits" >&2; exit 1; }
