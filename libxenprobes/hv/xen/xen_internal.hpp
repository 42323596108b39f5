// Internal to hv/xen. The one header the backend's files share.
//
// File map (each Xen library header is included in exactly one place: one .cpp, or
// xc_shim_internal.hpp, which the four xc_shim*.cpp files share):
//   xc_shim_internal.hpp  xenctrl.h (+ __XEN_TOOLS__ domctl.h, hvm/save.h, vm_event.h,
//                         io/ring.h), xencall.h, xendevicemodel.h, xentoollog.h; shared by:
//     xc_shim.cpp            XcShim (all but its monitor calls); the quiet logger
//     xc_shim_translate.cpp  the pure Xen<->hv translations
//     xc_shim_ext_state.cpp  the vcpuextstate buffers
//     xc_shim_vm_event.cpp   the vm_event ring; XcShim's monitor calls
//   evtchn.cpp            xenevtchn.h
//   xenstore.cpp          xenstore.h
//   foreign_memory.cpp    xenforeignmemory.h
//   xen_hypervisor.cpp    no Xen header: hv::Hypervisor on top of the classes below.
//
// Xen's C types appear here only as forward-declared struct tags, so that this header pulls in
// no Xen header; tests/unit/hv_xen builds those structs from the public Xen headers by hand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "common/types.hpp"
#include "hv/hypervisor.hpp"

struct xentoollog_logger;
struct xc_interface_core;  // xc_interface
struct xenevtchn_handle;
struct xenforeignmemory_handle;
struct xs_handle;
struct vcpu_guest_context_x86_64;  // xen/foreign/x86_64.h: the 64-bit PV vCPU context
struct hvm_hw_cpu;                 // xen/arch-x86/hvm/save.h: HVM_SAVE_TYPE(CPU)
struct vm_event_st;                // xen/vm_event.h: vm_event_request_t / vm_event_response_t
struct xen_domctl_getdomaininfo;   // xen/domctl.h: xc_domaininfo_t
struct xen_domctl_vcpuextstate;    // xen/domctl.h: XEN_DOMCTL_{get,set}vcpuextstate

