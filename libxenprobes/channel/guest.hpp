// The guest-assisted channel (docs/probes.md "The guest channel"; the contract is
// include/xenprobes/protocol.h). The guest module hooks int3: for an address in the trap
// table Dom0 keeps in the module's control area, its hook copies the registers into the
// vCPU's mailbox, notifies an interdomain event channel and waits; Dom0 runs the handlers on
// those registers, writes the answer into the mailbox and notifies back. Per hit: no domain
// pause and no vCPU-context hypercall, one notification each way plus the acknowledgement of
// the event. Dom0 claims a hit (HIT -> CLAIMED) before any handler runs, so the handlers never
// write guest memory for a hit the module gave up on; the module waits for a claimed hit up to
// the claim bound. A hit Dom0 does not claim in time (or a claim that outlives the bound) the
// module resumes on its own, as the trap entry says (and restores the text after
// XENPROBES_DEAD_AFTER misses in a row), so a dying Dom0 leaves the guest running.
//
// The control area is guest memory mapped writable into Dom0: everything read from it is
// hostile. Its layout is read once at attach, validated and kept here; later accesses go
// through that copy only, stay inside the mapping, and read each shared field once. The
// tables are written from Dom0's own copies, never read back.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "channel/channel.hpp"
#include "guestmod/module_info.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::channel {

class GuestChannel final : public Channel, public TrapTable {
 public:
  // Binds nothing until attach: each domain brings its own port.
  explicit GuestChannel(hv::Hypervisor& hv) : hv_(hv) {}
  // Releases (protocol.h "Letting go"), unbinds and unmaps, but leaves the trap tables as they
  // are: bytes the engine did not restore (a Dom0 going away without detaching) still need
  // their entries, or the module would take them for the kernel's own int3s; it restores them
  // itself once Dom0 stops answering. After abandon() it only unbinds and unmaps.
  ~GuestChannel() override;
  GuestChannel(const GuestChannel&) = delete;
  GuestChannel& operator=(const GuestChannel&) = delete;

  const char* name() const override { return "guest"; }
  ChannelTraits traits() const override { return {.trap_byte = kInt3, .guest_int3 = true}; }
  TrapTable* trap_table() override { return this; }
  // Reads the module's keys (refusing a module that is absent, not ready, too old, or gave up
  // on Dom0, saying what would work), maps the control area writable (translated through the
  // guest's page tables), validates its header, binds the module's port and, with the domain
  // paused, says it holds the areas (header.dom0_hold = MAPPED, protocol.h "Letting go"),
  // refusing a module that began detaching.
  Result<void> attach(DomId) override;
  // Empties the tables (the engine restored every byte), gives back any hit it holds claimed
  // (detached from a handler: the module's timeout resumes it), then releases the areas
  // (header.dom0_hold = RELEASED, the last write), unbinds, unmaps. Writes nothing but the
  // release when the module no longer says `state` = ready or its header says closing (it is
  // unloading and waits for the release to free the area). Call it only after the engine
  // dropped its mappings of the domain's rings and OEA (Engine::forget does).
  Result<void> detach(DomId) override;
  // A killed process's stand-in (the tests'): the destructor then releases nothing.
  void abandon() override { abandoned_ = true; }
  // The handle's event-channel fd, shared with any other channel binding ports on the same
  // handle (the debugger channel's VIRQ). Each attached domain's port is its own: the event
  // loop wakes process_domain() for the domain whose port fired.
  int fd() const override { return hv_.evtchn_fd(); }
  std::optional<PortUse> port_use(hv::EvtchnPort) const override;
  // Every hit notifies, and the event loop acknowledges the port before the mailboxes are
  // read: no periodic poll is needed.
  int poll_interval_ms() const override { return 0; }
  Result<unsigned> process(StopSink&) override;
  Result<unsigned> process_domain(DomId, StopSink&) override;
  // Writes the entry into the module's trap table. Refuses (NotSupported, naming the channels
  // that can) an Emulate entry the module's fallback could not run, as the module's own decoder
  // (guest-module/xp_fallback.c, linked in) decides: a jmp/call through memory among them. The
  // module runs that fallback whenever Dom0 does not answer; with none it could run, the guest
  // would oops.
  Result<void> trap_added(DomId, const TrapEntry&) override;
  void trap_removed(DomId, Gva) override;
  Result<void> return_added(DomId, Gva stack_slot, Gva ret) override;
  void return_removed(DomId, Gva stack_slot) override;
  Result<unsigned> flush(DomId, StopSink&) override;
  // Answers the module has not taken up yet (state DONE with the seq answered: rip = the
  // answer's), and each hit whose handlers are running (claimed: the vCPU resumes at the answer
  // being made or, should the claim outlive its bound, at the entry's fallback; both the trap
  // and that fallback are reported).
  std::vector<std::uint64_t> resumes_in_flight(DomId) const override;
  // protocol.h "Return slots written by the module": mailbox v's ret_slot still holds `slot`
  // (the module takes a request by exchanging it with 0), and its withdrawal by a
  // compare-and-swap to 0.
  bool return_write_pending(DomId, VcpuId, Gva slot) const override;
  bool cancel_return_write(DomId, VcpuId, Gva slot) override;

