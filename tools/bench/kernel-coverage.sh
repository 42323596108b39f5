#!/bin/sh
# Coverage of real kernels (issue 14, docs/benchmarks.md "Coverage of a real kernel"): every
# instruction of every function of Debian's kernels in the cache that
# tools/fetch-debian-kernels.sh fills, and the share the library would probe on the vmevent
# channel, boost, and replace with a jump (5-byte regions, and with the engine's two rules:
# tail calls proven, short jumps to islands), with per-reason counts (bench/kernel_coverage.cpp).
# A benchmark, not a test (~100 s for 6.1, ~120 s for 6.12 on 2 shared cores at load average
# 6-10); ctest runs it over a slice (--every) to show it works.
#
#   sh tools/bench/kernel-coverage.sh [--build DIR] [--bin PROGRAM] [--every N] [--examples] [release...]
#
# release: a directory of the cache (default: every one holding vmlinux and System.map);
# --build: the CMake build directory to build the program in (default: build);
# --bin: run this kernel_coverage instead of building it; --every N: every Nth function only;
# --examples: one instruction per reason. XENPROBES_KERNEL_CACHE moves the cache.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
cache=${XENPROBES_KERNEL_CACHE:-/var/cache/xenprobes-kernels}
build=$top/build
bin=
every=1
examples=
usage() {
  echo "usage: sh tools/bench/kernel-coverage.sh [--build DIR] [--bin PROGRAM] [--every N] [--examples] [release...]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case $1 in
    --build) [ $# -ge 2 ] || usage; build=$2; shift 2 ;;
    --bin) [ $# -ge 2 ] || usage; bin=$2; shift 2 ;;
    --every) [ $# -ge 2 ] || usage; every=$2; shift 2 ;;
    --examples) examples=--examples; shift ;;
    --*) usage ;;
    *) break ;;
  esac
done

if [ -z "$bin" ]; then
  [ -f "$build/CMakeCache.txt" ] || cmake -S "$top" -B "$build" >&2
  cmake --build "$build" --target kernel_coverage -j2 >&2
  bin=$build/bench/kernel_coverage
fi

if [ $# -eq 0 ]; then
  for d in "$cache"/*/; do
    r=$(basename "$d")
    [ -f "$cache/$r/vmlinux" ] && [ -f "$cache/$r/System.map" ] && set -- "$@" "$r"
  done
fi
if [ $# -eq 0 ]; then
  echo "kernel-coverage.sh: no kernel in $cache: run sh tools/fetch-debian-kernels.sh first" >&2
  exit 1
fi

status=0
for r in "$@"; do
  echo "== $r"
  # shellcheck disable=SC2086
  "$bin" --every "$every" $examples "$cache/$r/vmlinux" "$cache/$r/System.map" || status=1
  echo
done
exit $status
