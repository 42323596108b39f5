# Scenario: Debian's stock hypervisor has no CONFIG_GDBSX. SessionOptions{Debugger} must fail
# with its clear message (EOPNOTSUPP, naming CONFIG_GDBSX and the alternatives) and change
# nothing: the text is untouched, the domain neither paused nor in debugging mode, and the
# guest's workload runs normally afterwards.
S=${XPE2E_SCENARIO:-stock_debugger_refusal}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-dbg
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=50:5:2") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
timeout 180 "$PROBE" refuse-debugger --domid "$domid"
rc=$?
xenstore-write "/local/domain/$domid/data/xpe2e/go" 1
xs_wait "/local/domain/$domid/data/xpe2e/done" 120 >/dev/null || result FAIL "no data/xpe2e/done within 120 s"
xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120 >/dev/null
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe refuse-debugger failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "refused with the CONFIG_GDBSX message; nothing changed; the guest is fine"
