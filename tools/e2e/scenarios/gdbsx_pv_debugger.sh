# Scenario: the Xen rebuilt with CONFIG_GDBSX (and QEMU >= 9.1 for ICEBP under TCG), a PV
# DomU with the module (its OEA holds the slots), the debugger channel (VIRQ_DEBUGGER, ICEBP
# trap bytes) forced with SessionOptions{Debugger}: the same probes and assertions as
# stock_pv_guest.
S=gdbsx_pv_debugger
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-gdbsx
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
timeout 600 "$PROBE" probe --domid "$domid" --channel debugger --timeout 400 $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed on the debugger channel"
