// Jump probes on the simulated Xen (protocol.h "Jump probes"): on the guest channel a probe
// asked for as a jump goes in as a trap byte that sends every hit to its detour, then as the
// jump itself once the guest module has confirmed quiescence; every call is counted exactly,
// the guest's results are unchanged (or changed as the handler says) and its text is restored
// byte for byte. On the other channels a jump is refused saying why, and Fastest falls back to
// a trap probe.
#include <algorithm>
#include <cstring>

#include "common/hex.hpp"
#include "api/session_testing.hpp"
#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {
namespace {

constexpr std::uint64_t kIterations = 40;

ProbeOptions jump() { return ProbeOptions{ProbeMethod::Jump}; }

std::int32_t rel32_at(const std::vector<std::uint8_t>& b) {
  std::int32_t v = 0;
  std::memcpy(&v, b.data() + 1, 4);
  return v;
}

TEST(JumpProbe, CountsEveryCallExactlyThroughTheTrapByteAndThenTheJump) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, kIterations));
  auto layout = g.host->layout(g.dom);
  const auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  const std::uint64_t at = g.entry("sys_getppid");
  std::uint64_t hits = 0;
  {
    auto p = g.session->probe(
        g.dom, "sys_getppid",
        [&](HitContext& c) {
          EXPECT_EQ(c.regs().rip, at);
          EXPECT_EQ(c.address().value, at);
          ++hits;
          return 0;
        },
        {}, jump());
    ASSERT_TRUE(p) << p.error().what;
    auto info = p->info();
    ASSERT_TRUE(info);
    EXPECT_EQ(info->method, ProbeMethod::Jump);
    EXPECT_EQ(info->mode, ExecMode::Detour);
    EXPECT_NE(info->slot.value, 0u) << "the detour's slot";
    EXPECT_TRUE(info->jump_pending) << "the guest has not run: no quiescence yet";
    EXPECT_EQ(g.peek(at, 1)[0], 0xcc) << "until then a trap byte sends every hit to the detour";
    const std::uint64_t detour = info->slot.value;

    g.start();
    // The jump goes in once the module confirms quiescence, while the guest runs its workload.
    ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending; })) << "the jump was never written";
    auto jmp = g.peek(at, 5);
    EXPECT_EQ(jmp[0], 0xe9);
    EXPECT_EQ(at + 5 + static_cast<std::uint64_t>(std::int64_t{rel32_at(jmp)}), detour) << "a jump to the detour";
    ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
    EXPECT_EQ(hits, expected_calls(DEMO_FN_GETPPID, kIterations));
    EXPECT_EQ(p->stats().hits, hits);
    EXPECT_EQ(p->stats().unhandled, 0u);
    const demo_stats ref = reference_stats(0, kIterations);
    EXPECT_EQ(g.stats(0).checksum, ref.checksum);
    EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], ref.calls[DEMO_FN_GETPPID]);
  }
  EXPECT_EQ(g.peek(layout->text_start, text.size()), text) << "unregistered: the text is the guest's again";
}

TEST(JumpProbe, APreHandlerCanChangeRegistersAndSkipTheFunction) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, 5));
  // Return 42 from sys_getppid without running it (kprobes' "return 1"), through a jump.
  auto p = g.session->probe(
      g.dom, "sys_getppid",
      [&](HitContext& c) {
        auto ra = c.read_u64(Gva{c.regs().rsp});
        EXPECT_TRUE(ra);
        c.regs().rip = *ra;
        c.regs().rsp += 8;
        c.regs().rax = 42;
        return 1;
      },
      {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], 0u) << "the body never ran";
  EXPECT_EQ(g.stats(0).iterations, 5u);
  EXPECT_EQ(p->stats().hits, expected_calls(DEMO_FN_GETPPID, 5));
}

