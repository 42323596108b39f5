#!/bin/bash
# xenprobesd at scale on the simulated Xen (issue 16, docs/benchmarks.md "xenprobesd at scale
# on the simulated Xen"): for each (guests, probes per guest) point, one daemon
# (`xenprobesd --sim`) is started with that many demo guests (1 vCPU each) running their
# workload without end and one program of that many probes in every guest; the script reads
# the attach times from the event log, then samples the process for a window: hits served
# (`xenprobesd status`), CPU and run-queue wait per thread (/proc/PID/task/*/schedstat),
# memory (/proc/PID/status, /proc/PID/smaps). Then, unless left out: the same daemon with
# idle guests (their workload done), a guest that appears while the others run, and one
# slow guest (a heavy program in one guest) against the others' probe round trip.
# A benchmark, not a test: nothing fails when the numbers move. Builds nothing.
#
#   nice -n 10 bash tools/bench/xenprobesd-scale.sh [--bin XENPROBESD] [--points "G:P ..."]
#       [--window S] [--warmup S] [--no-idle] [--no-late] [--no-stall] [--keep]
#
# --bin: the daemon (default build/bin/xenprobesd: `cmake --build build --target xenprobesd`);
# --points: guests:probes pairs (default "0:20 1:1 1:20 10:20 25:20 50:20 50:1"; G is 0 ... 64,
#   P is 1 ... 20; G = 0 is the daemon with no guest, the base of the per-guest memory);
# --window: seconds measured per point (default 15) after --warmup seconds (default 3);
# --keep: keep the run directory (configurations, event logs, samples) and print its path.
# About 5 minutes with the defaults on 2 cores. Every daemon started is stopped on exit.
#
# In the simulation the guests' vCPUs are Unicorn threads of the daemon's own process (one
# thread per guest) and all emulation is serialised by one lock (libxenprobes/hv/sim): the
# daemon's main thread (its tid is the pid) is Dom0's side: the handlers, the guest channel,
# the attach work, and the simulated hypercalls it makes. The other threads are the guests
# (plus the control socket's thread, which only waits). Memory is split by mapping: guest RAM
# (the sim's memfd, mapped by the guest and by Dom0's foreign mappings), Unicorn's translated
# code (anonymous rwx mappings), and the rest (daemon, library and Unicorn's own heap: these
# cannot be told apart from outside).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
bin=$top/build/bin/xenprobesd
points="0:20 1:1 1:20 10:20 25:20 50:20 50:1"
window=15
warmup=3
do_idle=1
do_late=1
do_stall=1
keep=0
usage() {
  echo "usage: tools/bench/xenprobesd-scale.sh [--bin XENPROBESD] [--points \"G:P ...\"] [--window S] [--warmup S] [--no-idle] [--no-late] [--no-stall] [--keep]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case $1 in
    --bin) [ $# -ge 2 ] || usage; bin=$2; shift 2 ;;
    --points) [ $# -ge 2 ] || usage; points=$2; shift 2 ;;
    --window) [ $# -ge 2 ] || usage; window=$2; shift 2 ;;
    --warmup) [ $# -ge 2 ] || usage; warmup=$2; shift 2 ;;
    --no-idle) do_idle=0; shift ;;
    --no-late) do_late=0; shift ;;
    --no-stall) do_stall=0; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
done
[ -x "$bin" ] || { echo "xenprobesd-scale.sh: no daemon at $bin (build it: cmake --build build --target xenprobesd, or give --bin)" >&2; exit 1; }
for pt in $points; do
  case $pt in
    *:*) g=${pt%%:*}; p=${pt#*:} ;;
    *) usage ;;
  esac
  case "$g$p" in *[!0-9]*|"") usage ;; esac
  if [ "$g" -gt 64 ] || [ "$p" -lt 1 ] || [ "$p" -gt 20 ]; then usage; fi
done

