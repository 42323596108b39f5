#include "kernel/addresses_taken.hpp"

#include <algorithm>
#include <cstring>

#include "common/hex.hpp"
#include "x86/analysis.hpp"

namespace xenprobes::kernel {

namespace {

// The functions whose start is a symbol, in [lo, hi) of `r` or `r2`, sorted by start.
std::vector<symbols::Function> functions_in(const symbols::SymbolTable& syms, const Range& r, const Range& r2) {
  std::vector<symbols::Function> fns;
  for (const symbols::Symbol& s : syms.matching("*")) {
    if (s.kind != symbols::SymbolKind::Text || !(r.contains(s.address.value) || r2.contains(s.address.value))) continue;
    if (auto f = syms.function_containing(s.address); f && f->start == s.address) fns.push_back(*f);
  }
  std::sort(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start.value < b.start.value; });
  fns.erase(std::unique(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start == b.start; }),
            fns.end());
  return fns;
}

}  // namespace

std::vector<TakenAddress> addresses_taken(const symbols::KernelImage& image, const Range& core, const Range& init,
                                          std::span<const std::vector<x86::Insn>* const> decoded) {
  const symbols::SymbolTable& syms = image.symbols();
  std::vector<TakenAddress> out;
  std::vector<std::uint64_t> starts;  // of the core text's functions: a start is no interior address
  for (const symbols::Function& f : functions_in(syms, core, Range{})) starts.push_back(f.start.value);
  auto interior = [&](std::uint64_t v) {
    return v >= core.start && v < core.end && !std::binary_search(starts.begin(), starts.end(), v);
  };

  // The code: what the caller decoded, and every other function of the core and init text.
  std::vector<std::uint64_t> done;
  for (const auto* insns : decoded)
    if (!insns->empty()) done.push_back(insns->front().address.value);
  std::sort(done.begin(), done.end());
  std::vector<std::vector<x86::Insn>> extra;
  for (const symbols::Function& f : functions_in(syms, core, init)) {
    if (std::binary_search(done.begin(), done.end(), f.start.value) || f.size == 0 ||
        f.size > symbols::kMaxFunctionBytes)
      continue;
    std::vector<std::uint8_t> bytes(f.size);
    if (!image.read(f.start, std::as_writable_bytes(std::span(bytes)))) continue;
    if (auto in = x86::decode_function(bytes, f.start)) extra.push_back(std::move(*in));
  }
  auto operands = [&](const std::vector<x86::Insn>& insns) {
    for (const x86::Insn& i : insns)
      for (std::uint64_t a : x86::materialized_addresses(i))
        if (interior(a)) out.push_back({a, i.address.value, false});
  };
  for (const auto* insns : decoded) operands(*insns);
  for (const auto& insns : extra) operands(insns);

  // The data, and the code without symbols read as data unaligned.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> raw;
  if (auto a = syms.lookup("_einittext"); a && !a->empty())
    raw.emplace_back(a->front().address.value, a->front().address.value + 0x10000);
  auto b = syms.lookup("__alt_instructions_end"), e = syms.lookup("__init_end");
  if (b && e && !b->empty() && !e->empty()) raw.emplace_back(b->front().address.value, e->front().address.value);
  auto in_raw = [&](std::uint64_t a) {
    return std::any_of(raw.begin(), raw.end(), [&](const auto& r) { return a >= r.first && a < r.second; });
  };
  for (const elf::Segment& seg : image.elf().segments) {
    if (seg.vaddr < symbols::kKernelImageStart) continue;
    const std::size_t n = seg.bytes.size();
    for (std::size_t off = 0; off + 4 <= n; ++off) {
      const std::uint64_t at = seg.vaddr + off;
      if (off % 4 != 0 && !in_raw(at)) continue;
      std::int32_t w = 0;
      std::memcpy(&w, seg.bytes.data() + off, 4);
      if (auto v = static_cast<std::uint64_t>(static_cast<std::int64_t>(w)); interior(v)) out.push_back({v, at, true});
      if ((off % 8 != 0 && !in_raw(at)) || off + 8 > n) continue;
      std::uint64_t q = 0;
      std::memcpy(&q, seg.bytes.data() + off, 8);
      if (interior(q)) out.push_back({q, at, true});
    }
  }
  return out;
}

x86::SiteIndex taken_index(std::span<const TakenAddress> taken, std::int64_t delta) {
  x86::SiteIndex out;
  const auto d = static_cast<std::uint64_t>(delta);
  for (const TakenAddress& t : taken)
    out.add(t.to + d, 1, (t.data ? "the word at " : "the instruction at ") + hex(t.by + d));
  return out;
}

}  // namespace xenprobes::kernel
