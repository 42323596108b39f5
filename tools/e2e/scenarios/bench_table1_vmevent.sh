# Benchmark (not a test; tools/bench/table1.sh): the paper's Table 1 side by side on
# the stock hypervisor under QEMU 10, a PVH DomU (hap = 0, tsc_mode native) with the module, the vm_event channel.
S=bench_table1_vmevent
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
DOMU_TYPE=pvh bench_scenario xpe2e-bench-pvh vmevent "nokaslr"
