// Building the jump probes' index (probe/jump_index.hpp): every function of the core text
// decoded for its relative branches, on a few threads. Each thread decodes its own contiguous
// range of the functions into its own output, reading only what every thread reads (the text,
// the functions, their starts); the outputs are merged in function order afterwards, so the
// index is the one a single thread builds.
#include <algorithm>
#include <exception>
#include <functional>
#include <system_error>
#include <thread>

#include "probe/jump_index.hpp"
#include "x86/insn.hpp"

namespace xenprobes::probe {

namespace {

// What one thread found in its range of functions: each branch with the function it is in.
struct Part {
  std::size_t lo = 0, hi = 0;  // [lo, hi) of fns
  struct Found {
    std::size_t fn;
    std::uint64_t to, from;  // offsets from the core text's start
  };
  std::vector<Found> found;
  std::size_t unknown = 0;
  std::exception_ptr error;
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

void decode_part(const Input& in, Part& part) noexcept {
  try {
    const std::uint64_t size = in.text.size();
    std::vector<x86::RelativeBranch> rel;
    for (std::size_t k = part.lo; k < part.hi; ++k) {
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
  } catch (...) { part.error = std::current_exception(); }
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
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t by_work = std::max<std::size_t>(1, functions / kMinIndexFunctionsPerThread);
  return static_cast<unsigned>(std::min<std::size_t>({hw, kMaxIndexThreads, by_work}));
}

void decode_cross_branches(std::span<const std::uint8_t> text, std::uint64_t base, const std::vector<bool>& unread,
                           std::span<const symbols::Function> fns, unsigned threads, CrossBranches& out) {
  std::vector<std::uint64_t> starts;
  starts.reserve(fns.size());
  for (const symbols::Function& f : fns) starts.push_back(f.start.value);
  const Input in{text, base, unread, fns, starts};

  // Contiguous ranges of about the same number of bytes to decode.
  const std::size_t n = std::clamp<std::size_t>(threads, 1, std::max<std::size_t>(1, fns.size()));
  std::uint64_t total = 0;
  for (const symbols::Function& f : fns) total += decodable_size(f, base, text.size()) ? f.size : 0;
  std::vector<Part> parts(n);
  std::uint64_t acc = 0;
  std::size_t k = 0;
  for (std::size_t p = 0; p < n; ++p) {
    parts[p].lo = k;
    const std::uint64_t goal = p + 1 == n ? total : total / n * (p + 1);
    while (k < fns.size() && (p + 1 == n || acc < goal)) {
      acc += decodable_size(fns[k], base, text.size()) ? fns[k].size : 0;
      ++k;
    }
    parts[p].hi = k;
  }

  {
    // Parts 1.. on threads of their own (on this one when no thread can be started), part 0
    // here; every thread joined before anything is merged or rethrown.
    std::vector<std::jthread> workers;
    workers.reserve(n);
    for (std::size_t p = 1; p < n; ++p) {
      try {
        workers.emplace_back(decode_part, std::cref(in), std::ref(parts[p]));
      } catch (const std::system_error&) { decode_part(in, parts[p]); }
    }
    decode_part(in, parts[0]);
  }
  for (const Part& p : parts)
    if (p.error) std::rethrow_exception(p.error);

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
