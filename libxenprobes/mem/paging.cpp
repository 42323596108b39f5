#include "mem/paging.hpp"

#include "hv/hypervisor.hpp"

namespace xenprobes::mem {

std::string_view to_string(PagingMode m) {
  switch (m) {
    case PagingMode::None: return "None";
    case PagingMode::Legacy32: return "Legacy32";
    case PagingMode::Pae: return "Pae";
    case PagingMode::Long4: return "Long4";
    case PagingMode::Long5: return "Long5";
  }
  return "?";
}

Result<PagingContext> paging_context(const hv::DomainInfo& dom, const hv::VcpuRegs& regs) {
  PagingContext ctx;
  ctx.cr3 = regs.cr3;
  if (dom.type == hv::GuestType::Pv) {
    if (dom.guest_width != 8)
      return fail(Errc::NotSupported, "32-bit PV guests are not supported (Xen 4.17 builds without CONFIG_PV32)");
    ctx.mode = pv_paging_mode(regs.cr4);
    // Xen turns NX on for PV guests whenever the CPU has it; their EFER view is not reliable.
    ctx.nxe = true;
    return ctx;
  }
  ctx.mode = paging_mode(regs.cr0, regs.cr4, regs.efer);
  ctx.pse = (regs.cr4 & kCr4Pse) != 0;
  ctx.nxe = (regs.efer & kEferNxe) != 0;
  return ctx;
}

}  // namespace xenprobes::mem
