# Scenario: stock_kill9 with jump probes (issue 14): the probes without a post-handler go in as
# jumps where the points allow (xpe2e-probe --method fastest; do_filp_open's is one), and the
# probing process SIGKILLs itself inside do_filp_open's handler, a vCPU waiting in the module's
# jump entry. The module's fail-safe must put every jump's region back whole (and every trap
# byte), the guest keep running and its workload finish with correct results.
S=${XPE2E_SCENARIO:-stock_kill9_jump}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
PROBE_EXTRA="$PROBE_EXTRA --method fastest" KILL_DIE_IN=filp KILL_AFTER=10 kill9_scenario xpe2e-killj guest "" 180
