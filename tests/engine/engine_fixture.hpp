// Probe-engine tests: the public Session API over the simulated Xen running the demo guest.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "demo_abi.h"
#include "symbols/symbol_table.hpp"
#include "x86/insn.hpp"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes::testing {

using namespace std::chrono_literals;

inline std::string demo_map() { return hv::sim::default_guest_dir() + "/System.map"; }

// The channel the suite runs over: XENPROBES_TEST_CHANNEL (debugger, guest or vmevent; the
// CMake file registers every engine test once per channel). Default: debugger.
inline ChannelKind test_channel() {
  const char* e = std::getenv("XENPROBES_TEST_CHANNEL");
  if (!e || !*e) return ChannelKind::Debugger;
  auto k = parse_channel_kind(e);
  if (!k || *k == ChannelKind::Auto) throw std::runtime_error("XENPROBES_TEST_CHANNEL: use debugger, guest or vmevent");
  return *k;
}

// The byte a probe point holds while armed on the test channel.
inline std::uint8_t trap_byte() { return test_channel() == ChannelKind::Guest ? 0xcc : 0xf1; }

// For tests of one channel's own behaviour.
#define XP_ONLY_ON_CHANNEL(kind)                                                              \
  do {                                                                                        \
    if (::xenprobes::testing::test_channel() != (kind))                                       \
      GTEST_SKIP() << "a test of the " << ::xenprobes::channel_kind_name(kind) << " channel"; \
  } while (0)

inline hv::sim::DomainConfig demo_config(unsigned vcpus = 1, std::uint64_t iterations = 5) {
  hv::sim::DomainConfig c;
  c.vcpus = vcpus;
  c.iterations = iterations;
  if (test_channel() == ChannelKind::VmEvent) c.type = hv::GuestType::Hvm;  // vm_event needs HVM/PVH
  return c;
}

// A host, a demo-guest domain (created paused so probes are in place before it runs) and a
// Session on a Dom0 handle of that host. On the guest channel the guest module's clock is
// manual (SimOptions::manual_clock): no hit times out because the machine is loaded while the
// test's Dom0 serves it; a test that leaves the guest to its module says so
// (finish_without_dom0).
struct ProbedGuest {
  std::shared_ptr<hv::sim::SimHost> host;
  DomId dom;
  std::unique_ptr<Session> session;

  // `before_attach`: what the guest does before the session sees it (e.g. what its module
  // publishes).
  explicit ProbedGuest(hv::sim::DomainConfig cfg = demo_config(), hv::sim::SimOptions opts = {},
                       SessionLimits limits = {}, unsigned spin_us = 0,
                       const std::function<void(hv::sim::SimHost&, DomId)>& before_attach = {}) {
    if (test_channel() == ChannelKind::Guest) opts.manual_clock = true;
    host = hv::sim::SimHost::create(opts);
    cfg.start_paused = true;
    auto id = host->create_domain(cfg);
    if (!id) throw std::runtime_error(id.error().what);
    dom = *id;
    if (before_attach) before_attach(*host, dom);
    SessionOptions so{test_channel()};
    so.limits = limits;
    so.spin_us = spin_us;
    auto s = Session::open(host->open(), so);
    if (!s) throw std::runtime_error(s.error().what);
    session = std::move(*s);
    auto l = session->load_symbols(dom, demo_map());
    if (!l) throw std::runtime_error(l.error().what);
  }

  void start() {
    auto r = session->hypervisor().unpause(dom);
    if (!r) throw std::runtime_error(r.error().what);
  }

