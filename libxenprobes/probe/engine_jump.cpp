// Jump probes (protocol.h "Jump probes", docs/probes.md): planning a point's region with the
// jump rules (x86/jump_safety.hpp) and the kernel's own tables, arming in two steps (a trap
// byte that sends every hit to the detour, then, once the guest module has confirmed
// quiescence, the jump itself), disarming, and hits.
#include <chrono>

#include "probe/engine_internal.hpp"

#include <cstring>

#include "x86/relocate.hpp"

namespace xenprobes::probe {

namespace {

bool overlaps(std::uint64_t a_lo, std::uint64_t a_hi, std::uint64_t b_lo, std::uint64_t b_hi) {
  return a_lo < b_hi && b_lo < a_hi;
}

}  // namespace

Result<void> Engine::prepare_jumps(DomId id) {
  XP_TRY(attach(id));
  Domain* d = XP_TRY(domain(id));
  if (d->jump_index) return {};
  // Read as a registration reads text before its pause: through vCPU 0's page tables now.
  if (d->pause_depth == 0) XP_TRY(refresh_context(*d));
  jump_fixups(*d);  // builds d->jump_index
  return {};
}

bool Engine::jumps_prepared(DomId id) const {
  auto it = domains_.find(id);
  return it != domains_.end() && it->second->jump_index;
}

const x86::SiteIndex& Engine::jump_fixups(Domain& d) {
  if (!d.jump_index) {
    auto idx = std::make_unique<Domain::JumpIndex>();
    // Every exception fixup of the core kernel: a fault anywhere continues there, so it is
    // entered from outside its function's own branches.
    if (d.tables) {
      const kernel::Range& text = d.tables->core_text();
      for (const kernel::ExEntry* e = d.tables->exception_entry_in(text.start, text.end); e;
           e = d.tables->exception_entry_in(e->insn + 1, text.end))
        idx->fixups.add(e->fixup, 1, "the exception fixup of " + hex(e->insn));
      // A jump label's target: while its key is off the site is a nop and the text shows no
      // branch there, but flipping the key writes a jmp to it at any time.
      for (const kernel::Site* s = d.tables->jump_label_in(text.start, text.end); s;
           s = d.tables->jump_label_in(s->addr + kernel::KernelTables::kJumpSiteLen, text.end))
        if (s->target) idx->fixups.add(s->target, 1, "the target of the jump label at " + hex(s->addr));
    }
    if (d.syms) {
      for (const char* glob : {"__x86_indirect_thunk_*", "__x86_indirect_jump_thunk_*", "__x86_indirect_its_thunk_*"})
        for (const symbols::Symbol& s : d.syms->matching(glob))
          if (auto f = d.syms->function_containing(s.address); f && f->start == s.address)
            idx->thunks.add(f->start.value, static_cast<std::uint32_t>(std::min<std::uint64_t>(f->size, 4096)),
                            f->name);
      idx->ibt = d.syms->lookup("__ibt_endbr_seal").has_value();
    }
    // Branches from other functions into the middle of one: every function of the core text
    // decoded, once per kernel build per process (probe/engine_jump_index.cpp).
    if (d.syms && d.tables) cross_function_branches(d, *idx);
    // Tail calls proven from the kernel image, when one of the guest's build was given.
    if (d.tables) image_proof(d, *idx);
    d.jump_index = std::move(idx);
  }
  return d.jump_index->fixups;
}

const Engine::Point* Engine::overlapping_point(const Domain& d, std::uint64_t lo, std::uint64_t hi,
                                               const Point* self) const {
  for (const auto& [addr, q] : d.points) {
    if (q.get() == self) continue;
    if (q->jump ? overlaps(q->jump->region.start.value, q->jump->region.end().value, lo, hi)
                : (addr.value >= lo && addr.value < hi))
      return q.get();
  }
  return nullptr;
}

std::optional<std::string> Engine::plan_jump(Domain& d, Point& p, const Registration& reg) {
  if (!d.table)  // the module's trap table takes the jump's entries
    return std::string("jump probes need the guest channel (this domain is served by the ") + d.ch->name() +
           " channel)";
  if (!d.jump_entry || !d.pool)
    return std::string("the guest module publishes no jump entry (install the current xenprobesU in the guest)");
  if (reg.post)
    return std::string(
        "a post-handler needs a stop after the instruction, which a jump does not make (use a "
        "pre-handler, or a trap probe)");
  if (p.in_place || p.own_address)
    return "its fault must reach the kernel's fixup at its own address (" +
           (p.own_address ? p.own_address->why : std::string("no slots")) + ")";
  if (!d.tables) return std::string("the guest kernel's tables are not known (load its symbols first)");
  for (const kernel::TableStatus* t :
       {&d.tables->ex_status(), &d.tables->jump_status(), &d.tables->static_call_status()})
    if (!t->found) return std::string("the kernel's ") + t->name + " could not be read (" + t->why + ")";
  // In a loaded module's text (engine_jump_module.cpp): the very module decoded there, with its
  // own tables read.
  const kernel::Module* mod = nullptr;
  if (p.module)
    if (auto why = module_jump_check(d, p, mod)) return why;

  auto fn = d.syms->function_containing(p.addr);
  if (!fn || fn->size == 0 || fn->size > symbols::kMaxFunctionBytes) return std::string("no function symbol covers it");
  if (mod && (fn->start.value < mod->text.start || fn->size > mod->text.end - fn->start.value))
    return "its function " + fn->name + " runs past its module's text";
  // The detour's call pushes onto the stack: not in code that runs before the kernel has one
  // (its entry point at _text, and the CPU bring-up paths of x86-64 Linux's head code).
  if (fn->name == "startup_64" || fn->name.starts_with("secondary_startup_64") || fn->name == "verify_cpu")
    return "its function " + fn->name + " runs before the kernel has a stack, and a detour's call pushes onto it";
  if (auto text = d.syms->lookup("_text"); text && !text->empty() && text->front().address == fn->start)
    return "its function " + fn->name +
           " is the kernel's entry point (at _text), which runs before the kernel has "
           "a stack, and a detour's call pushes onto it";
  auto bytes = read_text(d, fn->start, fn->size);
  if (!bytes) return "its function cannot be read: " + bytes.error().what;
  auto insns = x86::decode_function(*bytes, fn->start);
  if (!insns) return "its function does not decode: " + insns.error().what;
  const std::uint64_t lo = fn->start.value, hi = lo + fn->size;

  // What must stay as it is inside this function, from the kernel's tables (their own
  // O(log n) queries), and its ftrace site.
  x86::SiteIndex reserved, entries;
  for (const kernel::ExEntry* e = d.tables->exception_entry_in(lo, hi); e;
       e = d.tables->exception_entry_in(e->insn + 1, hi))
    reserved.add(e->insn, 1, "__ex_table entry");
  for (const kernel::Site* s = d.tables->jump_label_in(lo, hi); s;
       s = d.tables->jump_label_in(s->addr + kernel::KernelTables::kJumpSiteLen, hi))
    reserved.add(s->addr, kernel::KernelTables::kJumpSiteLen, "jump label");
  for (const kernel::Site* s = d.tables->static_call_in(lo, hi); s;
       s = d.tables->static_call_in(s->addr + kernel::KernelTables::kStaticCallSiteLen, hi))
    reserved.add(s->addr, kernel::KernelTables::kStaticCallSiteLen, "static call");
  for (auto l = d.tables->smp_lock_in(lo, hi); l; l = d.tables->smp_lock_in(*l + 1, hi))
    reserved.add(*l, 1, "lock prefix");  // rewritten only while the kernel may still patch it
  // A module's lock sites are not read (address_rules.cpp): while the kernel may still rewrite
  // lock prefixes, every instruction of the module's function that has one is left alone.
  if (mod && !d.tables->smp_locks_status().freed)
    for (const x86::Insn& i : *insns)
      if (i.has_lock() || i.prefixes[1] == 0x3e)
        reserved.add(i.address.value, i.length,
                     "a lock prefix (the kernel may still rewrite lock prefixes, and a "
                     "module's lock sites are not read)");
  for (std::size_t k = 0; k < std::min<std::size_t>(2, insns->size()); ++k)
    if (kernel::is_ftrace_site(rule_context(d), *insns, (*insns)[k]))
      reserved.add((*insns)[k].address.value, 5, "ftrace site");
  // Entered from outside its own branches: exception fixups, jump-label targets, branches from
  // other functions (its cold part's among them); in a module, the module's own.
  const x86::SiteIndex& fixups = jump_fixups(d);
  const x86::SiteIndex* entered = &fixups;
  if (mod) {
    std::string why;
    const Domain::ModuleJumpIndex* mi = module_jump_index(d, *mod, why);
    if (!mi) return why;
    entered = &mi->entries;
  }
  for (std::uint64_t at = lo; const x86::SiteIndex::Site* s = entered->overlapping(at, hi); at = s->addr + 1)
    entries.add(s->addr, 1, s->what);
  // (A module's cold parts are functions of the module: its index has their branches.)
  for (const symbols::Symbol& cold : mod ? std::vector<symbols::Symbol>{} : d.syms->matching(fn->name + ".cold*")) {
    auto cf = d.syms->function_containing(cold.address);
    if (!cf || cf->start != cold.address || cf->size == 0 || cf->size > symbols::kMaxFunctionBytes)
      return "its cold part " + cold.name + " has no extent to decode";
    auto cb = read_text(d, cf->start, cf->size);
    auto ci = cb ? x86::decode_function(*cb, cf->start) : Result<std::vector<x86::Insn>>(std::unexpected(cb.error()));
    if (!ci) return "its cold part " + cold.name + " does not decode, so its branches back are unknown";
    for (const x86::Insn& i : *ci)
      if (i.is_relative_branch() && i.branch_target.value >= lo && i.branch_target.value < hi)
        entries.add(i.branch_target.value, 1, "a branch from " + cold.name + " (" + hex(i.address.value) + ")");
  }
  x86::JumpContext jc;
  jc.reserved = &reserved;
  jc.entry_points = &entries;
  jc.indirect_thunks = &d.jump_index->thunks;
  jc.endbr_marks_indirect_targets = d.jump_index->ibt;
  if (d.jump_index->taken && !mod) jc.addresses_taken = &*d.jump_index->taken;  // the core text's only
  mem::GuestMemory& m = *d.memory;
  jc.indirect_targets = [&](const x86::Insn& i) -> std::optional<std::vector<Gva>> {
    // A jump table (jmp [index*8 + table]): its entries while they point into the function.
    if (i.branch != x86::BranchKind::JmpIndirect || !i.mem.present || i.mem.base != x86::Reg::None ||
        i.mem.index == x86::Reg::None || i.mem.scale != 8)
      return std::nullopt;
    std::vector<Gva> out;
    for (unsigned k = 0; k < 1024; ++k) {
      auto e = m.read_u64(Gva{static_cast<std::uint64_t>(i.mem.disp) + 8ull * k});
      if (!e || *e < lo || *e >= hi) break;
      out.push_back(Gva{*e});
    }
    if (out.empty()) return std::nullopt;
    return out;
  };
  // Short jumps to islands only on a module that restores them (engine_island.cpp), and only in
  // the core text: a module's functions end where its symtab's st_size says, so the padding
  // after them lies outside every function, which kernel::island_padding_near() was not made
  // for.
  x86::SiteIndex island_padding, islands_taken;
  if (d.jump_islands && !mod) {
    island_context(d, *insns, fn->start, Gva{hi}, jc, island_padding, islands_taken);
    jc.island_padding = &island_padding;
    jc.islands_taken = &islands_taken;
  }
  const x86::JumpFunction jf = x86::JumpFunction::from_insns(*insns, fn->start, Gva{hi}, jc);
  const x86::JumpVerdict v = x86::check_jump(jf, p.addr);
  if (!v.optimizable) {
    std::string why =
        "refused by jump rule '" + std::string(x86::jump_rule_name(v.refusal.rule)) + "': " + v.refusal.reason;
    // An indirect jump of unknown targets decided it: what the tail-call proof would need.
    if (jf.unknown_targets() && v.refusal.reason.find(*jf.unknown_targets()) != std::string::npos) {
      if (mod)
        why += "; tail calls are not proven in a module's text (the kernel image that proves them holds no module)";
      else if (jc.addresses_taken)
        why += "; the kernel image forms an address inside the function (" +
               x86::interior_address_taken(jf).value_or("?") + "), so they may not be tail calls";
      else if (!d.jump_index->no_taken.empty()) why += "; no tail-call proof: " + d.jump_index->no_taken;
      else why += "; tail calls are proven only from the kernel image (give load_symbols() the guest's vmlinux)";
    }
    if (mod) why += " (a short jump to an island is not tried in a module's text)";
    else if (!d.jump_islands)
      why += " (a short jump to an island was not tried: the guest module does not publish the jump-island feature)";
    return why;
  }
  if (v.island.has_value() != (v.region.patch == x86::kShortJumpLen))
    return std::string("its short jump has no island");  // check_jump gives both or neither
  if (v.island &&
      overlaps(v.island->value, v.island->value + x86::kIslandLen, v.region.start.value, v.region.end().value))
    return std::string("its island lies inside its region");  // island_in_reach never gives one
  if (v.region.length > x86::kMaxInsnLen)
    return "its region [" + hex(v.region.start.value) + ", " + hex(v.region.end().value) + ") is " +
           std::to_string(v.region.length) + " bytes, more than the 15 the guest module restores";
  if (const Point* q = overlapping_point(d, v.region.start.value, v.region.end().value, &p))
    return "its region [" + hex(v.region.start.value) + ", " + hex(v.region.end().value) + ") holds the probe at " +
           hex(q->addr.value);
  if (mod)
    if (auto why = module_detour_reach(d, v.region)) return why;
  JumpState j;
  j.region = v.region;
  j.insns.assign(insns->begin() + static_cast<std::ptrdiff_t>(v.region.first),
                 insns->begin() + static_cast<std::ptrdiff_t>(v.region.first + v.region.count));
  std::copy_n(bytes->begin() + static_cast<std::ptrdiff_t>(v.region.start.value - lo), v.region.length,
              j.original.begin());
  if (v.island) {
    // Its function's padding, or the previous function's (engine_island.cpp): as decoded.
    auto isl = read_text(d, *v.island, x86::kIslandLen);
    if (!isl) return "its island at " + hex(v.island->value) + " cannot be read: " + isl.error().what;
    std::copy_n(isl->begin(), x86::kIslandLen, j.island_original.begin());
    j.island = *v.island;
    j.short_because = "a short jump (eb rel8) to an island at " + hex(v.island->value) +
                      " (dead padding): no 5-byte jump, refused by jump rule '" +
                      std::string(x86::jump_rule_name(v.refusal.rule)) + "': " + v.refusal.reason;
  }
  // The detour must fit one slot, wherever the slot is (relocation never changes its size).
  std::array<std::uint8_t, x86::kMaxDetourSize> scratch{};
  const Gva somewhere = d.pool->areas().front().addr;
  auto l = x86::emit_detour(scratch, somewhere, j.insns, p.addr, *d.jump_entry);
  if (!l && l.error().code != Errc::Range) return "its detour cannot be made: " + l.error().what;
  if (l && l->size > kSlotSize)
    return "its detour needs " + std::to_string(l->size) + " bytes, more than a " + std::to_string(kSlotSize) +
           "-byte slot";
  p.jump = std::move(j);
  return std::nullopt;
}

Result<void> Engine::arm_jump(Domain& d, Point& p) {
  JumpState& j = *p.jump;
  std::optional<Patch> detour;
  if (!j.detour.value) {
    // An async probe's capture specs follow its detour, in the slots after it.
    const std::size_t spec_bytes = j.specs.size() * sizeof(xenprobes_capture_spec);
    const unsigned n = 1 + static_cast<unsigned>((spec_bytes + kSlotSize - 1) / kSlotSize);
    const Gva slot = XP_TRY(allocate_slot(d, n));
    PatchSpec spec;
    spec.at = slot;
    spec.on_undo = [give = give_back_slot(d, slot), pool = d.pool.get(), slot, n, id = d.id] {
      give();
      for (unsigned k = 1; k < n; ++k)
        if (auto r = pool->release(slot + std::uint64_t{k} * kSlotSize); !r)
          XP_LOG(Warn, "domain %u: slot %s: %s", id.value, hex(slot.value + k * kSlotSize).c_str(),
                 r.error().what.c_str());
    };
    std::vector<std::uint8_t> code(std::size_t{n} * kSlotSize, 0xcc);
    auto l = x86::emit_detour(std::span(code).first(kSlotSize), slot, j.insns, p.addr, *d.jump_entry);
    if (!l) {
      spec.on_undo();
      return std::unexpected(l.error());
    }
    if (spec_bytes) std::memcpy(code.data() + kSlotSize, j.specs.data(), spec_bytes);
    spec.bytes = std::move(code);
    channel::TrapEntry te;  // the detour's call: known to the channel before anything can reach it
    te.addr = slot + l->call_offset;
    te.fallback = channel::TrapEntry::Fallback::Jump;
    te.resume_at = p.addr;
    if (j.async_key) async_key(j, slot + kSlotSize, te);
    spec.trap = te;
    j.slots = n;
    detour = XP_TRY(patcher(d).apply(std::move(spec)));
    j.detour = slot;
    j.layout = *l;
  }
  // The trap byte at the region's start: every vCPU arriving there goes to the detour.
  auto undo_detour = [&] {
    if (j.island_patch && !p.text) {  // put in by this call: the island goes back first
      if (auto u = j.island_patch->undo(); !u)
        XP_LOG(Warn, "domain %u: island at %s: %s", d.id.value, hex(j.island_patch->at().value).c_str(),
               u.error().what.c_str());
      j.island_patch.reset();
    }
    if (detour) j.detour = Gva{0};  // dropping the uncommitted patch gives the slot back
  };
  // A short jump's island, before anything can reach it (the trap byte sends vCPUs to the
  // detour directly; only the eb, written later, goes through the island).
  if (auto r = arm_island(d, j); !r) {
    undo_detour();
    return std::unexpected(r.error());
  }
  if (p.text) {
    if (auto r = p.text->reapply(trap_entry(p)); !r) {
      undo_detour();
      return std::unexpected(r.error());
    }
  } else {
    PatchSpec spec;
    spec.at = j.region.start;
    spec.bytes = {d.traits.trap_byte};
    spec.expect.assign(j.original.begin(), j.original.begin() + j.region.length);
    spec.trap = trap_entry(p);
    spec.journal =
        PatchSpec::Record{PatchKind::Text, j.region.start, {d.traits.trap_byte}, {j.original[0]}, j.region.start};
    const kernel::ModuleTables* mods = d.tables ? d.tables->modules() : nullptr;
    if (p.module && mods && mods->status().found) spec.journal->module = journal_module(mods->layout(), *p.module);
    auto patch = patcher(d).apply(std::move(spec));
    if (!patch) {
      undo_detour();
      Error e = patch.error();
      if (e.code == Errc::Again)
        e.what = hex(j.region.start.value) +
                 ": refused by rule 'text-changed': the guest rewrote the jump's region "
                 "since it was decoded (" +
                 e.what + "); unregister the probe and register it again";
      return std::unexpected(e);
    }
    patch->commit();
    p.text = std::move(*patch);
  }
  if (detour) {
    detour->commit();
    SlotTrap& st = d.slot_traps[j.key()];
    st.point = &p;
    st.resume = p.addr;
    st.original_next = p.addr;
    st.jump = true;
    st.patch = std::move(*detour);
  }
  // The jump itself once no task can be inside the region's later bytes: after a quiescence
  // asked for from now on (advance_jumps).
  j.waits_for = d.quiesce_next;
  ++d.jumps_waiting;
  p.armed = true;
  advance_quiescence(d);
  return {};
}

Result<void> Engine::disarm_jump(Domain& d, Point& p) {
  JumpState& j = *p.jump;
  if (j.waits_for) {
    j.waits_for.reset();
    --d.jumps_waiting;
  }
  if (j.jmp) {
    // Back to the trap byte (over our own jump only), which the next step restores.
    const bool ours = XP_TRY(j.jmp->restore());
    if (!ours) {
      XP_LOG(Warn, "domain %u: %s no longer holds our jump: the guest rewrote it; left as it is (rule 'text-changed')",
             d.id.value, hex(j.region.start.value).c_str());
      ++d.text_changed;
    }
    j.jmp->forget();
    j.jmp.reset();
  }
  const bool ours = XP_TRY(p.text->restore());
  if (!ours) {
    XP_LOG(Warn,
           "domain %u: %s no longer holds our trap byte: the guest rewrote it; left as it is (rule 'text-changed')",
           d.id.value, hex(j.region.start.value).c_str());
    ++d.text_changed;
  }
  return_island(d, j);  // after a later quiescence
  p.armed = false;
  p.flush_pending = true;
  return {};
}

void Engine::advance_jumps(Domain& d) {
  advance_islands(d);
  if (!d.jumps_waiting) return;
  advance_quiescence(d);
  auto due = [&](const Point& p) {
    return p.jump && p.armed && p.jump->waits_for && d.quiesce_done && *p.jump->waits_for <= *d.quiesce_done;
  };
  if (std::none_of(d.points.begin(), d.points.end(), [&](const auto& e) { return due(*e.second); })) return;
  auto hold = Pause::take(*this, d);
  if (!hold) {
    XP_LOG(Warn, "domain %u: jumps not written yet: %s", d.id.value, hold.error().what.c_str());
    return;
  }
  std::vector<std::uint64_t> rips;
  for (unsigned v = 0; v < d.info.vcpus; ++v)
    if (auto r = hv_.get_vcpu_regs(d.id, VcpuId{v})) rips.push_back(r->rip);
    else return;  // not knowing where a vCPU stands, write nothing
  for (auto& [addr, pp] : d.points) {
    Point& p = *pp;
    if (!due(p)) continue;
    JumpState& j = *p.jump;
    // A vCPU stopped between two of the region's instructions would resume inside the jump.
    if (std::any_of(rips.begin(), rips.end(),
                    [&](std::uint64_t r) { return r > j.region.start.value && r < j.region.end().value; }))
      continue;
    // In a module that went (its text freed, or another module's now): the jump is never
    // written; the probe writes nothing more there (disarm: module_gone).
    if (auto gone = module_gone(d, p)) {
      XP_LOG(Warn, "domain %u: the jump at %s not written: %s (rule 'module-gone')", d.id.value,
             hex(j.region.start.value).c_str(), gone->c_str());
      j.waits_for.reset();
      --d.jumps_waiting;
      continue;
    }
    // Only into a module the list shows LIVE as it was decoded (not one GOING, nor while the
    // list cannot be read): else the trap byte keeps serving the probe, and the next turn looks.
    const kernel::Module* live = nullptr;
    if (p.module && module_jump_check(d, p, live)) continue;
    PatchSpec spec;
    spec.at = j.region.start;
    // A short jump: eb rel8 to its island, which already holds the jump to the detour.
    const bool short_jump = j.island && j.island_patch;
    if (j.island && !short_jump) continue;
    spec.bytes.assign(short_jump ? x86::kShortJumpLen : x86::kJmpRel32Len, 0);
    if (short_jump) {
      spec.bytes = {0xeb, static_cast<std::uint8_t>(j.island->value - (j.region.start.value + x86::kShortJumpLen))};
    } else if (auto n = x86::emit_jmp_rel32(spec.bytes, j.region.start, j.detour); !n) {
      XP_LOG(Error, "domain %u: %s: %s", d.id.value, hex(j.region.start.value).c_str(), n.error().what.c_str());
      continue;
    }
    spec.expect = {d.traits.trap_byte};
    spec.expect.insert(spec.expect.end(), j.original.begin() + 1, j.original.begin() + spec.bytes.size());
    auto patch = patcher(d).apply(std::move(spec));
    if (!patch) {
      // The trap byte keeps serving the probe; the log says why the jump could not go in.
      XP_LOG_RATELIMITED(Warn, "domain %u: the jump at %s not written: %s", d.id.value,
                         hex(j.region.start.value).c_str(), patch.error().what.c_str());
      continue;
    }
    patch->commit();
    j.jmp = std::move(*patch);
    j.waits_for.reset();
    --d.jumps_waiting;
    XP_LOG(Debug, "domain %u: jump probe at %s: the jump to %s is in", d.id.value, hex(p.addr.value).c_str(),
           hex(j.detour.value).c_str());
  }
}

int Engine::wake_interval_ms() const {
  int ms = 0;
  for (const auto& [id, d] : domains_) {
    if (d->jumps_waiting || !d->islands_returning.empty()) return 10;
    if (!d->async_keys.empty()) ms = kDrainIntervalMs;
  }
  return ms;
}

channel::Verdict Engine::hit_jump(Domain& d, const SlotTrap& st, channel::Stop& s) {
  // rip stays the probed address: the module goes on in the detour (protocol.h).
  s.regs.rip = st.resume.value;
  if (!st.point || !st.point->armed) return channel::Verdict::Resume;
  Point& p = *st.point;
  const channel::Verdict v = hit_point(d, p, s);
  // A handler that sends the vCPU to another instruction of the region would land inside the
  // jump's bytes: it goes to that instruction's copy in the detour instead.
  const JumpState& j = *p.jump;
  const std::uint64_t rip = s.regs.rip;
  if (rip != p.addr.value && rip > j.region.start.value && rip < j.region.end().value) {
    if (auto off = j.layout.copy_of(Gva{rip})) {
      s.regs.rip = j.detour.value + *off;
    } else {
      XP_LOG_RATELIMITED(Warn,
                         "probe at %s: a handler sent the vCPU to %s, inside an instruction the jump covers; it "
                         "goes on at the probed instruction instead",
                         hex(p.addr.value).c_str(), hex(rip).c_str());
      s.regs.rip = p.addr.value;
    }
  }
  return v;
}

}  // namespace xenprobes::probe
