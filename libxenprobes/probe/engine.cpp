// The engine's public surface: registration (transactional), enable/disable, removal (a
// failure keeps the registration), deferred removals, statistics and info.
#include "probe/engine_internal.hpp"

#include <cinttypes>

namespace xenprobes::probe {

namespace {

ExecMode exec_mode(x86::Plan p, bool trap_tail) {
  switch (p) {
    case x86::Plan::Boost:
    case x86::Plan::BoostRipRel: return trap_tail ? ExecMode::TrapAfter : ExecMode::Boosted;
    case x86::Plan::Skip: return ExecMode::Skipped;
    default: return ExecMode::Emulated;
  }
}

}  // namespace

Result<ProbeId> Engine::add(DomId id, Gva addr, PreHandler pre, PostHandler post, ProbeMethod method) {
  if (!pre && !post) return fail(Errc::InvalidArgument, "a probe needs a pre-handler or a post-handler");
  auto reg = std::make_unique<Registration>();
  reg->pre = std::move(pre);
  reg->post = std::move(post);
  reg->method = method;
  return add_registration(id, addr, std::move(reg));
}

Result<ProbeId> Engine::add_registration(DomId id, Gva addr, std::unique_ptr<Registration> reg) {
  XP_TRY(attach(id));
  Domain* d = XP_TRY(domain(id));
  if (d->failed) return fail(Errc::Busy, "domain " + std::to_string(id.value) + ": " + d->failed->what);
  if (d->pool && d->pool->contains(addr))
    return fail(Errc::InvalidArgument, hex(addr.value) + " is inside the out-of-line execution area");
  if (!d->pool && reg->post)
    return fail(Errc::NotSupported,
                "domain " + std::to_string(id.value) +
                    " has no guest module: without its slots the probed "
                    "instruction runs in the hypervisor's emulator and no stop follows it, so post-handlers "
                    "cannot run (load the xenprobesU module in the guest)");
  reg->id = next_id_;
  reg->requested = addr;
  {
    auto placed = XP_TRY(place(*d, addr));
    addr = placed.address;
    reg->moved_because = std::move(placed.moved_because);
  }

  auto existing = d->points.find(addr);
  if (existing == d->points.end() && d->points.size() >= limits_.points_per_domain)
    return fail(Errc::NoSpace, "domain " + std::to_string(id.value) + " has " + std::to_string(d->points.size()) +
                                   " probe points, the session's limit (SessionLimits::points_per_domain): remove "
                                   "some, or open the session with a higher limit");
  if (existing != d->points.end()) {
    // Aggregate: the point is already decoded, slotted and (maybe) armed.
    Point& p = *existing->second;
    if (reg->async || (p.jump && p.jump->async_key))
      return fail(Errc::Busy, hex(addr.value) + " already holds " +
                                  (p.jump && p.jump->async_key ? "an async probe" : "a probe") +
                                  ": an async probe has its point to itself (unregister the other first)");
    if (p.jump && reg->post)
      return fail(Errc::NotSupported, hex(addr.value) +
                                          " is a jump probe, which makes no stop after the instruction: "
                                          "post-handlers cannot run there (use a pre-handler)");
    if (!p.jump && reg->method == ProbeMethod::Jump)
      return fail(
          Errc::Busy,
          hex(addr.value) + " already holds a trap probe" +
              (p.not_jump_because.empty() ? std::string() : " (it cannot be a jump: " + p.not_jump_because + ")") +
              "; a jump probe cannot share it: unregister that one first, or ask for ProbeMethod::Fastest");
    if (reg->post && (p.in_place || p.fixup_slot))
      return fail(Errc::NotSupported, p.insn.describe() +
                                          (p.fixup_slot ? ": runs in a fixup slot, which ends in a jump back"
                                                        : ": Xen's emulator runs it in place, and no stop follows it") +
                                          (p.own_address ? " (" + p.own_address->why + ")" : std::string()) +
                                          ": post-handlers cannot run after it (use a pre-handler)");
    bool tail = reg->post && uses_slot(p) && !p.trap_tail;
    bool must_arm = !p.armed;
    if (tail || must_arm) {
      auto hold = XP_TRY(Pause::take(*this, *d));
      if (tail) XP_TRY(replace_slot(*d, p, true));
      if (must_arm) XP_TRY(arm(*d, p));
    }
    reg->point = &p;
    p.regs.push_back(reg.get());
    ProbeId rid = next_id_++;
    probes_[rid] = std::move(reg);
    return rid;
  }

  auto point = std::make_unique<Point>();
  point->dom = id;
  point->addr = addr;
  point->in_place = !d->pool;
  // Decoding reads text before the pause: through vCPU 0's page tables now, not through a
  // root left by an earlier hit (whose process may be gone). Checked again under the pause.
  // Already paused (a batch), the context pause() took is still current.
  if (d->pause_depth == 0) XP_TRY(refresh_context(*d));
  XP_TRY(decode_probe_point(*d, *point));
  const bool copied = point->plan == x86::Plan::Boost || point->plan == x86::Plan::BoostRipRel;
  if (copied && point->own_address && !point->in_place && d->traits.can_emulate) {
    // Its fault must have its own address (the kernel looks the fixup up by it): not out of
    // line, but in Xen's emulator where it is.
    point->in_place = true;
    if (auto why = x86::xen_emulator_refusal(point->insn)) {
      std::string m = point->insn.describe() +
                      ": refused by rule 'exception-table': its fault must reach the "
                      "kernel's fixup (" +
                      point->own_address->why +
                      "); Xen's emulator, which keeps its address, "
                      "cannot run it: " +
                      *why;
      m += d->fixup ? "" : "; a guest module that gives fixup slots would run it on any channel";
      return fail(Errc::InvalidArgument, m);
    }
    if (reg->post)
      return fail(Errc::NotSupported,
                  point->insn.describe() + ": its fault must reach the kernel's fixup at its own address (" +
                      point->own_address->why +
                      "), so Xen's emulator runs it in place and no stop follows it: "
                      "post-handlers cannot run there (use a pre-handler, or probe the next instruction)");
  } else if (copied && point->own_address && !point->in_place) {
    // The address rules accepted it for a fixup slot (the module gives them, the entry is known).
    point->fixup_slot = true;
    if (reg->post)
      return fail(Errc::NotSupported,
                  point->insn.describe() + ": runs in a fixup slot (" + point->own_address->why +
                      "), which ends in a jump back and is never rewritten (a task may sleep in a fault there): "
                      "post-handlers cannot run after it (use a pre-handler, or probe the next instruction)");
    if (point->next)
      return fail(Errc::InvalidArgument,
                  point->insn.describe() + ": a 1-byte instruction with an exception-table entry (" +
                      point->own_address->why +
                      ") would run out of line together with its neighbour on the "
                      "debugger channel, which a fixup slot does not hold; the guest and vmevent channels accept it");
  } else if (copied && point->in_place) {
    if (auto why = x86::xen_emulator_refusal(point->insn))
      return fail(Errc::NotSupported, point->insn.describe() + ": " + *why +
                                          "; without the guest module's slots the hypervisor must emulate it (load "
                                          "the xenprobesU module in the guest)");
  }
  // A 1-byte point with a continuation copies its neighbour: nobody may probe that one now.
  if (Gva before{addr.value - 1}; d->points.contains(before) && d->points.at(before)->next)
    return fail(Errc::Busy, point->insn.describe() + ": the instruction before it is a probed 1-byte instruction");
  // Inside a jump probe's region the bytes are the jump's.
  if (const Point* q = overlapping_point(*d, addr.value, addr.value + 1, nullptr); q && q->jump)
    return fail(Errc::Busy, point->insn.describe() + ": inside the region [" + hex(q->jump->region.start.value) + ", " +
                                hex(q->jump->region.end().value) + ") that the jump probe at " + hex(q->addr.value) +
                                " covers; unregister it first");
  if (reg->method != ProbeMethod::Trap) {
    if (auto why = plan_jump(*d, *point, *reg)) {
      std::string where = d->syms ? d->syms->symbolize(addr) + " (" + hex(addr.value) + ")" : hex(addr.value);
      if (reg->method == ProbeMethod::Jump)
        return fail(Errc::NotSupported,
                    where + ": cannot be a jump probe: " + *why + "; a trap probe can be put there");
      XP_LOG(Info, "domain %u: %s: a trap probe, not a jump: %s", id.value, where.c_str(), why->c_str());
      point->not_jump_because = std::move(*why);
    }
    if (reg->async) {  // a jump (an async probe is never Fastest)
      if (auto why = plan_async(*d, *reg))
        return fail(Errc::NotSupported,
                    (d->syms ? d->syms->symbolize(addr) + " (" + hex(addr.value) + ")" : hex(addr.value)) +
                        ": cannot be an async probe: " + *why);
      point->jump->async_key = d->next_async_key++;
      point->jump->specs = reg->specs;
    }
  }

  {
    auto hold = XP_TRY(Pause::take(*this, *d));  // with vCPU 0's paging context, fresh
    // The bytes may have changed since we decoded them (the guest patches itself too): arm()'s
    // patch checks them before anything is written. The slot is the point's only once the
    // trap is in: a failed arm drops (undoes) it.
    std::optional<NewSlot> ns;
    if (point->jump) {
      // Its detour is its slot (arm_jump).
    } else if (point->fixup_slot) point->slot = XP_TRY(take_fixup_slot(*d, *point));  // kept whatever follows
    else if (uses_slot(*point)) ns = XP_TRY(write_slot(*d, *point, bool(reg->post)));
    if (ns) {
      point->slot = ns->slot;  // arm's trap entry sends the vCPU there
      point->trap_tail = ns->trap_tail;
    }
    if (auto r = arm(*d, *point); !r) {
      point->slot.reset();
      return std::unexpected(r.error());
    }
    if (ns) {
      point->slot.reset();  // adopt: nothing to release
      adopt_slot(*d, *point, std::move(*ns));
    }
  }
  reg->point = point.get();
  point->regs.push_back(reg.get());
  if (reg->async) d->async_keys[point->jump->async_key] = reg.get();
  d->points[addr] = std::move(point);
  ProbeId rid = next_id_++;
  probes_[rid] = std::move(reg);
  return rid;
}

Result<void> Engine::set_enabled(ProbeId id, bool on) {
  auto it = probes_.find(id);
  if (it == probes_.end()) return fail(Errc::NotFound, "no probe " + std::to_string(id));
  Registration& r = *it->second;
  if (r.enabled == on) return {};
  Point& p = *r.point;
  Domain* d = domain_of(p);
  if (!d) return fail(Errc::NoSuchDomain, "the probe's domain is gone");
  if (d->failed && on) return fail(Errc::Busy, "domain " + std::to_string(d->id.value) + ": " + d->failed->what);
  bool was = any_enabled(p);
  r.enabled = on;
  bool now = any_enabled(p);
  if (was == now) return {};
  auto hold = Pause::take(*this, *d);
  if (!hold) {
    r.enabled = !on;
    return std::unexpected(hold.error());
  }
  auto res = now ? arm(*d, p) : disarm(*d, p);
  if (!res) {
    r.enabled = !on;
    return res;
  }
  if (!now) XP_TRY(flush(*d));
  return {};
}

Result<void> Engine::remove(ProbeId id) {
  if (!probes_.contains(id)) return fail(Errc::NotFound, "no probe " + std::to_string(id));
  if (dispatching_) {  // from a handler: after the current hit
    if (std::find(deferred_removals_.begin(), deferred_removals_.end(), id) == deferred_removals_.end())
      deferred_removals_.push_back(id);
    probes_[id]->enabled = false;
    return {};
  }
  return remove_now(id);
}

Result<void> Engine::remove_now(ProbeId id) {
  auto it = probes_.find(id);
  if (it == probes_.end()) return {};
  Registration& r = *it->second;
  Point* p = r.point;
  Domain* d = domain_of(*p);
  if (!d) {
    probes_.erase(it);
    return {};
  }
  if (r.ret) {
    // Calls in flight get their return addresses back before the instances go away.
    // The hold lasts until the registration is gone: no new call may be tracked after this.
    auto hold = XP_TRY(Pause::take(*this, *d));
    XP_TRY(flush(*d));  // entries and returns already stopped are handled first
    restore_returns(*d, &r);
    const bool was = std::exchange(r.enabled, false);
    auto res = remove_registration(*d, it);
    if (!res) r.enabled = was;  // kept, as it was (its calls in flight are already given back)
    return res;
  }
  return remove_registration(*d, it);
}

Result<void> Engine::remove_registration(Domain& dom, std::map<ProbeId, std::unique_ptr<Registration>>::iterator it) {
  Registration& r = *it->second;
  Point* p = r.point;
  Domain* d = &dom;
  if (p->regs.size() > 1) {
    // The point stays for the others. A failure keeps this registration where it was: the
    // caller's handle still names it, and a retry finds it.
    const auto pos = std::find(p->regs.begin(), p->regs.end(), &r) - p->regs.begin();
    p->regs.erase(p->regs.begin() + pos);
    auto rest = [&]() -> Result<void> {
      const bool tail_needed = needs_trap_tail(*p);
      const bool enabled = any_enabled(*p);
      if (!(p->trap_tail && !tail_needed) && !(p->armed && !enabled)) return {};
      auto hold = XP_TRY(Pause::take(*this, *d));
      if (p->armed && !enabled) {
        XP_TRY(disarm(*d, *p));
        XP_TRY(flush(*d));
      }
      if (p->trap_tail && !tail_needed) XP_TRY(replace_slot(*d, *p, false));
      return reclaim_slots(*d);
    };
    if (auto res = rest(); !res) {
      p->regs.insert(p->regs.begin() + pos, &r);
      return res;
    }
    probes_.erase(it);
    return {};
  }
  // The last registration: restore the bytes, resume pending stops (found through the
  // disarmed point, then rewound onto the restored instruction), free the slot.
  // An async probe's records so far reach its handler first.
  if (r.async && !d->rings.empty()) drain_rings(*d);
  auto hold = XP_TRY(Pause::take(*this, *d));
  XP_TRY(disarm(*d, *p));
  XP_TRY(flush(*d));
  // And what came between that read and the pause (the domain is paused now: nothing more).
  if (r.async && !d->rings.empty()) drain_rings(*d);
  if (p->jump && p->jump->async_key) d->async_keys.erase(p->jump->async_key);
  release_slot(*d, *p);
  d->points.erase(p->addr);
  probes_.erase(it);
  // The registration is gone: its removal succeeded whatever follows. Slots not reclaimed
  // now stay dirty until a later reclaim (a failure here once made the caller touch the
  // freed registration).
  if (auto rc = reclaim_slots(*d); !rc)
    XP_LOG(Warn, "domain %u: released slots not reclaimed yet: %s", d->id.value, rc.error().what.c_str());
  return {};
}

Result<void> Engine::after_dispatch(bool resumed) {
  if (resumed) {
    for (const auto& [dom, record] : returned_records_) journal_->remove_return(record);
    returned_records_.clear();
  }
  for (auto& [id, d] : domains_) {
    advance_jumps(*d);
    if (!d->rings.empty()) drain_rings(*d);
  }
  if (deferred_removals_.empty()) return {};
  flush_deferred();
  return {};
}

void Engine::flush_deferred() {
  auto ids = std::move(deferred_removals_);
  deferred_removals_.clear();
  for (ProbeId id : ids)
    if (auto r = remove_now(id); !r)
      XP_LOG(Error, "probe %" PRIu64 ": deferred removal failed: %s", id, r.error().what.c_str());
}

ProbeStats Engine::stats(ProbeId id) const {
  auto it = probes_.find(id);
  if (it == probes_.end()) return {};
  ProbeStats st = it->second->stats;
  if (const RetState* rs = it->second->ret.get()) st.active = unsigned(rs->instances.size() - rs->free.size());
  return st;
}

Result<ProbeInfo> Engine::info(ProbeId id) const {
  auto it = probes_.find(id);
  if (it == probes_.end()) return fail(Errc::NotFound, "no probe " + std::to_string(id));
  const Point& p = *it->second->point;
  ProbeInfo i;
  i.address = p.addr;
  i.requested = it->second->requested;
  i.moved_because = it->second->moved_because;
  i.instruction = p.insn.describe();
  // (A module-less domain's Boost points keep reporting Boosted, with no slot.)
  i.mode = p.in_place && p.own_address ? ExecMode::Emulated : exec_mode(p.plan, p.trap_tail);
  i.slot = p.slot.value_or(Gva{0});
  i.not_jump_because = p.not_jump_because;
  if (p.jump) {
    i.method = ProbeMethod::Jump;
    i.mode = ExecMode::Detour;
    i.slot = p.jump->detour;
    i.jump_pending = p.armed && !p.jump->jmp;
    i.async = p.jump->async_key != 0;
    if (p.jump->island) i.not_jump_because = p.jump->short_because;  // a jump, but a short one
  }
  if (it->second->ret)
    if (auto d = domains_.find(p.dom); d != domains_.end()) i.trampoline = d->second->trampoline.value_or(Gva{0});
  return i;
}

}  // namespace xenprobes::probe
