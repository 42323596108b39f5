// Coverage of a real kernel (issue 14, item 5): every instruction of every function of a kernel
// image, and the share the library would accept as
//   - probe-able on the vmevent channel with the guest module's slots (entry placement, the
//     address rules read from the image's own tables, the foreign-trap rule, the instruction
//     rules: what Engine::decode_probe_point decides),
//   - boostable (a slot copy + jmp back: plans boost and boost-riprel),
//   - jump-optimizable (probe-able, and x86::check_jump accepts a 5-byte jump region for it),
// with per-reason counts of everything refused.
//
// The image stands in for the guest's memory: its PT_LOAD segments at their link addresses
// (a memory adaptor), and the kernel layer's own table readers run over it unchanged. The
// image is the kernel before boot: alternatives, retpoline and return-thunk sites and the
// ftrace sites (still `call __fentry__`) are rewritten when it boots, and .smp_locks is still
// there (docs/benchmarks.md says what that changes).
//
//   kernel_coverage [--every N] [--max-functions N] [--examples] [--islands] [--proof] <vmlinux> <System.map>
//
// --islands: one line per instruction that only a short jump to an island serves (islands
// alone, no tail-call proof: what the engine places), "ISLAND <function>+<offset> island
// <function>+<offset> <instruction>", to pick e2e targets (docs/e2e.md).
// --proof: one line per instruction that neither a 5-byte region nor a short jump to an island
// serves without the tail-call proof, and a 5-byte region serves with it (what a session given
// the guest's vmlinux places as a jump, and refuses without it), "PROOF <function>+<offset>
// <instruction>", for the same purpose.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/hex.hpp"
#include "common/log.hpp"
#include "common/elf_image.hpp"
#include "kernel/address_rules.hpp"
#include "kernel/addresses_taken.hpp"
#include "kernel/island_padding.hpp"
#include "kernel/tables.hpp"
#include "symbols/kernel_image.hpp"
#include "symbols/symbol_table.hpp"
#include "x86/analysis.hpp"
#include "x86/detour.hpp"
#include "x86/jump_safety.hpp"

using namespace xenprobes;

