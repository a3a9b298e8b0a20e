#!/usr/bin/env bash
# Mesa 25's Vulkan drivers (lavapipe: the software adapter the webgpu engine runs on without a GPU) on Debian 12,
# from the bookworm-backports suite of the Debian mirror apt already installs from: the first URI of apt's sources
# (the `URIs:` of sources.list.d/*.sources, else the `deb` lines of sources.list) that is not the security archive.
# The project names no mirror of its own. This is the one reading of apt's sources: the refusal of
# `--backend webgpu` (src/model/engine/webgpu/device.ts) prints this command, docs/webgpu.md shows it, and .ci/run
# runs it.
#
#   scripts/mesa-backports.sh [--dry-run] [--etc DIR]        (as root)
#
# Where apt's sources do not list bookworm-backports yet, it writes sources.list.d/tstrain-bookworm-backports.sources
# naming that mirror; then `apt-get update` and `apt-get install -t bookworm-backports mesa-vulkan-drivers
# libvulkan1`. --dry-run prints the file it would write and the commands, and changes nothing; --etc DIR reads (and
# writes) apt's configuration under DIR instead of /etc/apt.
# Exit status: 0 installed (or, with --dry-run, printed); 1 apt-get failed (the file it wrote is removed again);
# 2 apt's sources name no mirror (it says what to add by hand), or an unknown argument.
set -euo pipefail

etc=/etc/apt
dry=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --etc)
      [ $# -ge 2 ] || { echo "mesa-backports.sh: --etc needs a folder" >&2; exit 2; }
      etc="$2"
      shift
      ;;
    *) echo "mesa-backports.sh: unknown argument '$1' (it takes --dry-run and --etc DIR)" >&2; exit 2 ;;
  esac
  shift
done

# The mirror: the first http(s) URI of the deb822 sources (files in name order), then of sources.list's deb lines
# (options in brackets skipped), that is not the security archive; empty when there is none.
mirror() {
  local f
  {
    for f in "$etc"/sources.list.d/*.sources; do
      if [ -f "$f" ]; then sed -n 's/^URIs:[[:space:]]*//p' "$f" | tr -s ' \t' '\n'; fi
    done
    if [ -f "$etc/sources.list" ]; then
      sed -n -E 's/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\2/p' "$etc/sources.list"
    fi
  } | grep -E '^https?://' | grep -v security | head -n1 || true
}

file="$etc/sources.list.d/tstrain-bookworm-backports.sources"
install=(apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers libvulkan1)
added=""
if grep -rqs 'bookworm-backports' "$etc/sources.list" "$etc/sources.list.d/"; then
  echo "mesa-backports: apt's sources ($etc) already list bookworm-backports"
else
  url="$(mirror)"
  if [ -z "$url" ]; then
    echo "mesa-backports: apt's sources ($etc) name no Debian mirror: add the bookworm-backports suite (component main) of the mirror you install from to $etc/sources.list.d, then run: apt-get update && ${install[*]}" >&2
    exit 2
  fi
  entry="$(printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg' "$url")"
  if [ -n "$dry" ]; then
    printf 'mesa-backports: would write %s:\n%s\n' "$file" "$entry"
  else
    printf '%s\n' "$entry" >"$file"
    added="$file"
    echo "mesa-backports: wrote $file (bookworm-backports of $url)"
  fi
fi
if [ -n "$dry" ]; then
  echo "mesa-backports: would run: apt-get update -qq && ${install[*]}"
  exit 0
fi
if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${install[@]}"; }; then
  if [ -n "$added" ]; then rm -f "$added"; fi
  echo "mesa-backports: apt-get could not install Mesa 25 from bookworm-backports" >&2
  exit 1
fi
echo "mesa-backports: installed $(dpkg-query -W -f '${Version}' mesa-vulkan-drivers 2>/dev/null || echo 'mesa-vulkan-drivers')"
