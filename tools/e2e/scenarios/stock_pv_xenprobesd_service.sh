# Scenario: xenprobesd as the systemd service it ships as (packaging/systemd/xenprobesd.service,
# installed unchanged but for the daemon's path by `cmake --install`), on a real Dom0 whose PID
# 1 is systemd (run.sh SCEN_SYSTEMD; dom0-init execs systemd once the toolstack is up). The
# unit's least privilege must still reach Xen: `systemctl start` returns once the daemon said
# READY=1 (Type=notify); its process has no capability but CAP_IPC_LOCK and no new privileges,
# and reaches Xen through the /dev/xen nodes the unit's closed device policy allows. It must then attach to a guest created
# after it, count the workload exactly, take `systemctl reload` (keeping the program and its
# counters), survive `xl destroy` of the guest, and stop with a clean result.
S=${XPE2E_SCENARIO:-stock_pv_xenprobesd_service}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
N=xpe2e-s1
GETPPID=300
LOG=/var/log/xenprobesd/events.ndjson   # LogsDirectory=xenprobesd: writable under ProtectSystem=strict
SOCK=/run/xenprobesd/control.sock        # RuntimeDirectory=xenprobesd
UNIT=xenprobesd.service
[ "$(cat /proc/1/comm)" = systemd ] || result FAIL "PID 1 is $(cat /proc/1/comm), not systemd (run.sh SCEN_SYSTEMD)"
[ -f /usr/lib/systemd/system/$UNIT ] || result FAIL "no /usr/lib/systemd/system/$UNIT in the payload (cmake --install)"
mkdir -p /etc/xenprobesd
cat >/etc/xenprobesd/xenprobesd.toml <<EOF
[daemon]
event_log = "$LOG"
metrics_listen = "127.0.0.1:9477"
control_socket = "$SOCK"

[[program]]
name = "getppid"
domains = [{ glob = "xpe2e-s*" }]
source = 'kprobe:__x64_sys_getppid { @calls = count(); }'
EOF
show() { systemctl show "$UNIT" -p "$1" --value 2>/dev/null; }
journal() { journalctl -u "$UNIT" --no-pager -o cat 2>&1 | tail -n 30 | sed 's/^/XPE2E-INFO: journal: /'; }
fail() {
  systemctl status "$UNIT" --no-pager 2>&1 | sed 's/^/XPE2E-INFO: status: /'
  journal
  sed 's/^/XPE2E-INFO: event log: /' "$LOG" 2>/dev/null | cut -c1-300 | tail -n 20
  systemctl stop "$UNIT" 2>/dev/null
  [ -n "${domid:-}" ] && domu_release "$domid"
  result FAIL "$*"
}
# hits: the getppid program's hit count for $N, from `xenprobesd status` over the unit's socket.
hits() { /usr/sbin/xenprobesd status --socket "$SOCK" 2>&1 | sed -n "s/^  $N ([0-9]*, [a-z]*): [0-9]* probes, \([0-9]*\) hits.*/\1/p"; }

echo "XPE2E-INFO: $(systemctl --version | head -n 1); unit $(systemctl show "$UNIT" -p FragmentPath --value)"
t0=$(cut -d' ' -f1 /proc/uptime)
timeout 120 systemctl start "$UNIT" || fail "systemctl start $UNIT failed (exit $?)"
echo "XPE2E-INFO: systemctl start returned after $(echo "$(cut -d' ' -f1 /proc/uptime) $t0" | awk '{printf "%.1f", $1 - $2}') s"
[ "$(show ActiveState)/$(show SubState)" = active/running ] || fail "after systemctl start: $(show ActiveState)/$(show SubState), not active/running"
pid=$(show MainPID)
[ "${pid:-0}" -gt 0 ] || fail "no MainPID"
caps=$(awk '/^Cap(Eff|Prm|Bnd)/ {printf "%s %s ", $1, $2}' /proc/$pid/status)
nnp=$(awk '/^NoNewPrivs/ {print $2}' /proc/$pid/status)
echo "XPE2E-INFO: xenprobesd pid $pid: $caps NoNewPrivs $nnp; WatchdogUSec $(show WatchdogUSec); $(show StatusText)"
# CAP_IPC_LOCK is capability 14: 0x4000.
for c in CapEff CapPrm CapBnd; do
  case "$caps" in *"$c: 0000000000004000 "*) ;; *) fail "the daemon's $c is not CAP_IPC_LOCK alone: $caps" ;; esac
