// XcShim: libxenctrl, libxencall (raw domctls) and libxendevicemodel; the quiet logger. The
// vm_event ring, the pure translations and the extended-state buffers are in the other
// xc_shim_*.cpp files (file map: xc_shim_internal.hpp).
//
// ABI pinning: XEN_DOMCTL_INTERFACE_VERSION and VM_EVENT_INTERFACE_VERSION (7) come from the
// installed headers; XcShim::sanity_check() refuses a hypervisor that rejects the former,
// and every ring request is checked against the latter. Two Xens are known: 4.17 (domctl
// 0x15, Debian 12) and 4.20 (domctl 0x17, Debian 13). The structs the xc_shim*.cpp files use
// (xen_domctl_getdomaininfo, _vcpuextstate, _gdbsx_pauseunp_vcpu, vm_event_request/response)
// have the same layout in both; 4.20 only adds a member to the vm_event union (I/O
// instructions), which does not change its size. A libxenprobes must be built against the
// libxen-dev of the Xen it runs on: Xen answers EACCES to another domctl version.

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "common/hex.hpp"
#include "common/log.hpp"
#include "hv/xen/xc_shim_internal.hpp"

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

void quiet_vmessage(xentoollog_logger*, xentoollog_level level, int errnoval, const char* context, const char* format,
                    va_list al) {
  if (log::level() > log::Level::Debug) return;
  char buf[512];
  std::vsnprintf(buf, sizeof buf, format, al);
  XP_LOG(Debug, "%s (xtl level %d, errno %d): %s", context ? context : "libxen", static_cast<int>(level), errnoval,
         buf);
}

void quiet_progress(xentoollog_logger*, const char*, const char*, int, unsigned long, unsigned long) {}

void quiet_destroy(xentoollog_logger*) {}  // static storage: nothing to free

xentoollog_logger g_quiet_logger = {quiet_vmessage, quiet_progress, quiet_destroy};

// ---- small helpers -------------------------------------------------------------------------

// Issues one domctl through libxencall. libxenctrl has no wrapper for the gdbsx domctls (Xen's
// own gdbsx issues them raw as well: _domctl_hcall, tools/debugger/gdbsx/xg/xg_main.c), so
// these go raw; `dc` is copied into a hypercall-safe buffer and back.
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

}  // namespace

