# Scenario: the unload handshake (protocol.h "Letting go"). The guest module frees its control
# area and async rings at rmmod only after the Dom0 that maps them released them
# (header.dom0_hold = RELEASED, Dom0's last write), and keeps them (never freed) otherwise.
#   a: xenprobe attached and running when the guest detaches the module: xenprobe sees `state`
#      go, forgets the domain and releases; the module's detach line and its unload line say
#      "Dom0 released them: freed".
#   b: xenprobe killed with SIGKILL (no release), then the guest detaches: the module finds the
#      port closed without a release; both lines say "kept, not freed"; the guest stays healthy
#      (its exercises after the unload, no oops).
S=${XPE2E_SCENARIO:-stock_pv_module_release}
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
PROG='kprobe:__x64_sys_getppid { @getppid = count(); }'

# phase <DomU name> <attached|killed>: one DomU, xenprobe on it, the detach as said; leaves the
# module's detach and unload lines in $det and $unl.
phase() {
  N=$1
  domid=$(domu_start $N "xpe2e.work=100:10:5") || result FAIL "xl create $N failed"
  echo "XPE2E-INFO: DomU $N is domain $domid"
  wait_console $N "XPE2E-WORKLOAD: waiting" 180 || { dump_console $N; result FAIL "the workload of $N did not start within 180 s"; }
  OUT=/tmp/$S.$N.json
  ERR=/tmp/$S.$N.err
  xenprobe_start "$domid" "$OUT" "$ERR" -d $N -f json --duration 600 -e "$PROG"
  xenstore-write "/local/domain/$domid/data/xpe2e/go" 1
  done=$(xs_wait "/local/domain/$domid/data/xpe2e/done" 240) || {
    kill -KILL $xp 2>/dev/null
    domu_release "$domid"
    result FAIL "the workload of $N did not finish within 240 s"
  }
  echo "XPE2E-INFO: $N: workload: $done"
  if [ "$2" = killed ]; then
    kill -KILL $xp
    wait $xp
    echo "XPE2E-INFO: $N: xenprobe killed (exit $?)"
  fi
  # The guest detaches (its init: echo 1 > detach, then rmmod) with xenprobe attached, or after
  # its death.
  xenstore-write "/local/domain/$domid/data/xpe2e/unload" 1
  un=$(xs_wait "/local/domain/$domid/data/xpe2e/unloaded" 120)
  if [ "$2" = attached ]; then
    # xenprobe saw the module withdraw (its `state` watch) while it ran; now it may end.
    if kill -0 $xp 2>/dev/null; then
      kill -TERM $xp
      wait $xp
      echo "XPE2E-INFO: $N: xenprobe ended by SIGTERM after the unload (exit $?)"
    else
      wait $xp
      echo "XPE2E-INFO: $N: xenprobe had ended by itself (exit $?)"
    fi
    sed 's/^/XPE2E-INFO: xenprobe: /' "$ERR"
  fi
  domu_verdict $N "$domid"
  domu_kernel_clean $N
  [ "$un" = ok ] || result FAIL "$N: detach + rmmod: '$un'"
  det=$(grep -a "xenprobes: detached" "$(console_log $N)" | head -n 1 | tr -d '\r')
  unl=$(grep -a "xenprobes: unloaded" "$(console_log $N)" | head -n 1 | tr -d '\r')
  echo "XPE2E-INFO: $N: ${det#*] }"
  echo "XPE2E-INFO: $N: ...${unl##*; }"
}

phase xpe2e-rel-a attached
case "$det" in *"control area and rings: Dom0 released them: freed"*) ;; *) result FAIL "xpe2e-rel-a: the detach did not see xenprobe's release: ${det#*] }" ;; esac
case "$unl" in *"Dom0's areas: Dom0 released them: freed"[\;\)]*) ;; *) result FAIL "xpe2e-rel-a: the unload line does not say the areas were released and freed: ${unl##*; }" ;; esac
phase xpe2e-rel-b killed
case "$det" in *"control area and rings: "*"kept, not freed"*) ;; *) result FAIL "xpe2e-rel-b: the detach did not keep the areas of the killed xenprobe: ${det#*] }" ;; esac
case "$unl" in *"Dom0's areas: "*"kept, not freed"[\;\)]*) ;; *) result FAIL "xpe2e-rel-b: the unload line does not say the areas were kept: ${unl##*; }" ;; esac
grep -aq "xenprobes: keeping the control area" "$(console_log xpe2e-rel-b)" || result FAIL "xpe2e-rel-b: no warning naming the kept pages"
result PASS "xenprobe attached at the detach released the module's areas (freed at rmmod); after kill -9 they were kept (never freed), the guest healthy after the unload"
