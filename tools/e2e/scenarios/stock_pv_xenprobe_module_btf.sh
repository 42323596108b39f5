# Scenario: a loaded module's types read from a real guest's memory by xenprobe (issue 15,
# "module BTF, read with libbpf's BTF API; field access by name with clear errors"), with no
# file copied to Dom0. The guest loads Debian's own loop.ko (xpe2e.victim=1, as
# stock_pv_module_gone); its split BTF is in the guest's memory (CONFIG_DEBUG_INFO_BTF_MODULES):
# once loop's init ran the kernel has set its struct module's btf_data to NULL, and the BTF is on
# the kernel's btf_modules list only, where Dom0 reads it. Three runs of xenprobe against it:
# 1. a program that casts to loop's own struct loop_device (through the gendisk that
#    lo_release gets: its private_data) attaches: the type was found in loop's BTF on top of the
#    kernel's, and the cast and field access checked against it;
# 2. the same with a field loop_device does not have fails before attaching, naming the field
#    and listing struct loop_device's real fields (lo_number is its first in 6.1 and 6.12);
# 3. a struct of a module the guest has not loaded (xfs) fails before attaching, naming the
#    modules whose BTF was read (loop among them) and saying when modules' types are read; run
#    with XENPROBES_LOG=debug, its log says loop's BTF came from the btf_modules list (the
#    real-kernel path: btf_data is NULL by then).
# No hit is needed (nothing in the guest uses a loop device): runs 2 and 3 show what was read,
# run 1 that it checks and attaches. The guest module must leave no trap byte behind and the
# guest must stay clean.
S=${XPE2E_SCENARIO:-stock_pv_xenprobe_module_btf}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-modbtf
domid=$(domu_start $N "xpe2e.victim=1") || result FAIL "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
v=$(xs_wait "/local/domain/$domid/data/xpe2e/victim" 240) || { dump_console $N; result FAIL "the DomU did not load loop.ko within 240 s"; }
[ "$v" = loaded ] || { dump_console $N; result FAIL "loop.ko: $v"; }
OUT=/tmp/$S.json
ERR=/tmp/$S.err
# 1. loop's own struct through lo_release's gendisk (its first argument in 6.1 and 6.12).
PROG='kprobe:loop:lo_release { @[((struct loop_device *)((struct gendisk *)arg0)->private_data)->lo_number] = count(); }'
echo "XPE2E-INFO: xenprobe -d $N -f json --duration 5 -e '$PROG'"
timeout 300 /usr/bin/xenprobe -d $N -f json --duration 5 -e "$PROG" >"$OUT" 2>"$ERR"
rc1=$?
sed 's/^/XPE2E-INFO: xenprobe 1: /' "$ERR"
sed 's/^/XPE2E-INFO: xenprobe 1 out: /' "$OUT"
att=$(grep '"attached_probes"' "$OUT")
# 2. a field struct loop_device does not have.
PROG2='kprobe:loop:lo_release { @ = ((struct loop_device *)((struct gendisk *)arg0)->private_data)->lo_no_such_field; }'
timeout 300 /usr/bin/xenprobe -d $N -e "$PROG2" >/tmp/$S.2.out 2>/tmp/$S.2.err
rc2=$?
sed 's/^/XPE2E-INFO: xenprobe 2: /' /tmp/$S.2.err
# 3. a struct of a module the guest has not loaded.
PROG3='kprobe:loop:lo_release { @ = ((struct xfs_inode *)arg0)->i_ino; }'
XENPROBES_LOG=debug timeout 300 /usr/bin/xenprobe -d $N -e "$PROG3" >/tmp/$S.3.out 2>/tmp/$S.3.log
rc3=$?
grep -av '^xenprobes debug: ' /tmp/$S.3.log >/tmp/$S.3.err
sed 's/^/XPE2E-INFO: xenprobe 3: /' /tmp/$S.3.err
grep -a 'btf_modules' /tmp/$S.3.log | head -n 5 | sed 's/^/XPE2E-INFO: xenprobe 3 log: /'
from_list=$(grep -ac "its BTF ([0-9]* bytes) from the kernel's btf_modules list" /tmp/$S.3.log)
from_data=$(grep -ac "its BTF ([0-9]* bytes) from its struct module's btf_data" /tmp/$S.3.log)
echo "XPE2E-INFO: modules whose BTF came from btf_modules: $from_list, from btf_data: $from_data"
victim_unload_then_module $N "$domid"
[ $rc1 -eq 0 ] || result FAIL "xenprobe with struct loop_device exited $rc1: $(tail -n 3 "$ERR" | tr '\n' ' ')"
case "$att" in *'"probes": 1'*) ;; *) result FAIL "xenprobe with struct loop_device: no attached_probes record for its one probe: '$att'" ;; esac
[ $rc2 -eq 1 ] || result FAIL "a field loop_device lacks: xenprobe exited $rc2, not 1"
grep -q "error: struct loop_device has no field 'lo_no_such_field'" /tmp/$S.2.err || result FAIL "a field loop_device lacks: $(head -n 1 /tmp/$S.2.err)"
grep -q '^its fields: lo_number, ' /tmp/$S.2.err || result FAIL "struct loop_device's fields as read from the guest: $(tail -n 1 /tmp/$S.2.err)"
[ -s /tmp/$S.2.out ] && result FAIL "a field loop_device lacks: xenprobe printed $(head -c 200 /tmp/$S.2.out)"
[ $rc3 -eq 1 ] || result FAIL "a type of a module not loaded: xenprobe exited $rc3, not 1"
grep -q "error: no struct xfs_inode in the BTF of $N's kernel (read from its memory), with the BTF of loaded module(s) .*loop" /tmp/$S.3.err ||
  result FAIL "a type of a module not loaded: $(head -n 1 /tmp/$S.3.err)"
grep -q "a module's types are read with the kernel's when xenprobe starts" /tmp/$S.3.err || result FAIL "a type of a module not loaded: no word of when modules' types are read: $(tail -n 2 /tmp/$S.3.err | tr '\n' ' ')"
grep -aq "guest module loop: its BTF ([0-9]* bytes) from the kernel's btf_modules list" /tmp/$S.3.log ||
  result FAIL "loop's BTF did not come from the kernel's btf_modules list: $(grep -a 'loop' /tmp/$S.3.log | head -n 3 | tr '\n' ' ')"
[ "$un" = ok ] || result FAIL "detach + rmmod of the guest module: '$un'"
det=$(echo "$log" | grep -a "xenprobes: detached: restored" | head -n 1)
echo "XPE2E-INFO: DomU $N: ${det#*] }"
case "$det" in *"restored 0 trap bytes"*) ;; *) result FAIL "xenprobe left trap bytes for the module's detach: ${det#*] }" ;; esac
result PASS "loop.ko's BTF read from the guest's memory through the kernel's btf_modules list ($from_list modules' BTF from it, $from_data from btf_data): a cast to its struct loop_device checked and attached, a missing field named with loop_device's real fields ($(grep '^its fields:' /tmp/$S.2.err | cut -c1-60)...), a module not loaded named with the modules read; nothing left behind"
