#!/bin/sh
# The main job: install dependencies, build, and run the examples — xenprobes-demo (the
# foundation), xenprobes-fig2 (the paper's Figure 2, in C) and xenprobes-trace (C++). Each
# runs on the simulated Xen when this machine is not a Xen Dom0 and says so on its first line.
set -eu
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target xenprobes-demo xenprobes-fig2 xenprobes-trace
echo "== xenprobes-demo"
build/bin/xenprobes-demo "$@"
echo "== xenprobes-fig2"
build/bin/xenprobes-fig2
echo "== xenprobes-trace"
build/bin/xenprobes-trace
