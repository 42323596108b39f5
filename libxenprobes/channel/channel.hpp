// A channel carries probe hits from the guest to Dom0 and sends the guest on: the engine
// (probe/) decides what a hit means, the channel only finds the stopped vCPUs and resumes
// them (docs/probes.md "Choosing a channel").
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/result.hpp"
#include "hv/hypervisor.hpp"

namespace xenprobes::channel {

// One vCPU stopped on a trap byte the channel patched for the engine.
struct Stop {
  DomId domain;
  VcpuId vcpu;
  Gva trap;           // address of the trap byte the vCPU executed
  hv::VcpuRegs regs;  // as the vCPU stopped; the engine edits them for the resume
  // Agentless resume (no guest module, so no slot to run the original instruction from):
  // with Verdict::Resume and regs.rip == trap, the engine may ask the channel to have the
  // hypervisor execute these original bytes at `trap` instead. Only when
  // ChannelTraits::can_emulate; post-handlers cannot run (no stop follows the instruction).
  struct Emulate {
    std::uint8_t len = 0;                  // 1..15 bytes of the instruction in `bytes`
    std::array<std::uint8_t, 16> bytes{};  // the original instruction at `trap`
  };
  std::optional<Emulate> emulate{};
  // The u64 at regs.rsp as the guest read it for this stop (the guest channel with a module
  // that writes return slots itself, protocol.h "Return slots written by the module"); nullopt:
  // not told, read guest memory. Only a stop that carries it takes ret_write.
  std::optional<std::uint64_t> stack_top{};
  // With Verdict::Resume: the guest writes `value` at `slot` (the stop's regs.rsp before any
  // handler) if the slot still holds `expect`, instead of the engine writing guest memory.
  struct RetWrite {
    std::uint64_t slot = 0, expect = 0, value = 0;
  };
  std::optional<RetWrite> ret_write{};
};

enum class Verdict {
  Resume,   // the engine handled the stop: resume the vCPU with Stop::regs
  NotOurs,  // no trap of ours at that address (any more): let the guest re-execute it
};

// The engine side of a channel.
class StopSink {
 public:
  virtual ~StopSink() = default;
  // True when the engine has (or had, until its slot is reclaimed) a trap byte at `addr`.
  virtual bool owns_trap(DomId, Gva addr) const = 0;
  virtual Verdict on_stop(Stop&) = 0;
  // The channel can no longer serve the domain (e.g. a guest breakpoint it cannot hand back):
  // the engine must disarm every probe there before the channel lets go of the domain.
  virtual void on_channel_failure(DomId, const Error&) = 0;
};

// A trap byte the engine patched, as a channel that keeps a table of them needs it (TrapTable:
// the guest channel publishes it in the module's trap table, protocol.h). Tells the guest how
// to go on without Dom0 should Dom0 not answer.
struct TrapEntry {
  enum class Fallback {
    ResumeAt,  // resume at `resume_at` (a slot holding the original instruction, ...)
    Emulate,   // emulate `insn`: a relative branch, a near ret or a branch through a register (what the module decodes)
    Return,    // the return trampoline: the return-address table says where
    // A jump probe (protocol.h "Jump probes"): `addr` is the detour's call to the guest
    // module's jump entry (a key, never a trap byte), `resume_at` the probed address, which
    // a hit reports as its rip. The channel reports the stop with `trap` = addr.
    Jump,
    // An async jump probe's key (protocol.h "Async jump probes"): as Jump, with the record's
    // key in `insn` (len 0); its hits become records in the rings, never stops.
    AsyncJump,
    // An int3 over a jump's region while the jump is put in place: the module sends the vCPU
    // to `resume_at` (the detour) with no stop at all; `insn` holds the region's bytes.
    Redirect,
    // A short jump's island (protocol.h "Short jumps to islands"): `addr` the island (5 bytes
    // of dead padding holding the jmp rel32 to the detour), `resume_at` the detour, `insn` the
    // padding's original bytes (len 5). Never a trap byte; only on a module with the feature.
    Island,
  };
  Gva addr;
  Fallback fallback = Fallback::ResumeAt;
  Gva resume_at{0};
  std::uint8_t len = 0;        // bytes of `insn` in use
  std::uint8_t insn[15] = {};  // the original bytes at addr
  // addr in a loaded module's text: xenprobes_module_id() of that module (protocol.h "Modules
  // that go": the guest module restores nothing there once that module has gone); 0: none.
  std::uint32_t module = 0;
};

// What the engine needs to know of a channel to patch for it, read once when it attaches a
// domain (Channel::traits(); fixed for the channel's lifetime).
struct ChannelTraits {
  // The byte patched at probe points and after slot copies that need a second stop.
  std::uint8_t trap_byte = 0;
  // A stop is recognised only by where the vCPU stands (rip == trap + 1): then a vCPU must
  // never be sent to the byte after a 1-byte probed instruction, where it would look stopped
  // (the engine runs that next instruction from the slot instead).
  bool stops_found_by_rip = false;
  // The channel honours Stop::emulate (the hypervisor runs the original bytes: vm_event in
  // int3 mode), so a domain without the guest module's slots can be probed.
  bool can_emulate = false;
  // The trap is taken by the guest kernel's own int3 path (the guest module's hook): the
  // address rules refuse what that path cannot take (kernel::RuleContext::guest_channel).
  bool guest_int3 = false;
};

// The optional part of a channel that keeps a table of the engine's traps (the guest
// channel: the module's trap table and return-address table, protocol.h). Every call is made
// with the domain paused by the caller: the engine reports a trap byte before it writes it and
// after it restored it, and every return-probe instance (the stack slot it rewrote and the
// real return address) while it is live. A channel without one (Channel::trap_table() null)
// is told none of this.
class TrapTable {
 public:
  [[nodiscard]] virtual Result<void> trap_added(DomId, const TrapEntry&) = 0;
  virtual void trap_removed(DomId, Gva) = 0;
  [[nodiscard]] virtual Result<void> return_added(DomId, Gva stack_slot, Gva ret) = 0;
  virtual void return_removed(DomId, Gva stack_slot) = 0;
  // Where vCPUs were sent that may not have gone there yet (answers the guest has not taken
  // up: the guest channel's mailboxes in state DONE). A slot such a rip points into is still
  // in use. A channel without a table writes the registers itself: none.
  virtual std::vector<std::uint64_t> resumes_in_flight(DomId) const = 0;
  // A return-slot write the engine asked of the guest in an answer to vCPU v (Stop::ret_write)
  // that the guest has not taken yet: pending (a look, the guest may take it any moment), and
  // withdrawn (with the domain paused: true when the guest will never make it). A channel
  // without such writes: never pending, nothing to withdraw.
  virtual bool return_write_pending(DomId, VcpuId, Gva /*slot*/) const { return false; }
  virtual bool cancel_return_write(DomId, VcpuId, Gva /*slot*/) { return false; }