work=$(mktemp -d /tmp/xenprobesd-scale.XXXXXX)
pid=
# Stops the running daemon: SIGTERM, then SIGKILL after 30 s.
stop_daemon() {
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null
  local i=0
  while kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
  kill -0 "$pid" 2>/dev/null && { echo "xenprobesd-scale.sh: daemon $pid ignored SIGTERM for 30 s: SIGKILL" >&2; kill -KILL "$pid" 2>/dev/null; }
  wait "$pid" 2>/dev/null
  pid=
}
cleanup() {
  stop_daemon
  if [ $keep = 1 ]; then echo "run directory kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# The probes, hottest first (the demo guest's workload, guest/demo.c: per iteration 2 calls of
# each sys_* and demo_classify, 10 of demo_dispatch, 13 entries of demo_recurse, memcpy from
# sys_read; demo_main and demo_puts run at the start and the end only).
PROBES="kprobe:sys_getppid kretprobe:sys_getppid kprobe:sys_read kretprobe:sys_read
kprobe:sys_write kretprobe:sys_write kprobe:sys_open kretprobe:sys_open kprobe:sys_unlink
kretprobe:sys_unlink kprobe:demo_classify kretprobe:demo_classify kprobe:demo_dispatch
kretprobe:demo_dispatch kprobe:demo_recurse kretprobe:demo_recurse kprobe:memcpy
kretprobe:memcpy kprobe:demo_main kprobe:demo_puts"

# daemon_section DIR
daemon_section() {
  printf '[daemon]\nevent_log = "-"\nmetrics_listen = ""\ncontrol_socket = "%s/ctl.sock"\nmetrics_textfile = "%s/metrics.prom"\n' "$1" "$1"
}
# handler_ns DIR: the programs' actions, ns per hit over the whole run (the textfile the
# daemon writes at exit: xenprobesd_probe_handler_seconds_total / xenprobesd_probe_hits_total).
handler_ns() {
  awk '/^xenprobesd_probe_handler_seconds_total/ { s += $NF } /^xenprobesd_probe_hits_total/ { h += $NF }
    END { if (h > 0) printf "%.0f\n", s * 1e9 / h; else print "-" }' "$1/metrics.prom" 2>/dev/null || echo -
}
# scale_program P SELECTOR: one program with the first P probes, each counting per probe and
# summing an argument or the return value (what a typical bpftrace one-liner does).
scale_program() {
  local i=0 s
  printf "\n[[program]]\nname = \"scale\"\nsource = '''\n"
  for s in $PROBES; do
    i=$((i + 1))
    [ $i -le "$1" ] || break
    case $s in
      kret*) echo "$s { @ret[probe] = count(); @rv = sum(retval); }" ;;
      *) echo "$s { @calls[probe] = count(); @a0 = sum(arg0); }" ;;
    esac
  done
  printf "'''\ndomains = [%s]\n" "$2"
}

now_ns() { date +%s%N; }
# ns_diff A B: B - A for two decimal nanosecond stamps (awk's doubles would round the full
# values: only the last 13 digits, about 2.8 hours, are compared).
ns_diff() {
  awk -v a="$1" -v b="$2" 'BEGIN { a = substr(a, length(a) - 12) + 0; b = substr(b, length(b) - 12) + 0
    d = b - a; if (d < 0) d += 1e13; printf "%.0f\n", d }'
}
# stamp KIND [DOMAIN] [first|last] < events: time_unix_nano of a record.
stamp() {
  awk -v kind="\"kind\":\"$1\"" -v dom="${2:+\"domain\":\"$2\"}" -v which="${3:-first}" '
    index($0, kind) && (dom == "" || index($0, dom)) {
      i = index($0, "\"time_unix_nano\":\"") + 18; t = substr($0, i); t = substr(t, 1, index(t, "\"") - 1)
      if (which == "first") { print t; exit }
      last = t
    }
    END { if (which == "last" && last != "") print last }'
}
count_kind() {
  local c
  c=$(grep -c "\"kind\":\"$1\"" "$2" 2>/dev/null)
  echo "${c:-0}"
}

