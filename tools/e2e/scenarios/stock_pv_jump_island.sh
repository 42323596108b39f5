# Scenario: Debian's stock hypervisor, a PV DomU with the xenprobesU module, the guest
# channel: a short jump to an island (issue 14, protocol.h "Short jumps to islands"). The
# module publishes the jump-island feature; a jump probe on the first instruction of a function
# of the workload's openat/unlink/close paths that only a short jump serves (putname on 6.1.0-50:
# bench/kernel_coverage --islands) goes in as eb rel8 to an island in its (or the previous) function's dead
# padding, whose e9 goes to the detour; it counts hits (putname: at least one per openat and
# unlink of the workload), the workload's results are unchanged, the module timed nothing out;
# unregistering gives the region back at once and the island after the module's quiescence;
# the module unloads.
S=${XPE2E_SCENARIO:-stock_pv_jump_island}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-island
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
if ! wait_console $N "XPE2E-WORKLOAD: waiting" 180; then
  dump_console $N
  result FAIL "the DomU workload did not start within 180 s"
fi
timeout 420 "$PROBE" jump-island --domid "$domid" --timeout 240 $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe jump-island failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed"
