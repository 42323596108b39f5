# Scenario: the environment alone. A PV DomU without the module, nothing probed: the same
# workload and process exercises must be clean, or no other scenario's failure means anything.
S=stock_pv_baseline
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-baseline
domid=$(domu_start $N "xpe2e.module=0 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
xenstore-write "/local/domain/$domid/data/xpe2e/go" 1
xs_wait "/local/domain/$domid/data/xpe2e/done" 120 >/dev/null || result FAIL "no data/xpe2e/done within 120 s"
xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120 >/dev/null
domu_verdict $N "$domid"
result PASS "workload ok, no process failed, no oops"