# start DIR CONFIG ARGS...: starts the daemon on the simulated Xen, stdout (the event log) and
# stderr into DIR; sets pid and t_exec.
start() {
  local dir=$1 cfg=$2
  shift 2
  rm -f "$dir/ctl.sock"
  t_exec=$(now_ns)
  "$bin" -c "$cfg" --sim --sim-vcpus 1 "$@" >"$dir/events.ndjson" 2>"$dir/stderr.txt" &
  pid=$!
}
# wait_for DIR KIND N [SECONDS]: until the event log holds N records of KIND (default 120 s).
wait_for() {
  local i=0 lim=$(( ${4:-120} * 10 ))
  while [ "$(count_kind "$2" "$1/events.ndjson")" -lt "$3" ]; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "xenprobesd-scale.sh: the daemon ended early; its stderr:" >&2
      cat "$1/stderr.txt" >&2
      pid=
      exit 1
    fi
    i=$((i + 1))
    if [ $i -gt "$lim" ]; then
      echo "xenprobesd-scale.sh: no $3 \"$2\" records within ${4:-120} s ($1/events.ndjson)" >&2
      exit 1
    fi
    sleep 0.1
  done
  if [ "$(count_kind attach_failed "$1/events.ndjson")" -gt 0 ]; then
    echo "xenprobesd-scale.sh: an attach failed:" >&2
    grep '"attach_failed"' "$1/events.ndjson" | head -3 >&2
    exit 1
  fi
}
# sample DIR NAME: hits and missed so far (status), the time, each thread's schedstat.
sample() {
  local out=$1/$2 t
  "$bin" status --socket "$1/ctl.sock" >"$out.status" 2>&1 || { echo "xenprobesd-scale.sh: status failed:" >&2; cat "$out.status" >&2; exit 1; }
  now_ns >"$out.time"
  echo "$2 $(basename "$1") $(cut -d' ' -f1 /proc/loadavg)" >>"$work/load"
  for t in /proc/"$pid"/task/*; do
    echo "${t##*/} $(cat "$t/schedstat" 2>/dev/null)"
  done >"$out.sched"
}
# The hits (or missed) in a status text.
status_sum() {
  awk -v w="$2" '{ for (i = 1; i < NF; i++) if ($(i + 1) == w "," || $(i + 1) == w) s += $i } END { printf "%.0f\n", s }' "$1"
}
# guest_range A B: the fewest and the most hits one guest got between two status texts.
guest_range() {
  awk 'FNR == NR { if ($1 ~ /^sim-/) h[$1] = $6; next }
    $1 ~ /^sim-/ { d = $6 - h[$1]; if (n++ == 0 || d < lo) lo = d; if (d > hi) hi = d }
    END { printf "%d %d\n", lo, hi }' "$1" "$2"
}
# memory DIR: VmRSS and its split by mapping (KiB): total guest_ram jit rest.
memory() {
  local rss
  rss=$(awk '/^VmRSS:/ { print $2 }' /proc/"$pid"/status)
  awk -v rss="$rss" '
    /^[0-9a-f]+-[0-9a-f]+ / { perm = $2; name = $6; kind = "rest"
      if (name ~ /xenprobes-sim-ram/) kind = "ram"; else if (name == "" && perm ~ /x/) kind = "jit" }
    /^Rss:/ { k[kind] += $2 }
    END { printf "%d %d %d %d\n", rss, k["ram"], k["jit"], rss - k["ram"] - k["jit"] }' /proc/"$pid"/smaps >"$1/memory"
}
# cpu DIR A B PID: daemon (main thread) CPU, its run-queue wait, the other threads' CPU, all
# in ns, between samples A and B.
cpu() {
  awk -v main="$4" '
    FNR == NR { run[$1] = $2; wt[$1] = $3; next }
    { d = $2 - run[$1]; w = $3 - wt[$1]
      if ($1 == main) { m += d; mw += w } else o += d }
    END { printf "%.0f %.0f %.0f\n", m, mw, o }' "$1/$2.sched" "$1/$3.sched"
}

results=$work/results
: >"$results"
echo "xenprobesd-scale: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), daemon $bin" >&2
echo "xenprobesd-scale: run directory $work" >&2

# ---- the points: busy guests ------------------------------------------------------------
# busy_point G P [idle]: one line of $results:
#   mode G P startup_ns first_attach_ns all_attach_ns rss ram jit rest window_ns hits missed main_ns main_wait_ns other_ns
busy_point() {
  local g=$1 p=$2 mode=${3:-busy} dir iters ts t1 tl d
  dir=$work/$mode-g$g-p$p
  mkdir -p "$dir"
  { daemon_section "$dir"; scale_program "$p" '{ glob = "*" }'; } >"$dir/config.toml"
  iters=0
  [ "$mode" = idle ] && iters=1
  echo "xenprobesd-scale: $mode: $g guests x $p probes" >&2
  start "$dir" "$dir/config.toml" --sim-guests "$g" --sim-iterations $iters
  wait_for "$dir" started 1
  wait_for "$dir" attached "$g"
  ts=$(stamp started <"$dir/events.ndjson")
  if [ "$g" -gt 0 ]; then
    t1=$(ns_diff "$ts" "$(stamp attached "" first <"$dir/events.ndjson")")
    tl=$(ns_diff "$ts" "$(stamp attached "" last <"$dir/events.ndjson")")
  else
    t1=-; tl=-
  fi
  if [ "$mode" = idle ]; then
    wait_for "$dir" sim_idle 1 300
    sleep 1
  else
    sleep "$warmup"
  fi
  sample "$dir" a
  sleep "$window"
  sample "$dir" b
  memory "$dir"
  d=$pid
  stop_daemon
  echo "$mode $g $p $(ns_diff "$t_exec" "$ts") $t1 $tl $(cat "$dir/memory") \
$(ns_diff "$(cat "$dir/a.time")" "$(cat "$dir/b.time")") \
$(( $(status_sum "$dir/b.status" hits) - $(status_sum "$dir/a.status" hits) )) \
$(status_sum "$dir/b.status" missed) $(cpu "$dir" a b $d) $(handler_ns "$dir") \
$(guest_range "$dir/a.status" "$dir/b.status")" >>"$results"
}

