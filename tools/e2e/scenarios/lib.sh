# Helpers for the Dom0 side of a scenario (sourced by scenarios/*.sh, run by dom0-init).
E2E=/usr/lib/xenprobes-e2e
PROBE=$E2E/xpe2e-probe
KVER=$(uname -r)

# result PASS|FAIL|XFAIL <reason...>: the one line the host harness reads (run.sh passes only
# PASS, and FAIL for a scenario it lists in SCEN_XFAIL). What the scenario had to try again
# (domu_start's xl create) is appended in brackets, so that a pass after a retry says so.
result() {
  r=$1
  shift
  # Checks narrowed by hand (XPE2E_PROBE_EXTRA, e.g. --skip xrp to bisect) make a pass a SKIP,
  # which run.sh counts as a failure: not every check ran.
  if [ "$r" = PASS ] && [ -n "${PROBE_EXTRA:-}" ]; then
    r=SKIP
    set -- "$* (but XPE2E_PROBE_EXTRA='$PROBE_EXTRA' narrowed the checks)"
  fi
  # A failure keeps the console of every DomU the scenario created and has not printed yet.
  if [ "$r" = FAIL ] && [ -f "/tmp/$S.domus" ]; then
    for _d in $(sort -u "/tmp/$S.domus"); do
      grep -qx "$_d" "/tmp/$S.dumped" 2>/dev/null || dump_console "$_d"
    done
  fi
  notes=$([ -f "/tmp/$S.notes" ] && tr '\n' ' ' <"/tmp/$S.notes" | sed 's/ $//')
  echo "XPE2E-RESULT $S $r $*${notes:+ [$notes]}"
  exit 0
}

# uptime_s: Dom0's uptime in whole seconds. Every wait here is bounded in wall time: under TCG
# with a busy Dom0 one round of a polling loop (an `xl list`, a `grep`) can take seconds, so a
# bound in rounds is no bound (a 600-round wait once meant 120 s, and could mean 20 min).
uptime_s() { cut -d. -f1 /proc/uptime; }

# domain_booting <domid>: the domain exists and is neither shut down, crashed nor dying (xl
# list's state letters s, c, d).
domain_booting() {
  _st=$(xl list "$1" 2>/dev/null | awk 'NR == 2 { print $5 }')
  case "$_st" in "" | *s* | *c* | *d*) return 1 ;; esac
  return 0
}

