// Out-of-line slots: writing one for a point, moving a point to another, allocation and pool
// growth, release with quiescence, reclaim, and neutralizing slot traps before letting go.
#include "probe/engine_internal.hpp"

#include "common/bytes.hpp"

#include "x86/relocate.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::probe {

std::function<void()> Engine::give_back_slot(Domain& d, Gva slot) {
  return [pool = d.pool.get(), slot, id = d.id] {
    if (auto r = pool->release(slot); !r)
      XP_LOG(Warn, "domain %u: slot %s: %s", id.value, hex(slot.value).c_str(), r.error().what.c_str());
  };
}

Result<Engine::NewSlot> Engine::write_slot(Domain& d, const Point& p, bool trap_tail) {
  static_assert(kSlotSize == 32);
  const Gva slot = XP_TRY(allocate_slot(d));
  PatchSpec spec;
  spec.at = slot;
  spec.on_undo = give_back_slot(d, slot);
  std::array<std::uint8_t, kSlotSize> code{};
  code.fill(0xcc);  // never executed: pads the slot
  // Layout: [insn][jmp back] or [insn][trap]; with a continuation (p.next, see
  // decode_probe_point): [insn][next][jmp back] or [insn][trap][pad][next][jmp back]; with an
  // emulated next instruction: [insn][trap] (Dom0 emulates it at the trap).
  if (next_emulated(p)) trap_tail = true;
  const bool continuation = p.next && !next_emulated(p);
  Gva resume = p.insn.next();
  auto emitted =
      x86::emit_slot(code, slot, p.insn, p.insn.next(),
                     trap_tail || continuation ? x86::SlotTail::Trap : x86::SlotTail::JmpBack, d.traits.trap_byte);
  if (emitted && continuation) {
    // Without a trap tail the copy of the next instruction overwrites the trap byte. After a
    // trap it starts one byte later: a vCPU sent there must not stand at trap + 1, which is
    // what a stop on that trap looks like.
    std::size_t at = trap_tail ? *emitted + 1 : p.insn.length;
    resume = slot + at;
    emitted = x86::emit_slot(std::span(code).subspan(at), resume, *p.next, p.next->next(), x86::SlotTail::JmpBack,
                             d.traits.trap_byte);
  }
  if (!emitted) {
    spec.on_undo();
    return std::unexpected(emitted.error());
  }
  spec.bytes.assign(code.begin(), code.end());
  if (trap_tail) {
    channel::TrapEntry te;
    te.addr = slot + p.insn.length;
    te.fallback = channel::TrapEntry::Fallback::ResumeAt;
    te.resume_at = resume;
    if (next_emulated(p)) {
      te.fallback = channel::TrapEntry::Fallback::Emulate;
      te.len = p.next->length;
      std::copy(p.next->bytes.begin(), p.next->bytes.end(), te.insn);
    }
    // What the guardian puts there: the jump neutralize_slot_traps() would write.
    std::array<std::uint8_t, 5> jmp{};
    if (auto n = x86::emit_jmp_rel32(jmp, te.addr, p.insn.next()); !n) {
      spec.on_undo();
      return std::unexpected(n.error());
    }
    const std::size_t off = te.addr.value - slot.value;
    spec.journal = PatchSpec::Record{PatchKind::SlotTrap,
                                     te.addr,
                                     {code.begin() + off, code.begin() + off + 5},
                                     {jmp.begin(), jmp.end()},
                                     p.insn.next()};
    // Known to the channel before any vCPU can reach it: none is sent to the slot yet.
    spec.trap = te;
  }
  Patch patch = XP_TRY(patcher(d).apply(std::move(spec)));
  return NewSlot{slot, trap_tail, resume, std::move(patch)};
}

