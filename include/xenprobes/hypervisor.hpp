// hv::Hypervisor — the only seam between libxenprobes and Xen.
//
// It speaks Xen's own concepts (domains, vCPU contexts, foreign frame mappings, xenstore,
// event channels, debugging mode, the vm_event monitor ring) and nothing more: everything
// else (page-table walks, probes, channels) is built in the layers above on top of it.
//
// Two implementations: hv/xen (libxenctrl & co., the real thing) and hv/sim (the simulated
// Xen that runs a real x86-64 guest kernel with Unicorn). Both follow the Xen 4.17 semantics
// the comments of hv/xen/ cite from Xen's source; where the sim simplifies, sim.hpp says so.
//
// Thread safety: every method may be called from any thread; implementations serialise
// internally. Returned mappings stay valid until the ForeignMapping is destroyed, even if
// the domain dies in between (Xen keeps the page referenced as long as it is mapped).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xenprobes/export.h"
#include "xenprobes/result.hpp"
#include "xenprobes/types.hpp"

namespace xenprobes::hv {

enum class GuestType { Pv, Hvm };  // PVH reports as Hvm, as XEN_DOMINF_hvm_guest does

// xen_domain_handle_t: the 16-byte handle (the toolstack's UUID) XEN_DOMCTL_getdomaininfo
// reports. A domid is reused once its domain is gone; the handle names one domain (xl gives
// every domain a fresh UUID; a toolstack that leaves it zero gives no such guarantee).
using DomainHandle = std::array<std::uint8_t, 16>;

struct DomainInfo {
  DomId domid;
  DomainHandle handle{};
  GuestType type = GuestType::Pv;
  unsigned guest_width = 8;  // bytes: 8 for 64-bit, 4 for 32-bit guests
  unsigned vcpus = 0;        // max_vcpu_id + 1
  unsigned online_vcpus = 0;
  bool paused = false;  // controller pause count > 0 (the exact count is not visible)
  bool dying = false;
  bool shutdown = false;
  bool crashed = false;   // shutdown with reason crash
  bool debugged = false;  // XEN_DOMINF_debugged
  std::string name;       // from xenstore /local/domain/<id>/name, "" if unknown
};

// The x86-64 register file as Dom0 sees it. cr3 holds a physical address: for PV guests
// the machine address of the L4 (xen_cr3_to_pfn already decoded, so cr3 >> 12 is an MFN),
// for HVM guests a guest-physical address (cr3 >> 12 is a GFN).
struct VcpuRegs {
  std::uint64_t rax = 0, rbx = 0, rcx = 0, rdx = 0, rsi = 0, rdi = 0, rbp = 0, rsp = 0;
  std::uint64_t r8 = 0, r9 = 0, r10 = 0, r11 = 0, r12 = 0, r13 = 0, r14 = 0, r15 = 0;
  std::uint64_t rip = 0, rflags = 0;
  std::uint64_t cr0 = 0, cr2 = 0, cr3 = 0, cr4 = 0, efer = 0;
  std::uint64_t dr6 = 0, dr7 = 0;
  std::uint64_t fs_base = 0, gs_base = 0;
  std::uint16_t cs = 0, ss = 0;
  bool kernel_mode = true;  // guest kernel mode as Xen decides it (PV: TF_kernel_mode)
};

// A mapping of guest frames into this process. Move-only; unmaps on destruction.
class ForeignMapping {
 public:
  ForeignMapping() = default;
  ForeignMapping(std::byte* data, std::size_t pages, std::function<void(std::byte*, std::size_t)> unmap)
      : data_(data), pages_(pages), unmap_(std::move(unmap)) {}
  ForeignMapping(ForeignMapping&& o) noexcept { *this = std::move(o); }
  ForeignMapping& operator=(ForeignMapping&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      pages_ = std::exchange(o.pages_, 0);
      unmap_ = std::move(o.unmap_);
    }
    return *this;
  }
  ForeignMapping(const ForeignMapping&) = delete;
  ForeignMapping& operator=(const ForeignMapping&) = delete;
  ~ForeignMapping() { reset(); }

  std::byte* data() const { return data_; }
  std::size_t pages() const { return pages_; }
  std::span<std::byte> bytes() const { return {data_, pages_ * kPageSize}; }
  explicit operator bool() const { return data_ != nullptr; }

  void reset() {
    if (data_ && unmap_) unmap_(data_, pages_);
    data_ = nullptr;
    pages_ = 0;
  }

 private:
  std::byte* data_ = nullptr;
  std::size_t pages_ = 0;
  std::function<void(std::byte*, std::size_t)> unmap_;
};

enum class MapAccess { Read, ReadWrite };

struct WatchEvent {
  std::string path;
  std::string token;
};

