#!/bin/sh
# The installed library's ABI: the dynamic symbols libxenprobes.so defines must be exactly the
# list in libxenprobes/xenprobes.abi (demangled, with their version node). A symbol exported by
# accident (an internal class, a vtable of the engine) or one dropped fails; a deliberate
# change updates the list in the same commit:
#
#   sh tests/abi/check-abi.sh build/lib/libxenprobes.so libxenprobes/xenprobes.abi [--update]
set -eu
lib=$1
list=$2
actual=$(nm -D --defined-only "$lib" | awk '{print $NF}' | c++filt | LC_ALL=C sort)
if [ "${3:-}" = --update ]; then
  printf '%s\n' "$actual" >"$list"
  exit 0
fi
if ! printf '%s\n' "$actual" | diff -u "$list" - ; then
  echo "check-abi: $lib does not export exactly $list (- expected, + exported)." >&2
  echo "An accidental export: give the symbol hidden visibility. A deliberate change: run" >&2
  echo "  sh tests/abi/check-abi.sh $lib $list --update" >&2
  exit 1
fi
echo "check-abi: $(printf '%s\n' "$actual" | wc -l) symbols, as listed"
