#include "mem/map_cache.hpp"

#include "mem/hex.hpp"

namespace xenprobes::mem {

Result<std::span<std::byte, kPageSize>> MapCache::page(Frame frame, hv::MapAccess access) {
  Entry* e = entries_.find(frame);
  if (e && (access == hv::MapAccess::Read || e->access == hv::MapAccess::ReadWrite)) {
    ++stats_.hits;
    return std::span<std::byte, kPageSize>(e->mapping.data(), kPageSize);
  }
  auto m = source_.map(frame, access);
  if (!m) return std::unexpected(std::move(m.error()));
  if (!*m || m->pages() < 1) return fail(Errc::Io, "empty mapping for frame " + detail::hex(frame.value));
  ++stats_.maps;
  std::byte* data = m->data();
  if (e) {  // upgrade: the old read-only mapping is unmapped here
    ++stats_.upgrades;
    e->mapping = std::move(*m);
    e->access = access;
  } else if (entries_.put(frame, Entry{std::move(*m), access})) {
    ++stats_.evictions;
  }
  return std::span<std::byte, kPageSize>(data, kPageSize);
}

}  // namespace xenprobes::mem
