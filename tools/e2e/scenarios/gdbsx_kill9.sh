# Scenario: the probing process dies (SIGKILL, from inside a handler: the domain is paused on
# the debugger channel's stop at that moment) with probes armed under load, on the GDBSX
# hypervisor through the debugger channel. The guest has no fail-safe of its own there: the
# session's guardian (xenprobes-guardian, docs/guardian.md) must move the stopped vCPU on,
# restore the text, turn debugging mode off and unpause the domain; the workload must finish
# with correct results.
S=gdbsx_kill9
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
kill9_scenario xpe2e-gkill debugger "" 180
