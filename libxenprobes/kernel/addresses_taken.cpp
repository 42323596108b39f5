#include "kernel/addresses_taken.hpp"

#include <algorithm>
#include <cstring>

#include "common/hex.hpp"
#include "common/parallel.hpp"
#include "x86/analysis.hpp"

namespace xenprobes::kernel {

namespace {

// The functions whose start is a symbol, in `r` or `r2`, sorted by start, once each.
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

using Spans = std::vector<std::pair<std::uint64_t, std::uint64_t>>;  // [first, second)

// The offsets off in [0, n) of a segment at `vaddr` whose address vaddr + off (modulo 2^64,
// as the scan computes it) lies in one of `raw`'s ranges [a, b) (none when b <= a), sorted and
// merged. A range is the offsets [a - vaddr, a - vaddr + (b - a)) modulo 2^64: one span of
// [0, n), or two when it wraps.
Spans raw_offsets(const Spans& raw, std::uint64_t vaddr, std::uint64_t n) {
  Spans out;
  for (const auto& [a, b] : raw) {
    if (b <= a) continue;
    const std::uint64_t s = a - vaddr, len = b - a;
    if (s < n) out.emplace_back(s, s + std::min(len, n - s));
    if (s != 0 && len > 0 - s) out.emplace_back(0, std::min(s + len, n));  // 0 - s: 2^64 - s; s + len wrapped
  }
  std::sort(out.begin(), out.end());
  Spans merged;
  for (const auto& r : out) {
    if (r.first >= r.second) continue;
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else merged.push_back(r);
  }
  return merged;
}

// A piece of a segment the data scan reads: its offsets [lo, hi).
struct Chunk {
  const elf::Segment* seg;
  const Spans* raw;  // raw_offsets() of the segment
  std::uint64_t lo, hi;
};
constexpr std::uint64_t kScanChunk = std::uint64_t{1} << 20;

// Every 4-byte word of the chunk at an offset that is a multiple of 4, and every 8-byte word at
// a multiple of 8, whose value (the 4-byte one sign-extended) `interior`; in the raw spans the
// words at every offset. In offset order, the 4-byte word before the 8-byte one.
template <class Interior>
void scan_chunk(const Chunk& c, const Interior& interior, std::vector<TakenAddress>& out) {
  const std::uint8_t* bytes = c.seg->bytes.data();
  const std::uint64_t n = c.seg->bytes.size();
  auto visit = [&](std::uint64_t off, bool raw) {
    const std::uint64_t at = c.seg->vaddr + off;
    std::int32_t w = 0;
    std::memcpy(&w, bytes + off, 4);
    if (auto v = static_cast<std::uint64_t>(static_cast<std::int64_t>(w)); interior(v)) out.push_back({v, at, true});
    if ((off % 8 != 0 && !raw) || off + 8 > n) return;
    std::uint64_t q = 0;
    std::memcpy(&q, bytes + off, 8);
    if (interior(q)) out.push_back({q, at, true});
  };
  auto aligned = [&](std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t off = from + (4 - from % 4) % 4; off < to; off += 4) visit(off, false);
  };
  const std::uint64_t end = std::min(c.hi, n >= 4 ? n - 3 : 0);  // the offsets with 4 bytes after them
  std::uint64_t pos = c.lo;
  if (pos >= end) return;
  for (auto [a, b] : *c.raw) {
    if (b <= pos) continue;
    if (a >= end) break;
    a = std::max(a, pos);
    b = std::min(b, end);
    aligned(pos, a);
    for (std::uint64_t off = a; off < b; ++off) visit(off, true);
    pos = b;
  }
  if (pos < end) aligned(pos, end);
}

}  // namespace

unsigned taken_threads(std::size_t functions) { return worker_threads(functions, kMinTakenFunctionsPerThread); }

