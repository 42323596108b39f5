#!/bin/sh
# The main job: install dependencies, build, and run xenprobes-demo (on the simulated Xen
# when this machine is not a Xen Dom0; it says so on its first line).
set -eu
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target xenprobes-demo
exec build/bin/xenprobes-demo "$@"
