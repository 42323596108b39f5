# Benchmark (not a test; tools/bench/table1.sh): the paper's Table 1 side by side on
# Debian's stock hypervisor, a PV DomU with the module, the guest channel.
S=${XPE2E_SCENARIO:-bench_table1_guest}  # trixie_bench_table1_guest runs this body too (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
bench_scenario xpe2e-bench guest ""
