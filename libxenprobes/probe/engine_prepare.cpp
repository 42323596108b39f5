// Preparing a probe point: where it goes (entry placement), decoding, the address rules, and
// the channel's trap entry for it.
#include "probe/engine_internal.hpp"
#include "xenprobes/protocol.h"

#include "x86/relocate.hpp"

namespace xenprobes::probe {

namespace {}  // namespace

kernel::RuleContext Engine::rule_context(const Domain& d) const {
  kernel::RuleContext c;
  c.tables = d.tables ? &*d.tables : nullptr;
  c.syms = d.syms ? &*d.syms : nullptr;
  c.module_text = d.module_text;
  c.hook_path = d.hook_path ? &*d.hook_path : nullptr;
  c.hook_path_error = d.hook_path_error;
  c.guest_channel = d.traits.guest_int3;
  c.emulates_in_place = d.traits.can_emulate;
  c.fixup_slots = d.fixup.has_value();
  return c;
}

Result<std::vector<std::uint8_t>> Engine::read_text(Domain& d, Gva start, std::uint64_t size) {
  std::vector<std::uint8_t> bytes(size);
  XP_TRY(d.memory->read(start, std::as_writable_bytes(std::span(bytes))));
  // Bytes we patched ourselves read back as the original instruction.
  auto original = [&](Gva at, std::span<const std::uint8_t> was) {
    for (std::uint64_t k = 0; k < was.size(); ++k)
      if (at.value + k >= start.value && at.value + k < start.value + size) bytes[at.value + k - start.value] = was[k];
  };
  // Islands in dead padding (engine_island.cpp): the padding they went over (a multi-byte nop
  // cut by an island would decode as something else after it).
  for (const Domain::ReturningIsland& r : d.islands_returning) original(r.patch.at(), r.original);
  for (auto& [a, q] : d.points) {
    if (q->jump && q->jump->island_patch) original(*q->jump->island, q->jump->island_original);
    if (q->jump && (q->armed || q->text)) {  // the trap byte, and maybe the jump over the next four
      const x86::JumpRegion& r = q->jump->region;
      for (std::uint64_t k = 0; k < r.length; ++k)
        if (r.start.value + k >= start.value && r.start.value + k < start.value + size)
          bytes[r.start.value + k - start.value] = q->jump->original[k];
      continue;
    }
    if (q->armed && a.value >= start.value && a.value < start.value + size)
      bytes[a.value - start.value] = q->original[0];
  }
  return bytes;
}

Result<kernel::EntryPlacement> Engine::place(Domain& d, Gva addr) {
  if (!d.syms) return kernel::EntryPlacement{addr, {}};
  if (d.pause_depth == 0) XP_TRY(refresh_context(d));
  // Modules loaded or unloaded since the last walk (cheap when nothing changed), before anything
  // is looked up: a probe must never go into the text of a module that has gone, and a function
  // of a module loaded since is placed (and decoded) like any other.
  update_modules(d);
  auto fn = d.syms->function_containing(addr);
  if (!fn || fn->start != addr || fn->size == 0 || fn->size > symbols::kMaxFunctionBytes)
    return kernel::EntryPlacement{addr, {}};
  // Only the first instructions matter: read a little, not the whole function. Three of them:
  // endbr64, the ftrace site and the instruction the probe moves to (Linux 6.12 as Debian 13
  // builds it, IBT on, starts every function with endbr64 + nop5; with two, the probe stayed
  // on the ftrace site).
  auto bytes = XP_TRY(read_text(d, fn->start, std::min<std::uint64_t>(fn->size, 3 * x86::kMaxInsnLen)));
  std::vector<x86::Insn> head;
  std::size_t off = 0;
  while (head.size() < 3 && off < bytes.size()) {
    auto i = x86::decode(std::span(bytes).subspan(off), Gva{fn->start.value + off});
    if (!i) break;
    off += i->length;
    head.push_back(*i);
  }
  auto placed = kernel::place_entry_probe(rule_context(d), head, addr);
  if (!placed.moved_because.empty())
    XP_LOG(Info, "domain %u: a probe asked for at %s goes to %s: %s", d.id.value, fn->name.c_str(),
           d.syms->symbolize(placed.address).c_str(), placed.moved_because.c_str());
  return placed;
}

Result<void> Engine::decode_probe_point(Domain& d, Point& p) {
  const Gva addr = p.addr;
  std::vector<x86::Insn> fn_insns;
  if (!d.syms)
    return fail(Errc::InvalidArgument,
                hex(addr.value) +
                    ": refused by rule 'no-symbols': without the guest kernel's symbols neither the "
                    "instruction boundary nor the kernel's own tables can be checked (call load_symbols() with its "
                    "System.map or kallsyms first)");
  // (place() brought the module list up to date for this registration.)
  auto fn = d.syms->function_containing(addr);
  if (!fn || fn->size == 0 || fn->size > symbols::kMaxFunctionBytes) {
    // No function to decode from: the address rules say why (data, a gap, not text).
    x86::Insn bare;
    bare.address = addr;
    bare.length = 1;
    auto r = kernel::check_address(rule_context(d), bare, nullptr);
    std::string where = d.syms->symbolize(addr);
    if (where != hex(addr.value)) where += " (" + hex(addr.value) + ")";
    if (r) return fail(r->code, r->message(where));
    return fail(Errc::InvalidArgument, where + ": no function symbol covers it");
  }
  auto bytes = XP_TRY(read_text(d, fn->start, fn->size));
  const std::string where = d.syms->symbolize(addr) + " (" + hex(addr.value) + ")";
  // Somebody else's breakpoint on the way from the function's start (an in-guest kprobe, a
  // debugger) hides the instruction it replaced, and an in-guest optimized kprobe's jump out of
  // the text leaves the rest of the instructions it replaced behind (rule 'foreign-jump'), so
  // the boundaries past either may be garbage. Padding is walked over (x86::is_padding_trap:
  // after ret, jmp or iret, or filling the function's end after a BUG()'s ud2), and a probe on
  // it meets the instruction rule for an int3; the jumps of our own jump probes are regions of
  // our points. A trap byte or jump in the flow is not ours to reason about.
  auto foreign_patch = [&](const std::vector<x86::Insn>& flow) -> std::optional<Error> {
    for (std::size_t k = 0; k < flow.size() && flow[k].address.value <= addr.value; ++k) {
      const x86::Insn& i = flow[k];
      if (d.points.contains(i.address)) continue;
      if (auto r = kernel::check_foreign_jump(rule_context(d), i, fn->name);
          r && !overlapping_point(d, i.address.value, i.address.value + 1, nullptr))
        return Error{r->code, r->message(where)};
      if (x86::is_trap_byte(i) && !x86::is_padding_trap(flow, k))
        return Error{Errc::Busy, where +
                                     ": refused by rule 'foreign-trap': another breakpoint (an in-guest kprobe or "
                                     "debugger) at " +
                                     d.syms->symbolize(i.address) +
                                     " hides the instruction it replaced, so the instruction boundaries of " +
                                     fn->name + " cannot be trusted; no channel accepts it until it is gone"};
    }
    return std::nullopt;
  };
  auto insn = x86::decode_at(bytes, fn->start, addr);
  if (!insn) {
    // A boundary lost behind such a patch is refused by the patch's rule, which says what to do.
    std::vector<x86::Insn> flow;
    for (std::size_t off = 0; off < bytes.size() && fn->start.value + off < addr.value;) {
      auto i = x86::decode(std::span(bytes).subspan(off), Gva{fn->start.value + off});
      if (!i) break;
      off += i->length;
      flow.push_back(*i);
    }
    if (auto f = foreign_patch(flow)) return std::unexpected(*f);
    Error e = insn.error();
    e.what = fn->name + ": " + e.what;
    return std::unexpected(e);
  }
  p.insn = *insn;
  if (const kernel::Module* m = d.tables ? d.tables->live_module_at(addr.value) : nullptr)
    p.module = kernel::ModuleIdentity::of(*m);
  if (auto all = x86::decode_function(bytes, fn->start)) fn_insns = std::move(*all);
  if (auto r = kernel::check_address(rule_context(d), p.insn, &*fn)) return fail(r->code, r->message(where));
  if (auto r = kernel::check_in_function(rule_context(d), fn_insns, p.insn)) return fail(r->code, r->message(where));
  // Accepted because it can run at its own address or in a fixup slot: it must run there.
  p.own_address = kernel::needs_own_address(rule_context(d), p.insn);
  // The same patches when the boundary check passed: the walk may have gone through garbage.
  if (auto f = foreign_patch(fn_insns)) return std::unexpected(*f);
  std::copy(p.insn.bytes.begin(), p.insn.bytes.end(), p.original.begin());
  p.plan = XP_TRY(x86::analyze(p.insn));

  // On a channel that recognises stops by rip == trap + 1, a vCPU must never stand at
  // addr + 1 for any other reason. For a 1-byte instruction that is exactly where it would
  // continue, so the next instruction runs from the slot as well, and addr + 1 must not be a
  // branch target (a vCPU jumping there would look stopped).
  if (!d.traits.stops_found_by_rip || p.insn.length != 1) return {};
  auto refuse = [&](const std::string& why) {
    return fail(Errc::InvalidArgument, p.insn.describe() + ": a 1-byte instruction " + why +
                                           " (on the debugger channel a vCPU standing right after "
                                           "it cannot be told apart from one stopped on the probe)");
  };
  if (fn_insns.empty()) return refuse("needs the function's symbols to be probed");
  Gva after = p.insn.next();
  auto it = std::find_if(fn_insns.begin(), fn_insns.end(), [&](const x86::Insn& i) { return i.address == after; });
  if (it == fn_insns.end()) return refuse("ends its function");
  for (const auto& i : fn_insns)
    if (i.is_relative_branch() && i.branch_target == after) return refuse("is followed by a branch target");
  // Jump tables: `jmp *table(,%reg,8)` — read the table's entries while they point into the
  // function (a compiler's switch table is bounded by the cmp before the jump).
  const std::uint64_t fn_lo = fn_insns.front().address.value, fn_hi = fn_insns.back().next().value;
  for (const auto& i : fn_insns) {
    if (i.branch != x86::BranchKind::JmpIndirect || !i.mem.present || i.mem.base != x86::Reg::None ||
        i.mem.index == x86::Reg::None || i.mem.scale != 8)
      continue;
    std::uint64_t table = static_cast<std::uint64_t>(i.mem.disp);
    for (unsigned k = 0; k < 1024; ++k) {
      auto e = d.memory->read_u64(Gva{table + 8ull * k});
      if (!e || *e < fn_lo || *e >= fn_hi) break;
      if (*e == after.value) return refuse("is followed by a jump-table target");
    }
  }
  // An emulated 1-byte instruction (ret) never continues at addr + 1 through us: nothing to copy.
  if (p.plan == x86::Plan::EmulateLoaded || p.plan == x86::Plan::EmulateBranch) return {};
  if (d.points.contains(after)) return fail(Errc::Busy, p.insn.describe() + ": the next instruction is probed already");
  auto next_plan = x86::analyze(*it);
  if (!next_plan) return refuse("is followed by an instruction that cannot be probed (" + it->describe() + ")");
  // The next instruction runs out of line too (or is emulated): the address rules hold for it
  // as for the probed one.
  if (auto r = kernel::check_address(rule_context(d), *it, &*fn))
    return fail(r->code, where +
                             ": a 1-byte instruction whose neighbour runs out of line with it on the debugger "
                             "channel; the neighbour " +
                             r->message(d.syms->symbolize(it->address)));
  // The neighbour runs in the probed instruction's ordinary slot, never in a fixup slot.
  if (auto own = kernel::needs_own_address(rule_context(d), *it))
    return fail(Errc::InvalidArgument,
                where +
                    ": a 1-byte instruction whose neighbour runs out of line with it on the debugger channel; "
                    "the neighbour " +
                    d.syms->symbolize(it->address) +
                    " is refused by rule 'exception-table': its "
                    "fault must reach the kernel's fixup (" +
                    own->why +
                    "), which a copy in an ordinary slot "
                    "does not; the guest and vmevent channels accept it");
  p.next = *it;
  p.next_plan = *next_plan;                                  // a branch (pop; ret) is emulated at a trap after the copy
  if (p.plan == x86::Plan::Skip) p.plan = x86::Plan::Boost;  // a 1-byte nop: copy it with the next
  return {};
}

bool Engine::uses_slot(const Point& p) const {
  return !p.in_place && (p.plan == x86::Plan::Boost || p.plan == x86::Plan::BoostRipRel);
}

bool Engine::needs_trap_tail(const Point& p) const {
  if (next_emulated(p)) return true;
  return std::any_of(p.regs.begin(), p.regs.end(), [](const Registration* r) { return bool(r->post); });
}

bool Engine::any_enabled(const Point& p) const {
  return std::any_of(p.regs.begin(), p.regs.end(), [](const Registration* r) { return r->enabled; });
}

channel::TrapEntry Engine::trap_entry(const Point& p) const {
  channel::TrapEntry e;
  if (p.module) e.module = xenprobes_module_id(p.module->name.c_str(), p.module->name.size(), p.module->text.start);
  if (p.jump) {  // the trap byte at the region's start sends the vCPU to the detour
    e.addr = p.jump->region.start;
    e.fallback = channel::TrapEntry::Fallback::Redirect;
    e.resume_at = p.jump->detour;
    e.len = p.jump->region.length;
    std::copy(p.jump->original.begin(), p.jump->original.begin() + e.len, e.insn);
    return e;
  }
  e.addr = p.addr;
  e.len = p.insn.length;
  std::copy(p.original.begin(), p.original.begin() + p.insn.length, e.insn);
  switch (p.plan) {
    case x86::Plan::Boost:
    case x86::Plan::BoostRipRel:
      if (p.slot) {
        e.fallback = channel::TrapEntry::Fallback::ResumeAt;
        e.resume_at = *p.slot;  // the slot runs the original instruction
      } else {
        e.fallback = channel::TrapEntry::Fallback::Emulate;
      }
      break;
    case x86::Plan::Skip:
      e.fallback = channel::TrapEntry::Fallback::ResumeAt;
      e.resume_at = p.insn.next();
      break;
    case x86::Plan::EmulateBranch:
    case x86::Plan::EmulateLoaded: e.fallback = channel::TrapEntry::Fallback::Emulate; break;
  }
  return e;
}

}  // namespace xenprobes::probe
