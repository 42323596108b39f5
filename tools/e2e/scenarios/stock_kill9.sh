# Scenario: the probing process dies (SIGKILL, from inside a handler: a vCPU is waiting for
# its answer) with probes armed under load. The guest must keep running, the workload finish
# with correct results, and the module restore the kernel text itself after
# XENPROBES_DEAD_AFTER timeouts (timeout_ms = 500, the module's default).
S=stock_kill9
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-kill
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=500 xpe2e.work=2000:50:20") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
timeout 300 "$PROBE" kill --domid "$domid" --channel guest --snapshot /tmp/kill.snap --die-after-hits 50 \
  --timeout 240 $PROBE_EXTRA >/tmp/kill.out 2>&1
rc=$?
cat /tmp/kill.out
grep -q "^XPE2E-KILL" /tmp/kill.out || result FAIL "xpe2e-probe kill did not reach its SIGKILL (exit $rc)"
[ $rc -eq 137 ] || result FAIL "xpe2e-probe kill exited $rc, not 137 (SIGKILL)"
t0=$(cut -d. -f1 /proc/uptime)
done=$(xs_wait "/local/domain/$domid/data/xpe2e/done" 240) || { dump_console $N; result FAIL "the workload did not finish within 240 s after the kill"; }
echo "XPE2E-INFO: workload finished $(($(cut -d. -f1 /proc/uptime) - t0)) s after the kill: $done"
timeout 120 "$PROBE" verify-text --domid "$domid" --snapshot /tmp/kill.snap --timeout 60
rc2=$?
xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
un=$(xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120)
domu_verdict $N "$domid"
[ $rc2 -eq 0 ] || result FAIL "text not restored or module counters wrong (its XPE2E-CHECK lines above)"
[ "$un" = ok ] || result FAIL "detach + rmmod after the kill: '$un'"
result PASS "guest kept running, workload ok, text restored by the module, module unloaded"
