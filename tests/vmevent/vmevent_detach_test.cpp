// The vm_event channel (vmevent_rig.hpp) leaving a domain: detach with stops pending answers
// them all, flush hands the sink every stop in the ring, and two domains sharing one fd.
#include "vmevent/vmevent_rig.hpp"

namespace xenprobes::testing {
namespace {

// ---- detach and flush ----------------------------------------------------------------

// Without the channel's answers, disabling the ring would strand those vCPUs: Xen keeps a
// vCPU paused by an unanswered request paused (the control for the next test).
TEST(VmEventChannel, DisablingTheRingUnansweredStrandsTheVcpu) {
  Dom0Guest g(hvm(1, 0));
  auto ring = g.hv->monitor_enable(g.dom);
  ASSERT_TRUE(ring);
  ASSERT_TRUE(g.hv->monitor_software_breakpoint(g.dom, true));
  const std::uint64_t fn = g.sym("sys_read");
  auto gm = g.memory_view();
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0xcc));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(eventually([&] { return g.hv->get_vcpu_regs(g.dom, VcpuId{0})->rip == fn; }));
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(gm->write_u8(Gva{fn}, 0x0f));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.hv->monitor_disable(g.dom));
  auto before = g.stats(0).iterations;
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(g.stats(0).iterations, before);
  EXPECT_EQ(g.hv->get_vcpu_regs(g.dom, VcpuId{0})->rip, fn) << "stuck";
}

// detach answers every pending request (also those of vCPUs waiting for ring room) before
// it disables the ring: no vCPU stays paused.
TEST(VmEventChannel, DetachWithStopsPendingLeavesNoVcpuPaused) {
  SimOptions o;
  o.ring_slots = 1;
  const std::uint64_t iters = 2;
  auto ref = reference(3, iters);
  Rig r(hvm(3, iters), Mode::Icebp, o);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_getppid");
  const std::uint8_t orig = r.byte_at(fn);
  r.patch(fn, 0xf1);
  r.start();
  // Nobody processes: one vCPU in the ring, two waiting for room.
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 3); }));
  r.patch(fn, orig);  // the engine restores its bytes before the channel detaches
  auto d = r.ch->detach(r.g.dom);
  ASSERT_TRUE(d) << d.error().what;
  EXPECT_EQ(r.g.host->op_count(Op::MonitorDisable), 1u);
  EXPECT_EQ(r.rec.responses.size(), 3u) << "one answer per stopped vCPU";
  for (const auto& rsp : r.rec.responses) EXPECT_EQ(rsp.flags, kPaused);
  ASSERT_TRUE(r.g.host->wait_halted(r.g.dom, 60s)) << "a vCPU stayed paused";
  for (unsigned v = 0; v < 3; ++v) {
    EXPECT_EQ(r.g.stats(v).calls[DEMO_FN_GETPPID], expected_calls(DEMO_FN_GETPPID, iters));
    EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  }
  EXPECT_EQ(r.g.host->pause_count(r.g.dom).value_or(99), 0u) << "the channel's own pause was released";
  // The ring is gone: another monitor can take the domain.
  EXPECT_TRUE(r.g.host->open()->monitor_enable(r.g.dom));
}

// flush (domain paused by the caller) hands the sink every stop still in the ring.
TEST(VmEventChannel, FlushHandlesEveryPendingStop) {
  SimOptions o;
  o.ring_slots = 1;
  Rig r(hvm(3, 2), Mode::Int3, o);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_unlink");
  r.patch(fn, 0xcc);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  r.start();
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 3); }));
  ASSERT_TRUE(r.g.hv->pause(r.g.dom));
  auto n = r.ch->flush(r.g.dom, sink);
  ASSERT_TRUE(n) << n.error().what;
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(sink.stops.size(), 3u);
  for (unsigned v = 0; v < 3; ++v) {
    auto regs = r.g.hv->get_vcpu_regs(r.g.dom, VcpuId{v});
    EXPECT_EQ(regs->rip, fn + 5) << "resumed (and held by the caller's pause only)";
  }
  ASSERT_TRUE(r.g.hv->unpause(r.g.dom));
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
}

// Two domains on one handle: one fd for both, each served; detaching one leaves the other
// watched (the simulated Xen gives both rings the same fd).
TEST(VmEventChannel, TwoDomainsShareOneFd) {
  Rig r(hvm(1, 3), Mode::Icebp);
  auto dom2 = r.g.host->create_domain(hvm(1, 3));
  ASSERT_TRUE(dom2);
  r.attach();
  ASSERT_TRUE(r.ch->attach(*dom2));
  const std::uint64_t fn = r.g.sym("sys_open");  // the same kernel at the same address
  r.patch(fn, 0xf1);
  auto m2 = r.g.memory_view(*dom2);
  ASSERT_TRUE(m2->write_u8(Gva{fn}, 0xf1));
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  ASSERT_TRUE(r.g.hv->unpause(*dom2));
  ASSERT_TRUE(r.run(sink, [&] { return r.g.host->wait_halted(*dom2, 0ms); }));
  ASSERT_EQ(sink.stops.size(), expected_calls(DEMO_FN_OPEN, 3));
  for (const Stop& s : sink.stops) EXPECT_EQ(s.domain, *dom2);
  ASSERT_TRUE(r.ch->detach(*dom2));
  // Domain 1 still wakes the channel's fd.
  r.start();
  pollfd p{r.ch->fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1) << "the shared fd was left in the poll set";
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  ASSERT_EQ(sink.stops.size(), 2 * expected_calls(DEMO_FN_OPEN, 3));
  for (std::size_t i = expected_calls(DEMO_FN_OPEN, 3); i < sink.stops.size(); ++i)
    EXPECT_EQ(sink.stops[i].domain, r.g.dom);
}

}  // namespace
}  // namespace xenprobes::testing
