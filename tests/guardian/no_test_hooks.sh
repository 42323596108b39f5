#!/bin/sh
# no_test_hooks.sh NAME TEST_BUILD INSTALLED... : NAME is in TEST_BUILD (the search works) and
# in none of the INSTALLED files.
set -eu
name=$1 test_build=$2
shift 2
if ! grep -q -a -F "$name" "$test_build"; then
  echo "$test_build does not hold $name: this check would prove nothing"
  exit 1
fi
for f in "$@"; do
  if grep -q -a -F "$name" "$f"; then
    echo "$f holds the test hook $name"
    exit 1
  fi
  echo "$f: no $name"
done