  static constexpr std::uint8_t kInt3 = 0xcc;
  // How many of the latest removals of traps in text a late hit is answered for (Stats::retired).
  static constexpr std::size_t kRetiredTraps = 16384;

  // What the module counts in the header (reported, never relied on).
  struct ModuleCounters {
    std::uint64_t hits = 0, timeouts = 0, foreign = 0;
    std::uint64_t nested = 0;     // jump hits inside the module's own hook
    std::uint64_t async_bad = 0;  // async jump hits whose key or specs it refused
    // Hits it did not notify because dom0_polling was set (protocol.h "Spinning"; Stats::
    // unnotified counts the other way: Dom0's answers to a spinning module).
    std::uint64_t notify_skipped = 0;
    // How long its vCPUs waited for Dom0's answers with interrupts off (protocol.h,
    // header.wait_ns): in all and the longest, in nanoseconds. 0 from a module before them.
    std::uint64_t wait_ns = 0, wait_max_ns = 0;
    // Hits it resumed without Dom0 because their CPU's waiting budget was spent (protocol.h
    // "Waiting budget"): no handler ran for them. 0 from a module before the budget.
    std::uint64_t over_budget = 0;
    // Return-slot writes it refused (protocol.h "Return slots written by the module": the slot
    // did not hold the return address Dom0 recorded, or the answer broke another rule); a u32
    // that wraps. 0 from a module without the feature.
    std::uint32_t ret_refused = 0;
    bool dom0_gone = false;
  };
  [[nodiscard]] Result<ModuleCounters> module_counters(DomId) const;
  // Dom0's side: answers written; hits refused (a trap not ours, rip != trap, a seq already
  // answered or one a late answer may have overwritten); hits the module abandoned before Dom0
  // could claim them (no handler ran); answers dropped because the module gave up on a
  // claimed hit (past the claim bound) while the handlers ran.
  struct Stats {
    std::uint64_t answered = 0, rejected = 0, abandoned = 0, late = 0;
    // Answers not notified: the module was spinning on its mailbox (protocol.h "Spinning").
    std::uint64_t unnotified = 0;
    // Hits on a trap in text Dom0 had removed (byte restored, entry cleared) while the vCPU
    // stood between its table lookup and its mailbox (paused there by Xen): answered at once
    // with the vCPU's own registers, to run the original instruction; no handler runs.
    std::uint64_t retired = 0;
    // Looks at the domain's mailboxes (process, process_domain, flush, the spin's polls).
    std::uint64_t looks = 0;
    // Answers that asked the module to write a return slot (protocol.h "Return slots written
    // by the module"): Dom0 mapped no stack for them.
    std::uint64_t ret_writes = 0;
  };
  Stats stats(DomId) const;
  // Tells every attached domain's module that Dom0 polls the mailboxes (on) or no longer does
  // (off: then call process() once more, for hits published before the module saw the clear).
  void set_polling(bool on);
  std::size_t traps(DomId) const;  // live entries in the trap table

