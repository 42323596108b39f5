// Probe-engine tests: the public Session API over the simulated Xen running the demo guest, on
// the channel XENPROBES_TEST_CHANNEL names (the CMake file registers every test of these
// suites once per channel: debugger.*, guest.*, vmevent.*).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <vector>

#include "demo_guest.hpp"

namespace xenprobes::testing {

// The byte a probe point holds while armed on the test channel.
inline std::uint8_t trap_byte() { return test_channel() == ChannelKind::Guest ? 0xcc : 0xf1; }

// For tests of one channel's own behaviour.
#define XP_ONLY_ON_CHANNEL(kind)                                                              \
  do {                                                                                        \
    if (::xenprobes::testing::test_channel() != (kind))                                       \
      GTEST_SKIP() << "a test of the " << ::xenprobes::channel_kind_name(kind) << " channel"; \
  } while (0)

// The demo guest probed on the test channel.
struct ProbedGuest : SessionGuest {
  explicit ProbedGuest(hv::sim::DomainConfig cfg = demo_config(), hv::sim::SimOptions opts = {},
                       SessionLimits limits = {}, unsigned spin_us = 0, const BeforeAttach& before_attach = {})
      : SessionGuest(std::move(cfg), opts, options(limits, spin_us), true, before_attach) {}

 private:
  static SessionOptions options(SessionLimits limits, unsigned spin_us) {
    SessionOptions so{test_channel()};
    so.limits = limits;
    so.spin_us = spin_us;
    return so;
  }
};

// Runs the session until `done` or `rounds` rounds of at most 2 ms.
template <typename F>
bool run_until(SessionGuest& g, F done, int rounds = 5000) {
  for (int i = 0; i < rounds; ++i) {
    if (done()) return true;
    if (auto r = g.session->run_once(2); !r) {
      ADD_FAILURE() << "run_once: " << r.error().what;
      return false;
    }
  }
  return done();
}

}  // namespace xenprobes::testing
