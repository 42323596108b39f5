// The guest module's side of a hit (guest-module/xp_logic.c): Dom0's answer, which registers it
// may set, and the mailbox state machine with its timeouts and the claim bound.
#include "module/module_logic_fixture.hpp"

namespace {

using namespace module_logic;

// ---- Dom0's answer ----

TEST(ModuleAnswer, TakesGprsRipAndOnlyArithmeticFlags) {
  Guest g;
  auto b = g.bounds();
  auto hit = regs_at(kText + 0x100);
  hit.rflags = 0x2 | kRflagsIf | kRflagsDf | XP_RFLAGS_ZF;
  xenprobes_regs ans = hit;
  ans.rax = 0xdead;
  ans.r15 = 0xbeef;
  ans.rsp = hit.rsp - 8;
  ans.rip = kOea + 0x80;
  ans.rflags = XP_RFLAGS_CF | XP_RFLAGS_TF | XP_RFLAGS_OF | 0x3000 /* IOPL */;  // IF/DF/ZF clear
  ans.cs = 0x33;                                                                // user cs: must be ignored
  ans.ss = 0x2b;
  xenprobes_regs out{};
  ASSERT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_OK);
  EXPECT_EQ(out.rax, 0xdeadu);
  EXPECT_EQ(out.r15, 0xbeefu);
  EXPECT_EQ(out.rbx, hit.rbx);
  EXPECT_EQ(out.rsp, hit.rsp - 8);
  EXPECT_EQ(out.rip, kOea + 0x80);
  // TF set by Dom0 is dropped: the guest would take a #DB its kernel WARNs about.
  EXPECT_EQ(out.rflags, 0x2 | kRflagsIf | kRflagsDf | XP_RFLAGS_CF | XP_RFLAGS_OF);
  EXPECT_EQ(out.cs, 0x10u);
  EXPECT_EQ(out.ss, 0x18u);
}

TEST(ModuleAnswer, TrapFlagStaysTheGuests) {
  Guest g;
  auto b = g.bounds();
  auto hit = regs_at(kText + 0x100);
  auto ans = hit;
  ans.rflags = hit.rflags | XP_RFLAGS_TF;  // a handler setting TF
  xenprobes_regs out{};
  ASSERT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_OK);
  EXPECT_EQ(out.rflags & XP_RFLAGS_TF, 0u);
  EXPECT_EQ(out.rflags, hit.rflags);
  // A guest that had TF itself (a kernel debugger stepping) keeps it whatever Dom0 says.
  hit.rflags |= XP_RFLAGS_TF;
  ans.rflags = hit.rflags & ~XP_RFLAGS_TF;
  ASSERT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_OK);
  EXPECT_EQ(out.rflags & XP_RFLAGS_TF, XP_RFLAGS_TF);
}

TEST(ModuleAnswer, RefusesRipOutsideTextAndWildStacks) {
  Guest g;
  auto b = g.bounds();
  auto hit = regs_at(kText + 0x100);
  xenprobes_regs out = regs_at(0x42);
  const xenprobes_regs untouched = out;
  for (std::uint64_t rip :
       std::initializer_list<std::uint64_t>{0x0, 0x400000, kStack, kModulesEnd, 0xffff888000000000}) {
    auto ans = hit;
    ans.rip = rip;
    EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_BAD_RIP) << std::hex << rip;
  }
  auto ans = hit;
  ans.rsp = hit.rsp + XP_RSP_SLACK;  // ret imm16 0xffff: still fine
  EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_OK);
  out = untouched;
  ans.rsp = hit.rsp + XP_RSP_SLACK + 8;
  EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_BAD_RSP);
  ans.rsp = hit.rsp - XP_RSP_SLACK - 8;
  EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_BAD_RSP);
  ans.rsp = 0;
  EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_BAD_RSP);
  EXPECT_EQ(std::memcmp(&out, &untouched, sizeof out), 0);
}

TEST(ModuleAnswer, SnapshotCopiesEveryRegister) {
  xenprobes_regs src;
  auto* words = reinterpret_cast<std::uint64_t*>(&src);
  for (std::size_t i = 0; i < sizeof src / 8; ++i) words[i] = 0x1000 + i;
  xenprobes_regs dst{};
  xp_regs_snapshot(&dst, &src);
  EXPECT_EQ(std::memcmp(&dst, &src, sizeof src), 0);
}

// ---- the mailbox state machine ----