 private:
  // The header's layout as validated at attach; never re-read from the area.
  struct Layout {
    std::uint32_t nr_mailboxes = 0, mailbox_offset = 0;
    std::uint32_t trap_capacity = 0, trap_offset = 0;
    std::uint32_t ret_capacity = 0, ret_offset = 0;
  };
  struct Attached {
    hv::ForeignMapping map;
    Layout layout;
    hv::EvtchnPort port = 0;
    std::vector<guestmod::OeaArea> oea;  // the module's areas as last read
    // The module emulates jmp/call through a register (one that publishes module-text: both
    // came in the same version; an older one would oops the guest on such a fallback).
    bool register_branches = false;
    std::optional<Gva> jump_entry;  // the module's jump entry: it makes jump probes
    // The module writes return slots itself (features: XENPROBES_FEATURE_RET_WRITE): hits carry
    // Stop::stack_top and answers Stop::ret_write (protocol.h "Return slots written by the module").
    bool ret_write = false;
    // The module knows short jumps to islands (features: XENPROBES_FEATURE_JUMP_ISLAND, with
    // jump-entry): Island entries and REDIRECT regions of 2..4 bytes.
    bool islands = false;
    std::vector<xenprobes_trap> traps;                   // sorted by addr: what the shared table is written from
    std::vector<xenprobes_ret> rets;                     // index = entry in the shared table; slot 0 = free
    std::vector<std::optional<std::uint32_t>> answered;  // per mailbox: the last seq answered
    std::vector<std::uint64_t> answered_rip;             // per mailbox: where that answer sends it
    std::vector<std::optional<std::uint32_t>> rejected;  // per mailbox: the last seq refused (logged once)
    // Per mailbox, while Dom0 holds its claim (the handlers run): the hit, and where the module
    // resumes it should the claim outlive the bound (0: not a slot address Dom0 knows).
    struct Claim {
      std::uint32_t seq = 0;
      std::uint64_t trap = 0, fallback = 0;
    };
    std::vector<std::optional<Claim>> claimed;
    // Per mailbox, after a late answer: hits with a seq in (after, upto] may carry Dom0's late
    // registers instead of the module's; they are refused (protocol.h, Dom0 side e.).
    struct SeqRange {
      std::uint32_t after = 0, upto = 0;
    };
    std::vector<SeqRange> overwritten;
    // Traps in text removed from the table lately (the original byte back), oldest first, at
    // most kRetiredTraps: a vCPU that looked one up before the domain was paused for its
    // removal publishes its hit after the pause ("Retired traps" in guest_hits.cpp).
    std::deque<std::uint64_t> retired_order;
    std::map<std::uint64_t, unsigned> retired;  // address -> how many times in retired_order
    Stats stats;
  };

  Attached* find(DomId);
  const Attached* find(DomId) const;
  // Handles every mailbox of the domain in state HIT (claim, handlers, answer); returns how
  // many were answered. The domain may be detached from inside a handler: looked up again
  // after each one.
  Result<unsigned> scan(DomId, StopSink&);
  // Mailbox v inside the mapping (v < layout.nr_mailboxes, checked by the caller).
  static std::byte* mailbox_at(const Attached&, std::uint32_t v);
  void write_trap(Attached&, std::size_t index);
  void write_ret(Attached&, std::size_t index);
  void set_nr_traps(Attached&, std::size_t n);
  // Inside one of the module's OEA areas (re-read once when not: the area may be new).
  bool in_oea(DomId, Attached&, Gva);
  // protocol.h "Letting go": MAPPED at attach (paused; refused once the module is leaving),
  // RELEASED as the last write, which also unmaps the area (no mapping left to write with).
  Result<void> hold(DomId, const hv::ForeignMapping&, const guestmod::GuestChannelInfo&);
  static void release(Attached&);
  static void retire(Attached&, const xenprobes_trap&);

  hv::Hypervisor& hv_;
  std::map<DomId, Attached> domains_;
  bool abandoned_ = false;
};

}  // namespace xenprobes::channel
