# Scenario: the control of stock_pv_safety's "hookpath" class (issue 12). On a PVH DomU probed
# through vm_event, Xen intercepts the trap (ICEBP) before the guest's own int3 handling, so
# __rcu_read_lock, lookup_address and notifier_call_chain are ordinary probe points there: they
# must register and count (handler = ProbeStats.hits, nothing missed; notifier_call_chain at
# least once per user int3 of the guest's activity), and the guest must stay clean. PVH under
# TCG needs hap = 0, tsc_mode = "native" and QEMU 10 (see stock_pvh_vmevent).
S=stock_pvh_safety_control
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
DOMU_TYPE=pvh safety_scenario xpe2e-safety-pvh vmevent "nokaslr xpe2e.modparams=timeout_ms=2000" 240 --hazards hookpath --timeout 120
result PASS "the hook-path points registered and counted through vm_event; the guest's activity ok; no oops/BUG/WARN"
