// SimXenHandle's vm_event side, with Xen 4.17 semantics: the monitor ring (SimRing) and the
// monitor calls, event injection, and the ring's requests and responses as vm_event_resume
// acts on them.
#include <cstring>

#include "hv/sim/sim_host_impl.hpp"
#include "hv/sim/sim_xen_internal.hpp"

namespace xenprobes::hv::sim {

// ---- vm_event ----

class SimRing final : public VmEventRing {
 public:
  SimRing(SimXenHandle* h, DomId d) : h_(h), d_(d) {}
  ~SimRing() override = default;
  int fd() const override { return h_->ring_fd(); }
  Result<std::optional<VmEventRequest>> get_request() override { return h_->ring_get(d_); }
  Result<void> put_response(const VmEventResponse& r) override { return h_->ring_put(d_, r); }
  Result<void> notify() override { return h_->ring_notify(d_); }

 private:
  SimXenHandle* h_;
  DomId d_;
};

Result<std::unique_ptr<VmEventRing>> SimXenHandle::monitor_enable(DomId id) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::MonitorEnable));
  Domain* d = XP_TRY(host_->dom(id));
  if (d->cfg.type != GuestType::Hvm)
    return fail(Errc::NotSupported, "domain " + dstr(id) + " is PV: vm_event needs an HVM or PVH guest");
  if (d->monitor) return fail(Errc::Busy, "domain " + dstr(id) + ": the monitor ring is already enabled");
  d->monitor = true;
  d->monitor_owner = this;
  d->outstanding = 0;
  d->requests.clear();
  d->responses.clear();
  return std::unique_ptr<VmEventRing>(std::make_unique<SimRing>(this, id));
}

Result<void> SimXenHandle::monitor_disable(DomId id) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::MonitorDisable));
  Domain* d = XP_TRY(host_->dom(id));
  if (!d->monitor) return fail(Errc::InvalidArgument, "domain " + dstr(id) + ": monitor not enabled");
  // vm_event_disable (xen/common/vm_event.c:194-198 in 4.17): EBUSY while a vCPU waits in the
  // ring's wait queue for a free slot.
  if (!d->ring_waiters.empty())
    return fail(Errc::Busy, "domain " + dstr(id) + ": vCPUs are waiting for room in the vm_event ring");
  d->monitor = d->mon_sw_bp = d->mon_debug = false;
  d->monitor_owner = nullptr;
  // The ring goes with its unread requests and unconsumed responses. Xen unblocks only vCPUs
  // it paused for lack of ring space (:203-211); a vCPU paused by a request nobody answered
  // keeps its vm_event pause (vm_event_pause_count) for good: answer everything first.
  d->requests.clear();
  d->responses.clear();
  d->outstanding = 0;
  host_->cv_.notify_all();
  return {};
}

Result<void> SimXenHandle::monitor_recover(DomId id) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::MonitorDisable));
  Domain* d = XP_TRY(host_->dom(id));
  if (!d->monitor) return fail(Errc::InvalidArgument, "domain " + dstr(id) + ": monitor not enabled");
  // What xc_shim's version reaches on a real Xen in several steps (monitoring off, disable,
  // a fresh ring answering every vCPU, disable again): no monitoring, no ring, no vCPU left
  // paused by vm_event or waiting for ring room. Those vCPUs stand on their trap address and
  // re-execute what is there now.
  d->mon_sw_bp = d->mon_debug = false;
  for (auto& v : d->vcpus) {
    v->vm_pause = 0;
    v->ring_wait = false;
  }
  d->ring_waiters.clear();
  d->requests.clear();
  d->responses.clear();
  d->outstanding = 0;
  d->monitor = false;
  d->monitor_owner = nullptr;
  host_->cv_.notify_all();
  return {};
}

Result<void> SimXenHandle::monitor_software_breakpoint(DomId id, bool on) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::MonitorSoftwareBreakpoint));
  Domain* d = XP_TRY(host_->dom(id));
  if (d->cfg.type != GuestType::Hvm) return fail(Errc::NotSupported, "vm_event needs an HVM or PVH guest");
  d->mon_sw_bp = on;
  return {};
}

