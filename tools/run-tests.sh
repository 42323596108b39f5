#!/bin/sh
# The test suite: install dependencies, build with -Werror, run every test; then build again
# with AddressSanitizer + UndefinedBehaviorSanitizer and run every test under them. A failing
# test is run once more (ctest --repeat until-pass:2) and the first failure stays in the log:
# the simulated Xen runs guest vCPUs on threads, and a loaded CI machine has shown one
# unexplained failure (see the issue notes); a test that fails twice fails the run.
set -eu
cd "$(dirname "$0")/.."
tools/install-deps.sh
jobs="$(nproc)"

echo "== build (RelWithDebInfo, -Werror)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXENPROBES_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs" --repeat until-pass:2

echo "== build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DXENPROBES_WERROR=ON \
  -DXENPROBES_SANITIZE="address;undefined" -DXENPROBES_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-asan -j"$jobs"
echo "== tests under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" --repeat until-pass:2
