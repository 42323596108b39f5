# Scenario: Debian's stock hypervisor, a PV DomU with the xenprobesU module, the guest
# channel. XP (boosted, emulated call, post-handler) and XrP on real kernel functions; hit
# counts equal the calls the workload made; filenames read from guest memory; the workload's
# own results unchanged; unregister restores the text byte for byte; the module unloads.
S=${XPE2E_SCENARIO:-stock_pv_guest}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-guest
# timeout_ms: TCG is slow; a hit that waits longer than this would be counted as a timeout.
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
if ! wait_console $N "XPE2E-WORKLOAD: waiting" 180; then
  dump_console $N
  result FAIL "the DomU workload did not start within 180 s"
fi
timeout 420 "$PROBE" probe --domid "$domid" --channel guest --timeout 240 $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed"
