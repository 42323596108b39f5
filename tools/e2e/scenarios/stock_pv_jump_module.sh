# Scenario: jump probes in a loaded module's text (docs/probes.md "Jump probes in a module's
# text"). The PV DomU loads Debian's loop.ko after the xenprobesU module (xpe2e.victim=2);
# xpe2e-probe jump-module puts a jump probe, then an async probe, on loop's lo_ioctl, each
# counting one round of the DomU's 40 LOOP_GET_STATUS64 ioctls exactly, the module's text
# byte-identical after each; then a jump probe there again, its jump written, and the guest
# unloads loop.ko while it is: the guest module's notifier names loop as probed when it goes,
# unregistering writes nothing where its text was (the library says "nothing written"), the
# guest module unloads and the guest's kernel stays clean.
S=${XPE2E_SCENARIO:-stock_pv_jump_module}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-jumpmod
domid=$(domu_start $N "xpe2e.victim=2 xpe2e.modparams=timeout_ms=2000") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
v=$(xs_wait "/local/domain/$domid/data/xpe2e/victim" 240) || { dump_console $N; result FAIL "the DomU did not load loop.ko within 240 s"; }
[ "$v" = loaded ] || { dump_console $N; result FAIL "loop.ko: $v"; }
OUT=/tmp/$S.out
timeout 600 "$PROBE" jump-module --domid "$domid" --timeout 240 $PROBE_EXTRA >"$OUT" 2>&1
rc=$?
cat "$OUT"
domu_release "$domid"
wait_console $N "XPE2E-DOMU: idle" 90
dump_console $N
domain_alive "$domid" || result FAIL "DomU $N is not running any more (xl list: $(xl list "$domid" 2>&1 | tail -n 1))"
log=$(tr -d '\r' <"$(console_log "$N")")
bad=$(echo "$log" | grep -a "XPE2E-DOMU: exercise .* failures=[1-9]" | head -n 1)
[ -z "$bad" ] || result FAIL "DomU $N: processes failed: ${bad#*XPE2E-DOMU: }"
bad=$(echo "$log" | grep -a "XPE2E-DOMU: dmesg-bad" | head -n 1)
[ -z "$bad" ] || result FAIL "DomU $N: ${bad#*dmesg-bad: }"
domu_kernel_clean $N
[ $rc -eq 0 ] || result FAIL "xpe2e-probe jump-module failed (exit $rc; its XPE2E-CHECK lines above)"
echo "$log" | grep -aq "XPE2E-DOMU: victim loop unloaded" || result FAIL "the guest did not unload loop.ko"
went=$(echo "$log" | grep -a "xenprobes: module loop went while probed" | head -n 1)
echo "XPE2E-INFO: DomU $N: ${went#*] }"
[ -n "$went" ] || result FAIL "the guest module's notifier did not name loop as probed when it went: the jump region's entry carried no identity the guest module knows"
nothing=$(grep -a "no longer holds\|nothing written" "$OUT" | head -n 1)
echo "XPE2E-INFO: the library after rmmod: $nothing"
echo "$nothing" | grep -q "module loop was unloaded.*nothing written" ||
  result FAIL "the library did not say it wrote nothing into loop's freed text: '$nothing'"
result PASS "loop.ko's lo_ioctl as a jump (40 of 40 calls) and an async probe (40 of 40 records), its text byte-identical after each; rmmod loop with a jump written there: nothing written, the guest module knew loop went, the guest stayed clean"
