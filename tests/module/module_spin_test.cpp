// The guest module spinning on its mailbox instead of waiting for a notification
// (guest-module/xp_logic.c; protocol.h "Spinning instead of notifying").
#include "module/module_logic_fixture.hpp"

namespace {

using namespace module_logic;

// ---- spinning instead of notifying (protocol.h, "Spinning instead of notifying") ----

TEST(ModuleSpin, NotifyOnlyWhileDom0IsNotPolling) {
  EXPECT_TRUE(xp_hit_notify(0));
  // Any nonzero value Dom0 writes means "polling": the hit skips the notification.
  for (std::uint32_t v : {1u, 2u, 0x80000000u, 0xffffffffu}) EXPECT_FALSE(xp_hit_notify(v)) << v;
}

TEST(ModuleSpin, SpinUsIsBounded) {
  EXPECT_EQ(XP_SPIN_MAX_US, 1000);
  EXPECT_TRUE(xp_spin_us_ok(0));  // the default: never spin
  EXPECT_TRUE(xp_spin_us_ok(1));
  EXPECT_TRUE(xp_spin_us_ok(50));
  EXPECT_TRUE(xp_spin_us_ok(1000));
  EXPECT_FALSE(xp_spin_us_ok(1001));
  EXPECT_FALSE(xp_spin_us_ok(0x7fffffffu));
  EXPECT_FALSE(xp_spin_us_ok(0xffffffffu));
}

TEST(ModuleSpin, SpinEndIsMicrosecondsLaterAndSaturates) {
  EXPECT_EQ(xp_spin_until(0, 0), 0u);
  EXPECT_EQ(xp_spin_until(123, 0), 123u);
  EXPECT_EQ(xp_spin_until(0, 1), 1000u);
  EXPECT_EQ(xp_spin_until(5000, 1000), 5000u + 1000000u);
  EXPECT_EQ(xp_spin_until(7, 0xffffffffu), 7u + 0xffffffffull * 1000u);  // no 32-bit overflow
  // A clock near the top of its range: the end saturates instead of wrapping to the past.
  EXPECT_EQ(xp_spin_until(~0ull - 1001, 1), ~0ull - 1);
  EXPECT_EQ(xp_spin_until(~0ull - 1000, 1), ~0ull);  // just fits
  EXPECT_EQ(xp_spin_until(~0ull - 999, 1), ~0ull);   // would wrap: saturated
  EXPECT_EQ(xp_spin_until(~0ull - 999, 2), ~0ull);
  EXPECT_EQ(xp_spin_until(~0ull, 1000), ~0ull);
  EXPECT_EQ(xp_spin_until(~0ull, 0), ~0ull);
}

TEST(ModuleSpin, WaitStepsResultAlwaysWinsOverTheSpinBound) {
  const std::uint64_t until = 1000;
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, 0, until), XP_SPIN_AGAIN);
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, 999, until), XP_SPIN_AGAIN);
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, 1000, until), XP_SPIN_BLOCK);
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, ~0ull, until), XP_SPIN_BLOCK);
  for (std::uint64_t now : {0ull, 999ull, 1000ull, ~0ull}) {
    EXPECT_EQ(xp_spin_step(XP_WAIT_DONE, now, until), XP_SPIN_ENDED) << now;
    EXPECT_EQ(xp_spin_step(XP_WAIT_TIMEOUT, now, until), XP_SPIN_ENDED) << now;
  }
  // spin_us = 0 spins not even once (the module does not set `spinning` at all then).
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, 42, xp_spin_until(42, 0)), XP_SPIN_BLOCK);
}

// Step 2 as xp_exchange.c runs it (xp_wait() with its spin, xp_spin()), in nanoseconds, on a
// mailbox whose state a scripted Dom0 changes: a spin check costs 100 ns, a block in Xen one
// slice (1 ms) or up to the next deadline.
struct SpinWait {
  enum xp_wait w;
  std::uint64_t at;          // when the wait ended
  unsigned spin_checks = 0;  // checks made while `spinning` was 1
  bool spun_out = false;     // the spin bound passed unanswered (XP_SPIN_BLOCK)
  unsigned polls = 0;        // blocks in Xen (SCHEDOP_poll)
};
constexpr std::uint64_t kUs = 1000, kMs = 1000 * 1000;
SpinWait run_spin_wait(std::uint32_t spin_us, std::uint64_t deadline, std::uint64_t claim_deadline, bool detaching,
                       const Dom0Script& dom0) {
  const std::uint32_t seq = 5;
  std::uint32_t state = XENPROBES_MBOX_HIT, answer_seq = 0;
  std::uint64_t now = 0;
  SpinWait r{XP_WAIT_AGAIN, 0};
  auto check = [&] {
    dom0(now, state, answer_seq);
    return xp_wait_step(state, answer_seq, seq, now, deadline, claim_deadline, detaching);
  };
  if (spin_us) {
    const std::uint64_t until = xp_spin_until(now, spin_us);
    for (;;) {
      const enum xp_wait w = check();
      ++r.spin_checks;
      const enum xp_spin s = xp_spin_step(w, now, until);
      if (s == XP_SPIN_ENDED) {
        r.w = w;
        r.at = now;
        return r;
      }
      if (s == XP_SPIN_BLOCK) {
        r.spun_out = true;
        break;
      }
      now += 100;  // cpu_relax(), then the clock again
    }
  }
  for (;;) {  // the one more check after the spin, then the wait as before
    const enum xp_wait w = check();
    if (w != XP_WAIT_AGAIN) {
      r.w = w;
      r.at = now;
      return r;
    }
    ++r.polls;
    now += std::min((now < deadline ? deadline : claim_deadline) - now, kMs);
  }
}

