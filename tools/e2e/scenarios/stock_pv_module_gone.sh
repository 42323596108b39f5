# Scenario: a probe in a loaded module of the guest (Debian's loop.ko), the probing process
# killed (SIGKILL) with it armed, then the module unloaded by the guest. The guest module's own
# restore (here at its detach) must leave that trap byte alone: the module's text is freed, and
# another module loaded there could hold 0xcc at that address by itself (protocol.h "Modules
# that go"). What it shows on a real kernel: Dom0's identity of the module (its name and text
# base, read through the guest's BTF from its module list) equals the guest module's (from
# struct module in its notifier): the notifier says the module "went while probed", and the
# restore leaves exactly that one trap byte alone. The guest's kernel must stay clean.
S=${XPE2E_SCENARIO:-stock_pv_module_gone}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-modgone
domid=$(domu_start $N "xpe2e.victim=1") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
v=$(xs_wait "/local/domain/$domid/data/xpe2e/victim" 240) || { dump_console $N; result FAIL "the DomU did not load loop.ko within 240 s"; }
[ "$v" = loaded ] || { dump_console $N; result FAIL "loop.ko: $v"; }
# A function of loop, read from the guest's module list (its core_kallsyms).
lst=$(timeout 120 /usr/bin/xenprobe list -d $N 'loop:lo_*' 2>&1)
echo "XPE2E-INFO: xenprobe list -d $N 'loop:lo_*': $(echo "$lst" | wc -l) lines: $(echo "$lst" | head -n 4 | tr '\n' ' ')"
fn=lo_release
echo "$lst" | grep -q "^kprobe:$fn \[loop\]$" || fn=$(echo "$lst" | sed -n 's/^kprobe:\(lo_[a-z0-9_]*\) \[loop\]$/\1/p' | head -n 1)
[ -n "$fn" ] || { domu_release "$domid"; result FAIL "xenprobe list shows no lo_* function of [loop]: $(echo "$lst" | tail -n 2 | tr '\n' ' ')"; }
OUT=/tmp/$S.json
ERR=/tmp/$S.err
PROG="kprobe:loop:$fn { @[func] = count(); }"
echo "XPE2E-INFO: xenprobe -d $N -f json --channel guest -e '$PROG'"
xenprobe_start "$domid" "$OUT" "$ERR" -d $N -f json --channel guest --duration 300 -e "$PROG"
echo "XPE2E-INFO: attached: $(grep '"attached_probes"' "$OUT")"
# SIGKILL: nothing restored by the process; the guest channel has no guardian.
kill -KILL $xp
wait $xp
echo "XPE2E-INFO: xenprobe killed (exit $?)"
victim_unload_then_module $N "$domid"
went=$(echo "$log" | grep -a "xenprobes: module loop went while probed" | head -n 1)
left=$(echo "$log" | grep -a "trap bytes or jump regions were in modules unloaded since Dom0 probed them: left alone" | head -n 1)
det=$(echo "$log" | grep -a "xenprobes: detached: restored" | head -n 1)
echo "XPE2E-INFO: DomU $N: ${went#*] }"
echo "XPE2E-INFO: DomU $N: ${left#*] }"
echo "XPE2E-INFO: DomU $N: ${det#*] }"
[ "$un" = ok ] || result FAIL "detach + rmmod of the guest module: '$un'"
[ -n "$went" ] || result FAIL "the guest module's notifier did not name loop as probed: Dom0's and the module's identities of it differ"
case "$left" in
  *": 1 trap bytes or jump regions were in modules unloaded"*) ;;
  *) result FAIL "the restore did not leave exactly loop's one trap byte alone: '${left#*] }'" ;;
esac
result PASS "a trap in loop.ko ($fn) armed by a killed xenprobe: the module's notifier knew loop when it went, its restore left that byte alone, the guest stayed clean"
