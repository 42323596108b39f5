#!/bin/sh
# The test suite: install dependencies, build with -Werror, run every test; then build again
# with AddressSanitizer + UndefinedBehaviorSanitizer and run every test under them.
set -eu
cd "$(dirname "$0")/.."
tools/install-deps.sh
jobs="$(nproc)"

echo "== build (RelWithDebInfo, -Werror)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXENPROBES_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DXENPROBES_WERROR=ON \
  -DXENPROBES_SANITIZE="address;undefined" -DXENPROBES_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-asan -j"$jobs"
echo "== tests under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