# domu_start <name> <extra kernel args>: creates a PV DomU (DOMU_TYPE=pvh: a PVH one) running
# Dom0's kernel with the e2e initramfs; prints its domid once the guest's init said its first
# line (or after 120 s, its vCPUs' state then in the serial log: domu_diag).
domu_start() {
  CUR_DOMU=$1
  rm -f "$(console_log "$1")"  # a stale log of an earlier DomU of that name would fool wait_console
  echo "$1" >>"/tmp/$S.domus"  # (domu_start runs in a subshell: a file, not a variable)
  # PVH under TCG wants shadow paging (hap = 0: with nested paging QEMU's guest faults early,
  # docs/e2e.md). Debian 13's Xen 4.20 is built without it (virt_caps has no "shadow"): there
  # the guest gets the default, nested paging.
  _paging=""
  if [ "${DOMU_TYPE:-pv}" = pvh ]; then
    if xl info 2>/dev/null | grep -q '^virt_caps .*shadow'; then
      _paging='hap = 0'
    else
      echo "XPE2E-INFO: no shadow paging in this hypervisor (virt_caps: $(xl info 2>/dev/null | sed -n 's/^virt_caps *: //p')): PVH $1 with hap = 1" >&2
      _paging='hap = 1'
    fi
  fi
  cat >"/tmp/$1.cfg" <<EOF
name = "$1"
type = "${DOMU_TYPE:-pv}"
$([ "${DOMU_TYPE:-pv}" = pvh ] && printf '%s\ntsc_mode = "native"\n' "$_paging")
kernel = "/boot/vmlinuz-$KVER"
ramdisk = "$E2E/domu-initramfs.cpio.gz"
extra = "console=hvc0 rdinit=/init $2"
memory = 256
vcpus = 2
on_crash = "preserve"
on_reboot = "destroy"
EOF
  # xl create has failed under this setup for the toolstack's own reasons (a corrupted heap
  # under Xen's lazy FPU switching; a second DomU on a loaded host: docs/e2e.md "The
  # environment"): retry, and keep its verbose log as evidence.
  for try in 1 2 3; do
    # shellcheck disable=SC2086
    timeout 60 xl -vvv create ${XL_CREATE_FLAGS:-} "/tmp/$1.cfg" >"/tmp/$1.create.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      _id=$(xl domid "$1")
      # Its own boot, up to the init's first line, runs nothing of ours (the module loads
      # later): a guest that dies there (a triple fault in the early TSC calibration of a PVH
      # 6.12 guest under TCG, once in run 20261126-173751-18059; it "rebooted" under a new
      # domid) is created again, and the result line says so.
      _end=$(($(uptime_s) + 120))
      while [ "$(uptime_s)" -lt $_end ] && ! grep -q "XPE2E-DOMU: up" "$(console_log "$1")" 2>/dev/null && domain_booting "$_id"; do
        sleep 0.2
      done
      _state=died
      if grep -q "XPE2E-DOMU: up" "$(console_log "$1")" 2>/dev/null; then
        _state=up
      elif domain_booting "$_id"; then
        # Still in its own boot after 120 s: where its vCPUs stand, for the serial log (a
        # guest slow under a loaded host goes on; one that hangs there fails its next wait).
        _state=booting
        DIAG_NO_SYSRQ=1 domu_diag "$_id" "DomU $1 not up 120 s after its creation (try $try)" >&2
        echo "DomU $1 not up 120 s after its creation (try $try)" >>"/tmp/$S.notes"
      fi
      if [ "$_state" != died ]; then
        if [ $try -gt 1 ]; then
          echo "XPE2E-INFO: $1 created on try $try" >&2
          echo "$1 needed $try tries" >>"/tmp/$S.notes"
        fi
        echo "$_id"
        return 0
      fi
      echo "XPE2E-INFO: DomU $1 (domain $_id) died in its own boot, before anything of ours ran in it (try $try); Xen's log:" >&2
      xl dmesg 2>/dev/null | grep -a "d$_id" | tail -n 6 | sed 's/^/XPE2E-INFO: xl dmesg: /' >&2
      tail -n 5 "$(console_log "$1")" 2>/dev/null | sed 's/^/XPE2E-INFO: its console: /' >&2
      echo "DomU $1 died in its own boot (try $try, $(xl dmesg 2>/dev/null | grep -a "d$_id" | grep -o 'Triple fault' | head -n 1))" >>"/tmp/$S.notes"
      timeout 30 xl destroy "$_id" >/dev/null 2>&1
      rm -f "$(console_log "$1")"
      sleep 1
      continue
    fi
    echo "XPE2E-INFO: xl create of $1 failed (try $try, exit $rc); the end of its -vvv log:" >&2
    tail -n 12 "/tmp/$1.create.log" | sed 's/^/XPE2E-INFO: xl create: /' >&2
    # The tail is libxl's teardown; the reason is in its non-debug lines and Xen's own log.
    grep -v ': debug: ' "/tmp/$1.create.log" | grep -iE 'error|fail|warn|invalid|unknown' | tail -n 12 |
      sed 's/^/XPE2E-INFO: xl create (not debug): /' >&2
    xl dmesg 2>/dev/null | tail -n 8 | sed 's/^/XPE2E-INFO: xl dmesg: /' >&2
    timeout 30 xl destroy "$1" >/dev/null 2>&1
    sleep 1
  done
  return 1
}

# XPE2E_CONSOLE_DIR: another directory, for tests/e2e/harness_waits_test.sh.
console_log() { echo "${XPE2E_CONSOLE_DIR:-/var/log/xen/console}/guest-$1.log"; }

# domu_broken: the current DomU's console shows it is beyond saving (waits stop early).
CUR_DOMU=""
domu_broken() {
  [ -n "$CUR_DOMU" ] && grep -qE 'Kernel panic|Oops: |multicall\(s\) failed' "$(console_log "$CUR_DOMU")" 2>/dev/null
}

# wait_console <name> <grep -E pattern> <seconds>
wait_console() {
  _w=0
  _end=$(($(uptime_s) + $3))
  while [ "$(uptime_s)" -lt $_end ]; do
    grep -qE "$2" "$(console_log "$1")" 2>/dev/null && return 0
    [ $((_w % 10)) = 9 ] && domu_broken && return 1
    sleep 0.2
    _w=$((_w + 1))
  done
  grep -qE "$2" "$(console_log "$1")" 2>/dev/null
}

