// xpe2e-probe int3-intercept --domid D [--timeout S]: does this platform give Dom0 the guest's
// int3s? The vmevent channel's int3 mode (and with it agentless probing) rests on one fact:
// with software-breakpoint monitoring on, the CPU's #BP intercept takes every int3 the guest
// executes to Xen, which sends a synchronous vm_event before the guest sees anything. This
// command checks that fact with nothing of ours in the guest and no byte of its memory
// written: it turns the monitoring on through the public hypervisor interface, has the guest
// run its "activity" safety phase (three user-mode int3s, each in a child that handles its
// SIGTRAP), hands every int3 event back to the guest as the #BP it would have taken
// (inject_event, as the channel does with an int3 it does not own), and counts them.
//
// The guest is unharmed either way: an int3 Dom0 sees goes back to the guest, one it does not
// see never left. XPE2E-CHECK int3.intercepted PASS when Dom0 saw at least as many int3
// events as the guest counted SIGTRAPs.
#include <poll.h>

#include <cinttypes>
#include <cstring>

#include "xpe2e_common.hpp"

using namespace xpe2e;
using namespace xenprobes;

namespace {

// X86_EVENTTYPE_SW_EXCEPTION and the #BP vector (xen/include/public/hvm/dm_op.h).
constexpr std::uint8_t kSwException = 6, kVectorBreakpoint = 3;
constexpr std::uint32_t kNoErrorCode = ~0u;

struct Counts {
  unsigned int3 = 0, handed_back = 0, other = 0;
};

// Answers every request in the ring; an int3 goes back to the guest first.
void drain(hv::Hypervisor& hv, hv::VmEventRing& ring, DomId dom, Counts& c) {
  bool answered = false;
  for (;;) {
    auto r = ring.get_request();
    if (!r) fatal("vm_event get_request: " + r.error().what);
    if (!*r) break;
    const hv::VmEventRequest& q = **r;
    if (q.reason == hv::VmEventReason::SoftwareBreakpoint) {
      ++c.int3;
      if (c.int3 <= 8)
        say("XPE2E-INFO: int3 event: vcpu %u rip %#" PRIx64 " cs %#x length %u", q.vcpu, q.regs.rip,
            static_cast<unsigned>(q.regs.cs), q.insn_length);
      auto in = hv.inject_event(dom, VcpuId{q.vcpu}, kVectorBreakpoint, kSwException, kNoErrorCode,
                                q.insn_length ? q.insn_length : 1);
      if (in) ++c.handed_back;
      else say("XPE2E-INFO: inject_event: %s", in.error().what.c_str());
    } else {
      ++c.other;
    }
    hv::VmEventResponse rsp;
    rsp.vcpu = q.vcpu;
    rsp.reason = q.reason;
    rsp.flags = q.flags & hv::kVmEventFlagVcpuPaused;
    must(ring.put_response(rsp), "vm_event put_response");
    answered = true;
  }
  if (answered) must(ring.notify(), "vm_event notify");
}

}  // namespace

int xpe2e_intercept_main(int argc, char** argv) {
  DomId dom{0};
  int timeout_s = 120;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--domid")) dom = DomId{static_cast<std::uint32_t>(std::stoul(argv[i + 1]))};
    else if (!std::strcmp(argv[i], "--timeout")) timeout_s = std::stoi(argv[i + 1]);
    else fatal(std::string("int3-intercept: unknown option ") + argv[i]);
  }
  if (!dom.value) fatal("int3-intercept: --domid is required");
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  hv::Hypervisor& hv = *hvp;
  auto ring = must(hv.monitor_enable(dom), "monitor_enable");
  must(hv.monitor_software_breakpoint(dom, true), "monitor_software_breakpoint(on)");
  say("XPE2E-INFO: software-breakpoint monitoring on for domain %u; asking the guest for its activity phase",
      dom.value);
  must(hv.xs_write(dom_path(dom, "data/xpe2e/safety/go-1"), fmt("activity %d", timeout_s)),
       "write data/xpe2e/safety/go-1");
  Counts c;
  std::optional<std::string> res;
  const auto end = Clock::now() + std::chrono::seconds(timeout_s + 30);
  while (Clock::now() < end && !res) {
    pollfd p{ring->fd(), POLLIN, 0};
    (void)::poll(&p, 1, 100);
    drain(hv, *ring, dom, c);
    if (auto v = hv.xs_read(dom_path(dom, "data/xpe2e/safety/result-1"))) res = *v;
  }
  // Off first, then answer whatever came meanwhile, then let the ring go.
  must(hv.monitor_software_breakpoint(dom, false), "monitor_software_breakpoint(off)");
  drain(hv, *ring, dom, c);
  ring.reset();
  must(hv.monitor_disable(dom), "monitor_disable");
  say("XPE2E-INFO: guest: %s", res ? res->c_str() : "no result");
  const long traps = res ? num(kv(*res), "sigtraps") : -1;
  say("XPE2E-INFO: Dom0 saw %u int3 event(s) (handed back %u), %u other event(s); the guest counted %ld SIGTRAP(s)",
      c.int3, c.handed_back, c.other, traps);
  check("int3.phase", res && num(kv(*res), "ok") == 1, res ? *res : "no result from the guest's activity phase");
  const bool ok = check("int3.intercepted", traps > 0 && c.int3 >= static_cast<unsigned long>(traps),
                        fmt("%u int3 event(s) for %ld user-mode int3(s) the guest executed", c.int3, traps));
  say("XPE2E-PROG int3-intercept %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return ok && !g_failed ? 0 : 1;
}
