// Which dead padding a kernel leaves alone, so that a short jump's island may go there
// (x86/jump_safety.hpp "island-in-reach"; docs/benchmarks.md says why per kernel), and which
// functions' padding an island for a point may use. Shared by the engine (live text, after
// the kernel's boot-time patching) and bench/kernel_coverage (the image, before it, with the
// kernel's own lists of what it rewrites at boot).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"
#include "x86/insn.hpp"
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

// `size` bytes of kernel text at `start`, as the caller sees them (the engine reads its own
// patches back as the bytes they replaced).
using TextReadFn = std::function<Result<std::vector<std::uint8_t>>(Gva start, std::uint64_t size)>;

// What island_padding_near() needs of the kernel.
struct IslandPaddingSource {
  const symbols::SymbolTable* syms = nullptr;
  // The kernel's tables: an entry reaching into the previous function's padding refuses it.
  // Null: only the function's own padding is listed.
  const KernelTables* tables = nullptr;
  // Addresses entered from outside their function's own branches, over the core text
  // (exception fixups, jump labels' targets, branches from other functions): one in the
  // previous function's padding refuses it. Null: none known.
  const x86::SiteIndex* entered = nullptr;
  IslandPaddingRules rules;
  TextReadFn read;  // the previous function's bytes
};

// What island_padding_near() listed, and why not the rest.
struct IslandPaddingListed {
  bool own = false;                     // the function's own dead padding
  IslandPaddingCut own_cut;             // what usable_island_padding() did to it
  std::optional<std::string> previous;  // the previous function's name, when its padding is listed
  IslandPaddingCut previous_cut;
};

// The dead padding an island for a point of the function [lo, hi) may use, added to `padding`
// (for JumpContext::island_padding): the function's own (x86::dead_padding() of `insns`
// under `jc`, the context its points are checked in), and the padding of the function that
// ends right at `lo`, the one before it (with call padding, 6.2+, the one before the function's
// `__pfx_` symbol, whose bytes the kernel rewrites). That one is read and decoded here in a context of its
// own: its retpoline thunks and IBT as `jc` says, no jump table read (an indirect jump makes
// its padding unknown: stricter) and no tail-call proof; a table entry reaching into its
// padding, or an address `src.entered` lists there, refuses it. Each as usable_island_padding()
// leaves it. Functions larger than 256 KiB (a gap between symbols) are not decoded.
IslandPaddingListed island_padding_near(const IslandPaddingSource& src, const std::vector<x86::Insn>& insns, Gva lo,
                                        Gva hi, const x86::JumpContext& jc, x86::SiteIndex& padding);

}  // namespace xenprobes::kernel
