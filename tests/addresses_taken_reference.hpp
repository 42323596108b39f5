// kernel::addresses_taken() as it was before the lean decoder (x86::decode_function(), an Insn
// per instruction, one thread), verbatim but for where it puts things and a look at every
// function it decoded: for tests/unit/probe/addresses_taken_test.cpp and
// bench/jump_index_bench.cpp, which compare and time the two over whole kernels.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "kernel/addresses_taken.hpp"
#include "symbols/kernel_image.hpp"
#include "x86/insn.hpp"
#include "x86/jump_safety.hpp"

namespace xenprobes::testing {

// The functions whose start is a symbol, in `r` or `r2`, sorted by start, once each.
inline std::vector<symbols::Function> taken_functions(const symbols::SymbolTable& syms, const kernel::Range& r,
                                                      const kernel::Range& r2) {
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

// What decode_function() made of a function the old code decoded (its bytes read).
using TakenDecodedFn =
    std::function<void(const symbols::Function&, std::span<const std::uint8_t>, const Result<std::vector<x86::Insn>>&)>;

inline std::vector<kernel::TakenAddress> old_addresses_taken(const symbols::KernelImage& image,
                                                             const kernel::Range& core, const kernel::Range& init,
                                                             const TakenDecodedFn& each = {}) {
  const symbols::SymbolTable& syms = image.symbols();
  std::vector<kernel::TakenAddress> out;
  std::vector<std::uint64_t> starts;
  for (const symbols::Function& f : taken_functions(syms, core, kernel::Range{})) starts.push_back(f.start.value);
  auto interior = [&](std::uint64_t v) {
    return v >= core.start && v < core.end && !std::binary_search(starts.begin(), starts.end(), v);
  };

  std::vector<std::vector<x86::Insn>> extra;
  for (const symbols::Function& f : taken_functions(syms, core, init)) {
    if (f.size == 0 || f.size > symbols::kMaxFunctionBytes) continue;
    std::vector<std::uint8_t> bytes(f.size);
    if (!image.read(f.start, std::as_writable_bytes(std::span(bytes)))) continue;
    auto in = x86::decode_function(bytes, f.start);
    if (each) each(f, bytes, in);
    if (in) extra.push_back(std::move(*in));
  }
  for (const auto& insns : extra)
    for (const x86::Insn& i : insns)
      for (std::uint64_t a : x86::materialized_addresses(i))
        if (interior(a)) out.push_back({a, i.address.value, false});

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

}  // namespace xenprobes::testing
