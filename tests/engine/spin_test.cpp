// Spinning instead of notifying on the guest channel (protocol.h "Spinning"): with
// SessionOptions::spin_us Dom0 keeps polling the mailboxes after a hit and the module sends no
// notification while it does; a module spinning on its mailbox gets its answer without one.
// Counts stay exact either way, and without spinning every hit is notified as before. The
// module counts the notifications it skips in the control header (notify_skipped), and Dom0
// reads exactly the module's count.
#include <atomic>
#include <iostream>
#include <memory>
#include <thread>

#include "api/session_testing.hpp"
#include "engine/engine_fixture.hpp"
#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::testing {
namespace {

constexpr std::uint64_t kIterations = 40;

struct SpinRun {
  std::uint64_t hits = 0;
  hv::sim::SimHost::ModuleNotifications module;  // the module's notifications to Dom0
  std::uint64_t to_guest = 0;                    // Dom0's notifications to the module
  std::uint64_t notify_skipped = 0;              // header.notify_skipped, as Dom0 reads it
};

// `dom0_says_polling`: the test, not Dom0, sets header.dom0_polling once the probe is in (Dom0
// without spin_us never writes it after attaching): every hit skips its notification, and
// Dom0 finds each when its poll() times out (run_once(2)) and looks at the mailboxes anyway.
//
// `dom0_time_per_hit`: Dom0's spin measures its time on a virtual clock (SessionTesting::
// set_spin_clock) that moves only by that much in each handler, and jumps past every bound
// once the guest has halted or crashed (nothing more to wait for). A spin then sees the same
// number of hits however the machine schedules the guest's and Dom0's threads.
//
// `after_the_spin`: each handler returns only once vCPU 0's mailbox says spinning = 0 (the
// module's spin ran out and it cleared the flag), however long the module's thread takes.
SpinRun spin_run(unsigned module_spin_us, unsigned dom0_spin_us, bool after_the_spin = false,
                 bool dom0_says_polling = false, std::chrono::microseconds dom0_time_per_hit = {}) {
  auto cfg = demo_config(1, kIterations);
  cfg.module_spin_us = module_spin_us;
  ProbedGuest g(cfg, {}, {}, dom0_spin_us);
  SpinRun r;
  auto virtual_now = std::make_shared<std::atomic<std::int64_t>>(0);  // µs since the clock's epoch
  if (dom0_time_per_hit.count()) {
    using Clock = std::chrono::steady_clock;
    SessionTesting::set_spin_clock(*g.session, [virtual_now, host = g.host, dom = g.dom] {
      if (host->wait_halted(dom, 0ms) || !host->crash_reason(dom).empty())
        return Clock::time_point(Clock::duration::max() / 2);
      return Clock::time_point(std::chrono::microseconds(virtual_now->load()));
    });
  }
  xenprobes_ctl_header header{};
  EXPECT_TRUE(g.host->peek(g.dom, g.host->layout(g.dom)->control_addr, std::as_writable_bytes(std::span(&header, 1))));
  const std::uint64_t spinning_at =
      g.host->layout(g.dom)->control_addr + header.mailbox_offset + offsetof(xenprobes_mailbox, spinning);
  auto p = g.session->probe(g.dom, "sys_getppid", [&](HitContext&) {
    ++r.hits;
    // (At most 30 s, then an answer to a spinning module fails the test rather than hang it.)
    const auto give_up = std::chrono::steady_clock::now() + 30s;
    for (std::uint32_t spinning = 1; after_the_spin && spinning && std::chrono::steady_clock::now() < give_up;) {
      if (!g.host->peek(g.dom, spinning_at, std::as_writable_bytes(std::span(&spinning, 1)))) break;
      if (spinning) std::this_thread::sleep_for(50us);
    }
    *virtual_now += dom0_time_per_hit.count();
    return 0;
  });
  EXPECT_TRUE(p) << p.error().what;
  if (dom0_says_polling) {
    auto gv = GuestView::open(g.session->hypervisor(), g.dom);
    EXPECT_TRUE(gv);
    const std::uint32_t on = 1;
    if (gv) {
      EXPECT_TRUE((*gv)->write(Gva{g.host->layout(g.dom)->control_addr + offsetof(xenprobes_ctl_header, dom0_polling)},
                               std::as_bytes(std::span(&on, 1))));
    }
  }
  g.start();
  EXPECT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], expected_calls(DEMO_FN_GETPPID, kIterations));
  if (auto m = g.host->module_notifications(g.dom)) r.module = *m;
  auto port =
      g.session->hypervisor().xs_read("/local/domain/" + std::to_string(g.dom.value) + "/data/xenprobes/evtchn");
  EXPECT_TRUE(port);
  if (port)
    if (auto n = g.host->guest_evtchn_notifications(g.dom, static_cast<std::uint32_t>(std::stoul(*port))))
      r.to_guest = *n;
  auto c = SessionTesting::module_counters(*g.session, g.dom);
  EXPECT_TRUE(c) << c.error().what;
  if (c) r.notify_skipped = c->notify_skipped;
  EXPECT_EQ(r.notify_skipped, r.module.skipped) << "Dom0 reads the module's count exactly";
  // The public surface gives the same count (no async probe here: no rings, still the count).
  auto rs = g.session->ring_stats(g.dom);
  EXPECT_TRUE(rs) << rs.error().what;
  if (rs) {
    EXPECT_EQ(rs->notify_skipped, r.module.skipped) << "Session::ring_stats() reads the module's count";
    EXPECT_EQ(rs->rings, 0u);
  }
  return r;
}