  // Runs the session's loop until the workload has finished (true) or something went wrong.
  bool run_to_completion(std::chrono::milliseconds timeout = 60s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      auto r = session->run_once(2);
      if (!r) {
        ADD_FAILURE() << "run_once: " << r.error().what;
        return false;
      }
      if (!host->crash_reason(dom).empty()) return false;
      if (host->wait_halted(dom, 0ms)) return true;
    }
    return false;
  }

  // Waits for the workload to end once no Dom0 serves the guest any more (the session is gone
  // or never answers): on the guest channel its module's waits for Dom0 run out as the clock
  // advances, 100 ms at a time.
  bool finish_without_dom0(std::chrono::milliseconds timeout) {
    if (test_channel() != ChannelKind::Guest) return host->wait_halted(dom, timeout);
    auto end = std::chrono::steady_clock::now() + timeout;
    while (!host->wait_halted(dom, 0ms)) {
      if (!host->crash_reason(dom).empty() || std::chrono::steady_clock::now() >= end) return false;
      if (auto r = host->advance_clock(100ms); !r) throw std::runtime_error(r.error().what);
    }
    return true;
  }

  // Lets `d` of the guest module's time pass (guest channel; elsewhere nothing). A hit whose
  // answer Dom0 wrote but could not notify (a fault injected into evtchn_notify) is taken up
  // when its wait ends, as a real module's SCHEDOP_poll times out and finds the answer.
  void let_module_time_pass(std::chrono::milliseconds d) {
    if (test_channel() != ChannelKind::Guest) return;
    if (auto r = host->advance_clock(d); !r) throw std::runtime_error(r.error().what);
  }

  std::uint64_t sym(const char* name) { return *host->symbol(dom, name); }
  // Where a probe asked for at the function lands: past its 5-byte ftrace site (every C
  // function of the demo guest starts with one, like a distribution kernel's), which belongs
  // to the guest kernel.
  std::uint64_t entry(const char* name) {
    static constexpr std::uint8_t kNop5[] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
    std::uint64_t a = sym(name);
    auto b = peek(a, 5);
    return std::equal(b.begin(), b.end(), kNop5) ? a + 5 : a;
  }

  demo_stats stats(unsigned vcpu) {
    demo_stats st{};
    // A failed read would leave zeros, and every "no call" check would pass without looking.
    if (!host->peek(dom, sym(DEMO_SYM_STATS) + vcpu * sizeof(demo_stats), std::as_writable_bytes(std::span(&st, 1))))
      throw std::runtime_error("cannot read demo_stats");
    return st;
  }

  std::vector<std::uint8_t> peek(std::uint64_t va, std::size_t n) { return peek_at(dom, va, n); }
  std::vector<std::uint8_t> peek_at(DomId d, std::uint64_t va, std::size_t n) {
    std::vector<std::uint8_t> b(n);
    auto r = host->peek(d, va, std::as_writable_bytes(std::span(b)));
    if (!r) throw std::runtime_error(r.error().what);
    return b;
  }
};

// The reference: the same workload without probes.
inline demo_stats reference_stats(unsigned vcpu, std::uint64_t iterations, unsigned vcpus = 1) {
  auto host = hv::sim::SimHost::create();
  hv::sim::DomainConfig c = demo_config(vcpus, iterations);
  DomId dom = *host->create_domain(c);
  if (!host->wait_halted(dom, 60s)) throw std::runtime_error("reference run did not finish");
  demo_stats st{};
  if (!host->peek(dom, *host->symbol(dom, DEMO_SYM_STATS) + vcpu * sizeof(demo_stats),
                  std::as_writable_bytes(std::span(&st, 1))))
    throw std::runtime_error("reference run: cannot read demo_stats");
  return st;
}

inline bool eventually_paused(ProbedGuest& g, std::chrono::milliseconds timeout = 10s) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (g.session->hypervisor().domain_info(g.dom)->paused) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

inline bool eventually_crashed(ProbedGuest& g, std::chrono::milliseconds timeout = 10s) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (!g.host->crash_reason(g.dom).empty()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

inline std::uint64_t expected_calls(unsigned fn, std::uint64_t iterations) {
  static const std::uint64_t k[DEMO_NFUNCS] = DEMO_CALLS_PER_ITER_INIT;
  return k[fn] * iterations;
}

// Runs the session until `done` or `rounds` rounds of at most 2 ms.
template <typename F>
bool run_until(ProbedGuest& g, F done, int rounds = 5000) {
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
