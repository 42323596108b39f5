#include "mem/guest_memory.hpp"

#include <array>

#include <algorithm>
#include <cstring>
#include <vector>

#include "mem/hex.hpp"
#include "mem/walker.hpp"

namespace xenprobes::mem {
namespace {

// Copies through libc's memcpy. Why not inline: gcc knows a chunk is at most 4 KiB and then
// expands memcpy into `rep movsq`, whose start-up cost dominated 8-byte reads (~25 ns of
// ~70 ns in mem_bench). noipa keeps it from propagating that range into this function.
[[gnu::noipa]] void copy_bytes(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }

}  // namespace

GuestMemory::GuestMemory(FrameSource& source, GuestMemoryOptions options)
    : transient_data_writes_(options.transient_data_writes),
      maps_(source, options.mapping_cache_frames),
      translations_(options.translation_cache_pages) {}

void GuestMemory::set_context(PagingMode mode, std::uint64_t cr3) {
  PagingContext ctx = ctx_;
  ctx.mode = mode;
  ctx.cr3 = cr3;
  set_context(ctx);
}

void GuestMemory::set_context(const PagingContext& ctx) {
  // The cache key holds cr3 only, so anything else that changes a walk's outcome drops it.
  if (ctx.mode != ctx_.mode || ctx.max_phys_bits != ctx_.max_phys_bits || ctx.pse != ctx_.pse || ctx.nxe != ctx_.nxe)
    translations_.clear();
  ctx_ = ctx;
}

Result<Translation> GuestMemory::translate(Gva va) {
  if (ctx_.mode == PagingMode::None) return walk(ctx_, va, maps_);
  const std::uint64_t offset = va.value & (kPageSize - 1);
  const Key key{ctx_.cr3, va.value >> kPageShift};
  if (const Translation* hit = translations_.find(key)) {
    ++translations_cached_;
    Translation t = *hit;
    t.address = t.address + offset;
    return t;
  }
  auto t = walk(ctx_, va, maps_);
  if (!t) return t;
  ++translations_walked_;
  Translation stored = *t;
  stored.address = Gpa{t->address.value & ~(kPageSize - 1)};
  translations_.put(key, stored);
  return t;
}

template <typename Fn>
Result<void> GuestMemory::for_each_virtual_chunk(Gva va, std::size_t size, Fn&& fn) {
  while (size > 0) {
    const std::size_t offset = va.value & (kPageSize - 1);
    const std::size_t n = std::min<std::size_t>(size, kPageSize - offset);
    auto t = translate(va);
    if (!t) return std::unexpected(std::move(t.error()));
    if (auto r = fn(Chunk{t->frame(), t->address.value & (kPageSize - 1), n}); !r) return r;
    size -= n;
    va = va + n;
  }
  return {};
}

Result<void> GuestMemory::read(Gva va, std::span<std::byte> out) {
  std::byte* dst = out.data();
  return for_each_virtual_chunk(va, out.size(), [&](const Chunk& c) -> Result<void> {
    auto page = maps_.page(c.frame, hv::MapAccess::Read);
    if (!page) return std::unexpected(std::move(page.error()));
    copy_bytes(dst, page->data() + c.offset, c.size);
    dst += c.size;
    return {};
  });
}

// Two phases so that a fault or a refused mapping leaves memory untouched: translate and map
// writable every page, then copy. The second lookups are cache hits unless the range
// outgrows the mapping cache.
Result<void> GuestMemory::write(Gva va, std::span<const std::byte> data) {
  // Small writes (the hit path: a pushed return address, a patched byte) keep their chunk
  // list on the stack: no heap allocation per write.
  constexpr std::size_t kInlineChunks = 4;
  const std::size_t max_chunks = data.size() / kPageSize + 2;
  std::array<Chunk, kInlineChunks> inline_chunks{};
  std::vector<Chunk> heap_chunks;
  if (max_chunks > kInlineChunks) heap_chunks.reserve(max_chunks);
  std::size_t count = 0;
  auto collected = for_each_virtual_chunk(va, data.size(), [&](const Chunk& c) -> Result<void> {
    auto page = maps_.page(c.frame, hv::MapAccess::ReadWrite);
    if (!page) return fail(page.error().code, "cannot write gva " + detail::hex(va.value) + ": " + page.error().what);
    if (max_chunks > kInlineChunks) heap_chunks.push_back(c);
    else inline_chunks[count++] = c;
    return {};
  });
  if (!collected) return collected;
  std::span<const Chunk> chunks = max_chunks > kInlineChunks ? std::span<const Chunk>(heap_chunks)
                                                             : std::span<const Chunk>(inline_chunks.data(), count);
  const std::byte* src = data.data();
  for (const Chunk& c : chunks) {
    auto page = maps_.page(c.frame, hv::MapAccess::ReadWrite);
    if (!page) return std::unexpected(std::move(page.error()));
    copy_bytes(page->data() + c.offset, src, c.size);
    src += c.size;
  }
  return {};
}

Result<void> GuestMemory::write_transient(Gva va, std::span<const std::byte> data) {
  Result<void> r = write(va, data);
  if (!transient_data_writes_) return r;
  // Whether or not it completed: every frame it may have mapped writable is let go.
  best_effort(for_each_virtual_chunk(va, data.size(),
                                     [&](const Chunk& c) -> Result<void> {
                                       maps_.invalidate(c.frame);
                                       return {};
                                     }),
              "write_transient: letting go of the frames it mapped writable");
  return r;
}

Result<void> GuestMemory::read_phys(Gpa pa, std::span<std::byte> out) {
  std::byte* dst = out.data();
  std::size_t size = out.size();
  while (size > 0) {
    const std::size_t offset = pa.value & (kPageSize - 1);
    const std::size_t n = std::min<std::size_t>(size, kPageSize - offset);
    auto page = maps_.page(frame_of(pa), hv::MapAccess::Read);
    if (!page)
      return fail(page.error().code, "cannot read physical " + detail::hex(pa.value) + ": " + page.error().what);
    copy_bytes(dst, page->data() + offset, n);
    dst += n;
    size -= n;
    pa = pa + n;
  }
  return {};
}

Result<void> GuestMemory::write_phys(Gpa pa, std::span<const std::byte> data) {
  if (data.empty()) return {};
  // Phase 1: every frame mapped writable; phase 2: copy (see write()).
  const std::uint64_t first = frame_of(pa).value, last = frame_of(pa + (data.size() - 1)).value;
  for (std::uint64_t f = first; f <= last; ++f) {
    auto page = maps_.page(Frame{f}, hv::MapAccess::ReadWrite);
    if (!page)
      return fail(page.error().code, "cannot write physical " + detail::hex(pa.value) + ": " + page.error().what);
  }
  const std::byte* src = data.data();
  std::size_t size = data.size();
  while (size > 0) {
    const std::size_t offset = pa.value & (kPageSize - 1);
    const std::size_t n = std::min<std::size_t>(size, kPageSize - offset);
    auto page = maps_.page(frame_of(pa), hv::MapAccess::ReadWrite);
    if (!page) return std::unexpected(std::move(page.error()));
    copy_bytes(page->data() + offset, src, n);
    src += n;
    size -= n;
    pa = pa + n;
  }
  return {};
}

Result<std::string> GuestMemory::read_string(Gva va, std::size_t max_len) {
  std::string s;
  while (s.size() < max_len) {
    const std::size_t offset = va.value & (kPageSize - 1);
    const std::size_t n = std::min<std::size_t>(max_len - s.size(), kPageSize - offset);
    auto t = translate(va);
    if (!t) return std::unexpected(std::move(t.error()));
    auto page = maps_.page(t->frame(), hv::MapAccess::Read);
    if (!page) return std::unexpected(std::move(page.error()));
    const char* p = reinterpret_cast<const char*>(page->data()) + offset;
    const void* nul = std::memchr(p, 0, n);
    if (nul) {
      s.append(p, static_cast<const char*>(nul) - p);
      return s;
    }
    s.append(p, n);
    va = va + n;
  }
  return s;
}

void GuestMemory::invalidate_translations() { translations_.clear(); }

void GuestMemory::invalidate_frame(Frame f) {
  maps_.invalidate(f);
  translations_.erase_if([f](const Key&, const Translation& t) {
    if (t.frame() == f) return true;
    return std::find(t.table_frames.begin(), t.table_frames.begin() + t.depth, f) != t.table_frames.begin() + t.depth;
  });
}

void GuestMemory::flush() {
  translations_.clear();
  maps_.clear();
}

GuestMemory::Stats GuestMemory::stats() const {
  const MapCache::Stats& m = maps_.stats();
  return Stats{translations_cached_, translations_walked_, m.maps, m.hits, m.upgrades, m.evictions};
}

void GuestMemory::reset_stats() {
  translations_cached_ = translations_walked_ = 0;
  maps_.reset_stats();
}

Result<bool> use_kernel_page_tables(GuestMemory& memory, const PagingContext& ctx, hv::GuestType type,
                                    Gva kernel_addr) {
  constexpr std::uint64_t kPtiUserBit = 1ull << 12;
  memory.set_context(ctx);
  memory.invalidate_translations();
  if (type == hv::GuestType::Pv || !kernel_addr.value || !(ctx.cr3 & kPtiUserBit) || memory.translate(kernel_addr))
    return false;
  PagingContext kernel = ctx;
  kernel.cr3 &= ~kPtiUserBit;
  memory.set_context(kernel);
  memory.invalidate_translations();
  if (memory.translate(kernel_addr)) return true;
  memory.set_context(ctx);
  memory.invalidate_translations();
  return fail(Errc::Fault, "the kernel's text at " + detail::hex(kernel_addr.value) +
                               " is mapped neither by the page tables at cr3 " + detail::hex(ctx.cr3) +
                               " nor by their kernel half (page-table isolation)");
}

}  // namespace xenprobes::mem
