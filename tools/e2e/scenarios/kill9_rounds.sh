# Scenario body (stock_kill9_rounds, stock_pvh_kill9_rounds, gdbsx_kill9_rounds; never in the
# default list, docs/reliability.md "kill -9 at random points"): kill9_scenario, KILL_ROUNDS
# times (run.conf; default 20) in one boot, each round with a DomU of its own and the kill at a
# point drawn at random: right after the N-th probe is registered, inside the getppid, call
# or filp handler at its N-th hit, or (debugger and vmevent channels) right after the N-th probe
# is unregistered once the workload is done. Every round must pass as kill9_scenario does on
# its own: guest alive, workload ok, text byte-identical, restored by the module or the
# guardian, the module unloaded. KILL_SEED (run.conf) repeats a run's draws.
#
# The guest channel leaves unregistration out: a kill there leaves the probes not yet removed
# armed with nothing left to hit them, and the module restores them only on its next hits'
# timeouts or at its unload, which kill9_scenario's order (the text checked before the
# unload) does not wait for.
S=${XPE2E_SCENARIO:-stock_kill9_rounds}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
case $S in
  *pvh*) ch=vmevent kargs=nokaslr wait=240 points="register getppid call filp unregister" ;;
  gdbsx*) ch=debugger kargs="" wait=180 points="register getppid call filp unregister" ;;
  *) ch=guest kargs="" wait=180 points="register getppid call filp" ;;
esac
rounds=${KILL_ROUNDS:-20}
seed=${KILL_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}
seed0=$seed
echo "XPE2E-INFO: $rounds rounds on the $ch channel, seed $seed (XPE2E_KILL_SEED=$seed draws them again)"
npoints=$(echo $points | wc -w)
# next: a linear congruential generator (the C standard's example), enough to spread the draws.
next() { seed=$(((seed * 1103515245 + 12345) % 2147483648)); }
r=1 passed=0 failed=""
while [ $r -le $rounds ]; do
  next
  i=$((seed / 65536 % npoints + 1))
  in=$(echo $points | cut -d' ' -f$i)
  # The workload (KILL_WORK: 600 getppid calls, 50 openat, 20 unlink; a third of
  # kill9_scenario's, for time) and register_probes' 8-10 probes bound the draws.
  case $in in
    register | unregister) max=8 ;;
    filp) max=40 ;;
    *) max=500 ;;
  esac
  next
  after=$((seed / 65536 % max + 1))
  # XPE2E_KILL_AT=POINT:N (run.conf KILL_AT): every round kills there (a failed round again).
  if [ -n "${KILL_AT:-}" ]; then
    in=${KILL_AT%%:*}
    after=${KILL_AT#*:}
  fi
  echo "XPE2E-STAGE round $r of $rounds ($ch): kill -9 at $in $after"
  (
    S=$S-r$r
    result() {
      v=$1
      shift
      echo "XPE2E-ROUND $r $v $in $after: $*"
      exit 0
    }
    KILL_DIE_IN=$in KILL_AFTER=$after KILL_WORK=600:50:20
    [ $ch = vmevent ] && DOMU_TYPE=pvh
    kill9_scenario "xpe2e-r$r" $ch "$kargs" $wait
  ) >/tmp/$S-r$r.round 2>&1
  sed 's/^XPE2E-CHECK /XPE2E-INFO: check /' /tmp/$S-r$r.round
  line=$(grep -a "^XPE2E-ROUND $r " /tmp/$S-r$r.round | tail -n 1)
  case "$line" in
    "XPE2E-ROUND $r PASS "*) passed=$((passed + 1)) ;;
    *) failed="$failed; round $r ($in $after): ${line:-no result}" ;;
  esac
  timeout 60 xl destroy "xpe2e-r$r" >/dev/null 2>&1
  r=$((r + 1))
done
[ -z "$failed" ] || result FAIL "$passed of $rounds rounds passed (seed $seed0)$failed"
result PASS "$rounds of $rounds kills ${KILL_AT:+at }${KILL_AT:-at random points} on the $ch channel recovered: guest alive, workload ok, text byte-identical (seed $seed0)"