# dump_console <name>: the guest's console, prefixed, for the serial log.
dump_console() {
  echo "$1" >>"/tmp/$S.dumped"
  echo "XPE2E-INFO: ---- console of DomU $1 ----"
  tr -d '\r' <"$(console_log "$1")" 2>/dev/null | sed "s/^/[domu $1] /"
  echo "XPE2E-INFO: ---- end of console of DomU $1 ----"
}

# domu_diag <domid> <why...>: diagnostics of a DomU that stopped making progress, for the
# serial log, taken while it is still in that state (nothing here waits on the guest itself):
#  - every vCPU's registers and the kernel addresses on its stack, with their symbols
#    (xenctx pauses the domain for the read; works with the guest's interrupts off);
#  - the guest's own view through sysrq (xenstore control/sysrq, handled by its xenwatch
#    thread: needs one vCPU that still schedules; the DomU's init enables these keys): 'l'
#    backtraces of every CPU (NMI), 'w' blocked tasks, 't' every task (not with DIAG_NO_SYSRQ);
#  - Xen's per-vCPU state ('q' debug key: blocked/running, pending events; on the serial
#    console directly, Xen's log goes there);
#  - the DomU's console: its last 80 lines before, and everything after (the sysrq output).
# Header and footer lines start with XPE2E-DIAG (the host shows them as they come); the rest
# with "[diag d<domid>]".
domu_diag() {
  _d=$1
  shift
  _n=$(xl domname "$_d" 2>/dev/null)
  _log=$(console_log "${_n:-?}")
  _m=$(wc -l <"$_log" 2>/dev/null || echo 0)
  _t0=$(uptime_s)
  echo "XPE2E-DIAG domain $_d (${_n:-no name}): $*"
  {
    xl list "$_d" 2>&1
    # Dom0's own kallsyms name the DomU's kernel addresses (a PV DomU runs Dom0's kernel; a
    # PVH one boots with nokaslr). Debian's /boot/System.map is a stub. Text symbols only,
    # one per address, sorted: xenctx inserts each symbol into a list, from its head for an
    # address equal to the previous one's (aliases), which took minutes on all of kallsyms.
    [ -s /tmp/xpe2e-kallsyms.text ] ||
      awk '$2 == "t" || $2 == "T"' /proc/kallsyms | sort -s -u -k1,1 >/tmp/xpe2e-kallsyms.text
    timeout 60 xenctx -s /tmp/xpe2e-kallsyms.text -S -C "$_d" 2>&1
  } | sed "s/^/[diag d$_d] /"
  # DIAG_NO_SYSRQ=1: not for a guest that goes on (its console would carry the backtraces into
  # the checks that read it).
  if [ -z "${DIAG_NO_SYSRQ:-}" ]; then
    for k in l w t; do
      timeout 20 xl sysrq "$_d" $k >/dev/null 2>&1 || echo "[diag d$_d] xl sysrq $k failed"
      sleep 4
    done
  fi
  timeout 20 xl debug-keys q >/dev/null 2>&1
  sleep 4
  _from=$((_m > 80 ? _m - 79 : 1))
  echo "[diag d$_d] ---- console of ${_n:-?} from line $_from (the sysrq output from line $((_m + 1))) ----"
  tr -d '\r' <"$_log" 2>/dev/null | tail -n +"$_from" | sed "s/^/[diag d$_d] /"
  echo "XPE2E-DIAG domain $_d: end of diagnostics ($(($(uptime_s) - _t0)) s)"
}

# domain_alive <domid>: running, not crashed
domain_alive() {
  state=$(xl list "$1" 2>/dev/null | awk 'NR == 2 {print $5}')
  case "$state" in
    *c*|*d*|"") return 1 ;;
  esac
  return 0
}

# xenprobe_attached <json output file> <pid>: waits up to 240 s for xenprobe's attached_probes
# record; fails (1) when it did not come, or xenprobe ended first.
xenprobe_attached() {
  _end=$(($(uptime_s) + 240))
  while [ "$(uptime_s)" -lt $_end ] && ! grep -q '"attached_probes"' "$1" && kill -0 "$2" 2>/dev/null; do
    sleep 0.5
  done
  grep -q '"attached_probes"' "$1"
}

