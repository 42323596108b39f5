// FrameSource: the one thing the walkers and GuestMemory need from a hypervisor.
#pragma once

#include "common/result.hpp"
#include "common/types.hpp"
#include "hv/hypervisor.hpp"

namespace xenprobes::mem {

// Maps single 4 KiB guest frames into this process.
//
// The frame number is whatever the guest's page tables (or cr3 >> 12) hold: an MFN for a PV
// guest, a GFN for an HVM guest. Implementations pass it through unchanged; nothing in mem/
// converts between the two, which is why one walker serves both guest types.
//
// On real Xen each map() is a hypercall; callers cache the result (MapCache).
class FrameSource {
 public:
  virtual ~FrameSource() = default;
  // One page; the mapping stays valid until the returned object is destroyed.
  [[nodiscard]] virtual Result<hv::ForeignMapping> map(Frame, hv::MapAccess) = 0;
};

// Adapter over the hypervisor seam: hv.map_frames(domid, {frame}, access).
class HypervisorFrameSource final : public FrameSource {
 public:
  HypervisorFrameSource(hv::Hypervisor& hv, DomId domid) : hv_(hv), domid_(domid) {}
  [[nodiscard]] Result<hv::ForeignMapping> map(Frame, hv::MapAccess) override;
  DomId domid() const { return domid_; }

 private:
  hv::Hypervisor& hv_;
  DomId domid_;
};

}  // namespace xenprobes::mem