namespace {

constexpr std::uint64_t kMaxFunctionBytes = 256 * 1024;  // as the engine: larger "functions" are gaps
constexpr std::size_t kEngineSlotSize = 32;              // probe/engine.hpp kSlotSize: one detour
// Where the detours would run for the size check: the modules' area of x86-64 Linux (its
// MODULES_VADDR), where the guest module's slots are.
constexpr std::uint64_t kModuleArea = 0xffffffffa0000000ull;

struct Counter {
  std::map<std::string, std::size_t> n;
  std::map<std::string, std::string> example;
  // `ex` makes the example, only for a key's first instruction.
  template <class Ex>
  void add(const std::string& key, Ex ex) {
    if (n[key]++ == 0) example[key] = ex();
  }
};

double pct(std::size_t a, std::size_t b) { return b ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0; }

void print(const char* title, const Counter& c, std::size_t total, bool examples) {
  std::vector<std::pair<std::size_t, std::string>> v;
  for (const auto& [k, n] : c.n) v.emplace_back(n, k);
  std::sort(v.rbegin(), v.rend());
  std::printf("  %s\n", title);
  for (const auto& [n, k] : v) {
    std::printf("    %9zu  %6.2f%%  %s\n", n, pct(n, total), k.c_str());
    if (examples) std::printf("               e.g. %s\n", c.example.at(k).c_str());
  }
}

// Which instruction rule refuses `i` (analysis.hpp's predicates, in the gate's order).
std::string insn_rule(const x86::Insn& i) {
  using P = bool (*)(const x86::Insn&);
  static const std::pair<const char*, P> kRules[] = {
      {"trap byte (int3 padding or a foreign breakpoint)", x86::is_trap_byte},
      {"context return (iret/sysret/sysexit)", x86::is_context_return},
      {"software interrupt / syscall", x86::is_software_interrupt},
      {"hlt", x86::is_halt},
      {"ud2/ud1 (BUG/WARN)", x86::is_deliberate_ud},
      {"swapgs", x86::is_gs_swap},
      {"loads SS", x86::is_ss_load},
      {"far transfer", x86::is_far_transfer},
      {"xbegin", x86::is_transaction_begin},
      {"66 + relative branch", x86::is_opsize_relative_branch},
      {"addr32 RIP-relative", x86::is_addr32_rip_relative},
      {"sti", x86::is_interrupt_enable},
  };
  for (const auto& [name, p] : kRules)
    if (p(i)) return name;
  return "other";
}

// A short key for a jump refusal: the rule, and what in the reason tripped it.
std::string jump_key(const x86::JumpRefusal& r) {
  std::string k(x86::jump_rule_name(r.rule));
  struct Word {
    const char* in;
    const char* key;
  };
  if (r.rule == x86::JumpRule::None) return r.reason;  // the engine's own limits
  static const Word kWords[] = {
      {"foreign breakpoint", "int3 in the region"},
      {"deliberate #UD", "ud2 in the region"},
      {"landing pad", "endbr64 in the region"},
      {"rel8 form", "loop/jrcxz"},
      {"indirect call", "indirect call in the region"},
      {"out of rel32 reach", "rel32 reach from the detour"},
      {"push imm32", "call's return address"},
      {"returns to another context", "iret/sysret in the region"},
      {"software interrupt", "int/syscall in the region"},
      {"hlt parks", "hlt in the region"},
      {"swapgs", "swapgs in the region"},
      {"sti:", "sti in the region"},
      {"indirect jump", "indirect jump with unknown targets in the function"},
      {"__ex_table fixup", "exception fixup inside the region"},
      {"target of the jump label", "jump-label target inside the region"},
      {"(its cold part,", "branch from its cold part into the region"},
      {"(another function,", "branch from another function (not its cold part) into the region"},
      {"the branch", "branch into bytes 1..len-1"},
      {"__ex_table entry", "exception-table instruction"},
      {"jump label", "jump-label site"},
      {"static call", "static-call site"},
      {"lock prefix", "SMP lock prefix"},
      {"ftrace site", "ftrace site"},
      {"cross the function's end", "crosses the function's end"},
      {"not an instruction boundary", "not an instruction boundary"},
  };
  for (const Word& w : kWords)
    if (r.reason.find(w.in) != std::string::npos) return k + ": " + w.key;
  return k + ": other";
}

// What the engine would still refuse of a region the rules accept: longer than the 15 bytes the
// guest module restores, or a detour larger than a slot (probe/engine_jump.cpp, plan_jump).
std::optional<std::string> engine_refuses(const x86::JumpFunction& f, const x86::JumpVerdict& v) {
  if (v.region.length > x86::kMaxInsnLen) return "engine: region longer than 15 bytes";
  std::array<std::uint8_t, x86::kMaxDetourSize> scratch{};
  auto l = x86::emit_detour(scratch, Gva{kModuleArea}, f, v.region, v.point, Gva{kModuleArea + 0x100000});
  if (l && l->size > kEngineSlotSize) return "engine: detour larger than a slot";
  return std::nullopt;
}

// What the kernel rewrites at boot, from its own lists in the image (none of which the kernel
// layer reads): alternatives (`struct alt_instr`, 12 bytes on 6.1, 14 on 6.12), paravirt sites
// (6.1), retpoline and return sites, the endbr64 it seals (6.12), and for each direct call
// listed for call-depth tracking (6.12) the 16 bytes before its destination, where the kernel
// copies its accounting template. Dead padding that overlaps any of them is not used.
x86::SiteIndex boot_patched(const symbols::SymbolTable& syms, const symbols::KernelImage& mem) {
  x86::SiteIndex out;
  auto bounds = [&](const char* a, const char* b) -> std::optional<std::pair<std::uint64_t, std::uint64_t>> {
    auto x = syms.lookup(a), y = syms.lookup(b);
    if (!x || !y || x->empty() || y->empty() || y->front().address.value < x->front().address.value)
      return std::nullopt;
    return std::pair{x->front().address.value, y->front().address.value};
  };
  auto s32 = [&](std::uint64_t at) {
    std::int32_t v = 0;
    (void)mem.read(Gva{at}, std::as_writable_bytes(std::span(&v, 1)));
    return static_cast<std::int64_t>(v);
  };
  auto u8 = [&](std::uint64_t at) {
    std::uint8_t v = 0;
    (void)mem.read(Gva{at}, std::as_writable_bytes(std::span(&v, 1)));
    return v;
  };
  struct Rel {
    const char *start, *end, *what;
    std::uint32_t len;
  };
  // A retpoline site is a call/jmp rel32 (5 bytes) or a jcc rel32 or cs-prefixed call (6).
  for (const Rel& r : {Rel{"__retpoline_sites", "__retpoline_sites_end", "retpoline site", 0},
                       Rel{"__return_sites", "__return_sites_end", "return site", 5},
                       Rel{"__ibt_endbr_seal", "__ibt_endbr_seal_end", "sealed endbr64", 4}})
    if (auto b = bounds(r.start, r.end))
      for (std::uint64_t e = b->first; e + 4 <= b->second; e += 4) {
        const std::uint64_t site = e + static_cast<std::uint64_t>(s32(e));
        const std::uint8_t op = u8(site);
        out.add(site, r.len ? r.len : (op == 0xe8 || op == 0xe9) ? 5u : 6u, r.what);
      }
  if (auto b = bounds("__call_sites", "__call_sites_end"))
    for (std::uint64_t e = b->first; e + 4 <= b->second; e += 4) {
      const std::uint64_t site = e + static_cast<std::uint64_t>(s32(e));
      if (u8(site) != 0xe8) continue;
      const std::uint64_t dest = site + 5 + static_cast<std::uint64_t>(s32(site + 1));
      out.add(site, 5, "call-depth call site");
      out.add(dest - 16, 16, "call-depth template before a call's destination");
    }
  if (auto b = bounds("__alt_instructions", "__alt_instructions_end")) {
    const std::uint64_t n = b->second - b->first;
    const std::uint64_t size = n % 12 == 0 ? 12 : n % 14 == 0 ? 14 : 0;  // 6.1 : 6.12
    for (std::uint64_t e = b->first; size && e + size <= b->second; e += size)
      out.add(e + static_cast<std::uint64_t>(s32(e)), std::max<std::uint32_t>(1, u8(e + size - 2)), "alternative");
  }
  if (auto b = bounds("__parainstructions", "__parainstructions_end"))
    for (std::uint64_t e = b->first; e + 16 <= b->second; e += 16) {
      std::uint64_t instr = 0;
      (void)mem.read(Gva{e}, std::as_writable_bytes(std::span(&instr, 1)));
      out.add(instr, std::max<std::uint32_t>(1, u8(e + 9)), "paravirt site");
    }
  return out;
}

int usage() {
  std::fprintf(stderr,
               "usage: kernel_coverage [--every N] [--max-functions N] [--examples] [--islands] [--proof] "
               "<vmlinux> <System.map>\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t every = 1, max_functions = 0;
  bool examples = false, list_islands = false, list_proof = false;
  std::vector<std::string> args;
  for (int k = 1; k < argc; ++k) {
    std::string a = argv[k];
    if ((a == "--every" || a == "--max-functions") && k + 1 < argc) {
      char* end = nullptr;
      unsigned long v = std::strtoul(argv[++k], &end, 10);
      if (!end || *end || v == 0) return usage();
      (a == "--every" ? every : max_functions) = v;
    } else if (a == "--islands") {
      list_islands = true;
    } else if (a == "--proof") {
      list_proof = true;
    } else if (a == "--examples") {
      examples = true;
    } else if (a.starts_with("--")) {
      return usage();
    } else {
      args.push_back(a);
    }
  }
  if (args.size() != 2) return usage();
  log::set_level(log::Level::Error);
  const auto t0 = std::chrono::steady_clock::now();

  auto elf = elf::load(args[0]);
  if (!elf) {
    std::fprintf(stderr, "kernel_coverage: %s\n", elf.error().what.c_str());
    return 1;
  }
  auto syms = symbols::SymbolTable::load(args[1]);
  if (!syms) {
    std::fprintf(stderr, "kernel_coverage: %s\n", syms.error().what.c_str());
    return 1;
  }
  // The image stands in for the guest's memory, with the System.map's symbols.
  const symbols::KernelImage mem = symbols::KernelImage::with_symbols(std::move(*elf), *syms, args[0]);
  // The kernel layer's readers, unchanged, over the image.
  const kernel::KernelTables tables =
      kernel::KernelTables::read(*syms, [&](Gva a, std::span<std::byte> out) { return mem.read(a, out); });
  kernel::RuleContext rc;
  rc.tables = &tables;
  rc.syms = &*syms;
  rc.guest_channel = false;  // vmevent: Xen takes the trap before the guest's int3 path runs
  const kernel::Range text = tables.core_text();
  if (text.empty()) {
    std::fprintf(stderr, "kernel_coverage: no _stext/_etext in %s\n", args[1].c_str());
    return 1;
  }

  // The functions of the core text, by address (the preferred alias of each start).
  std::vector<symbols::Function> fns;
  for (const symbols::Symbol& s : syms->matching("*")) {
    if (s.kind != symbols::SymbolKind::Text || !text.contains(s.address.value)) continue;
    auto f = syms->function_containing(s.address);
    if (f && f->start == s.address) fns.push_back(*f);
  }
  std::sort(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start.value < b.start.value; });
  fns.erase(std::unique(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start == b.start; }),
            fns.end());