# xenprobe_start <domid> <json out> <stderr file> <xenprobe arguments...>: starts xenprobe in
# the background (its pid in $xp) and waits for its attached_probes record; when it does not
# come, the scenario fails with xenprobe's own last line, the DomU let go on to its unload.
xenprobe_start() {
  _xd=$1 _xo=$2 _xe=$3
  shift 3
  /usr/bin/xenprobe "$@" >"$_xo" 2>"$_xe" &
  xp=$!
  if ! xenprobe_attached "$_xo" $xp; then
    kill -KILL $xp 2>/dev/null
    sed 's/^/XPE2E-INFO: xenprobe: /' "$_xe"
    domu_release "$_xd"
    result FAIL "xenprobe did not attach: $(tail -n 1 "$_xe")"
  fi
}

# xenprobe_workload <domid> <json out> <stderr file>: lets the DomU's workload go, waits for its
# report (in $done), then stops xenprobe $xp with SIGTERM (it detaches and prints its maps, as
# ^C does); its exit status in $xp_rc, its output and errors in the log.
xenprobe_workload() {
  xenstore-write "/local/domain/$1/data/xpe2e/go" 1
  done=$(xs_wait "/local/domain/$1/data/xpe2e/done" 240) || {
    kill -TERM $xp 2>/dev/null
    wait $xp
    sed 's/^/XPE2E-INFO: xenprobe: /' "$3"
    domu_release "$1"
    result FAIL "the workload did not finish within 240 s"
  }
  echo "XPE2E-INFO: workload: $done"
  kill -TERM $xp
  wait $xp
  xp_rc=$?
  sed 's/^/XPE2E-INFO: xenprobe: /' "$3"
  sed 's/^/XPE2E-INFO: xenprobe out: /' "$2"
}

xs_wait() { # <path> <seconds>: prints the value once the key exists
  _w=0
  _end=$(($(uptime_s) + $2))
  while [ "$(uptime_s)" -lt $_end ]; do
    xenstore-read "$1" 2>/dev/null && return 0
    [ $((_w % 10)) = 9 ] && domu_broken && return 1
    sleep 0.2
    _w=$((_w + 1))
  done
  xenstore-read "$1" 2>/dev/null
}

# domu_verdict <name> <domid>: FAILs the scenario on anything wrong in the guest: not
# running, workload not ok, a failed exercise (a process crashed), an oops in its log.
domu_verdict() {
  wait_console "$1" "XPE2E-DOMU: idle" 90
  dump_console "$1"
  log=$(console_log "$1")
  domain_alive "$2" || result FAIL "DomU $1 is not running any more (xl list: $(xl list "$2" 2>&1 | tail -n 1))"
  grep -q "XPE2E-WORKLOAD: done .* ok=1" "$log" || result FAIL "DomU $1: the workload did not report ok=1"
  bad=$(grep -a "XPE2E-DOMU: exercise .* failures=[1-9]" "$log" | head -n 1 | tr -d '\r')
  [ -z "$bad" ] || result FAIL "DomU $1: processes failed: ${bad#*XPE2E-DOMU: }"
  grep -q "XPE2E-DOMU: idle" "$log" || result FAIL "DomU $1 did not finish its init script"
  bad=$(grep -a "XPE2E-DOMU: dmesg-bad" "$log" | head -n 1 | tr -d '\r')
  [ -z "$bad" ] || result FAIL "DomU $1: ${bad#*dmesg-bad: }"
}

# domu_release <domid>: lets the DomU's init go on to the module's unload even when the Dom0
# program stopped early (it writes these keys itself on success); waits for the unload.
domu_release() {
  xenstore-exists "/local/domain/$1/data/xpe2e/unload" 2>/dev/null || xenstore-write "/local/domain/$1/data/xpe2e/unload" 1
  xs_wait "/local/domain/$1/data/xpe2e/unloaded" 120 >/dev/null
}

