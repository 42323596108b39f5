// The guest channel's hits: every mailbox in state HIT claimed, handed to the engine and
// answered (process, flush, scan), and the resumes still in flight.
#include <atomic>
#include <cstddef>
#include <cstring>

#include "channel/guest_internal.hpp"
#include "common/hex.hpp"
#include "common/log.hpp"

namespace xenprobes::channel {
namespace {

hv::VcpuRegs from_mailbox(const xenprobes_regs& x) {
  hv::VcpuRegs r;
  r.rax = x.rax, r.rbx = x.rbx, r.rcx = x.rcx, r.rdx = x.rdx, r.rsi = x.rsi, r.rdi = x.rdi;
  r.rbp = x.rbp, r.rsp = x.rsp, r.r8 = x.r8, r.r9 = x.r9, r.r10 = x.r10, r.r11 = x.r11;
  r.r12 = x.r12, r.r13 = x.r13, r.r14 = x.r14, r.r15 = x.r15;
  r.rip = x.rip;
  r.rflags = x.rflags;
  r.cs = static_cast<std::uint16_t>(x.cs);
  r.ss = static_cast<std::uint16_t>(x.ss);
  // The hook serves kernel-mode int3s only (cs cannot tell: a 64-bit PV kernel runs with RPL 3).
  r.kernel_mode = true;
  return r;
}

// cs/ss go back as the module wrote them: it never takes them from Dom0 anyway.
xenprobes_regs to_mailbox(const hv::VcpuRegs& r, const xenprobes_regs& as_read) {
  return xenprobes_regs{r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp,    r.r8,       r.r9,
                        r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rip, r.rflags, as_read.cs, as_read.ss};
}

constexpr std::uint64_t kRejectWarnings = 10;  // per domain, of refused hits and of late answers each

}  // namespace

// ---- hits ---------------------------------------------------------------------------

Result<unsigned> GuestChannel::process(StopSink& sink) {
  unsigned handled = 0;
  for (auto it = domains_.begin(); it != domains_.end();) {
    const DomId dom = it->first;
    handled += XP_TRY(process_domain(dom, sink));
    it = domains_.upper_bound(dom);  // handlers may have detached domains
  }
  return handled;
}

// The event loop has already unmasked the domain's port (EventPorts::take): a hit published
// after this look raises it again.
Result<unsigned> GuestChannel::process_domain(DomId dom, StopSink& sink) {
  if (!find(dom)) return 0u;
  auto n = scan(dom, sink);
  if (n || n.error().code != Errc::NoSuchDomain) return n;
  // Died under us: nothing left to resume. The engine forgets it on @releaseDomain.
  if (auto gone = domains_.find(dom); gone != domains_.end()) {
    best_effort(hv_.evtchn_unbind(gone->second.port), "guest channel: unbinding a dead domain's port");
    domains_.erase(gone);
  }
  return 0u;
}

std::optional<PortUse> GuestChannel::port_use(hv::EvtchnPort port) const {
  for (const auto& [dom, a] : domains_)
    if (a.port == port) return PortUse{dom};
  return std::nullopt;
}

Result<unsigned> GuestChannel::flush(DomId dom, StopSink& sink) {
  if (!find(dom)) return 0u;
  return scan(dom, sink);
}

Result<unsigned> GuestChannel::scan(DomId dom, StopSink& sink) {
  if (Attached* a = find(dom)) ++a->stats.looks;
  unsigned answered = 0;
  bool notify = false;  // an answer, or a hit given back: the module should look now
  for (std::uint32_t v = 0;; ++v) {
    Attached* a = find(dom);
    if (!a || v >= a->layout.nr_mailboxes) break;
    std::byte* mb = mailbox_at(*a, v);
    if (state_of(mb).load(std::memory_order_acquire) != XENPROBES_MBOX_HIT) continue;

    // One read of each field; only these copies are used from here on.
    struct Hit {
      std::uint32_t seq;
      std::uint64_t trap;
      xenprobes_regs regs;
      std::uint64_t stack_top;  // 0: not told (protocol.h "Return slots written by the module")
    };
    auto read_hit = [&] {
      Hit h;
      h.seq = load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, seq));
      h.trap = load<std::uint64_t>(mb + offsetof(xenprobes_mailbox, trap));
      std::memcpy(&h.regs, mb + offsetof(xenprobes_mailbox, regs), sizeof h.regs);
      h.stack_top = a->ret_write ? load<std::uint64_t>(mb + offsetof(xenprobes_mailbox, stack_top)) : 0;
      return h;
    };
    auto refusal = [&](const Hit& h) -> const char* {
      if (a->answered[v] && *a->answered[v] == h.seq) return "a seq already answered";
      const Attached::SeqRange& o = a->overwritten[v];
      if (h.seq - o.after - 1u < o.upto - o.after) return "its registers may be a late answer's";
      const auto t = find_trap(a->traps, h.trap);
      // A jump probe's hit carries the probed address as its rip, and its key as its trap.
      if (t != a->traps.end() && t->flags == XENPROBES_TRAP_JUMP) {
        if (h.regs.rip != t->fallback) return "regs.rip is not the jump probe's address";
        return nullptr;
      }
      if (t != a->traps.end() && t->flags == XENPROBES_TRAP_REDIRECT) return "a jump's redirect, which makes no hit";
      if (t != a->traps.end() && t->flags == (XENPROBES_TRAP_JUMP | XENPROBES_TRAP_ASYNC))
        return "an async probe's key, whose hits are ring records";
      if (h.regs.rip != h.trap) return "regs.rip is not the trap address";
      // Owned: disarmed, not flushed yet. Retired: see below.
      if (t == a->traps.end() && !sink.owns_trap(dom, Gva{h.trap}) && !a->retired.contains(h.trap))
        return "not a trap of ours";
      return nullptr;
    };
    auto reject = [&](const Hit& h, const char* why) {
      if (a->rejected[v] == h.seq) return;  // logged and counted once per hit
      a->rejected[v] = h.seq;
      // A hostile guest can make these as fast as it likes: the first few are warnings.
      if (++a->stats.rejected <= kRejectWarnings)
        XP_LOG(Warn, "%s vcpu %u: mailbox hit %u at %s ignored: %s%s", dom_str(dom).c_str(), v, h.seq,
               hex(h.trap).c_str(), why, a->stats.rejected == kRejectWarnings ? " (further ones: debug log)" : "");
      else
        XP_LOG(Debug, "%s vcpu %u: mailbox hit %u at %s ignored: %s", dom_str(dom).c_str(), v, h.seq,
               hex(h.trap).c_str(), why);
    };

