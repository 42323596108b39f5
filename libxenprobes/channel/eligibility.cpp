#include "channel/eligibility.hpp"

namespace xenprobes::channel {
namespace {

std::string dom_str(const hv::DomainInfo& i) { return "domain " + std::to_string(i.domid.value); }

Result<void> alive(const hv::DomainInfo& i) {
  if (i.dying || i.crashed) return fail(Errc::NoSuchDomain, dom_str(i) + " is dying or crashed");
  return {};
}

Result<void> usable_64bit(const hv::DomainInfo& i) {
  XP_TRY(alive(i));
  if (i.guest_width != 8) return fail(Errc::NotSupported, dom_str(i) + " is a 32-bit guest: not supported");
  if (i.vcpus == 0) return fail(Errc::Io, dom_str(i) + " reports no vCPU");
  return {};
}

}  // namespace

Result<void> vmevent_host_eligible(const hv::Capabilities& c) {
  if (!c.vm_event)
    return fail(Errc::NotSupported,
                "the vmevent channel needs Xen's vm_event monitor interface, which this hypervisor "
                "does not offer: use the guest channel (load the xenprobesU module in the guest) or, "
                "on a Xen built with CONFIG_GDBSX, the debugger channel");
  return {};
}

Result<void> debugger_host_eligible(const hv::Capabilities& c) {
  if (!c.gdbsx)
    return fail(Errc::NotSupported,
                "the debugger channel needs a Xen built with CONFIG_GDBSX (this hypervisor answers "
                "ENOSYS to the gdbsx domctls, as Debian's does): without it debugging mode swallows "
                "breakpoints and the guest would crash. Use the guest channel (load the xenprobesU "
                "module in the guest) or, for HVM/PVH guests, the vmevent channel");
  return {};
}

Result<void> guest_domain_eligible(const hv::DomainInfo& i) { return usable_64bit(i); }

Result<void> vmevent_domain_eligible(const hv::DomainInfo& i) {
  XP_TRY(alive(i));
  if (i.type == hv::GuestType::Pv)
    return fail(Errc::NotSupported, dom_str(i) +
                                        " is a PV guest, and Xen's vm_event monitor serves only HVM and PVH "
                                        "guests: use the guest channel (load the xenprobesU module in the guest) "
                                        "or, on a Xen built with CONFIG_GDBSX, the debugger channel");
  if (i.debugged)
    return fail(Errc::Busy, dom_str(i) +
                                " is in debugging mode (XEN_DOMCTL_setdebugging: gdbsx or the "
                                "debugger channel), which takes every int3 and #DB before the "
                                "vm_event monitor sees it: turn debugging mode off first, or "
                                "use the debugger channel");
  return {};
}

Result<void> debugger_domain_eligible(const hv::DomainInfo& i) {
  XP_TRY(usable_64bit(i));
  // Somebody else's (gdbsx, another xenprobes program): taking it over would swallow their
  // breakpoints, and our detach would turn their debugging mode off.
  if (i.debugged)
    return fail(Errc::Busy, dom_str(i) +
                                " is already in debugging mode (gdbsx or another debugger holds it): "
                                "stop that debugger, or use the guest or vmevent channel");
  return {};
}

}  // namespace xenprobes::channel
