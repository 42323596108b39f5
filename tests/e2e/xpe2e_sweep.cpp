// xpe2e-probe sweep: the real-kernel sweep of issue 12 ("And a real-kernel sweep"), the Dom0
// side of tools/e2e/scenarios/stock_pv_sweep.sh (docs/e2e.md "The real-kernel sweep").
//
//   xpe2e-probe sweep --domid D [--channel guest] [--batch N] [--cap N] [--per-area N]
//                     [--max-fn-bytes N] [--min-functions N] [--round-limit S] [--hot-limit S]
//                     [--console FILE] [--only F1,F2,...]
//
// Takes the kernel functions of kAreas (a fixed list by name over mm, fs, sched, net, locking,
// RCU and the syscall paths; each name looked up in the guest's symbols, those absent or larger
// than --max-fn-bytes are left out and said so), decodes each one from the running guest's text
// (Capstone, from the function's first byte to the next symbol), and asks the library for a
// probe on every instruction, --batch instructions at a time. Each registration either gives a
// probe (counted by the mode the library chose, and as "moved" when it went elsewhere) or is
// refused (counted by the rule the refusal names: `rule '<name>'`, or the instruction rule's
// reason). The batch's probes stay armed while the guest runs one round of its mixed workload
// (xpe2e-workload safety, phase "sweep": exact numbers of getppid, getsid, fsync and listen
// calls, fork+exec churn, file I/O, TCP and UDP over 127.0.0.1, the function tracer and two
// tracepoints on and off); then they are unregistered and every function of the batch must be
// byte-identical to the snapshot taken before. Four probes on the counted syscalls' entries stay
// for the whole sweep and must count exactly what every round reports. A probe whose handler
// ran --cap times is unregistered at once (the time bound on hot functions: under TCG each hit
// costs ~0.4 ms); a round still running --hot-limit seconds after it started loses every sweep
// probe of its batch (said so). After every batch: the guest alive, no timeouts in the guest
// module, and its console (--console) without an oops, WARN, BUG, lockup or stall line.
// Prints "XPE2E-SWEEP ..." lines: one per batch, per area, per mode and per rule.
//
// Here: the options, the guest's console check and xpe2e_sweep_main(); the function list in
// xpe2e_sweep_areas.cpp, the Sweep's steps and its run in xpe2e_sweep_run.cpp (xpe2e_sweep.hpp).
#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_sweep.hpp"

using namespace xenprobes;
using namespace xpe2e;
using namespace xpe2e::sweep;

namespace xpe2e::sweep {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

namespace {

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) fatal("option " + k + " needs a value");
    std::string v = argv[++i];
    if (k == "--domid") a.dom = DomId{static_cast<std::uint32_t>(std::stoul(v))};
    else if (k == "--channel") a.channel = v;
    else if (k == "--batch") a.batch = static_cast<unsigned>(std::stoul(v));
    else if (k == "--cap") a.cap = static_cast<unsigned>(std::stoul(v));
    else if (k == "--per-area") a.per_area = static_cast<unsigned>(std::stoul(v));
    else if (k == "--max-fn-bytes") a.max_fn_bytes = std::stoull(v);
    else if (k == "--min-functions") a.min_functions = static_cast<unsigned>(std::stoul(v));
    else if (k == "--round-limit") a.round_limit = std::stoi(v);
    else if (k == "--hot-limit") a.hot_limit = std::stoi(v);
    else if (k == "--console") a.console = v;
    else if (k == "--only") a.only = "," + v + ",";
    else if (k == "--timeout")
      ;  // accepted for the harness's common options; --round-limit bounds a round
    else fatal("unknown option " + k);
  }
  if (!a.dom.value) fatal("--domid is required");
  if (a.batch == 0 || a.cap == 0) fatal("--batch and --cap must be at least 1");
  return a;
}

}  // namespace

// Every line of the console from `*offset` on that a hurt kernel prints (scenarios/lib.sh's
// KERNEL_BAD_RE, plus the lockup and stall reports).
std::vector<std::string> console_bad(const std::string& path, std::streamoff* offset) {
  static const std::regex bad(
      "BUG:|Oops|WARNING:|general protection|kernel BUG|panic|soft lockup|hard LOCKUP|rcu_(sched|preempt) "
      "(self-)?detected stall|detected stalls on CPUs|self-detected stall|blocked for more than|ftrace failed to "
      "modify|jump_label: Fatal|unexpected static_call");
  std::vector<std::string> out;
  if (path.empty()) return out;
  std::ifstream in(path);
  if (!in) return out;
  in.seekg(*offset);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("XPE2E-SWEEP-ROUND") != std::string::npos) say("XPE2E-INFO: guest: %s", line.c_str());
    if (line.rfind("XPE2E-", 0) != 0 && std::regex_search(line, bad)) out.push_back(line);
    if (in.tellg() >= 0) *offset = in.tellg();
  }
  in.clear();
  in.seekg(0, std::ios::end);
  *offset = in.tellg();
  return out;
}

}  // namespace xpe2e::sweep

int xpe2e_sweep_main(int argc, char** argv) {
  // The sweep's own fatal lines, fmt() length, describe() and xenstore polling (xpe2e_common.hpp).
  g_program = Program{.fatal_check = "sweep.fatal",
                      .fatal_prog = "sweep",
                      .fmt_buffer = 2048,
                      .describe_magic = false,
                      .key_poll = std::chrono::milliseconds(200)};
  Args a = parse(argc, argv);
  auto opt = must(parse_channel_kind(a.channel), "--channel");
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  auto state = wait_key(*hvp, dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_STATE), 120);
  if (!check("module.state", state && *state == XENPROBES_XS_STATE_READY,
             state ? "state=" + *state : "no state within 120 s"))
    fatal("the guest module never published its keys");
  std::string rel;
  if (std::ifstream f("/proc/sys/kernel/osrelease"); f) std::getline(f, rel);
  auto grel = hvp->xs_read(dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_RELEASE));
  check("module.release", grel && *grel == rel, "guest " + (grel ? *grel : std::string("?")) + ", Dom0 " + rel);
  say("XPE2E-INFO: sweep: kernel %s; %s", rel.c_str(), describe(ctl_header(*hvp, a.dom)).c_str());
  auto s = must(Session::open(std::move(hvp), SessionOptions{opt}), "Session::open");
  must(s->load_symbols(a.dom, "/proc/kallsyms"), "load_symbols(/proc/kallsyms)");
  auto ch = s->channel_name(a.dom);
  check("channel", ch && *ch == a.channel, ch ? "serving channel: " + *ch : "channel_name: " + ch.error().what);
  int rc = 0;
  {
    Sweep sw(a, *s);
    rc = sw.run();
  }
  hv::Hypervisor& hv = s->hypervisor();
  must(hv.xs_write(dom_path(a.dom, "data/xpe2e/safety/end"), "1"), "write data/xpe2e/safety/end");
  auto done = wait_key(hv, dom_path(a.dom, "data/xpe2e/done"), 60);
  check("workload.ok", done && num(kv(*done), "ok") == 1, done ? *done : "no data/xpe2e/done within 60 s");
  s.reset();
  auto hv2 = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  auto h = ctl_header(*hv2, a.dom);
  check("module.traps_cleared", h && h->nr_traps == 0 && h->timeouts == 0, "after the session closed: " + describe(h));
  must(hv2->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hv2, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG sweep %s %d", g_failed || rc ? "FAIL" : "PASS", g_failed);
  return g_failed || rc ? 1 : 0;
}
