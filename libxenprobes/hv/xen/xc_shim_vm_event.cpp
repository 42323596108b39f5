// The vm_event ring: VmEventBackRing (the consumer side of the ring page), the ring with its
// event channel, and XcShim's monitor calls that create, recover and configure it (file map:
// xc_shim_internal.hpp).
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "common/log.hpp"
#include "hv/xen/xc_shim_internal.hpp"

namespace xenprobes::hv::xen {
namespace {

// ---- the vm_event ring with its event channel -------------------------------------------

class XenVmEventRing final : public VmEventRing {
 public:
  XenVmEventRing(void* page, DomId dom, std::unique_ptr<Evtchn> ev, EvtchnPort port)
      : ring_(page, dom), page_(page), ev_(std::move(ev)), port_(port) {}

  // Unmaps the page and unbinds the port. Does not disable the monitor: that is
  // Hypervisor::monitor_disable, which the owner calls.
  ~XenVmEventRing() override {
    munmap(page_, XC_PAGE_SIZE);
    best_effort(ev_->unbind(port_), "vm_event: unbinding the ring's port");
  }

  int fd() const override { return ev_->fd(); }

  Result<std::optional<VmEventRequest>> get_request() override {
    std::lock_guard lk(mu_);
    // Acknowledge the notification first and unmask at once: the ring, not the event, says
    // what is pending, and a request pushed after the ring check raises a new event.
    auto pending = XP_TRY(ev_->pending());
    if (pending) XP_TRY(ev_->unmask(*pending));
    bool answered = false;
    auto r = ring_.take_request(answered);
    if (answered) XP_TRY(ev_->notify(port_));  // resumes the vCPUs of skipped requests
    return r;
  }

  Result<void> put_response(const VmEventResponse& r) override {
    std::lock_guard lk(mu_);
    return ring_.push_response(r);
  }

  Result<void> notify() override { return ev_->notify(port_); }

