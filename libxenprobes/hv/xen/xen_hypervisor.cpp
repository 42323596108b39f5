// hv::Hypervisor over the real Xen. No Xen header here: the library calls are in the
// xc_shim*.cpp files, evtchn.cpp, xenstore.cpp and foreign_memory.cpp, behind xen_internal.hpp.
#include "hv/xen/xen_hypervisor.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/log.hpp"
#include "hv/xen/xen_internal.hpp"

namespace xenprobes::hv {
namespace xen {
namespace {

// Dom0 exposes the hypercall interface as /dev/xen/privcmd (or /proc/xen/privcmd with an old
// xenfs layout). Checking for it first keeps xc_interface_open from ever running (and logging)
// on a machine that is not a Xen Dom0.
Result<void> check_privcmd() {
  static constexpr const char* kPaths[] = {"/dev/xen/privcmd", "/proc/xen/privcmd"};
  for (const char* path : kPaths) {
    struct stat st;
    if (::stat(path, &st) != 0) {
      int e = errno;
      if (e == ENOENT || e == ENOTDIR) continue;
      if (e == EACCES)
        return fail(Errc::Permission, std::string("permission denied on ") + path + ": run as root in Dom0");
      return fail_errno(e, std::string("stat ") + path);
    }
    int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
      ::close(fd);
      return {};
    }
    int e = errno;
    if (e == EACCES || e == EPERM)
      return fail(Errc::Permission, std::string("permission denied on ") + path + ": run as root in Dom0");
    return fail_errno(e, std::string("open ") + path);
  }
  return fail(Errc::NotSupported, kNoPrivcmdMessage);
}

class XenHypervisor final : public Hypervisor {
 public:
  XenHypervisor(std::unique_ptr<XcShim> xc, std::shared_ptr<ForeignMemory> fmem, std::unique_ptr<Evtchn> ev,
                Result<std::unique_ptr<XsClient>> xs)
      : xc_(std::move(xc)), fmem_(std::move(fmem)), ev_(std::move(ev)) {
    if (xs) {
      xs_ = std::move(*xs);
    } else {
      xs_error_ = xs.error();
      XP_LOG(Debug, "xenstore unavailable: %s", xs_error_.what.c_str());
    }
  }

  std::string name() const override { return "xen"; }
  Result<std::string> version() override { return xc_->version(); }

  Result<Capabilities> capabilities() override {
    std::lock_guard lk(caps_mu_);
    if (!caps_) {
      Capabilities c;
      c.gdbsx = XP_TRY(xc_->has_gdbsx());
      c.vm_event = true;  // obj-y in Xen 4.17 (Debian included); per domain: HVM/PVH only
      caps_ = c;
    }
    return *caps_;
  }

  // ---- domains ----

  Result<std::vector<DomainInfo>> list_domains() override {
    auto list = XP_TRY(xc_->list_domains());
    {
      std::lock_guard lk(kinds_mu_);
      kinds_.clear();  // also drops domains that are gone
      for (const auto& d : list) kinds_[d.domid.value] = {d.type, d.guest_width};
    }
    for (auto& d : list) d.name = name_of(d.domid);
    return list;
  }

  Result<DomainInfo> domain_info(DomId dom) override {
    auto d = XP_TRY(gone_check(dom, xc_->domain_info(dom)));
    remember(d);
    d.name = name_of(dom);
    return d;
  }

  Result<void> pause(DomId dom) override { return gone_check(dom, xc_->pause(dom)); }
  Result<void> unpause(DomId dom) override { return gone_check(dom, xc_->unpause(dom)); }

  // ---- vCPU state ----

  Result<VcpuRegs> get_vcpu_regs(DomId dom, VcpuId vcpu) override {
    auto k = XP_TRY(kind_of(dom));
    if (k.type == GuestType::Hvm) return gone_check(dom, xc_->get_hvm_regs(dom, vcpu));
    XP_TRY(require_64bit_pv(dom, k));
    return gone_check(dom, xc_->get_pv_regs(dom, vcpu));
  }