TEST(ModuleMailbox, RouteToDom0OnlyWhenEverythingIsFine) {
  EXPECT_EQ(xp_route_hit(false, false, false, 0, 4), XP_ROUTE_PUBLISH);
  EXPECT_EQ(xp_route_hit(false, false, false, 3, 4), XP_ROUTE_PUBLISH);
  EXPECT_EQ(xp_route_hit(true, false, false, 0, 4), XP_ROUTE_FALLBACK);   // Dom0 gone
  EXPECT_EQ(xp_route_hit(false, true, false, 0, 4), XP_ROUTE_FALLBACK);   // detaching
  EXPECT_EQ(xp_route_hit(false, false, true, 0, 4), XP_ROUTE_FALLBACK);   // nested hit
  EXPECT_EQ(xp_route_hit(false, false, false, 4, 4), XP_ROUTE_FALLBACK);  // no mailbox
  EXPECT_EQ(xp_route_hit(false, false, false, 0, 0), XP_ROUTE_FALLBACK);
}

TEST(ModuleMailbox, WaitEndsOnlyOnThisHitsAnswer) {
  const std::uint32_t seq = 7;
  const std::uint64_t claim = 2000;  // the claim deadline, past the deadline (100)
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_HIT, 6, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 7, seq, 10, 100, claim, false), XP_WAIT_DONE);
  // A DONE for an older hit (a late answer to an abandoned one) is not ours.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 6, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  // Garbage states written by Dom0 do not end the wait either.
  EXPECT_EQ(xp_wait_step(0x12345678, 7, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_IDLE, 7, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_ABANDONED, 7, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  // The deadline; an answer that is there wins over it.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_HIT, 6, seq, 100, 100, claim, false), XP_WAIT_TIMEOUT);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 7, seq, 200, 100, claim, false), XP_WAIT_DONE);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 7, seq, 5000, 100, claim, false), XP_WAIT_DONE);
  // Garbage past the deadline: time out (it is not a claim).
  EXPECT_EQ(xp_wait_step(0x12345678, 7, seq, 100, 100, claim, false), XP_WAIT_TIMEOUT);
  // Detaching gives up at once.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_HIT, 6, seq, 10, 100, claim, true), XP_WAIT_TIMEOUT);
  // seq wraps around: 0xffffffff + 1 == 0 is just another value.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 0, 0, 10, 100, claim, false), XP_WAIT_DONE);
}

TEST(ModuleMailbox, AClaimedHitIsWaitedForUpToTheClaimBound) {
  const std::uint32_t seq = 7;
  // Before the deadline, claimed or not: wait.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 10, 100, 2000, false), XP_WAIT_AGAIN);
  // Past the deadline a claim keeps the vCPU waiting: Dom0's handlers run on its stack.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 100, 100, 2000, false), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 1999, 100, 2000, false), XP_WAIT_AGAIN);
  // Even when detaching (give_up): the claim is honoured up to its bound.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 10, 100, 2000, true), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 2000, 100, 2000, true), XP_WAIT_TIMEOUT);
  // The hard bound.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 2000, 100, 2000, false), XP_WAIT_TIMEOUT);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, ~0ull, 100, 2000, false), XP_WAIT_TIMEOUT);
  // Given back (HIT again) past the deadline: time out now, not at the bound.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_HIT, 6, seq, 150, 100, 2000, false), XP_WAIT_TIMEOUT);
  // The answer still wins.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 7, seq, 1500, 100, 2000, false), XP_WAIT_DONE);
}

TEST(ModuleMailbox, ClaimBound) {
  // max(timeout, min(20 x timeout, 10 s)).
  EXPECT_EQ(XENPROBES_CLAIM_FACTOR, 20u);
  EXPECT_EQ(XENPROBES_CLAIM_MAX_MS, 10000u);
  EXPECT_EQ(xp_claim_bound_ms(1), 20u);
  EXPECT_EQ(xp_claim_bound_ms(20), 400u);
  EXPECT_EQ(xp_claim_bound_ms(500), 10000u);  // the module's default timeout
  EXPECT_EQ(xp_claim_bound_ms(499), 9980u);
  EXPECT_EQ(xp_claim_bound_ms(5000), 10000u);                // the module's largest timeout
  EXPECT_EQ(xp_claim_bound_ms(20000), 20000u);               // never below the timeout itself
  EXPECT_EQ(xp_claim_bound_ms(0xffffffffu), 0xffffffffull);  // no overflow
  EXPECT_EQ(xp_claim_bound_ms(0), 0u);
}

TEST(ModuleMailbox, GivingUpAbandonsOrWaitsOrTakesTheAnswer) {
  const std::uint32_t seq = 9;
  // Dom0 completed the answer after the last check: use it, whenever and however often.
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_DONE, 9, seq, false, 0), XP_GIVE_UP_ANSWERED);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_DONE, 9, seq, true, 100), XP_GIVE_UP_ANSWERED);
  // A DONE for another hit is garbage: abandon regardless.
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_DONE, 8, seq, false, 0), XP_GIVE_UP_FORCE);
  // Claimed at the last moment: keep waiting while within the bound (however many tries).
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, false, 0), XP_GIVE_UP_WAIT);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, false, 1000), XP_GIVE_UP_WAIT);
  // Past the bound: swap from CLAIMED (Dom0 died mid-handler), a few times at most.
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, true, 0), XP_GIVE_UP_SWAP);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, true, XP_GIVE_UP_TRIES - 2), XP_GIVE_UP_SWAP);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, true, XP_GIVE_UP_TRIES - 1), XP_GIVE_UP_FORCE);
  // Given back (HIT after our swap from CLAIMED failed): swap from HIT.
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_HIT, 0, seq, false, 1), XP_GIVE_UP_SWAP);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_HIT, 0, seq, true, XP_GIVE_UP_TRIES - 1), XP_GIVE_UP_FORCE);
  // Anything else Dom0 must not write: abandon.
  for (std::uint32_t st : {XENPROBES_MBOX_IDLE, XENPROBES_MBOX_ABANDONED, 5u, 0x12345678u, 0xffffffffu}) {
    EXPECT_EQ(xp_give_up_step(st, seq, seq, false, 0), XP_GIVE_UP_FORCE) << st;
    EXPECT_EQ(xp_give_up_step(st, seq, seq, true, 0), XP_GIVE_UP_FORCE) << st;
  }
}

