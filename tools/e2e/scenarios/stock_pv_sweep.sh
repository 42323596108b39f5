# Scenario: the real-kernel sweep (issue 12, docs/e2e.md "The real-kernel sweep"), a PV DomU
# with the module, the guest channel. xpe2e-probe sweep asks the library for a probe on every
# instruction of a few hundred kernel functions over mm, fs, sched, net, locking, RCU and the
# syscall paths, batch by batch; each batch stays armed while the guest runs one round of its
# mixed workload (xpe2e-workload safety, phase "sweep": process churn, file I/O, TCP and UDP on
# loopback, the function tracer and tracepoints on and off). Asserted: every round ok, the
# counted syscalls' probes count exactly the guest's calls, every function byte-identical after
# its batch, no module timeout, no oops/WARN/BUG/lockup/stall in either kernel's log; the module
# unloads cleanly. Accepted and refused counts per mode and rule: the XPE2E-SWEEP lines.
S=${XPE2E_SCENARIO:-stock_pv_sweep}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-sweep
dom0_dmesg_mark
# timeout_ms=5000 (the module's maximum): the batch's registrations pause the domain for up
# to ~0.5 s at a time, and a hit pending at a pause must not time out. trap_capacity=2048: a
# batch arms up to 1000 points (1024 by default).
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=5000:trap_capacity=2048 xpe2e.safety=1") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the round loop did not start within 180 s"; }
# shellcheck disable=SC2086
{
  timeout 1500 "$PROBE" sweep --domid "$domid" --channel guest --console "$(console_log $N)" $PROBE_EXTRA
  echo $? >/tmp/$S.rc
} | tee /tmp/$S.sweep
rc=$(cat /tmp/$S.rc)
if domain_alive "$domid"; then
  domu_release "$domid"
  wait_console $N "XPE2E-DOMU: idle" 90
fi
domu_kernel_clean $N
domain_alive "$domid" || { dump_console $N; result FAIL "DomU $N is not running any more (xl list: $(xl list "$domid" 2>&1 | tail -n 1))"; }
dom0_kernel_clean
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe sweep failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "$(grep -a '^XPE2E-SWEEP total' /tmp/$S.sweep 2>/dev/null | cut -d' ' -f3-)"
