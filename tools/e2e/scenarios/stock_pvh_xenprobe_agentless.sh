# Scenario: the xenprobe tool (issue 15) against a PVH guest with nothing of ours installed:
# no guest module, probed through the vm_event channel in int3 mode (Xen emulates each probed
# instruction), symbols (kallsyms), types (BTF) and stacks (ORC) all read from the guest's
# memory. The comm-filtered one-liners of stock_pv_xenprobe (openat by file name, getppid)
# must count exactly the workload's own calls, the guest must stay clean, and its text must be
# what it was (xenprobe detached; nothing of ours was ever in the guest to restore it).
# PVH under TCG: hap = 0, tsc_mode = "native" and "nokaslr", as the other PVH scenarios.
# Agentless probing needs the CPU's #BP intercept (every guest int3 reaches Xen first): a first
# guest checks it as stock_pvh_int3_intercept does, with nothing written into it, and the
# scenario fails there, before any probe, on a platform without it (QEMU's TCG: docs/e2e.md).
S=${XPE2E_SCENARIO:-stock_pvh_xenprobe_agentless}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-pvh-cli
GETPPID=200 OPENAT=20
I=xpe2e-pvh-int3
idom=$(DOMU_TYPE=pvh domu_start $I "nokaslr xpe2e.module=0 xpe2e.safety=1") || result FAIL "xl create failed"
wait_console $I "XPE2E-WORKLOAD: waiting" 240 || { dump_console $I; result FAIL "the int3 check's safety loop did not start within 240 s"; }
timeout 300 "$PROBE" int3-intercept --domid "$idom" --timeout 120
irc=$?
xenstore-write "/local/domain/$idom/data/xpe2e/safety/end" 1
domu_release "$idom"
xl destroy "$idom"
[ $irc -eq 0 ] || result FAIL "this platform does not hand the guest's int3s to Dom0 (xpe2e-probe int3-intercept above): agentless probing would crash the guest here, so it was not tried"
domid=$(DOMU_TYPE=pvh domu_start $N "nokaslr xpe2e.module=0 xpe2e.work=$GETPPID:$OPENAT:5") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 240 || { dump_console $N; result FAIL "the workload did not start within 240 s"; }
doc=$(timeout 120 /usr/bin/xenprobe doctor -d $N 2>&1)
echo "$doc" | sed 's/^/XPE2E-INFO: xenprobe doctor: /'
OUT=/tmp/$S.json
ERR=/tmp/$S.err
PROG='kprobe:do_sys_openat2 /comm == "xpe2e-workload"/ { @opens[str(arg1)] = count(); }
kprobe:__x64_sys_getppid /comm == "xpe2e-workload"/ { @getppid = count(); @stacks[kstack(4)] = count(); }'
echo "XPE2E-INFO: xenprobe -d $N -f json --channel vmevent -e '$PROG'"
xenprobe_start "$domid" "$OUT" "$ERR" -d $N -f json --channel vmevent --duration 300 -e "$PROG"
echo "XPE2E-INFO: attached: $(grep '"attached_probes"' "$OUT")"
xenprobe_workload "$domid" "$OUT" "$ERR"
opens=$(grep '"@opens"' "$OUT" | grep -o '"/tmp/xpe2e-target":[0-9]*' | cut -d: -f2)
calls=$(grep '"@getppid"' "$OUT" | grep -o '"@getppid":[0-9]*' | cut -d: -f2)
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
[ "$nstacks" = "$GETPPID" ] || result FAIL "@stacks counts $nstacks getppid calls, the workload made $GETPPID: $stacks"
[ "$nkeys" -ge 1 ] && [ "$nsys" = "$nkeys" ] || result FAIL "not every getppid stack shows do_syscall_64 ($nsys of $nkeys): $stacks"
[ "$un" = none ] || result FAIL "the guest's end of the run: '$un' (expected 'none': no module)"
result PASS "xenprobe on vm_event with nothing in the guest: @opens[\"/tmp/xpe2e-target\"] = $opens, @getppid = $calls (comm-filtered), exactly the workload's, in $nkeys kernel stack(s) through do_syscall_64, symbols, BTF and ORC from its memory; the guest clean"