Result<void> SimXenHandle::monitor_debug_exceptions(DomId id, bool on, bool) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::MonitorDebugExceptions));
  Domain* d = XP_TRY(host_->dom(id));
  if (d->cfg.type != GuestType::Hvm) return fail(Errc::NotSupported, "vm_event needs an HVM or PVH guest");
  d->mon_debug = on;
  return {};
}

Result<void> SimXenHandle::inject_event(DomId id, VcpuId vid, std::uint8_t vector, std::uint8_t, std::uint32_t,
                                        std::uint8_t) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::InjectEvent));
  Domain* d = XP_TRY(host_->dom(id));
  XP_TRY(host_->vcpu(*d, vid));
  if (d->cfg.type != GuestType::Hvm) return fail(Errc::NotSupported, "inject_event needs an HVM or PVH guest");
  // The demo guest has no IDT: an exception delivered to it is fatal, as in trap().
  host_->crash(*d, "vcpu " + std::to_string(vid.value) + ": injected exception " + std::to_string(vector));
  return {};
}

Result<std::optional<VmEventRequest>> SimXenHandle::ring_get(DomId id) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::RingGetRequest));
  Domain* d = XP_TRY(host_->dom(id));
  ring_fd_.drain();
  std::optional<VmEventRequest> r;
  if (!d->requests.empty()) {
    r = d->requests.front();
    d->requests.pop_front();
  }
  // One fd serves every ring of this handle (a real ring has an event channel of its own):
  // it stays readable while any of them holds requests, or taking from one ring would hide
  // a request another domain posted meanwhile.
  for (const auto& [oid, o] : host_->domains_)
    if (o->monitor_owner == this && !o->requests.empty()) {
      ring_fd_.signal();
      break;
    }
  return r;
}

Result<void> SimXenHandle::ring_put(DomId id, const VmEventResponse& r) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::RingPutResponse));
  Domain* d = XP_TRY(host_->dom(id));
  if (d->responses.size() >= host_->opts_.ring_slots) return fail(Errc::NoSpace, "vm_event: response ring full");
  if ((r.flags & kVmEventFlagSetRegisters) && (r.flags & kVmEventFlagSetEmulInsnData))
    return fail(Errc::InvalidArgument,
                "vm_event: SET_REGISTERS and SET_EMUL_INSN_DATA share one union in the response");
  d->responses.push_back(r);
  return {};
}

Result<void> SimXenHandle::ring_notify(DomId id) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::RingNotify));
  Domain* d = XP_TRY(host_->dom(id));
  // vm_event_resume: consume every response; flags only act on a vCPU paused by vm_event.
  while (!d->responses.empty()) {
    VmEventResponse r = d->responses.front();
    d->responses.pop_front();
    if (d->outstanding) d->outstanding--;
    if (r.vcpu >= d->vcpus.size()) continue;  // Xen ignores responses for bad vCPUs
    Vcpu& v = *d->vcpus[r.vcpu];
    if (!v.vm_pause) continue;
    if (r.flags & kVmEventFlagSetRegisters) host_->write_regs(v, r.regs, false);
    // vm_event_emulate_check (xen/arch/x86/vm_event.c:260-291): supplied instruction bytes
    // are taken only in answer to a software breakpoint; for any other reason (a debug
    // exception, i.e. ICEBP) nothing is emulated and the vCPU resumes at RIP unchanged.
    if ((r.flags & kVmEventFlagEmulate) && (r.flags & kVmEventFlagSetEmulInsnData) &&
        r.reason == VmEventReason::SoftwareBreakpoint) {
      v.pending_emulate = true;
      std::memcpy(v.emul.data(), r.emul_insn, sizeof r.emul_insn);
    }
    if (r.flags & kVmEventFlagVcpuPaused) v.vm_pause = 0;
  }
  // Freed slots let waiting vCPUs post their requests.
  while (d->outstanding < host_->opts_.ring_slots && !d->ring_waiters.empty()) {
    Vcpu& v = *d->vcpus[d->ring_waiters.front()];
    d->ring_waiters.pop_front();
    v.ring_wait = false;
    host_->post_request_locked(*d, v, v.waiting_req);
  }
  host_->cv_.notify_all();
  return {};
}

}  // namespace xenprobes::hv::sim
