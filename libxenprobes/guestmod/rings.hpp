// A domain's async rings mapped into Dom0 (protocol.h "Async jump probes"): each ring's pages
// found through the guest's page tables, mapped read-write (Dom0 writes tail, wakeup and the
// watermark), and a RingReader opened on each.
#pragma once

#include <vector>

#include "common/result.hpp"
#include "common/types.hpp"
#include "guestmod/module_info.hpp"
#include "guestmod/ring.hpp"
#include "hv/hypervisor.hpp"

namespace xenprobes::mem {
class GuestMemory;
}

namespace xenprobes::guestmod {

struct MappedRing {
  hv::ForeignMapping map;  // first: the reader points into it
  RingReader reader;
};

// Every ring of `rings` (read_rings_info), ring v with a reader for vCPU v. Each page must be
// mapped writable and no frame may appear twice in all the rings (aliased pages would let one
// ring's records land in another's header); each header must carry the published order.
// Errors: Fault (a page not mapped or read-only), InvalidArgument (an aliased frame, a header
// RingReader::open refuses, another order), or the mapping's own error.
[[nodiscard]] Result<std::vector<MappedRing>> map_rings(hv::Hypervisor& hv, DomId dom, mem::GuestMemory& memory,
                                                        const RingsInfo& rings);

}  // namespace xenprobes::guestmod
