// The guest channel when Dom0 dies or does not answer in time, over the simulated Xen: the
// module's fallbacks, the claim and its bound, and the module's clock.
#include <optional>

#include "guestch/guestch_fixture.hpp"

namespace xenprobes::testing {
namespace {

using channel::GuestChannel;

// ---- Dom0 gone ---------------------------------------------------------------------------

struct FallbackCase {
  const char* name;
  const char* function;
  x86::BranchKind kind;  // None: the nop5 at the entry, resumed after it
};

class GuestChannelNoAnswer : public ::testing::TestWithParam<FallbackCase> {};

// Dom0 attached, armed, then never answers: each hit waits for the timeout and resumes as
// the entry says (the fallback runs the real instruction: the results are exact); after
// XENPROBES_DEAD_AFTER of them the module restores the text and the guest runs on unprobed.
TEST_P(GuestChannelNoAnswer, TheGuestFinishesOnItsOwn) {
  constexpr std::uint64_t kIters = 4;
  ChannelGuest g(guest_config(1, kIters, 20));
  g.attach();
  std::uint64_t addr = 0;
  if (GetParam().kind == x86::BranchKind::None) {
    addr = g.sym(GetParam().function);
    g.arm_skip(GetParam().function);
  } else {
    for (const auto& i : g.function(GetParam().function))
      if (i.branch == GetParam().kind) {
        addr = i.address.value;
        break;
      }
    ASSERT_NE(addr, 0u) << "no such instruction in " << GetParam().function;
    g.arm(addr, TrapEntry::Fallback::Emulate);
  }
  const auto original = g.peek(addr, 1);
  ASSERT_EQ(g.peek(addr, 1)[0], 0xcc);
  g.start();
  ASSERT_TRUE(g.advance_until_halted(20ms)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).iterations, kIters);
  const auto h = g.header();
  EXPECT_EQ(h.timeouts, unsigned{XENPROBES_DEAD_AFTER});
  EXPECT_EQ(h.hits, unsigned{XENPROBES_DEAD_AFTER});
  EXPECT_EQ(h.dom0_gone, 1u);
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_ABANDONED);
  auto insn = x86::decode(g.peek(addr, 15), Gva{addr});
  ASSERT_TRUE(insn);
  EXPECT_NE(g.peek(addr, 1)[0], 0xcc) << "the module restored the byte";
  EXPECT_NE(g.host->console(g.dom).find("xenprobesU: Dom0 did not answer 3 hits in a row"), std::string::npos);
  // Dom0 coming back finds a module that gave up, and is told so.
  GuestChannel again(*g.hv);
  ASSERT_TRUE(g.ch->detach(g.dom));
  auto r = again.attach(g.dom);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Busy) << r.error().what;
}

INSTANTIATE_TEST_SUITE_P(Fallbacks, GuestChannelNoAnswer,
                         ::testing::Values(FallbackCase{"ResumeAt", "sys_open", x86::BranchKind::None},
                                           FallbackCase{"EmulateRet", "sys_getppid", x86::BranchKind::Ret},
                                           FallbackCase{"EmulateCall", "demo_recurse", x86::BranchKind::Call},
                                           FallbackCase{"EmulateJcc", "demo_recurse", x86::BranchKind::Jcc},
                                           FallbackCase{"EmulateJcc2", "demo_classify", x86::BranchKind::Jcc},
                                           FallbackCase{"EmulateJmp", "demo_dispatch", x86::BranchKind::Jmp}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(GuestChannelDom0Gone, KilledWhileVcpusWait) {
  constexpr unsigned kVcpus = 2;
  constexpr std::uint64_t kIters = 6;
  ChannelGuest g(guest_config(kVcpus, kIters, 30));
  g.attach();
  FakeSink sink;
  const char* fns[] = {"sys_open", "sys_read", "demo_recurse"};
  std::vector<std::uint64_t> addrs;
  std::vector<std::vector<std::uint8_t>> originals;
  for (const char* f : fns) {
    addrs.push_back(g.sym(f));
    originals.push_back(g.peek(g.sym(f), 5));
    sink.skip(g.sym(f));
    g.arm_skip(f);
  }
  g.start();
  // Dom0 serves a while, then dies with a vCPU waiting in the hook.
  ASSERT_TRUE(g.pump_until(sink, [&] { return sink.total >= 20; })) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.header().timeouts, 0u) << "the clock stood still while Dom0 served";
  ASSERT_TRUE(eventually([&] { return g.mailboxes_in(XENPROBES_MBOX_HIT, kVcpus) >= 1; }));
  g.kill_dom0();
  ASSERT_TRUE(g.advance_until_halted(30ms)) << g.host->crash_reason(g.dom);
  for (unsigned v = 0; v < kVcpus; ++v) {
    EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, kVcpus).checksum) << "vcpu " << v;
    EXPECT_EQ(g.stats(v).calls[DEMO_FN_OPEN], expected_calls(DEMO_FN_OPEN, kIters));
  }
  const auto h = g.header();
  EXPECT_EQ(h.dom0_gone, 1u);
  // The third timeout in a row declares Dom0 gone; a vCPU waiting at that moment is released
  // as one more.
  EXPECT_GE(h.timeouts, unsigned{XENPROBES_DEAD_AFTER});
  EXPECT_LE(h.timeouts, unsigned{XENPROBES_DEAD_AFTER} + kVcpus - 1);
  for (std::size_t i = 0; i < addrs.size(); ++i) EXPECT_EQ(g.peek(addrs[i], 5), originals[i]) << fns[i];
}

