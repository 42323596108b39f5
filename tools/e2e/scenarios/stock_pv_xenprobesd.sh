# Scenario: the xenprobesd daemon (issue 16) on a real Xen. It starts in Dom0 before any guest
# exists, with a program selecting the guests named xpe2e-d*. Then `xl create` makes one: the
# daemon notices it (@introduceDomain), reads its kernel's symbols out of its memory, and keeps
# trying (its retry backoff) until the guest has booted and loaded the guest module; the
# attachment must then count the workload's getppid() calls exactly (the hits between the go and
# the workload's done, from `xenprobesd status` over its control socket). A second program
# filters by comm, which needs the guest kernel's types: the daemon checks it with the guest's
# BTF read from its memory, and its map (from the Prometheus endpoint) must hold exactly the
# workload's calls. The attachments must survive `xl destroy`
# of the guest with a `detached` record, and the daemon must go on and stop cleanly.
S=${XPE2E_SCENARIO:-stock_pv_xenprobesd}  # trixie_* runs this body under its own name (run.sh SCEN_BODY)
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-d1
GETPPID=500
LOG=/tmp/$S.ndjson
SOCK=/tmp/$S.sock
cat >/tmp/$S.toml <<EOF
[daemon]
event_log = "$LOG"
metrics_listen = "127.0.0.1:9477"
control_socket = "$SOCK"

[[program]]
name = "getppid"
domains = [{ glob = "xpe2e-d*" }]
source = 'kprobe:__x64_sys_getppid { @calls = count(); }'

[[program]]
name = "by-comm"
domains = [{ glob = "xpe2e-d*" }]
source = 'kprobe:__x64_sys_getppid /comm == "xpe2e-workload"/ { @calls = count(); }'
EOF
# The metrics endpoint listens on 127.0.0.1: Dom0's minimal init leaves the loopback down.
busybox ip link set lo up 2>/dev/null || busybox ifconfig lo up
/usr/sbin/xenprobesd -c /tmp/$S.toml 2>/tmp/$S.err &
xpd=$!
# hits: the getppid program's hit count for $N (its attachment's line in xenprobesd status)
hits() { /usr/sbin/xenprobesd status --socket "$SOCK" 2>&1 | sed -n '/^program getppid /,/^program /p' | sed -n "s/^  $N ([0-9]*, [a-z]*): [0-9]* probes, \([0-9]*\) hits.*/\1/p"; }
# bycomm: the by-comm program's @calls for $N, from the metrics endpoint
bycomm() { busybox wget -q -O - http://127.0.0.1:9477/metrics 2>/dev/null | sed -n "s/^xenprobesd_map_value{domain=\"$N\",program=\"by-comm\",map=\"@calls\",key=\"\"} \([0-9]*\)\$/\1/p"; }
stop_daemon() {
  kill -TERM $xpd 2>/dev/null
  wait $xpd
  drc=$?
  sed 's/^/XPE2E-INFO: xenprobesd: /' /tmp/$S.err
  sed 's/^/XPE2E-INFO: event log: /' "$LOG" 2>/dev/null | cut -c1-400
}
i=0
while [ $i -lt 60 ] && ! grep -q '"kind":"started"' "$LOG" 2>/dev/null; do sleep 0.5; i=$((i + 1)); done
grep -q '"kind":"started"' "$LOG" 2>/dev/null || { stop_daemon; result FAIL "xenprobesd did not start: $(tail -n 1 /tmp/$S.err)"; }
echo "XPE2E-INFO: xenprobesd started before any guest: $(/usr/sbin/xenprobesd status --socket "$SOCK" 2>&1 | tr '\n' ' ')"
domid=$(domu_start $N "xpe2e.work=$GETPPID:10:2") || { stop_daemon; result FAIL "xl create failed"; }
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; stop_daemon; result FAIL "the workload did not start within 180 s"; }
# The daemon attaches once the guest module is ready (retried: 2 s, then doubling).
i=0
while [ $i -lt 240 ] && [ "$(grep -c "\"kind\":\"attached\".*\"domain\":\"$N\"" "$LOG")" -lt 2 ]; do sleep 0.5; i=$((i + 1)); done
att=$(grep "\"kind\":\"attached\".*\"domain\":\"$N\"" "$LOG" | grep -c '"program":"getppid"\|"program":"by-comm"')
if [ "$att" -lt 2 ]; then
  echo "XPE2E-INFO: status: $(/usr/sbin/xenprobesd status --socket "$SOCK" 2>&1 | tr '\n' ' ')"
  stop_daemon
  domu_release "$domid"
  result FAIL "xenprobesd did not attach both programs to $N within 120 s of its workload's start"
