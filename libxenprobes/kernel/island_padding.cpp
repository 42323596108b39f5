// Which dead padding a kernel leaves alone (island_padding.hpp).
#include "kernel/island_padding.hpp"

#include <algorithm>

namespace xenprobes::kernel {

IslandPaddingRules island_padding_rules(const symbols::SymbolTable& syms) {
  IslandPaddingRules r;
  r.call_thunks = syms.lookup("__call_sites").has_value();
  return r;
}

bool usable_island_padding(const symbols::SymbolTable& syms, const IslandPaddingRules& rules, std::pair<Gva, Gva>& pad,
                           IslandPaddingCut* cut) {
  if (rules.call_thunks) {
    auto next = syms.function_containing(pad.second);
    if (next && next->start == pad.second && !next->name.starts_with("__pfx_")) {
      if (cut) cut->trimmed = true;
      pad.second = Gva{pad.second.value - std::min<std::uint64_t>(16, pad.second.value - pad.first.value)};
      if (pad.second.value - pad.first.value < x86::kIslandLen) return false;
    }
  }
  if (rules.boot_patched)
    if (const x86::SiteIndex::Site* b = rules.boot_patched->overlapping(pad.first.value, pad.second.value)) {
      if (cut) cut->dropped = b->what + " at " + syms.symbolize(Gva{b->addr});
      return false;
    }
  return true;
}

IslandPaddingListed island_padding_near(const IslandPaddingSource& src, const std::vector<x86::Insn>& insns, Gva lo,
                                        Gva hi, const x86::JumpContext& jc, x86::SiteIndex& padding) {
  constexpr std::uint64_t kPfxMax = 64;  // CONFIG_FUNCTION_PADDING_BYTES: 16 on x86-64 (at most 64)
  IslandPaddingListed out;
  if (!src.syms) return out;
  const symbols::SymbolTable& syms = *src.syms;
  // The function's own padding, in the context its points are checked in.
  auto pad = x86::dead_padding(x86::JumpFunction::from_insns(insns, lo, hi, jc));
  if (pad && usable_island_padding(syms, src.rules, *pad, &out.own_cut)) {
    padding.add(pad->first.value, static_cast<std::uint32_t>(pad->second.value - pad->first.value), "dead padding");
    out.own = true;
  }
  // The previous function's, when it ends right at lo (within reach of this one's first bytes).
  if (!src.tables || !src.read || lo.value == 0) return out;
  auto ends_at = [&](const Result<symbols::Function>& f, Gva end) {
    return f && f->start != end && f->size != 0 && f->size <= symbols::kMaxFunctionBytes &&
           f->start.value + f->size == end.value;
  };
  auto prev = syms.function_containing(Gva{lo.value - 1});
  if (!ends_at(prev, lo)) return out;
  // With call padding (6.2+) the bytes right before a function are its `__pfx_` symbol, which the
  // kernel rewrites (call-depth tracking) and which has no padding of its own: the previous
  // function is the one before it, whose padding ends where the __pfx_ symbol starts.
  if (prev->name.starts_with("__pfx_") && prev->size <= kPfxMax) {
    const Gva pfx = prev->start;
    prev = syms.function_containing(Gva{pfx.value - 1});
    if (!ends_at(prev, pfx)) return out;
  }
  const Gva end = prev->start + prev->size;
  auto bytes = src.read(prev->start, prev->size);
  if (!bytes || bytes->size() != prev->size) return out;
  auto pi = x86::decode_function(*bytes, prev->start);
  if (!pi) return out;
  x86::JumpContext pc;
  pc.indirect_thunks = jc.indirect_thunks;
  pc.endbr_marks_indirect_targets = jc.endbr_marks_indirect_targets;
  auto pp = x86::dead_padding(x86::JumpFunction::from_insns(*pi, prev->start, end, pc));
  if (!pp) return out;
  const KernelTables& t = *src.tables;
  const std::uint64_t a = pp->first.value - 4, b = pp->second.value;  // a site reaching into it
  if (t.exception_entry_in(a, b) || t.jump_label_in(a, b) || t.static_call_in(a, b) || t.smp_lock_in(a, b) ||
      (src.entered && src.entered->overlapping(pp->first.value, b)))
    return out;
  if (usable_island_padding(syms, src.rules, *pp, &out.previous_cut)) {
    padding.add(pp->first.value, static_cast<std::uint32_t>(pp->second.value - pp->first.value),
                "dead padding of " + prev->name);
    out.previous = prev->name;
  }
  return out;
}

}  // namespace xenprobes::kernel
