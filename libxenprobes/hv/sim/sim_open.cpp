// open_default_sim(): what XENPROBES_BACKEND=sim gives a program. Its variables are read with
// secure_getenv (XENPROBES_SIM_GUEST names a file it reads): a privileged-at-exec program
// ignores them.
#include <cstdlib>
#include <cstring>

#include "common/result.hpp"
#include "hv/sim/sim.hpp"

namespace xenprobes::hv::sim {
namespace {

Result<unsigned> env_uint(const char* name, unsigned dflt, unsigned lo, unsigned hi) {
  const char* s = ::secure_getenv(name);
  if (!s || !*s) return dflt;
  char* end = nullptr;
  unsigned long v = std::strtoul(s, &end, 10);
  if (*end || v < lo || v > hi)
    return fail(Errc::InvalidArgument, std::string(name) + "='" + s + "': expected a number from " +
                                           std::to_string(lo) + " to " + std::to_string(hi));
  return static_cast<unsigned>(v);
}

}  // namespace

Result<std::unique_ptr<Hypervisor>> open_default_sim() {
  SimOptions opts;
  opts.gdbsx = XP_TRY(env_uint("XENPROBES_SIM_GDBSX", 1, 0, 1)) == 1;
  DomainConfig cfg;
  cfg.vcpus = XP_TRY(env_uint("XENPROBES_SIM_VCPUS", 2, 1, 8));
  if (const char* t = ::secure_getenv("XENPROBES_SIM_TYPE"); t && *t) {
    if (!std::strcmp(t, "pv")) cfg.type = GuestType::Pv;
    else if (!std::strcmp(t, "hvm") || !std::strcmp(t, "pvh")) cfg.type = GuestType::Hvm;
    else return fail(Errc::InvalidArgument, std::string("XENPROBES_SIM_TYPE='") + t + "': expected pv, pvh or hvm");
  }
  if (const char* g = ::secure_getenv("XENPROBES_SIM_GUEST"); g && *g) cfg.image = g;
  auto host = SimHost::create(opts);
  auto id = host->create_domain(cfg);
  if (!id) {
    Error e = id.error();
    e.what = "simulated Xen: cannot start the guest: " + e.what;
    return std::unexpected(e);
  }
  return host->open();
}

}  // namespace xenprobes::hv::sim
