# Scenario: the xenprobe tool (issue 15) against a real guest, with no file copied to Dom0:
# xenprobe reads the guest kernel's symbols (kallsyms) and types (BTF) out of its memory. The
# one-liner counts the workload's openat() calls by file name (str() of the user pointer the
# syscall got, read through the hit vCPU's page tables) and its getppid() calls, both filtered
# by comm (the current task through the guest's BTF). Both counts must equal the workload's own,
# and xenprobe must leave no trap byte behind (the module's detach finds none to restore).
# `xenprobe list` must show the guest module's own functions, read from the guest's module list.
# stock_pv_xenprobe_async (and its trixie twin) runs the same counts with `--method async`: jump
# probes whose hits the guest module writes into its rings, str(arg1) captured in the guest (a
# user pointer, read as user memory because of its address); no comm filter and no kstack there
# (an async block sees registers and captures only), so the counts rest on the workload being the
# only process that opens its file or calls getppid; no event may be lost.
S=${XPE2E_SCENARIO:-stock_pv_xenprobe}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
case "$S" in *_async) ASYNC=1 ;; *) ASYNC=0 ;; esac
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-cli
GETPPID=300 OPENAT=40
domid=$(domu_start $N "xpe2e.work=$GETPPID:$OPENAT:5") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload did not start within 180 s"; }
# The guest's loaded modules' functions, read from its memory (struct module's core_kallsyms):
# the guest module's own, listed as bpftrace lists a module's functions.
lst=$(timeout 120 /usr/bin/xenprobe list -d $N 'xp_*' 2>&1)
echo "XPE2E-INFO: xenprobe list -d $N 'xp_*': $(echo "$lst" | wc -l) lines: $(echo "$lst" | head -n 4 | tr '\n' ' ')"
echo "$lst" | grep -q '^kprobe:xp_[a-z0-9_]* \[xenprobes\]$' || {
  domu_release "$domid"
  result FAIL "xenprobe list 'xp_*' shows no function of the guest module [xenprobes]: $(echo "$lst" | tail -n 2 | tr '\n' ' ')"
}
OUT=/tmp/$S.json
ERR=/tmp/$S.err
PROG='kprobe:do_sys_openat2 /comm == "xpe2e-workload"/ { @opens[str(arg1)] = count(); }
kprobe:__x64_sys_getppid /comm == "xpe2e-workload"/ { @getppid = count(); @stacks[kstack(4)] = count(); }'
METHOD=""
if [ $ASYNC = 1 ]; then
  PROG='kprobe:do_sys_openat2 { @opens[str(arg1)] = count(); }
kprobe:__x64_sys_getppid { @getppid = count(); }'
  METHOD="--method async"
fi
echo "XPE2E-INFO: xenprobe -d $N -f json $METHOD -e '$PROG'"
t0=$(cut -d' ' -f1 /proc/uptime)
# shellcheck disable=SC2086
xenprobe_start "$domid" "$OUT" "$ERR" -d $N -f json --duration 300 $METHOD -e "$PROG"
echo "XPE2E-INFO: attached after $(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN { printf "%.1f", b - a }') s (symbols and BTF read from the guest): $(grep '"attached_probes"' "$OUT")"
xenprobe_workload "$domid" "$OUT" "$ERR"
opens=$(grep '"@opens"' "$OUT" | grep -o '"/tmp/xpe2e-target":[0-9]*' | cut -d: -f2)
calls=$(grep '"@getppid"' "$OUT" | grep -o '"@getppid":[0-9]*' | cut -d: -f2)
# kstack, unwound from Dom0 through the guest's own ORC tables: every getppid stack is the
# system call's (do_syscall_64 calls it), and the stacks count every call.
stacks=$(grep '"@stacks"' "$OUT")
nstacks=$(echo "$stacks" | grep -o '":[0-9]*[,}]' | tr -dc '0-9\n' | awk '{ s += $1 } END { print s + 0 }')
nsys=$(echo "$stacks" | grep -o 'do_syscall_64' | wc -l)
nkeys=$(echo "$stacks" | grep -o '":[0-9]*[,}]' | wc -l)
xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
un=$(xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120)
domu_verdict $N "$domid"
domu_kernel_clean $N
[ $xp_rc -eq 0 ] || result FAIL "xenprobe exited $xp_rc after SIGTERM: $(tail -n 1 "$ERR")"
case "$done" in *"getppid=$GETPPID "*"openat=$OPENAT "*"ok=1"*) ;; *) result FAIL "the workload's own report: $done" ;; esac
[ "$opens" = "$OPENAT" ] || result FAIL "@opens[\"/tmp/xpe2e-target\"] = '${opens}', the workload opened it $OPENAT times"
[ "$calls" = "$GETPPID" ] || result FAIL "@getppid = '${calls}', the workload called getppid $GETPPID times"
if [ $ASYNC = 1 ]; then
  lost=$(grep '"lost_events"' "$OUT" | grep -o '"events": *[0-9]*' | grep -o '[0-9]*$' | awk '{ s += $1 } END { print s + 0 }')
  [ "$lost" = 0 ] || result FAIL "xenprobe reported $lost lost event(s): $(grep '"lost_events"' "$OUT" | tr '\n' ' ')"
else
  [ "$nstacks" = "$GETPPID" ] || result FAIL "@stacks counts $nstacks getppid calls, the workload made $GETPPID: $stacks"
  [ "$nkeys" -ge 1 ] && [ "$nsys" = "$nkeys" ] || result FAIL "not every getppid stack shows do_syscall_64 ($nsys of $nkeys): $stacks"
fi
[ "$un" = ok ] || result FAIL "detach + rmmod after xenprobe: '$un'"
det=$(grep -a "xenprobes: detached" "$(console_log $N)" | head -n 1 | tr -d '\r')
case "$det" in *"restored 0 trap bytes"*) ;; *) result FAIL "xenprobe left trap bytes for the module's detach: ${det#*] }" ;; esac
[ $ASYNC = 1 ] && result PASS "xenprobe --method async with the guest's own kallsyms: @opens[\"/tmp/xpe2e-target\"] = $opens (the user pointer captured in the guest), @getppid = $calls, exactly the workload's, no event lost; nothing left behind"
result PASS "xenprobe with the guest's own kallsyms, BTF and ORC: @opens[\"/tmp/xpe2e-target\"] = $opens, @getppid = $calls (comm-filtered), exactly the workload's, in $nkeys kernel stack(s) through do_syscall_64; nothing left behind"