namespace xenprobes::hv::xen {

// A xentoollog logger that forwards libxc/libxencall/... messages to XP_LOG at debug level
// (passing NULL would make each library create a stderr logger). Static: outlives every handle.
xentoollog_logger* quiet_logger();

// ---------------------------------------------------------------------------------------------
// Pure translations between Xen's structs and hv types (defined in xc_shim_translate.cpp).

// EFER reported for 64-bit PV guests, which run in long mode by definition: Xen has no PV EFER
// to report (the guest cannot change it), so LMA|LME|SCE is synthesised. NXE is not claimed.
inline constexpr std::uint64_t kPvEfer = 0x400 /*LMA*/ | 0x100 /*LME*/ | 0x1 /*SCE*/;

// PV ctrlreg[3] holds the L4 MFN encoded with xen_pfn_to_cr3 (x86_64: pfn << 12). These turn
// it into / from a machine address (so that cr3 >> 12 is the MFN, as hv::VcpuRegs documents).
std::uint64_t pv_cr3_to_maddr(std::uint64_t ctrlreg3);
std::uint64_t maddr_to_pv_cr3(std::uint64_t maddr);

// 64-bit PV: the x64 view of xc_vcpu_getcontext. gs_base is the *active* GS base: the kernel
// one in guest kernel mode (VGCF_in_kernel), the user one otherwise.
VcpuRegs regs_from_pv(const vcpu_guest_context_x86_64& c);
// Writes GPRs, rip, rflags, debugreg[6], debugreg[7]; everything else (CR3, GDT, LDT, flags,
// FPU image) is left as read, which XEN_DOMCTL_setvcpucontext requires (arch_set_info_guest,
// xen/arch/x86/domain.c: EOPNOTSUPP when an initialised PV vCPU's CR3, GDT or LDT differ).
void regs_to_pv(const VcpuRegs& r, vcpu_guest_context_x86_64& c);

// HVM/PVH: HVM_SAVE_TYPE(CPU). kernel_mode = (SS.DPL == 0), SS.DPL being the CPL on VMX and SVM.
VcpuRegs regs_from_hvm(const hvm_hw_cpu& c);
// Writes GPRs, rip, rflags, dr6, dr7 only.
void regs_to_hvm(const VcpuRegs& r, hvm_hw_cpu& c);

// In a full HVM context blob (xc_domain_hvm_getcontext: descriptor + payload records, HEADER
// first, END last), rewrites the CPU record of `vcpu` with regs_to_hvm. Bounds-checked:
// a malformed blob is Io; no CPU record for that vCPU (offline) is InvalidArgument.
[[nodiscard]] Result<void> hvm_context_set_cpu_regs(std::span<std::uint8_t> blob, unsigned vcpu, const VcpuRegs& r);

// Domain info without name (xenstore) and guest_width (a separate domctl for PV).
DomainInfo domain_info_from_xen(const xen_domctl_getdomaininfo& d);

// vm_event request -> hv. The request is treated as hostile: a version other than
// VM_EVENT_INTERFACE_VERSION or an impossible instruction length is Io. A reason hv does not
// model is NotSupported (the ring answers those itself). Flags are translated bit by bit
// (hv's kVmEventFlag* values are not Xen's VM_EVENT_FLAG_* values); Xen-only flags are dropped.
[[nodiscard]] Result<VmEventRequest> vm_event_request_from_xen(const vm_event_st& req);
// hv -> vm_event response. Unknown hv flags, or SET_REGISTERS together with SET_EMUL_INSN_DATA
// (data.regs and data.emul are a union in Xen), are InvalidArgument.
[[nodiscard]] Result<void> vm_event_response_to_xen(const VmEventResponse& rsp, vm_event_st& out);

// ---------------------------------------------------------------------------------------------
// XEN_DOMCTL_{get,set}vcpuextstate (xc_shim_ext_state.cpp), with which set_pv_regs keeps the
// XSAVE state that XEN_DOMCTL_setvcpucontext would reset (vcpu_setup_fpu). Pure, so that tests
// can play Xen's part with hand-built buffers. Xen 4.17.7 refs: xen/arch/x86/domctl.c:913-1075
// (the domctl), xen/arch/x86/xstate.c:583-609 (valid_xcr0), :689-711 (validate_xstate).
//
//   buffer:  [u64 xcr0][u64 xcr0_accum][XSAVE image, standard (uncompressed) format:
//             512-byte legacy FXSAVE region | 64-byte header (xstate_bv, xcomp_bv, reserved[6])
//             | extended components]          (the image is absent when xcr0_accum == 0)
//   size   = 16 + (CPUID 0xD size of xcr0_accum)  ("PV_XSAVE_SIZE(xcr0_accum)", domctl.c:921)

inline constexpr std::size_t kExtStateHeaderSize = 16;      // xcr0, xcr0_accum
inline constexpr std::size_t kXsaveAreaMinSize = 512 + 64;  // legacy region + XSAVE header
// Sanity bound on what Xen may ask us to allocate (4.17's largest, AVX-512 + PKRU, is 2.7 KiB).
inline constexpr std::size_t kExtStateMaxSize = std::size_t{64} * 1024;

// What the size query reveals about the host: its XSAVE feature mask and the largest buffer a
// get may fill. xfeature_mask == 0: the host has no XSAVE, so the vCPU's FPU state is just the
// FXSAVE image that setvcpucontext echoes, and nothing needs saving.
struct ExtStateHost {
  std::uint64_t xfeature_mask = 0;
  std::size_t max_size = kExtStateHeaderSize;
  bool has_xsave() const { return xfeature_mask != 0; }
};

// A validated getvcpuextstate answer.
struct ExtStateImage {
  std::uint64_t xcr0 = 0;
  std::uint64_t xcr0_accum = 0;
  std::uint64_t xstate_bv = 0;             // from the XSAVE header (0 without image)
  std::size_t size = kExtStateHeaderSize;  // bytes written; exactly what set must be given
  // size 16 (xcr0_accum 0): Xen has no XSAVE image for the vCPU and set would restore nothing.
  bool needs_restore() const { return size > kExtStateHeaderSize; }
};

// The size query: vcpu, xfeature_mask 0, size 0, null buffer (domctl.c:938-949).
void ext_state_prepare_query(xen_domctl_vcpuextstate& e, unsigned vcpu);
// Validates the query's answer (hostile input: Io on nonsense).
[[nodiscard]] Result<ExtStateHost> ext_state_host_from_query(const xen_domctl_vcpuextstate& e);
// The data get: vcpu, the host's xfeature_mask (it must match, domctl.c:955) and the full
// max_size. The buffer handle is the caller's (a hypercall buffer of max_size bytes).
void ext_state_prepare_get(xen_domctl_vcpuextstate& e, unsigned vcpu, const ExtStateHost& h);
// Validates the answer of a data get against what setvcpuextstate will accept (so that a bad
// answer is refused before setcontext destroys anything): `buf` is the whole buffer handed to
// Xen. Io on anything Xen would not have produced or would not take back.
[[nodiscard]] Result<ExtStateImage> ext_state_parse(const xen_domctl_vcpuextstate& answered, unsigned vcpu,
                                                    const ExtStateHost& h, std::span<const std::uint8_t> buf);
// The write-back: vcpu and the size of the image; xfeature_mask is ignored by SET (domctl.h)
// and zeroed. The buffer handle is the caller's (the one the get filled).
void ext_state_prepare_set(xen_domctl_vcpuextstate& e, unsigned vcpu, const ExtStateImage& img);

// ---------------------------------------------------------------------------------------------
// The consumer ("back") side of a vm_event ring page (xc_shim_vm_event.cpp), without its event
// channel, so that it works on any 4 KiB page (tests play Xen's part on a plain page). Not
// thread-safe: the owning VmEventRing serialises.
class VmEventBackRing {
 public:
  // Initialises the shared ring in `page` (SHARED_RING_INIT), as the consumer must.
  VmEventBackRing(void* page, DomId dom);
  ~VmEventBackRing();
  VmEventBackRing(const VmEventBackRing&) = delete;
  VmEventBackRing& operator=(const VmEventBackRing&) = delete;