TEST(GuestChannelDom0Gone, ReturnsFinishThroughTheReturnTable) {
  // A return probe the way the engine does it: at the entry the return address on the stack
  // becomes the trampoline (a trap byte in the OEA) and the real one goes into the return
  // table; at the trampoline Dom0 sends the vCPU back. Dom0 dies right after an entry: the
  // module finishes that return from the table.
  constexpr std::uint64_t kIters = 4;
  ChannelGuest g(guest_config(1, kIters, 30));
  g.attach();
  const std::uint64_t fn = g.sym("sys_getppid");
  const std::uint64_t tramp = g.layout.oea_addr + 0x40;
  std::map<std::uint64_t, std::uint64_t> live;  // stack slot -> real return address
  std::uint64_t entries = 0, returns = 0;
  bool kill = false;
  FakeSink sink;
  sink.probes[fn].on_hit = [&](channel::Stop& s) {
    auto ra = g.memory->read_u64(Gva{s.regs.rsp});
    ASSERT_TRUE(ra);
    ASSERT_TRUE(g.ch->return_added(g.dom, Gva{s.regs.rsp}, Gva{*ra}));
    ASSERT_TRUE(g.memory->write_u64(Gva{s.regs.rsp}, tramp));
    live[s.regs.rsp] = *ra;
    s.regs.rip = fn + 5;
    if (++entries == 5) kill = true;
  };
  sink.probes[tramp].on_hit = [&](channel::Stop& s) {
    const std::uint64_t slot = s.regs.rsp - 8;
    ASSERT_TRUE(live.contains(slot));
    s.regs.rip = live[slot];
    live.erase(slot);
    g.ch->return_removed(g.dom, Gva{slot});
    ++returns;
  };
  // The trampoline: one trap byte in a slot, with the return fallback.
  ASSERT_TRUE(g.hv->pause(g.dom));
  TrapEntry t;
  t.addr = Gva{tramp};
  t.fallback = TrapEntry::Fallback::Return;
  t.len = 1;
  t.insn[0] = 0xcc;
  ASSERT_TRUE(g.ch->trap_added(g.dom, t));
  const std::uint8_t cc = 0xcc;
  ASSERT_TRUE(g.memory->write(Gva{tramp}, std::as_bytes(std::span(&cc, 1))));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  g.arm_skip("sys_getppid");
  g.start();
  ASSERT_TRUE(g.pump_until(sink, [&] { return kill; })) << g.host->crash_reason(g.dom);
  EXPECT_EQ(returns, entries - 1);
  EXPECT_EQ(live.size(), 1u);
  EXPECT_EQ(g.header().timeouts, 0u);
  g.kill_dom0();
  ASSERT_TRUE(g.advance_until_halted(30ms)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], expected_calls(DEMO_FN_GETPPID, kIters));
  const auto h = g.header();
  EXPECT_EQ(h.dom0_gone, 1u);
  const auto rets = g.return_table();
  ASSERT_EQ(rets.size(), h.ret_capacity);
  for (const auto& r : rets) EXPECT_EQ(r.slot, 0u) << "the module used and cleared the entry";
  EXPECT_EQ(g.peek(fn, 1)[0], 0x0f) << "the entry's byte is restored";
  EXPECT_EQ(g.peek(tramp, 1)[0], 0xcc) << "the trampoline is in the OEA: left alone";
}

