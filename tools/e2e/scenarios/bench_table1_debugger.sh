# Benchmark (not a test; tools/bench/table1.sh): the paper's Table 1 side by side on
# the GDBSX hypervisor (QEMU 10 for ICEBP), a PV DomU with the module, the debugger channel.
S=bench_table1_debugger
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
bench_scenario xpe2e-bench debugger ""
