#!/bin/sh
# No source file of the library or of the guest module over 600 lines (issue 13): a longer file
# is cut along its responsibilities (see probe/engine*.cpp, hv/xen/xc_shim*.cpp, and in the
# guest module xp_fallback.c, xp_exchange.c, xp_xenstore.c), helpers its pieces share going into
# a small internal header next to them (the module's: xp_internal.h, or xp_logic.h for its pure
# code). Every .cpp, .hpp, .h and .c file under libxenprobes/ counts, and every .c, .h and .S
# file under guest-module/. The test command (tools/run-tests.sh) runs this.
#
#   sh tools/check-file-size.sh
set -eu
cd "$(dirname "$0")/.."

MAX_LINES=600

too_long=$({ find libxenprobes -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.c' \)
             find guest-module -type f \( -name '*.c' -o -name '*.h' -o -name '*.S' \); } |
           sort |
           while IFS= read -r file; do
             lines=$(wc -l < "$file")
             if [ "$lines" -gt "$MAX_LINES" ]; then
               echo "$file: $lines lines"
             fi
           done)

if [ -n "$too_long" ]; then
  echo "$too_long" | sed 's/^/check-file-size: /' >&2
  echo "check-file-size: FAILED: a source file under libxenprobes/ or guest-module/ has more than $MAX_LINES lines; cut it along its responsibilities" >&2
  exit 1
fi
echo "check-file-size: every source file under libxenprobes/ and guest-module/ has at most $MAX_LINES lines"