// ---- the claim ----------------------------------------------------------------------------

TEST(GuestChannelClaim, ASlowHandlerIsWaitedFor) {
  // The module waits timeout_ms (30) for Dom0 to claim a hit, and a claimed hit up to the
  // claim bound (600 ms here). Handlers that take three timeouts of the module's clock -- one
  // of them after writing guest memory, as a call Dom0 emulates pushes its return address --
  // are waited for: every answer is applied and nothing times out.
  constexpr std::uint64_t kIters = 2;
  constexpr unsigned kTimeoutMs = 30;
  ChannelGuest g(guest_config(1, kIters, kTimeoutMs));
  g.attach();
  FakeSink sink;
  std::optional<x86::Insn> call;
  for (const auto& i : g.function("demo_recurse"))
    if (i.branch == x86::BranchKind::Call) {
      call = i;
      break;
    }
  ASSERT_TRUE(call);
  unsigned slow_getppid = 0, slow_call = 0;
  auto take_long = [&](unsigned& slow) {
    if (slow >= 2) return;
    ++slow;
    EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED);
    g.advance(std::chrono::milliseconds(3 * kTimeoutMs));  // past timeout_ms, within the bound
    EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED) << "the module waits on for a claimed hit";
  };
  // sys_getppid returns 42 without running: only Dom0's answer does that (the module's
  // fallback would run the body).
  const std::uint64_t getppid = g.sym("sys_getppid");
  sink.probes[getppid].on_hit = [&](channel::Stop& s) {
    take_long(slow_getppid);
    auto ra = g.memory->read_u64(Gva{s.regs.rsp});
    ASSERT_TRUE(ra);
    s.regs.rip = *ra;
    s.regs.rsp += 8;
    s.regs.rax = 42;
  };
  sink.probes[call->address.value].on_hit = [&](channel::Stop& s) {
    const std::uint64_t ret = s.trap.value + call->length;
    ASSERT_TRUE(g.memory->write_u64(Gva{s.regs.rsp - 8}, ret));
    take_long(slow_call);  // after the write: without the claim the module would have moved on
    s.regs.rsp -= 8;
    s.regs.rip = call->branch_target.value;
  };
  g.arm_skip("sys_getppid");
  g.arm(call->address.value, TrapEntry::Fallback::Emulate);
  g.start();
  ASSERT_TRUE(g.run_to_completion(sink)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(slow_getppid, 2u);
  EXPECT_EQ(slow_call, 2u);
  EXPECT_EQ(g.stats(0).iterations, kIters);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], 0u) << "every answer was applied";
  EXPECT_EQ(sink.probes[getppid].hits, expected_calls(DEMO_FN_GETPPID, kIters));
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_RECURSE], expected_calls(DEMO_FN_RECURSE, kIters));
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_OPEN], expected_calls(DEMO_FN_OPEN, kIters));
  const auto h = g.header();
  EXPECT_EQ(h.timeouts, 0u);
  EXPECT_EQ(h.dom0_gone, 0u);
  const auto st = g.ch->stats(g.dom);
  EXPECT_EQ(st.answered, sink.total);
  EXPECT_EQ(st.late, 0u);
  EXPECT_EQ(st.abandoned, 0u);
}

