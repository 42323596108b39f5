# Scenario: two PV DomUs with the xenprobesU module, probed at once by one process (one
# Session, the guest channel). Once DomU b has had some hits it is destroyed (`xl destroy`,
# run by the probing process while it keeps serving hits): the process must survive, the
# session drop b's probes (info() fails, unregister() succeeds, nothing left mapped), and go
# on probing a, whose counts must equal its calls exactly and whose text must come back
# byte-identical. Two DomUs of 256 MiB fit: Xen reports ~2 GB free beside Dom0's 1024 MiB.
S=stock_pv_two_guests
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
NA=xpe2e-a
NB=xpe2e-b
# create_failed <name>: the error lines of the last `xl create -vvv` try, and Xen's view.
create_failed() {
  grep -anE "error|fail|abort|corrupt|denied|cannot|No such" "/tmp/$1.create.log" | head -n 40 | sed "s/^/XPE2E-INFO: xl create $1: /"
  xl dmesg | tail -n 20 | sed "s/^/XPE2E-INFO: xl dmesg: /"
  result FAIL "xl create failed ($1)"
}
# a's workload is long enough to outlast b's destruction; b's never finishes (it is destroyed).
# Both wait up to 900 s for their go: a waits while b boots (~2 min on a loaded host). b is
# created once a's init is waiting, so the two kernels do not boot at the same time.
a=$(domu_start $NA "xpe2e.modparams=timeout_ms=2000 xpe2e.work=1000:20:10 xpe2e.wait=900") || create_failed $NA
echo "XPE2E-INFO: DomU $NA is domain $a"
if ! wait_console $NA "XPE2E-WORKLOAD: waiting" 180; then
  dump_console $NA
  result FAIL "the workload of DomU $NA did not start within 180 s"
fi
b=$(domu_start $NB "xpe2e.modparams=timeout_ms=2000 xpe2e.work=100000:20:10 xpe2e.wait=900") || create_failed $NB
echo "XPE2E-INFO: DomU $NB is domain $b"
xl list | sed 's/^/XPE2E-INFO: xl list: /'
if ! wait_console $NB "XPE2E-WORKLOAD: waiting" 180; then
  dump_console $NB
  result FAIL "the workload of DomU $NB did not start within 180 s"
fi
timeout 600 "$PROBE" pair --domid "$a" --domid2 "$b" --timeout 300 $PROBE_EXTRA
rc=$?
xl list | sed 's/^/XPE2E-INFO: xl list after: /'
dump_console $NB
# b is gone: only a goes through the usual unload and verdict.
domu_release "$a"
domu_verdict $NA "$a"
if xl domid $NB >/dev/null 2>&1; then
  result FAIL "DomU $NB still exists after xl destroy (xl list: $(xl list $NB 2>&1 | tail -n 1))"
fi
[ $rc -eq 0 ] || result FAIL "xpe2e-probe pair failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "both guests probed by one process; $NB destroyed while probed, its probes dropped; $NA's counts exact, text restored"