 private:
  std::mutex mu_;
  VmEventBackRing ring_;
  void* page_;
  std::unique_ptr<Evtchn> ev_;  // a handle of its own: fd() must only wake for this ring
  EvtchnPort port_;
};

}  // namespace

// ---- VmEventBackRing -----------------------------------------------------------------------
//
//   one page, shared with Xen (xc_monitor_enable mapped it and removed it from the guest):
//   +----------------------------------------------+
//   | req_prod req_event rsp_prod rsp_event  pad   |  vm_event_sring_t header (64 bytes)
//   +----------------------------------------------+
//   | slot 0: request | response (a union)         |  8 slots of 400 bytes
//   | ...                                          |
//   +----------------------------------------------+
//   Xen produces requests; we consume them (req_cons) and produce one response per request
//   into the slot the request came from (rsp_prod_pvt <= req_cons always).

struct VmEventBackRing::Impl {
  vm_event_back_ring_t back{};
  DomId dom;
};

VmEventBackRing::VmEventBackRing(void* page, DomId dom) : impl_(std::make_unique<Impl>()) {
  impl_->dom = dom;
  auto* sring = static_cast<vm_event_sring_t*>(page);
  SHARED_RING_INIT(sring);
  BACK_RING_INIT(&impl_->back, sring, XC_PAGE_SIZE);
}

VmEventBackRing::~VmEventBackRing() = default;

unsigned VmEventBackRing::size() const { return RING_SIZE(&impl_->back); }

Result<std::optional<VmEventRequest>> VmEventBackRing::take_request(bool& answered) {
  auto& back = impl_->back;
  for (;;) {
    xen_rmb();  // fresh reads of the shared indexes on every round
    RING_IDX prod = back.sring->req_prod;
    if (RING_REQUEST_PROD_OVERFLOW(&back, prod))
      return fail(Errc::Io, on_dom("vm_event ring", impl_->dom) + ": request producer index " + std::to_string(prod) +
                                " overruns the ring");
    int work = 0;
    RING_FINAL_CHECK_FOR_REQUESTS(&back, work);
    if (!work) return std::optional<VmEventRequest>{};
    xen_rmb();  // read the slot only after the producer index

    // One copy out of shared memory; only the copy is looked at afterwards.
    vm_event_request_t req;
    std::memcpy(&req, RING_GET_REQUEST(&back, back.req_cons), sizeof req);
    ++back.req_cons;
    back.sring->req_event = back.req_cons + 1;

    auto r = vm_event_request_from_xen(req);
    if (r) return std::optional<VmEventRequest>{*r};
    if (r.error().code != Errc::NotSupported) return std::unexpected(r.error());

    // A well-formed event of a kind libxenprobes never enables: resume the vCPU unchanged,
    // as xen-access does, and carry on with the next request.
    XP_LOG(Warn, "dom%u: %s; resuming vCPU %u unchanged", impl_->dom.value, r.error().what.c_str(), req.vcpu_id);
    vm_event_response_t rsp{};
    rsp.version = VM_EVENT_INTERFACE_VERSION;
    rsp.vcpu_id = req.vcpu_id;
    rsp.reason = req.reason;
    rsp.flags = req.flags & VM_EVENT_FLAG_VCPU_PAUSED;
    XP_TRY(push_xen_response(&rsp));
    answered = true;
  }
}

Result<void> VmEventBackRing::push_response(const VmEventResponse& r) {
  vm_event_response_t rsp{};
  XP_TRY(vm_event_response_to_xen(r, rsp));
  return push_xen_response(&rsp);
}

Result<void> VmEventBackRing::push_xen_response(const vm_event_st* rsp) {
  auto& back = impl_->back;
  if (back.rsp_prod_pvt == back.req_cons)
    return fail(Errc::NoSpace, on_dom("vm_event ring", impl_->dom) + ": no request is waiting for a response");
  std::memcpy(RING_GET_RESPONSE(&back, back.rsp_prod_pvt), rsp, sizeof *rsp);
  ++back.rsp_prod_pvt;
  RING_PUSH_RESPONSES(&back);
  return {};
}

// ---- XcShim: the monitor -------------------------------------------------------------------

Result<std::unique_ptr<VmEventRing>> XcShim::monitor_enable(DomId dom) {
  std::uint32_t remote_port = 0;
  void* page = xc_monitor_enable(xch_, dom.value, &remote_port);
  if (!page) {
    int e = errno;
    if (e == EBUSY)
      return fail(Errc::Busy,
                  on_dom("xc_monitor_enable", dom) + ": a vm_event monitor is already attached (one per domain)");
    return fail_errno(e, on_dom("xc_monitor_enable", dom));
  }
  // Transactional: undo the enable if binding fails.
  auto rollback = [&] {
    munmap(page, XC_PAGE_SIZE);
    xc_monitor_disable(xch_, dom.value);
  };
  auto ev = Evtchn::open();
  if (!ev) {
    rollback();
    return std::unexpected(ev.error());
  }
  auto port = (*ev)->bind_interdomain(dom, remote_port);
  if (!port) {
    rollback();
    return std::unexpected(port.error());
  }
  return std::unique_ptr<VmEventRing>(new XenVmEventRing(page, dom, std::move(*ev), *port));
}

Result<void> XcShim::monitor_disable(DomId dom) {
  if (xc_monitor_disable(xch_, dom.value) < 0) return fail_errno(errno, on_dom("xc_monitor_disable", dom));
  return {};
}

// The guardian's step after the ring's owner died (docs/guardian.md). Read from the Xen 4.17
// sources, not yet run on a real Xen:
//  - xc_monitor_enable took the ring page out of the guest's physmap and the dead process's
//    mapping went with it, so nobody can answer the requests in that ring any more;
//  - vm_event_disable frees the ring but resumes only vCPUs it paused for lack of ring room
//    (and refuses with EBUSY while one waits for room); a vCPU paused by a request keeps its
//    vm_event pause;
//  - vm_event_resume acts on a response only for a vCPU that has a vm_event pause, and a
//    response with VM_EVENT_FLAG_VCPU_PAUSED releases it.
// So: monitoring off, disable the dead ring, enable a fresh one (xc_monitor_enable puts a page
// back for it), answer every vCPU once through it (XEN_VM_EVENT_RESUME, no event channel
// needed), disable it again.
Result<void> XcShim::monitor_recover(DomId dom, unsigned vcpus) {
  (void)xc_monitor_software_breakpoint(xch_, dom.value, false);
  (void)xc_monitor_debug_exceptions(xch_, dom.value, false, false);
  if (xc_monitor_disable(xch_, dom.value) < 0) {
    int e = errno;
    if (e == EBUSY)
      return fail(Errc::Busy, on_dom("xc_monitor_disable", dom) +
                                  ": vCPUs wait for room in a ring whose owner is gone; they stay paused");
    if (e != ENODEV && e != EINVAL) return fail_errno(e, on_dom("xc_monitor_disable", dom));
  }
  std::uint32_t port = 0;
  void* page = xc_monitor_enable(xch_, dom.value, &port);
  if (!page) return fail_errno(errno, on_dom("xc_monitor_enable (to release paused vCPUs)", dom));
  auto* sring = static_cast<vm_event_sring_t*>(page);
  SHARED_RING_INIT(sring);
  vm_event_back_ring_t back{};
  BACK_RING_INIT(&back, sring, XC_PAGE_SIZE);
  const unsigned size = RING_SIZE(&back);
  Result<void> result;
  for (unsigned v = 0; v < vcpus && result;) {
    for (unsigned n = 0; n < size && v < vcpus; ++n, ++v) {
      vm_event_response_t rsp{};
      rsp.version = VM_EVENT_INTERFACE_VERSION;
      rsp.vcpu_id = v;
      rsp.flags = VM_EVENT_FLAG_VCPU_PAUSED;
      rsp.reason = VM_EVENT_REASON_DEBUG_EXCEPTION;
      std::memcpy(RING_GET_RESPONSE(&back, back.rsp_prod_pvt), &rsp, sizeof rsp);
      ++back.rsp_prod_pvt;
    }
    RING_PUSH_RESPONSES(&back);
    if (xc_monitor_resume(xch_, dom.value) < 0) result = fail_errno(errno, on_dom("xc_monitor_resume", dom));
  }
  munmap(page, XC_PAGE_SIZE);
  if (xc_monitor_disable(xch_, dom.value) < 0 && result) result = fail_errno(errno, on_dom("xc_monitor_disable", dom));
  return result;
}

Result<void> XcShim::monitor_software_breakpoint(DomId dom, bool on) {
  if (xc_monitor_software_breakpoint(xch_, dom.value, on) < 0)
    return fail_errno(errno, on_dom("xc_monitor_software_breakpoint", dom));
  return {};
}

Result<void> XcShim::monitor_debug_exceptions(DomId dom, bool on, bool sync) {
  if (xc_monitor_debug_exceptions(xch_, dom.value, on, sync) < 0)
    return fail_errno(errno, on_dom("xc_monitor_debug_exceptions", dom));
  return {};
}

}  // namespace xenprobes::hv::xen
