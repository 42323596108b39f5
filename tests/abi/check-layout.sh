#!/bin/sh
# The layout of the public types (sizes, alignments, the C structs' member offsets) must be
# exactly libxenprobes/xenprobes.layout, recorded for the project version on its first line.
# A program built against other headers reads or writes past a struct whose size changed, so a
# change is either undone or shipped under a new soname (docs/architecture.md "ABI"): --update
# refuses to record a changed or removed line under the version the file already names; new
# lines (a new type, a member at the end of a C struct that grows) need no new version.
#
#   sh tests/abi/check-layout.sh LAYOUT-PROGRAM LAYOUT-FILE INCLUDE-DIR PROJECT-VERSION [--update]
set -eu
prog=$1
file=$2
incdir=$3
version=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$prog" >"$tmp/actual"

# Every struct or class the installed headers define is in the program's output (protocol.h is
# the guest module's wire format, checked by its own static asserts; export.h defines none).
for h in "$incdir"/*.h "$incdir"/*.hpp; do
  case $(basename "$h") in protocol.h | export.h) continue ;; esac
  sed -n -E 's/^[[:space:]]*(struct|class)([[:space:]]+(\[\[[^]]*\]\]|XENPROBES_API))*[[:space:]]+([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*(final[[:space:]]*)?(:[[:space:]][^{;]*)?\{.*$/\4/p' "$h"
done | LC_ALL=C sort -u >"$tmp/defined"
sed -E 's/[ .].*//' "$tmp/actual" | LC_ALL=C sort -u >"$tmp/printed"
unlisted=$(LC_ALL=C comm -23 "$tmp/defined" "$tmp/printed")
if [ -n "$unlisted" ]; then
  echo "check-layout: public types missing from tests/abi/layout.cpp:" >&2
  printf '  %s\n' $unlisted >&2
  echo "Add each (its size, and for a C struct every member's offset), then run --update." >&2
  exit 1
fi

recorded=$(sed -n '1s/^version //p' "$file")
sed 1d "$file" >"$tmp/expected"
LC_ALL=C sort "$tmp/expected" >"$tmp/expected.sorted"
LC_ALL=C sort "$tmp/actual" >"$tmp/actual.sorted"
# Lines that changed or went: a program built against the recorded headers would read or write a
# type differently. Lines that are only new (a new type, a member added at the end of a C
# struct that grows) break nothing.
LC_ALL=C comm -23 "$tmp/expected.sorted" "$tmp/actual.sorted" >"$tmp/gone"
if cmp -s "$tmp/expected" "$tmp/actual"; then
  if [ "${5:-}" = --update ] && [ "$recorded" != "$version" ]; then
    { echo "version $version"; cat "$tmp/actual"; } >"$file"
  fi
  echo "check-layout: $(wc -l <"$tmp/actual") lines, as recorded for $recorded"
  exit 0
fi
if [ "${5:-}" = --update ]; then
  if [ -s "$tmp/gone" ] && [ "$recorded" = "$version" ]; then
    echo "check-layout: the layout changed but the project version is still $version, as recorded:" >&2
    sed 's/^/  was: /' "$tmp/gone" >&2
    echo "a program built against $version's headers would read or write past the changed types." >&2
    echo "Raise the minor version in CMakeLists.txt (project(... VERSION ...); before 1.0 the soname" >&2
    echo "carries it), then run --update again." >&2
    exit 1
  fi
  { echo "version $version"; cat "$tmp/actual"; } >"$file"
  echo "check-layout: recorded for $version"
  exit 0
fi
echo "check-layout: the public types' layout is not the one recorded for $recorded in $file:" >&2
diff -u "$tmp/expected" "$tmp/actual" | sed -n '3,$p' >&2 || true
if [ -s "$tmp/gone" ]; then
  echo "A program built against the recorded headers would read or write past a changed type." >&2
  echo "Keep the layout (C: a new member goes at the end of a struct that grows, or into reserved" >&2
  echo "space), or raise the minor version in CMakeLists.txt and run" >&2
else
  echo "Only additions (new types, members at the end of a C struct that grows): record them with" >&2
fi
echo "  sh tests/abi/check-layout.sh $prog $file $incdir <version> --update" >&2
exit 1
