// bench/kernel_coverage's parts (kernel_coverage.cpp says what it measures and how it is run):
//   coverage_kernel.cpp      the image standing in for a guest's memory, its functions decoded,
//                            and what the jump rules need of it, read from its own tables
//   coverage_boot_sites.cpp  what the kernel rewrites at boot, from its own lists in the image
//   coverage_count.cpp       every instruction decided: probe-able, boostable, jump-optimizable,
//                            today and with the engine's two rules, with per-reason counts
//   coverage_report.cpp      the figures printed
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "kernel/address_rules.hpp"
#include "kernel/island_padding.hpp"
#include "kernel/tables.hpp"
#include "symbols/kernel_image.hpp"
#include "symbols/symbol_table.hpp"
#include "x86/insn.hpp"
#include "x86/jump_safety.hpp"

namespace xenprobes::coverage {

struct Options {
  std::size_t every = 1;          // every Nth function only
  std::size_t max_functions = 0;  // at most this many (0: all)
  bool examples = false;          // one instruction per reason
  bool list_islands = false;      // one ISLAND line per point only a short jump serves
  bool list_proof = false;        // one PROOF line per point only the tail-call proof makes a jump
  std::string vmlinux, system_map;
};

struct Decoded {
  const symbols::Function* fn = nullptr;
  std::vector<x86::Insn> insns;
};

// The kernel under measure (coverage_kernel.cpp). The jump contexts point into it: it is made
// in place by load() and never copied or moved.
struct Kernel {
  Kernel(symbols::SymbolTable s, symbols::KernelImage m) : syms(std::move(s)), mem(std::move(m)) {}
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  // The image and its symbols, the kernel layer's readers run over it, the core text's
  // functions (by address, the preferred alias of each start) and those analysed, decoded.
  [[nodiscard]] static Result<std::unique_ptr<Kernel>> load(const Options& o);

  symbols::SymbolTable syms;
  symbols::KernelImage mem;
  kernel::KernelTables tables;
  kernel::RuleContext rc;  // the vmevent channel's address rules
  kernel::Range text;      // [_stext, _etext)
  std::vector<symbols::Function> fns;
  std::vector<Decoded> decoded;
  // Not analysed: __pfx_ padding, too large or unsized, unreadable, undecodable.
  std::size_t padding_fns = 0, too_large = 0, unreadable = 0, undecodable = 0, undecodable_bytes = 0;
  std::string undecodable_example;

  // What the jump rules must leave alone and where functions are entered from outside them,
  // over the whole core text (as the engine's jump index); retpoline thunks.
  x86::SiteIndex reserved, entries, thunks;
  std::size_t label_targets = 0, cross = 0, cross_not_cold = 0;
  std::size_t tables_read = 0;       // jump tables read
  const Decoded* current = nullptr;  // whose jump tables jc's indirect_targets reads
  x86::JumpContext jc;               // today's context
  // The tail-call proof (kernel::addresses_taken, as the engine runs it given the vmlinux).
  x86::SiteIndex taken;
  double taken_secs = 0;
  x86::JumpContext jc_proof;
  // What the kernel rewrites at boot (coverage_boot_sites.cpp), and the library's island
  // padding selection over the image (kernel::island_padding_near, as the engine calls it).
  x86::SiteIndex patched;
  kernel::IslandPaddingSource islands;
};

// What the kernel rewrites at boot, from its own lists in the image (coverage_boot_sites.cpp).
x86::SiteIndex boot_patched(const symbols::SymbolTable& syms, const symbols::KernelImage& mem);

// Instructions per key, with the first one's description.
struct Counter {
  std::map<std::string, std::size_t> n;
  std::map<std::string, std::string> example;
  template <class Ex>
  void add(const std::string& key, Ex ex) {  // `ex` makes the example, for a key's first only
    if (n[key]++ == 0) example[key] = ex();
  }
};

// Jumps the engine places beyond today's with one of its rules or both: the points it adds
// and those that stay traps.
struct Placed {
  std::size_t added = 0;                        // jump-optimizable beyond today's
  std::size_t island = 0, island_earlier = 0;   // by a short jump (its region starting earlier)
  std::size_t island_own = 0, island_prev = 0;  // its island in the function's own padding / the one before
  Counter island_why;                           // why the 5-byte region was refused
  Counter refused;                              // still traps: the own 5-byte region's first refusal
  Counter short_refused;                        // still traps: what the own short region lacks
};

// The padding the engine's rule lists for the functions analysed, in one context.
struct PaddingListed {
  std::size_t own = 0, previous = 0, trimmed = 0, dropped = 0;
  std::string dropped_example;
};

struct Tally {
  std::size_t total = 0, probeable = 0, boostable = 0, agentless = 0;
  std::size_t jump_ok = 0, jump_own = 0, jump_earlier = 0;
  std::size_t fn_with_unknown = 0, fn_relaxed = 0;
  std::vector<std::string> still_unknown;  // with the proof: who forms an address inside
  Counter refused, plans, jump_refused, jump_earlier_why;
  std::size_t proof = 0;  // + tail calls proven
  Placed islands, both;   // + short jumps to islands; + both
  PaddingListed pad, pad_proof;
};

// Every instruction of the analysed functions (coverage_count.cpp). Prints the ISLAND lines
// when asked.
Tally count(Kernel& k, const Options& o);

// The figures (coverage_report.cpp).
void report(const Kernel& k, const Options& o, const Tally& t, double secs);

double pct(std::size_t a, std::size_t b);

}  // namespace xenprobes::coverage
