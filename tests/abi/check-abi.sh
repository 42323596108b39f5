#!/bin/sh
# The installed library's ABI: the dynamic symbols libxenprobes.so defines must be exactly the
# list in libxenprobes/xenprobes.abi (demangled, with their version node). The linker's version
# script is written from that list (libxenprobes/abi-to-map.cmake), so the list and the exports
# agree by construction; what this holds besides is that the list and the sources agree:
# when <lib>'s directory has <name>.objects (libxenprobes.objects, the objects the library is
# linked from, one a line: libxenprobes/CMakeLists.txt), every symbol those objects mark for
# export must be listed: the C functions (a global default-visibility symbol whose name is a C
# identifier) and the default-visibility symbols of the xenprobes namespace, its classes'
# typeinfo and vtables. A public function missing from the list (a line dropped) fails, and so
# does a symbol exported by accident (an internal class left with default visibility), which
# the list then has to name to be exported. A line starting with "? " is a symbol the
# compiler emits in some builds only (the vtables of the public abstract classes, which an
# unoptimised build keeps): it may be missing, never unlisted.
#
#   sh tests/abi/check-abi.sh build/lib/libxenprobes.so libxenprobes/xenprobes.abi [--update]
#
# --update rewrites the list: the exports and the symbols the objects mark, a new one under the
# newest version node of the list.
set -eu
lib=$1
list=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only "$lib" | awk '{print $NF}' | c++filt | LC_ALL=C sort -u >"$tmp/actual"
objects=$(dirname "$lib")/$(basename "$lib" | sed 's/\.so.*//').objects
: >"$tmp/marked"
if [ -f "$objects" ]; then
  # shellcheck disable=SC2046 # the object paths have no blanks (CMake's build tree)
  readelf -sW $(cat "$objects") |
    awk '$5 != "LOCAL" && $6 == "DEFAULT" && $7 != "UND" && $8 != "" {print $8}' |
    c++filt | grep -E '^([A-Za-z_][A-Za-z0-9_]*|xenprobes::.*|(typeinfo|vtable).*xenprobes::.*)$' |
    LC_ALL=C sort -u >"$tmp/marked" || true
  [ -s "$tmp/marked" ] || { echo "check-abi: no symbol marked for export in $objects" >&2; exit 1; }
fi
if [ "${3:-}" = --update ]; then
  grep '^? ' "$list" >"$tmp/optional" || true
  sed 's/^? //' "$tmp/optional" | LC_ALL=C sort -u >"$tmp/opt"
  newest=$(grep -v '@' "$list" | sort -V | tail -n 1)
  # Each symbol with the version node it is listed under, a new one under the newest node.
  sed "s/\$/@@$newest/" "$tmp/marked" >"$tmp/marked_v"
  grep -v '^? ' "$list" | grep '@@' >"$tmp/listed" || true
  awk -F'@@' 'NR == FNR { v[$1] = $0; next } { split($0, a, "@@"); print (a[1] in v) ? v[a[1]] : $0 }' \
    "$tmp/listed" "$tmp/marked_v" >"$tmp/marked_listed"
  LC_ALL=C sort -u "$tmp/actual" "$tmp/marked_listed" >"$tmp/all"
  { LC_ALL=C comm -23 "$tmp/all" "$tmp/opt" | awk -F'@@' '!seen[$1]++'; cat "$tmp/optional"; } >"$list"
  exit 0
fi
grep -v '^? ' "$list" | LC_ALL=C sort -u >"$tmp/required"
sed -n 's/^? //p' "$list" | LC_ALL=C sort -u >"$tmp/optional"
LC_ALL=C sort -u "$tmp/required" "$tmp/optional" >"$tmp/allowed"
missing=$(LC_ALL=C comm -23 "$tmp/required" "$tmp/actual")
extra=$(LC_ALL=C comm -13 "$tmp/allowed" "$tmp/actual")
sed 's/@@[^@]*$//' "$tmp/allowed" | LC_ALL=C sort -u >"$tmp/allowed_names"
unlisted=$(LC_ALL=C comm -23 "$tmp/marked" "$tmp/allowed_names")
if [ -n "$missing$extra$unlisted" ]; then
  echo "check-abi: $lib does not export exactly $list." >&2
  [ -z "$missing" ] || printf 'listed but not exported:\n%s\n' "$missing" >&2
  [ -z "$extra" ] || printf 'exported but not listed:\n%s\n' "$extra" >&2
  [ -z "$unlisted" ] || printf 'marked for export in the sources (%s) but not listed:\n%s\n' "$objects" "$unlisted" >&2
  echo "An accidental export: give the symbol hidden visibility. A deliberate change: run" >&2
  echo "  sh tests/abi/check-abi.sh $lib $list --update" >&2
  exit 1
fi
echo "check-abi: $(wc -l <"$tmp/actual") symbols, as listed"
