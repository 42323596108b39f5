# Diagnostic (not in the default list): creates and destroys DomUs in a row to find how many
# `xl create` calls one Dom0 boot survives (xl's heap got corrupted under Xen's lazy FPU
# switching: docs/e2e.md "The environment").
# XL_CREATE_FLAGS (run.conf) adds flags to xl create, e.g. -e.
S=diag_xl_churn
. /usr/lib/xenprobes-e2e/scenarios/lib.sh
ok=0
for i in 1 2 3 4 5 6 7 8; do
  N=xpe2e-churn$i
  if ! domid=$(domu_start $N "xpe2e.module=0 xpe2e.work=1:1:1"); then
    echo "XPE2E-INFO: churn: create $i failed"
    break
  fi
  wait_console $N "XPE2E-WORKLOAD: waiting" 180 || echo "XPE2E-INFO: churn: DomU $i did not start"
  ps -eo pid,args | grep "[x]l " | sed 's/^/XPE2E-INFO: churn: process: /'
  timeout 30 xl destroy "$domid"
  ok=$i
  echo "XPE2E-INFO: churn: create+destroy $i ok"
done
[ $ok = 8 ] && result PASS "8 creates" || result FAIL "xl create failed after $ok creates"
