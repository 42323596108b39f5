# Scenario: a PVH DomU with the module, probed through the vm_event monitor (ICEBP debug
# exceptions, slots from the module): the same probes and checks as stock_pv_guest. Under TCG
# a PVH guest needs hap = 0 and tsc_mode = "native", and ICEBP needs QEMU >= 9.1 (docs/e2e.md).
S=${XPE2E_SCENARIO:-stock_pvh_vmevent}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-pvh
domid=$(DOMU_TYPE=pvh domu_start $N "nokaslr xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 240 || { dump_console $N; result FAIL "the workload did not start within 240 s"; }
timeout 420 "$PROBE" probe --domid "$domid" --channel vmevent --timeout 240 $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed on the vmevent channel (PVH guest)"
