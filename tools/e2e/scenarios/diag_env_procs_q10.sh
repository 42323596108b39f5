# diag_env_procs under QEMU 10 (the stock hypervisor, as the PVH scenarios run).
S=diag_env_procs_q10
. /usr/lib/xenprobes-e2e/scenarios/diag_env_procs.sh
