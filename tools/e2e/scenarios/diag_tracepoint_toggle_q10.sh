# diag_tracepoint_toggle under QEMU 10 (the stock hypervisor, as the PVH scenarios run).
S=diag_tracepoint_toggle_q10
. /usr/lib/xenprobes-e2e/scenarios/diag_tracepoint_toggle.sh
