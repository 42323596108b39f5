# stock_pv_xenprobe with `--method async` (its body: the async counts, see there).
XPE2E_SCENARIO=${XPE2E_SCENARIO:-stock_pv_xenprobe_async}
. /usr/lib/xenprobes-e2e/scenarios/stock_pv_xenprobe.sh
