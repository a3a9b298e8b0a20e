#!/usr/bin/env bash
# An older revision built beside this tree, for the bench's `--attention-base DIR`:
#
#   bench/native/build-base.sh REV DIR      e.g. bench/native/build-base.sh 2babbe7 ../base-2babbe7
#
# REV's files (git archive) go into DIR, which must not exist yet or be empty, and its own
# scripts/build-native.cjs builds its addon there (DIR/build/Release/tstrain_native.node) with the same toolchain
# as `npm run build:native`; its TypeScript is compiled into DIR/dist with this tree's tsc and node_modules (linked);
# DIR/.base-rev names the revision. Nothing of this tree changes.
set -euo pipefail
usage="usage: bench/native/build-base.sh REV DIR   (e.g. bench/native/build-base.sh 2babbe7 ../base-2babbe7)"
rev=${1:?$usage}
dir=${2:?$usage}
root=$(git rev-parse --show-toplevel)
sha=$(git -C "$root" rev-parse --verify --quiet "$rev^{commit}") || {
  echo "build-base: $rev is not a commit of this clone (git log --oneline lists them)" >&2
  exit 2
}
if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
  echo "build-base: $dir exists and is not empty; pick a new folder, or remove it first: rm -r $dir" >&2
  exit 2
fi
mkdir -p "$dir"
git -C "$root" archive "$sha" | tar -x -C "$dir"
git -C "$root" rev-parse --short "$sha" >"$dir/.base-rev"
(cd "$dir" && TSTRAIN_SKIP_NATIVE= node scripts/build-native.cjs)
# its TypeScript too, against this tree's node_modules (the bench's webgpu case runs its dist/)
[ -e "$dir/node_modules" ] || ln -s "$root/node_modules" "$dir/node_modules"
(cd "$dir" && "$root/node_modules/.bin/tsc" -p tsconfig.json)
addon="$dir/build/Release/tstrain_native.node"
[ -e "$addon" ] || {
  echo "build-base: $rev's build made no $addon (its log: $dir/build/native-build.log)" >&2
  exit 1
}
echo "build-base: $(cat "$dir/.base-rev") built in $dir; time it with: npm run bench -- --cases attention --attention-base $dir (or --cases webgpu --webgpu-base $dir)"
