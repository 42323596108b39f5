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

}  // namespace xenprobes::kernel
