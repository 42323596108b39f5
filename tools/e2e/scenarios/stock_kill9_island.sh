# Scenario: kill -9 with a short jump to an island armed (issue 14, protocol.h "Short jumps to
# islands": the guest module's own restore). xpe2e-probe kill-island saves the text around the
# island candidates, arms the short jump that jump-island finds (putname+0x17 on 6.1.0-50: eb
# rel8 to an island in putname's dead padding, whose e9 goes to the detour), reads both back,
# and SIGKILLs itself inside the probe's handler on its 10th hit, a vCPU waiting in the module's
# jump entry. The module's fail-safe must put the region back and then, after its quiescence,
# the island: its log says it restored 2 (the region and the island) and left no island alone,
# the text is byte-identical to the snapshot taken before arming (verify-text), the guest keeps
# running and its workload finishes with ok=1; then the module unloads.
S=${XPE2E_SCENARIO:-stock_kill9_island}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
# island_restored <DomU name>: the module's fail-safe line (xp_disarm_work) counts the region
# and the island, and no island was left alone (xp_restore_islands).
island_restored() {
  _log=$(tr -d '\r' <"$(console_log "$1")")
  _line=$(echo "$_log" | grep -a "xenprobes: Dom0 did not answer" | head -n 1)
  echo "XPE2E-INFO: DomU $1: ${_line#*] }"
  case "$_line" in
    *"restored 2 trap bytes and jump regions"*) ;;
    *) result FAIL "DomU $1: the module's fail-safe did not restore the region and the island (2): '${_line#*] }'" ;;
  esac
  _bad=$(echo "$_log" | grep -a "short-jump islands left alone" | head -n 1)
  [ -z "$_bad" ] || result FAIL "DomU $1: ${_bad#*] }"
}
KILL_CMD=kill-island KILL_DIE_IN=island KILL_AFTER=10 KILL_CHECK=island_restored kill9_scenario xpe2e-killi guest "" 180