done
[ "$nnp" = 1 ] || fail "NoNewPrivs is '$nnp' for the daemon"
[ "$(show WatchdogUSec)" = 30s ] || fail "WatchdogUSec is '$(show WatchdogUSec)', the unit says 30s"
grep -q '"kind":"started"' "$LOG" 2>/dev/null || fail "no started record in $LOG"

domid=$(domu_start $N "xpe2e.work=$GETPPID:10:2") || fail "xl create failed"
echo "XPE2E-INFO: DomU $N is domain $domid"
wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; fail "the workload did not start within 180 s"; }
i=0
while [ $i -lt 240 ] && ! grep -q "\"kind\":\"attached\".*\"domain\":\"$N\"" "$LOG"; do sleep 0.5; i=$((i + 1)); done
grep -q "\"kind\":\"attached\".*\"domain\":\"$N\"" "$LOG" || fail "the service did not attach to $N within 120 s of its workload's start"
grep "\"kind\":\"attached\".*\"domain\":\"$N\"" "$LOG" | cut -c1-300 | sed 's/^/XPE2E-INFO: /'
h0=$(hits)
xenstore-write "/local/domain/$domid/data/xpe2e/go" 1
done=$(xs_wait "/local/domain/$domid/data/xpe2e/done" 240) || fail "the workload did not finish within 240 s"
echo "XPE2E-INFO: workload: $done"
h1=$(hits)
case "$done" in *"getppid=$GETPPID "*"ok=1"*) ;; *) fail "the workload's own report: $done" ;; esac
[ -n "$h0" ] && [ -n "$h1" ] || fail "no hit count for $N in xenprobesd status (before: '$h0', after: '$h1')"
n=$((h1 - h0))
[ $n -eq $GETPPID ] || fail "the service counted $n getppid hits during the workload (status before $h0, after $h1), the workload made $GETPPID"
# systemctl reload: ExecReload sends SIGHUP; an unchanged program keeps its probes and counts.
timeout 60 systemctl reload "$UNIT" || fail "systemctl reload failed"
i=0
while [ $i -lt 60 ] && ! grep -q '"kind":"config_loaded"' "$LOG"; do sleep 0.5; i=$((i + 1)); done
grep '"kind":"config_loaded"' "$LOG" | grep -q '"kept":\["getppid"\]' || fail "no config_loaded record keeping getppid after systemctl reload"
h2=$(hits)
[ "$h2" = "$h1" ] || fail "the hit count changed across the reload: $h1 before, '$h2' after"
timeout 60 xl destroy "$N" >/dev/null 2>&1 || fail "xl destroy $N failed"
i=0
while [ $i -lt 120 ] && ! grep -q "\"kind\":\"detached\".*\"domain\":\"$N\"" "$LOG"; do sleep 0.5; i=$((i + 1)); done
grep -q "\"kind\":\"detached\".*\"domain\":\"$N\"" "$LOG" || fail "no detached record for $N within 60 s of xl destroy"
[ "$(show ActiveState)" = active ] || fail "the service is $(show ActiveState) after xl destroy of its guest"
[ "$(show NRestarts)" = 0 ] || fail "the service restarted $(show NRestarts) times"
timeout 60 systemctl stop "$UNIT" || fail "systemctl stop failed"
res="$(show Result) $(show ExecMainStatus)"
echo "XPE2E-INFO: after systemctl stop: Result ExecMainStatus = $res"
journal
[ "$res" = "success 0" ] || fail "systemctl stop: Result ExecMainStatus = $res, not 'success 0'"
grep -q '"kind":"stopped"' "$LOG" || fail "no stopped record in the event log"
domu_kernel_clean $N
result PASS "xenprobesd as its systemd unit (Type=notify, watchdog 30s, CAP_IPC_LOCK alone, NoNewPrivs) on a real Dom0: attached to $N created after it, counted $n getppid calls = the workload's, kept them across systemctl reload, detached at xl destroy, stopped with Result=success"
