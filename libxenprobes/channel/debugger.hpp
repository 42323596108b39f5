// The VIRQ_DEBUGGER channel: the paper's path, made to work on Xen 4.17 (docs/probes.md
// "The VIRQ_DEBUGGER channel"). Debugging mode on the domain, ICEBP (0xF1) as the trap byte: with
// CONFIG_GDBSX every ICEBP in guest kernel mode pauses the whole domain and raises the global
// VIRQ_DEBUGGER (an int3 would pause it silently). The VIRQ carries nothing and coalesces, so
// each event is answered by scanning every vCPU of every attached domain for
// `rip == trap + 1`, and exactly one unpause is given per stop found.
#pragma once

#include <map>
#include <memory>

#include "channel/channel.hpp"
#include "guardian/journal.hpp"

namespace xenprobes::channel {

class DebuggerChannel final : public Channel {
 public:
  // Binds VIRQ_DEBUGGER (one binder per host) and checks the hypervisor has CONFIG_GDBSX;
  // either failure is refused with the cause and the alternatives.
  static Result<std::unique_ptr<DebuggerChannel>> open(hv::Hypervisor&);
  ~DebuggerChannel() override;

  const char* name() const override { return "debugger"; }
  ChannelTraits traits() const override { return {.trap_byte = kIcebp, .stops_found_by_rip = true}; }
  Result<void> attach(DomId) override;
  Result<void> detach(DomId) override;
  // The handle's event-channel fd (shared with the guest channel's ports); the VIRQ's port
  // serves every attached domain.
  int fd() const override { return hv_.evtchn_fd(); }
  std::optional<PortUse> port_use(hv::EvtchnPort p) const override {
    return p == port_ ? std::optional<PortUse>(PortUse{}) : std::nullopt;
  }
  int poll_interval_ms() const override { return 10; }
  Result<unsigned> process(StopSink&) override;
  Result<unsigned> process_domain(DomId, StopSink&) override;
  Result<unsigned> flush(DomId, StopSink&) override;
  void abandon() override { domains_.clear(); }
  // The guardian's journal: the pause references owed are kept there (see pay()).
  void set_journal(guardian::Journal* j) { journal_ = j; }

  static constexpr std::uint8_t kIcebp = 0xf1;
  // A guest's own int3 (text_poke_bp, an in-guest kprobe) stops the domain too under debugging
  // mode, and Xen offers no way to hand #BP back to a PV guest: the vCPU is rewound onto the
  // int3 and retried. After this many retries in a row at one address the channel gives the
  // domain up (the engine disarms, debugging mode goes off, the guest takes its own #BP).
  static constexpr unsigned kForeignRetryLimit = 500;

 private:
  struct Attached {
    unsigned vcpus = 0;
    std::uint64_t foreign_addr = 0;
    unsigned foreign_retries = 0;
    bool given_up = false;
    // Stops already resumed whose pause reference is not released yet (an unpause failed or
    // the scan was cut short): paid before anything else on the next scan.
    unsigned owed = 0;
  };
  Result<void> pay(DomId, Attached&);
  DebuggerChannel(hv::Hypervisor& hv, hv::EvtchnPort port) : hv_(hv), port_(port) {}
  // Handles every stop in one domain; returns how many pause references it released.
  Result<unsigned> scan(DomId, Attached&, StopSink&, bool require_paused);

  hv::Hypervisor& hv_;
  hv::EvtchnPort port_;
  std::map<DomId, Attached> domains_;
  guardian::Journal* journal_ = nullptr;
  void journal_owed(DomId dom, unsigned owed) {
    if (journal_) journal_->set_owed_unpauses(dom, owed);
  }
};

}  // namespace xenprobes::channel
