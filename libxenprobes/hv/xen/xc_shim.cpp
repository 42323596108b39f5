// The ONLY file that includes xenctrl.h (and, through it, the __XEN_TOOLS__-only public headers
// domctl.h and vm_event.h). Everything that depends on the Xen 4.17 control ABI lives here:
// libxenctrl calls, raw domctls through libxencall, the vm_event ring, and the pure
// translations between Xen's structs and hv types.
//
// ABI pinning: XEN_DOMCTL_INTERFACE_VERSION and VM_EVENT_INTERFACE_VERSION (7) come from the
// installed headers; XcShim::sanity_check() refuses a hypervisor that rejects the former,
// and every ring request is checked against the latter. Two Xens are known: 4.17 (domctl
// 0x15, Debian 12) and 4.20 (domctl 0x17, Debian 13). The structs used here
// (xen_domctl_getdomaininfo, _vcpuextstate, _gdbsx_pauseunp_vcpu, vm_event_request/response)
// have the same layout in both; 4.20 only adds a member to the vm_event union (I/O
// instructions), which does not change its size. A libxenprobes must be built against the
// libxen-dev of the Xen it runs on: Xen answers EACCES to another domctl version.

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <string>

extern "C" {
#include <xenctrl.h>  // defines __XEN_TOOLS__ before the public headers, and xen_mb() & co.
#include <xencall.h>
#include <xendevicemodel.h>
#include <xentoollog.h>
#include <xen/hvm/save.h>
#include <xen/vm_event.h>
#include <xen/io/ring.h>
}

#include "common/hex.hpp"
#include "common/log.hpp"
#include "hv/xen/xen_internal.hpp"

namespace xenprobes::hv::xen {
namespace {

static_assert(sizeof(xen_pfn_t) == 8, "x86-64 Dom0 expected");
static_assert(VM_EVENT_INTERFACE_VERSION == 7, "built against a vm_event ABI other than 4.17's/4.20's");
static_assert(XEN_DOMCTL_INTERFACE_VERSION == 0x15 || XEN_DOMCTL_INTERFACE_VERSION == 0x17,
              "built against a domctl ABI other than Xen 4.17's (0x15) or 4.20's (0x17): check "
              "the structs this file uses, then add it here");
// The layouts the paragraph above relies on (equal in 4.17's and 4.20's headers).
static_assert(sizeof(vm_event_request_t) == 400 && sizeof(vm_event_response_t) == 400);
static_assert(sizeof(xen_domctl_getdomaininfo_t) == 112 && sizeof(xen_domctl_vcpuextstate) == 32);
// What the headers this library was built with belong to, for messages.
constexpr const char* kBuiltForXen = XEN_DOMCTL_INTERFACE_VERSION == 0x15 ? "4.17" : "4.20";

// ---- the quiet logger ----------------------------------------------------------------------

void quiet_vmessage(xentoollog_logger*, xentoollog_level level, int errnoval, const char* context,
                    const char* format, va_list al) {
  if (log::level() > log::Level::Debug) return;
  char buf[512];
  std::vsnprintf(buf, sizeof buf, format, al);
  XP_LOG(Debug, "%s (xtl level %d, errno %d): %s", context ? context : "libxen",
         static_cast<int>(level), errnoval, buf);
}

void quiet_progress(xentoollog_logger*, const char*, const char*, int, unsigned long,
                    unsigned long) {}

void quiet_destroy(xentoollog_logger*) {}  // static storage: nothing to free

xentoollog_logger g_quiet_logger = {quiet_vmessage, quiet_progress, quiet_destroy};

// ---- small helpers -------------------------------------------------------------------------

std::string on_dom(const char* call, DomId dom) {
  return std::string(call) + "(dom" + std::to_string(dom.value) + ")";
}

std::string on_vcpu(const char* call, DomId dom, VcpuId vcpu) {
  return std::string(call) + "(dom" + std::to_string(dom.value) + ", vcpu " +
         std::to_string(vcpu.value) + ")";
}


// Issues one domctl through libxencall. libxenctrl has no wrapper for the gdbsx domctls
// (xen-facts §5), so these go raw; `dc` is copied into a hypercall-safe buffer and back.
// Returns 0 or the errno of the failure.
int raw_domctl(xc_interface* xch, xen_domctl& dc) {
  xencall_handle* xcall = xc_interface_xcall_handle(xch);
  void* buf = xencall_alloc_buffer(xcall, sizeof dc);
  if (!buf) return errno ? errno : ENOMEM;
  dc.interface_version = XEN_DOMCTL_INTERFACE_VERSION;
  std::memcpy(buf, &dc, sizeof dc);
  int rc = xencall1(xcall, __HYPERVISOR_domctl, reinterpret_cast<std::uintptr_t>(buf));
  int e = rc < 0 ? errno : 0;
  std::memcpy(&dc, buf, sizeof dc);
  xencall_free_buffer(xcall, buf);
  return e;
}

// ---- vm_event flag and reason translation --------------------------------------------------
// hv's kVmEventFlag* / VmEventReason values are the library's own vocabulary; they are not
// guaranteed to equal Xen's (and several do not), so translate name by name.

struct FlagPair {
  std::uint32_t hv;
  std::uint32_t xen;
};
constexpr FlagPair kFlagMap[] = {
    {kVmEventFlagVcpuPaused, VM_EVENT_FLAG_VCPU_PAUSED},
    {kVmEventFlagToggleSinglestep, VM_EVENT_FLAG_TOGGLE_SINGLESTEP},
    {kVmEventFlagEmulate, VM_EVENT_FLAG_EMULATE},
    {kVmEventFlagSetEmulInsnData, VM_EVENT_FLAG_SET_EMUL_INSN_DATA},
    {kVmEventFlagSetRegisters, VM_EVENT_FLAG_SET_REGISTERS},
};

std::uint32_t flags_from_xen(std::uint32_t xen) {
  std::uint32_t hv = 0;
  for (auto [h, x] : kFlagMap)
    if (xen & x) hv |= h;
  return hv;  // Xen-only flags (FOREIGN, ALTERNATE_P2M, NESTED_P2M, ...) are dropped
}

Result<std::uint32_t> flags_to_xen(std::uint32_t hv) {
  std::uint32_t xen = 0, known = 0;
  for (auto [h, x] : kFlagMap) {
    known |= h;
    if (hv & h) xen |= x;
  }
  if (hv & ~known)
    return fail(Errc::InvalidArgument, "vm_event response: unknown flags " + hex(hv & ~known));
  return xen;
}

Result<std::uint32_t> reason_to_xen(VmEventReason r) {
  switch (r) {
    case VmEventReason::SoftwareBreakpoint: return VM_EVENT_REASON_SOFTWARE_BREAKPOINT;
    case VmEventReason::Singlestep: return VM_EVENT_REASON_SINGLESTEP;
    case VmEventReason::DebugException: return VM_EVENT_REASON_DEBUG_EXCEPTION;
  }
  return fail(Errc::InvalidArgument,
              "vm_event response: unknown reason " + std::to_string(static_cast<unsigned>(r)));
}

// The general registers, rip and rflags carry the same names in every Xen register record
// (vm_event_regs_x86, cpu_user_regs, hvm_hw_cpu): one copy for all of them.
template <typename X>
void gprs_from(const X& x, VcpuRegs& r) {
  r.rax = x.rax; r.rbx = x.rbx; r.rcx = x.rcx; r.rdx = x.rdx;
  r.rsi = x.rsi; r.rdi = x.rdi; r.rbp = x.rbp; r.rsp = x.rsp;
  r.r8 = x.r8; r.r9 = x.r9; r.r10 = x.r10; r.r11 = x.r11;
  r.r12 = x.r12; r.r13 = x.r13; r.r14 = x.r14; r.r15 = x.r15;
  r.rip = x.rip; r.rflags = x.rflags;
}

template <typename X>
void gprs_to(const VcpuRegs& r, X& x) {
  x.rax = r.rax; x.rbx = r.rbx; x.rcx = r.rcx; x.rdx = r.rdx;
  x.rsi = r.rsi; x.rdi = r.rdi; x.rbp = r.rbp; x.rsp = r.rsp;
  x.r8 = r.r8; x.r9 = r.r9; x.r10 = r.r10; x.r11 = r.r11;
  x.r12 = r.r12; x.r13 = r.r13; x.r14 = r.r14; x.r15 = r.r15;
  x.rip = r.rip; x.rflags = r.rflags;
}

// Segment attributes are Xen's packed 12-bit form (type:4 s:1 dpl:2 p:1 avl:1 l:1 db:1 g:1).
constexpr unsigned dpl_of_attr(std::uint32_t attr) { return (attr >> 5) & 3; }

VcpuRegs regs_from_vm_event(const vm_event_regs_x86& x) {
  VcpuRegs r;
  gprs_from(x, r);
  r.cr0 = x.cr0; r.cr2 = x.cr2; r.cr3 = x.cr3; r.cr4 = x.cr4; r.efer = x.msr_efer;
  r.dr6 = x.dr6; r.dr7 = x.dr7;
  r.fs_base = x.fs_base; r.gs_base = x.gs_base;
  r.cs = x.cs_sel; r.ss = x.ss_sel;
  r.kernel_mode = dpl_of_attr(x.ss.ar) == 0;
  return r;
}

// Only what VM_EVENT_FLAG_SET_REGISTERS applies (vm_event.h: GPRs, rflags, rip).
void regs_to_vm_event(const VcpuRegs& r, vm_event_regs_x86& x) {
  gprs_to(r, x);
}

// ---- the vm_event ring with its event channel -------------------------------------------

class XenVmEventRing final : public VmEventRing {
 public:
  XenVmEventRing(void* page, DomId dom, std::unique_ptr<Evtchn> ev, EvtchnPort port)
      : ring_(page, dom), page_(page), ev_(std::move(ev)), port_(port) {}

