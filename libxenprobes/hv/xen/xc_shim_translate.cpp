// The pure translations between Xen's structs and hv types (declared in xen_internal.hpp;
// file map: xc_shim_internal.hpp).
#include <cstring>
#include <string>

#include "common/hex.hpp"
#include "hv/xen/xc_shim_internal.hpp"

namespace xenprobes::hv::xen {
namespace {

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
  if (hv & ~known) return fail(Errc::InvalidArgument, "vm_event response: unknown flags " + hex(hv & ~known));
  return xen;
}

Result<std::uint32_t> reason_to_xen(VmEventReason r) {
  switch (r) {
    case VmEventReason::SoftwareBreakpoint: return VM_EVENT_REASON_SOFTWARE_BREAKPOINT;
    case VmEventReason::Singlestep: return VM_EVENT_REASON_SINGLESTEP;
    case VmEventReason::DebugException: return VM_EVENT_REASON_DEBUG_EXCEPTION;
  }
  return fail(Errc::InvalidArgument, "vm_event response: unknown reason " + std::to_string(static_cast<unsigned>(r)));
}

// The general registers, rip and rflags carry the same names in every Xen register record
// (vm_event_regs_x86, cpu_user_regs, hvm_hw_cpu): one copy for all of them.
template <typename X>
void gprs_from(const X& x, VcpuRegs& r) {
  r.rax = x.rax;
  r.rbx = x.rbx;
  r.rcx = x.rcx;
  r.rdx = x.rdx;
  r.rsi = x.rsi;
  r.rdi = x.rdi;
  r.rbp = x.rbp;
  r.rsp = x.rsp;
  r.r8 = x.r8;
  r.r9 = x.r9;
  r.r10 = x.r10;
  r.r11 = x.r11;
  r.r12 = x.r12;
  r.r13 = x.r13;
  r.r14 = x.r14;
  r.r15 = x.r15;
  r.rip = x.rip;
  r.rflags = x.rflags;
}

template <typename X>
void gprs_to(const VcpuRegs& r, X& x) {
  x.rax = r.rax;
  x.rbx = r.rbx;
  x.rcx = r.rcx;
  x.rdx = r.rdx;
  x.rsi = r.rsi;
  x.rdi = r.rdi;
  x.rbp = r.rbp;
  x.rsp = r.rsp;
  x.r8 = r.r8;
  x.r9 = r.r9;
  x.r10 = r.r10;
  x.r11 = r.r11;
  x.r12 = r.r12;
  x.r13 = r.r13;
  x.r14 = r.r14;
  x.r15 = r.r15;
  x.rip = r.rip;
  x.rflags = r.rflags;
}

// Segment attributes are Xen's packed 12-bit form (type:4 s:1 dpl:2 p:1 avl:1 l:1 db:1 g:1).
constexpr unsigned dpl_of_attr(std::uint32_t attr) { return (attr >> 5) & 3; }

VcpuRegs regs_from_vm_event(const vm_event_regs_x86& x) {
  VcpuRegs r;
  gprs_from(x, r);
  r.cr0 = x.cr0;
  r.cr2 = x.cr2;
  r.cr3 = x.cr3;
  r.cr4 = x.cr4;
  r.efer = x.msr_efer;
  r.dr6 = x.dr6;
  r.dr7 = x.dr7;
  r.fs_base = x.fs_base;
  r.gs_base = x.gs_base;
  r.cs = x.cs_sel;
  r.ss = x.ss_sel;
  r.kernel_mode = dpl_of_attr(x.ss.ar) == 0;
  return r;
}

// Only what VM_EVENT_FLAG_SET_REGISTERS applies (vm_event.h: GPRs, rflags, rip).
void regs_to_vm_event(const VcpuRegs& r, vm_event_regs_x86& x) { gprs_to(r, x); }

}  // namespace

// ---- pure translations ---------------------------------------------------------------------

