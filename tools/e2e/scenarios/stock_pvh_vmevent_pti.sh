# Scenario: stock_pvh_vmevent with page-table isolation on in the guest (issue 12, "a PVH guest
# with page-table isolation on"). With PTI a vCPU in user mode holds the user page tables,
# which do not map kernel text: every kernel-text operation of the library (attach, decode,
# arm, disarm, restore) must walk the kernel's page tables, not the vCPU's cr3, and handlers
# still read the workload's user memory (file names). `pti=on` forces it whatever the CPU
# (Linux turns it off only for Xen PV guests, which Xen protects itself); the guest's boot log
# must say it is enabled. The same probes and checks as stock_pvh_vmevent. Slow under TCG: every
# kernel entry and exit switches page tables (the guest loaded the module ~165 s after boot
# where it takes ~15 s without PTI, run 20261128-032604-19663): SCEN_LIMIT gives it 1500 s.
S=${XPE2E_SCENARIO:-stock_pvh_vmevent_pti}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-pvh-pti
domid=$(DOMU_TYPE=pvh domu_start $N "nokaslr pti=on xpe2e.wait=900 xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 600 || { dump_console $N; result FAIL "the workload did not start within 240 s"; }
pti=$(grep -a "page tables isolation" "$(console_log $N)" | head -n 1 | tr -d '\r')
echo "XPE2E-INFO: guest: ${pti:-no line about page-table isolation}"
# Linux prints "Kernel/User page tables isolation: enabled", or "force enabled on command line."
case "$pti" in *"isolation: enabled"* | *"isolation: force enabled"*) ;; *) result FAIL "the guest did not enable page-table isolation: '${pti}'" ;; esac
timeout 800 "$PROBE" probe --domid "$domid" --channel vmevent --timeout 600 $PROBE_EXTRA
rc=$?
domu_release "$domid"
domu_verdict $N "$domid"
domu_kernel_clean $N
[ $rc -eq 0 ] || result FAIL "xpe2e-probe failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all of stock_pvh_vmevent's checks passed on a PVH guest with page-table isolation enabled ($pti)"
