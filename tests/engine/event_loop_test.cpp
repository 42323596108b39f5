// The session's event loop (Session::run_once): every channel looks on every wake-up, the
// timeout's included, not only the channel whose fd woke the loop.
#include <poll.h>

#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {
namespace {

// A guest-channel hit whose notification never reaches the loop (swallowed here, as a late or
// lost /dev/xen/evtchn wake-up on a real Dom0 would leave it: docs/e2e.md "Open") is handled
// on the next wake-up all the same, even one that is only the poll's timeout. A loop that let
// only the channel whose fd is readable look would leave it to the module's timeout.
TEST(EventLoop, AHitWhoseNotificationWasLostIsFoundOnTheTimeoutsWakeUp) {
  hv::sim::SimOptions o;
  o.manual_clock = true;  // the module waits for Dom0 however long the test takes
  auto host = hv::sim::SimHost::create(o);
  hv::sim::DomainConfig c;
  c.type = hv::GuestType::Pv;
  c.iterations = 2;
  c.start_paused = true;
  DomId dom = *host->create_domain(c);
  auto s = Session::open(host->open(), SessionOptions{ChannelKind::Guest});
  ASSERT_TRUE(s) << s.error().what;
  Session& session = **s;
  ASSERT_TRUE(session.load_symbols(dom, demo_map()));
  std::uint64_t hits = 0;
  auto p = session.probe(dom, "sys_open", [&](HitContext&) { ++hits; return 0; });
  ASSERT_TRUE(p) << p.error().what;
  hv::Hypervisor& hv = session.hypervisor();
  ASSERT_TRUE(hv.unpause(dom));

  // The first hit: published and notified; the vCPU waits in the module for Dom0.
  auto end = std::chrono::steady_clock::now() + 30s;
  while (host->module_notifications(dom)->sent == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), end) << "no hit notified";
    ASSERT_TRUE(host->crash_reason(dom).empty()) << host->crash_reason(dom);
    std::this_thread::sleep_for(1ms);
  }
  // Its notification is taken away before the loop sees it.
  for (;;) {
    auto port = hv.evtchn_pending();
    ASSERT_TRUE(port) << port.error().what;
    if (!*port) break;
    ASSERT_TRUE(hv.evtchn_unmask(**port));
  }
  pollfd quiet{hv.evtchn_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&quiet, 1, 0), 0) << "the event channel still says something is pending";

  auto r = session.run_once(5);
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(*r, 1u) << "the hit waited for a notification that never came";
  EXPECT_EQ(hits, 1u);

  for (int i = 0; i < 20000 && !host->wait_halted(dom, 0ms); ++i) {
    ASSERT_TRUE(host->crash_reason(dom).empty()) << host->crash_reason(dom);
    ASSERT_TRUE(session.run_once(2));
  }
  ASSERT_TRUE(host->wait_halted(dom, 0ms));
  EXPECT_EQ(hits, expected_calls(DEMO_FN_OPEN, 2));
  EXPECT_EQ(host->module_notifications(dom)->skipped, 0u);
}

}  // namespace
}  // namespace xenprobes::testing
