# Scenario: bad user pointers while every probe-able instruction of the kernel's user-access
# routines is probed (issue 12, docs/e2e.md "Probe safety"), a PV DomU with the module, the
# guest channel. xpe2e-probe safety-extable-all (tests/e2e/xpe2e_extable_all.cpp) has the guest
# run its extable-all phase (EFAULT from openat, uname, nanosleep and wait4 on bad pointers, a
# read cut short at a PROT_NONE page, paths ending at a page's end, execve with a bad argv and a
# bad argv[0], a read of /dev/zero cut short) once unprobed, then asks for a probe on every
# instruction of copy_user_* / rep_movs_alternative, clear_user_* / rep_stos_alternative,
# __copy_user_nocache, strncpy_from_user, strnlen_user, __get_user_*, __get_user_nocheck_*,
# __put_user_*, __put_user_nocheck_*, _copy_from_user, _copy_to_user, copy_from_user_nofault,
# copy_to_user_nofault, strncpy_from_user_nofault and copy_mc_to_user (those in the kernel),
# each decoded from the running guest's text, and runs the phase again with them armed.
# Asserted: the probed run's result line identical to the unprobed one (both ok=1); every
# instruction the exception table covers boosted in one of the module's fixup slots (or
# refused by guest-hook-path); every refusal named by its rule (the XPE2E-SAFETY lines count
# them per mode and rule); exact hit counts; the routines byte-identical afterwards; no module
# timeout, the module's unload clean; no oops/BUG/WARN/lockup in either kernel's log.
S=${XPE2E_SCENARIO:-stock_pv_safety_extable_all}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
# timeout_ms=5000 (the module's maximum): a registration batch pauses the domain, and a hit
# pending then must not time out. trap_capacity=2048: some 600-700 points, moved entry probes
# sharing theirs.
SAFETY_CMD=safety-extable-all
safety_scenario xpe2e-safex guest "xpe2e.modparams=timeout_ms=5000:trap_capacity=2048" 180 --timeout 240
result PASS "every instruction of the user-access routines asked for (counts per mode and rule: the XPE2E-SAFETY lines); the guest's faulting accesses as unprobed; exact counts; text restored; no oops/BUG/WARN in either kernel"