TEST(Spin, WithoutSpinningEveryHitAndEveryAnswerIsNotified) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  const SpinRun r = spin_run(0, 0);
  EXPECT_EQ(r.hits, expected_calls(DEMO_FN_GETPPID, kIterations));
  EXPECT_EQ(r.module.skipped, 0u);
  EXPECT_EQ(r.notify_skipped, 0u);
  EXPECT_EQ(r.module.sent, r.hits);
  EXPECT_GE(r.to_guest, r.hits) << "one notification per answering round at least";
}

// While header.dom0_polling is set the module notifies no hit and counts each one it skips: with
// the flag set for the whole run, exactly every hit.
TEST(Spin, EveryHitWhileDom0SaysItPollsIsACountedSkippedNotification) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  const SpinRun r = spin_run(0, 0, false, true);
  EXPECT_EQ(r.hits, expected_calls(DEMO_FN_GETPPID, kIterations));
  EXPECT_EQ(r.module.sent, 0u);
  EXPECT_EQ(r.notify_skipped, r.hits);
}

// Dom0 polls for up to 1 s after each hit (at most 10 ms at a time), the module spins up to
// 1 s, longer than any answer takes. Dom0's time is virtual, 0.5 ms per hit: a Dom0 spin that
// got its turn for real microseconds saw fewer hits per 10 ms turn the more the machine was
// loaded (each turn's end costs a notified hit or two: 19 to 38 skipped of 80 at a load of
// 10). Now every turn but the last answers exactly 20 hits and follows one answered outside
// a turn, so there are at most 1 + (80 - 1) / 21 = 4 turns, whatever the scheduling. A hit
// goes notified only if the module reads dom0_polling outside a turn: before the first, at
// most 2 (the first hit, and the next one if it comes before Dom0 sets the flag); between two
// turns at most 4, since Dom0 answers at most 2 hits there (the turn's last look, the hit
// that starts the next turn) and the guest hits again only once answered; after the last, 2.
// At most 4 per turn, 16 of 80 (a Dom0 whose turn ended after each hit notified 28).
TEST(Spin, Dom0PollingSparesTheModulesNotificationsAndASpinningModuleDom0s) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  const SpinRun r = spin_run(1'000'000, 1'000'000, false, false, 500us);
  EXPECT_EQ(r.hits, expected_calls(DEMO_FN_GETPPID, kIterations)) << "every hit handled exactly once";
  EXPECT_EQ(r.module.sent + r.module.skipped, r.hits);
  EXPECT_EQ(r.module.sent + r.notify_skipped, r.hits) << "every hit not notified is counted in the header";
  const std::uint64_t turns = 1 + (r.hits - 1) / 21;
  EXPECT_LE(r.module.sent, 4 * turns) << "a hit is notified only outside Dom0's turns of polling";
  EXPECT_GT(r.module.skipped, r.hits / 2) << "most hits came while Dom0 polled: no notification";
  EXPECT_LT(r.to_guest, r.hits / 2) << "most answers went to a spinning module: no notification";
  std::cout << "spin: " << r.hits << " hits, " << r.module.sent << " notified, " << r.module.skipped << " skipped; "
            << r.to_guest << " answers notified\n";
}

// The module's spin (20 µs) runs out before Dom0 answers (each handler waits until the module
// has cleared its flag): it blocks, so Dom0 must notify every answer. A Dom0 that skipped it
// would leave the vCPU waiting for its timeout, which the guest channel's manual clock never
// lets come: the run would not finish. (Handlers that took 2 ms of real time instead let a
// loaded machine's module thread clear the flag after the answer: 54 of 72 notified.)
TEST(Spin, ASpinThatRunsOutIsWokenByANotification) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  const SpinRun r = spin_run(20, 0, true);
  EXPECT_EQ(r.hits, expected_calls(DEMO_FN_GETPPID, kIterations));
  EXPECT_EQ(r.notify_skipped, 0u) << "Dom0 never polled: every hit notified";
  EXPECT_GE(r.to_guest, r.hits) << "every answer notified: the module had stopped spinning";
}

}  // namespace
}  // namespace xenprobes::testing
