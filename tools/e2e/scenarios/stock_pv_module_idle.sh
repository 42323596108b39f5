# Scenario: the guest module alone. Loaded, published, never attached by Dom0; the workload
# runs, then the module detaches and unloads. Separates the module's own effects on the guest
# from the library's.
S=stock_pv_module_idle
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-modidle
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
st=$(xenstore-read "/local/domain/$domid/data/xenprobes/state" 2>/dev/null)
[ "$st" = ready ] || { dump_console $N; result FAIL "module state is '$st', not ready"; }
xenstore-write "/local/domain/$domid/data/xpe2e/go" 1
xs_wait "/local/domain/$domid/data/xpe2e/done" 120 >/dev/null || result FAIL "no data/xpe2e/done within 120 s"
xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
un=$(xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120)
domu_verdict $N "$domid"
[ "$un" = ok ] || result FAIL "detach + rmmod: '$un'"
result PASS "module loaded, published, detached and unloaded; workload ok, no process failed, no oops"
