// libxenprobes-sim.so's side of its one door (hv/sim_entry.hpp): the table of the simulated
// Xen's public functions, stamped with the build it came from. Compiled into
// libxenprobes-sim.so only; the static xp_hv_sim that the tests link has no door.
#include "hv/sim_entry.hpp"

#include "sim_build.h"
#include "xenprobes/export.h"

namespace {

const xenprobes::hv::sim::SimEntry kEntry = {
    XENPROBES_VERSION_STRING,
    XENPROBES_SIM_BUILD,
    &xenprobes::hv::sim::SimHost::create,
    &xenprobes::hv::sim::sim_host_of,
    &xenprobes::hv::sim::default_guest_dir,
    &xenprobes::hv::sim::op_name,
    &xenprobes::hv::sim::open_default_sim,
};

}  // namespace

extern "C" XENPROBES_API const xenprobes::hv::sim::SimEntry* xenprobes_sim_entry(void) { return &kEntry; }