  Result<void> set_vcpu_regs(DomId dom, VcpuId vcpu, const VcpuRegs& r) override {
    auto k = XP_TRY(kind_of(dom));
    if (k.type == GuestType::Hvm) return gone_check(dom, xc_->set_hvm_regs(dom, vcpu, r));
    XP_TRY(require_64bit_pv(dom, k));
    return gone_check(dom, xc_->set_pv_regs(dom, vcpu, r));
  }

  // ---- memory ----

  Result<ForeignMapping> map_frames(DomId dom, std::span<const Frame> frames, MapAccess access) override {
    return gone_check(dom, fmem_->map(dom, frames, access));
  }

  // ---- xenstore ----

  Result<std::string> xs_read(const std::string& path) override { return XP_TRY(xs())->read(path); }
  Result<void> xs_write(const std::string& path, const std::string& value) override {
    return XP_TRY(xs())->write(path, value);
  }
  Result<void> xs_rm(const std::string& path) override { return XP_TRY(xs())->rm(path); }
  Result<std::vector<std::string>> xs_directory(const std::string& path) override {
    return XP_TRY(xs())->directory(path);
  }
  Result<void> xs_grant_read(const std::string& path, DomId reader) override {
    return XP_TRY(xs())->grant_read(path, reader);
  }
  Result<void> xs_watch(const std::string& path, const std::string& token) override {
    return XP_TRY(xs())->watch(path, token);
  }
  Result<void> xs_unwatch(const std::string& path, const std::string& token) override {
    return XP_TRY(xs())->unwatch(path, token);
  }
  int xs_fd() override { return xs_ ? xs_->fd() : -1; }
  Result<std::vector<WatchEvent>> xs_read_watches() override { return XP_TRY(xs())->read_watches(); }

  // ---- event channels ----

  Result<EvtchnPort> evtchn_bind_virq(unsigned virq) override { return ev_->bind_virq(virq); }
  Result<EvtchnPort> evtchn_bind_interdomain(DomId dom, std::uint32_t remote_port) override {
    return gone_check(dom, ev_->bind_interdomain(dom, remote_port));
  }
  Result<void> evtchn_unbind(EvtchnPort port) override { return ev_->unbind(port); }
  Result<void> evtchn_notify(EvtchnPort port) override { return ev_->notify(port); }
  int evtchn_fd() override { return ev_->fd(); }
  Result<std::optional<EvtchnPort>> evtchn_pending() override { return ev_->pending(); }
  Result<void> evtchn_unmask(EvtchnPort port) override { return ev_->unmask(port); }

  // ---- debugging mode ----

  Result<void> set_debugging(DomId dom, bool on) override { return gone_check(dom, xc_->set_debugging(dom, on)); }
  Result<GdbsxStatus> gdbsx_domstatus(DomId dom) override { return gone_check(dom, xc_->gdbsx_domstatus(dom)); }

  // ---- vm_event monitor ----

  Result<std::unique_ptr<VmEventRing>> monitor_enable(DomId dom) override {
    XP_TRY(require_hvm(dom, "vm_event needs an HVM or PVH guest"));
    return gone_check(dom, xc_->monitor_enable(dom));
  }
  Result<void> monitor_disable(DomId dom) override {
    XP_TRY(require_hvm(dom, "vm_event needs an HVM or PVH guest"));
    return gone_check(dom, xc_->monitor_disable(dom));
  }
  Result<void> monitor_software_breakpoint(DomId dom, bool on) override {
    XP_TRY(require_hvm(dom, "vm_event needs an HVM or PVH guest"));
    return gone_check(dom, xc_->monitor_software_breakpoint(dom, on));
  }
  Result<void> monitor_debug_exceptions(DomId dom, bool on, bool sync) override {
    XP_TRY(require_hvm(dom, "vm_event needs an HVM or PVH guest"));
    return gone_check(dom, xc_->monitor_debug_exceptions(dom, on, sync));
  }
  Result<void> monitor_recover(DomId dom) override {
    XP_TRY(require_hvm(dom, "vm_event needs an HVM or PVH guest"));
    DomainInfo info = XP_TRY(domain_info(dom));
    return gone_check(dom, xc_->monitor_recover(dom, info.vcpus));
  }
  Result<void> inject_event(DomId dom, VcpuId vcpu, std::uint8_t vector, std::uint8_t type, std::uint32_t error_code,
                            std::uint8_t insn_len) override {
    XP_TRY(require_hvm(dom, "event injection needs an HVM or PVH guest"));
    return gone_check(dom, xc_->inject_event(dom, vcpu, vector, type, error_code, insn_len));
  }