TEST(JumpProbe, AHandlerSendingTheVcpuToAnInstructionTheJumpCoversGoesToItsCopy) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, 5));
  // sys_getppid after its ftrace site: mov %rsp,%rax (3 bytes), then sub $imm32,%rax: both in
  // the jump's region. The handler does the mov itself and sends the vCPU to the sub, whose
  // address holds the jump's rel32 now: it must run the sub's copy in the detour.
  const std::uint64_t at = g.entry("sys_getppid");
  ASSERT_EQ(g.peek(at, 3), (std::vector<std::uint8_t>{0x48, 0x89, 0xe0})) << "guest/ changed: pick another point";
  std::uint64_t hits = 0;
  auto p = g.session->probe(
      g.dom, "sys_getppid",
      [&](HitContext& c) {
        c.regs().rax = c.regs().rsp;
        c.regs().rip = at + 3;
        ++hits;
        return 1;
      },
      {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending; }));
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(hits, expected_calls(DEMO_FN_GETPPID, 5));
  const demo_stats ref = reference_stats(0, 5);
  EXPECT_EQ(g.stats(0).checksum, ref.checksum) << "the same work, with the mov done by the handler";
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], ref.calls[DEMO_FN_GETPPID]);
}

TEST(JumpProbe, PostHandlersAndOtherChannelsAreRefusedWithTheReasonAndFastestFallsBack) {
  ProbedGuest g(demo_config(1, 5));
  auto layout = g.host->layout(g.dom);
  const auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  auto pre = [](HitContext&) { return 0; };
  auto post = g.session->probe(
      g.dom, "sys_open", pre, [](HitContext&) {}, jump());
  ASSERT_FALSE(post);
  EXPECT_EQ(post.error().code, Errc::NotSupported);
  const bool guest = test_channel() == ChannelKind::Guest;
  EXPECT_NE(post.error().what.find(guest ? "post-handler" : "guest channel"), std::string::npos) << post.error().what;
  EXPECT_EQ(g.peek(layout->text_start, text.size()), text) << "nothing written";

  auto fastest = g.session->probe(
      g.dom, "sys_open", pre, [](HitContext&) {}, ProbeOptions{ProbeMethod::Fastest});
  ASSERT_TRUE(fastest) << fastest.error().what;
  EXPECT_EQ(fastest->info()->method, ProbeMethod::Trap);
  EXPECT_NE(fastest->info()->not_jump_because.find(guest ? "post-handler" : "guest channel"), std::string::npos)
      << fastest->info()->not_jump_because;
  // A jump cannot share a trap probe's point.
  auto shared = g.session->probe(g.dom, "sys_open", pre, {}, jump());
  ASSERT_FALSE(shared);
  EXPECT_EQ(shared.error().code, Errc::Busy);
}

TEST(JumpProbe, AnOlderModuleWithoutAJumpEntryIsRefused) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  hv::sim::DomainConfig c = demo_config(1, 5);
  c.module_jump_entry = false;
  ProbedGuest g(c);
  auto p = g.session->probe(
      g.dom, "sys_getppid", [](HitContext&) { return 0; }, {}, jump());
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::NotSupported);
  EXPECT_NE(p.error().what.find("jump entry"), std::string::npos) << p.error().what;
}

TEST(JumpProbe, NoProbeInsideAJumpsRegionAndNoJumpOverAProbe) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, 5));
  auto pre = [](HitContext&) { return 0; };
  auto j = g.session->probe(g.dom, "sys_getppid", pre, {}, jump());
  ASSERT_TRUE(j) << j.error().what;
  // The instruction after the point lies in the jump's region (a region is >= 5 bytes, and
  // sys_getppid's first instruction after the ftrace site is shorter).
  const std::uint64_t at = g.entry("sys_getppid");
  auto insn = g.session->probe(g.dom, "sys_getppid", pre);  // joins the jump's point: fine
  ASSERT_TRUE(insn) << insn.error().what;
  EXPECT_EQ(insn->info()->method, ProbeMethod::Jump);
  bool refused_one = false;
  for (std::uint64_t a = at + 1; a < at + 5; ++a) {
    auto inside = g.session->probe(g.dom, Gva{a}, pre);
    if (inside) continue;  // not an instruction boundary is refused too, by decoding
    refused_one |= inside.error().code == Errc::Busy && inside.error().what.find("region") != std::string::npos;
  }
  EXPECT_TRUE(refused_one) << "a probe on an instruction inside the region is refused for it";
}

