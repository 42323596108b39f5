// open_hypervisor(): picks the backend named by XENPROBES_BACKEND (default: xen). A monitoring
// program must never silently watch a simulation, so "sim" is only ever chosen explicitly.
#include <cstdlib>

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
    return fail(Errc::NotSupported,
                "this libxenprobes was built without the Xen backend (XENPROBES_BACKEND_XEN=OFF)");
#endif
  }
  return fail(Errc::InvalidArgument,
              "unknown backend '" + backend + "': XENPROBES_BACKEND must be 'xen' or 'sim'");
}

Result<std::unique_ptr<Hypervisor>> open_hypervisor() {
  const char* b = std::getenv("XENPROBES_BACKEND");
  return open_hypervisor(b && *b ? b : "xen");
}

}  // namespace xenprobes::hv
