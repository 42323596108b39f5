# Scenario: probe safety on a real kernel (issue 12), a PV DomU with the module, the guest
# channel. One hazard class after another in one guest (docs/e2e.md "Probe safety"), in this
# order (without the rules, statickey leaves text_mutex held and hookpath kills the guest):
#   extable    instructions covered by __ex_table in strncpy_from_user, copy_user_* and
#              __get_user_8 (found here from the guest's own table): every one probed, boosted,
#              in one of the module's fixup slots (whose own exception-table entries send a
#              fault to the original fixup); the guest's faulting user accesses (EFAULT, a short
#              read, paths ending at a page's end, execve with a bad argv) behave as without
#              probes, and the probes count exactly (handler = ProbeStats.hits, none unhandled);
#   ftrace     XP on __x64_sys_getppid by name and by '0x<its start>': moved past the ftrace
#              NOP5 (ProbeInfo.address = start + 5); the function tracer and a kprobe event on
#              it work in the guest and the probes count its 20 calls exactly;
#   statickey  kernel_clone's sched_process_fork jump label and static call sites and the
#              static call's trampoline: refused ('jump-label', 'static-call',
#              'static-call-trampoline'); the instructions right before and after each site
#              armed while the tracepoint toggles in the guest (they count kernel_clone's
#              calls, their bytes identical afterwards);
#   hookpath   __rcu_read_lock, lookup_address, notifier_call_chain ('guest-hook-path') and the
#              module's die notifier ('module-text'): refused; copy_from_user_nofault, which
#              Dom0 knows by no name, refused for the module's published hook-path keys (the
#              refusal names the published entry); the guest's activity is fine.
# No oops, BUG, WARN, panic, lockup or stall in either kernel's log.
S=${XPE2E_SCENARIO:-stock_pv_safety}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
# timeout_ms=5000 (the module's maximum): a library without the rules leaves probes armed on
# hot paths, and slow hits must not turn into timeouts that disarm them before the hazard shows.
safety_scenario xpe2e-safety guest "xpe2e.modparams=timeout_ms=5000" 180 --timeout 90
result PASS "exception-table points probed in fixup slots, the other hazard points refused or moved; the guest's phases ok; no oops/BUG/WARN in either kernel"