std::vector<TakenAddress> addresses_taken(const symbols::KernelImage& image, const Range& core, const Range& init,
                                          std::span<const std::vector<x86::Insn>* const> decoded, unsigned threads) {
  const symbols::SymbolTable& syms = image.symbols();
  std::vector<TakenAddress> out;
  const std::vector<symbols::Function> fns = functions_in(syms, core, init);
  std::vector<std::uint64_t> starts;  // of the core text's functions: a start is no interior address
  for (const symbols::Function& f : fns)
    if (core.contains(f.start.value)) starts.push_back(f.start.value);
  auto interior = [&](std::uint64_t v) {
    return v >= core.start && v < core.end && !std::binary_search(starts.begin(), starts.end(), v);
  };

  // The code: what the caller decoded, and every other function of the core and init text,
  // decoded on up to `threads` threads in contiguous ranges, merged in function order.
  std::vector<std::uint64_t> done;
  for (const auto* insns : decoded)
    if (!insns->empty()) done.push_back(insns->front().address.value);
  std::sort(done.begin(), done.end());
  std::vector<symbols::Function> todo;
  for (const symbols::Function& f : fns)
    if (!std::binary_search(done.begin(), done.end(), f.start.value) && f.size != 0 &&
        f.size <= symbols::kMaxFunctionBytes)
      todo.push_back(f);
  for (const auto* insns : decoded)
    for (const x86::Insn& i : *insns)
      for (std::uint64_t a : x86::materialized_addresses(i))
        if (interior(a)) out.push_back({a, i.address.value, false});
  if (threads == 0) threads = taken_threads(todo.size());
  const auto ranges = split_by_weight(todo.size(), threads, [&](std::size_t k) { return todo[k].size; });
  std::vector<std::vector<TakenAddress>> parts(ranges.size());
  run_parts(parts.size(), [&](std::size_t p) {
    std::vector<std::uint8_t> bytes;
    std::vector<x86::FormedAddress> formed;
    for (std::size_t k = ranges[p].first; k < ranges[p].second; ++k) {
      const symbols::Function& f = todo[k];
      bytes.resize(f.size);
      if (!image.read(f.start, std::as_writable_bytes(std::span(bytes)))) continue;
      if (!x86::formed_addresses(bytes, f.start, formed)) continue;  // contributes nothing
      for (const x86::FormedAddress& a : formed)
        if (interior(a.value)) parts[p].push_back({a.value, a.by.value, false});
    }
  });
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());

  // The data, and the code without symbols read as data unaligned (raw), in chunks on the same
  // threads, merged in address order.
  Spans raw;
  if (auto a = syms.lookup("_einittext"); a && !a->empty())
    raw.emplace_back(a->front().address.value, a->front().address.value + 0x10000);
  auto b = syms.lookup("__alt_instructions_end"), e = syms.lookup("__init_end");
  if (b && e && !b->empty() && !e->empty()) raw.emplace_back(b->front().address.value, e->front().address.value);
  std::vector<Spans> raw_of;
  raw_of.reserve(image.elf().segments.size());
  std::vector<Chunk> chunks;
  for (const elf::Segment& seg : image.elf().segments) {
    if (seg.vaddr < symbols::kKernelImageStart) continue;
    raw_of.push_back(raw_offsets(raw, seg.vaddr, seg.bytes.size()));
    for (std::uint64_t lo = 0; lo < seg.bytes.size(); lo += kScanChunk)
      chunks.push_back({&seg, &raw_of.back(), lo, std::min<std::uint64_t>(lo + kScanChunk, seg.bytes.size())});
  }
  const auto pieces =
      split_by_weight(chunks.size(), threads, [&](std::size_t k) { return chunks[k].hi - chunks[k].lo; });
  std::vector<std::vector<TakenAddress>> found(pieces.size());
  run_parts(found.size(), [&](std::size_t p) {
    for (std::size_t k = pieces[p].first; k < pieces[p].second; ++k) scan_chunk(chunks[k], interior, found[p]);
  });
  for (const auto& part : found) out.insert(out.end(), part.begin(), part.end());
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