Result<Gva> Engine::take_fixup_slot(Domain& d, const Point& p) {
  const guestmod::FixupSlots& fs = *d.fixup;
  const kernel::ExEntry& want = *p.own_address->entry;
  constexpr std::size_t kSize = XENPROBES_FIXUP_SLOT_SIZE, kEntry = XENPROBES_FIXUP_ENTRY_SIZE;
  // Everything the module says about its slots is read back and checked, never assumed.
  std::vector<std::byte> slots(std::size_t{fs.count} * kSize), entries(std::size_t{fs.count} * kEntry);
  XP_TRY(d.memory->read(fs.addr, slots));
  XP_TRY(d.memory->read(fs.table, entries));
  auto code_for = [&](Gva slot) -> Result<std::array<std::uint8_t, kSize>> {
    std::array<std::uint8_t, kSize> code;
    code.fill(0xcc);
    XP_TRY(x86::emit_slot(code, slot, p.insn, p.insn.next(), x86::SlotTail::JmpBack, d.traits.trap_byte));
    return code;
  };
  std::optional<unsigned> unused;
  for (unsigned k = 0; k < fs.count; ++k) {
    const std::uint64_t slot = fs.slot(k).value, entry = fs.entry(k).value;
    const std::uint64_t insn =
        entry + static_cast<std::uint64_t>(std::int64_t{load<std::int32_t>(entries.data() + k * kEntry)});
    const std::uint64_t fixup =
        entry + 4 + static_cast<std::uint64_t>(std::int64_t{load<std::int32_t>(entries.data() + k * kEntry + 4)});
    const std::int32_t data = load<std::int32_t>(entries.data() + k * kEntry + 8);
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(slots.data()) + std::size_t{k} * kSize;
    if (insn == slot && fixup == want.fixup && data == want.data) {
      auto code = XP_TRY(code_for(Gva{slot}));
      if (std::equal(code.begin(), code.end(), bytes)) return Gva{slot};  // this instruction's, from before
      continue;
    }
    const bool blank = std::all_of(bytes, bytes + kSize, [](std::uint8_t b) { return b == 0xcc; });
    if (!unused && blank && insn == slot + kSize - 1 && fixup == slot + kSize - 1) unused = k;
  }
  if (!unused)
    return fail(Errc::NoSpace, "domain " + std::to_string(d.id.value) + ": all " + std::to_string(fs.count) +
                                   " fixup slots of the guest module are taken (each stays with its instruction "
                                   "while the module is loaded): reload the module to free them");
  const unsigned k = *unused;
  const Gva slot = fs.slot(k), entry = fs.entry(k);
  auto code = XP_TRY(code_for(slot));
  auto rel = [](std::uint64_t target, std::uint64_t field) -> std::optional<std::int32_t> {
    const auto off = static_cast<std::int64_t>(target - field);
    if (!x86::fits_rel32(off)) return std::nullopt;
    return static_cast<std::int32_t>(off);
  };
  auto insn_off = rel(slot.value, entry.value);
  auto fixup_off = rel(want.fixup, entry.value + 4);
  if (!insn_off || !fixup_off)
    return fail(Errc::InvalidArgument, "fixup slot " + hex(slot.value) + ": its entry at " + hex(entry.value) +
                                           " cannot reach the slot or the fixup " + hex(want.fixup) + " (rel32)");
  auto le32 = [](std::initializer_list<std::int32_t> values) {  // the entry's fields, little-endian
    std::vector<std::uint8_t> out;
    for (std::int32_t v : values)
      for (int b = 0; b < 4; ++b) out.push_back(static_cast<std::uint8_t>(static_cast<std::uint32_t>(v) >> (8 * b)));
    return out;
  };
  auto old = [&](std::size_t off, std::size_t n) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(entries.data()) + std::size_t{k} * kEntry + off;
    return std::vector<std::uint8_t>(b, b + n);
  };
  // The copy, then the entry's fixup and data, then its insn: the kernel may search the table
  // at any time, and until insn moves to the slot's first byte this entry matches nothing. Not
  // one committed until all three are written: a failure undoes them in reverse.
  PatchSpec cs;
  cs.at = slot;
  cs.bytes.assign(code.begin(), code.end());
  cs.expect.assign(kSize, 0xcc);
  Patch copy = XP_TRY(patcher(d).apply(std::move(cs)));
  PatchSpec fd;
  fd.at = entry + 4;
  fd.bytes = le32({*fixup_off, want.data});
  fd.expect = old(4, 8);
  Patch fixup_data = XP_TRY(patcher(d).apply(std::move(fd)));
  PatchSpec is;
  is.at = entry;
  is.bytes = le32({*insn_off});
  is.expect = old(0, 4);
  Patch insn = XP_TRY(patcher(d).apply(std::move(is)));
  copy.commit();
  fixup_data.commit();
  insn.commit();
  XP_LOG(Info, "domain %u: fixup slot %u at %s for %s (fixup %s, type %u)", d.id.value, k, hex(slot.value).c_str(),
         p.insn.describe().c_str(), hex(want.fixup).c_str(), want.type());
  return slot;
}