  unsigned size() const;  // slots in the ring (8 for vm_event on 4 KiB)

  // The next request, or nullopt. Treats the ring as hostile: a producer index beyond the ring
  // or a bad request (vm_event_request_from_xen) is Io, and the bad slot is consumed. Requests
  // with a reason hv does not model are answered here (vCPU resumed unchanged) and skipped;
  // `answered` is then set and the caller must notify Xen.
  [[nodiscard]] Result<std::optional<VmEventRequest>> take_request(bool& answered);
  // One response per request taken; more is NoSpace. Pushes the producer index (no notify).
  [[nodiscard]] Result<void> push_response(const VmEventResponse& rsp);

 private:
  [[nodiscard]] Result<void> push_xen_response(const vm_event_st* rsp);
  struct Impl;  // holds vm_event_back_ring_t, whose type lives in the Xen headers
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// libxenevtchn (evtchn.cpp). One handle; thread-safe.
class Evtchn {
 public:
  [[nodiscard]] static Result<std::unique_ptr<Evtchn>> open();
  ~Evtchn();
  Evtchn(const Evtchn&) = delete;
  Evtchn& operator=(const Evtchn&) = delete;

  [[nodiscard]] Result<EvtchnPort> bind_virq(unsigned virq);
  [[nodiscard]] Result<EvtchnPort> bind_interdomain(DomId dom, std::uint32_t remote_port);
  [[nodiscard]] Result<void> unbind(EvtchnPort port);
  [[nodiscard]] Result<void> notify(EvtchnPort port);
  int fd() const;
  // Non-blocking: polls the fd with a zero timeout and calls xenevtchn_pending only when it is
  // readable (xenevtchn_pending itself would block).
  [[nodiscard]] Result<std::optional<EvtchnPort>> pending();
  [[nodiscard]] Result<void> unmask(EvtchnPort port);

 private:
  explicit Evtchn(xenevtchn_handle* h) : h_(h) {}
  xenevtchn_handle* h_;
  std::mutex pending_mu_;  // poll + pending must not interleave between threads
};

// ---------------------------------------------------------------------------------------------
// libxenstore (xenstore.cpp). Thread-safe.
class XsClient {
 public:
  [[nodiscard]] static Result<std::unique_ptr<XsClient>> open();
  ~XsClient();
  XsClient(const XsClient&) = delete;
  XsClient& operator=(const XsClient&) = delete;

  [[nodiscard]] Result<std::string> read(const std::string& path);
  [[nodiscard]] Result<void> write(const std::string& path, const std::string& value);
  [[nodiscard]] Result<void> rm(const std::string& path);
  [[nodiscard]] Result<std::vector<std::string>> directory(const std::string& path);
  [[nodiscard]] Result<void> grant_read(const std::string& path, DomId reader);
  [[nodiscard]] Result<void> watch(const std::string& path, const std::string& token);
  [[nodiscard]] Result<void> unwatch(const std::string& path, const std::string& token);
  int fd();
  [[nodiscard]] Result<std::vector<WatchEvent>> read_watches();