// The exchange as xp_exchange.c runs it (xp_wait, then the give-up loop), on a mailbox whose state
// a scripted Dom0 changes at given times. Returns how the hit ended and when.
struct Exchange {
  enum End { Answered, Abandoned } end;
  std::uint64_t at;  // time the wait ended
  unsigned swaps;    // compare-and-swaps tried
  std::uint32_t final_state;
};
Exchange run_exchange(std::uint64_t timeout, std::uint64_t claim_bound, bool detaching, const Dom0Script& dom0) {
  const std::uint32_t seq = 5;
  std::uint32_t state = XENPROBES_MBOX_HIT, answer_seq = 0;
  std::uint64_t now = 0;
  const std::uint64_t deadline = timeout, claim_deadline = claim_bound;
  auto wait = [&] {
    for (;;) {
      dom0(now, state, answer_seq);
      enum xp_wait w = xp_wait_step(state, answer_seq, seq, now, deadline, claim_deadline, detaching);
      if (w != XP_WAIT_AGAIN) return w;
      ++now;  // one poll slice
    }
  };
  Exchange r{Exchange::Abandoned, 0, 0, 0};
  enum xp_wait w = wait();
  std::uint32_t expected = XENPROBES_MBOX_HIT, tries = 0;
  while (w == XP_WAIT_TIMEOUT) {
    dom0(now, state, answer_seq);  // Dom0 may act between the last check and the swap
    ++r.swaps;
    if (r.swaps > 1) ++now;  // a round takes time: the clock moves on
    const std::uint32_t seen = state;
    if (seen == expected) {
      state = XENPROBES_MBOX_ABANDONED;
      r.at = now;
      r.final_state = state;
      return r;
    }
    switch (xp_give_up_step(seen, answer_seq, seq, now >= claim_deadline, tries++)) {
      case XP_GIVE_UP_ANSWERED: w = XP_WAIT_DONE; break;
      case XP_GIVE_UP_WAIT:
        w = wait();
        expected = XENPROBES_MBOX_HIT;
        break;
      case XP_GIVE_UP_SWAP: expected = seen; break;
      case XP_GIVE_UP_FORCE:
        state = XENPROBES_MBOX_ABANDONED;
        r.at = now;
        r.final_state = state;
        return r;
    }
  }
  r.end = Exchange::Answered;
  r.at = now;
  r.final_state = state;
  return r;
}

TEST(ModuleMailbox, ExchangeUnclaimedHitIsAbandonedAtTheTimeout) {
  auto r = run_exchange(100, 2000, false, [](std::uint64_t, std::uint32_t&, std::uint32_t&) {});
  EXPECT_EQ(r.end, Exchange::Abandoned);
  EXPECT_EQ(r.at, 100u);
  EXPECT_EQ(r.swaps, 1u);
}

TEST(ModuleMailbox, ExchangeASlowHandlerIsWaitedFor) {
  // Claimed at 50, answered at 700: far past the timeout, within the claim bound.
  auto r = run_exchange(100, 2000, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now == 50 && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now == 700 && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.end, Exchange::Answered);
  EXPECT_EQ(r.at, 700u);
  EXPECT_EQ(r.swaps, 0u);
}

