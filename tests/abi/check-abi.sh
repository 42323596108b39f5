#!/bin/sh
# The installed library's ABI: the dynamic symbols libxenprobes.so defines must be exactly the
# list in libxenprobes/xenprobes.abi (demangled, with their version node). A symbol exported by
# accident (an internal class, a vtable of the engine) or one dropped fails; a deliberate
# change updates the list in the same commit. A line starting with "? " is a symbol the
# compiler emits in some builds only (the vtables of the public abstract classes, which an
# unoptimised build keeps): it may be missing, never unlisted.
#
#   sh tests/abi/check-abi.sh build/lib/libxenprobes.so libxenprobes/xenprobes.abi [--update]
set -eu
lib=$1
list=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only "$lib" | awk '{print $NF}' | c++filt | LC_ALL=C sort -u >"$tmp/actual"
if [ "${3:-}" = --update ]; then
  grep '^? ' "$list" >"$tmp/optional" || true
  sed 's/^? //' "$tmp/optional" | LC_ALL=C sort -u >"$tmp/opt"
  { LC_ALL=C comm -23 "$tmp/actual" "$tmp/opt"; cat "$tmp/optional"; } >"$list"
  exit 0
fi
grep -v '^? ' "$list" | LC_ALL=C sort -u >"$tmp/required"
sed -n 's/^? //p' "$list" | LC_ALL=C sort -u >"$tmp/optional"
LC_ALL=C sort -u "$tmp/required" "$tmp/optional" >"$tmp/allowed"
missing=$(LC_ALL=C comm -23 "$tmp/required" "$tmp/actual")
extra=$(LC_ALL=C comm -13 "$tmp/allowed" "$tmp/actual")
if [ -n "$missing$extra" ]; then
  echo "check-abi: $lib does not export exactly $list." >&2
  [ -z "$missing" ] || printf 'listed but not exported:\n%s\n' "$missing" >&2
  [ -z "$extra" ] || printf 'exported but not listed:\n%s\n' "$extra" >&2
  echo "An accidental export: give the symbol hidden visibility. A deliberate change: run" >&2
  echo "  sh tests/abi/check-abi.sh $lib $list --update" >&2
  exit 1
fi
echo "check-abi: $(wc -l <"$tmp/actual") symbols, as listed"