// Event-channel port in this process's event-channel handle.
using EvtchnPort = std::uint32_t;

inline constexpr unsigned kVirqDebugger = 6;  // VIRQ_DEBUGGER, xen/include/public/xen.h

// What XEN_DOMCTL_gdbsx_domstatus reports: one vCPU with a recorded debug event.
struct GdbsxStatus {
  bool paused = false;           // controller pause count > 0
  std::optional<unsigned> vcpu;  // nullopt: no vCPU has a recorded event (vcpu_id == -1)
  unsigned event = 0;            // trap number (3 for int3)
};

// ---- vm_event monitor ring (xen/include/public/vm_event.h, interface version 7) ----

enum class VmEventReason : std::uint32_t {
  SoftwareBreakpoint = 6,  // VM_EVENT_REASON_SOFTWARE_BREAKPOINT
  Singlestep = 7,          // VM_EVENT_REASON_SINGLESTEP
  DebugException = 9,      // VM_EVENT_REASON_DEBUG_EXCEPTION
};

inline constexpr std::uint32_t kVmEventFlagVcpuPaused = 1u << 0;
// Same values as VM_EVENT_FLAG_* in xen/include/public/vm_event.h (interface version 7).
inline constexpr std::uint32_t kVmEventFlagEmulate = 1u << 2;
inline constexpr std::uint32_t kVmEventFlagToggleSinglestep = 1u << 4;
inline constexpr std::uint32_t kVmEventFlagSetRegisters = 1u << 8;
inline constexpr std::uint32_t kVmEventFlagSetEmulInsnData = 1u << 9;

struct VmEventRequest {
  std::uint32_t vcpu = 0;
  std::uint32_t flags = 0;  // kVmEventFlag*
  VmEventReason reason = VmEventReason::SoftwareBreakpoint;
  VcpuRegs regs;  // rip = the breakpoint address itself
  std::uint64_t gfn = 0;
  std::uint8_t type = 0;  // X86_EVENTTYPE_*: 6 sw exception (int3), 5 privileged sw exc (ICEBP), 3 hw exc
  std::uint8_t insn_length = 0;
  std::uint32_t pending_dbg = 0;
};

struct VmEventResponse {
  std::uint32_t vcpu = 0;
  std::uint32_t flags = 0;  // echo kVmEventFlagVcpuPaused to unpause
  VmEventReason reason = VmEventReason::SoftwareBreakpoint;
  VcpuRegs regs;                    // used with kVmEventFlagSetRegisters (GPRs, rflags, rip)
  std::uint8_t emul_insn[16] = {};  // used with kVmEventFlagSetEmulInsnData (a union with regs in Xen)
};

// The monitor ring of one domain, as bound by this process.
class XENPROBES_API VmEventRing {
 public:
  virtual ~VmEventRing() = default;
  virtual int fd() const = 0;  // pollable; readable when requests may be pending
  // Takes the next request, or nullopt if the ring is empty. Acknowledges the notification.
  [[nodiscard]] virtual Result<std::optional<VmEventRequest>> get_request() = 0;
  [[nodiscard]] virtual Result<void> put_response(const VmEventResponse&) = 0;
  [[nodiscard]] virtual Result<void> notify() = 0;  // one EVTCHNOP_send: Xen processes the responses
};

// Which optional hypervisor features exist (checked once at open/attach time).
struct Capabilities {
  bool gdbsx = false;     // CONFIG_GDBSX: debugging mode really pauses the domain
  bool vm_event = false;  // monitor interface present (HVM/PVH guests only)
};

class XENPROBES_API Hypervisor {
 public:
  virtual ~Hypervisor() = default;

  virtual std::string name() const = 0;                     // "xen" or "sim"
  [[nodiscard]] virtual Result<std::string> version() = 0;  // "4.17.5" …
  [[nodiscard]] virtual Result<Capabilities> capabilities() = 0;

  // ---- domains ----
  [[nodiscard]] virtual Result<std::vector<DomainInfo>> list_domains() = 0;
  [[nodiscard]] virtual Result<DomainInfo> domain_info(DomId) = 0;
  // Reference counted exactly as XEN_DOMCTL_pausedomain / unpausedomain: every pause needs
  // one unpause, and unpausing a domain whose count is already zero fails with EINVAL.
  [[nodiscard]] virtual Result<void> pause(DomId) = 0;
  [[nodiscard]] virtual Result<void> unpause(DomId) = 0;

  // ---- vCPU state ----
  [[nodiscard]] virtual Result<VcpuRegs> get_vcpu_regs(DomId, VcpuId) = 0;
  // Sets GPRs, rip, rflags and dr6/dr7; control registers are echoed, not changed. Must not
  // disturb the guest's extended FPU state (a PV setcontext resets it: docs/probes.md "Known limits").
  [[nodiscard]] virtual Result<void> set_vcpu_regs(DomId, VcpuId, const VcpuRegs&) = 0;