TEST(GuestChannelClaim, AHandlerPastTheClaimBoundIsGivenUpOnAndItsAnswerDropped) {
  // Dom0 hangs in a handler: the module waits the claim bound (1 s for a 50 ms timeout,
  // counted from the hit), then resumes on its own (counted as a timeout); Dom0's answer, when
  // it comes, is dropped as late and written nowhere. Dom0 answers everything else.
  constexpr std::uint64_t kIters = 2;
  constexpr unsigned kTimeoutMs = 50;
  ChannelGuest g(guest_config(1, kIters, kTimeoutMs));
  g.attach();
  FakeSink sink;
  bool hung = false;
  std::uint32_t hung_seq = 0;
  sink.skip(g.sym("sys_open")).on_hit = [&](channel::Stop& s) {
    s.regs.rip = s.trap.value + 5;
    if (hung) return;
    hung = true;
    hung_seq = g.mailbox(0).seq;
    EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED);
    g.advance(claim_bound(kTimeoutMs) - 1ms);
    EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED) << "still within the bound";
    EXPECT_EQ(g.header().timeouts, 0u);
    g.advance(1ms);  // given up on: the vCPU runs on (and may hit again at once)
    EXPECT_NE(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED) << "the bound has passed";
    EXPECT_EQ(g.header().timeouts, 1u);
  };
  g.arm_skip("sys_open");
  g.start();
  ASSERT_TRUE(g.run_to_completion(sink)) << g.host->crash_reason(g.dom);
  ASSERT_TRUE(hung);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  const auto h = g.header();
  EXPECT_EQ(h.timeouts, 1u);
  EXPECT_EQ(h.dom0_gone, 0u);
  const auto st = g.ch->stats(g.dom);
  EXPECT_EQ(st.late, 1u);
  EXPECT_EQ(st.answered, sink.total - 1);
  EXPECT_NE(g.mailbox(0).answer_seq, hung_seq) << "the late answer was not written";
}

TEST(GuestChannelClaim, ADom0ThatDiesHoldingAClaimLeavesTheGuestRunning) {
  // Another Dom0 claims a hit and dies in its handler: the vCPU waits the claim bound, then
  // the module resumes it and every later hit on its own, and restores the text.
  constexpr std::uint64_t kIters = 3;
  constexpr unsigned kTimeoutMs = 50;
  ChannelGuest g(guest_config(1, kIters, kTimeoutMs));
  g.attach();
  g.arm_skip("sys_open");
  g.arm_skip("demo_recurse");
  const auto h = g.header();
  auto other = g.host->open();
  const hv::ForeignMapping map = g.map_control(*other);
  auto state = ChannelGuest::mailbox_word(map, h, 0, offsetof(xenprobes_mailbox, state));
  g.kill_dom0();  // the channel never answers anything
  ASSERT_TRUE(other->unpause(g.dom));
  // Claim the first hit (the module's clock stands still: it cannot give up on it first).
  ASSERT_TRUE(eventually(
      [&] {
        std::uint32_t expected = XENPROBES_MBOX_HIT;
        return state.compare_exchange_strong(expected, XENPROBES_MBOX_CLAIMED);
      },
      20s));
  g.advance(claim_bound(kTimeoutMs) - 1ms);
  EXPECT_EQ(state.load(), XENPROBES_MBOX_CLAIMED) << "the claim is honoured up to the bound";
  EXPECT_EQ(g.header().timeouts, 0u);
  g.advance(1ms);
  EXPECT_NE(state.load(), XENPROBES_MBOX_CLAIMED) << "and given up on once it has passed";
  EXPECT_EQ(g.header().timeouts, 1u);
  ASSERT_TRUE(g.advance_until_halted(std::chrono::milliseconds(kTimeoutMs))) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).iterations, kIters);
  const auto after = g.header();
  EXPECT_EQ(after.timeouts, unsigned{XENPROBES_DEAD_AFTER}) << "the expired claim counts as a timeout";
  EXPECT_EQ(after.dom0_gone, 1u);
  EXPECT_EQ(g.peek(g.sym("sys_open"), 5), (std::vector<std::uint8_t>{0x0f, 0x1f, 0x44, 0x00, 0x00}));
}