  // What the jump rules must leave alone, from the same tables (their own O(log n) queries,
  // walked from the start of the text).
  x86::SiteIndex reserved, entries, thunks;
  std::size_t label_targets = 0;
  for (const kernel::ExEntry* e = tables.exception_entry_in(text.start, text.end); e;
       e = tables.exception_entry_in(e->insn + 1, text.end)) {
    reserved.add(e->insn, 1, "__ex_table entry");
    entries.add(e->fixup, 1, "__ex_table fixup");
  }
  for (const kernel::Site* s = tables.jump_label_in(text.start, text.end); s;
       s = tables.jump_label_in(s->addr + kernel::KernelTables::kJumpSiteLen, text.end)) {
    reserved.add(s->addr, kernel::KernelTables::kJumpSiteLen, "jump label");
    // Its target: a nop in the text until the key flips it into a jmp there.
    if (s->target) entries.add(s->target, 1, "the target of the jump label at " + hex(s->addr));
    ++label_targets;
  }
  for (const kernel::Site* s = tables.static_call_in(text.start, text.end); s;
       s = tables.static_call_in(s->addr + kernel::KernelTables::kStaticCallSiteLen, text.end))
    reserved.add(s->addr, kernel::KernelTables::kStaticCallSiteLen, "static call");
  for (auto l = tables.smp_lock_in(text.start, text.end); l; l = tables.smp_lock_in(*l + 1, text.end)) {
    std::byte b{};
    if (mem.read(Gva{*l}, std::span(&b, 1)) && (b == std::byte{0xf0} || b == std::byte{0x3e}))
      reserved.add(*l, 1, "lock prefix");
  }
  for (const symbols::Function& f : fns)
    if (f.name.starts_with("__x86_indirect_thunk_") || f.name.starts_with("__x86_indirect_jump_thunk_") ||
        f.name.starts_with("__x86_indirect_its_thunk_"))
      thunks.add(f.start.value, static_cast<std::uint32_t>(std::min<std::uint64_t>(f.size, 4096)), f.name);

