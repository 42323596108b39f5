// Which dead padding a kernel leaves alone, so that a short jump's island may go there
// (x86/jump_safety.hpp "island-in-reach"; docs/benchmarks.md says why per kernel). Shared by
// the engine (live text, after the kernel's boot-time patching) and bench/kernel_coverage
// (the image, before it, with the kernel's own lists of what it rewrites at boot).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "symbols/symbol_table.hpp"
#include "x86/jump_safety.hpp"

namespace xenprobes::kernel {

struct IslandPaddingRules {
  // Call-depth tracking is built in (the `__call_sites` list exists: 6.2+ CONFIG_CALL_THUNKS):
  // the kernel may copy its accounting template into the 16 bytes before any call's
  // destination, also one it picks at run time (a static call's new target). Before a
  // function with no `__pfx_` symbol of its own those bytes are the previous function's
  // padding: they are cut off.
  bool call_thunks = false;
  // What the kernel rewrites at boot (the image's alternatives, paravirt, retpoline, return,
  // sealed-endbr and call-depth sites), when the caller knows it: padding that one of them
  // overlaps is not used. Null: the caller reads live text, already patched.
  const x86::SiteIndex* boot_patched = nullptr;
};

// From the symbols: call_thunks.
IslandPaddingRules island_padding_rules(const symbols::SymbolTable& syms);

struct IslandPaddingCut {
  bool trimmed = false;                // 16 bytes cut before a function without __pfx_
  std::optional<std::string> dropped;  // why none of it is usable (a boot-patched site in it)
};

// `pad` (x86::dead_padding() of a function) as the kernel leaves it alone: trimmed in place;
// false when nothing usable (at least an island) is left. `cut` says what happened.
bool usable_island_padding(const symbols::SymbolTable& syms, const IslandPaddingRules& rules, std::pair<Gva, Gva>& pad,
                           IslandPaddingCut* cut = nullptr);

}  // namespace xenprobes::kernel
