#!/bin/sh
# A Dom0 program does not carry Unicorn (docs/architecture.md, "The simulated Xen, a library of
# its own"): libxenprobes.so and the library's own programs have no DT_NEEDED entry for
# libunicorn; libxenprobes-sim.so, which holds the simulation, has one (so that this check sees
# what it looks for).
#
#   sh tests/abi/check-needed.sh <libxenprobes-sim.so> <libxenprobes.so or program>...
set -eu
sim=$1
shift
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*Shared library: \[\(.*\)\]/\1/p'; }
if ! needed "$sim" | grep -q unicorn; then
  echo "check-needed: $sim does not need Unicorn: this check cannot see what it looks for" >&2
  exit 1
fi
status=0
for f in "$@"; do
  if needed "$f" | grep -q unicorn; then
    echo "check-needed: $f needs Unicorn:" >&2
    needed "$f" | sed 's/^/  /' >&2
    status=1
  else
    echo "check-needed: $(basename "$f") needs $(needed "$f" | tr '\n' ' ')- no Unicorn"
  fi
done
if [ "$status" != 0 ]; then
  echo "check-needed: only libxenprobes-sim.so may link Unicorn (libxenprobes/CMakeLists.txt)" >&2
  exit 1
fi
echo "check-needed: $(basename "$sim") needs $(needed "$sim" | grep unicorn)"
