# Diagnostic (not in the default list): the environment's random process deaths
# (docs/e2e.md "The environment"). Creates DomUs one after another (no module, nothing
# probed), each runs its boot exercise plus DIAG_ROUNDS more rounds of 40 short processes
# (xpe2e.churn), then is destroyed. One XPE2E-DIAG line per DomU, one summary line.
# run.conf (from the host's XPE2E_DIAG_*): DIAG_TYPE pv|pvh, DIAG_N DomUs, DIAG_ROUNDS.
S=${S:-diag_env_procs}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
T=${DIAG_TYPE:-pv}
NDOM=${DIAG_N:-6}
R=${DIAG_ROUNDS:-10}
# DIAG_FPU=S:K: each DomU first runs K fpucheck processes for S seconds while Dom0 runs two.
FPU=${DIAG_FPU:-}
echo "XPE2E-DIAG: dom0 flags $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2)"
echo "XPE2E-DIAG: xen $(xl info 2>/dev/null | grep -E '^(xen_version|virt_caps|hw_caps)' | tr '\n' ' ')"
doms=0 procs=0 died=0 lossy=0 xlfail=0 incomplete=0
i=0
while [ $i -lt "$NDOM" ]; do
  i=$((i + 1))
  N=xpe2e-env$i
  if ! domid=$(DOMU_TYPE=$T domu_start $N "nokaslr xpe2e.module=0 xpe2e.churn=$R${FPU:+ xpe2e.fpucheck=$FPU}"); then
    xlfail=$((xlfail + 1))
    echo "XPE2E-DIAG: domu $i type=$T xl-create-failed"
    continue
  fi
  log=$(console_log $N)
  if [ -n "$FPU" ]; then
    wait_console $N "XPE2E-DOMU: up" 120
    $E2E/fpucheck "${FPU%%:*}" dom0-a-$i &
    $E2E/fpucheck "${FPU%%:*}" dom0-b-$i &
    wait
  fi
  if wait_console $N "XPE2E-DOMU: idle" $((60 + R * 40)); then st=done; else st=incomplete; incomplete=$((incomplete + 1)); fi
  sleep 1
  line=$(grep -a "XPE2E-DOMU: churn done" "$log" | tr -d '\r' | tail -n 1)
  segv=$(grep -aE 'segfault at|general protection|traps: ' "$log" | grep -av 'dmesg-bad' | wc -l)
  pids=$(echo "$line" | sed -n 's/.* pids=\([0-9]*\).*/\1/p')
  fails=$(echo "$line" | sed -n 's/.* failures=\([0-9]*\).*/\1/p')
  [ -n "$pids" ] || pids=0
  # Processes: the churn's pids plus the boot exercise's (about as many as one round).
  p=$((pids + pids / (R > 0 ? R : 1)))
  doms=$((doms + 1))
  procs=$((procs + p))
  died=$((died + segv))
  [ "$segv" -gt 0 ] && lossy=$((lossy + 1))
  echo "XPE2E-DIAG: domu $i type=$T domid=$domid status=$st procs~$p failures=${fails:-?} segv=$segv | ${line#*XPE2E-DOMU: }"
  grep -aE 'segfault at|general protection|traps: |Kernel panic' "$log" | grep -av 'dmesg-bad' | tr -d '\r' | sed "s/^/XPE2E-DIAG:   [$N] /"
  grep -a 'XPE2E-FPU:' "$log" | tr -d '\r' | sed "s/^/XPE2E-DIAG:   [$N] /"
  [ "$st" = done ] || tail -n 20 "$log" | tr -d '\r' | sed "s/^/XPE2E-DIAG:   [$N tail] /"
  timeout 30 xl destroy "$domid" || echo "XPE2E-DIAG: xl destroy $domid failed"
  sleep 1
done
echo "XPE2E-DIAG-SUM type=$T domus=$doms procs~$procs died=$died domus_with_deaths=$lossy incomplete=$incomplete xl_create_failed=$xlfail"
result PASS "type=$T domus=$doms procs~$procs died=$died domus_with_deaths=$lossy incomplete=$incomplete xl_create_failed=$xlfail"
