# Scenario: the guest module's waiting budget (protocol.h "Waiting budget") on a real kernel.
# The module is loaded with wait_budget_ms=1: once a CPU's hits have waited 1 ms for Dom0 in
# all since that CPU last switched tasks, its hits resume without Dom0 (counted over budget)
# until it switches. The workload's getppid loop runs on one CPU without switching for long
# stretches, so most of its calls go over budget; each call is seen exactly once either way:
# xenprobe's count plus the module's over-budget count must equal the workload's calls, with
# no timeout (an over-budget hit says nothing about Dom0), and the guest must stay clean. With
# the default budget (5 s) the same loop is counted whole: stock_pv_xenprobe.
S=${XPE2E_SCENARIO:-stock_pv_budget}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-budget
GETPPID=300
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000:wait_budget_ms=1 xpe2e.work=$GETPPID:10:5") ||
  result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
OUT=/tmp/$S.json
ERR=/tmp/$S.err
PROG='kprobe:__x64_sys_getppid { @getppid = count(); }'
echo "XPE2E-INFO: xenprobe -d $N -f json --channel guest -e '$PROG'"
xenprobe_start "$domid" "$OUT" "$ERR" -d $N -f json --channel guest --duration 300 -e "$PROG"
xenprobe_workload "$domid" "$OUT" "$ERR"
calls=$(grep '"@getppid"' "$OUT" | grep -o '"@getppid":[0-9]*' | cut -d: -f2)
xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
un=$(xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120)
domu_verdict $N "$domid"
domu_kernel_clean $N
# The module's unload line: "... N timeouts, ...; N hits over budget; return slots: ...".
line=$(tr -d '\r' <"$(console_log $N)" | grep -a "xenprobes: unloaded (" | tail -n 1)
echo "XPE2E-INFO: DomU $N: ${line#*] }"
over=$(echo "$line" | sed -n 's/.*; \([0-9]*\) hits over budget[;)].*/\1/p')
tmo=$(echo "$line" | sed -n 's/.*hits, \([0-9]*\) timeouts,.*/\1/p')
[ $xp_rc -eq 0 ] || result FAIL "xenprobe exited $xp_rc after SIGTERM: $(tail -n 1 "$ERR")"
[ "$un" = ok ] || result FAIL "detach + rmmod of the guest module: '$un'"
case "$done" in *"getppid=$GETPPID "*"ok=1"*) ;; *) result FAIL "the workload's own report: $done" ;; esac
[ -n "$over" ] && [ -n "$tmo" ] || result FAIL "no over-budget or timeout count in the module's unload line: '${line#*] }'"
[ "$tmo" = 0 ] || result FAIL "the module timed out $tmo hits (Dom0 answered late): the budget's count cannot be told apart"
[ "$over" -gt 0 ] || result FAIL "no hit went over a 1 ms budget in $GETPPID getppid calls (@getppid = $calls)"
[ -n "$calls" ] || calls=0
[ $((calls + over)) -eq $GETPPID ] ||
  result FAIL "@getppid = $calls plus $over over budget is not the workload's $GETPPID calls"
result PASS "wait_budget_ms=1: @getppid = $calls through Dom0 plus $over over budget = the workload's $GETPPID calls, no timeout, the guest clean"
