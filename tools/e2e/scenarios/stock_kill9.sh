# Scenario: the probing process dies (SIGKILL, from inside a handler: a vCPU is waiting for
# its answer) with probes armed under load. The guest must keep running, the workload finish
# with correct results, and the module restore the kernel text itself after
# XENPROBES_DEAD_AFTER timeouts (timeout_ms = 500, the module's default).
S=${XPE2E_SCENARIO:-stock_kill9}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
kill9_scenario xpe2e-kill guest "" 180