fi
grep "\"kind\":\"attached\".*\"domain\":\"$N\"" "$LOG" | cut -c1-300 | sed 's/^/XPE2E-INFO: /'
failed=$(grep -c '"kind":"attach_failed"' "$LOG")
echo "XPE2E-INFO: attach_failed records before the attachment: $failed (one per reason while the guest booted)"
h0=$(hits)
xenstore-write "/local/domain/$domid/data/xpe2e/go" 1
done=$(xs_wait "/local/domain/$domid/data/xpe2e/done" 240) || { stop_daemon; domu_release "$domid"; result FAIL "the workload did not finish within 240 s"; }
echo "XPE2E-INFO: workload: $done"
h1=$(hits)
c1=$(bycomm)
busybox wget -q -O - http://127.0.0.1:9477/metrics 2>&1 | grep -E "^wget|^xenprobesd_(map_value|guest_read_errors_total|probe_hits_total)" | sed "s/^/XPE2E-INFO: metrics: /"
echo "XPE2E-INFO: status: $(/usr/sbin/xenprobesd status --socket "$SOCK" 2>&1 | tr '\n' ' ')"
case "$done" in *"getppid=$GETPPID "*"ok=1"*) ;; *) stop_daemon; domu_release "$domid"; result FAIL "the workload's own report: $done" ;; esac
[ -n "$h0" ] && [ -n "$h1" ] || { stop_daemon; domu_release "$domid"; result FAIL "no hit count for $N in xenprobesd status (before: '$h0', after: '$h1')"; }
n=$((h1 - h0))
# The guest is destroyed with the daemon attached: the attachment must go, the daemon stay.
timeout 60 xl destroy "$N" >/dev/null 2>&1 || { stop_daemon; result FAIL "xl destroy $N failed"; }
i=0
while [ $i -lt 120 ] && ! grep -q "\"kind\":\"detached\".*\"domain\":\"$N\"" "$LOG"; do sleep 0.5; i=$((i + 1)); done
det=$(grep "\"kind\":\"detached\".*\"domain\":\"$N\"" "$LOG" | head -n 1)
alive=1
kill -0 $xpd 2>/dev/null || alive=0
st=$(/usr/sbin/xenprobesd status --socket "$SOCK" 2>&1 | tr '\n' ' ')
stop_daemon
echo "XPE2E-INFO: $(echo "$det" | cut -c1-300)"
[ "$c1" = "$GETPPID" ] || result FAIL "the by-comm program's @calls = '$c1' (comm == \"xpe2e-workload\" through the guest's BTF), the workload made $GETPPID calls"
[ $n -eq $GETPPID ] || result FAIL "xenprobesd counted $n getppid hits during the workload (status before $h0, after $h1), the workload made $GETPPID"
[ -n "$det" ] || result FAIL "no detached record for $N within 60 s of xl destroy"
[ $alive -eq 1 ] || result FAIL "xenprobesd died with the guest"
case "$st" in *"no domain selected"*) ;; *) result FAIL "after the destroy, status still shows $N: $st" ;; esac
[ $drc -eq 0 ] || result FAIL "xenprobesd exited $drc after SIGTERM"
domu_kernel_clean $N
grep -q '"kind":"stopped"' "$LOG" || result FAIL "no stopped record in the event log"
result PASS "xenprobesd started before the guest, attached after its module came up ($failed attach_failed record(s) while it booted), counted $n getppid calls = the workload's (and $c1 by comm, through the guest's own BTF), detached at xl destroy, stopped cleanly"
