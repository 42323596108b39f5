#!/bin/sh
# ctest xenprobesd.unit_file_verifies: `systemd-analyze verify` on the service unit, with
# ExecStart pointing at the binary just built (verify checks that it exists). systemd-analyze
# exits 0 even when it ignores a line it cannot parse, so any output at all fails the test.
#   sh verify-unit.sh UNIT BINARY
set -eu
unit=$1
bin=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed "s#/usr/sbin/xenprobesd#$bin#g" "$unit" > "$dir/xenprobesd.service"
out=$(cd "$dir" && systemd-analyze verify "$dir/xenprobesd.service" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then
  echo "systemd-analyze verify has something to say about $unit:"
  echo "$out"
  exit 1
fi
echo "systemd-analyze verify: $unit is clean"
