# Scenario: Debian 13's stock hypervisor, a PV DomU (6.12) with the xenprobesU module, the
# guest channel: a short jump whose island is in the previous function's dead padding, past
# the probed function's `__pfx_` symbol (call padding, 6.2+; kernel::island_padding_near). On
# 6.12.117+deb13 bench/kernel_coverage --islands lists complete_walk+0x43 (path walks of the
# workload's openat and unlink, after an RCU walk's try_to_unlazy) as its first point only a
# short jump serves, with its island at lookup_fast+0xe4, before __pfx_complete_walk. The
# same checks as stock_pv_jump_island (at least one hit), and the island must lie before the
# function's start.
S=${XPE2E_SCENARIO:-trixie_pv_jump_island_prev}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-island-prev
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
if ! wait_console $N "XPE2E-WORKLOAD: waiting" 180; then
  dump_console $N
  result FAIL "the DomU workload did not start within 180 s"
fi
timeout 420 "$PROBE" jump-island --domid "$domid" --timeout 240 --functions complete_walk --island previous $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe jump-island failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed"
