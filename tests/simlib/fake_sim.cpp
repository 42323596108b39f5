// A libxenprobes-sim from another build (tests/simlib): the right door, the wrong version and
// build. The loader must refuse it before it reads anything past the two stamps.
#include "hv/sim_entry.hpp"

namespace {
const xenprobes::hv::sim::SimEntry kEntry = {"0.0.0", "0000000000000000", nullptr, nullptr, nullptr, nullptr, nullptr};
}

extern "C" __attribute__((visibility("default"))) const xenprobes::hv::sim::SimEntry* xenprobes_sim_entry(void) {
  return &kEntry;
}