// demo_static_branch (guest/safety.S): ftrace nop5, the jump label's nop5, `xor %eax,%eax` (+10),
// `ret` (+12), then the label's target `mov $1,%eax` (+13). No decoded branch reaches +13 while
// the key is off, but the kernel may write the jmp to it at any time: the region [+10, +18)
// would have it inside, and the jump is refused for it, naming the jump label.
TEST(JumpProbe, AJumpLabelsTargetIsNeverInsideARegion) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, 5));
  auto pre = [](HitContext&) { return 0; };
  const std::uint64_t at = g.sym("demo_static_branch");
  ASSERT_EQ(g.peek(at + 10, 3), (std::vector<std::uint8_t>{0x31, 0xc0, 0xc3})) << "the layout this test names";
  auto p = g.session->probe(g.dom, Gva{at + 10}, pre, {}, jump());
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::NotSupported);
  EXPECT_NE(p.error().what.find("no-branch-into-region"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("jump label at " + hex(at + 5)), std::string::npos) << p.error().what;
}

// demo_cross_into (guest/safety.S): `xor %eax,%eax` then, at +2, the target of demo_cross_from's
// jmp. A 5-byte jump at +0 would cover it: refused, naming the other function; the kernel's
// every function is decoded for such branches (6.1's assembly has them, copy_mc_fragile's
// .E_* labels among them).
TEST(JumpProbe, ABranchFromAnotherFunctionIsNeverInsideARegion) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, 5));
  auto pre = [](HitContext&) { return 0; };
  const std::uint64_t at = g.sym("demo_cross_into");
  ASSERT_EQ(g.peek(at, 2), (std::vector<std::uint8_t>{0x31, 0xc0})) << "the layout this test names";
  auto p = g.session->probe(g.dom, Gva{at}, pre, {}, jump());
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::NotSupported);
  EXPECT_NE(p.error().what.find("no-branch-into-region"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("a branch from demo_cross_from"), std::string::npos) << p.error().what;
  // The instruction at the target starts its own region: fine.
  auto q = g.session->probe(g.dom, Gva{at + 2}, pre, {}, jump());
  ASSERT_TRUE(q) << q.error().what;
  EXPECT_EQ(q->info()->method, ProbeMethod::Jump);
}

// Session::prepare_jump_probes builds what jump probes need of the kernel (every function
// decoded) before a batch, so that a batch whose first probe is a trap probe, which pauses the
// domain, does not build it paused when its jump probe comes. Then both work, counts exact.
TEST(JumpProbe, PreparedBeforeABatchThatBeginsWithATrapProbe) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  constexpr std::uint64_t kIters = 5;
  ProbedGuest g(demo_config(1, kIters));
  EXPECT_FALSE(SessionTesting::jumps_prepared(*g.session, g.dom));
  ASSERT_TRUE(g.session->prepare_jump_probes(g.dom));
  EXPECT_TRUE(SessionTesting::jumps_prepared(*g.session, g.dom));
  ASSERT_TRUE(g.session->prepare_jump_probes(g.dom)) << "a second call does nothing";
  std::uint64_t traps = 0, jumps = 0;
  ASSERT_TRUE(g.session->begin_batch());
  auto t = g.session->probe(g.dom, "sys_getppid", [&](HitContext&) { return ++traps, 0; });
  auto j = g.session->probe(
      g.dom, "sys_write", [&](HitContext&) { return ++jumps, 0; }, {}, jump());
  ASSERT_TRUE(g.session->end_batch());
  ASSERT_TRUE(t) << t.error().what;
  ASSERT_TRUE(j) << j.error().what;
  EXPECT_EQ(j->info()->method, ProbeMethod::Jump);
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(traps, expected_calls(DEMO_FN_GETPPID, kIters));
  EXPECT_EQ(jumps, expected_calls(DEMO_FN_WRITE, kIters));
}

}  // namespace
}  // namespace xenprobes::testing
