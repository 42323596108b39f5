// The real Xen backend of hv::Hypervisor, over libxenctrl, libxencall, libxenforeignmemory,
// libxenevtchn, libxenstore and libxendevicemodel (Xen 4.17 ABI: domctl interface 0x15,
// vm_event interface 7).
#pragma once

#include <memory>

#include "common/result.hpp"
#include "hv/hypervisor.hpp"

namespace xenprobes::hv {

// Opens the hypervisor of the Dom0 this process runs in.
//
// Errors (nothing is printed to stderr, libxc's own log goes to XP_LOG at debug level):
//   NotSupported  no /dev/xen/privcmd (or /proc/xen/privcmd): not a Xen Dom0, with the message
//                 "no /dev/xen/privcmd: not running in a Xen Dom0; set XENPROBES_BACKEND=sim ...";
//                 or the hypervisor speaks another domctl ABI than Xen 4.17's.
//   Permission    privcmd exists but cannot be opened, or domctls are refused (not root, a DomU).
//   other         the errno of the library call that failed, named in the message.
[[nodiscard]] Result<std::unique_ptr<Hypervisor>> open_xen_hypervisor();

// The message of the NotSupported error above (exposed for tests and callers that match it).
inline constexpr const char* kNoPrivcmdMessage =
    "no /dev/xen/privcmd: not running in a Xen Dom0; set XENPROBES_BACKEND=sim to use the "
    "simulated Xen";

}  // namespace xenprobes::hv