  // Functions analysed (a slice when asked), and their ftrace sites: reserved for jumps
  // (the kernel's ftrace rewrites them), and moved past by entry placement.
  // `__pfx_<name>` (CONFIG_CALL_PADDING, 6.2+) is the 16 bytes of nops before a function
  // that the kernel rewrites at boot (call-depth thunks, FineIBT): no code of its own, and
  // left out of the figures.
  std::vector<const symbols::Function*> todo;
  std::size_t padding_fns = 0, seen = 0;
  for (const symbols::Function& f : fns) {
    if (f.name.starts_with("__pfx_")) {
      ++padding_fns;
      continue;
    }
    if (seen++ % every != 0) continue;
    if (max_functions && todo.size() >= max_functions) break;
    todo.push_back(&f);
  }
  std::size_t too_large = 0, unreadable = 0, undecodable = 0, undecodable_bytes = 0;
  std::string undecodable_example;
  struct Decoded {
    const symbols::Function* fn;
    std::vector<std::uint8_t> bytes;
    std::vector<x86::Insn> insns;
  };
  std::vector<Decoded> decoded;
  decoded.reserve(todo.size());
  for (const symbols::Function* f : todo) {
    if (f->size == 0 || f->size > kMaxFunctionBytes) {
      ++too_large;
      continue;
    }
    std::vector<std::uint8_t> bytes(f->size);
    if (!mem.read(f->start, std::as_writable_bytes(std::span(bytes)))) {
      ++unreadable;
      continue;
    }
    auto insns = x86::decode_function(bytes, f->start);
    if (!insns) {
      if (undecodable_example.empty()) undecodable_example = f->name + ": " + insns.error().what;
      ++undecodable;
      undecodable_bytes += f->size;
      continue;
    }
    for (std::size_t k = 0; k < std::min<std::size_t>(2, insns->size()); ++k)
      if (kernel::is_ftrace_site(rc, *insns, (*insns)[k])) reserved.add((*insns)[k].address.value, 5, "ftrace site");
    decoded.push_back(Decoded{f, std::move(bytes), std::move(*insns)});
  }