TEST(GuestChannelClaim, ResumesInFlightWhileClaimedAndUntilTakenUp) {
  ChannelGuest g(guest_config(1, 0, 10000));
  g.attach();
  FakeSink sink;
  const std::uint64_t fn = g.sym("sys_open");
  const std::uint64_t fallback = g.layout.oea_addr + 0x100;  // as if a slot held the nop
  std::vector<std::uint64_t> during;
  sink.skip(fn).on_hit = [&](channel::Stop& s) {
    during = g.ch->resumes_in_flight(g.dom);
    s.regs.rip = fn + 5;
  };
  g.arm(fn, TrapEntry::Fallback::ResumeAt, fallback);
  g.start();
  ASSERT_TRUE(eventually([&] { return g.mailboxes_in(XENPROBES_MBOX_HIT, 1) == 1; }));
  ASSERT_TRUE(g.hv->pause(g.dom));  // a paused guest takes up no answer
  EXPECT_TRUE(g.ch->resumes_in_flight(g.dom).empty()) << "an unclaimed hit is the module's";
  auto n = g.ch->flush(g.dom, sink);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 1u);
  // Claimed: the vCPU resumes at the answer being made, or at the entry's fallback.
  EXPECT_EQ(during, (std::vector<std::uint64_t>{fn, fallback}));
  // Answered, not taken up yet.
  EXPECT_EQ(g.ch->resumes_in_flight(g.dom), std::vector<std::uint64_t>{fn + 5});
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(eventually([&] { return g.ch->resumes_in_flight(g.dom).empty(); }));
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty());
}

TEST(GuestChannelClaim, DetachFromAHandlerGivesTheClaimBack) {
  // The engine lets go of the domain inside a handler: the hit is given back (HIT), so the
  // module resumes it after timeout_ms instead of waiting out the claim bound.
  constexpr unsigned kTimeoutMs = 100;
  ChannelGuest g(guest_config(1, 0, kTimeoutMs));
  g.attach();
  FakeSink sink;
  const std::uint64_t fn = g.sym("sys_open");
  std::uint32_t seq = 0;
  const auto original = g.peek(fn, 1);
  sink.skip(fn).on_hit = [&](channel::Stop& s) {
    seq = g.mailbox(0).seq;
    // As the engine does: the byte first, then the channel lets go.
    ASSERT_TRUE(g.memory->write(Gva{fn}, std::as_bytes(std::span(original))));
    ASSERT_TRUE(g.ch->detach(g.dom));
    s.regs.rip = fn + 5;
  };
  g.arm_skip("sys_open");
  g.start();
  ASSERT_TRUE(g.pump_until(
      sink, [&] { return sink.total == 1; }, 10s));
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_HIT) << "the claim was given back";
  // Resumed by the module's timeout, not after the claim bound (2 s).
  g.advance(std::chrono::milliseconds(kTimeoutMs) - 1ms);
  EXPECT_EQ(g.header().timeouts, 0u);
  g.advance(1ms);
  EXPECT_EQ(g.header().timeouts, 1u);
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_ABANDONED);
  EXPECT_EQ(g.mailbox(0).seq, seq);
  EXPECT_NE(g.mailbox(0).answer_seq, seq);
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
}

// ---- the module's clock -------------------------------------------------------------------

