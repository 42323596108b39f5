// open_hypervisor(): picks the backend named by XENPROBES_BACKEND (default: xen). A monitoring
// program must never silently watch a simulation, so "sim" is only ever chosen explicitly,
// and said so. The variable is read with secure_getenv: a set-user-ID (or otherwise
// privileged-at-exec) program ignores it and gets the real Xen.
#include <cstdlib>

#include "common/log.hpp"
#include "common/result.hpp"
#include "hv/hypervisor.hpp"
#include "hv/sim/sim.hpp"
#ifdef XENPROBES_HAVE_XEN
#include "hv/xen/xen_hypervisor.hpp"
#endif

namespace xenprobes::hv {

Result<std::unique_ptr<Hypervisor>> open_hypervisor(const std::string& backend) {
  if (backend == "sim") return sim::open_default_sim();
  if (backend == "xen") {
#ifdef XENPROBES_HAVE_XEN
    return open_xen_hypervisor();
#else
    return fail(Errc::NotSupported, "this libxenprobes was built without the Xen backend (XENPROBES_BACKEND_XEN=OFF)");
#endif
  }
  return fail(Errc::InvalidArgument, "unknown backend '" + backend + "': XENPROBES_BACKEND must be 'xen' or 'sim'");
}

Result<std::unique_ptr<Hypervisor>> open_hypervisor() {
  const char* b = ::secure_getenv("XENPROBES_BACKEND");
  if (!b || !*b) return open_hypervisor("xen");
  if (std::string(b) == "sim") XP_LOG(Warn, "XENPROBES_BACKEND=sim: the SIMULATED Xen, not a real one");
  return open_hypervisor(b);
}

}  // namespace xenprobes::hv
