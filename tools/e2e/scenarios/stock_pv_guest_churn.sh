# Scenario: as stock_pv_guest, but after the probes are unregistered the guest's processes
# exit, fork and exec (40 short processes) while the probing session is still open. Frames
# the guest freed (the workload's kernel stack, pages the handlers read or wrote) become page
# tables and stacks of new processes while Dom0 may still hold cached foreign mappings of
# them (BUG-MAPCACHE in docs/e2e.md: failed before the library dropped writable mappings of
# stacks after each write).
S=stock_pv_guest_churn
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-churn
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
timeout 420 "$PROBE" probe --domid "$domid" --channel guest --timeout 240 --exercise-attached $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed, the guest survived process churn with the session open"
