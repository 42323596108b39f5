# Scenario: Debian's stock hypervisor, a PV DomU with the xenprobesU module loaded with
# spin_us=200, the guest channel with Dom0 polling (SessionOptions::spin_us, protocol.h
# "Spinning instead of notifying"): stock_pv_guest's probes and checks (XP boosted, emulated
# call, post-handler, XrP; every count exact, filenames read, text restored, the module
# unloads), and the module's unload line shows hits that went without a notification both ways.
S=${XPE2E_SCENARIO:-stock_pv_spin}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-spin
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000:spin_us=200 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
if ! wait_console $N "XPE2E-WORKLOAD: waiting" 180; then
  dump_console $N
  result FAIL "the DomU workload did not start within 180 s"
fi
timeout 420 "$PROBE" probe --domid "$domid" --channel guest --timeout 240 --spin-us 20000 $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe failed (exit $rc; its XPE2E-CHECK lines above)"
line=$(grep -a -o "spinning: [0-9]* notifications skipped while Dom0 polled, [0-9]* answers found spinning" "$(console_log $N)" | head -n 1)
echo "XPE2E-INFO: module: ${line:-no spinning counters in its unload line}"
skipped=$(echo "$line" | sed -n 's/spinning: \([0-9]*\) notifications.*/\1/p')
spun=$(echo "$line" | sed -n 's/.*polled, \([0-9]*\) answers.*/\1/p')
[ "${skipped:-0}" -gt 0 ] || result FAIL "no hit went without its notification while Dom0 polled (${line:-no unload line})"
[ "${spun:-0}" -gt 0 ] || result FAIL "no answer found the module spinning (${line:-no unload line})"
result PASS "all checks passed; $line"
