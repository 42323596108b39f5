# Scenario: Debian's stock hypervisor, a PV DomU with the xenprobesU module, the guest channel:
# the tail-call proof from the guest's own kernel image (issue 14, docs/probes.md "Tail calls
# proven from the kernel image"). Dom0 gives the session the ELF inside the DomU's vmlinuz (the
# Dom0's /boot/vmlinuz-$KVER, which every DomU boots: run.sh stages it, SCEN_VMLINUX) with no
# symbol table: it goes with the guest's own kallsyms, which the session reads from its memory.
# xpe2e-probe jump-image: dentry_unlink_inode, whose only indirect jump is a tail call, is
# refused as a jump without the image (Jump refused, Fastest a trap probe, both saying the image
# would prove it), and with it is a jump (Fastest, nothing said against it), written, hit at
# least once per successful unlink of the workload, the workload's results unchanged, the text
# byte-identical after unregistering; the module unloads.
S=${XPE2E_SCENARIO:-stock_pv_jump_image}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-image
img=/tmp/vmlinux-$KVER
[ -f "$E2E/vmlinux-$KVER.gz" ] || result FAIL "no $E2E/vmlinux-$KVER.gz (run.sh stages it for the scenarios in SCEN_VMLINUX)"
gzip -dc "$E2E/vmlinux-$KVER.gz" >"$img" || result FAIL "cannot unpack $E2E/vmlinux-$KVER.gz"
echo "XPE2E-INFO: the DomUs' kernel image: $img, $(wc -c <"$img") bytes (the ELF inside /boot/vmlinuz-$KVER)"
# The workload waits for its go while the kernel is read twice (xpe2e.wait: up to 900 s).
domid=$(domu_start $N "xpe2e.modparams=timeout_ms=2000 xpe2e.work=200:20:10 xpe2e.wait=900") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
if ! wait_console $N "XPE2E-WORKLOAD: waiting" 180; then
  dump_console $N
  result FAIL "the DomU workload did not start within 180 s"
fi
# The kernel read whole twice (the jump index without the image and with it, the image's
# code addresses): minutes under TCG.
timeout 720 "$PROBE" jump-image --domid "$domid" --image "$img" --timeout 240 $PROBE_EXTRA
rc=$?
rm -f "$img"
domu_release "$domid"
domu_verdict $N "$domid"
[ $rc -eq 0 ] || result FAIL "xpe2e-probe jump-image failed (exit $rc; its XPE2E-CHECK lines above)"
result PASS "all checks passed"