# bench_scenario <DomU name> <channel> <extra kernel args> [<extra module params, ":a=1:b=2">]
# [<extra xpe2e-probe args>] [<configs>]: the benchmark (tools/bench/table1.sh):
# one DomU with the module runs the guest's benchmark loop, xpe2e-probe drives it config by
# config through <channel> and prints the XPE2E-BENCH lines. PASS when every config ran and
# every check held (probes saw every measured call, text restored); the numbers are in the log.
# BENCH_CONFIGS, BENCH_ROUND, BENCH_ROUNDS, BENCH_UNTAR (run.conf, from the host) tune it.
bench_scenario() {
  # ring_order=20: 1 MiB of records per vCPU for the async config (Dom0 reads them every 20 ms at
  # best; under TCG it wakes far less often).
  domid=$(domu_start "$1" "$3 xpe2e.bench=1 xpe2e.wait=900 xpe2e.modparams=timeout_ms=5000:ring_order=20${4:-}") || result FAIL "xl create failed"
  echo "XPE2E-INFO: DomU $1 is domain $domid"
  echo "XPE2E-BENCH-ENV hypervisor=$(xl info 2>/dev/null | awk -F': ' '/^xen_version/ {print $2}') guest=${DOMU_TYPE:-pv} kernel=$KVER host_cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\""
  # shellcheck disable=SC2086
  timeout 1500 "$PROBE" bench --domid "$domid" --channel "$2" --timeout 600 --configs "${6:-${BENCH_CONFIGS:-native,kprobe,kretprobe,xp,xrp}}" \
    --round "${BENCH_ROUND:-1}" --rounds "${BENCH_ROUNDS:-3}" --untar "${BENCH_UNTAR:-3}" ${5:-} $PROBE_EXTRA
  rc=$?
  domu_release "$domid"
  wait_console "$1" "XPE2E-DOMU: idle" 90
  dump_console "$1"
  domain_alive "$domid" || result FAIL "DomU $1 is not running any more"
  [ $rc -eq 0 ] || result FAIL "xpe2e-probe bench failed (exit $rc; its XPE2E-CHECK lines above)"
  result PASS "benchmark complete on the $2 channel (XPE2E-BENCH lines above)"
}

# guardian_account <program output>: FAILs the scenario unless the guardian's account
# (docs/guardian.md, "What recovery does") shows a whole recovery: xpe2e-reap saw it exit 0;
# it recovered the one domain; restored at least one patch per armed probe point (the
# text.armed line), left none alone and no step failed; a return-probe call was in flight at
# the kill (the program dies in the handler of the call inside __x64_sys_getppid, under the
# XrP on getppid) and a return address was put back; on the debugger channel it moved the
# stopped vCPU back onto its probe point and released that stop's pause too.
guardian_account() {
  g=$(grep -a "xenprobes-guardian\[" "$1")
  echo "$g" | sed 's/^/XPE2E-INFO: /'
  reaped=$(grep -a "^XPE2E-REAPED .* comm=xenprobes-guard" "$1" | head -n 1)
  [ -n "$reaped" ] || result FAIL "guardian: its end was not seen (no XPE2E-REAPED line for it: still running, or never started)"
  case "$reaped" in
    *" status=exit 0") ;;
    *) result FAIL "guardian: ${reaped#XPE2E-REAPED }" ;;
  esac
  bad=$(echo "$g" | grep -aE " failed: |: left alone$|: left as it is$" | head -n 1)
  [ -z "$bad" ] || result FAIL "guardian: ${bad#*]: }"
  armed=$(sed -nE 's/^XPE2E-CHECK text.armed PASS ([0-9]+) probe points.*/\1/p' /tmp/$S.out | head -n 1)
  # Killed while registering, the program never checked what it armed; killed while
  # unregistering, some of it was already removed (the journal holds the rest): the text's
  # return to the snapshot (verify-text) is the check then.
  case ${die_in:-call} in register | unregister) armed=0 ;; esac
  set -- $(echo "$g" | sh "$E2E/guardian-account.sh") $armed
  [ $# -eq 13 ] || result FAIL "guardian: no complete account (its 'recovering' and 'done' lines) in the output"
  # $1 domains $2 patches $3 calls in flight | $4 recovered $5 gone $6 restored $7 left alone
  # $8 vCPUs moved $9 returns restored ${10} pauses released ${11} steps failed ${12} refused
  # (domid reused) | ${13} armed points
  acct="journal: $1 domains, $2 patches, $3 calls in flight; recovered $4, gone $5, refused ${12}, restored $6, left alone $7, vCPUs moved $8, returns restored $9, pauses released ${10}, failed ${11}; ${13} points armed"
  echo "XPE2E-INFO: guardian account: $acct"
  [ "$1" = 1 ] && [ "$4" = 1 ] && [ "$5" = 0 ] && [ "$7" = 0 ] && [ "${11}" = 0 ] && [ "${12}" = 0 ] ||
    result FAIL "guardian: not one domain recovered whole ($acct)"
  [ "$6" -ge "${13}" ] || result FAIL "guardian: fewer patches restored than probe points armed ($acct)"
  # A call in flight, and a vCPU stopped on the debugger channel, only when the kill came inside
  # a handler (kill9_scenario's die_in): the call and filp handlers run inside an XrP'd call.
  case ${die_in:-call} in
    call | filp)
      [ "$3" -ge 1 ] || result FAIL "guardian: no return-probe call in flight at the kill ($acct)"
      [ "$9" -ge 1 ] || result FAIL "guardian: no return address put back ($acct)"
      ;;
  esac
  if [ "$CHANNEL" = debugger ] && [ "${die_in:-call}" != register ] && [ "${die_in:-call}" != unregister ]; then
    [ "$8" -ge 1 ] && [ "${10}" -ge 2 ] || result FAIL "guardian: the stopped vCPU was not moved back, or its stop's pause not released ($acct)"
  else
    [ "${10}" -ge 1 ] || result FAIL "guardian: its own pause not released ($acct)"
  fi
}

