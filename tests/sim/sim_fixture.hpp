// Shared by the simulated Xen's tests (sim_test.cpp, sim_debugger_test.cpp, sim_host_test.cpp):
// a finite demo workload, the check that it ran to completion, and whether an fd is readable.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include "demo_guest.hpp"
#include "hv/hypervisor.hpp"

namespace xenprobes::testing {

using hv::GuestType;
using hv::sim::DomainConfig;
using hv::sim::Op;
using hv::sim::SimOptions;

inline DomainConfig finite(unsigned vcpus, std::uint64_t iterations, GuestType type = GuestType::Pv) {
  DomainConfig c;
  // A finite workload finishes in milliseconds: tests that probe it create it paused.
  c.vcpus = vcpus;
  c.iterations = iterations;
  c.type = type;
  return c;
}

inline void expect_workload_complete(Dom0Guest& g, unsigned vcpus, std::uint64_t iterations) {
  for (unsigned v = 0; v < vcpus; ++v) {
    demo_stats st = g.stats(v);
    EXPECT_EQ(st.done, 1u) << "vcpu " << v;
    EXPECT_EQ(st.iterations, iterations) << "vcpu " << v;
    for (unsigned f = 0; f < DEMO_NFUNCS; ++f)
      EXPECT_EQ(st.calls[f], expected_calls(f, iterations)) << "vcpu " << v << " fn " << f;
  }
}

inline bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

}  // namespace xenprobes::testing