TEST(GuestChannelClock, AHitTimesOutWhenTheModulesClockSaysSoNotTheMachine) {
  // The fixture's hosts run the module on a manual clock: real time passing (a loaded
  // machine, a slow Dom0) times nothing out; advancing the clock past timeout_ms does, at once.
  constexpr unsigned kTimeoutMs = 30;
  ChannelGuest g(guest_config(1, 0, kTimeoutMs));
  g.attach();
  g.arm_skip("sys_open");
  g.start();
  ASSERT_TRUE(eventually([&] { return g.mailboxes_in(XENPROBES_MBOX_HIT, 1) == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(5 * kTimeoutMs));
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_HIT) << "real time does not time a hit out";
  g.advance(std::chrono::milliseconds(kTimeoutMs) - 1ms);
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_HIT);
  EXPECT_EQ(g.header().timeouts, 0u);
  g.advance(1ms);
  EXPECT_EQ(g.header().timeouts, 1u) << "the clock passed timeout_ms";
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
  // Only a manual clock moves on demand.
  auto real = hv::sim::SimHost::create();
  auto r = real->advance_clock(1ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
}

TEST(GuestChannelClock, TheModuleSumsItsWaitsForDom0AndKeepsTheLongest) {
  // protocol.h, header.wait_ns and wait_max_ns: each hit's wait from its mailbox write to its
  // answer taken or its timeout, on the module's clock. Three hits: answered after 7 ms and
  // after 3 ms, then one left to time out at 30 ms.
  constexpr unsigned kTimeoutMs = 30;
  ChannelGuest g(guest_config(1, 0, kTimeoutMs));
  g.attach();
  FakeSink sink;
  const TrapEntry e = g.arm_skip("sys_open");
  sink.skip(e.addr.value);
  g.start();
  ASSERT_TRUE(hit_with_seq(g, 1));
  g.advance(7ms);
  EXPECT_EQ(g.pump(sink), 1u);
  ASSERT_TRUE(hit_with_seq(g, 2)) << "the answer to the first hit taken up, the next hit made";
  EXPECT_EQ(g.header().wait_ns, 7'000'000u);
  g.advance(3ms);
  EXPECT_EQ(g.pump(sink), 1u);
  ASSERT_TRUE(hit_with_seq(g, 3));
  g.advance(std::chrono::milliseconds(kTimeoutMs));  // the third: no answer
  EXPECT_EQ(g.header().timeouts, 1u);
  EXPECT_EQ(g.header().wait_ns, 40'000'000u);
  EXPECT_EQ(g.header().wait_max_ns, 30'000'000u);
  auto c = g.ch->module_counters(g.dom);  // Dom0 reads the module's figures as they are
  ASSERT_TRUE(c) << c.error().what;
  EXPECT_EQ(c->wait_ns, 40'000'000u);
  EXPECT_EQ(c->wait_max_ns, 30'000'000u);
}

TEST(GuestChannelClock, AVcpuThatSpentItsWaitingBudgetResumesWithoutDom0UntilItSwitches) {
  // protocol.h "Waiting budget": the waits of a vCPU's hits since its last context switch add
  // up; past the budget its hits take the fallback without a mailbox write, counted in
  // over_budget (not in timeouts), until the vCPU switches.
  constexpr unsigned kTimeoutMs = 30;
  ChannelGuest g(guest_config(1, 0, kTimeoutMs));
  ASSERT_TRUE(g.host->set_module_wait_budget(g.dom, 20ms));
  g.attach();
  FakeSink sink;
  const TrapEntry e = g.arm_skip("sys_open");
  sink.skip(e.addr.value);
  g.start();
  for (std::uint32_t seq = 1; seq <= 2; ++seq) {  // 7 + 7 ms: within the budget
    ASSERT_TRUE(hit_with_seq(g, seq));
    g.advance(7ms);
    EXPECT_EQ(g.pump(sink), 1u);
  }
  ASSERT_TRUE(hit_with_seq(g, 3));
  EXPECT_EQ(g.header().over_budget, 0u);
  g.advance(6ms);  // 20 ms in all: spent
  EXPECT_EQ(g.pump(sink), 1u);
  // The guest runs on through sys_open, each hit resumed by the fallback with no mailbox write.
  ASSERT_TRUE(eventually([&] { return g.header().over_budget >= 3; }));
  EXPECT_EQ(g.mailbox(0).seq, 3u) << "no hit went to the mailbox";
  EXPECT_NE(g.mailbox(0).state, XENPROBES_MBOX_HIT);
  EXPECT_EQ(g.header().timeouts, 0u) << "an over-budget hit says nothing about Dom0";
  EXPECT_EQ(g.header().dom0_gone, 0u);
  EXPECT_EQ(g.header().hits, 3u);
  auto c = g.ch->module_counters(g.dom);
  ASSERT_TRUE(c) << c.error().what;
  EXPECT_GE(c->over_budget, 3u);
  // The guest kernel switches tasks on the vCPU: its hits go to Dom0 again.
  ASSERT_TRUE(g.host->vcpu_switched(g.dom, VcpuId{0}));
  ASSERT_TRUE(hit_with_seq(g, 4));
  const std::uint64_t over = g.header().over_budget;
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(g.header().over_budget, over) << "the vCPU waits in its mailbox, over budget no more";
  auto n = g.host->module_over_budget(g.dom);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, over);
  EXPECT_EQ(g.header().wait_ns, 20'000'000u);
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
}

}  // namespace
}  // namespace xenprobes::testing
