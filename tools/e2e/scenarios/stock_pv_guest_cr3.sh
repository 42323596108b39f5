# Scenario: as stock_pv_guest, but vCPU 0 runs another process (a busy shell pinned to CPU 0)
# while the session attaches and the workload (pinned to CPU 1) runs. Handlers that read the
# workload's user memory must read it, not the shell's (BUG-CR3 in docs/e2e.md: handlers
# used to translate through vCPU 0's page tables from attach time).
S=stock_pv_guest_cr3
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-cr3
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10 xpe2e.cpu0busy=1") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
timeout 420 "$PROBE" probe --domid "$domid" --channel guest --timeout 240 $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed, the user filename read through the hit vCPU's page tables"