# kill9_scenario <DomU name> <channel> <extra kernel args> <seconds for the workload to start>:
# the probing process SIGKILLs itself inside the handler of the call in __x64_sys_getppid on
# its 50th hit (a vCPU waits for that answer, and the XrP on __x64_sys_getppid has that call
# in flight) with probes armed under load; the guest must keep running, its workload (2000
# getppid, 50 openat, 20 unlink) finish with correct results, and its text return
# byte-identical to the snapshot taken before arming. Who restores it depends on the channel:
# on `guest` the module's fail-safe, after XENPROBES_DEAD_AFTER timeouts (timeout_ms = 500,
# its default), the call in flight returning through the module's return table; on
# `debugger` and `vmevent` the session's guardian (xenprobes-guardian, docs/guardian.md),
# whose exit status and account are checked (guardian_account), and which must leave the
# domain neither paused nor debugged, no monitor behind and the module untouched. Then
# detach + rmmod. The program runs under xpe2e-reap, which outlives it and reaps the guardian.
kill9_scenario() {
  N=$1
  CHANNEL=$2
  tmo=2000 by=guardian
  [ "$2" = guest ] && tmo=500 by=module
  domid=$(domu_start $N "$3 xpe2e.modparams=timeout_ms=$tmo xpe2e.work=${KILL_WORK:-2000:50:20}") || result FAIL "xl create failed"
  echo "XPE2E-INFO: DomU $N is domain $domid"
  wait_console $N "XPE2E-WORKLOAD: waiting" "$4" || { dump_console $N; result FAIL "the workload did not start within $4 s"; }
  # KILL_DIE_IN, KILL_AFTER: where and after how many hits (or probes) the program kills itself
  # (xpe2e-probe kill --die-in, --die-after-hits; kill9_rounds.sh draws them at random);
  # KILL_METHOD: how its pre-handler-only probes go in (--method trap|fastest: jump probes).
  die_in=${KILL_DIE_IN:-call}
  # KILL_CMD: the xpe2e-probe command (kill; kill-island: a short jump to an island armed).
  timeout 400 "$E2E/xpe2e-reap" --wait 120 -- "$PROBE" "${KILL_CMD:-kill}" --domid "$domid" --channel "$2" --snapshot /tmp/$S.snap \
    --die-in "$die_in" --die-after-hits "${KILL_AFTER:-50}" --method "${KILL_METHOD:-trap}" --timeout 300 $PROBE_EXTRA >/tmp/$S.out 2>&1
  rc=$?
  cat /tmp/$S.out
  grep -q "^XPE2E-KILL" /tmp/$S.out || { dump_console $N; result FAIL "xpe2e-probe ${KILL_CMD:-kill} did not reach its SIGKILL (exit $rc)"; }
  [ $rc -eq 137 ] || result FAIL "xpe2e-probe ${KILL_CMD:-kill} exited $rc, not 137 (SIGKILL)"
  bad=$(grep -a "^XPE2E-CHECK .* FAIL" /tmp/$S.out | head -n 1)
  [ -z "$bad" ] || result FAIL "xpe2e-probe ${KILL_CMD:-kill}, before the kill: ${bad#XPE2E-CHECK }"
  # The call and filp handlers run while an XrP'd call is in flight: the recovery must put its
  # return address back.
  case $die_in in
    call | filp) grep -aq "^XPE2E-KILL.*XrP calls in flight: [1-9]" /tmp/$S.out ||
      result FAIL "no XrP call in flight at the kill: $(grep -a '^XPE2E-KILL' /tmp/$S.out)" ;;
  esac
  # Killed while registering: the workload was never started; start it (it runs into the armed
  # probes, which the guest module or the guardian must make harmless).
  xenstore-exists "/local/domain/$domid/data/xpe2e/go" 2>/dev/null || xenstore-write "/local/domain/$domid/data/xpe2e/go" 1
  t0=$(uptime_s)
  done=$(xs_wait "/local/domain/$domid/data/xpe2e/done" 240) || {
    grep -a "xenprobes-guardian" /tmp/$S.out | sed 's/^/XPE2E-INFO: /'
    xl list "$domid" | sed 's/^/XPE2E-INFO: /'
    dump_console $N
    result FAIL "the workload did not finish within 240 s after the kill"
  }
  echo "XPE2E-INFO: workload finished $(($(uptime_s) - t0)) s after the kill: $done"
  if [ $by = guardian ]; then
    guardian_account /tmp/$S.out
  elif grep -aq "xenprobes-guardian" /tmp/$S.out; then
    result FAIL "a guardian ran for a guest-channel session (its domains are never journaled)"
  fi
  timeout 120 "$PROBE" verify-text --domid "$domid" --channel "$2" --snapshot /tmp/$S.snap --timeout 60
  rc2=$?
  xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
  un=$(xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120)
  domu_verdict $N "$domid"
  [ $rc2 -eq 0 ] || result FAIL "text not restored, or the module's counters or the domain's state wrong (its XPE2E-CHECK lines above)"
  [ "$un" = ok ] || result FAIL "detach + rmmod after the kill: '$un'"
  if [ $by = module ]; then
    # After the module restored the text (under stop_machine), no vCPU may execute an int3
    # there any more: one that does (stale code) would be die("int3") once the module is gone
    # on Linux >= 6.2 (docs/e2e.md "kill -9 on the guest channel").
    unl=$(grep -a "xenprobes: unloaded" "$(console_log $N)" | head -n 1 | tr -d '\r')
    echo "XPE2E-INFO: DomU $N: ${unl#*] }"
    case "$unl" in
      *" 0 stale int3s at restored bytes"*"after the restore: 0 hits in text"*) ;;
      *) result FAIL "DomU $N: int3s executed at text the module had restored: ${unl#*unloaded }" ;;
    esac
  fi
  # KILL_CHECK: a function of the scenario's own, given the DomU's name, that FAILs it on
  # anything else it must see.
  [ -z "${KILL_CHECK:-}" ] || "$KILL_CHECK" "$N"
  case $die_in in
    call | filp) result PASS "guest kept running, workload ok, text restored by the $by ($2 channel) with an XrP call in flight, module unloaded" ;;
    *) result PASS "guest kept running, workload ok, text restored by the $by ($2 channel) after a kill in $die_in at ${KILL_AFTER:-50}, module unloaded" ;;
  esac
}