  // Unmaps the page and unbinds the port. Does not disable the monitor: that is
  // Hypervisor::monitor_disable, which the owner calls.
  ~XenVmEventRing() override {
    munmap(page_, XC_PAGE_SIZE);
    (void)ev_->unbind(port_);
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

xentoollog_logger* quiet_logger() { return &g_quiet_logger; }

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
      return fail(Errc::Io, on_dom("vm_event ring", impl_->dom) + ": request producer index " +
                                std::to_string(prod) + " overruns the ring");
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
    if (r) return std::optional<VmEventRequest>{std::move(*r)};
    if (r.error().code != Errc::NotSupported) return std::unexpected(r.error());

    // A well-formed event of a kind libxenprobes never enables: resume the vCPU unchanged,
    // as xen-access does, and carry on with the next request.
    XP_LOG(Warn, "dom%u: %s; resuming vCPU %u unchanged", impl_->dom.value,
           r.error().what.c_str(), req.vcpu_id);
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
    return fail(Errc::NoSpace, on_dom("vm_event ring", impl_->dom) +
                                   ": no request is waiting for a response");
  std::memcpy(RING_GET_RESPONSE(&back, back.rsp_prod_pvt), rsp, sizeof *rsp);
  ++back.rsp_prod_pvt;
  RING_PUSH_RESPONSES(&back);
  return {};
}

// ---- pure translations ---------------------------------------------------------------------

std::uint64_t pv_cr3_to_maddr(std::uint64_t ctrlreg3) {
  return static_cast<std::uint64_t>(xen_cr3_to_pfn_x86_64(ctrlreg3)) << XC_PAGE_SHIFT;
}

std::uint64_t maddr_to_pv_cr3(std::uint64_t maddr) {
  return xen_pfn_to_cr3_x86_64(maddr >> XC_PAGE_SHIFT);
}

VcpuRegs regs_from_pv(const vcpu_guest_context_x86_64& c) {
  const auto& u = c.user_regs;
  VcpuRegs r;
  gprs_from(u, r);
  r.cr0 = c.ctrlreg[0];
  r.cr2 = c.ctrlreg[2];
  r.cr3 = pv_cr3_to_maddr(c.ctrlreg[3]);  // kernel L4; the user L4 is in ctrlreg[1]
  r.cr4 = c.ctrlreg[4];
  r.efer = kPvEfer;
  r.dr6 = c.debugreg[6];
  r.dr7 = c.debugreg[7];
  r.kernel_mode = (c.flags & VGCF_in_kernel_X86_64) != 0;
  r.fs_base = c.fs_base;
  r.gs_base = r.kernel_mode ? c.gs_base_kernel : c.gs_base_user;
  r.cs = u.cs;
  r.ss = u.ss;
  return r;
}

void regs_to_pv(const VcpuRegs& r, vcpu_guest_context_x86_64& c) {
  auto& u = c.user_regs;
  gprs_to(r, u);
  c.debugreg[6] = r.dr6;
  c.debugreg[7] = r.dr7;
}

VcpuRegs regs_from_hvm(const hvm_hw_cpu& c) {
  VcpuRegs r;
  gprs_from(c, r);
  r.cr0 = c.cr0; r.cr2 = c.cr2; r.cr3 = c.cr3; r.cr4 = c.cr4; r.efer = c.msr_efer;
  r.dr6 = c.dr6; r.dr7 = c.dr7;
  r.fs_base = c.fs_base; r.gs_base = c.gs_base;
  r.cs = static_cast<std::uint16_t>(c.cs_sel);
  r.ss = static_cast<std::uint16_t>(c.ss_sel);
  r.kernel_mode = dpl_of_attr(c.ss_arbytes) == 0;
  return r;
}

void regs_to_hvm(const VcpuRegs& r, hvm_hw_cpu& c) {
  gprs_to(r, c);
  c.dr6 = r.dr6; c.dr7 = r.dr7;
}

Result<void> hvm_context_set_cpu_regs(std::span<std::uint8_t> blob, unsigned vcpu,
                                      const VcpuRegs& r) {
  //  blob: [desc HEADER][hvm_save_header] [desc CPU/0][hvm_hw_cpu] [desc CPU/1][...] ...
  //        [desc CPU_XSAVE/0][...] ... [desc END]     (records packed, no padding)
  std::size_t off = 0;
  while (blob.size() - off >= sizeof(hvm_save_descriptor)) {
    hvm_save_descriptor d;
    std::memcpy(&d, blob.data() + off, sizeof d);
    off += sizeof d;
    if (d.length > blob.size() - off)
      return fail(Errc::Io, "HVM context: record type " + std::to_string(d.typecode) +
                                " overruns the " + std::to_string(blob.size()) + "-byte blob");
    if (d.typecode == HVM_SAVE_CODE(END)) break;
    if (d.typecode == HVM_SAVE_CODE(CPU) && d.instance == vcpu) {
      if (d.length != sizeof(hvm_hw_cpu))
        return fail(Errc::Io, "HVM context: CPU record of " + std::to_string(d.length) +
                                  " bytes, expected " + std::to_string(sizeof(hvm_hw_cpu)));
      hvm_hw_cpu cpu;
      std::memcpy(&cpu, blob.data() + off, sizeof cpu);
      regs_to_hvm(r, cpu);
      std::memcpy(blob.data() + off, &cpu, sizeof cpu);
      return {};
    }
    off += d.length;
  }
  return fail(Errc::InvalidArgument,
              "HVM context has no CPU record for vCPU " + std::to_string(vcpu) + " (offline?)");
}

// ---- XEN_DOMCTL_{get,set}vcpuextstate buffers (layout: xen_internal.hpp) ------------------

namespace {

// XCR0 bits (Intel SDM vol. 1 §13.1; Xen's asm/x86-defns.h:81-100, not in the public headers).
constexpr std::uint64_t kXcr0Fp = 1u << 0, kXcr0Sse = 1u << 1, kXcr0Ymm = 1u << 2;
constexpr std::uint64_t kXcr0BndRegs = 1u << 3, kXcr0BndCsr = 1u << 4;
constexpr std::uint64_t kXcr0Avx512 = (1u << 5) | (1u << 6) | (1u << 7);  // OPMASK ZMM HI_ZMM

// Xen's valid_xcr0() (xstate.c:583-609): validate_xstate() refuses a set whose xcr0 or
// xcr0_accum fails it.
bool valid_xcr0(std::uint64_t x) {
  if (!(x & kXcr0Fp)) return false;
  if ((x & kXcr0Ymm) && !(x & kXcr0Sse)) return false;
  if ((x & kXcr0Avx512) && (!(x & kXcr0Ymm) || (x & kXcr0Avx512) != kXcr0Avx512)) return false;
  if (!(x & kXcr0BndRegs) != !(x & kXcr0BndCsr)) return false;
  return true;
}

std::uint64_t load_u64(std::span<const std::uint8_t> b, std::size_t off) {
  std::uint64_t v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

}  // namespace

void ext_state_prepare_query(xen_domctl_vcpuextstate& e, unsigned vcpu) {
  e = xen_domctl_vcpuextstate{};
  e.vcpu = vcpu;
  e.xfeature_mask = 0;
  e.size = 0;
  set_xen_guest_handle_raw(e.buffer, static_cast<std::uint64_t*>(nullptr));
}

Result<ExtStateHost> ext_state_host_from_query(const xen_domctl_vcpuextstate& e) {
  const std::string what = "XEN_DOMCTL_getvcpuextstate size query: ";
  ExtStateHost h;
  h.xfeature_mask = e.xfeature_mask;
  if (e.xfeature_mask == 0) {
    // No XSAVE on the host: PV_XSAVE_SIZE(0) = 16 + xstate_ctxt_size(0) = 16 (xstate.c:577).
    if (e.size != kExtStateHeaderSize)
      return fail(Errc::Io, what + "no XSAVE features but a size of " + std::to_string(e.size));
    h.max_size = kExtStateHeaderSize;
    return h;
  }
  // xstate_init() insists on FP|SSE whenever XSAVE is used, and the mask must itself be a
  // valid XCR0 (the guest's xcr0_accum, a subset, is checked against it).
  if ((e.xfeature_mask & (kXcr0Fp | kXcr0Sse)) != (kXcr0Fp | kXcr0Sse) ||
      !valid_xcr0(e.xfeature_mask))
    return fail(Errc::Io, what + "implausible xfeature_mask " + hex(e.xfeature_mask));
  if (e.size < kExtStateHeaderSize + kXsaveAreaMinSize ||
      e.size > kExtStateHeaderSize + kExtStateMaxSize)
    return fail(Errc::Io, what + "implausible size " + std::to_string(e.size) + " for mask " +
                              hex(e.xfeature_mask));
  h.max_size = static_cast<std::size_t>(e.size);
  return h;
}

void ext_state_prepare_get(xen_domctl_vcpuextstate& e, unsigned vcpu, const ExtStateHost& h) {
  e = xen_domctl_vcpuextstate{};
  e.vcpu = vcpu;
  e.xfeature_mask = h.xfeature_mask;  // must equal Xen's, or EINVAL (domctl.c:955)
  e.size = h.max_size;                // must be >= PV_XSAVE_SIZE(xcr0_accum) (domctl.c:955)
}

Result<ExtStateImage> ext_state_parse(const xen_domctl_vcpuextstate& a, unsigned vcpu,
                                      const ExtStateHost& h, std::span<const std::uint8_t> buf) {
  const std::string what = "XEN_DOMCTL_getvcpuextstate(vcpu " + std::to_string(vcpu) + "): ";
  // The domctl is copied back whole (domctl.c:1072-1073): the inputs must come back unchanged.
  if (a.vcpu != vcpu || a.xfeature_mask != h.xfeature_mask)
    return fail(Errc::Io, what + "vcpu/xfeature_mask changed in the answer");
  if (buf.size() < h.max_size)
    return fail(Errc::InvalidArgument, what + "buffer smaller than the size query's answer");
  if (a.size < kExtStateHeaderSize || a.size > h.max_size)
    return fail(Errc::Io, what + "answered size " + std::to_string(a.size) + " outside [16, " +
                              std::to_string(h.max_size) + "]");
  ExtStateImage img;
  img.size = static_cast<std::size_t>(a.size);
  img.xcr0 = load_u64(buf, 0);
  img.xcr0_accum = load_u64(buf, 8);

  if (img.xcr0_accum == 0) {
    // No XSAVE image (xstate_alloc_save_area leaves xcr0 = xcr0_accum = 0 until the guest's
    // first XSETBV, xstate.c:545-546): size is PV_XSAVE_SIZE(0) = 16, and set accepts that
    // only with xcr0 == 0 too (domctl.c:1027-1035).
    if (img.xcr0 != 0 || img.size != kExtStateHeaderSize)
      return fail(Errc::Io, what + "xcr0_accum 0 with xcr0 " + hex(img.xcr0) + " and size " +
                                std::to_string(img.size));
    return img;
  }
  // What validate_xstate() (xstate.c:689-711) and the size checks of the set (domctl.c:
  // 1041-1048) will demand when the image is handed back.
  if (img.size < kExtStateHeaderSize + kXsaveAreaMinSize)
    return fail(Errc::Io, what + "size " + std::to_string(img.size) +
                              " too small for an XSAVE image");
  if (img.xcr0_accum & ~h.xfeature_mask)
    return fail(Errc::Io, what + "xcr0_accum " + hex(img.xcr0_accum) +
                              " beyond the host's mask " + hex(h.xfeature_mask));
  if (!valid_xcr0(img.xcr0_accum) || !valid_xcr0(img.xcr0) || (img.xcr0 & ~img.xcr0_accum))
    return fail(Errc::Io, what + "invalid xcr0 " + hex(img.xcr0) + " / xcr0_accum " +
                              hex(img.xcr0_accum));
  // Only when xcr0_accum is the host's full mask is the exact size known here (the query's);
  // otherwise it is CPUID 0xD's for that subset, which Xen re-checks on set.
  if (img.xcr0_accum == h.xfeature_mask && img.size != h.max_size)
    return fail(Errc::Io, what + "size " + std::to_string(img.size) + " for the full mask, "
                              "expected " + std::to_string(h.max_size));
  const std::size_t hdr = kExtStateHeaderSize + 512;  // XSAVE header inside the buffer
  img.xstate_bv = load_u64(buf, hdr);
  const std::uint64_t xcomp_bv = load_u64(buf, hdr + 8);
  if (img.xstate_bv & ~img.xcr0_accum)
    return fail(Errc::Io, what + "xstate_bv " + hex(img.xstate_bv) + " beyond xcr0_accum " +
                              hex(img.xcr0_accum));
  if (xcomp_bv != 0)  // the toolstack ABI is strictly uncompressed (xstate.c:231-240)
    return fail(Errc::Io, what + "compacted image (xcomp_bv " + hex(xcomp_bv) + ")");
  for (std::size_t i = 0; i < 6; ++i)
    if (load_u64(buf, hdr + 16 + 8 * i) != 0)
      return fail(Errc::Io, what + "reserved XSAVE header word " + std::to_string(i) +
                                " is not zero");
  return img;
}

void ext_state_prepare_set(xen_domctl_vcpuextstate& e, unsigned vcpu, const ExtStateImage& img) {
  e = xen_domctl_vcpuextstate{};
  e.vcpu = vcpu;
  e.xfeature_mask = 0;  // "SET: Ignored." (domctl.h)
  e.size = img.size;    // must be PV_XSAVE_SIZE(xcr0_accum) exactly (domctl.c:1047)
}

DomainInfo domain_info_from_xen(const xen_domctl_getdomaininfo& x) {
  DomainInfo d;
  d.domid = DomId{x.domain};
  static_assert(sizeof x.handle == std::tuple_size_v<DomainHandle>);
  std::memcpy(d.handle.data(), x.handle, d.handle.size());
  d.type = (x.flags & XEN_DOMINF_hvm_guest) ? GuestType::Hvm : GuestType::Pv;
  d.guest_width = 8;  // PV: replaced by xc_domain_get_guest_width; HVM: per-vCPU mode (EFER.LMA)
  d.vcpus = x.max_vcpu_id == XEN_INVALID_MAX_VCPU_ID ? 0 : x.max_vcpu_id + 1;
  d.online_vcpus = x.nr_online_vcpus;
  d.paused = x.flags & XEN_DOMINF_paused;
  d.dying = x.flags & XEN_DOMINF_dying;
  d.shutdown = x.flags & XEN_DOMINF_shutdown;
  d.crashed = d.shutdown &&
              ((x.flags >> XEN_DOMINF_shutdownshift) & XEN_DOMINF_shutdownmask) == SHUTDOWN_crash;
  d.debugged = x.flags & XEN_DOMINF_debugged;
  return d;
}

Result<VmEventRequest> vm_event_request_from_xen(const vm_event_st& req) {
  if (req.version != VM_EVENT_INTERFACE_VERSION)
    return fail(Errc::Io, "vm_event request of version " + std::to_string(req.version) +
                              ", expected " + std::to_string(VM_EVENT_INTERFACE_VERSION));
  VmEventRequest o;
  o.vcpu = req.vcpu_id;
  o.flags = flags_from_xen(req.flags);
  const vm_event_debug* dbg = nullptr;
  switch (req.reason) {
    case VM_EVENT_REASON_SOFTWARE_BREAKPOINT:
      o.reason = VmEventReason::SoftwareBreakpoint;
      dbg = &req.u.software_breakpoint;
      break;
    case VM_EVENT_REASON_DEBUG_EXCEPTION:
      o.reason = VmEventReason::DebugException;
      dbg = &req.u.debug_exception;
      break;
    case VM_EVENT_REASON_SINGLESTEP:
      o.reason = VmEventReason::Singlestep;
      o.gfn = req.u.singlestep.gfn;
      break;
    default:
      return fail(Errc::NotSupported, "vm_event reason " + std::to_string(req.reason) +
                                          " is not one libxenprobes uses");
  }
  if (dbg) {
    if (dbg->insn_length > 15)  // the longest x86 instruction
      return fail(Errc::Io, "vm_event request: instruction length " +
                                std::to_string(dbg->insn_length));
    o.gfn = dbg->gfn;
    o.type = dbg->type;
    o.insn_length = static_cast<std::uint8_t>(dbg->insn_length);
    o.pending_dbg = static_cast<std::uint32_t>(dbg->pending_dbg);
  }
  o.regs = regs_from_vm_event(req.data.regs.x86);
  return o;
}

Result<void> vm_event_response_to_xen(const VmEventResponse& r, vm_event_st& out) {
  if ((r.flags & kVmEventFlagSetRegisters) && (r.flags & kVmEventFlagSetEmulInsnData))
    return fail(Errc::InvalidArgument,
                "vm_event response: SET_REGISTERS and SET_EMUL_INSN_DATA share one union in Xen");
  auto flags = XP_TRY(flags_to_xen(r.flags));
  auto reason = XP_TRY(reason_to_xen(r.reason));
  out = vm_event_st{};
  out.version = VM_EVENT_INTERFACE_VERSION;
  out.vcpu_id = r.vcpu;
  out.flags = flags;
  out.reason = reason;
  if (r.flags & kVmEventFlagSetRegisters) regs_to_vm_event(r.regs, out.data.regs.x86);
  if (r.flags & kVmEventFlagSetEmulInsnData) {
    static_assert(sizeof r.emul_insn == sizeof out.data.emul.insn.data);
    std::memcpy(out.data.emul.insn.data, r.emul_insn, sizeof r.emul_insn);
  }
  return {};
}

// ---- XcShim --------------------------------------------------------------------------------

Result<std::unique_ptr<XcShim>> XcShim::open() {
  xc_interface* xch = xc_interface_open(quiet_logger(), quiet_logger(), 0);
  if (!xch) {
    int e = errno;
    if (e == EACCES || e == EPERM)
      return fail(Errc::Permission, "xc_interface_open: permission denied: run as root in Dom0");
    return fail_errno(e, "xc_interface_open");
  }
  return std::unique_ptr<XcShim>(new XcShim(xch));
}

XcShim::~XcShim() { xc_interface_close(xch_); }

Result<void> XcShim::sanity_check() {
  xc_domaininfo_t info{};
  if (xc_domain_getinfolist(xch_, 0, 1, &info) >= 0) return {};
  int e = errno;
  if (e == EPERM)
    return fail(Errc::Permission,
                "xc_domain_getinfolist(dom0): domctl refused: not the control domain (a DomU?)");
  if (e == EACCES) {
    // do_domctl answers EACCES to a foreign XEN_DOMCTL_INTERFACE_VERSION (and XSM/FLASK denials).
    auto v = version();
    return fail(Errc::NotSupported,
                "the hypervisor (Xen " + (v ? *v : std::string("?")) +
                    ") refuses domctl interface " + hex(XEN_DOMCTL_INTERFACE_VERSION) +
                    ": this libxenprobes is built for Xen " + kBuiltForXen +
                    " (rebuild it against the libxen-dev of the running Xen), or an XSM policy "
                    "denies us");
  }
  return fail_errno(e, "xc_domain_getinfolist(dom0)");
}

Result<std::string> XcShim::version() {
  int v = xc_version(xch_, XENVER_version, nullptr);
  if (v < 0) return fail_errno(errno, "xc_version(XENVER_version)");
  xen_extraversion_t extra{};
  if (xc_version(xch_, XENVER_extraversion, &extra) < 0)
    return fail_errno(errno, "xc_version(XENVER_extraversion)");
  extra[sizeof extra - 1] = '\0';
  return std::to_string(v >> 16) + "." + std::to_string(v & 0xffff) + extra;
}

Result<bool> XcShim::has_gdbsx() {
  // xen-facts §2.2: without CONFIG_GDBSX the gdbsx domctls fall to `default: -ENOSYS`. With it,
  // vcpu ~0u on an unpaused domain (our own Dom0) answers EBUSY (or EINVAL) and changes nothing.
  xen_domctl dc{};
  dc.cmd = XEN_DOMCTL_gdbsx_unpausevcpu;
  dc.domain = 0;
  dc.u.gdbsx_pauseunp_vcpu.vcpu = ~0u;
  int e = raw_domctl(xch_, dc);
  if (e == ENOSYS) return false;
  if (e == 0 || e == EBUSY || e == EINVAL) return true;
  return fail_errno(e, "XEN_DOMCTL_gdbsx_unpausevcpu probe (dom0)");
}

namespace {
Result<unsigned> pv_guest_width(xc_interface* xch, DomId dom) {
  unsigned width = 0;
  int rc = xc_domain_get_guest_width(xch, dom.value, &width);
  if (rc < 0) return fail_errno(errno, on_dom("xc_domain_get_guest_width", dom));
  if (rc > 0 || (width != 4 && width != 8))  // rc 1: the domctl said EOPNOTSUPP (HVM)
    return fail(Errc::Io, on_dom("xc_domain_get_guest_width", dom) + ": no PV width");
  return width;
}
}  // namespace

Result<DomainInfo> XcShim::domain_info(DomId dom) {
  if (dom.value >= DOMID_FIRST_RESERVED)
    return fail(Errc::InvalidArgument, "domain id " + std::to_string(dom.value) + " is reserved");
  xc_domaininfo_t info{};
  int n = xc_domain_getinfolist(xch_, dom.value, 1, &info);
  if (n < 0) return fail_errno(errno, on_dom("xc_domain_getinfolist", dom));
  // The list starts at the first domain >= dom: check it is the one asked for.
  if (n == 0 || info.domain != dom.value)
    return fail(Errc::NoSuchDomain, "domain " + std::to_string(dom.value) + " does not exist");
  DomainInfo d = domain_info_from_xen(info);
  if (d.type == GuestType::Pv) d.guest_width = XP_TRY(pv_guest_width(xch_, dom));
  return d;
}

Result<std::vector<DomainInfo>> XcShim::list_domains() {
  std::vector<DomainInfo> out;
  std::vector<xc_domaininfo_t> batch(64);
  std::uint32_t first = 0;
  for (;;) {
    int n = xc_domain_getinfolist(xch_, first, batch.size(), batch.data());
    if (n < 0) return fail_errno(errno, "xc_domain_getinfolist");
    for (int i = 0; i < n; ++i) {
      DomainInfo d = domain_info_from_xen(batch[i]);
      if (d.type == GuestType::Pv) {
        auto w = pv_guest_width(xch_, d.domid);
        if (!w && w.error().code == Errc::NoSuchDomain) continue;  // gone meanwhile
        if (!w) return std::unexpected(w.error());
        d.guest_width = *w;
      }
      out.push_back(std::move(d));
    }
    if (n < static_cast<int>(batch.size())) break;
    first = batch[n - 1].domain + 1u;
  }
  return out;
}

Result<void> XcShim::pause(DomId dom) {
  if (xc_domain_pause(xch_, dom.value) < 0)
    return fail_errno(errno, on_dom("xc_domain_pause", dom));
  return {};
}

Result<void> XcShim::unpause(DomId dom) {
  if (xc_domain_unpause(xch_, dom.value) < 0) {
    int e = errno;
    if (e == EINVAL)  // xen-facts §5: unpausing below a zero count
      return fail(Errc::InvalidArgument,
                  on_dom("xc_domain_unpause", dom) + ": the pause count is already zero");
    return fail_errno(e, on_dom("xc_domain_unpause", dom));
  }
  return {};
}

Result<VcpuRegs> XcShim::get_pv_regs(DomId dom, VcpuId vcpu) {
  vcpu_guest_context_any_t ctx{};
  if (xc_vcpu_getcontext(xch_, dom.value, vcpu.value, &ctx) < 0)
    return fail_errno(errno, on_vcpu("xc_vcpu_getcontext", dom, vcpu));
  return regs_from_pv(ctx.x64);
}

// The size query, once per XcShim: its answer (the host's xfeature_mask and
// PV_XSAVE_SIZE(xfeature_mask)) is host-wide and fixed at boot (xstate.c: xfeature_mask is
// __read_mostly, set by xstate_init). The vCPU named must merely exist (domctl.c:923-930).
Result<ExtStateHost> XcShim::ext_state_host(DomId dom, VcpuId vcpu) {
  std::lock_guard lk(ext_host_mu_);
  if (ext_host_) return *ext_host_;
  xen_domctl dc{};
  dc.cmd = XEN_DOMCTL_getvcpuextstate;
  dc.domain = static_cast<domid_t>(dom.value);
  ext_state_prepare_query(dc.u.vcpuextstate, vcpu.value);
  if (int e = raw_domctl(xch_, dc))
    return fail_errno(e, on_vcpu("XEN_DOMCTL_getvcpuextstate(size query)", dom, vcpu));
  ext_host_ = XP_TRY(ext_state_host_from_query(dc.u.vcpuextstate));
  return *ext_host_;
}

// 64-bit PV register write that keeps the extended FPU state (xen-facts §3.3).
//
// Why: XEN_DOMCTL_setvcpucontext -> arch_set_info_guest -> vcpu_setup_fpu (xen/arch/x86/
// domain.c:1125-1127, RELEASE-4.17.7) copies only the 512-byte FXSAVE image and sets
// xstate_bv = XSTATE_FP_SSE (xen/arch/x86/i387.c:353-358), so every other XSAVE component
// (AVX, AVX-512, MPX, PKRU) of the vCPU returns to its init state. VGCF_I387_VALID, which
// getcontext reports whenever fpu_initialised (domctl.c:1435-1436) and we echo, only saves
// x87/SSE.
//
// How: XEN_DOMCTL_setvcpuextstate is usable for this in 4.17 (xen/arch/x86/domctl.c:
// 913-1075): it refuses only v == current (:929, never true for a Dom0 caller and another
// domain), needs no paused domain (it vcpu_pause()s itself, :1051-1062), and takes back
// exactly what getvcpuextstate produced: xcr0/xcr0_accum/header are re-validated by
// validate_xstate (:1027-1031, xstate.c:689-711) and the size must be PV_XSAVE_SIZE
// (xcr0_accum) (:1047). It restores xcr0, xcr0_accum and the whole image, the FXSAVE region
// included (compress_xsave_states, xstate.c:241-258), overwriting what setcontext reset.
// ext_state_parse() checks the answer against those rules *before* setcontext, so a refused
// or hostile answer leaves the vCPU untouched.
//
// The domain is paused (reference counted, harmless if the caller holds a pause) across the
// sequence: otherwise the vCPU could run between the get and the set (its new state then lost
// when the stale image is written back) and between setcontext and the write-back (running
// with AVX state wiped). It also keeps the CR3/GDT/LDT echo exact (xen-facts §3.3).
//
// Cost: pause, getcontext, getvcpuextstate, setcontext, setvcpuextstate, unpause = 6
// hypercalls (was 2), +1 size query on this XcShim's first call. Fewer when there is nothing to
// keep: 5 if the vCPU has no XSAVE image yet (xcr0_accum 0), 4 on a host without XSAVE (the
// FXSAVE image echoed through setcontext is then the whole FPU state).
//
// Preserved: xcr0, xcr0_accum and the whole XSAVE image, xstate_bv included. Residual gaps:
// (1) a vCPU that never executed XSETBV (xcr0_accum 0) has no image to save; it keeps x87/SSE
// through the echoed FXSAVE image, but setcontext marks them in use (xstate_bv = FP|SSE) even
// if they were in their init state. (2) If setvcpuextstate fails after setcontext succeeded
// (only ENOMEM/EFAULT remain plausible once the image passed ext_state_parse), the registers
// are written but the extended state is reset: reported as Io, not retried.
Result<void> XcShim::set_pv_regs(DomId dom, VcpuId vcpu, const VcpuRegs& r) {
  std::lock_guard lk(pv_set_mu_);
  const ExtStateHost host = XP_TRY(ext_state_host(dom, vcpu));

  // Hypercall-safe buffer for the image, shared by the get and the set.
  xencall_handle* xcall = xc_interface_xcall_handle(xch_);
  void* ext_buf = nullptr;
  if (host.has_xsave()) {
    ext_buf = xencall_alloc_buffer(xcall, host.max_size);
    if (!ext_buf) return fail_errno(errno ? errno : ENOMEM, "xencall_alloc_buffer");
  }
  struct BufFree {
    xencall_handle* x;
    void* b;
    ~BufFree() {
      if (b) xencall_free_buffer(x, b);
    }
  } ext_buf_free{xcall, ext_buf};

  XP_TRY(pause(dom));
  auto done = [&]() -> Result<void> {
    // Get -> modify -> set: an initialised PV vCPU must echo its current CR3 (ctrlreg[3] and
    // [1]), GDT frames and LDT, or Xen answers EOPNOTSUPP (xen-facts §3.3). Debug registers
    // are reloaded from the struct (clear DR6.BS here after a step).
    vcpu_guest_context_any_t ctx{};
    if (xc_vcpu_getcontext(xch_, dom.value, vcpu.value, &ctx) < 0)
      return fail_errno(errno, on_vcpu("xc_vcpu_getcontext", dom, vcpu));

    std::optional<ExtStateImage> img;
    xen_domctl dc{};
    if (host.has_xsave()) {
      std::memset(ext_buf, 0, host.max_size);
      dc.cmd = XEN_DOMCTL_getvcpuextstate;
      dc.domain = static_cast<domid_t>(dom.value);
      ext_state_prepare_get(dc.u.vcpuextstate, vcpu.value, host);
      set_xen_guest_handle_raw(dc.u.vcpuextstate.buffer, static_cast<std::uint64_t*>(ext_buf));
      if (int e = raw_domctl(xch_, dc))
        return fail_errno(e, on_vcpu("XEN_DOMCTL_getvcpuextstate", dom, vcpu) +
                                 ": registers not written");
      img = XP_TRY(ext_state_parse(
          dc.u.vcpuextstate, vcpu.value, host,
          std::span<const std::uint8_t>(static_cast<const std::uint8_t*>(ext_buf),
                                        host.max_size)));
    }

    regs_to_pv(r, ctx.x64);
    if (xc_vcpu_setcontext(xch_, dom.value, vcpu.value, &ctx) < 0) {
      int e = errno;
      if (e == EOPNOTSUPP)
        return fail(Errc::Again, on_vcpu("xc_vcpu_setcontext", dom, vcpu) +
                                     ": CR3/GDT/LDT changed since read");
      return fail_errno(e, on_vcpu("xc_vcpu_setcontext", dom, vcpu));
    }

    if (img && img->needs_restore()) {
      dc = xen_domctl{};
      dc.cmd = XEN_DOMCTL_setvcpuextstate;
      dc.domain = static_cast<domid_t>(dom.value);
      ext_state_prepare_set(dc.u.vcpuextstate, vcpu.value, *img);
      set_xen_guest_handle_raw(dc.u.vcpuextstate.buffer, static_cast<std::uint64_t*>(ext_buf));
      if (int e = raw_domctl(xch_, dc))
        return fail(Errc::Io, on_vcpu("XEN_DOMCTL_setvcpuextstate", dom, vcpu) + ": " +
                                  std::strerror(e) +
                                  ": registers written, but the extended FPU state "
                                  "(xcr0_accum " + hex(img->xcr0_accum) + ") was reset");
    }
    return {};
  }();
  auto resumed = unpause(dom);
  if (!done) return done;
  return resumed;
}

Result<VcpuRegs> XcShim::get_hvm_regs(DomId dom, VcpuId vcpu) {
  if (vcpu.value > 0xffff)  // the save-record instance is 16 bits
    return fail(Errc::InvalidArgument, on_vcpu("xc_domain_hvm_getcontext_partial", dom, vcpu) +
                                           ": no such vCPU");
  hvm_hw_cpu cpu{};
  if (xc_domain_hvm_getcontext_partial(xch_, dom.value, HVM_SAVE_CODE(CPU),
                                       static_cast<std::uint16_t>(vcpu.value), &cpu,
                                       sizeof cpu) < 0)
    return fail_errno(errno, on_vcpu("xc_domain_hvm_getcontext_partial(CPU)", dom, vcpu));
  return regs_from_hvm(cpu);
}

// Xen has no "set one vCPU's registers" for HVM except loading HVM save records, and loading a
// CPU record alone resets that vCPU's extended state (hvm_load_cpu_ctxt keeps only FP/SSE).
// So: pause, fetch the whole context, patch only this vCPU's CPU record, load the whole context
// back; its CPU_XSAVE records are loaded after the CPU records and restore the full XSAVE
// state. The pause (reference counted, so harmless if the caller holds one) keeps the snapshot
// exact: nothing in the domain runs between get and set. Expensive (a few hypercalls and a
// context of tens of KiB): on the hot path use vm_event's SET_REGISTERS instead.
Result<void> XcShim::set_hvm_regs(DomId dom, VcpuId vcpu, const VcpuRegs& r) {
  std::lock_guard lk(hvm_set_mu_);
  XP_TRY(pause(dom));
  auto patched = [&]() -> Result<void> {
    int size = xc_domain_hvm_getcontext(xch_, dom.value, nullptr, 0);
    if (size < 0) return fail_errno(errno, on_dom("xc_domain_hvm_getcontext(size)", dom));
    std::vector<std::uint8_t> blob(static_cast<std::size_t>(size));
    int got = xc_domain_hvm_getcontext(xch_, dom.value, blob.data(), blob.size());
    if (got < 0) return fail_errno(errno, on_dom("xc_domain_hvm_getcontext", dom));
    blob.resize(std::min<std::size_t>(blob.size(), static_cast<std::size_t>(got)));
    XP_TRY(hvm_context_set_cpu_regs(blob, vcpu.value, r));
    if (xc_domain_hvm_setcontext(xch_, dom.value, blob.data(), blob.size()) < 0)
      return fail_errno(errno, on_vcpu("xc_domain_hvm_setcontext", dom, vcpu));
    return {};
  }();
  auto resumed = unpause(dom);
  if (!patched) return patched;
  return resumed;
}

Result<void> XcShim::set_debugging(DomId dom, bool on) {
  if (xc_domain_setdebugging(xch_, dom.value, on ? 1 : 0) < 0)
    return fail_errno(errno, on_dom("xc_domain_setdebugging", dom));
  return {};
}

Result<GdbsxStatus> XcShim::gdbsx_domstatus(DomId dom) {
  xen_domctl dc{};
  dc.cmd = XEN_DOMCTL_gdbsx_domstatus;
  dc.domain = static_cast<domid_t>(dom.value);
  int e = raw_domctl(xch_, dc);
  if (e == ENOSYS)
    return fail(Errc::NoSys, on_dom("XEN_DOMCTL_gdbsx_domstatus", dom) +
                                 ": hypervisor built without CONFIG_GDBSX");
  if (e) return fail_errno(e, on_dom("XEN_DOMCTL_gdbsx_domstatus", dom));
  const auto& s = dc.u.gdbsx_domstatus;
  GdbsxStatus out;
  out.paused = s.paused != 0;
  if (s.vcpu_id != ~0u) out.vcpu = s.vcpu_id;  // -1: no vCPU has a recorded event
  out.event = s.vcpu_ev;
  return out;
}

Result<std::unique_ptr<VmEventRing>> XcShim::monitor_enable(DomId dom) {
  std::uint32_t remote_port = 0;
  void* page = xc_monitor_enable(xch_, dom.value, &remote_port);
  if (!page) {
    int e = errno;
    if (e == EBUSY)
      return fail(Errc::Busy, on_dom("xc_monitor_enable", dom) +
                                  ": a vm_event monitor is already attached (one per domain)");
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
  if (xc_monitor_disable(xch_, dom.value) < 0)
    return fail_errno(errno, on_dom("xc_monitor_disable", dom));
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

Result<void> XcShim::inject_event(DomId dom, VcpuId vcpu, std::uint8_t vector, std::uint8_t type,
                                  std::uint32_t error_code, std::uint8_t insn_len) {
  xendevicemodel_handle* dmod = xc_interface_dmod_handle(xch_);
  if (xendevicemodel_inject_event(dmod, static_cast<domid_t>(dom.value),
                                  static_cast<int>(vcpu.value), vector, type, error_code,
                                  insn_len, 0) < 0)
    return fail_errno(errno, on_vcpu("xendevicemodel_inject_event", dom, vcpu));
  return {};
}

}  // namespace xenprobes::hv::xen