    // Refused before the claim: left alone, without a write; the module's timeout resumes the
    // vCPU as its trap entry says.
    Hit h = read_hit();
    if (const char* why = refusal(h)) {
      reject(h, why);
      continue;
    }
    // The claim. Failing, the module gave up on the hit first: no handler may run for it (its
    // writes to guest memory would land on a stack that moved on).
    std::uint32_t expected = XENPROBES_MBOX_HIT;
    if (!state_of(mb).compare_exchange_strong(expected, XENPROBES_MBOX_CLAIMED, std::memory_order_acquire,
                                              std::memory_order_relaxed)) {
      ++a->stats.abandoned;
      continue;
    }
    // Under the claim the module changes nothing in the mailbox (until the claim bound). The
    // hit may be a newer one than read above (the module abandoned that one and published
    // this one in between): what counts is read now, and checked again.
    h = read_hit();
    if (const char* why = refusal(h)) {
      expected = XENPROBES_MBOX_CLAIMED;
      (void)state_of(mb).compare_exchange_strong(expected, XENPROBES_MBOX_HIT, std::memory_order_release,
                                                 std::memory_order_relaxed);
      notify = true;
      reject(h, why);
      continue;
    }

    std::uint64_t fallback = 0;
    bool jump = false;
    if (auto t = find_trap(a->traps, h.trap); t != a->traps.end()) {
      if (t->flags == XENPROBES_TRAP_FALLBACK) fallback = t->fallback;
      jump = t->flags == XENPROBES_TRAP_JUMP;
    }
    // Retired traps. The engine removes a trap with the domain paused: the byte restored,
    // then (after a flush of the mailboxes) the entry cleared. A vCPU that Xen paused inside
    // the module's int3 hook after its table lookup, before its mailbox write, publishes the
    // hit after the pause, for a trap that is gone. Left alone, it would wait out the
    // module's timeout with interrupts off and count as a timeout (XENPROBES_DEAD_AFTER of
    // those in a row and the module gives up on Dom0). Such a hit, on a trap in text removed
    // lately, is answered at once with the vCPU's own registers at the trap address: the
    // original instruction is back there, as kprobes rewinds an int3 whose byte is gone. No
    // handler runs: the probe is gone.
    const bool retired = find_trap(a->traps, h.trap) == a->traps.end() && !sink.owns_trap(dom, Gva{h.trap}) &&
                         a->retired.contains(h.trap);
    a->claimed[v] = Attached::Claim{h.seq, h.trap, fallback};
    Stop s{dom, VcpuId{v}, Gva{h.trap}, from_mailbox(h.regs)};
    if (h.stack_top) s.stack_top = h.stack_top;  // only from a module that writes return slots
    if (retired) {
      ++a->stats.retired;
      XP_LOG(Debug,
             "%s vcpu %u: hit %u at %s: a trap removed while the vCPU was in the module's hook: the "
             "original instruction runs",
             dom_str(dom).c_str(), v, h.seq, hex(h.trap).c_str());
    } else if (sink.on_stop(s) == Verdict::NotOurs) {
      s.regs = from_mailbox(h.regs);
      // An int3's byte is the original again: execute it. A jump's hit goes on in its detour.
      if (!jump) s.regs.rip = h.trap;
      s.ret_write.reset();
    }
    a = find(dom);
    if (!a) break;  // detached by a handler (which gave the claim back)
    a->claimed[v].reset();
    mb = mailbox_at(*a, v);
    std::atomic_ref<std::uint32_t> state = state_of(mb);
    // Still ours? The module gives a claimed hit up only past the claim bound (Dom0 stalled
    // that long); nothing written then.
    auto late = [&] {
      // As common as hung handlers, or as a hostile guest likes: the first few are warnings.
      if (++a->stats.late <= kRejectWarnings)
        XP_LOG_RATELIMITED(
            Warn,
            "%s vcpu %u: hit %u at %s: the guest module gave up on it (its claim outlived the claim "
            "bound) before the handlers finished: answer dropped, guest memory they wrote stays written%s",
            dom_str(dom).c_str(), v, h.seq, hex(h.trap).c_str(),
            a->stats.late == kRejectWarnings ? " (further ones: debug log)" : "");
      else
        XP_LOG(Debug, "%s vcpu %u: hit %u at %s: late answer dropped", dom_str(dom).c_str(), v, h.seq,
               hex(h.trap).c_str());
    };
    if (state.load(std::memory_order_acquire) != XENPROBES_MBOX_CLAIMED ||
        load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, seq)) != h.seq) {
      late();
      continue;
    }
    const xenprobes_regs out = to_mailbox(s.regs, h.regs);
    std::memcpy(mb + offsetof(xenprobes_mailbox, regs), &out, sizeof out);
    // The module zeroed ret_slot in step 1: written only for an answer that asks for the write,
    // and only for the hit's own return slot (the module checks that too).
    if (s.ret_write && s.stack_top && s.ret_write->slot == h.regs.rsp) {
      store<std::uint64_t>(mb + offsetof(xenprobes_mailbox, ret_expect), s.ret_write->expect);
      store<std::uint64_t>(mb + offsetof(xenprobes_mailbox, ret_value), s.ret_write->value);
      store<std::uint64_t>(mb + offsetof(xenprobes_mailbox, ret_slot), s.ret_write->slot);
      ++a->stats.ret_writes;
    } else if (s.ret_write) {
      XP_LOG_RATELIMITED(Error, "%s vcpu %u: hit %u: a return-slot write for %s, not the hit's rsp %s: not asked",
                         dom_str(dom).c_str(), v, h.seq, hex(s.ret_write->slot).c_str(), hex(h.regs.rsp).c_str());
    }
    store<std::uint32_t>(mb + offsetof(xenprobes_mailbox, answer_seq), h.seq);
    expected = XENPROBES_MBOX_CLAIMED;
    if (!state.compare_exchange_strong(expected, XENPROBES_MBOX_DONE, std::memory_order_release,
                                       std::memory_order_relaxed)) {
      // The bound passed between the check and the swap: the module resumed on its own and
      // may have published further hits, whose registers the write above may have hit. Those
      // are the hits up to the seq read now: every store above is visible before this load (a
      // full fence; x86's locked cmpxchg is one anyway), and the module writes a hit's seq
      // before its registers, so hits after that seq were written after ours.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      a->overwritten[v] = Attached::SeqRange{h.seq, load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, seq))};
      late();
      continue;
    }
    a->answered[v] = h.seq;
    // A jump's hit resumes in its detour (the slot at the key) whatever rip says.
    a->answered_rip[v] = jump ? h.trap : out.rip;
    ++a->stats.answered;
    ++answered;
    // A module spinning on this mailbox sees DONE without a notification (protocol.h
    // "Spinning"): DONE is stored (the locked cmpxchg), then spinning is read; the module stores
    // spinning = 0 before its last look at state, so one of the two sees the other.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, spinning)) == 0) notify = true;
    else ++a->stats.unnotified;
  }
  if (notify) {
    Attached* a = find(dom);
    if (a) XP_TRY(hv_.evtchn_notify(a->port));  // once for all of them
  }
  return answered;
}

