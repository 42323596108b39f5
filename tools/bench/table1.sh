#!/bin/bash
# The paper's Table 1 (and a scaled-down Table 2/3) side by side with in-guest kprobes, on a
# real Xen under QEMU (TCG). A benchmark, not a test: see docs/benchmarks.md for the results
# and how to read them.
#
#   sudo tools/bench/table1.sh [guest] [guest-spin] [debugger] [vmevent]   default: guest debugger vmevent
#   tools/bench/table1.sh --table RUN_DIR                       re-print a finished run's table
#
# Each channel gets its own boot of the e2e harness (tools/e2e/run.sh, docs/e2e.md): guest =
# Debian's stock hypervisor + PV DomU + the guest module; debugger = the GDBSX hypervisor + PV
# DomU; vmevent = the stock hypervisor under QEMU 10 + PVH DomU. Inside the DomU a
# lat_syscall-style loop (tools/e2e/domu/workload_bench.c, "bench") measures getppid ("null"), a
# 1-byte read of /dev/zero, a 1-byte write to /dev/null and openat + close of a tmpfs file,
# then times a busybox tar extraction of 8 directories x 8 files x 4 KiB; it does so once per
# config: native (nothing armed), kprobe / kretprobe (tracefs kprobe events on the same kernel
# functions, armed by the guest itself), xp / xrp (our probes, a counting handler, armed from
# Dom0 by xpe2e-probe bench, tests/e2e/xpe2e_bench.cpp), jump (xp's handler on a jump probe)
# and async (the same count from an async probe's records; both guest channel only, and only
# when asked for in XPE2E_BENCH_CONFIGS). guest-spin: the guest channel again, in a boot of its
# own, with the module spinning (spin_us=200) and Dom0 polling (--spin-us 20000): native, xp
# and jump (XPE2E_BENCH_SPIN_CONFIGS). Ratios are to the native run of the same boot.
#
# Knobs (environment): XPE2E_BENCH_CONFIGS (native,kprobe,kretprobe,xp,xrp), XPE2E_BENCH_ROUND
# (seconds per measured round, 1), XPE2E_BENCH_ROUNDS (rounds per syscall, 3; the median is
# reported), XPE2E_BENCH_UNTAR (tar extractions per config, 3); and those of tools/e2e/run.sh.
set -u
here=$(cd "$(dirname "$0")" && pwd)

# table <run dir>: the markdown tables from the XPE2E-BENCH lines of the run's serial logs
# (a retried boot's lines replace the earlier boot's).
table() {
  local logs
  logs=$(ls -1tr "$1"/*/serial.log 2>/dev/null)
  [ -n "$logs" ] || { echo "table1.sh: no serial logs in $1" >&2; return 1; }
  # shellcheck disable=SC2086
  cat $logs | tr -d '\r' | awk '
    function ratio(v, b,   r) {
      if (!(b > 0 && v > 0)) return ""
      r = v / b
      return r < 10 ? sprintf(" (%.1f×)", r) : sprintf(" (%.0f×)", r)
    }
    function cell(ch, cf, k,   v) {
      v = us[ch, cf, k]
      if (v == "") return "-"
      return sprintf("%.2f%s", v, cf == "native" ? "" : ratio(v, us[ch, "native", k]))
    }
    /^XPE2E-BENCH-ENV / { env = substr($0, 17) }
    /^XPE2E-BENCH / {
      ch = $2; cf = $3; k = $4
      if (!(ch in seen)) { seen[ch] = 1; order[++n] = ch; envof[ch] = env }
      for (i = 5; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      if (k == "untar") { us[ch, cf, k] = f["s"]; hits[ch, cf] = f["hits"] }
      else { us[ch, cf, k] = f["us"]; calls[ch, cf, k] = f["calls"] }
      delete f
    }
    END {
      split("null read write open", kinds, " ")
      px["null"] = 180; px["read"] = 105; px["write"] = 119; px["open"] = 15
      pr["null"] = 404; pr["read"] = 273; pr["write"] = 262; pr["open"] = 29
      for (c = 1; c <= n; c++) {
        ch = order[c]
        printf "\n#### %s channel\n\n", ch
        if (envof[ch] != "") printf "Environment: %s\n\n", envof[ch]
        print "| syscall | native µs | kprobe µs (×native) | kretprobe µs | XP µs | XrP µs | jump µs | async µs | paper XP × | paper XrP × |"
        print "|---|---|---|---|---|---|---|---|---|---|"
        for (j = 1; j <= 4; j++) {
          k = kinds[j]
          printf "| %s | %s | %s | %s | %s | %s | %s | %s | %d× | %d× |\n", k, cell(ch, "native", k), cell(ch, "kprobe", k),
                 cell(ch, "kretprobe", k), cell(ch, "xp", k), cell(ch, "xrp", k), cell(ch, "jump", k), cell(ch, "async", k),
                 px[k], pr[k]
        }
        if (us[ch, "native", "untar"] != "") {
          printf "\nTar extraction (8 dirs × 8 files × 4 KiB; seconds, median of the rounds):\n\n"
          print "| config | seconds (×native) | hits in the whole config (null,read,write,open: the loops above too; mkdir, chmod: tar only) |"
          print "|---|---|---|"
          split("native kprobe kretprobe xp xrp jump async", cfs, " ")
          for (j = 1; j <= 7; j++)
            if (us[ch, cfs[j], "untar"] != "")
              printf "| %s | %s | %s |\n", cfs[j], cell(ch, cfs[j], "untar"), cfs[j] == "native" ? "-" : hits[ch, cfs[j]]
        }
      }
    }'
}

if [ "${1:-}" = --table ]; then
  table "${2:?usage: table1.sh --table RUN_DIR}"
  exit
fi
case "${1:-}" in -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
scen=""
for c in "${@:-guest debugger vmevent}"; do
  for w in $c; do
    case "$w" in
      guest|debugger|vmevent) scen="$scen bench_table1_$w" ;;
      guest-spin) scen="$scen bench_table1_guest_spin" ;;
      *) echo "table1.sh: unknown channel '$w' (guest, guest-spin, debugger, vmevent)" >&2; exit 2 ;;
    esac
  done
done
# shellcheck disable=SC2086
"$here/../e2e/run.sh" --isolate $scen
rc=$?
cache=${XENPROBES_E2E_CACHE:-/var/cache/xenprobes-e2e}
run=$(readlink -f "$cache/runs/latest")
table "$run" | tee "$run/table1.md"
echo
echo "table1.sh: run $run (exit $rc); the table is in $run/table1.md"
exit $rc
