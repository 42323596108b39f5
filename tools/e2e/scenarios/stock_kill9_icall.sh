# Scenario: kill -9 with probes armed on indirect branches (issue 12), a PV DomU with the module,
# the guest channel. xpe2e-probe kill-icall (tests/e2e/xpe2e_icall.cpp) decodes candidate
# functions on the workload's openat/read/unlink paths from the running guest's text, probes
# every `call *%reg` / `jmp *%reg` in the first three that have one (each must be an emulated
# branch; one through memory must be refused), lets the workload go (2000 getppid, 50 openat +
# read, 20 unlink) and SIGKILLs itself inside the handler of the 30th hit after the go: a vCPU
# waits for that answer at an indirect branch. The guest module's fallback must then emulate the
# branch itself (and every later hit until its fail-safe restores the text, after 3 timeouts of
# timeout_ms = 500). Asserted: the program died of the SIGKILL with no check failed before; the
# workload finished with correct results; the text byte-identical to the snapshot taken before
# arming (verify-text, the module's dom0_gone and timeouts); no guardian ran; the module's unload
# line shows no stale int3, no hit after the restore and no hit left without a fallback; no
# oops/BUG/WARN in either kernel's log.
#
# spectre_v2=off: Debian's 6.1 on this platform's AMD CPU model picks generic retpolines, which
# leave every indirect call of C code a `call __x86_indirect_thunk_<reg>` (a relative call) and
# so no indirect branch to probe; without the mitigation the kernel's alternatives rewrite each
# such call into `call *%reg` at boot, the form kernels on CPUs with enhanced IBRS run.
S=${XPE2E_SCENARIO:-stock_kill9_icall}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-killi
dom0_dmesg_mark
domid=$(domu_start $N "spectre_v2=off xpe2e.modparams=timeout_ms=500 xpe2e.work=2000:50:20") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
tr -d '\r' <"$(console_log $N)" | grep -a "Spectre V2" | sed "s/^/XPE2E-INFO: DomU $N: /"
# shellcheck disable=SC2086
timeout 400 "$E2E/xpe2e-reap" --wait 120 -- "$PROBE" kill-icall --domid "$domid" --snapshot /tmp/$S.snap \
  --die-after-hits "${KILL_AFTER:-30}" --timeout 300 $PROBE_EXTRA >/tmp/$S.out 2>&1
rc=$?
cat /tmp/$S.out
if ! grep -q "^XPE2E-KILL" /tmp/$S.out; then
  domu_release "$domid"
  dump_console $N
  bad=$(grep -a "^XPE2E-CHECK .* FAIL" /tmp/$S.out | head -n 1)
  result FAIL "xpe2e-probe kill-icall did not reach its SIGKILL (exit $rc${bad:+; ${bad#XPE2E-CHECK }})"
fi
[ $rc -eq 137 ] || result FAIL "xpe2e-probe kill-icall exited $rc, not 137 (SIGKILL)"
bad=$(grep -a "^XPE2E-CHECK .* FAIL" /tmp/$S.out | head -n 1)
[ -z "$bad" ] || result FAIL "xpe2e-probe kill-icall, before the kill: ${bad#XPE2E-CHECK }"
xenstore-exists "/local/domain/$domid/data/xpe2e/go" 2>/dev/null || xenstore-write "/local/domain/$domid/data/xpe2e/go" 1
t0=$(cut -d. -f1 /proc/uptime)
done=$(xs_wait "/local/domain/$domid/data/xpe2e/done" 240) || {
  xl list "$domid" | sed 's/^/XPE2E-INFO: /'
  dump_console $N
  result FAIL "the workload did not finish within 240 s after the kill"
}
echo "XPE2E-INFO: workload finished $(($(cut -d. -f1 /proc/uptime) - t0)) s after the kill: $done"
if grep -aq "xenprobes-guardian" /tmp/$S.out; then
  result FAIL "a guardian ran for a guest-channel session (its domains are never journaled)"
fi
timeout 120 "$PROBE" verify-text --domid "$domid" --channel guest --snapshot /tmp/$S.snap --timeout 60
rc2=$?
xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
un=$(xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120)
domu_kernel_clean $N
dom0_kernel_clean
domu_verdict $N "$domid"
[ $rc2 -eq 0 ] || result FAIL "text not restored, or the module's counters wrong (its XPE2E-CHECK lines above)"
[ "$un" = ok ] || result FAIL "detach + rmmod after the kill: '$un'"
# After the restore (under stop_machine) no vCPU may execute an int3 there (docs/e2e.md "kill -9
# on the guest channel"), and every hit Dom0 did not answer had a fallback the module could run.
unl=$(grep -a "xenprobes: unloaded" "$(console_log $N)" | head -n 1 | tr -d '\r')
echo "XPE2E-INFO: DomU $N: ${unl#*] }"
case "$unl" in
  *" 0 hits without fallback, 0 stale int3s at restored bytes"*"after the restore: 0 hits in text"*) ;;
  *) result FAIL "DomU $N: a hit without a fallback, or int3s at text the module had restored: ${unl#*unloaded }" ;;
esac
kill_at=$(sed -n 's/^XPE2E-KILL: SIGKILL to myself inside the handler of the probe on \([^ ]*\) (\([^)]*\)).*/\1 (\2)/p' /tmp/$S.out | head -n 1)
result PASS "killed inside the probe on $kill_at; guest kept running, workload ok, the module's fallback ran the indirect branches and its fail-safe restored the text; module unloaded"
