#!/bin/sh
# The main job: install dependencies, build, and run the examples — xenprobes-doctor (what
# can probe what), xenprobes-demo (the foundation), xenprobes-fig2 and xenprobes-fig3 (the
# paper's Figures 2 and 3, in C) and xenprobes-trace (C++). Each runs on the simulated Xen
# when this machine is not a Xen Dom0 and says so on its first line.
set -eu
cd "$(dirname "$0")/.."
tools/install-deps.sh
. tools/build-cache.sh
# shellcheck disable=SC2086
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo $XP_CMAKE_LAUNCHER >/dev/null
cmake --build build -j"$(nproc)" --target xenprobes-doctor xenprobes-demo xenprobes-fig2 xenprobes-fig3 xenprobes-trace
echo "== xenprobes-doctor"
build/bin/xenprobes-doctor
echo "== xenprobes-demo"
build/bin/xenprobes-demo "$@"
echo "== xenprobes-fig2"
build/bin/xenprobes-fig2
echo "== xenprobes-fig3"
build/bin/xenprobes-fig3
echo "== xenprobes-trace"
build/bin/xenprobes-trace
