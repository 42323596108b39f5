# Scenario: the environment alone, PVH. A PVH DomU (hap = 0, tsc_mode = "native") without
# the module, nothing probed: measures how clean a PVH guest is under TCG on its own, the
# baseline for stock_pvh_vmevent.
S=stock_pvh_baseline
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-pvh-baseline
domid=$(DOMU_TYPE=pvh domu_start $N "nokaslr xpe2e.module=0 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 240 || { dump_console $N; result FAIL "the workload did not start within 240 s"; }
xenstore-write "/local/domain/$domid/data/xpe2e/go" 1
xs_wait "/local/domain/$domid/data/xpe2e/done" 120 >/dev/null || result FAIL "no data/xpe2e/done within 120 s"
xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120 >/dev/null
domu_verdict $N "$domid"
result PASS "workload ok, no process failed, no oops"
