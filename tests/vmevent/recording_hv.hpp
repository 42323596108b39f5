// A Hypervisor that forwards every call to another one and records what the vm_event channel
// asked of it: injected events and the responses it put into a ring (the simulated Xen crashes
// the demo guest on an injected event without saying how it was injected).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "hv/hypervisor.hpp"

namespace xenprobes::testing {

struct Injected {
  DomId dom;
  VcpuId vcpu;
  std::uint8_t vector, type;
  std::uint32_t error_code;
  std::uint8_t insn_len;
};

class RecordingHv final : public hv::Hypervisor {
 public:
  explicit RecordingHv(hv::Hypervisor& inner) : in_(inner) {}

  bool vm_event = true;  // false: report a hypervisor without the monitor interface
  std::vector<Injected> injected;
  std::vector<hv::VmEventResponse> responses;  // in the order they went into a ring

  std::string name() const override { return in_.name(); }
  Result<std::string> version() override { return in_.version(); }
  Result<hv::Capabilities> capabilities() override {
    auto c = in_.capabilities();
    if (c && !vm_event) c->vm_event = false;
    return c;
  }
  Result<std::vector<hv::DomainInfo>> list_domains() override { return in_.list_domains(); }
  Result<hv::DomainInfo> domain_info(DomId d) override { return in_.domain_info(d); }
  Result<void> pause(DomId d) override { return in_.pause(d); }
  Result<void> unpause(DomId d) override { return in_.unpause(d); }
  Result<hv::VcpuRegs> get_vcpu_regs(DomId d, VcpuId v) override { return in_.get_vcpu_regs(d, v); }
  Result<void> set_vcpu_regs(DomId d, VcpuId v, const hv::VcpuRegs& r) override { return in_.set_vcpu_regs(d, v, r); }
  Result<hv::ForeignMapping> map_frames(DomId d, std::span<const Frame> f, hv::MapAccess a) override {
    return in_.map_frames(d, f, a);
  }
  Result<std::string> xs_read(const std::string& p) override { return in_.xs_read(p); }
  Result<void> xs_write(const std::string& p, const std::string& v) override { return in_.xs_write(p, v); }
  Result<void> xs_rm(const std::string& p) override { return in_.xs_rm(p); }
  Result<std::vector<std::string>> xs_directory(const std::string& p) override { return in_.xs_directory(p); }
  Result<void> xs_grant_read(const std::string& p, DomId d) override { return in_.xs_grant_read(p, d); }
  Result<void> xs_watch(const std::string& p, const std::string& t) override { return in_.xs_watch(p, t); }
  Result<void> xs_unwatch(const std::string& p, const std::string& t) override { return in_.xs_unwatch(p, t); }
  int xs_fd() override { return in_.xs_fd(); }
  Result<std::vector<hv::WatchEvent>> xs_read_watches() override { return in_.xs_read_watches(); }
  Result<hv::EvtchnPort> evtchn_bind_virq(unsigned v) override { return in_.evtchn_bind_virq(v); }
  Result<hv::EvtchnPort> evtchn_bind_interdomain(DomId d, std::uint32_t p) override {
    return in_.evtchn_bind_interdomain(d, p);
  }
  Result<void> evtchn_unbind(hv::EvtchnPort p) override { return in_.evtchn_unbind(p); }
  Result<void> evtchn_notify(hv::EvtchnPort p) override { return in_.evtchn_notify(p); }
  int evtchn_fd() override { return in_.evtchn_fd(); }
  Result<std::optional<hv::EvtchnPort>> evtchn_pending() override { return in_.evtchn_pending(); }
  Result<void> evtchn_unmask(hv::EvtchnPort p) override { return in_.evtchn_unmask(p); }
  Result<void> set_debugging(DomId d, bool on) override { return in_.set_debugging(d, on); }
  Result<hv::GdbsxStatus> gdbsx_domstatus(DomId d) override { return in_.gdbsx_domstatus(d); }
  Result<std::unique_ptr<hv::VmEventRing>> monitor_enable(DomId d) override {
    auto r = in_.monitor_enable(d);
    if (!r) return r;
    return std::unique_ptr<hv::VmEventRing>(std::make_unique<Ring>(*this, std::move(*r)));
  }
  Result<void> monitor_disable(DomId d) override { return in_.monitor_disable(d); }
  Result<void> monitor_software_breakpoint(DomId d, bool on) override { return in_.monitor_software_breakpoint(d, on); }
  Result<void> monitor_debug_exceptions(DomId d, bool on, bool sync) override {
    return in_.monitor_debug_exceptions(d, on, sync);
  }
  Result<void> inject_event(DomId d, VcpuId v, std::uint8_t vector, std::uint8_t type, std::uint32_t ec,
                            std::uint8_t len) override {
    injected.push_back(Injected{d, v, vector, type, ec, len});
    return in_.inject_event(d, v, vector, type, ec, len);
  }

 private:
  class Ring final : public hv::VmEventRing {
   public:
    Ring(RecordingHv& o, std::unique_ptr<hv::VmEventRing> r) : o_(o), r_(std::move(r)) {}
    int fd() const override { return r_->fd(); }
    Result<std::optional<hv::VmEventRequest>> get_request() override { return r_->get_request(); }
    Result<void> put_response(const hv::VmEventResponse& rsp) override {
      auto r = r_->put_response(rsp);
      if (r) o_.responses.push_back(rsp);
      return r;
    }
    Result<void> notify() override { return r_->notify(); }

   private:
    RecordingHv& o_;
    std::unique_ptr<hv::VmEventRing> r_;
  };

  hv::Hypervisor& in_;
};

}  // namespace xenprobes::testing
