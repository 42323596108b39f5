# Scenario: the guest module's slots at unload (issue 12). The OEA and the fixup slots are the
# module's own text: rmmod frees them. A task sleeping in a page fault taken by a copy in a
# fixup slot returns into that slot when the fault is resolved, so the module must not go
# while one does. One PV DomU with the module, the guest channel; xpe2e-probe safety --hazards
# slotunload probes every instruction of the kernel's user copies that the exception table
# covers (their copies run in fixup slots) and __x64_sys_getppid (an OEA copy). In the guest
# (the safety phase slotunload) a pread() into a userfaultfd page sleeps in the fault its copy
# took in a fixup slot while a process keeps calling getppid, and the guest detaches:
#   - the first `echo 1 > detach` fails with EBUSY after slot_wait_ms (the module's warning
#     names the task and the slot address on its stack) and rmmod is refused;
#   - the fault resolved, the read returns the file's bytes; the second detach and rmmod
#     succeed ("slots: no task in them");
#   - no oops, BUG, WARN, lockup or stall in either kernel; the guest's exercise after the
#     unload is clean.
# On the code before the slot check, the first detach succeeds, rmmod frees the slot, and the
# reader returns into freed text: an oops (the check safety.slotunload.held fails first).
S=${XPE2E_SCENARIO:-stock_pv_slot_unload}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
# slot_wait_ms=2000: the first detach gives up on the sleeping reader after 2 s.
safety_scenario xpe2e-slotunload guest "xpe2e.modparams=timeout_ms=5000:slot_wait_ms=2000" 180 --hazards slotunload --timeout 90
log=$(console_log xpe2e-slotunload)
held=$(grep -a "xenprobes: slots: .* tasks may still return into the OEA or the fixup slots" "$log" | head -n 1 | tr -d '\r')
[ -n "$held" ] || result FAIL "the module did not say a task held a slot at the first detach"
echo "XPE2E-INFO: ${held#*] }"
clear=$(grep -a "xenprobes: slots: no task in them" "$log" | head -n 1 | tr -d '\r')
[ -n "$clear" ] || result FAIL "the module did not find the slots clear at the second detach"
echo "XPE2E-INFO: ${clear#*] }"
grep -aq "xenprobes: unloaded .*slots: no task in them)" "$log" || result FAIL "no unload line saying the slots were clear"
grep -aq "XPE2E-DOMU: exercise after-unload failures=0" "$log" || result FAIL "the guest's exercise after the unload failed"
result PASS "a read asleep in a fault taken in a fixup slot kept the module loaded (detach EBUSY, rmmod refused); once it left the slot the module detached and unloaded; the guest healthy"
