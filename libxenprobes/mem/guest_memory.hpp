// GuestMemory: read and write a guest's virtual and physical memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "common/result.hpp"
#include "common/types.hpp"
#include "mem/frame_source.hpp"
#include "mem/lru_map.hpp"
#include "mem/map_cache.hpp"
#include "mem/paging.hpp"
#include "xenprobes/hypervisor.hpp"

namespace xenprobes::mem {

struct GuestMemoryOptions {
  std::size_t mapping_cache_frames = 256;      // live foreign mappings (LRU)
  std::size_t translation_cache_pages = 4096;  // cached 4 KiB translations (LRU)
  // write_transient() drops the writable mappings it took. Needed for PV guests (Xen's page
  // types: a frame Dom0 holds writable cannot become a page table); an HVM guest's page
  // tables are plain memory to Xen, so there the mappings stay cached (false).
  bool transient_data_writes = true;
};

// Virtual accesses translate through the guest's page tables for the context set with
// set_context() (the layer above reads CR3/CR0/CR4/EFER from a vCPU); physical accesses take
// GPAs for HVM guests and machine addresses for PV guests (the same numbers the page tables
// hold).
//
// Caches. Translations are cached per 4 KiB page keyed by (cr3, page), so switching between
// address spaces needs no flush; frames stay mapped in a bounded LRU (a map is a hypercall on
// Xen). Neither cache sees the guest change its page tables or its p2m: call
// invalidate_translations() after the guest ran and may have changed them, invalidate_frame()
// when one frame changed, flush() for both. Failed walks are never cached.
//
// Writes need a writable foreign mapping: the frame's read-only mapping is upgraded (see
// MapCache). The guest's own R/W bit is reported in Translation but not enforced, because
// Dom0 must be able to patch kernel text the guest maps read-only. A write first translates
// and maps writable every page it touches, so a fault or a refused mapping leaves guest
// memory unchanged (if the range fits in the mapping cache).
//
// Not thread-safe: use one GuestMemory per thread (or per event loop).
class GuestMemory {
 public:
  struct Stats {
    std::uint64_t translations_cached = 0;  // translate() answered from the cache
    std::uint64_t translations_walked = 0;  // full page-table walks
    std::uint64_t maps = 0;                 // FrameSource::map calls that succeeded
    std::uint64_t mapping_hits = 0;
    std::uint64_t mapping_upgrades = 0;  // Read → ReadWrite
    std::uint64_t mapping_evictions = 0;
  };

  explicit GuestMemory(FrameSource& source) : GuestMemory(source, GuestMemoryOptions{}) {}
  GuestMemory(FrameSource& source, GuestMemoryOptions options);

  // A change of mode or walk options drops cached translations; a change of cr3 alone does not.
  void set_context(PagingMode mode, std::uint64_t cr3);
  void set_context(const PagingContext& ctx);
  const PagingContext& context() const { return ctx_; }

  [[nodiscard]] Result<Translation> translate(Gva va);

  [[nodiscard]] Result<void> read(Gva va, std::span<std::byte> out);
  [[nodiscard]] Result<void> write(Gva va, std::span<const std::byte> data);
  [[nodiscard]] Result<void> read_phys(Gpa pa, std::span<std::byte> out);
  [[nodiscard]] Result<void> write_phys(Gpa pa, std::span<const std::byte> data);

