# Benchmark (not a test; tools/bench/table1.sh guest-spin): the guest channel's part of the
# paper's Table 1 with spinning instead of notifying (docs/probes.md): the module spins 200 µs
# on its mailbox before it blocks, Dom0 polls the mailboxes for 20 ms after each hit.
S=${XPE2E_SCENARIO:-bench_table1_guest_spin}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
bench_scenario xpe2e-bench guest "" ":spin_us=200" "--spin-us 20000" "${BENCH_SPIN_CONFIGS:-native,xp,jump}"
