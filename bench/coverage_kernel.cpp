// The kernel under measure (coverage.hpp): the image stands in for the guest's memory (its
// PT_LOAD segments at their link addresses), the kernel layer's own table readers run over it
// unchanged, and the jump rules get what the engine gives them of a live guest: the tables'
// sites, the entries from outside a function, the retpoline thunks, the jump tables, and
// given the vmlinux, the tail-call proof.
#include <algorithm>
#include <chrono>

#include "common/elf_image.hpp"
#include "common/hex.hpp"
#include "coverage.hpp"
#include "kernel/addresses_taken.hpp"

namespace xenprobes::coverage {

namespace {

// The functions of the core text, by address (the preferred alias of each start).
std::vector<symbols::Function> core_functions(const symbols::SymbolTable& syms, const kernel::Range& text) {
  std::vector<symbols::Function> fns;
  for (const symbols::Symbol& s : syms.matching("*")) {
    if (s.kind != symbols::SymbolKind::Text || !text.contains(s.address.value)) continue;
    auto f = syms.function_containing(s.address);
    if (f && f->start == s.address) fns.push_back(*f);
  }
  std::sort(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start.value < b.start.value; });
  fns.erase(std::unique(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start == b.start; }),
            fns.end());
  return fns;
}

// What the jump rules must leave alone, from the tables (their own O(log n) queries, walked
// from the start of the text), and the retpoline thunks.
void table_sites(Kernel& k) {
  const kernel::Range& text = k.text;
  const kernel::KernelTables& t = k.tables;
  for (const kernel::ExEntry* e = t.exception_entry_in(text.start, text.end); e;
       e = t.exception_entry_in(e->insn + 1, text.end)) {
    k.reserved.add(e->insn, 1, "__ex_table entry");
    k.entries.add(e->fixup, 1, "__ex_table fixup");
  }
  for (const kernel::Site* s = t.jump_label_in(text.start, text.end); s;
       s = t.jump_label_in(s->addr + kernel::KernelTables::kJumpSiteLen, text.end)) {
    k.reserved.add(s->addr, kernel::KernelTables::kJumpSiteLen, "jump label");
    // Its target: a nop in the text until the key flips it into a jmp there.
    if (s->target) k.entries.add(s->target, 1, "the target of the jump label at " + hex(s->addr));
    ++k.label_targets;
  }
  for (const kernel::Site* s = t.static_call_in(text.start, text.end); s;
       s = t.static_call_in(s->addr + kernel::KernelTables::kStaticCallSiteLen, text.end))
    k.reserved.add(s->addr, kernel::KernelTables::kStaticCallSiteLen, "static call");
  for (auto l = t.smp_lock_in(text.start, text.end); l; l = t.smp_lock_in(*l + 1, text.end)) {
    std::byte b{};
    if (k.mem.read(Gva{*l}, std::span(&b, 1)) && (b == std::byte{0xf0} || b == std::byte{0x3e}))
      k.reserved.add(*l, 1, "lock prefix");
  }
  for (const symbols::Function& f : k.fns)
    if (f.name.starts_with("__x86_indirect_thunk_") || f.name.starts_with("__x86_indirect_jump_thunk_") ||
        f.name.starts_with("__x86_indirect_its_thunk_"))
      k.thunks.add(f.start.value, static_cast<std::uint32_t>(std::min<std::uint64_t>(f.size, 4096)), f.name);
}

// The functions analysed (a slice when asked), decoded, and their ftrace sites: reserved for
// jumps (the kernel's ftrace rewrites them), and moved past by entry placement.
// `__pfx_<name>` (CONFIG_CALL_PADDING, 6.2+) is the 16 bytes of nops before a function that
// the kernel rewrites at boot (call-depth thunks, FineIBT): no code of its own, and left out.
void decode_functions(Kernel& k, const Options& o) {
  std::vector<const symbols::Function*> todo;
  std::size_t seen = 0;
  for (const symbols::Function& f : k.fns) {
    if (f.name.starts_with("__pfx_")) {
      ++k.padding_fns;
      continue;
    }
    if (seen++ % o.every != 0) continue;
    if (o.max_functions && todo.size() >= o.max_functions) break;
    todo.push_back(&f);
  }
  k.decoded.reserve(todo.size());
  for (const symbols::Function* f : todo) {
    if (f->size == 0 || f->size > symbols::kMaxFunctionBytes) {
      ++k.too_large;
      continue;
    }
    std::vector<std::uint8_t> bytes(f->size);
    if (!k.mem.read(f->start, std::as_writable_bytes(std::span(bytes)))) {
      ++k.unreadable;
      continue;
    }
    auto insns = x86::decode_function(bytes, f->start);
    if (!insns) {
      if (k.undecodable_example.empty()) k.undecodable_example = f->name + ": " + insns.error().what;
      ++k.undecodable;
      k.undecodable_bytes += f->size;
      continue;
    }
    for (std::size_t j = 0; j < std::min<std::size_t>(2, insns->size()); ++j)
      if (kernel::is_ftrace_site(k.rc, *insns, (*insns)[j]))
        k.reserved.add((*insns)[j].address.value, 5, "ftrace site");
    k.decoded.push_back(Decoded{f, std::move(*insns)});
  }
}