  template <typename T>
  requires std::is_trivially_copyable_v<T>
  [[nodiscard]] Result<T> read_as(Gva va) {
    T v;
    if (auto r = read(va, std::as_writable_bytes(std::span(&v, 1))); !r) return std::unexpected(std::move(r.error()));
    return v;
  }
  template <typename T>
  requires std::is_trivially_copyable_v<T>
  [[nodiscard]] Result<void> write_as(Gva va, const T& v) { return write(va, std::as_bytes(std::span(&v, 1))); }
  [[nodiscard]] Result<std::uint8_t> read_u8(Gva va) { return read_as<std::uint8_t>(va); }
  [[nodiscard]] Result<std::uint16_t> read_u16(Gva va) { return read_as<std::uint16_t>(va); }
  [[nodiscard]] Result<std::uint32_t> read_u32(Gva va) { return read_as<std::uint32_t>(va); }
  [[nodiscard]] Result<std::uint64_t> read_u64(Gva va) { return read_as<std::uint64_t>(va); }
  [[nodiscard]] Result<void> write_u8(Gva va, std::uint8_t v) { return write_as(va, v); }
  [[nodiscard]] Result<void> write_u16(Gva va, std::uint16_t v) { return write_as(va, v); }
  [[nodiscard]] Result<void> write_u32(Gva va, std::uint32_t v) { return write_as(va, v); }
  [[nodiscard]] Result<void> write_u64(Gva va, std::uint64_t v) { return write_as(va, v); }
  // A write into memory the guest frees and reuses (stacks, data): the writable mappings it
  // took are dropped before it returns (unless GuestMemoryOptions::transient_data_writes is
  // off, for HVM guests). On a PV guest, a frame Dom0 keeps mapped writable
  // holds a writable type reference and cannot become a page table: the guest's fork or exec
  // then fails (MMUEXT_PIN_L4_TABLE: EINVAL). Kernel text, OEA slots and the control area
  // keep their cached mappings (write()).
  [[nodiscard]] Result<void> write_transient(Gva va, std::span<const std::byte> data);
  [[nodiscard]] Result<void> write_u64_transient(Gva va, std::uint64_t v) {
    return write_transient(va, std::as_bytes(std::span(&v, 1)));
  }

  // Reads a NUL-terminated string of at most max_len bytes (the NUL excluded). Without a NUL
  // in the first max_len bytes the result is those bytes, truncated (like bpftrace's str()).
  // Reads page by page, so bytes past the NUL are never touched.
  [[nodiscard]] Result<std::string> read_string(Gva va, std::size_t max_len);

  void invalidate_translations();
  // Forgets the mapping of `f`, and every cached translation that read a table in `f` or
  // lands in `f`.
  void invalidate_frame(Frame f);
  void flush();

  Stats stats() const;
  void reset_stats();

 private:
  struct Key {
    std::uint64_t cr3;
    std::uint64_t page;  // va >> 12
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept {
      return std::hash<std::uint64_t>{}(k.page * 0x9E3779B97F4A7C15ull ^ k.cr3);
    }
  };
  // One page-sized piece of an access: where it goes in guest memory.
  struct Chunk {
    Frame frame;
    std::size_t offset;
    std::size_t size;
  };
  template <typename Fn>
  Result<void> for_each_virtual_chunk(Gva va, std::size_t size, Fn&& fn);

  PagingContext ctx_;
  bool transient_data_writes_;
  MapCache maps_;
  detail::LruMap<Key, Translation, KeyHash> translations_;
  std::uint64_t translations_cached_ = 0;
  std::uint64_t translations_walked_ = 0;
};

// Points `memory` at page tables that map the guest kernel's text: `ctx` (read from a vCPU),
// or, when that vCPU holds the user half of a page-table-isolation pair (HVM/PVH guests on CPUs
// affected by Meltdown, while it runs in user mode), the kernel half. Linux allocates the
// kernel's and the user's top-level tables as one 8 KiB pair, the kernel's first
// (PGD_ALLOCATION_ORDER with CONFIG_PAGE_TABLE_ISOLATION; bit 12 of cr3 selects the user one),
// so the kernel's are the user's with bit 12 clear. PV guests need none of this: Xen reports
// the kernel's table in cr3 whatever mode the vCPU is in. `kernel_addr` is an address the
// kernel's tables map (its text); 0 skips the check. Returns whether the kernel half was
// taken; Fault, with `memory` left on `ctx`, when neither maps it.
[[nodiscard]] Result<bool> use_kernel_page_tables(GuestMemory& memory, const PagingContext& ctx, hv::GuestType type,
                                                  Gva kernel_addr);

}  // namespace xenprobes::mem