# What a kernel says when it is hurt: an oops, a BUG()/WARN(), a panic, a lockup or an RCU
# stall, and the hazards' own lines (ftrace refusing a site it did not write, jump labels and
# static calls finding an unexpected byte). Probe safety (docs/e2e.md) fails on any of them.
KERNEL_BAD_RE='BUG:|Oops|WARNING:|general protection|kernel BUG|panic|soft lockup|hard LOCKUP|rcu_(sched|preempt) (self-)?detected stall|ftrace failed to modify|jump_label: Fatal|unexpected static_call'

# dom0_dmesg_mark: remembers how long Dom0's kernel log is (dom0_kernel_clean checks only
# what came after).
dom0_dmesg_mark() { DOM0_DMESG_MARK=$(dmesg | wc -l); }

# domu_kernel_clean <name>: FAILs the scenario when the DomU's console (its kernel's messages
# among them) holds a KERNEL_BAD_RE line; prints every such line first.
domu_kernel_clean() {
  bad=$(tr -d '\r' <"$(console_log "$1")" 2>/dev/null | grep -aE "$KERNEL_BAD_RE" | grep -av '^XPE2E-')
  [ -z "$bad" ] && return 0
  echo "$bad" | head -n 40 | sed "s/^/XPE2E-INFO: DomU $1 kernel: /"
  dump_console "$1"
  result FAIL "DomU $1: kernel: $(echo "$bad" | head -n 1 | cut -c1-200)"
}

