// What the kernel rewrites at boot, from its own lists in the image (coverage.hpp): dead
// padding that one of these sites overlaps is not listed for islands
// (kernel::IslandPaddingRules::boot_patched; docs/benchmarks.md says why per kernel).
#include <algorithm>

#include "coverage.hpp"

namespace xenprobes::coverage {

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

}  // namespace xenprobes::coverage
