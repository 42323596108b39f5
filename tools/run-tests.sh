#!/bin/sh
# The test suite: install dependencies, build with -Werror, run every test; then build again
# with AddressSanitizer + UndefinedBehaviorSanitizer and run every test under them; then the
# end-to-end scenarios on a real Xen under QEMU. Any test that fails fails the run: nothing is
# run again (a retry turns an intermittent bug into a pass).
set -eu
cd "$(dirname "$0")/.."
# stage <what>: a stage's heading with the time since the start (CI's limit is 90 min; the
# stages' times say where it goes).
T0=$(date +%s)
stage() { echo "== $* [+$(($(date +%s) - T0)) s]"; }
tools/install-deps.sh
# Every program the host-side scripts run must come from a package they install (a fresh
# machine once stopped at the e2e images for want of kmod): a check of seconds, before the
# long stages.
sh tools/check-host-commands.sh
# Every include goes down the library's layers (docs/architecture.md).
sh tools/check-layers.sh
# No source file of the library or of the guest module over 600 lines (issue 13).
sh tools/check-file-size.sh
# Every Dom0, test and tool source laid out as .clang-format says (clang-format 14).
sh tools/check-format.sh
jobs="$(nproc)"
# Compile through ccache (tools/build-cache.sh): a clean clone then rebuilds from the cache.
. tools/build-cache.sh
# This run's hits and misses, printed at the end.
if [ "$XP_CCACHE" = 1 ]; then
  export CCACHE_STATSLOG="$(pwd)/build/ccache-stats.log"
  mkdir -p build && : >"$CCACHE_STATSLOG"
fi
# Debian's 6.1 and 6.12 kernels for the kallsyms and BTF test on real images
# (docs/guest-symbols.md); cached, fetched once.
sh tools/fetch-debian-kernels.sh

stage "build (RelWithDebInfo, -Werror)"
# shellcheck disable=SC2086
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXENPROBES_WERROR=ON $XP_CMAKE_LAUNCHER >/dev/null
cmake --build build -j"$jobs"
stage "tests"
ctest --test-dir build --output-on-failure -j"$jobs"
stage "clang-tidy (.clang-tidy) over the library, xenprobe and xenprobesd"
sh tools/check-tidy.sh build

stage "build (ASan + UBSan)"
# shellcheck disable=SC2086
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DXENPROBES_WERROR=ON $XP_CMAKE_LAUNCHER \
  -DXENPROBES_SANITIZE="address;undefined" -DXENPROBES_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-asan -j"$jobs"
stage "tests under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

# Every input a guest or a file controls, fuzzed for a bounded time (docs/reliability.md): the
# replays of the seeds and regressions already ran above; this searches for new inputs.
stage "fuzzing (libFuzzer, ${XENPROBES_FUZZ_SECONDS:-20} s per target)"
sh tools/fuzz.sh "${XENPROBES_FUZZ_SECONDS:-20}"

# End to end on a real Xen under QEMU (TCG): docs/e2e.md. Needs root (debootstrap, chroot,
# mkfs) and Debian's mirror; caches ~11 GB in /var/cache/xenprobes-e2e. XENPROBES_E2E=0
# leaves it out (e.g. a quick local run).
if [ "${XENPROBES_E2E:-1}" = 0 ]; then
  stage "end-to-end suite left out (XENPROBES_E2E=0)"
elif [ "$(id -u)" != 0 ]; then
  echo "== end-to-end suite NOT run: it needs root (sudo sh tools/run-tests.sh, or XENPROBES_E2E=0)" >&2
  exit 1
else
  # --group: up to six consecutive scenarios on the same platform and hypervisor share a boot
  # (a Dom0 boot each saved; docs/e2e.md "Timings"), which keeps the suite well inside CI's time.
  stage "end-to-end on a real Xen under QEMU (tools/e2e/run.sh --group)"
  bash tools/e2e/run.sh --group
fi
if [ -n "${CCACHE_STATSLOG:-}" ] && [ -s "$CCACHE_STATSLOG" ]; then
  stage "ccache, this run's builds (the e2e payloads' included, the Debian 13 one's not)"
  ccache --show-log-stats | sed -n '1,/Misses/p'
fi
stage "done"
