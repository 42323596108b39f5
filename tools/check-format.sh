#!/bin/sh
# Every C and C++ file of the Dom0 code, the tests, the examples, the benchmarks and the demo guest
# is laid out as .clang-format says (clang-format 14, Debian 12's): the test command
# (tools/run-tests.sh) runs this. Files in the Linux kernel's style are left out: the guest
# module, the protocol header it shares with Dom0, and the e2e guest's workload program.
#
#   sh tools/check-format.sh          check; a file laid out otherwise fails the run
#   sh tools/check-format.sh --fix    lay every covered file out in place
set -eu
cd "$(dirname "$0")/.."

command -v clang-format-14 >/dev/null || {
  echo "check-format: clang-format-14 not found: install Debian's clang-format-14 (tools/install-deps.sh does)" >&2
  exit 1
}

files=$(find bench examples guest include libxenprobes shared tests tools xenprobe xenprobesd -type f \
          \( -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' \) \
          ! -path include/xenprobes/protocol.h ! -path 'tools/e2e/domu/*' | sort)

if [ "${1:-}" = --fix ]; then
  # shellcheck disable=SC2086
  clang-format-14 -i $files
  exit 0
fi

bad=""
for f in $files; do
  if ! clang-format-14 --dry-run --Werror "$f" >/dev/null 2>&1; then bad="$bad $f"; fi
done
if [ -n "$bad" ]; then
  for f in $bad; do echo "check-format: $f is not laid out as .clang-format says" >&2; done
  echo "check-format: FAILED: run 'sh tools/check-format.sh --fix' and commit the result (see the diff with git diff)" >&2
  exit 1
fi
echo "check-format: $(echo "$files" | wc -l) files laid out as .clang-format says"
