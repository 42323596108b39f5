#include "mem/frame_source.hpp"

#include <span>

#include "mem/hex.hpp"

namespace xenprobes::mem {

Result<hv::ForeignMapping> HypervisorFrameSource::map(Frame frame, hv::MapAccess access) {
  auto m = hv_.map_frames(domid_, std::span<const Frame>(&frame, 1), access);
  if (!m) return m;
  // The mapping is dereferenced as one full page: refuse anything smaller.
  if (!*m || m->pages() < 1)
    return fail(Errc::Io, "hypervisor returned an empty mapping for frame " + detail::hex(frame.value) + " of domain " +
                              std::to_string(domid_.value));
  return m;
}

}  // namespace xenprobes::mem