// Branches from one function into the middle of another (a `foo.cold` part jumping back into
// `foo`, assembly): entry points of the function they land in. The engine finds the same ones
// (Engine::cross_function_branches). With --every, only the analysed functions' are seen.
void cross_function_branches(Kernel& k) {
  std::vector<std::uint64_t> starts;
  starts.reserve(k.fns.size());
  for (const symbols::Function& f : k.fns) starts.push_back(f.start.value);
  for (const Decoded& d : k.decoded) {
    const std::uint64_t lo = d.fn->start.value, hi = lo + d.fn->size;
    for (const x86::Insn& i : d.insns) {
      const std::uint64_t t = i.branch_target.value;
      if (!i.is_relative_branch() || (t >= lo && t < hi) || !k.text.contains(t)) continue;
      if (std::binary_search(starts.begin(), starts.end(), t)) continue;  // a call or tail call
      auto into = k.syms.function_containing(Gva{t});
      const bool cold = into && d.fn->name.starts_with(into->name + ".cold");
      k.entries.add(t, 1,
                    "the target of a branch in " + d.fn->name + (cold ? " (its cold part, " : " (another function, ") +
                        hex(i.address.value) + ")");
      ++k.cross;
      k.cross_not_cold += !cold;
    }
  }
}

// The jump rules' contexts: today's, as the engine reads jump tables (a `jmp [index*8 +
// table]`'s entries while they point into the function; anything else indirect, a register or
// a retpoline thunk, has unknown targets), and with the tail-call proof, computed as the
// engine does given the vmlinux (kernel::addresses_taken over every function of the core and
// init text, whatever --every says, and the alternatives' code, which has no symbols).
void jump_contexts(Kernel& k) {
  x86::JumpContext& jc = k.jc;
  jc.reserved = &k.reserved;
  jc.entry_points = &k.entries;
  jc.indirect_thunks = &k.thunks;
  // An IBT build lists the endbr64 it may seal at boot between these symbols.
  jc.endbr_marks_indirect_targets = bool(k.syms.lookup("__ibt_endbr_seal"));
  jc.indirect_targets = [&k](const x86::Insn& i) -> std::optional<std::vector<Gva>> {
    if (i.branch != x86::BranchKind::JmpIndirect || !i.mem.present || i.mem.base != x86::Reg::None ||
        i.mem.index == x86::Reg::None || i.mem.scale != 8)
      return std::nullopt;
    const std::uint64_t lo = k.current->fn->start.value, hi = lo + k.current->fn->size;
    std::vector<Gva> out;
    for (unsigned j = 0; j < 1024; ++j) {
      std::uint64_t e = 0;
      if (!k.mem.read(Gva{static_cast<std::uint64_t>(i.mem.disp) + 8ull * j},
                      std::as_writable_bytes(std::span(&e, 1))) ||
          e < lo || e >= hi)
        break;
      out.push_back(Gva{e});
    }
    if (out.empty()) return std::nullopt;
    ++k.tables_read;
    return out;
  };
  std::vector<const std::vector<x86::Insn>*> code;
  for (const Decoded& d : k.decoded) code.push_back(&d.insns);
  const auto t0 = std::chrono::steady_clock::now();
  k.taken = kernel::taken_index(kernel::addresses_taken(k.mem, k.text, k.tables.init_text(), code));
  k.taken_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  k.jc_proof = jc;
  k.jc_proof.addresses_taken = &k.taken;
}

// Short jumps' islands, by the engine's own selection (kernel::island_padding_near): the
// padding rules with what the image says the kernel rewrites at boot (the engine reads live
// text, already rewritten), the tables and the entries from outside, and the image's bytes.
void island_source(Kernel& k) {
  k.patched = boot_patched(k.syms, k.mem);
  kernel::IslandPaddingSource& s = k.islands;
  s.syms = &k.syms;
  s.tables = &k.tables;
  s.entered = &k.entries;
  s.rules = kernel::island_padding_rules(k.syms);
  s.rules.boot_patched = &k.patched;
  s.read = [&k](Gva at, std::uint64_t size) -> Result<std::vector<std::uint8_t>> {
    std::vector<std::uint8_t> bytes(size);
    XP_TRY(k.mem.read(at, std::as_writable_bytes(std::span(bytes))));
    return bytes;
  };
}

}  // namespace

Result<std::unique_ptr<Kernel>> Kernel::load(const Options& o) {
  auto elf = elf::load(o.vmlinux);
  if (!elf) return std::unexpected(elf.error());
  auto syms = symbols::SymbolTable::load(o.system_map);
  if (!syms) return std::unexpected(syms.error());
  // The image stands in for the guest's memory, with the System.map's symbols.
  symbols::KernelImage mem = symbols::KernelImage::with_symbols(std::move(*elf), *syms, o.vmlinux);
  auto k = std::make_unique<Kernel>(std::move(*syms), std::move(mem));
  // The kernel layer's readers, unchanged, over the image.
  k->tables =
      kernel::KernelTables::read(k->syms, [&m = k->mem](Gva a, std::span<std::byte> out) { return m.read(a, out); });
  k->rc.tables = &k->tables;
  k->rc.syms = &k->syms;
  k->rc.guest_channel = false;  // vmevent: Xen takes the trap before the guest's int3 path runs
  k->text = k->tables.core_text();
  if (k->text.empty()) return fail(Errc::InvalidArgument, "no _stext/_etext in " + o.system_map);
  k->fns = core_functions(k->syms, k->text);
  table_sites(*k);
  decode_functions(*k, o);
  cross_function_branches(*k);
  jump_contexts(*k);
  island_source(*k);
  return k;
}

}  // namespace xenprobes::coverage