  // Branches from one function into the middle of another (a `foo.cold` part jumping back
  // into `foo`, assembly): entry points of the function they land in. With --every, only the
  // analysed functions' branches are seen.
  std::vector<std::uint64_t> starts;
  starts.reserve(fns.size());
  for (const symbols::Function& f : fns) starts.push_back(f.start.value);
  std::size_t cross = 0, cross_not_cold = 0;
  for (const Decoded& d : decoded) {
    const std::uint64_t lo = d.fn->start.value, hi = lo + d.fn->size;
    for (const x86::Insn& i : d.insns) {
      const std::uint64_t t = i.branch_target.value;
      if (!i.is_relative_branch() || (t >= lo && t < hi) || !text.contains(t)) continue;
      if (std::binary_search(starts.begin(), starts.end(), t)) continue;  // a call or tail call
      // The engine finds the same ones (Engine::cross_function_branches).
      auto into = syms->function_containing(Gva{t});
      const bool cold = into && d.fn->name.starts_with(into->name + ".cold");
      entries.add(t, 1,
                  "the target of a branch in " + d.fn->name + (cold ? " (its cold part, " : " (another function, ") +
                      hex(i.address.value) + ")");
      ++cross;
      cross_not_cold += !cold;
    }
  }

  // Jump-table entries, as the engine reads them: a `jmp [index*8 + table]`'s entries while
  // they point into the function. Anything else indirect (a register, a retpoline thunk) has
  // unknown targets.
  const Decoded* current = nullptr;
  x86::JumpContext jc;
  jc.reserved = &reserved;
  jc.entry_points = &entries;
  jc.indirect_thunks = &thunks;
  // An IBT build lists the endbr64 it may seal at boot between these symbols.
  jc.endbr_marks_indirect_targets = bool(syms->lookup("__ibt_endbr_seal"));
  std::size_t tables_read = 0;
  jc.indirect_targets = [&](const x86::Insn& i) -> std::optional<std::vector<Gva>> {
    if (i.branch != x86::BranchKind::JmpIndirect || !i.mem.present || i.mem.base != x86::Reg::None ||
        i.mem.index == x86::Reg::None || i.mem.scale != 8)
      return std::nullopt;
    const std::uint64_t lo = current->fn->start.value, hi = lo + current->fn->size;
    std::vector<Gva> out;
    for (unsigned k = 0; k < 1024; ++k) {
      std::uint64_t e = 0;
      if (!mem.read(Gva{static_cast<std::uint64_t>(i.mem.disp) + 8ull * k}, std::as_writable_bytes(std::span(&e, 1))) ||
          e < lo || e >= hi)
        break;
      out.push_back(Gva{e});
    }
    if (out.empty()) return std::nullopt;
    ++tables_read;
    return out;
  };

