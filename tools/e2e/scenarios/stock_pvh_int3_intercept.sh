# Scenario: does this platform hand a PVH guest's int3s to Dom0? The vmevent channel's int3
# mode, and agentless probing with it, needs the CPU's #BP intercept: with software-breakpoint
# monitoring on, every int3 the guest executes must reach Xen (a synchronous vm_event) before
# the guest sees it. Nothing of ours in the guest, no byte of it written: xpe2e-probe
# int3-intercept turns the monitoring on, the guest runs its activity phase (three user-mode
# int3s, each caught by the child's SIGTRAP handler), Dom0 hands every int3 event back as the
# #BP the guest would have taken and counts them. PASS: Dom0 saw every int3 and the guest is
# clean. PVH under TCG: hap = 0, tsc_mode = "native" and "nokaslr", as the other PVH scenarios.
S=${XPE2E_SCENARIO:-stock_pvh_int3_intercept}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-pvh-int3
domid=$(DOMU_TYPE=pvh domu_start $N "nokaslr xpe2e.module=0 xpe2e.safety=1") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 240 || { dump_console $N; result FAIL "the safety loop did not start within 240 s"; }
timeout 300 "$PROBE" int3-intercept --domid "$domid" --timeout 120
rc=$?
xenstore-write "/local/domain/$domid/data/xpe2e/safety/end" 1
domu_release "$domid"
domu_verdict $N "$domid"
domu_kernel_clean $N
[ $rc -eq 0 ] || result FAIL "xpe2e-probe int3-intercept failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "every user-mode int3 of the PVH guest reached Dom0 as a software-breakpoint event and went back to the guest as its #BP; the guest clean"
