// What each channel needs of the host and of a domain, decided from facts read without
// touching either. One function per need, used by the channels themselves (open, attach), by
// the session's Auto choice and by doctor(): the report and the behaviour cannot disagree.
#pragma once

#include <array>
#include <string>

#include "common/result.hpp"
#include "xenprobes/hypervisor.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::channel {

// The order Auto tries the channels in: the guest module's channel (no domain pause per
// hit), Xen's vm_event monitor (HVM/PVH), the debugger channel (a Xen built with GDBSX).
inline constexpr std::array<ChannelKind, 3> kAutoOrder = {ChannelKind::Guest, ChannelKind::VmEvent,
                                                          ChannelKind::Debugger};

// The host: the vm_event monitor interface (vmevent), CONFIG_GDBSX (debugger).
[[nodiscard]] Result<void> vmevent_host_eligible(const hv::Capabilities&);
[[nodiscard]] Result<void> debugger_host_eligible(const hv::Capabilities&);

// The domain, from its DomainInfo. The guest channel also needs the module's keys and control
// area, the debugger channel the module's out-of-line area (it cannot emulate): those are
// read and validated where they are used (GuestChannel::attach, the engine's attach).
[[nodiscard]] Result<void> guest_domain_eligible(const hv::DomainInfo&);
[[nodiscard]] Result<void> vmevent_domain_eligible(const hv::DomainInfo&);
[[nodiscard]] Result<void> debugger_domain_eligible(const hv::DomainInfo&);

}  // namespace xenprobes::channel
