// Return probes: the per-domain trampoline, instances by stack slot, entries and returns,
// reclaiming lost instances and putting return addresses back.
#include "probe/engine_internal.hpp"

#include <cinttypes>

namespace xenprobes::probe {

namespace {

constexpr int kMaxActive = 4096;
constexpr std::size_t kMaxInstanceData = 4096;
// Where calls that lost their instance return to is remembered for this many stack slots.
constexpr std::size_t kReturnedMemory = 4096;

}  // namespace

Result<ProbeId> Engine::add_ret(DomId id, Gva addr, EntryHandler entry, ReturnHandler on_return, RetProbeOptions o) {
  if (o.maxactive > kMaxActive)
    return fail(Errc::InvalidArgument, "maxactive " + std::to_string(o.maxactive) + " is more than " +
                                           std::to_string(kMaxActive) + " instances");
  if (o.data_size > kMaxInstanceData)
    return fail(Errc::InvalidArgument, "data_size " + std::to_string(o.data_size) + " is more than " +
                                           std::to_string(kMaxInstanceData) + " bytes per call");
  XP_TRY(attach(id));
  Domain* d = XP_TRY(domain(id));
  if (d->failed) return fail(Errc::Busy, "domain " + std::to_string(id.value) + ": " + d->failed->what);
  if (d->syms) {
    // Only at a function's first instruction does [rsp] hold the return address.
    auto fn = d->syms->function_containing(addr);
    if (fn && fn->start != addr)
      return fail(Errc::InvalidArgument, hex(addr.value) + " is " + fn->name + "+" + hex(addr.value - fn->start.value) +
                                             ": a return probe goes on a function's first instruction");
  }
  unsigned maxactive = o.maxactive > 0 ? unsigned(o.maxactive) : std::max(10u, 2 * d->info.vcpus);
  std::size_t in_domain = 0;
  for (const auto& [pid, r] : probes_)
    if (r->ret && r->point->dom == id) in_domain += r->ret->instances.size();
  if (in_domain + maxactive > limits_.instances_per_domain)
    return fail(Errc::NoSpace, "domain " + std::to_string(id.value) + ": " + std::to_string(maxactive) +
                                   " more return-probe instances would make " + std::to_string(in_domain + maxactive) +
                                   ", over the session's limit of " + std::to_string(limits_.instances_per_domain) +
                                   " (SessionLimits::instances_per_domain): lower maxactive, or open the session "
                                   "with a higher limit");
  auto reg = std::make_unique<Registration>();
  reg->ret = std::make_unique<RetState>();
  reg->ret->entry = std::move(entry);
  reg->ret->on_return = std::move(on_return);
  reg->ret->instances.resize(maxactive);
  for (Instance& in : reg->ret->instances) in.data.resize(o.data_size);
  for (auto it = reg->ret->instances.rbegin(); it != reg->ret->instances.rend(); ++it) reg->ret->free.push_back(&*it);
  reg->stats.maxactive = maxactive;
  // Held across both steps: a trampoline made here is taken away again under it.
  auto hold = XP_TRY(Pause::take(*this, *d));
  bool made = false;
  XP_TRY(ensure_trampoline(*d, &made));  // before the entry can fire
  auto added = add_registration(id, addr, std::move(reg));
  if (!added) {
    // Transactional: the trampoline this registration made goes too (no other user yet).
    if (made) undo_trampoline(*d);
    return added;
  }
  if (made) d->trampoline_patch.commit();
  std::size_t total = 0;
  for (const auto& [pid, r] : probes_)
    if (r->ret && r->point->dom == id) total += r->ret->instances.size();
  d->live_returns.reserve(total);  // no allocation on the hit path
  return added;
}

Result<Gva> Engine::ensure_trampoline(Domain& d, bool* made) {
  *made = false;
  if (d.trampoline) return *d.trampoline;
  if (!d.pool)
    return fail(Errc::NotSupported, "domain " + std::to_string(d.id.value) +
                                        " has no guest module: return probes need its out-of-line area for "
                                        "the return trampoline (load the xenprobesU module in the guest)");
  auto hold = XP_TRY(Pause::take(*this, d));
  const Gva t = XP_TRY(allocate_slot(d));
  PatchSpec spec;
  spec.at = t;
  spec.on_undo = [pool = d.pool.get(), t, id = d.id] {
    if (auto r = pool->release(t); !r) XP_LOG(Warn, "domain %u: trampoline slot: %s", id.value, r.error().what.c_str());
  };
  spec.bytes.assign(kSlotSize, 0xcc);  // never executed: the vCPU always leaves from the trap
  spec.bytes[0] = d.traits.trap_byte;
  channel::TrapEntry te;
  te.addr = t;
  te.fallback = channel::TrapEntry::Fallback::Return;
  spec.trap = te;
  spec.journal = PatchSpec::Record{PatchKind::Trampoline, t, {spec.bytes[0]}, {spec.bytes[0]}, t};
  d.trampoline_patch = XP_TRY(patcher(d).apply(std::move(spec)));
  d.trampoline = t;
  *made = true;
  return t;
}

void Engine::undo_trampoline(Domain& d) {
  if (auto u = d.trampoline_patch.undo(); !u)
    XP_LOG(Error, "domain %u: cannot take the return trampoline away: %s", d.id.value, u.error().what.c_str());
  d.trampoline.reset();
}

// A call whose instance is gone but which may still return to the trampoline: its return
// address stays known, and so does its journal record (the guardian still needs it).
void Engine::remember_return(Domain& d, std::uint64_t slot, std::uint64_t ret, std::uint32_t journal) {
  std::uint64_t seq = ++d.returned_seq;
  if (auto it = d.returned.find(slot); it != d.returned.end()) forget_return(d, it);
  d.returned[slot] = Domain::Returned{ret, seq, journal};
  d.returned_order.emplace_back(slot, seq);
  while (d.returned.size() > kReturnedMemory && !d.returned_order.empty()) {
    auto [old, old_seq] = d.returned_order.front();
    d.returned_order.pop_front();
    if (auto it = d.returned.find(old); it != d.returned.end() && it->second.seq == old_seq) forget_return(d, it);
  }
  if (d.returned_order.size() > 2 * kReturnedMemory) {  // entries superseded since: compact
    std::erase_if(d.returned_order, [&](const auto& e) {
      auto it = d.returned.find(e.first);
      return it == d.returned.end() || it->second.seq != e.second;
    });
  }
}

void Engine::forget_return(Domain& d, std::map<std::uint64_t, Domain::Returned>::iterator it) {
  if (it->second.journal != ~0u) journal_->remove_return(it->second.journal);
  d.returned.erase(it);
}

void Engine::drop_instance(Domain& d, Instance& in, bool remember) {
  if (!in.live) return;
  d.live_returns.erase(in.slot.value);
  if (d.table) d.table->return_removed(d.id, in.slot);
  if (remember) {
    remember_return(d, in.slot.value, in.ret, in.journal);
  } else if (in.journal != ~0u) {
    journal_->remove_return(in.journal);
  }
  in.journal = ~0u;
  in.live = false;
  in.owner->ret->free.push_back(&in);
}

// The return address is read, and the trampoline written over it, by Dom0 through guest
// memory, or, on a stop that carries the guest's own read of the slot (Stop::stack_top: the
// guest channel with a module that writes return slots, protocol.h "Return slots written by
// the module"), by the guest module: the stop carries the write back (Stop::ret_write) and
// Dom0 maps no stack. The bookkeeping is the same either way.
void Engine::enter_return_probe(Domain& d, Registration& reg, Ctx& ctx, channel::Stop& s) {
  RetState& rs = *reg.ret;
  Regs& r = ctx.regs();
  const Gva slot{r.rsp};
  const std::uint64_t tramp = d.trampoline->value;
  const bool by_module = s.stack_top.has_value();
  Result<std::uint64_t> ret = fail(Errc::InvalidArgument, "");
  if (by_module) ret = s.ret_write ? tramp : *s.stack_top;  // a return probe before this one wrote it
  else if (auto m = hit_memory(d); m) ret = d.memory->read_u64(slot);
  else ret = std::unexpected(m.error());
  if (!ret) {
    XP_LOG_RATELIMITED(Warn, "return probe at %s: cannot read the return address at %s: %s",
                       hex(ctx.address().value).c_str(), hex(slot.value).c_str(), ret.error().what.c_str());
    reg.stats.unhandled++;
    return;
  }
  if (*ret == tramp) {
    // A tail call back into the function: its return is the tracked caller's return.
    reg.stats.untracked_calls++;
    return;
  }
  if (rs.free.empty()) reclaim_instances(d, reg);
  if (rs.free.empty()) {
    reg.stats.untracked_calls++;
    return;
  }
  Instance& in = *rs.free.back();
  rs.free.pop_back();
  std::fill(in.data.begin(), in.data.end(), std::byte{0});
  if (rs.entry) {
    int rc = rs.entry(ctx, in.data);
    if (rc != 0 || r.rip != ctx.address().value) {
      rs.free.push_back(&in);
      reg.stats.declined++;
      return;
    }
  }
  // A live instance on this slot belongs to a frame that is gone: a new call uses the slot.
  if (Instance* old = d.live_returns.find(slot.value)) {
    old->owner->stats.reclaimed++;
    drop_instance(d, *old, false);
  }
  if (auto it = d.returned.find(slot.value); it != d.returned.end()) forget_return(d, it);
  if (auto a = d.table ? d.table->return_added(d.id, slot, Gva{*ret}) : Result<void>{}; !a) {
    XP_LOG_RATELIMITED(Warn, "return probe at %s: %s", hex(ctx.address().value).c_str(), a.error().what.c_str());
    rs.free.push_back(&in);
    reg.stats.untracked_calls++;
    return;
  }
  std::uint32_t journaled = ~0u;
  if (d.journaled) {
    // Before the stack changes: the guardian puts the return address back from this.
    auto j = journal_->add_return(d.id, slot, *ret, Gva{tramp});
    if (!j) {
      if (d.table) d.table->return_removed(d.id, slot);
      rs.free.push_back(&in);
      reg.stats.untracked_calls++;
      return;
    }
    journaled = *j;
  }
  if (by_module) {
    s.ret_write = channel::Stop::RetWrite{slot.value, *ret, tramp};
  } else if (auto w = d.memory->write_u64_transient(slot, tramp); !w) {  // a kernel stack
    XP_LOG_RATELIMITED(Warn, "return probe at %s: cannot rewrite the return address at %s: %s",
                       hex(ctx.address().value).c_str(), hex(slot.value).c_str(), w.error().what.c_str());
    if (d.table) d.table->return_removed(d.id, slot);
    if (journaled != ~0u) journal_->remove_return(journaled);
    rs.free.push_back(&in);
    reg.stats.unhandled++;
    return;
  }
  in.journal = journaled;
  in.by_module = by_module;
  in.vcpu = s.vcpu;
  in.owner = &reg;
  in.slot = slot;
  in.ret = *ret;
  in.live = true;
  d.live_returns.insert(slot.value, &in);
}

// The handlers after a return probe's entry in the same stop (an XP on the same point, a second
// return probe) see and change the slot as they would had Dom0 written the trampoline there at
// once: one that touches it has Dom0 make the write now, and the guest is asked for none.
Result<void> Engine::settle_ret_write(Domain& d, std::uint64_t va, std::uint64_t len) {
  if (!hit_stop_ || hit_stop_->domain != d.id || !hit_stop_->ret_write || len == 0) return {};
  const channel::Stop::RetWrite w = *hit_stop_->ret_write;
  const std::uint64_t last = len - 1 > ~va ? ~std::uint64_t{0} : va + (len - 1);
  if (last < w.slot || va > w.slot + 7) return {};
  XP_TRY(hit_memory(d));
  XP_TRY(d.memory->write_u64_transient(Gva{w.slot}, w.value));
  hit_stop_->ret_write.reset();
  hit_stop_->stack_top = w.value;  // what the slot holds now, for a later return probe's entry
  return {};
}

channel::Verdict Engine::hit_trampoline(Domain& d, channel::Stop& s) {
  Regs& r = s.regs;
  // The function's ret popped the trampoline's address from the slot right below rsp.
  const std::uint64_t slot = r.rsp - 8;
  if (Instance* found = d.live_returns.find(slot)) {
    Instance& in = *found;
    Registration& reg = *in.owner;
    r.rip = in.ret;
    if (reg.enabled && reg.ret->on_return) {
      reg.stats.returns++;
      Ctx ctx(*this, d, s, r, reg.point->addr);
      reg.ret->on_return(ctx, in.data);
    }
    if (in.journal != ~0u) {
      returned_records_.emplace_back(d.id, in.journal);
      in.journal = ~0u;
    }
    drop_instance(d, in, false);
    return channel::Verdict::Resume;
  }
  if (auto it = d.returned.find(slot); it != d.returned.end()) {
    r.rip = it->second.ret;  // its instance is gone (unregistered or reclaimed): no handler
    if (it->second.journal != ~0u) returned_records_.emplace_back(d.id, it->second.journal);
    d.returned.erase(it);
    return channel::Verdict::Resume;
  }
  // Nothing of ours returns from here: the call's instance was reclaimed and its return
  // address forgotten since, or the guest jumped here on its own. The trap byte stays, so
  // answering "not ours" would stop the vCPU here again, forever. As Linux's rethook does
  // (BUG_ON on a return address it cannot find), the task cannot go on: it resumes at
  // address 0, so the guest kernel's own oops names it, once, and the vCPU is free.
  ++d.lost_returns;
  XP_LOG_RATELIMITED(
      Error,
      "domain %u vcpu %u: reached the return trampoline with rsp %s, which no call of ours returns to (its "
      "return address is unknown); the task is sent to address 0 so that the guest's oops reports it (lost "
      "returns in this domain: %" PRIu64 ")",
      d.id.value, s.vcpu.value, hex(r.rsp).c_str(), d.lost_returns);
  r.rip = 0;
  return channel::Verdict::Resume;
}

unsigned Engine::reclaim_instances(Domain& d, Registration& reg) {
  unsigned n = 0;
  for (Instance& in : reg.ret->instances) {
    if (!in.live) continue;
    // Its write not taken up by the guest yet: the call has not even resumed.
    if (in.by_module && d.table && d.table->return_write_pending(d.id, in.vcpu, in.slot)) continue;
    auto v = d.memory->read_u64(in.slot);
    if (v && *v == d.trampoline->value) continue;
    // Gone another way (longjmp-like, a killed task) or, rarely, an interrupt frame now
    // covers a slot whose ret already ran: remembered, so such a return still finds its way.
    reg.stats.reclaimed++;
    drop_instance(d, in, true);
    ++n;
  }
  return n;
}

void Engine::restore_returns(Domain& d, Registration* only) {
  if (!d.trampoline) return;
  const std::uint64_t tramp = d.trampoline->value;
  auto wanted = [&](const Instance& in) { return in.live && (!only || in.owner == only); };
  // A vCPU that already returned to the trampoline but has not trapped yet goes straight on.
  for (unsigned v = 0; v < d.info.vcpus; ++v) {
    auto regs = hv_.get_vcpu_regs(d.id, VcpuId{v});
    if (!regs || regs->rip != tramp) continue;
    Instance* in = d.live_returns.find(regs->rsp - 8);
    if (!in || !wanted(*in)) continue;
    regs->rip = in->ret;
    if (auto w = hv_.set_vcpu_regs(d.id, VcpuId{v}, *regs); !w) {
      XP_LOG(Error, "domain %u vcpu %u: cannot move it off the trampoline: %s", d.id.value, v, w.error().what.c_str());
      continue;  // the instance stays remembered below
    }
    in->owner->stats.unhandled++;
    drop_instance(d, *in, false);
  }
  std::vector<Instance*> live;
  d.live_returns.for_each([&](std::uint64_t, Instance* in) {
    if (wanted(*in)) live.push_back(in);
  });
  for (Instance* in : live) {
    // A write the guest has not taken yet is withdrawn: the slot keeps its return address.
    if (in->by_module && d.table && d.table->cancel_return_write(d.id, in->vcpu, in->slot)) {
      drop_instance(d, *in, false);
      continue;
    }
    auto v = d.memory->read_u64(in->slot);
    bool restored = false;
    if (v && *v == tramp) {
      if (auto w = d.memory->write_u64_transient(in->slot, in->ret); w) restored = true;
      else
        XP_LOG(Error, "domain %u: cannot restore the return address at %s: %s", d.id.value, hex(in->slot.value).c_str(),
               w.error().what.c_str());
    }
    // Not restored: the trampoline (kept while attached) still knows where it returns.
    drop_instance(d, *in, !restored);
  }
}

}  // namespace xenprobes::probe
