#!/bin/sh
# The e2e harness's waits (tools/e2e/scenarios/lib.sh) on this host, with xl and the clock
# stubbed: every wait ends within its bound in wall time however slow a round of its loop is,
# and domu_start tells a guest that came up, one still in its own boot, and one that died.
# Run by ctest (E2eHarness.Waits); needs no Xen.
set -u
LIB=${1:?usage: harness_waits_test.sh <tools/e2e/scenarios/lib.sh>}
T=$(mktemp -d)
S=harness-test-$$
# lib.sh's own files: domu_start writes /tmp/<name>.cfg and .create.log, result notes /tmp/$S.*.
trap 'rm -rf "$T" /tmp/xpe2e-t.cfg /tmp/xpe2e-t.create.log "/tmp/$S.notes" "/tmp/$S.domus"' EXIT
mkdir -p "$T/bin" "$T/console"
fails=0
check() { # <name> <condition...>
  _n=$1
  shift
  if "$@"; then echo "ok   $_n"; else echo "FAIL $_n"; fails=$((fails + 1)); fi
}
# xl: the DomU's state comes from $T/state ("r-----" running, "--c---" crashed), creation
# always succeeds and is counted.
cat >"$T/bin/xl" <<STUB
#!/bin/sh
case "\$1" in
  -vvv) echo x >>"$T/creates"; exit 0 ;;
  domid) echo 7 ;;
  list) echo "Name ID Mem VCPUs State Time(s)"; echo "xpe2e-t 7 256 2 \$(cat "$T/state") 1.0" ;;
  info) echo "virt_caps : pv hvm shadow" ;;
esac
exit 0
STUB
printf '#!/bin/sh\nexit 0\n' >"$T/bin/xenstore-read"
chmod +x "$T/bin/xl" "$T/bin/xenstore-read"
PATH=$T/bin:$PATH
# shellcheck disable=SC2034 # read by lib.sh's console_log
XPE2E_CONSOLE_DIR=$T/console
# shellcheck disable=SC1090
. "$LIB"
# shellcheck disable=SC2034 # read by lib.sh's domu_start (the DomU's ramdisk in its config)
E2E=$T
# The clock runs 100 times fast (a wait's bound of 120 s is 1.2 s here), and each round of a
# polling loop sleeps half a real second: 600 rounds would be 300 s, 240 s of rounds 120 s.
uptime_s() { echo $(($(date +%s%N) / 10000000)); }
sleep() { command sleep 0.5; }
domu_diag() { echo "$* (no_sysrq=${DIAG_NO_SYSRQ:-})" >>"$T/diag"; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
log=$T/console/guest-xpe2e-t.log

# wait_console: a line that comes is found; one that never comes ends the wait at its bound.
: >"$log"
(command sleep 0.3 && echo "XPE2E-WORKLOAD: waiting" >>"$log") &
t0=$(date +%s%N)
wait_console xpe2e-t "XPE2E-WORKLOAD: waiting" 240
rc=$?
check "wait_console finds the line (rc $rc)" [ $rc -eq 0 ]
t0=$(date +%s%N)
wait_console xpe2e-t "never" 240
rc=$? el=$(ms_since "$t0")
check "wait_console gives up (rc $rc)" [ $rc -eq 1 ]
check "wait_console's 240 s are 2.4 s of this clock, rounds of 0.5 s or not (took $el ms)" [ "$el" -lt 4000 ]
wait_console xpe2e-t "XPE2E-WORKLOAD" 1
check "wait_console finds a line already there with a bound shorter than a round" [ $? -eq 0 ]

# xs_wait: the key's value when it exists; the bound in wall time when it does not.
printf '#!/bin/sh\necho done-value\n' >"$T/bin/xenstore-read"
check "xs_wait prints the value" [ "$(xs_wait /some/key 240)" = done-value ]
printf '#!/bin/sh\nexit 1\n' >"$T/bin/xenstore-read"
t0=$(date +%s%N)
xs_wait /some/key 240 >/dev/null
rc=$? el=$(ms_since "$t0")
check "xs_wait gives up at its bound (rc $rc, $el ms)" [ $rc -eq 1 ] && [ "$el" -lt 4000 ]

# domu_start, a guest whose init says it is up: its domid, no note, no diagnostics.
rm -f "$T/creates" "$T/diag" "/tmp/$S.notes" "/tmp/$S.domus"
echo "r-----" >"$T/state"
(command sleep 0.3 && echo "XPE2E-DOMU: up" >>"$log") &
id=$(domu_start xpe2e-t "x" 2>"$T/err")
check "domu_start: up -> its domid ($id)" [ "$id" = 7 ]
check "domu_start: up -> one creation" [ "$(wc -l <"$T/creates")" -eq 1 ]
check "domu_start: up -> no note" [ ! -s "/tmp/$S.notes" ]
check "domu_start: up -> no diagnostics" [ ! -e "$T/diag" ]

# A guest still in its own boot at 120 s (1.2 s here, rounds of 0.5 s): its domid, its vCPUs'
# state (domu_diag) and a note for the result line, within the bound.
rm -f "$T/creates" "$T/diag" "/tmp/$S.notes"
t0=$(date +%s%N)
id=$(domu_start xpe2e-t "x" 2>"$T/err")
el=$(ms_since "$t0")
check "domu_start: still booting -> its domid ($id)" [ "$id" = 7 ]
check "domu_start: still booting -> within its bound ($el ms)" [ "$el" -lt 4000 ]
check "domu_start: still booting -> diagnostics" grep -q "not up 120 s after its creation (try 1)" "$T/diag"
check "domu_start: still booting -> no sysrq into a guest that goes on" grep -q "(no_sysrq=1)" "$T/diag"
check "domu_start: still booting -> a note" grep -q "not up 120 s" "/tmp/$S.notes"

# A guest that died in its own boot each time: three creations, then failure.
rm -f "$T/creates" "$T/diag" "/tmp/$S.notes"
echo "--c---" >"$T/state"
domu_start xpe2e-t "x" >/dev/null 2>"$T/err"
rc=$?
check "domu_start: died -> failure (rc $rc)" [ $rc -eq 1 ]
check "domu_start: died -> three creations" [ "$(wc -l <"$T/creates")" -eq 3 ]
check "domu_start: died -> noted per try" [ "$(grep -c "died in its own boot" "/tmp/$S.notes")" -eq 3 ]
echo "$fails failed"
[ "$fails" -eq 0 ]
