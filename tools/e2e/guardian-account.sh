#!/bin/sh
# guardian-account.sh: reads the guardian's account (its stderr, or a console holding it) on
# stdin and prints its numbers on one line, in this order:
#   journal: domains patches calls-in-flight
#   done:    recovered gone restored left-alone vcpus-moved returns-restored pauses-released
#            steps-failed refused-(domid-reused)
# Exits 1, printing nothing, unless both lines ('recovering ...' and 'done: ...') are there
# in the form xenprobes-guardian writes them (docs/guardian.md, "What recovery does").
# Used by the real-Xen scenarios (scenarios/lib.sh) and by the guardian's tests, which feed
# it the program's own output so that a change of wording fails there first.
set -eu
g=$(grep -a "xenprobes-guardian\[" || true)
set -- $(printf '%s\n' "$g" | sed -nE 's/.*recovering ([0-9]+) domains \(([0-9]+) patches, ([0-9]+) return-probe calls in flight\).*/\1 \2 \3/p' | head -n 1) \
  $(printf '%s\n' "$g" | sed -nE 's/.*: done: ([0-9]+) domains recovered, ([0-9]+) gone, ([0-9]+) refused \(domid reused\), ([0-9]+) patches restored, ([0-9]+) left alone \(changed since\), ([0-9]+) vCPUs moved, ([0-9]+) return addresses restored, ([0-9]+) pauses released, ([0-9]+) steps failed.*/\1 \2 \4 \5 \6 \7 \8 \9 \3/p' | head -n 1)
[ $# -eq 12 ] || exit 1
echo "$*"