TEST(ModuleMailbox, ExchangeAClaimAtTheLastMomentIsHonoured) {
  // Dom0 claims between the module's last check and its swap: the swap fails on CLAIMED, the
  // module waits on, and takes the answer.
  int looks_at_100 = 0;
  auto r = run_exchange(100, 2000, false, [&](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    // The first look at 100 is the wait's last check (HIT: time out); the second, the swap.
    if (now == 100 && ++looks_at_100 == 2) st = XENPROBES_MBOX_CLAIMED;
    if (now == 300 && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.end, Exchange::Answered);
  EXPECT_EQ(r.at, 300u);
  EXPECT_EQ(r.swaps, 1u);
}

TEST(ModuleMailbox, ExchangeAClaimNeverFinishedEndsAtTheBound) {
  // Dom0 claims, then dies: the module takes the fallback at the claim bound, swapping from
  // CLAIMED.
  auto r = run_exchange(100, 2000, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now == 10 && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
  });
  EXPECT_EQ(r.end, Exchange::Abandoned);
  EXPECT_GE(r.at, 2000u);  // the bound, plus the second swap's moment
  EXPECT_LE(r.at, 2001u);
  EXPECT_EQ(r.swaps, 2u);  // from HIT (found CLAIMED), then from CLAIMED
  EXPECT_EQ(r.final_state, XENPROBES_MBOX_ABANDONED);
  // Detaching changes nothing about a claim.
  auto d = run_exchange(100, 2000, true, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now == 0 && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
  });
  EXPECT_EQ(d.end, Exchange::Abandoned);
  EXPECT_GE(d.at, 2000u);
  EXPECT_LE(d.at, 2001u);
}

TEST(ModuleMailbox, ExchangeAHitGivenBackIsAbandonedWithoutWaitingForTheBound) {
  auto r = run_exchange(100, 2000, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now == 10 && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now == 400 && st == XENPROBES_MBOX_CLAIMED) st = XENPROBES_MBOX_HIT;  // refused after the claim
  });
  EXPECT_EQ(r.end, Exchange::Abandoned);
  EXPECT_EQ(r.at, 400u);
}

TEST(ModuleMailbox, ExchangeADom0FlippingStatesCannotHoldTheHookPastTheBound) {
  // Every look at the state sees another value: the hook still ends, by the bound.
  std::uint64_t looks = 0;
  auto r = run_exchange(100, 2000, false, [&](std::uint64_t, std::uint32_t& st, std::uint32_t&) {
    st = ++looks % 2 ? XENPROBES_MBOX_CLAIMED : XENPROBES_MBOX_HIT;
  });
  EXPECT_EQ(r.end, Exchange::Abandoned);
  EXPECT_LE(r.at, 2000u);
  EXPECT_LE(r.swaps, 2000u + XP_GIVE_UP_TRIES);
  // Past the bound a state that changes under every swap: at most XP_GIVE_UP_TRIES swaps.
  auto p = run_exchange(100, 100, false, [&](std::uint64_t, std::uint32_t& st, std::uint32_t&) {
    st = ++looks % 2 ? XENPROBES_MBOX_CLAIMED : XENPROBES_MBOX_HIT;
  });
  EXPECT_EQ(p.end, Exchange::Abandoned);
  EXPECT_LE(p.swaps, XP_GIVE_UP_TRIES);
  // Garbage: abandoned at the timeout, not waited for.
  auto g = run_exchange(100, 2000, false, [](std::uint64_t, std::uint32_t& st, std::uint32_t&) { st = 77; });
  EXPECT_EQ(g.end, Exchange::Abandoned);
  EXPECT_EQ(g.at, 100u);
}

TEST(ModuleMailbox, Dom0IsGoneAfterDeadAfterTimeoutsInARow) {
  for (std::uint32_t n = 0; n < XENPROBES_DEAD_AFTER; ++n) EXPECT_FALSE(xp_dead_after(n)) << n;
  EXPECT_TRUE(xp_dead_after(XENPROBES_DEAD_AFTER));
  EXPECT_TRUE(xp_dead_after(XENPROBES_DEAD_AFTER + 1));
}

TEST(ModuleMailbox, FlagsMergeKeepsEverythingButArithmetic) {
  EXPECT_EQ(XP_RFLAGS_FROM_DOM0, 0x8d5ull);           // CF PF AF ZF SF OF
  EXPECT_EQ(XP_RFLAGS_FROM_DOM0 & XP_RFLAGS_TF, 0u);  // never TF
  EXPECT_EQ(xp_merge_flags(0x246, 0), 0x202ull);      // ZF, PF dropped; IF kept
  EXPECT_EQ(xp_merge_flags(0x2, ~0ull), 0x2ull | 0x8d5ull);
  EXPECT_EQ(xp_merge_flags(0x202, 0x302), 0x202ull);  // Dom0's TF ignored
  EXPECT_EQ(xp_merge_flags(0x302, 0x202), 0x302ull);  // the guest's own TF kept
}

}  // namespace