xentoollog_logger* quiet_logger() { return &g_quiet_logger; }

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
    return fail(Errc::Permission, "xc_domain_getinfolist(dom0): domctl refused: not the control domain (a DomU?)");
  if (e == EACCES) {
    // do_domctl answers EACCES to a foreign XEN_DOMCTL_INTERFACE_VERSION (and XSM/FLASK denials).
    auto v = version();
    return fail(Errc::NotSupported, "the hypervisor (Xen " + (v ? *v : std::string("?")) +
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
  if (xc_version(xch_, XENVER_extraversion, &extra) < 0) return fail_errno(errno, "xc_version(XENVER_extraversion)");
  extra[sizeof extra - 1] = '\0';
  return std::to_string(v >> 16) + "." + std::to_string(v & 0xffff) + extra;
}

Result<bool> XcShim::has_gdbsx() {
  // Without CONFIG_GDBSX the gdbsx domctls answer ENOSYS: in Xen 4.17 their cases of
  // arch_do_domctl (xen/arch/x86/domctl.c) are compiled out and they reach `default: -ENOSYS`; in
  // 4.20 they call gdbsx_domctl(), whose stub (xen/arch/x86/include/asm/gdbsx.h) returns -ENOSYS.
  // With it, vcpu ~0u on an unpaused domain (our own Dom0) answers EBUSY (no controller pause;
  // EINVAL for a vCPU that does not exist) and changes nothing.
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
  if (xc_domain_pause(xch_, dom.value) < 0) return fail_errno(errno, on_dom("xc_domain_pause", dom));
  return {};
}

Result<void> XcShim::unpause(DomId dom) {
  if (xc_domain_unpause(xch_, dom.value) < 0) {
    int e = errno;
    // Below a zero pause count: domain_unpause_by_systemcontroller (xen/common/domain.c).
    if (e == EINVAL)
      return fail(Errc::InvalidArgument, on_dom("xc_domain_unpause", dom) + ": the pause count is already zero");
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
  if (int e = raw_domctl(xch_, dc)) return fail_errno(e, on_vcpu("XEN_DOMCTL_getvcpuextstate(size query)", dom, vcpu));
  ext_host_ = XP_TRY(ext_state_host_from_query(dc.u.vcpuextstate));
  return *ext_host_;
}

// 64-bit PV register write that keeps the extended FPU state.
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
// with AVX state wiped). It also keeps the CR3/GDT/LDT echo exact: arch_set_info_guest
// (xen/arch/x86/domain.c) refuses with EOPNOTSUPP an initialised PV vCPU's context whose CR3,
// user CR3, GDT frames or LDT differ from the vCPU's own.
//
// Cost: pause, getcontext, getvcpuextstate, setcontext, setvcpuextstate, unpause = 6
// hypercalls, +1 size query on this XcShim's first call. Fewer when there is nothing to
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
    // [1]), GDT frames and LDT, or Xen answers EOPNOTSUPP (arch_set_info_guest). Debug registers
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
        return fail_errno(e, on_vcpu("XEN_DOMCTL_getvcpuextstate", dom, vcpu) + ": registers not written");
      img = XP_TRY(
          ext_state_parse(dc.u.vcpuextstate, vcpu.value, host,
                          std::span<const std::uint8_t>(static_cast<const std::uint8_t*>(ext_buf), host.max_size)));
    }

    regs_to_pv(r, ctx.x64);
    if (xc_vcpu_setcontext(xch_, dom.value, vcpu.value, &ctx) < 0) {
      int e = errno;
      if (e == EOPNOTSUPP)
        return fail(Errc::Again, on_vcpu("xc_vcpu_setcontext", dom, vcpu) + ": CR3/GDT/LDT changed since read");
      return fail_errno(e, on_vcpu("xc_vcpu_setcontext", dom, vcpu));
    }

    if (img && img->needs_restore()) {
      dc = xen_domctl{};
      dc.cmd = XEN_DOMCTL_setvcpuextstate;
      dc.domain = static_cast<domid_t>(dom.value);
      ext_state_prepare_set(dc.u.vcpuextstate, vcpu.value, *img);
      set_xen_guest_handle_raw(dc.u.vcpuextstate.buffer, static_cast<std::uint64_t*>(ext_buf));
      if (int e = raw_domctl(xch_, dc))
        return fail(Errc::Io, on_vcpu("XEN_DOMCTL_setvcpuextstate", dom, vcpu) + ": " + std::strerror(e) +
                                  ": registers written, but the extended FPU state "
                                  "(xcr0_accum " +
                                  hex(img->xcr0_accum) + ") was reset");
    }
    return {};
  }();
  auto resumed = unpause(dom);
  if (!done) return done;
  return resumed;
}

Result<VcpuRegs> XcShim::get_hvm_regs(DomId dom, VcpuId vcpu) {
  if (vcpu.value > 0xffff)  // the save-record instance is 16 bits
    return fail(Errc::InvalidArgument, on_vcpu("xc_domain_hvm_getcontext_partial", dom, vcpu) + ": no such vCPU");
  hvm_hw_cpu cpu{};
  if (xc_domain_hvm_getcontext_partial(xch_, dom.value, HVM_SAVE_CODE(CPU), static_cast<std::uint16_t>(vcpu.value),
                                       &cpu, sizeof cpu) < 0)
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
    return fail(Errc::NoSys, on_dom("XEN_DOMCTL_gdbsx_domstatus", dom) + ": hypervisor built without CONFIG_GDBSX");
  if (e) return fail_errno(e, on_dom("XEN_DOMCTL_gdbsx_domstatus", dom));
  const auto& s = dc.u.gdbsx_domstatus;
  GdbsxStatus out;
  out.paused = s.paused != 0;
  if (s.vcpu_id != ~0u) out.vcpu = s.vcpu_id;  // -1: no vCPU has a recorded event
  out.event = s.vcpu_ev;
  return out;
}

Result<void> XcShim::inject_event(DomId dom, VcpuId vcpu, std::uint8_t vector, std::uint8_t type,
                                  std::uint32_t error_code, std::uint8_t insn_len) {
  xendevicemodel_handle* dmod = xc_interface_dmod_handle(xch_);
  if (xendevicemodel_inject_event(dmod, static_cast<domid_t>(dom.value), static_cast<int>(vcpu.value), vector, type,
                                  error_code, insn_len, 0) < 0)
    return fail_errno(errno, on_vcpu("xendevicemodel_inject_event", dom, vcpu));
  return {};
}

}  // namespace xenprobes::hv::xen
