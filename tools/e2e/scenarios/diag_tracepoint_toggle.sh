# Diagnostic (not in the default list): does a PV DomU survive its own text_poke_bp() under
# this QEMU, with or without the guest module? DIAG_N DomUs one after another, each turning
# sched_process_exec's tracepoint on and off DIAG_TOGGLES times beside a fork/exec loop
# (xpe2e.toggle; the cmdline recorder it starts rewrites the jump-label sites in __schedule and
# the sched_switch/sched_wakeup static-call trampolines every round), nothing probed.
# DIAG_MODULE=1 loads the guest module (no Dom0 session). A DomU that does not finish within
# 60 s + 2 s per round gets domu_diag (registers, stacks, sysrq) and counts as hung.
# One XPE2E-DIAG line per DomU, one summary line (docs/e2e.md "The environment").
S=${S:-diag_tracepoint_toggle}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
T=${DIAG_TYPE:-pv}
NDOM=${DIAG_N:-6}
K=${DIAG_TOGGLES:-200}
M=${DIAG_MODULE:-0}
doms=0 hung=0 bad=0 xlfail=0
i=0
while [ $i -lt "$NDOM" ]; do
  i=$((i + 1))
  N=xpe2e-tog$i
  if ! domid=$(DOMU_TYPE=$T domu_start $N "xpe2e.module=$M xpe2e.toggle=$K"); then
    xlfail=$((xlfail + 1))
    echo "XPE2E-DIAG: domu $i type=$T xl-create-failed"
    continue
  fi
  doms=$((doms + 1))
  log=$(console_log $N)
  if wait_console $N "XPE2E-DOMU: idle" $((60 + K * 2)); then
    st=done
  else
    st=hung
    hung=$((hung + 1))
    domu_diag "$domid" "round $i: no 'toggle done' within $((60 + K * 2)) s"
  fi
  sleep 1
  line=$(grep -a "XPE2E-DOMU: toggle done" "$log" | tr -d '\r' | tail -n 1)
  nbad=$(grep -aE 'Oops|BUG:|rcu.*stall|soft lockup|hard LOCKUP' "$log" | wc -l)
  [ "$nbad" -gt 0 ] && bad=$((bad + 1))
  echo "XPE2E-DIAG: domu $i type=$T module=$M domid=$domid status=$st bad_lines=$nbad | ${line#*XPE2E-DOMU: }"
  grep -aE 'XPE2E-DOMU: toggle [0-9]' "$log" | tr -d '\r' | tail -n 1 | sed "s/^/XPE2E-DIAG:   [$N last] /"
  # The first report in full (where the stuck CPU stood), then one line per later report.
  grep -a -m1 -A40 -E 'soft lockup|rcu.*stall|hard LOCKUP' "$log" | grep -av 'dmesg-bad' | tr -d '\r' | sed "s/^/XPE2E-DIAG:   [$N] /"
  grep -aE 'soft lockup|rcu.*stall|hard LOCKUP' "$log" | grep -av 'dmesg-bad' | tr -d '\r' | sed "s/^/XPE2E-DIAG:   [$N] /"
  timeout 30 xl destroy "$domid" || echo "XPE2E-DIAG: xl destroy $domid failed"
  sleep 1
done
echo "XPE2E-DIAG-SUM type=$T module=$M toggles=$K domus=$doms hung=$hung with_bad_lines=$bad xl_create_failed=$xlfail"
result PASS "type=$T module=$M toggles=$K domus=$doms hung=$hung with_bad_lines=$bad xl_create_failed=$xlfail"
