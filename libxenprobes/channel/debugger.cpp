#include "common/hex.hpp"
#include "channel/debugger.hpp"

#include <cinttypes>
#include <cstdio>

#include "channel/eligibility.hpp"
#include "common/log.hpp"

namespace xenprobes::channel {
namespace {}  // namespace

Result<std::unique_ptr<DebuggerChannel>> DebuggerChannel::open(hv::Hypervisor& hv) {
  XP_TRY(debugger_host_eligible(XP_TRY(hv.capabilities())));
  auto port = hv.evtchn_bind_virq(hv::kVirqDebugger);
  if (!port) {
    if (port.error().code == Errc::Exists)
      return fail(Errc::Busy,
                  "VIRQ_DEBUGGER is already bound by another process on this host (one binder per "
                  "host: another xenprobes program or gdbsx); stop it or use another channel");
    return std::unexpected(port.error());
  }
  return std::unique_ptr<DebuggerChannel>(new DebuggerChannel(hv, *port));
}

DebuggerChannel::~DebuggerChannel() {
  for (auto& [dom, a] : domains_) best_effort(hv_.set_debugging(dom, false), "debugger channel: clearing debugging");
  best_effort(hv_.evtchn_unbind(port_), "debugger channel: unbinding VIRQ_DEBUGGER");
}

Result<void> DebuggerChannel::attach(DomId dom) {
  if (domains_.contains(dom)) return {};
  hv::DomainInfo info = XP_TRY(hv_.domain_info(dom));
  XP_TRY(debugger_domain_eligible(info));
  XP_TRY(hv_.set_debugging(dom, true));
  domains_[dom] = Attached{info.vcpus};
  return {};
}

Result<void> DebuggerChannel::detach(DomId dom) {
  auto it = domains_.find(dom);
  if (it == domains_.end()) return {};
  // What still fails after three tries is reported below, with the count.
  for (int attempt = 0; attempt < 3 && it->second.owed > 0; ++attempt)
    best_effort(pay(dom, it->second), "debugger channel: releasing pause references");
  if (it->second.owed > 0)
    XP_LOG(Error, "domain %u: %u pause references could not be released", dom.value, it->second.owed);
  domains_.erase(it);
  auto r = hv_.set_debugging(dom, false);
  if (!r && r.error().code != Errc::NoSuchDomain) return r;
  return {};
}

Result<unsigned> DebuggerChannel::process(StopSink& sink) {
  // The event loop has already unmasked the VIRQ (EventPorts::take): a stop that lands after
  // this look raises it again. It says nothing of which domain stopped: every one is looked at.
  unsigned handled = 0;
  for (auto it = domains_.begin(); it != domains_.end();) {
    const DomId dom = it->first;
    handled += XP_TRY(process_domain(dom, sink));
    it = domains_.upper_bound(dom);
  }
  return handled;
}

Result<unsigned> DebuggerChannel::process_domain(DomId dom, StopSink& sink) {
  auto it = domains_.find(dom);
  if (it == domains_.end()) return 0u;
  auto n = scan(dom, it->second, sink, true);
  if (!n && n.error().code == Errc::NoSuchDomain) {  // died under us: nothing left to resume
    domains_.erase(dom);
    return 0u;
  }
  if (!n) return n;
  if (auto a = domains_.find(dom); a != domains_.end() && a->second.given_up) domains_.erase(a);
  return n;
}

Result<unsigned> DebuggerChannel::flush(DomId dom, StopSink& sink) {
  auto it = domains_.find(dom);
  if (it == domains_.end()) return 0u;
  auto n = scan(dom, it->second, sink, false);
  if (n && it->second.given_up) domains_.erase(it);
  return n;
}

Result<void> DebuggerChannel::pay(DomId dom, Attached& a) {
  while (a.owed > 0) {
    XP_TRY(hv_.unpause(dom));
    journal_owed(dom, --a.owed);
  }
  return {};
}

Result<unsigned> DebuggerChannel::scan(DomId dom, Attached& a, StopSink& sink, bool require_paused) {
  XP_TRY(pay(dom, a));
  if (require_paused) {
    hv::DomainInfo info = XP_TRY(hv_.domain_info(dom));
    if (!info.paused) return 0u;  // nothing stopped (a coalesced VIRQ for stops already handled)
  }
  unsigned stops = 0;
  for (unsigned v = 0; v < a.vcpus; ++v) {
    hv::VcpuRegs regs = XP_TRY(hv_.get_vcpu_regs(dom, VcpuId{v}));
    if (regs.rip == 0) continue;
    Gva trap{regs.rip - 1};
    if (!sink.owns_trap(dom, trap)) continue;
    // Nothing else leaves a vCPU one byte into an instruction we patched: this is a stop.
    XP_LOG(Debug, "domain %u vcpu %u: stop at %s", dom.value, v, hex(trap.value).c_str());
    Stop s{dom, VcpuId{v}, trap, regs};
    if (sink.on_stop(s) == Verdict::NotOurs) {
      s.regs = regs;
      s.regs.rip = trap.value;  // the byte is the original again: execute it
    }
    // Owed from the moment the vCPU no longer shows the stop: journaled before, so the
    // guardian never misses it (an extra one it skips once the domain is unpaused).
    journal_owed(dom, a.owed + 1);
    if (auto w = hv_.set_vcpu_regs(dom, VcpuId{v}, s.regs); !w) {
      journal_owed(dom, a.owed);
      return std::unexpected(w.error());
    }
    ++stops;
    ++a.owed;  // resumed: its pause reference is now ours to release
  }
  // Guest int3s (ours are ICEBPs) leave a gdbsx record and raise no VIRQ: they are looked
  // for when the domain is paused but holds none of our stops (the periodic poll finds them).
  // Every record is consumed, or later #DB stops of that vCPU would raise no VIRQ. Each one
  // is rewound and retried.
  for (bool look = stops == 0; look;) {
    auto st = hv_.gdbsx_domstatus(dom);
    if (!st) return std::unexpected(st.error());
    if (!st->vcpu) break;
    if (*st->vcpu >= a.vcpus) continue;  // hostile or stale: ignore
    hv::VcpuRegs regs = XP_TRY(hv_.get_vcpu_regs(dom, VcpuId{*st->vcpu}));
    std::uint64_t at = regs.rip - 1;
    a.foreign_retries = at == a.foreign_addr ? a.foreign_retries + 1 : 1;
    a.foreign_addr = at;
    if (a.foreign_retries > kForeignRetryLimit) {
      Error e{Errc::Busy, "domain " + std::to_string(dom.value) + ": the guest's own breakpoint at " + hex(at) +
                              " keeps firing under debugging mode; the debugger channel gives the domain up"};
      XP_LOG(Error, "%s", e.what.c_str());
      sink.on_channel_failure(dom, e);  // disarms every probe (bytes restored)
      XP_TRY(hv_.set_debugging(dom, false));
      a.given_up = true;  // the vCPU re-executes the int3 and now takes its own #BP
    }
    regs.rip = at;
    journal_owed(dom, a.owed + 1);
    if (auto w = hv_.set_vcpu_regs(dom, VcpuId{*st->vcpu}, regs); !w) {
      journal_owed(dom, a.owed);
      return std::unexpected(w.error());
    }
    ++stops;
    ++a.owed;
  }
  // One unpause per stop found, never more: an extra one would release another vCPU's
  // unhandled stop (seen on a real Xen 4.17: docs/e2e.md).
  XP_TRY(pay(dom, a));
  return stops;
}

}  // namespace xenprobes::channel