# dom0_kernel_clean: the same for Dom0's kernel log since dom0_dmesg_mark.
dom0_kernel_clean() {
  bad=$(dmesg | tail -n +"$((${DOM0_DMESG_MARK:-0} + 1))" | grep -aE "$KERNEL_BAD_RE")
  [ -z "$bad" ] && return 0
  echo "$bad" | head -n 40 | sed 's/^/XPE2E-INFO: Dom0 kernel: /'
  result FAIL "Dom0: kernel: $(echo "$bad" | head -n 1 | cut -c1-200)"
}

# safety_scenario <DomU name> <channel> <extra kernel args> <seconds for the guest to start>
# <xpe2e-probe safety options...>: probe safety (issue 12, docs/e2e.md "Probe safety"). One
# DomU runs the safety phases (xpe2e.safety=1) while xpe2e-probe safety registers probes on
# each hazard class and drives them; the program's checks, the workload's phases, the module's
# unload and both kernels' logs must all be clean. SAFETY_CMD names another xpe2e-probe command
# that drives the same guest loop (safety-extable-all).
safety_scenario() {
  N=$1
  ch=$2
  dom0_dmesg_mark
  domid=$(domu_start "$N" "$3 xpe2e.safety=1") || result FAIL "xl create failed"
  echo "XPE2E-INFO: DomU $N is domain $domid"
  wait_console "$N" "XPE2E-WORKLOAD: waiting" "$4" || { dump_console "$N"; result FAIL "the safety loop did not start within $4 s"; }
  shift 4
  # shellcheck disable=SC2086
  timeout 900 "$PROBE" "${SAFETY_CMD:-safety}" --domid "$domid" --channel "$ch" "$@" $PROBE_EXTRA
  rc=$?
  # A guest that died (a crash of a PV guest may print nothing) has nothing left to wait for.
  if domain_alive "$domid"; then
    domu_release "$domid"
    wait_console "$N" "XPE2E-DOMU: idle" 90
  fi
  domu_kernel_clean "$N"
  domain_alive "$domid" || { dump_console "$N"; result FAIL "DomU $N is not running any more (xl list: $(xl list "$domid" 2>&1 | tail -n 1))"; }
  dom0_kernel_clean
  domu_verdict "$N" "$domid"
  [ $rc -eq 0 ] || result FAIL "xpe2e-probe ${SAFETY_CMD:-safety} failed (exit $rc; its XPE2E-CHECK lines above)"
}

# victim_unload_then_module NAME DOMID: the guest unloads its victim loop.ko, then detaches and
# unloads our module; the scenario fails on a guest that could not, died, had a process fail, a
# bad dmesg line or an unclean kernel. Leaves the guest's unload report in `un` and its console
# in `log` (stock_pv_module_gone, stock_pv_xenprobe_module_btf).
victim_unload_then_module() {
  local n=$1 d=$2 bad
  xenstore-write "/local/domain/$d/data/xpe2e/victim_unload" 1
  wait_console "$n" "XPE2E-DOMU: victim loop unloaded" 120 || {
    domu_release "$d"
    dump_console "$n"
    result FAIL "the guest could not unload loop.ko: $(xenstore-read "/local/domain/$d/data/xpe2e/victim" 2>&1)"
  }
  xenstore-write "/local/domain/$d/data/xpe2e/unload" 1
  un=$(xs_wait "/local/domain/$d/data/xpe2e/unloaded" 120)
  wait_console "$n" "XPE2E-DOMU: idle" 90
  dump_console "$n"
  domain_alive "$d" || result FAIL "DomU $n is not running any more (xl list: $(xl list "$d" 2>&1 | tail -n 1))"
  log=$(tr -d '\r' <"$(console_log "$n")")
  bad=$(echo "$log" | grep -a "XPE2E-DOMU: exercise .* failures=[1-9]" | head -n 1)
  [ -z "$bad" ] || result FAIL "DomU $n: processes failed: ${bad#*XPE2E-DOMU: }"
  bad=$(echo "$log" | grep -a "XPE2E-DOMU: dmesg-bad" | head -n 1)
  [ -z "$bad" ] || result FAIL "DomU $n: ${bad#*dmesg-bad: }"
  domu_kernel_clean "$n"
}