TEST(ModuleSpin, NoSpinWaitsAsBefore) {
  auto r = run_spin_wait(0, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 30 * kUs && st == XENPROBES_MBOX_HIT) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.w, XP_WAIT_DONE);
  EXPECT_EQ(r.spin_checks, 0u);
  EXPECT_EQ(r.polls, 1u);  // the answer is found after the first block (the notification's wakeup)
  EXPECT_EQ(r.at, 1 * kMs);
}

TEST(ModuleSpin, AnAnswerWithinTheSpinEndsItWithoutBlocking) {
  auto r = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 30 * kUs && st == XENPROBES_MBOX_HIT) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.w, XP_WAIT_DONE);
  EXPECT_EQ(r.at, 30 * kUs);
  EXPECT_FALSE(r.spun_out);
  EXPECT_EQ(r.polls, 0u);
  // Claimed first, answered within the spin: the same.
  auto c = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 5 * kUs && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now >= 60 * kUs && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(c.w, XP_WAIT_DONE);
  EXPECT_EQ(c.at, 60 * kUs);
  EXPECT_EQ(c.polls, 0u);
}

TEST(ModuleSpin, AnAnswerAfterTheSpinIsWaitedForAsBefore) {
  auto r = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 250 * kUs && st == XENPROBES_MBOX_HIT) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.w, XP_WAIT_DONE);
  EXPECT_TRUE(r.spun_out);
  EXPECT_EQ(r.spin_checks, 1001u);  // every 100 ns from 0 to the bound (100 us) included
  EXPECT_EQ(r.polls, 1u);
  EXPECT_EQ(r.at, 100 * kUs + 1 * kMs);
  // An answer that lands after the spin's last check (Dom0 read spinning == 1 and skipped the
  // notification) is found by the one more check after spinning = 0, not after a block.
  unsigned looks = 0;
  auto b = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [&](std::uint64_t, std::uint32_t& st, std::uint32_t& as) {
    if (++looks == 1002 && st == XENPROBES_MBOX_HIT) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(b.w, XP_WAIT_DONE);
  EXPECT_TRUE(b.spun_out);
  EXPECT_EQ(b.spin_checks, 1001u);
  EXPECT_EQ(b.at, 100 * kUs);
  EXPECT_EQ(b.polls, 0u);
}

TEST(ModuleSpin, TheSpinNeverExtendsADeadline) {
  // The timeout comes before the spin bound: the hit times out at the timeout, not later.
  auto r = run_spin_wait(1000, 20 * kUs, 400 * kUs, false, [](std::uint64_t, std::uint32_t&, std::uint32_t&) {});
  EXPECT_EQ(r.w, XP_WAIT_TIMEOUT);
  EXPECT_EQ(r.at, 20 * kUs);
  EXPECT_FALSE(r.spun_out);
  EXPECT_EQ(r.polls, 0u);
  // A claim keeps it to the claim bound, spinning or not, and no further.
  auto c = run_spin_wait(1000, 20 * kUs, 400 * kUs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now >= 10 * kUs && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
  });
  EXPECT_EQ(c.w, XP_WAIT_TIMEOUT);
  EXPECT_EQ(c.at, 400 * kUs);
  EXPECT_FALSE(c.spun_out);  // the claim bound came first
  // A claim past the spin: the spin ends at its bound, the wait goes on to the answer.
  auto a = run_spin_wait(50, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 10 * kUs && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now >= 150 * kMs && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(a.w, XP_WAIT_DONE);
  EXPECT_TRUE(a.spun_out);
  EXPECT_GE(a.at, 150 * kMs);
  EXPECT_LT(a.at, 151 * kMs);
  // Given back (HIT again) past the deadline while spinning: time out at once.
  auto g = run_spin_wait(1000, 20 * kUs, 400 * kUs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now >= 5 * kUs && now < 30 * kUs && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now >= 30 * kUs && st == XENPROBES_MBOX_CLAIMED) st = XENPROBES_MBOX_HIT;
  });
  EXPECT_EQ(g.w, XP_WAIT_TIMEOUT);
  EXPECT_EQ(g.at, 30 * kUs);
}

TEST(ModuleSpin, DetachingEndsTheSpinButNotAClaim) {
  auto r = run_spin_wait(1000, 10 * kMs, 200 * kMs, true, [](std::uint64_t, std::uint32_t&, std::uint32_t&) {});
  EXPECT_EQ(r.w, XP_WAIT_TIMEOUT);
  EXPECT_EQ(r.at, 0u);
  EXPECT_EQ(r.spin_checks, 1u);
  auto c = run_spin_wait(1000, 10 * kMs, 200 * kMs, true, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now >= 3 * kMs && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(c.w, XP_WAIT_DONE);
  EXPECT_TRUE(c.spun_out);
  EXPECT_GE(c.at, 3 * kMs);
}

TEST(ModuleSpin, OnlyThisHitsAnswerEndsTheSpin) {
  // A DONE for an older seq (a late answer) or garbage: the spin runs out, then the timeout.
  for (std::uint32_t garbage : {XENPROBES_MBOX_DONE, XENPROBES_MBOX_IDLE, XENPROBES_MBOX_ABANDONED, 77u}) {
    auto r = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [&](std::uint64_t, std::uint32_t& st, std::uint32_t& as) {
      st = garbage;
      as = 4;
    });
    EXPECT_EQ(r.w, XP_WAIT_TIMEOUT) << garbage;
    EXPECT_TRUE(r.spun_out) << garbage;
    EXPECT_EQ(r.at, 10 * kMs) << garbage;
  }
}

}  // namespace
