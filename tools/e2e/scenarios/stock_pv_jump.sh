# Scenario: Debian's stock hypervisor, a PV DomU with the xenprobesU module, the guest
# channel: jump probes (issue 14). Jump probes on __x64_sys_getppid and do_unlinkat and a
# Fastest one on __x64_sys_openat go in as jumps to their detours once the module confirmed
# quiescence; every call of the workload is counted through the module's jump entry, none
# resumed without Dom0; unregistering restores the text byte for byte; the module unloads.
S=${XPE2E_SCENARIO:-stock_pv_jump}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-jump
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
if ! wait_console $N "XPE2E-WORKLOAD: waiting" 180; then
  dump_console $N
  result FAIL "the DomU workload did not start within 180 s"
fi
timeout 420 "$PROBE" jump --domid "$domid" --timeout 240 $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe jump failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed"