void Engine::adopt_slot(Domain& d, Point& p, NewSlot&& ns) {
  std::optional<Gva> old = p.slot;
  const bool old_tail = p.trap_tail;
  ns.patch.commit();
  p.slot = ns.slot;
  p.trap_tail = ns.trap_tail;
  if (ns.trap_tail) {
    SlotTrap& st = d.slot_traps[ns.slot + p.insn.length];
    st.point = &p;
    st.resume = ns.resume;
    st.original_next = p.insn.next();
    if (next_emulated(p)) {
      st.emulate_next = p.next;
      st.emulate_plan = p.next_plan;
    }
    st.patch = std::move(ns.patch);
  }
  if (old) {  // an armed point switches slots: the old one stays valid until reclaimed
    if (old_tail) d.slot_traps[*old + p.insn.length].point = nullptr;
    release_ran_slot(d, *old);
  }
}

Result<void> Engine::replace_slot(Domain& d, Point& p, bool trap_tail) {
  NewSlot ns = XP_TRY(write_slot(d, p, trap_tail));
  if (p.text) {
    // The channel's entry for the point sends a vCPU it cannot hand to Dom0 into the slot:
    // the new one, before the old one is released (and, once quiescent, reused).
    const std::optional<Gva> old = std::exchange(p.slot, ns.slot);
    auto r = p.text->update_trap(trap_entry(p));
    p.slot = old;
    XP_TRY(std::move(r));  // the new slot is dropped: undone
  }
  adopt_slot(d, p, std::move(ns));
  return {};
}

Result<void> Engine::refresh_areas(Domain& d) {
  guestmod::ModuleInfo mi = XP_TRY(guestmod::read_module_info(hv_, d.id, guestmod::check_mapped_via(*d.memory)));
  auto added = XP_TRY(guestmod::added_areas(mi, d.pool->areas()));
  for (const OeaArea& a : added) XP_TRY(d.pool->add_area(a));
  if (!added.empty()) d.growth_requested = false;
  return {};
}

Result<Gva> Engine::allocate_slot(Domain& d, unsigned n) {
  if (d.pool->clean() < n && d.pool->dirty() > 0) XP_TRY(reclaim_slots(d));
  auto slot = d.pool->allocate_run(n);
  if (!slot && slot.error().code == Errc::NoSpace) {
    // The module may have published an area since we asked (or answer at once).
    if (!d.growth_requested && d.pool->areas().size() < XENPROBES_OEA_MAX_AREAS &&
        guestmod::request_growth(hv_, d.id, d.pool->areas().back().size))
      d.growth_requested = true;
    if (d.growth_requested && refresh_areas(d)) slot = d.pool->allocate_run(n);
    if (!slot && !d.quiesce_wait.empty()) {
      Error e = slot.error();
      e.what += "; " + std::to_string(d.quiesce_wait.size()) +
                " released slots wait for the guest module to confirm quiescence (the guest must run)";
      if (d.growth_requested) e.what += "; asked the guest module for another area too";
      return std::unexpected(e);
    }
    if (!slot && d.growth_requested) {
      Error e = slot.error();
      e.what += "; asked the guest module for another area: retry once it has published it";
      return std::unexpected(e);
    }
  }
  if (slot && d.pool->wants_growth() && !d.growth_requested &&
      guestmod::request_growth(hv_, d.id, d.pool->areas().back().size))
    d.growth_requested = true;  // ahead of need: the module answers asynchronously
  return slot;
}