 private:
  struct GuestKind {
    GuestType type = GuestType::Pv;
    unsigned width = 8;
  };

  // Guest type and width never change during a domain's life, and Xen 4.17 does not hand a
  // destroyed domain's id out again soon (Xen's allocator moves forward; libxl's random policy
  // avoids recently used ids). So they are cached per domid, dropped when a call says the
  // domain is gone (ESRCH) and refreshed by list_domains/domain_info. This saves one or two
  // domctls on every register access.
  Result<GuestKind> kind_of(DomId dom) {
    {
      std::lock_guard lk(kinds_mu_);
      if (auto it = kinds_.find(dom.value); it != kinds_.end()) return it->second;
    }
    auto d = XP_TRY(gone_check(dom, xc_->domain_info(dom)));
    remember(d);
    return GuestKind{d.type, d.guest_width};
  }

  void remember(const DomainInfo& d) {
    std::lock_guard lk(kinds_mu_);
    kinds_[d.domid.value] = {d.type, d.guest_width};
  }

  template <typename T>
  Result<T> gone_check(DomId dom, Result<T> r) {
    if (!r && r.error().code == Errc::NoSuchDomain) {
      std::lock_guard lk(kinds_mu_);
      kinds_.erase(dom.value);
    }
    return r;
  }

  Result<void> require_hvm(DomId dom, const char* why) {
    auto k = XP_TRY(kind_of(dom));
    if (k.type != GuestType::Hvm)
      return fail(Errc::NotSupported, std::string(why) + " (dom" + std::to_string(dom.value) + " is PV)");
    return {};
  }

  static Result<void> require_64bit_pv(DomId dom, GuestKind k) {
    // Debian's Xen 4.17 is built without CONFIG_PV32 anyway (the build configuration it carries,
    // xen-hypervisor-4.17-amd64 4.17.5+72-g01140da4e8-1: "# CONFIG_PV32 is not set").
    if (k.width != 8)
      return fail(Errc::NotSupported,
                  "dom" + std::to_string(dom.value) + " is a 32-bit PV guest: only 64-bit PV is supported");
    return {};
  }

  Result<XsClient*> xs() {
    if (!xs_) return std::unexpected(xs_error_);
    return xs_.get();
  }

  std::string name_of(DomId dom) {
    if (!xs_) return {};
    auto n = xs_->read("/local/domain/" + std::to_string(dom.value) + "/name");
    if (!n) {
      XP_LOG(Debug, "dom%u: no name: %s", dom.value, n.error().what.c_str());
      return {};
    }
    return std::move(*n);
  }

  std::unique_ptr<XcShim> xc_;
  std::shared_ptr<ForeignMemory> fmem_;
  std::unique_ptr<Evtchn> ev_;
  std::unique_ptr<XsClient> xs_;  // null if xs_open failed: xs_* then return xs_error_
  Error xs_error_;

  std::mutex caps_mu_;
  std::optional<Capabilities> caps_;

  std::mutex kinds_mu_;
  std::unordered_map<std::uint32_t, GuestKind> kinds_;
};

}  // namespace
}  // namespace xen

Result<std::unique_ptr<Hypervisor>> open_xen_hypervisor() {
  XP_TRY(xen::check_privcmd());
  auto xc = XP_TRY(xen::XcShim::open());
  XP_TRY(xc->sanity_check());
  auto fmem = XP_TRY(xen::ForeignMemory::open());
  auto ev = XP_TRY(xen::Evtchn::open());
  // xenstore is optional: domain names become "" and xs_* report why.
  auto xs = xen::XsClient::open();
  return std::unique_ptr<Hypervisor>(
      new xen::XenHypervisor(std::move(xc), std::move(fmem), std::move(ev), std::move(xs)));
}

}  // namespace xenprobes::hv
