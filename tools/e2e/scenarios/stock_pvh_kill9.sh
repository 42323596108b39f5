# Scenario: as gdbsx_kill9, on a PVH DomU through the vm_event channel (ICEBP debug exceptions, the
# stock hypervisor under QEMU 10). The trapping vCPU waits for a response the dead process
# will never send: the guardian must turn monitoring off, release that vCPU (a fresh ring,
# one response per vCPU), restore the text and unpause; the workload must finish.
S=${XPE2E_SCENARIO:-stock_pvh_kill9}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
DOMU_TYPE=pvh kill9_scenario xpe2e-pkill vmevent nokaslr 240
