#include "guestmod/rings.hpp"

#include <algorithm>
#include <atomic>
#include <string>

#include "common/hex.hpp"
#include "mem/guest_memory.hpp"

namespace xenprobes::guestmod {

Result<std::vector<MappedRing>> map_rings(hv::Hypervisor& hv, DomId dom, mem::GuestMemory& memory,
                                          const RingsInfo& rings) {
  const std::string ds = "domain " + std::to_string(dom.value);
  const std::size_t pages = rings.stride() / kPageSize;
  std::vector<Frame> seen;
  seen.reserve(pages * rings.count);
  std::vector<MappedRing> out;
  out.reserve(rings.count);
  for (unsigned v = 0; v < rings.count; ++v) {
    const Gva base = rings.ring(v);
    const std::string where = ds + ": the async ring of vCPU " + std::to_string(v) + " at " + hex(base.value);
    std::vector<Frame> frames;
    frames.reserve(pages);
    for (std::size_t p = 0; p < pages; ++p) {
      const Gva va = base + std::uint64_t{p} * kPageSize;
      auto t = memory.translate(va);
      if (!t) return fail(Errc::Fault, where + ": page " + hex(va.value) + " is not mapped: " + t.error().what);
      if (!t->writable) return fail(Errc::Fault, where + ": page " + hex(va.value) + " is mapped read-only");
      frames.push_back(t->frame());
    }
    for (const Frame& f : frames) seen.push_back(f);
    hv::ForeignMapping map = XP_TRY(hv.map_frames(dom, frames, hv::MapAccess::ReadWrite));
    if (map.pages() != pages) return fail(Errc::Io, where + ": mapped " + std::to_string(map.pages()) + " pages");
    const std::uint32_t order =
        std::atomic_ref<std::uint32_t>(reinterpret_cast<xenprobes_ring_header*>(map.data())->data_order)
            .load(std::memory_order_relaxed);
    if (order != rings.order)
      return fail(Errc::InvalidArgument, where + ": its header says data order " + std::to_string(order) +
                                             ", rings/order says " + std::to_string(rings.order));
    auto reader = RingReader::open(map.bytes(), v);
    if (!reader) return fail(Errc::InvalidArgument, ds + ": " + reader.error().what);
    out.push_back(MappedRing{std::move(map), std::move(*reader)});
  }
  std::sort(seen.begin(), seen.end());
  if (auto dup = std::adjacent_find(seen.begin(), seen.end()); dup != seen.end())
    return fail(Errc::InvalidArgument, ds + ": the async rings map frame " + hex(dup->value) + " twice");
  return out;
}

}  // namespace xenprobes::guestmod
