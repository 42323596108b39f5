# Scenario: Debian's stock hypervisor, a PV DomU with the xenprobesU module, the guest
# channel: async jump probes (issue 14). Async probes on __x64_sys_getppid and on the first of
# do_sys_openat2 / getname_flags that can be one (capturing the user filename, the return
# address and an unmapped address) go in as jumps; the module writes every hit into its vCPU's
# ring and goes on; Dom0 reads the rings: every call is one record, in order, with the right
# captures, none dropped; unregistering restores the text byte for byte; the module unloads.
S=${XPE2E_SCENARIO:-stock_pv_async}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-async
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
if ! wait_console $N "XPE2E-WORKLOAD: waiting" 180; then
  dump_console $N
  result FAIL "the DomU workload did not start within 180 s"
fi
timeout 420 "$PROBE" async --domid "$domid" --timeout 240 $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe async failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed"
