// The one door between libxenprobes.so and libxenprobes-sim.so (docs/architecture.md, "The
// simulated Xen, a library of its own"). libxenprobes.so does not link the simulated Xen: it
// loads libxenprobes-sim.so with dlopen() the first time a program asks for it
// (XENPROBES_BACKEND=sim, SimHost::create(), open_default_sim()), looks up the C-linkage
// function xenprobes_sim_entry and reaches the simulation only through the table it returns.
// So a Dom0 program that never asks for the simulation never loads Unicorn.
//
// The table passes C++ types (SimOptions, Hypervisor, Result, std::string), so the two
// libraries must come from one build: `version` and `build` open every table, in this order,
// in every build that ever has them, and the loader compares both with its own before it reads
// any other member. `build` (XENPROBES_SIM_BUILD) is a hash of what the two sides must agree on:
// the project version, the compiler, the sanitizers and the headers whose types cross.
#pragma once

#include <memory>
#include <string>

#include "xenprobes/sim.hpp"

namespace xenprobes::hv::sim {

struct SimEntry {
  const char* version;  // the project version, "0.2.0"
  const char* build;    // XENPROBES_SIM_BUILD of the build it came from
  std::shared_ptr<SimHost> (*create)(SimOptions);
  SimHost* (*host_of)(Hypervisor&);
  std::string (*guest_dir)();
  const char* (*op_name)(Op);
  Result<std::unique_ptr<Hypervisor>> (*open_default)();
};

}  // namespace xenprobes::hv::sim

// The name the loader looks up, and the only symbol libxenprobes-sim.so exports
// (libxenprobes/xenprobes-sim.map).
#define XENPROBES_SIM_ENTRY_SYMBOL "xenprobes_sim_entry"
extern "C" const xenprobes::hv::sim::SimEntry* xenprobes_sim_entry(void);
