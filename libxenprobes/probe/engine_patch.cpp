// Arming and disarming a point's trap byte through the Patcher, and the flush that lets the
// channel and the journal forget a disarmed one.
#include "probe/engine_internal.hpp"

namespace xenprobes::probe {

Patcher Engine::patcher(Domain& d) {
  // Text outside the core kernel's and outside the module's slot areas is a loaded module's,
  // which the guest frees when it unloads the module: no writable mapping of it is kept.
  auto reused = [&d](Gva a) {
    return d.tables && !d.tables->core_text().contains(a.value) && !(d.pool && d.pool->contains(a));
  };
  return Patcher(*d.memory, *d.ch, d.table, d.journaled ? journal_ : nullptr, d.id, reused);
}

Result<void> Engine::arm(Domain& d, Point& p) {
  if (p.armed) return {};
  if (auto gone = module_gone(d, p))
    return fail(Errc::NotFound, hex(p.addr.value) + ": refused by rule 'module-gone': " + *gone +
                                    "; unregister the probe (and register it again if the module is back)");
  if (p.jump) {
    // A jump's region and its trap entry go only into a module the list shows LIVE as it was
    // decoded: a module GOING has passed the guest module's notifier, which would not know to
    // leave this region alone once the module is freed.
    const kernel::Module* live = nullptr;
    if (p.module)
      if (auto why = module_jump_check(d, p, live))
        return fail(Errc::NotFound, hex(p.addr.value) + ": refused by rule 'module-gone': " + *why +
                                        " (not LIVE, or the module list cannot be read)");
    return arm_jump(d, p);
  }
  // Never a trap over bytes we did not decode: the guest may have rewritten the instruction
  // since (a static key flipped while the probe was disabled, a module unloaded and another
  // loaded at the address). Its slot copy would then run the old instruction.
  auto text_changed = [&](const Error& e) {
    if (e.code != Errc::Again) return e;
    return Error{Errc::Again, hex(p.addr.value) +
                                  ": refused by rule 'text-changed': the guest rewrote the instruction "
                                  "since it was decoded (" +
                                  p.insn.describe() + "; " + e.what +
                                  "); unregister the probe and register it again to decode it afresh"};
  };
  if (p.text) {
    // Restored, not flushed yet: the channel and the journal still have it.
    if (auto r = p.text->reapply(trap_entry(p)); !r) return std::unexpected(text_changed(r.error()));
  } else {
    PatchSpec spec;
    spec.at = p.addr;
    spec.bytes = {d.traits.trap_byte};
    spec.expect.assign(p.original.begin(), p.original.begin() + p.insn.length);
    spec.trap = trap_entry(p);  // the channel learns of the trap before the guest can execute it
    spec.journal = PatchSpec::Record{PatchKind::Text, p.addr, {d.traits.trap_byte}, {p.original[0]}, p.addr};
    // In a module's text: the guardian restores the byte only while that module is still there.
    const kernel::ModuleTables* mods = d.tables ? d.tables->modules() : nullptr;
    if (p.module && mods && mods->status().found) spec.journal->module = journal_module(mods->layout(), *p.module);
    auto patch = patcher(d).apply(std::move(spec));
    if (!patch) return std::unexpected(text_changed(patch.error()));
    patch->commit();
    p.text = std::move(*patch);
  }
  p.armed = true;
  return {};
}

Result<void> Engine::disarm(Domain& d, Point& p) {
  if (!p.armed) return {};
  XP_LOG(Debug, "domain %u: disarm %s", d.id.value, hex(p.addr.value).c_str());
  // A module unloaded since: its text is freed, or another module's code is there now, which
  // may hold the trap byte's value by itself (int3 padding). Nothing is written.
  if (auto gone = module_gone(d, p)) {
    XP_LOG(Warn, "domain %u: %s: %s; its trap byte is not ours any more: nothing written", d.id.value,
           hex(p.addr.value).c_str(), gone->c_str());
    ++d.text_changed;
    if (p.jump) {  // its jump (if written) is forgotten too, nothing written; its detour goes as any
      if (p.jump->waits_for) {
        p.jump->waits_for.reset();
        --d.jumps_waiting;
      }
      if (p.jump->jmp) p.jump->jmp->forget();
      p.jump->jmp.reset();
    }
    p.armed = false;
    p.flush_pending = true;
    return {};
  }
  if (p.jump) return disarm_jump(d, p);
  // Restore only our own byte: if the guest rewrote the site meanwhile, writing the saved
  // byte back would corrupt its new instruction.
  const bool ours = XP_TRY(p.text->restore());
  if (!ours) {
    XP_LOG(Warn,
           "domain %u: %s no longer holds our trap byte: the guest rewrote it; left as it is (rule 'text-changed')",
           d.id.value, hex(p.addr.value).c_str());
    ++d.text_changed;
  }
  p.armed = false;
  p.flush_pending = true;
  return {};
}

std::optional<std::string> Engine::module_gone(Domain& d, const Point& p) {
  if (!p.module || !d.tables || !d.syms) return std::nullopt;
  update_modules(d);
  const kernel::ModuleTables* mods = d.tables->modules();
  return mods ? kernel::module_replaced(*mods, p.addr.value, *p.module) : std::nullopt;
}

Result<void> Engine::flush(Domain& d) {
  XP_TRY(d.ch->flush(d.id, *this));
  // No vCPU is stopped on a restored byte any more: the channel may forget it.
  for (auto& [addr, p] : d.points) {
    if (p->flush_pending && !p->armed && p->text) {
      p->text->forget();
      p->text.reset();
    }
    p->flush_pending = false;
  }
  return {};
}

}  // namespace xenprobes::probe