std::uint64_t pv_cr3_to_maddr(std::uint64_t ctrlreg3) {
  return static_cast<std::uint64_t>(xen_cr3_to_pfn_x86_64(ctrlreg3)) << XC_PAGE_SHIFT;
}

std::uint64_t maddr_to_pv_cr3(std::uint64_t maddr) { return xen_pfn_to_cr3_x86_64(maddr >> XC_PAGE_SHIFT); }

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
  r.cr0 = c.cr0;
  r.cr2 = c.cr2;
  r.cr3 = c.cr3;
  r.cr4 = c.cr4;
  r.efer = c.msr_efer;
  r.dr6 = c.dr6;
  r.dr7 = c.dr7;
  r.fs_base = c.fs_base;
  r.gs_base = c.gs_base;
  r.cs = static_cast<std::uint16_t>(c.cs_sel);
  r.ss = static_cast<std::uint16_t>(c.ss_sel);
  r.kernel_mode = dpl_of_attr(c.ss_arbytes) == 0;
  return r;
}

void regs_to_hvm(const VcpuRegs& r, hvm_hw_cpu& c) {
  gprs_to(r, c);
  c.dr6 = r.dr6;
  c.dr7 = r.dr7;
}

Result<void> hvm_context_set_cpu_regs(std::span<std::uint8_t> blob, unsigned vcpu, const VcpuRegs& r) {
  //  blob: [desc HEADER][hvm_save_header] [desc CPU/0][hvm_hw_cpu] [desc CPU/1][...] ...
  //        [desc CPU_XSAVE/0][...] ... [desc END]     (records packed, no padding)
  std::size_t off = 0;
  while (blob.size() - off >= sizeof(hvm_save_descriptor)) {
    hvm_save_descriptor d;
    std::memcpy(&d, blob.data() + off, sizeof d);
    off += sizeof d;
    if (d.length > blob.size() - off)
      return fail(Errc::Io, "HVM context: record type " + std::to_string(d.typecode) + " overruns the " +
                                std::to_string(blob.size()) + "-byte blob");
    if (d.typecode == HVM_SAVE_CODE(END)) break;
    if (d.typecode == HVM_SAVE_CODE(CPU) && d.instance == vcpu) {
      if (d.length != sizeof(hvm_hw_cpu))
        return fail(Errc::Io, "HVM context: CPU record of " + std::to_string(d.length) + " bytes, expected " +
                                  std::to_string(sizeof(hvm_hw_cpu)));
      hvm_hw_cpu cpu;
      std::memcpy(&cpu, blob.data() + off, sizeof cpu);
      regs_to_hvm(r, cpu);
      std::memcpy(blob.data() + off, &cpu, sizeof cpu);
      return {};
    }
    off += d.length;
  }
  return fail(Errc::InvalidArgument, "HVM context has no CPU record for vCPU " + std::to_string(vcpu) + " (offline?)");
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
  d.crashed = d.shutdown && ((x.flags >> XEN_DOMINF_shutdownshift) & XEN_DOMINF_shutdownmask) == SHUTDOWN_crash;
  d.debugged = x.flags & XEN_DOMINF_debugged;
  return d;
}

Result<VmEventRequest> vm_event_request_from_xen(const vm_event_st& req) {
  if (req.version != VM_EVENT_INTERFACE_VERSION)
    return fail(Errc::Io, "vm_event request of version " + std::to_string(req.version) + ", expected " +
                              std::to_string(VM_EVENT_INTERFACE_VERSION));
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
      return fail(Errc::NotSupported,
                  "vm_event reason " + std::to_string(req.reason) + " is not one libxenprobes uses");
  }
  if (dbg) {
    if (dbg->insn_length > 15)  // the longest x86 instruction
      return fail(Errc::Io, "vm_event request: instruction length " + std::to_string(dbg->insn_length));
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

}  // namespace xenprobes::hv::xen