for pt in $points; do busy_point "${pt%%:*}" "${pt#*:}"; done
big=0
bigp=20
for pt in $points; do
  if [ "${pt%%:*}" -gt $big ]; then big=${pt%%:*}; bigp=${pt#*:}; fi
done
[ $do_idle = 1 ] && [ $big -gt 0 ] && busy_point $big $bigp idle

# ---- a guest that appears ---------------------------------------------------------------
# BIG-1 guests at start with the scale program, and a marker program (kprobe:demo_main, the
# first function each guest runs) that logs each guest's first hit. `--sim-create late@1`
# makes the daemon's loop create the guest "late" (paused, like `xl create -p`) right after
# the first hit it handles: t0 = the first marker record, t1 = late's attached record.
if [ $do_late = 1 ] && [ $big -gt 1 ]; then
  dir=$work/late
  mkdir -p "$dir"
  {
    daemon_section "$dir"
    scale_program $bigp '{ glob = "*" }'
    printf "\n[[program]]\nname = \"first\"\nsource = 'kprobe:demo_main { printf(\"first hit\\\\n\"); }'\ndomains = [{ glob = \"sim-*\" }]\n"
  } >"$dir/config.toml"
  echo "xenprobesd-scale: late: $((big - 1)) guests x $bigp probes, then one more" >&2
  start "$dir" "$dir/config.toml" --sim-guests $((big - 1)) --sim-iterations 0 --sim-create late@1
  wait_for "$dir" started 1
  # every start guest twice (scale, first), then late once
  wait_for "$dir" attached $((2 * (big - 1) + 1))
  sleep 1
  stop_daemon
  ts=$(stamp started <"$dir/events.ndjson")
  t0=$(stamp printf <"$dir/events.ndjson")
  t1=$(stamp attached late <"$dir/events.ndjson")
  n_before=$(awk '/"kind":"printf"/ { n++ } /"kind":"attached"/ && /"domain":"late"/ { print n + 0; exit }' "$dir/events.ndjson")
  # the last first-hit record written before it
  tp=$(awk '/"kind":"attached"/ && /"domain":"late"/ { exit } /"kind":"printf"/ { i = index($0, "\"time_unix_nano\":\"") + 18
    t = substr($0, i); last = substr(t, 1, index(t, "\"") - 1) } END { print last }' "$dir/events.ndjson")
  echo "late $big $bigp $(ns_diff "$t_exec" "$ts") $(ns_diff "$t0" "$t1") $n_before $(ns_diff "$tp" "$t1")" >>"$results"
fi

# ---- one slow guest ---------------------------------------------------------------------
# 4 guests: sim-2..4 run a round-trip program (Dom0 time from the handler of a sys_getppid
# entry hit to the handler of the same call's return hit: the guest runs a few instructions
# in between, so the rest is waiting to be served); sim-1 runs a program whose handler on
# demo_recurse (13 hits per iteration) does N string reads of guest memory into maps, and
# times itself; N = 0 (no slow program: the baseline), 1000, 10000, 30000.
slow_program() {
  local n=$1 i=0
  printf "\n[[program]]\nname = \"slow\"\nsource = '''\nkprobe:demo_recurse { \$t = nsecs;\n"
  while [ $i -lt "$n" ]; do
    i=$((i + 1))
    echo "@s$((i % 50))[str(kaddr(\"sys_getppid\") + $((i % 64)), 48)] = count();"
  done
  printf "@self = hist(nsecs - \$t); @selfmax = max(nsecs - \$t); }\nEND { print(@self); print(@selfmax); }\n'''\n"
  printf 'domains = [{ name = "sim-1" }]\n'
}
rt_program() {
  printf "\n[[program]]\nname = \"rt\"\nsource = '''\n"
  printf 'kprobe:sys_getppid { @t = nsecs; }\n'
  printf 'kretprobe:sys_getppid { $d = nsecs - @t; @rt = hist($d); @rtmax = max($d); }\n'
  printf "END { print(@rt); print(@rtmax); }\n'''\n"
  printf 'domains = [{ name = "sim-2" }, { name = "sim-3" }, { name = "sim-4" }]\n'
}
# hist_stats PROGRAM MAP < events: median and 99th percentile (a power-of-2 bucket's upper
# bound, ns) of PROGRAM's hist MAP summed over the domains, and the samples.
hist_stats() {
  awk -v prog="\"program\":\"$1\"" -v map="\"$2\":\\[" '
    /"kind":"hist"/ && index($0, prog) && match($0, map) {
      n = split(substr($0, RSTART), b, "\\{\"min\":")
      for (i = 2; i <= n; i++) { split(b[i], f, /[^0-9]+/); c[f[2] + 0] += f[3]; tot += f[3] }
    }
    END {
      if (tot == 0) { print "- - 0"; exit }
      m = 0; for (k in c) keys[++m] = k + 0
      for (i = 2; i <= m; i++) { v = keys[i]; for (j = i - 1; j >= 1 && keys[j] > v; j--) keys[j + 1] = keys[j]; keys[j + 1] = v }
      s = 0; p50 = ""; p99 = ""
      for (i = 1; i <= m; i++) { s += c[keys[i]]; if (p50 == "" && s >= 0.5 * tot) p50 = keys[i]; if (p99 == "" && s >= 0.99 * tot) p99 = keys[i] }
      printf "%d %d %d\n", p50, p99, tot
    }'
}
# map_max PROGRAM MAP < events: the largest value of MAP over the domains.
map_max() {
  awk -v prog="\"program\":\"$1\"" -v key="\"$2\":" '
    /"kind":"map"/ && index($0, prog) && (i = index($0, key)) { v = substr($0, i + length(key)) + 0; if (v > m) m = v }
    END { printf "%d\n", m }'
}
if [ $do_stall = 1 ]; then
  for n in 0 1000 10000 30000; do
    dir=$work/stall-$n
    mkdir -p "$dir"
    { daemon_section "$dir"; rt_program; [ $n -gt 0 ] && slow_program $n; } >"$dir/config.toml"
    echo "xenprobesd-scale: stall: slow guest with $n reads per hit" >&2
    start "$dir" "$dir/config.toml" --sim-guests 4 --sim-iterations 0
    wait_for "$dir" started 1
    wait_for "$dir" attached $((n > 0 ? 4 : 3))
    sleep "$warmup"
    sample "$dir" a
    sleep "$window"
    sample "$dir" b
    d=$pid
    stop_daemon
    others_a=$(grep -E '^ +sim-[234] ' "$dir/a.status" | awk '{ for (i = 1; i < NF; i++) if ($(i + 1) == "hits,") s += $i } END { printf "%.0f\n", s }')
    others_b=$(grep -E '^ +sim-[234] ' "$dir/b.status" | awk '{ for (i = 1; i < NF; i++) if ($(i + 1) == "hits,") s += $i } END { printf "%.0f\n", s }')
    echo "stall $n $(ns_diff "$(cat "$dir/a.time")" "$(cat "$dir/b.time")") $((others_b - others_a)) \
$(hist_stats rt @rt <"$dir/events.ndjson") $(map_max rt @rtmax <"$dir/events.ndjson") \
$(hist_stats slow @self <"$dir/events.ndjson") $(map_max slow @selfmax <"$dir/events.ndjson") \
$(status_sum "$dir/b.status" missed) $(cpu "$dir" a b $d)" >>"$results"
  done
fi

# ---- the tables -------------------------------------------------------------------------
echo "xenprobesd-scale: load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "Load average (1 min) at the end of each window: $(awk '$1 == "b" { printf "%s%s %s", n++ ? ", " : "", $2, $3 }' "$work/load")"
echo
awk '
  function ms(ns) { return ns == "-" ? "-" : sprintf("%.1f", ns / 1e6) }
  function mib(k) { return sprintf("%.1f", k / 1024) }
  function us(ns) { return ns == "-" ? "-" : sprintf(ns < 1e5 ? "%.1f" : "%.0f", ns / 1e3) }
  function cap(b, m) { return b == "-" ? "-" : "≤" us(b + 0 > m + 0 ? m : b) }
  $1 == "busy" || $1 == "idle" { row[++n] = $0 }
  $1 == "busy" && $2 == 0 { base = $7; brest = $10 }
  $1 == "late" { late = $0 }
  $1 == "stall" { st[++ns] = $0 }
  END {
    print "Attach and memory (busy guests; RSS at the end of the window; per guest: above the 0-guest daemon):"
    print ""
    print "| guests | probes/guest | start-up to `started` (ms) | attach, first guest (ms) | attach, all guests (ms) | RSS (MiB) | RSS per guest (MiB) | guest RAM / Unicorn code / rest (MiB) | rest per guest (MiB) |"
    print "|---:|---:|---:|---:|---:|---:|---:|---|---:|"
    for (i = 1; i <= n; i++) {
      split(row[i], f, " ")
      if (f[1] != "busy") continue
      g = f[2]
      per = "-"; rest = "-"
      if (g > 0) per = base != "" ? mib((f[7] - base) / g) : mib(f[7] / g)
      if (g > 0 && base != "") rest = mib((f[10] - brest) / g)
      printf "| %d | %d | %s | %s | %s | %s | %s | %s / %s / %s | %s |\n", g, f[3], ms(f[4]), ms(f[5]), ms(f[6]), mib(f[7]), per, mib(f[8]), mib(f[9]), mib(f[10]), rest
    }
    print ""
    print "CPU and hits over the window (CPU in seconds per second of wall time; daemon = its main thread):"
    print ""
    print "| guests | probes/guest | guests | window (s) | hits/s | one guest: fewest / most hits/s | missed (whole run) | daemon CPU (s/s) | daemon CPU per guest (ms/s) | daemon CPU per hit (µs) | program actions per hit (µs) | daemon run-queue wait (s/s) | guest threads CPU (s/s) |"
    print "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) {
      split(row[i], f, " ")
      w = f[11] / 1e9; h = f[12]
      pg = "-"; ph = "-"
      if (f[2] > 0) pg = sprintf("%.2f", f[14] / 1e6 / w / f[2])
      if (h > 0) ph = us(f[14] / h)
      rg = "-"
      if (f[2] > 0) rg = sprintf("%.0f / %.0f", f[18] / w, f[19] / w)
      printf "| %d | %d | %s | %.1f | %.0f | %s | %d | %.3f | %s | %s | %s | %.3f | %.3f |\n", f[2], f[3], f[1], w, h / w, rg, f[13], f[14] / 1e9 / w, pg, ph, us(f[17]), f[15] / 1e9 / w, f[16] / 1e9 / w
    }
    if (late != "") {
      split(late, f, " ")
      print ""
      printf "A guest that appears: %d guests x %d probes running; the daemon loop creates one more right after the first hit it serves. First hit to the new guest'"'"'s `attached` record: %s ms; from the last of the %d first-hit records written before it: %s ms. Start-up of the %d guests at start: %s ms (%.1f ms per guest, mostly the simulated domain creation, which both figures include once).\n", f[2] - 1, f[3], ms(f[5]), f[6], ms(f[7]), f[2] - 1, ms(f[4]), f[4] / 1e6 / (f[2] - 1)
    }
    if (ns > 0) {
      print ""
      print "One slow guest (sim-1) and three others (sim-2..4), 1 vCPU each. Round trip: Dom0 time from the handler of a sys_getppid entry hit to the handler of its return hit in sim-2..4. Medians and 99th percentiles are the upper bounds of power-of-2 buckets (capped at the maximum); maxima are exact:"
      print ""
      print "| reads per slow hit | slow handler median / p99 / max (µs) | others: round trip median / p99 / max (µs) | others: hits/s | round trips | daemon CPU (s/s) | daemon run-queue wait (s/s) |"
      print "|---:|---|---|---:|---:|---:|---:|"
      for (i = 1; i <= ns; i++) {
        split(st[i], f, " ")
        w = f[3] / 1e9
        slow = "-"
        if (f[2] > 0) slow = sprintf("%s / %s / %s", cap(f[9], f[12]), cap(f[10], f[12]), us(f[12]))
        printf "| %d | %s | %s / %s / %s | %.0f | %d | %.3f | %.3f |\n", f[2], slow, cap(f[5], f[8]), cap(f[6], f[8]), us(f[8]), f[4] / w, f[7], f[14] / 1e9 / w, f[15] / 1e9 / w
      }
    }
  }' "$results"