void Engine::neutralize_slot_traps(Domain& d) {
  Patcher patch = patcher(d);
  const std::uint8_t trap_byte = d.traits.trap_byte;
  for (const auto& [trap, st] : d.slot_traps) {
    if (st.jump) continue;  // a detour's call, no trap byte: it goes on by itself
    std::array<std::uint8_t, 5> jmp{};
    auto n = x86::emit_jmp_rel32(jmp, trap, st.original_next);
    Result<void> w = n ? patch.replace(trap, std::span(&trap_byte, 1), jmp) : Result<void>(std::unexpected(n.error()));
    if (!w)
      XP_LOG(Error, "domain %u: cannot turn the slot trap at %s into a jump: %s", d.id.value, hex(trap.value).c_str(),
             w.error().what.c_str());
  }
}

void Engine::release_slot(Domain& d, Point& p) {
  if (p.jump && p.jump->detour.value) {
    // Its call stays known to the channel until the slot is reclaimed: a vCPU may still be in
    // the detour (a hit that resumes there runs no handler then).
    if (auto it = d.slot_traps.find(p.jump->key()); it != d.slot_traps.end()) it->second.point = nullptr;
    for (unsigned k = 0; k < p.jump->slots; ++k) release_ran_slot(d, p.jump->detour + std::uint64_t{k} * kSlotSize);
    p.jump->detour = Gva{0};
    return;
  }
  if (!p.slot) return;
  if (p.fixup_slot) {  // kept as it is for the module's lifetime (protocol.h, fixup-slots)
    p.slot.reset();
    return;
  }
  if (p.trap_tail) {
    auto it = d.slot_traps.find(*p.slot + p.insn.length);
    if (it != d.slot_traps.end()) it->second.point = nullptr;
  }
  release_ran_slot(d, *p.slot);
  p.slot.reset();
}

void Engine::release_ran_slot(Domain& d, Gva slot) {
  if (!d.pool->release(slot)) return;
  d.quiesce_wait[slot.value] = d.quiesce_next;
}

void Engine::advance_quiescence(Domain& d) {
  if (d.quiesce_asked) {
    auto done = hv_.xs_read(guestmod::module_key(d.id, XENPROBES_XS_QUIESCE_DONE));
    // Hostile input: only the exact token we asked for counts.
    if (done && *done == std::to_string(*d.quiesce_asked)) {
      std::erase_if(d.quiesce_wait, [&](const auto& e) { return e.second <= *d.quiesce_asked; });
      d.quiesce_done = d.quiesce_asked;
      d.quiesce_asked.reset();
    }
  }
  if ((!d.quiesce_wait.empty() || d.jumps_waiting || !d.islands_returning.empty()) && !d.quiesce_asked) {
    std::uint64_t token = d.quiesce_next;
    if (auto w = hv_.xs_write(guestmod::module_key(d.id, XENPROBES_XS_QUIESCE_REQUEST), std::to_string(token)); w) {
      d.quiesce_asked = token;
      ++d.quiesce_next;
    } else {
      XP_LOG(Warn, "domain %u: cannot ask the guest module for quiescence: %s", d.id.value, w.error().what.c_str());
    }
  }
}

Result<void> Engine::reclaim_slots(Domain& d) {
  if (!d.pool) return {};
  // With the domain paused: a dirty slot no vCPU is inside can be reused, once the guest
  // module has confirmed that no preempted task is inside either.
  advance_quiescence(d);
  std::vector<std::uint64_t> rips;
  for (const auto& [slot, token] : d.quiesce_wait) rips.push_back(slot);                        // not quiesced yet
  for (const Domain::ReturningIsland& r : d.islands_returning) rips.push_back(r.detour.value);  // its jump goes there
  for (unsigned v = 0; v < d.info.vcpus; ++v) rips.push_back(XP_TRY(hv_.get_vcpu_regs(d.id, VcpuId{v})).rip);
  if (d.table)
    for (std::uint64_t rip : d.table->resumes_in_flight(d.id)) rips.push_back(rip);  // answered, not yet taken
  d.pool->reclaim(rips);
  for (auto it = d.slot_traps.begin(); it != d.slot_traps.end();) {
    auto slot = d.pool->slot_of(it->first);
    if (!it->second.point && (!slot || d.pool->state_of(*slot) != SlotState::Dirty)) {
      it->second.patch.forget();
      it = d.slot_traps.erase(it);
    } else ++it;
  }
  return {};
}

}  // namespace xenprobes::probe
