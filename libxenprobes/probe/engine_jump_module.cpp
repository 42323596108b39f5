// Jump probes in a loaded module's text (docs/probes.md "Jump probes in a module's text"): the
// module's own tables and, per module, the places its functions are entered from outside their
// own branches, decoded once per module load with the core index's decoder.
//
// What enters a module's function other than its own branches:
//  - a fault in it that its __ex_table sends to a fixup: the fixups of the module's table;
//  - a jump label of the module whose key flips: the targets of its __jump_table;
//  - a relative branch from another function of the same module (its `.cold` part among
//    them): every function of the module decoded by x86::relative_branches();
//  - code outside the module. The core kernel is linked before any module and holds no
//    relocation against one: it reaches module code only through pointers the module handed
//    it (an ops table, a notifier, its init and exit), which an indirect call or jump uses
//    as they are, so at function starts. Other modules reach it through the symbols it
//    exports, which the module loader resolves for their calls and jumps (symbol + addend,
//    the addend the -4 of a rel32 to the symbol's start): function starts too. A pointer to
//    the middle of a function (a computed goto's label) can only be formed inside the module,
//    and an indirect jump through one is a jump of unknown targets, which refuses every
//    region of the function it is in (no tail-call proof here: the kernel image that proves
//    tail calls holds no module). A return address is the instruction after a call, which the
//    jump rules treat as they do in the core text.
#include <chrono>

#include "probe/engine_internal.hpp"
#include "probe/jump_index.hpp"
#include "x86/relocate.hpp"

namespace xenprobes::probe {

namespace {

// A module's text is a few hundred KiB (Debian 12's largest, a GPU driver, a few MiB); one that
// claims more is not believed.
constexpr std::uint64_t kMaxModuleTextBytes = std::uint64_t{64} << 20;

// A jump ending at `from_end` reaches `to` with a rel32.
bool in_rel32(std::uint64_t from_end, std::uint64_t to) {
  return x86::fits_rel32(static_cast<std::int64_t>(to - from_end));
}

}  // namespace

std::optional<std::string> Engine::module_jump_check(Domain& d, const Point& p, const kernel::Module*& mod) {
  mod = nullptr;
  const kernel::ModuleTables* mods = d.tables->modules();
  if (!mods || !mods->status().found)
    return "the guest's module list could not be read (" + (mods ? mods->status().why : std::string("never walked")) +
           ")";
  const kernel::Module* m = d.tables->live_module_at(p.addr.value);
  if (!m || kernel::ModuleIdentity::of(*m) != *p.module)
    return "module " + p.module->name + " is not the module that was decoded there any more";
  for (const kernel::TableStatus* t : {&m->ex_status, &m->jump_status, &m->sc_status})
    if (!t->found) return "module " + m->name + "'s " + t->name + " could not be read (" + t->why + ")";
  mod = m;
  return std::nullopt;
}

const Engine::Domain::ModuleJumpIndex* Engine::module_jump_index(Domain& d, const kernel::Module& m, std::string& why) {
  const kernel::ModuleIdentity id = kernel::ModuleIdentity::of(m);
  for (const auto& x : d.module_jump_indexes)
    if (x->module == id) return x.get();
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t base = m.text.start, size = m.text.end - m.text.start;
  if (m.text.empty() || size > kMaxModuleTextBytes) {
    why = "module " + m.name + "'s text is said to be " + hex(size) + " bytes: its functions are not decoded";
    return nullptr;
  }
  auto idx = std::make_unique<Domain::ModuleJumpIndex>();
  idx->module = id;
  // A fault continues at its fixup; a jump label's key may turn its nop into a jmp at any time.
  for (const kernel::ExEntry& e : m.ex) idx->entries.add(e.fixup, 1, "the exception fixup of " + hex(e.insn));
  for (const kernel::Site& s : m.jumps)
    if (s.target) idx->entries.add(s.target, 1, "the target of the jump label at " + hex(s.addr));
  // Every function of the module (its kallsyms, module_symbols.hpp), decoded for branches into
  // the middle of another, as the core text's are (jump_index_decode.cpp).
  std::vector<symbols::Function> fns;
  for (const symbols::Symbol& s : d.syms->matching(m.name + ":*")) {
    if (!m.text.contains(s.address.value)) continue;
    if (auto f = d.syms->function_containing(s.address); f && f->start == s.address) fns.push_back(*f);
  }
  std::sort(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start.value < b.start.value; });
  fns.erase(std::unique(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start == b.start; }),
            fns.end());
  std::vector<std::uint8_t> bytes;
  std::vector<bool> unread;
  read_text_pages(d, base, size, bytes, unread);
  CrossBranches cb;
  decode_cross_branches(bytes, base, unread, fns, index_threads(fns.size()), cb);
  for (const CrossBranches::Branch& b : cb.branches)
    idx->entries.add(base + b.to, 1, "a branch from " + cb.names[b.fn] + " (" + hex(base + b.from) + ")");
  idx->functions = fns.size();
  idx->unknown = cb.unknown;
  XP_LOG(Info,
         "domain %u: jump probes: the branches between module %s's %zu functions indexed in %.2f s (%zu entries "
         "from outside a function's own branches; once per load of the module)",
         d.id.value, m.name.c_str(), fns.size(),
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), idx->entries.size());
  if (cb.unknown)
    XP_LOG(Info,
           "domain %u: %zu functions of module %s do not decode: their branches into other functions are not known",
           d.id.value, cb.unknown, m.name.c_str());
  d.module_jump_indexes.push_back(std::move(idx));
  return d.module_jump_indexes.back().get();
}

void Engine::prune_module_jump_indexes(Domain& d, const std::vector<kernel::ModuleIdentity>& live) {
  std::erase_if(d.module_jump_indexes, [&](const auto& x) {
    return std::none_of(live.begin(), live.end(), [&](const kernel::ModuleIdentity& m) { return m == x->module; });
  });
}

std::optional<std::string> detour_out_of_reach(std::span<const guestmod::OeaArea> areas, Gva region_start,
                                               Gva region_end, std::uint64_t slot_size) {
  // The jump from the region's start to the detour, the detour's jump back to the region's
  // end: any slot of any area may be the detour.
  const std::uint64_t from = region_start.value + x86::kJmpRel32Len, back = region_end.value;
  for (const guestmod::OeaArea& a : areas)
    for (const std::uint64_t slot : {a.addr.value, a.last()})
      if (!in_rel32(from, slot) || !in_rel32(slot, back) || !in_rel32(slot + slot_size, back))
        return "the guest module's slots at " + hex(a.addr.value) + " are out of a rel32 jump's reach of the region [" +
               hex(region_start.value) + ", " + hex(region_end.value) + ")";
  return std::nullopt;
}

std::optional<std::string> Engine::module_detour_reach(const Domain& d, const x86::JumpRegion& region) const {
  // (Areas added later: a slot out of reach then fails its arming, and nothing is written.)
  return detour_out_of_reach(d.pool->areas(), region.start, region.end(), kSlotSize);
}

}  // namespace xenprobes::probe
