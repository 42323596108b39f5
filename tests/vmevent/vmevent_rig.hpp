// The vm_event channel tests' rig (vmevent_channel_test.cpp, vmevent_detach_test.cpp,
// vmevent_agentless_test.cpp): an HVM demo guest with a Dom0 handle (Dom0Guest), the channel
// opened over a RecordingHv on that handle, a fake engine (FakeSink) and the event loop that
// drives them; the workload without probes as the reference.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include <functional>
#include <set>

#include "channel/vmevent.hpp"
#include "demo_guest.hpp"
#include "vmevent/recording_hv.hpp"

namespace xenprobes::testing {

using channel::Stop;
using channel::Verdict;
using channel::VmEventChannel;
using Mode = VmEventChannel::Mode;
using hv::GuestType;
using hv::sim::DomainConfig;
using hv::sim::Op;
using hv::sim::SimOptions;

inline constexpr std::uint32_t kPaused = hv::kVmEventFlagVcpuPaused;
inline constexpr std::uint32_t kEmulate = hv::kVmEventFlagEmulate | hv::kVmEventFlagSetEmulInsnData;

inline DomainConfig hvm(unsigned vcpus, std::uint64_t iterations) {
  DomainConfig c;
  c.type = GuestType::Hvm;
  c.vcpus = vcpus;
  c.iterations = iterations;
  c.start_paused = true;  // traps go in before the first instruction runs
  return c;
}

// The engine side, faked: owns the traps listed, records every stop, answers with `handler`.
struct FakeSink final : channel::StopSink {
  std::set<std::uint64_t> owned;
  bool own_everything = false;
  std::function<Verdict(Stop&)> handler;
  std::function<void()> on_failure;
  std::vector<Stop> stops;
  std::vector<Error> failures;

  bool owns_trap(DomId, Gva a) const override { return own_everything || owned.contains(a.value); }
  Verdict on_stop(Stop& s) override {
    stops.push_back(s);
    return handler ? handler(s) : Verdict::Resume;
  }
  void on_channel_failure(DomId, const Error& e) override {
    failures.push_back(e);
    if (on_failure) on_failure();
  }
};

// Every demo function starts with a 5-byte nopl (the ftrace nop): resuming after it is what
// a slot holding it would do.
inline Verdict skip_nop(Stop& s) {
  s.regs.rip = s.trap.value + 5;
  return Verdict::Resume;
}

struct Rig {
  Dom0Guest g;
  RecordingHv rec;
  std::unique_ptr<VmEventChannel> ch;
  std::unique_ptr<mem::GuestMemory> gm;

  Rig(DomainConfig c, Mode mode, SimOptions o = {}) : g(c, o), rec(*g.hv) {
    auto r = VmEventChannel::open(rec, mode);
    if (!r) throw std::runtime_error(r.error().what);
    ch = std::move(*r);
    gm = g.memory_view();
  }

  void attach() {
    auto r = ch->attach(g.dom);
    ASSERT_TRUE(r) << r.error().what;
  }
  void patch(std::uint64_t va, std::uint8_t b) {
    ASSERT_TRUE(g.hv->pause(g.dom));
    ASSERT_TRUE(gm->write_u8(Gva{va}, b));
    ASSERT_TRUE(g.hv->unpause(g.dom));
  }
  std::uint8_t byte_at(std::uint64_t va) {
    std::uint8_t b = 0;
    EXPECT_TRUE(g.host->peek(g.dom, va, std::as_writable_bytes(std::span(&b, 1))));
    return b;
  }
  void start() { ASSERT_TRUE(g.hv->unpause(g.dom)); }  // the creation pause

  // The event loop: waits on the channel's fd, processes, until `done` or the guest crashed.
  bool run(FakeSink& sink, const std::function<bool()>& done, std::chrono::milliseconds timeout = 60s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (done()) return true;
      if (!g.host->crash_reason(g.dom).empty()) return false;
      pollfd p{ch->fd(), POLLIN, 0};
      int iv = ch->poll_interval_ms();
      ::poll(&p, 1, iv > 0 ? iv : 20);
      auto r = ch->process(sink);
      if (!r) {
        ADD_FAILURE() << "process: " << r.error().what;
        return false;
      }
    }
    return done();
  }
  bool run_to_completion(FakeSink& sink) {
    return run(sink, [&] { return g.host->wait_halted(g.dom, 0ms); });
  }

  // Every vCPU of the domain stands at `va` (stopped there: paused by its request or waiting
  // for room in the ring).
  bool all_stopped_at(std::uint64_t va, unsigned vcpus) {
    for (unsigned v = 0; v < vcpus; ++v) {
      auto r = g.hv->get_vcpu_regs(g.dom, VcpuId{v});
      if (!r || r->rip != va) return false;
    }
    return true;
  }
};

// The workload without probes, as the reference; `ppid` is what sys_getppid returns.
inline std::vector<demo_stats> reference(unsigned vcpus, std::uint64_t iterations, std::int32_t ppid = 1) {
  Dom0Guest ref(hvm(vcpus, iterations));
  if (ppid != 1) {
    auto gm = ref.memory_view();
    EXPECT_TRUE(gm->write(Gva{ref.sym(DEMO_SYM_PPID)}, std::as_bytes(std::span(&ppid, 1))));
  }
  EXPECT_TRUE(ref.hv->unpause(ref.dom));
  EXPECT_TRUE(ref.host->wait_halted(ref.dom, 60s));
  std::vector<demo_stats> out;
  for (unsigned v = 0; v < vcpus; ++v) out.push_back(ref.stats(v));
  return out;
}

}  // namespace xenprobes::testing