 protected:
  ~TrapTable() = default;  // owned as the Channel it is part of
};

// Whose a port fired on the hypervisor handle's event channels is (Channel::port_use): the
// domain it serves, or none when it serves every domain the channel attached (VIRQ_DEBUGGER,
// which does not say which domain stopped).
struct PortUse {
  std::optional<DomId> domain;
};

class Channel {
 public:
  virtual ~Channel() = default;
  virtual const char* name() const = 0;
  virtual ChannelTraits traits() const = 0;
  // The channel's trap table, or null when it keeps none.
  virtual TrapTable* trap_table() { return nullptr; }
  // Prepares the domain (or refuses, saying why and what would work). Patches nothing.
  [[nodiscard]] virtual Result<void> attach(DomId) = 0;
  // Undoes attach. The engine has already restored every byte and released its stops.
  [[nodiscard]] virtual Result<void> detach(DomId) = 0;
  // Pollable; readable when stops may be waiting. A channel whose events are ports bound on
  // the hypervisor handle (port_use) answers the handle's event-channel fd, which it shares
  // with the other such channels: the event loop reads which port fired and wakes its owner
  // only (channel/event_ports.hpp). The vmevent channel has an fd of its own (its rings').
  virtual int fd() const = 0;
  // The use of a port fired on the hypervisor handle when this channel bound it; nullopt for a
  // port it does not own. The channel never acknowledges (unmasks) a port itself: the event
  // loop does, in one place (EventPorts::take), before the owner looks.
  virtual std::optional<PortUse> port_use(hv::EvtchnPort) const { return std::nullopt; }
  // How often process() must run even when fd() stays quiet (0 = never): some stops raise
  // no event (a guest's own int3 under debugging mode), and some work waits for room (the
  // vmevent channel's answers while its ring is full). Read on every turn of the event loop:
  // it may change with the channel's state.
  virtual int poll_interval_ms() const = 0;
  // Finds every stop waiting in every attached domain, hands each to `sink`, resumes them.
  // Returns the number of stops handled. The event loop's look at everything: on a wake-up
  // that names no channel (a timeout, xenstore, stop()), when the channel's own fd is
  // readable, when poll_interval_ms() has passed since the last one, and for a port that
  // serves every domain.
  [[nodiscard]] virtual Result<unsigned> process(StopSink& sink) = 0;
  // process() for one attached domain (0 when it is not attached): what a port serving only
  // that domain wakes. The other domains are not looked at.
  [[nodiscard]] virtual Result<unsigned> process_domain(DomId, StopSink& sink) = 0;
  // With the domain paused by the caller: hands every vCPU stopped on one of our traps to
  // `sink` and resumes it (used before disarming, so no stop is left behind).
  [[nodiscard]] virtual Result<unsigned> flush(DomId, StopSink& sink) = 0;
  // With the domain paused by the caller: the engine no longer has a trap at `addr` (its
  // byte restored and flushed, or a patch undone). Told to every channel, with or without a
  // trap table (after TrapTable::trap_removed); one that keeps state per trap drops it (the
  // vmevent channel: the second half of a pending emulation there).
  virtual void trap_forgotten(DomId, Gva) {}
  // Test hook (the guardian's tests): forget every domain without a word to the hypervisor,
  // as a killed process would; the destructor then only releases what death releases.
  virtual void abandon() {}
};

}  // namespace xenprobes::channel