  // ---- memory ----
  // Maps guest frames (MFNs for PV, GFNs for HVM) contiguously into this process.
  [[nodiscard]] virtual Result<ForeignMapping> map_frames(DomId, std::span<const Frame>, MapAccess) = 0;

  // ---- xenstore ----
  [[nodiscard]] virtual Result<std::string> xs_read(const std::string& path) = 0;
  [[nodiscard]] virtual Result<void> xs_write(const std::string& path, const std::string& value) = 0;
  [[nodiscard]] virtual Result<void> xs_rm(const std::string& path) = 0;
  [[nodiscard]] virtual Result<std::vector<std::string>> xs_directory(const std::string& path) = 0;
  // Gives domid read access to path (Dom0 stays owner): xs_set_permissions.
  [[nodiscard]] virtual Result<void> xs_grant_read(const std::string& path, DomId reader) = 0;
  // Watches path and everything below; "@introduceDomain"/"@releaseDomain" are special.
  // As in xenstored, a new watch fires once at once.
  [[nodiscard]] virtual Result<void> xs_watch(const std::string& path, const std::string& token) = 0;
  [[nodiscard]] virtual Result<void> xs_unwatch(const std::string& path, const std::string& token) = 0;
  virtual int xs_fd() = 0;  // pollable; readable when watch events are queued
  [[nodiscard]] virtual Result<std::vector<WatchEvent>> xs_read_watches() = 0;  // non-blocking, drains

  // ---- event channels (one handle per Hypervisor object) ----
  // Global VIRQs have one binder per host: a second bind fails with EEXIST.
  [[nodiscard]] virtual Result<EvtchnPort> evtchn_bind_virq(unsigned virq) = 0;
  [[nodiscard]] virtual Result<EvtchnPort> evtchn_bind_interdomain(DomId, std::uint32_t remote_port) = 0;
  [[nodiscard]] virtual Result<void> evtchn_unbind(EvtchnPort) = 0;
  [[nodiscard]] virtual Result<void> evtchn_notify(EvtchnPort) = 0;
  virtual int evtchn_fd() = 0;
  // Next pending port (the port is then masked until evtchn_unmask), or nullopt.
  [[nodiscard]] virtual Result<std::optional<EvtchnPort>> evtchn_pending() = 0;
  [[nodiscard]] virtual Result<void> evtchn_unmask(EvtchnPort) = 0;

  // ---- debugging mode (XEN_DOMCTL_setdebugging, gdbsx domctls) ----
  [[nodiscard]] virtual Result<void> set_debugging(DomId, bool on) = 0;
  // Fails with NoSys on a hypervisor built without CONFIG_GDBSX.
  [[nodiscard]] virtual Result<GdbsxStatus> gdbsx_domstatus(DomId) = 0;

  // ---- vm_event monitor (HVM/PVH only; NotSupported for PV) ----
  [[nodiscard]] virtual Result<std::unique_ptr<VmEventRing>> monitor_enable(DomId) = 0;
  [[nodiscard]] virtual Result<void> monitor_disable(DomId) = 0;
  [[nodiscard]] virtual Result<void> monitor_software_breakpoint(DomId, bool on) = 0;
  [[nodiscard]] virtual Result<void> monitor_debug_exceptions(DomId, bool on, bool sync) = 0;
  // The guardian's teardown of a monitor ring whose owner died (docs/guardian.md): turns
  // software-breakpoint and debug-exception monitoring off, releases every vCPU still paused
  // by a request nobody will answer (or waiting for room in the ring), and disables the
  // ring. Only for a ring no live process serves.
  [[nodiscard]] virtual Result<void> monitor_recover(DomId) {
    return std::unexpected(Error{Errc::NotSupported, "this hypervisor backend cannot take over a vm_event ring"});
  }
  // xendevicemodel_inject_event: re-inject an exception the library does not own.
  [[nodiscard]] virtual Result<void> inject_event(DomId, VcpuId, std::uint8_t vector, std::uint8_t type,
                                                  std::uint32_t error_code, std::uint8_t insn_len) = 0;
};

// Opens the hypervisor selected by XENPROBES_BACKEND (xen | sim; default xen). With "sim"
// the simulated Xen starts the demo guest (or XENPROBES_SIM_GUEST) as domain 1.
[[nodiscard]] XENPROBES_API Result<std::unique_ptr<Hypervisor>> open_hypervisor();
[[nodiscard]] XENPROBES_API Result<std::unique_ptr<Hypervisor>> open_hypervisor(const std::string& backend);

}  // namespace xenprobes::hv