bool GuestChannel::return_write_pending(DomId dom, VcpuId v, Gva slot) const {
  const Attached* a = find(dom);
  if (!a || !a->ret_write || v.value >= a->layout.nr_mailboxes || !slot.value) return false;
  return load<std::uint64_t>(mailbox_at(*a, v.value) + offsetof(xenprobes_mailbox, ret_slot),
                             std::memory_order_acquire) == slot.value;
}

bool GuestChannel::cancel_return_write(DomId dom, VcpuId v, Gva slot) {
  Attached* a = find(dom);
  if (!a || !a->ret_write || v.value >= a->layout.nr_mailboxes || !slot.value) return false;
  std::byte* mb = mailbox_at(*a, v.value);
  std::uint64_t expected = slot.value;
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(mb + offsetof(xenprobes_mailbox, ret_slot)))
      .compare_exchange_strong(expected, 0, std::memory_order_acq_rel, std::memory_order_acquire);
}

std::vector<std::uint64_t> GuestChannel::resumes_in_flight(DomId dom) const {
  std::vector<std::uint64_t> out;
  const Attached* a = find(dom);
  if (!a) return out;
  for (std::uint32_t v = 0; v < a->layout.nr_mailboxes; ++v) {
    // Our own bookkeeping, not the shared state: a guest cannot make a claimed vCPU look gone.
    if (const auto& c = a->claimed[v]) {
      out.push_back(c->trap);
      if (c->fallback) out.push_back(c->fallback);
    }
    if (!a->answered[v]) continue;
    const std::byte* mb = mailbox_at(*a, v);
    // The guest could fake DONE to keep slots busy: it only delays their reuse.
    if (load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, state), std::memory_order_acquire) ==
            XENPROBES_MBOX_DONE &&
        load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, answer_seq)) == *a->answered[v])
      out.push_back(a->answered_rip[v]);
  }
  return out;
}

}  // namespace xenprobes::channel
