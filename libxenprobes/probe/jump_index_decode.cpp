// Building the jump probes' index (probe/jump_index.hpp): every function of the core text
// decoded for its relative branches, on a few threads (common/parallel.hpp). Each thread decodes
// its own contiguous range of the functions into its own output, reading only what every thread
// reads (the text, the functions, their starts); the outputs are merged in function order
// afterwards, so the index is the one a single thread builds.
#include <algorithm>

#include "common/parallel.hpp"
#include "probe/jump_index.hpp"
#include "x86/insn.hpp"

namespace xenprobes::probe {

namespace {

// What one thread found in its range of functions: each branch with the function it is in.
struct Part {
  struct Found {
    std::size_t fn;
    std::uint64_t to, from;  // offsets from the core text's start
  };
  std::vector<Found> found;
  std::size_t unknown = 0;
};

// A function the index decodes (the others are left out, not counted unknown): inside the text,
// not empty, not larger than the engine's limit.
bool decodable_size(const symbols::Function& f, std::uint64_t base, std::uint64_t size) {
  if (f.start.value < base || f.start.value - base >= size) return false;
  const std::uint64_t lo = f.start.value - base;
  return f.size != 0 && f.size <= symbols::kMaxFunctionBytes && f.size <= size - lo;
}

struct Input {
  std::span<const std::uint8_t> text;
  std::uint64_t base;
  const std::vector<bool>& unread;
  std::span<const symbols::Function> fns;
  const std::vector<std::uint64_t>& starts;  // of fns, sorted
};

// The functions [first, last) of in.fns.
void decode_part(const Input& in, std::size_t first, std::size_t last, Part& part) {
  const std::uint64_t size = in.text.size();
  std::vector<x86::RelativeBranch> rel;
  for (std::size_t k = first; k < last; ++k) {
    const symbols::Function& f = in.fns[k];
    if (!decodable_size(f, in.base, size)) continue;
    const std::uint64_t lo = f.start.value - in.base;
    bool readable = true;
    for (std::uint64_t p = lo / kPage; p <= (lo + f.size - 1) / kPage; ++p) readable = readable && !in.unread[p];
    if (!readable || !x86::relative_branches(in.text.subspan(lo, f.size), f.start, rel)) {
      ++part.unknown;
      continue;
    }
    const std::uint64_t hi = f.start.value + f.size;
    for (const x86::RelativeBranch& b : rel) {
      const std::uint64_t t = b.target.value;
      if ((t >= f.start.value && t < hi) || t < in.base || t - in.base >= size) continue;
      if (std::binary_search(in.starts.begin(), in.starts.end(), t)) continue;
      part.found.push_back({k, t - in.base, b.address.value - in.base});
    }
  }
}

}  // namespace

std::vector<symbols::Function> index_functions(const symbols::SymbolTable& syms, const kernel::Range& core_text) {
  std::vector<symbols::Function> fns;
  for (const symbols::Symbol& s : syms.matching("*")) {
    if (s.kind != symbols::SymbolKind::Text || !core_text.contains(s.address.value)) continue;
    if (auto f = syms.function_containing(s.address); f && f->start == s.address) fns.push_back(*f);
  }
  std::sort(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start.value < b.start.value; });
  fns.erase(std::unique(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.start == b.start; }),
            fns.end());
  return fns;
}

unsigned index_threads(std::size_t functions) {
  return worker_threads(functions, kMinIndexFunctionsPerThread, kMaxIndexThreads);
}

void decode_cross_branches(std::span<const std::uint8_t> text, std::uint64_t base, const std::vector<bool>& unread,
                           std::span<const symbols::Function> fns, unsigned threads, CrossBranches& out) {
  std::vector<std::uint64_t> starts;
  starts.reserve(fns.size());
  for (const symbols::Function& f : fns) starts.push_back(f.start.value);
  const Input in{text, base, unread, fns, starts};

  // Contiguous ranges of about the same number of bytes to decode, merged in order.
  const auto ranges = split_by_weight(fns.size(), threads, [&](std::size_t k) {
    return decodable_size(fns[k], base, text.size()) ? fns[k].size : std::uint64_t{0};
  });
  std::vector<Part> parts(ranges.size());
  run_parts(parts.size(), [&](std::size_t p) { decode_part(in, ranges[p].first, ranges[p].second, parts[p]); });
  for (const Part& p : parts) {
    out.unknown += p.unknown;
    std::size_t named = fns.size();  // the function whose name was pushed last
    for (const Part::Found& f : p.found) {
      if (f.fn != named) out.names.push_back(fns[f.fn].name), named = f.fn;
      out.branches.push_back({f.to, f.from, static_cast<std::uint32_t>(out.names.size() - 1)});
    }
  }
}

}  // namespace xenprobes::probe
