// The vm_event channel: Xen's monitor ring (docs/probes.md "The vm_event channel"), for HVM and PVH guests on a
// stock hypervisor. Only the trapping vCPU pauses; the request carries the vCPU, the trap
// address and every register, and one response (SET_REGISTERS: rip = the slot) plus one
// event-channel notify resumes it.
//
// Two modes, chosen when the channel is opened:
//  - Icebp (default): the trap byte is ICEBP (0xF1), caught through debug-exception
//    monitoring. The guest's own int3s (text_poke_bp, in-guest kprobes) never leave the
//    guest; it works under QEMU TCG. Xen cannot emulate on a debug-exception answer, so a
//    slot is always needed.
//  - Int3: the trap byte is 0xCC, caught through software-breakpoint monitoring: every guest
//    int3 comes to Dom0 and the foreign ones are handed back with inject_event. Xen can run
//    the original bytes itself (EMULATE + SET_EMUL_INSN_DATA), which is what agentless
//    probing (no guest module, no slots) needs: see Stop::emulate.
// Never combined with debugging mode on one domain: debugger_attached takes every #BP/#DB
// before the monitor (Xen's debug-trap intercepts check debugging mode first), so attach refuses such a domain.
#pragma once

#include <array>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "channel/channel.hpp"
#include "guardian/journal.hpp"

namespace xenprobes::channel {

class VmEventChannel final : public Channel {
 public:
  enum class Mode { Icebp, Int3 };

  // Refuses a hypervisor without the monitor interface, saying what would work instead.
  static Result<std::unique_ptr<VmEventChannel>> open(hv::Hypervisor&, Mode = Mode::Icebp);
  ~VmEventChannel() override;
  VmEventChannel(const VmEventChannel&) = delete;
  VmEventChannel& operator=(const VmEventChannel&) = delete;

  const char* name() const override { return "vmevent"; }
  // Int3 mode: Xen can run the original bytes itself (Stop::emulate).
  ChannelTraits traits() const override {
    return {.trap_byte = mode_ == Mode::Int3 ? kInt3 : kIcebp, .can_emulate = mode_ == Mode::Int3};
  }
  Result<void> attach(DomId) override;
  // Stops the monitoring, answers every request still pending (no vCPU is left paused),
  // then disables the ring.
  Result<void> detach(DomId) override;
  int fd() const override { return epoll_fd_; }
  // 0, except while an answer waits for ring space: then process() must run again soon.
  int poll_interval_ms() const override;
  Result<unsigned> process(StopSink&) override;
  Result<unsigned> process_domain(DomId, StopSink&) override;
  Result<unsigned> flush(DomId, StopSink&) override;
  // Drops the pending emulations at that trap (see Continuation).
  void trap_forgotten(DomId, Gva) override;
  void abandon() override;

  Mode mode() const { return mode_; }
  // The guardian's journal: detach's own pause of the domain is recorded there.
  void set_journal(guardian::Journal* j) { journal_ = j; }

  // What the channel did, for tests and diagnostics.
  struct Counters {
    std::uint64_t stops = 0;     // requests handed to the sink
    std::uint64_t emulated = 0;  // answered with EMULATE (agentless resume)
    std::uint64_t two_step = 0;  // emulations that needed the registers set first
    std::uint64_t injected = 0;  // foreign traps handed back to the guest
    std::uint64_t retried = 0;   // foreign-looking traps whose byte was gone: re-executed
    std::uint64_t deferred = 0;  // answers kept back because the ring had no room
  };
  const Counters& counters() const { return counters_; }

  static constexpr std::uint8_t kIcebp = 0xf1;
  static constexpr std::uint8_t kInt3 = 0xcc;

 private:
  // An agentless resume whose registers had to be set first (SET_REGISTERS and the
  // instruction bytes share one union in the response): the vCPU was sent back onto the
  // int3 with the edited registers, and its next stop there is answered with EMULATE.
  struct Continuation {
    Gva trap;
    hv::VcpuRegs regs;
    std::array<std::uint8_t, 16> bytes{};
  };
  struct Attached {
    std::unique_ptr<hv::VmEventRing> ring;
    int fd = -1;
    std::deque<hv::VmEventResponse> outbox;  // answers that found no room in the ring yet
    bool notify_owed = false;                // responses in the ring Xen was not told about
    // By vCPU; a few each, for a vCPU interrupted on its way back that hits another one.
    std::map<unsigned, std::vector<Continuation>> continuations;
  };

  VmEventChannel(hv::Hypervisor& hv, Mode mode, int epoll_fd) : hv_(hv), mode_(mode), epoll_fd_(epoll_fd) {}
  Result<void> set_monitoring(DomId, bool on);
  Result<void> watch_fd(int fd);
  void unwatch_fd(int fd);
  // Takes every request in the domain's ring and answers it; `sink` null (detach) releases
  // every vCPU without asking anyone. `until_quiet` (the domain is paused): goes on until a
  // look after the notify finds nothing, so vCPUs that waited for ring room are answered
  // too. Returns how many requests were answered.
  Result<unsigned> drain(DomId, Attached&, StopSink*, bool until_quiet);
  hv::VmEventResponse answer(DomId, Attached&, const hv::VmEventRequest&, StopSink*);
  // A foreign trap: hands it back to the guest, or lets the vCPU re-execute when the trap
  // byte is gone from memory (the engine restored it after the trap).
  void hand_back(DomId, const hv::VmEventRequest&, std::uint8_t opcode);
  bool byte_still_there(DomId, const hv::VmEventRequest&, std::uint8_t opcode);
  // Puts an answer into the ring (or the outbox when there is no room); never loses one.
  Result<void> post(Attached&, const hv::VmEventResponse&);
  Result<void> send_outbox(Attached&);
  Result<void> notify(Attached&);

  hv::Hypervisor& hv_;
  Mode mode_;
  int epoll_fd_;
  std::map<DomId, Attached> domains_;
  std::map<int, unsigned> fd_refs_;  // a ring fd may serve several rings (the sim's does)
  Counters counters_;
  guardian::Journal* journal_ = nullptr;
};

}  // namespace xenprobes::channel