  // Measured, not placed by the engine yet (docs/benchmarks.md says which): (b) tail calls
  // proven from the addresses the image forms (kernel::addresses_taken, which the engine runs
  // when it is given the guest's vmlinux), over every function of the core and init text
  // (all of them, whatever --every says) and the alternatives' code, which has no symbols;
  // (i) short jumps to islands in dead padding (which padding per kernel: dead_padding(),
  // whose bytes no kernel of 6.1 or 6.12 rewrites: the 6.2+ call padding is its own __pfx_
  // symbol, left out above).
  x86::SiteIndex taken;
  double taken_secs = 0;
  {
    std::vector<const std::vector<x86::Insn>*> code;
    for (const Decoded& d : decoded) code.push_back(&d.insns);
    const auto t_taken = std::chrono::steady_clock::now();
    taken = kernel::taken_index(kernel::addresses_taken(mem, text, tables.init_text(), code));
    taken_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_taken).count();
  }
  x86::JumpContext jc_proof = jc;
  jc_proof.addresses_taken = &taken;
  // Dead padding, per context: a function the taint no longer covers has padding too.
  x86::SiteIndex pad, pad_proof;
  const x86::SiteIndex patched = boot_patched(*syms, mem);
  std::size_t fn_relaxed = 0, pad_dropped = 0;
  std::string pad_dropped_example;
  // With call-depth tracking the kernel may copy its template into the 16 bytes before any
  // call's destination, also one it picks at run time (a static call's new target): before a
  // function with no __pfx_ symbol of its own, those bytes are the previous function's
  // padding, and no island goes there. (Its copy checks for nops first, but a vCPU paused
  // between that check and the copy would write over an island placed meanwhile.)
  kernel::IslandPaddingRules pad_rules = kernel::island_padding_rules(*syms);
  pad_rules.boot_patched = &patched;
  std::size_t pad_trimmed = 0;
  auto usable = [&](std::optional<std::pair<Gva, Gva>>& p) {
    if (!p) return false;
    kernel::IslandPaddingCut cut;
    const std::pair<Gva, Gva> whole = *p;
    const bool ok = kernel::usable_island_padding(*syms, pad_rules, *p, &cut);
    pad_trimmed += cut.trimmed;
    if (cut.dropped && pad_dropped++ == 0) pad_dropped_example = syms->symbolize(whole.first) + ": " + *cut.dropped;
    return ok;
  };
  std::vector<std::string> still_unknown;  // with the proof: who forms an address inside
  for (const Decoded& d : decoded) {
    current = &d;
    const Gva lo = d.fn->start, hi = d.fn->start + d.fn->size;
    if (auto p = x86::dead_padding(x86::JumpFunction::from_insns(d.insns, lo, hi, jc)); usable(p))
      pad.add(p->first.value, static_cast<std::uint32_t>(p->second.value - p->first.value), d.fn->name);
    const auto jp = x86::JumpFunction::from_insns(d.insns, lo, hi, jc_proof);
    fn_relaxed += jp.only_leaving_indirect_jumps();
    if (jp.unknown_targets())
      still_unknown.push_back(d.fn->name + ": " + x86::interior_address_taken(jp).value_or("?"));
    if (auto p = x86::dead_padding(jp); usable(p))
      pad_proof.add(p->first.value, static_cast<std::uint32_t>(p->second.value - p->first.value), d.fn->name);
  }
  x86::JumpContext jc_islands = jc, jc_both = jc_proof;
  jc_islands.island_padding = &pad;
  jc_both.island_padding = &pad_proof;

  std::size_t total = 0, probeable = 0, boostable = 0, jump_ok = 0, jump_own = 0, jump_earlier = 0, agentless = 0,
              fn_with_unknown = 0, if_proof = 0, if_islands = 0, if_both = 0, island_used = 0, island_earlier = 0;
  Counter refused, plans, jump_refused, jump_earlier_why, both_refused, island_why;
  for (const Decoded& d : decoded) {
    current = &d;
    const auto& insns = d.insns;
    const Gva lo = d.fn->start, hi = d.fn->start + d.fn->size;
    const x86::JumpFunction jf = x86::JumpFunction::from_insns(insns, lo, hi, jc);
    std::optional<x86::JumpFunction> jf_proof, jf_islands, jf_both;  // made when needed
    if (jf.unknown_targets()) ++fn_with_unknown;
    // The engine's foreign-trap rule: an int3 in the flow (not padding, x86::is_padding_trap)
    // hides the instruction it replaced, and refuses every point after it.
    std::size_t first_foreign = insns.size();
    for (std::size_t k = 0; k < insns.size(); ++k) {
      if (x86::is_trap_byte(insns[k]) && !x86::is_padding_trap(insns, k)) {
        first_foreign = k;
        break;
      }
    }
    for (std::size_t k = 0; k < insns.size(); ++k) {
      const x86::Insn& i = insns[k];
      ++total;
      auto where = [&] { return d.fn->name + "+" + hex(i.address.value - d.fn->start.value) + " " + i.describe(); };
      if (k == 0 && x86::is_endbr(i) && insns.size() > 1) {
        refused.add("entry: endbr64 (an entry probe moves past it)", where);
        continue;
      }
      if (k < 2 && kernel::is_ftrace_site(rc, insns, i)) {
        refused.add("entry: the ftrace site (an entry probe moves past it)", where);
        continue;
      }
      if (auto r = kernel::check_address(rc, i, d.fn)) {
        refused.add(std::string("address rule: ") + r->rule, where);
        continue;
      }
      if (k > first_foreign) {
        refused.add("foreign-trap (an int3 earlier in the flow)", where);
        continue;
      }
      auto plan = x86::analyze(i);
      if (!plan) {
        refused.add("instruction rule: " + insn_rule(i), where);
        continue;
      }
      ++probeable;
      plans.add(std::string(x86::plan_name(*plan)), where);
      if (*plan == x86::Plan::Boost || *plan == x86::Plan::BoostRipRel) ++boostable;
      if (!x86::xen_emulator_refusal(i)) ++agentless;
      const x86::JumpVerdict v = x86::check_jump(jf, i.address);
      const auto engine_no = v.optimizable ? engine_refuses(jf, v) : std::nullopt;
      if (v.optimizable && !engine_no) {
        ++jump_ok;
        if (v.starts_earlier) {
          ++jump_earlier;
          jump_earlier_why.add(jump_key(v.refusal), where);
        } else {
          ++jump_own;
        }
        continue;
      }
      if (engine_no) jump_refused.add(*engine_no, where);
      else jump_refused.add(jump_key(v.refusal), [&] { return where() + ": " + v.refusal.reason; });
      // What the measured-only ideas would add, each alone and both together.
      auto placed = [&](std::optional<x86::JumpFunction>& f, const x86::JumpContext& c) {
        current = &d;
        if (!f) f.emplace(x86::JumpFunction::from_insns(insns, lo, hi, c));
        x86::JumpVerdict w = x86::check_jump(*f, i.address);
        if (auto no = w.optimizable ? engine_refuses(*f, w) : std::nullopt) {
          w.optimizable = false;
          w.refusal = x86::JumpRefusal{x86::JumpRule::None, *no};
        }
        return w;
      };
      const x86::JumpVerdict wp = placed(jf_proof, jc_proof);
      const bool proof = wp.optimizable;
      const x86::JumpVerdict wi = placed(jf_islands, jc_islands);
      const bool islands = wi.optimizable;
      if (list_proof && proof && !islands)
        std::printf("PROOF %s+%s %s%s\n", d.fn->name.c_str(), hex(i.address.value - lo.value).c_str(),
                    i.describe().c_str(), wp.starts_earlier ? " (a region starting earlier)" : "");
      if (list_islands && islands && wi.island)
        std::printf("ISLAND %s+%s island %s %s\n", d.fn->name.c_str(), hex(i.address.value - lo.value).c_str(),
                    syms->symbolize(*wi.island).c_str(), i.describe().c_str());
      const x86::JumpVerdict w = placed(jf_both, jc_both);
      if_proof += proof;
      if_islands += islands;
      if (w.optimizable) {
        ++if_both;
        if (w.island) {
          ++island_used;
          island_why.add(jump_key(w.refusal), where);
          island_earlier += w.starts_earlier;
        }
      } else {
        both_refused.add(jump_key(w.refusal), [&] { return where() + ": " + w.refusal.reason; });
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("kernel: %s\n", args[0].c_str());
  std::printf("symbols: %s (%zu functions in [_stext, _etext) %s-%s)\n", args[1].c_str(), fns.size(),
              hex(text.start).c_str(), hex(text.end).c_str());
  std::printf("tables: %s\n", tables.summary().c_str());
  std::printf(
      "jump context: %zu reserved sites, %zu exception fixups, %zu jump-label targets, %zu branches from "
      "other functions (%zu not from a cold part), %zu retpoline thunks, IBT build: %s\n",
      reserved.size(), entries.size() - cross - label_targets, label_targets, cross, cross_not_cold, thunks.size(),
      jc.endbr_marks_indirect_targets ? "yes" : "no");
  std::printf(
      "analysed: %zu functions (every %zu%s), %zu instructions; skipped: %zu __pfx_ padding, %zu too "
      "large or unsized, %zu unreadable, %zu undecodable (%zu bytes)\n",
      decoded.size(), every, max_functions ? ", capped" : "", total, padding_fns, too_large, unreadable, undecodable,
      undecodable_bytes);
  if (examples && !undecodable_example.empty()) std::printf("  e.g. undecodable: %s\n", undecodable_example.c_str());
  std::printf(
      "functions with an indirect jump of unknown targets: %zu (%zu of them only leaving it: no address "
      "inside them formed anywhere); jump tables read: %zu\n",
      fn_with_unknown, fn_relaxed, tables_read);
  std::printf(
      "interior code addresses formed: %zu (found in %.1f s); dead padding: %zu functions (%zu with the tail-call "
      "proof); "
      "boot-time patch sites: %zu, overlapping dead padding: %zu; padding cut before a function "
      "without __pfx_ (call-depth tracking): %zu\n",
      taken.size(), taken_secs, pad.size(), pad_proof.size(), patched.size(), pad_dropped, pad_trimmed);
  if (examples && pad_dropped)
    std::printf("  e.g. dead padding with a boot-time patch site: %s\n", pad_dropped_example.c_str());
  if (examples)
    for (const std::string& u : still_unknown) std::printf("  indirect jumps not proven to leave: %s\n", u.c_str());
  std::printf("\n%-58s %9zu  %6.2f%%\n", "probe-able (vmevent channel, module slots)", probeable,
              pct(probeable, total));
  std::printf("%-58s %9zu  %6.2f%%\n", "boostable (slot copy + jmp back: boost, boost-riprel)", boostable,
              pct(boostable, total));
  std::printf("%-58s %9zu  %6.2f%%\n", "agentless-safe (Xen's emulator runs it as the CPU does)", agentless,
              pct(agentless, total));
  std::printf("%-58s %9zu  %6.2f%%  (%.2f%% of probe-able)\n", "jump-optimizable", jump_ok, pct(jump_ok, total),
              pct(jump_ok, probeable));
  std::printf("%-58s %9zu  %6.2f%%\n", "  its own region", jump_own, pct(jump_own, total));
  std::printf("%-58s %9zu  %6.2f%%\n", "  a region starting earlier in its basic block", jump_earlier,
              pct(jump_earlier, total));
  std::printf("measured, not placed by the engine yet (jump-optimizable if it placed them):\n");
  std::printf("%-58s %9zu  %6.2f%%  (%.2f%% of probe-able)\n", "  + tail calls proven (the engine, given the vmlinux)",
              jump_ok + if_proof, pct(jump_ok + if_proof, total), pct(jump_ok + if_proof, probeable));
  std::printf("%-58s %9zu  %6.2f%%  (%.2f%% of probe-able)\n", "  + short jumps to islands", jump_ok + if_islands,
              pct(jump_ok + if_islands, total), pct(jump_ok + if_islands, probeable));
  std::printf("%-58s %9zu  %6.2f%%  (%.2f%% of probe-able)\n", "  + both", jump_ok + if_both,
              pct(jump_ok + if_both, total), pct(jump_ok + if_both, probeable));
  std::printf("%-58s %9zu  %6.2f%%  (%zu starting earlier)\n", "    of which short jumps to islands", island_used,
              pct(island_used, total), island_earlier);
  std::printf("\n(percentages of all %zu instructions)\n", total);
  print("not probe-able, by first refusal:", refused, total, examples);
  print("probe-able, by plan:", plans, total, examples);
  print("probe-able but not jump-optimizable, by the own region's first refusal:", jump_refused, total, examples);
  print("served by an earlier region; why the own region was refused:", jump_earlier_why, total, examples);
  print("with both measured ideas: served by a short jump; why the 5-byte region was refused:", island_why, total,
        examples);
  print("with both measured ideas: still not jump-optimizable, by the own region's first refusal:", both_refused, total,
        examples);
  std::printf("\ntime: %.1f s\n", secs);

  // A run that saw nothing, or read none of the tables, proves nothing.
  bool ok = total > 0 && jump_ok > 0;
  for (const kernel::TableStatus* st :
       {&tables.ex_status(), &tables.jump_status(), &tables.static_call_status(), &tables.smp_locks_status()})
    if (!st->found || st->entries == 0) {
      std::fprintf(stderr, "kernel_coverage: table %s not read: %s\n", st->name, st->why.c_str());
      ok = false;
    }
  return ok ? 0 : 1;
}
