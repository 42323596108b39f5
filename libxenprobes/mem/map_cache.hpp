// MapCache: a bounded LRU of single-frame foreign mappings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "mem/frame_source.hpp"
#include "mem/lru_map.hpp"

namespace xenprobes::mem {

// Mapping a frame is a hypercall on Xen, so frames stay mapped until evicted or invalidated.
//
// Read-only vs writable: the cache holds at most one mapping per frame. A ReadWrite request
// for a frame mapped Read maps it again writable and replaces the entry ("upgrade"); the
// writable mapping then serves reads too. If the writable map fails (Xen refuses it e.g. for
// PV page-table pages) the read-only mapping is kept and the error returned.
//
// Not thread-safe.
class MapCache {
 public:
  struct Stats {
    std::uint64_t hits = 0;
    std::uint64_t maps = 0;      // successful FrameSource::map calls
    std::uint64_t upgrades = 0;  // of those, Read → ReadWrite replacements
    std::uint64_t evictions = 0;
  };

  MapCache(FrameSource& source, std::size_t capacity) : source_(source), entries_(capacity) {}

  // The page of `frame`, mapped with at least `access`. The span is valid until the next
  // page()/invalidate()/clear() call: any of them may unmap it.
  [[nodiscard]] Result<std::span<std::byte, kPageSize>> page(Frame, hv::MapAccess);

  void invalidate(Frame f) { entries_.erase(f); }
  void clear() { entries_.clear(); }

  bool contains(Frame f) const { return entries_.contains(f); }
  std::size_t size() const { return entries_.size(); }
  std::size_t capacity() const { return entries_.capacity(); }
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Entry {
    hv::ForeignMapping mapping;
    hv::MapAccess access = hv::MapAccess::Read;
  };
  FrameSource& source_;
  detail::LruMap<Frame, Entry> entries_;
  Stats stats_;
};

}  // namespace xenprobes::mem