 private:
  explicit XsClient(xs_handle* h) : h_(h) {}
  xs_handle* h_;
  std::mutex watch_mu_;
};

// ---------------------------------------------------------------------------------------------
// libxenforeignmemory (foreign_memory.cpp). Always held by shared_ptr: every ForeignMapping's
// deleter keeps one, so the handle outlives the mappings even if the Hypervisor goes first.
class ForeignMemory : public std::enable_shared_from_this<ForeignMemory> {
 public:
  [[nodiscard]] static Result<std::shared_ptr<ForeignMemory>> open();
  ~ForeignMemory();
  ForeignMemory(const ForeignMemory&) = delete;
  ForeignMemory& operator=(const ForeignMemory&) = delete;

  // Per-page errors are checked: any failing frame unmaps everything and is a Fault naming the
  // first failing frame.
  [[nodiscard]] Result<ForeignMapping> map(DomId dom, std::span<const Frame> frames, MapAccess access);

 private:
  explicit ForeignMemory(xenforeignmemory_handle* h) : h_(h) {}
  xenforeignmemory_handle* h_;
};

// ---------------------------------------------------------------------------------------------
// libxenctrl, libxencall (raw domctls), libxendevicemodel (xc_shim.cpp; the monitor_* calls in
// xc_shim_vm_event.cpp). Thread-safe as libxenctrl is (opened without
// XC_OPENFLAG_NON_REENTRANT).
class XcShim {
 public:
  // Assumes the caller checked that privcmd exists (xc_interface_open would log otherwise).
  [[nodiscard]] static Result<std::unique_ptr<XcShim>> open();
  ~XcShim();
  XcShim(const XcShim&) = delete;
  XcShim& operator=(const XcShim&) = delete;

  // A harmless domctl (getdomaininfo of domain 0): fails if the hypervisor speaks another
  // domctl ABI (NotSupported) or refuses us (Permission).
  [[nodiscard]] Result<void> sanity_check();

  [[nodiscard]] Result<std::string> version();
  // Probes XEN_DOMCTL_gdbsx_unpausevcpu(vcpu = ~0u) on domain 0: ENOSYS means no CONFIG_GDBSX.
  [[nodiscard]] Result<bool> has_gdbsx();

  [[nodiscard]] Result<DomainInfo> domain_info(DomId dom);       // without name
  [[nodiscard]] Result<std::vector<DomainInfo>> list_domains();  // without names
  [[nodiscard]] Result<void> pause(DomId dom);
  [[nodiscard]] Result<void> unpause(DomId dom);

  [[nodiscard]] Result<VcpuRegs> get_pv_regs(DomId dom, VcpuId vcpu);
  // 64-bit PV. Pauses the domain around getcontext, getvcpuextstate, setcontext,
  // setvcpuextstate, so the XSAVE state setcontext resets is put back as it was (see
  // xc_shim.cpp). 6 hypercalls (+1 size query on the first call of this XcShim).
  [[nodiscard]] Result<void> set_pv_regs(DomId dom, VcpuId vcpu, const VcpuRegs& r);
  [[nodiscard]] Result<VcpuRegs> get_hvm_regs(DomId dom, VcpuId vcpu);
  // Pauses the domain around a full-context get/patch/set (keeps the XSAVE record intact).
  [[nodiscard]] Result<void> set_hvm_regs(DomId dom, VcpuId vcpu, const VcpuRegs& r);

  [[nodiscard]] Result<void> set_debugging(DomId dom, bool on);
  [[nodiscard]] Result<GdbsxStatus> gdbsx_domstatus(DomId dom);

  [[nodiscard]] Result<std::unique_ptr<VmEventRing>> monitor_enable(DomId dom);
  [[nodiscard]] Result<void> monitor_disable(DomId dom);
  [[nodiscard]] Result<void> monitor_software_breakpoint(DomId dom, bool on);
  [[nodiscard]] Result<void> monitor_debug_exceptions(DomId dom, bool on, bool sync);
  [[nodiscard]] Result<void> monitor_recover(DomId dom, unsigned vcpus);
  [[nodiscard]] Result<void> inject_event(DomId dom, VcpuId vcpu, std::uint8_t vector, std::uint8_t type,
                                          std::uint32_t error_code, std::uint8_t insn_len);

 private:
  explicit XcShim(xc_interface_core* xch) : xch_(xch) {}
  xc_interface_core* xch_;
  [[nodiscard]] Result<ExtStateHost> ext_state_host(DomId dom, VcpuId vcpu);

  std::mutex hvm_set_mu_;  // two concurrent full-context get/patch/set would undo each other
  std::mutex pv_set_mu_;   // likewise for the PV context + extended-state get/set
  std::mutex ext_host_mu_;
  std::optional<ExtStateHost> ext_host_;  // the size query's answer: host-wide, constant
};

}  // namespace xenprobes::hv::xen
