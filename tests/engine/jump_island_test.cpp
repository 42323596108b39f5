// Short jumps to islands on the simulated Xen (protocol.h "Short jumps to islands"): a point
// whose 5-byte region a branch target makes unsafe goes in as `eb rel8` to an island in its
// function's dead padding, which jumps to the detour; every execution is counted exactly, the
// island is written before the short jump and given back after a quiescence that follows the
// short jump's removal, the guest module's own restore gives both back, an older module gets
// a trap probe saying why, and two probes never share an island.
#include <cstring>
#include <map>

#include "api/session_testing.hpp"
#include "engine/engine_fixture.hpp"
#include "engine/sweep_sites.hpp"

namespace xenprobes::testing {
namespace {

constexpr std::uint64_t kIterations = 6;

ProbeOptions jump() { return ProbeOptions{ProbeMethod::Jump}; }

// sys_write's last return path: pop %rbx; ret; nop, then `xor %edi,%edi` (a branch target:
// no 5-byte region from the pop) and the padding after its last ret (nops). The short jump's
// region is the pop and the ret; its island lies in that padding.
struct Target {
  std::uint64_t at = 0, fn = 0;
};

Target target(SessionGuest& g) {
  Target t;
  t.fn = g.sym("sys_write");
  // Find `5b c3` (pop %rbx; ret) followed by `90 31 ff` in sys_write.
  const auto b = g.peek(t.fn, 0x120);
  for (std::size_t k = 0; k + 5 <= b.size(); ++k)
    if (b[k] == 0x5b && b[k + 1] == 0xc3 && b[k + 2] == 0x90 && b[k + 3] == 0x31 && b[k + 4] == 0xff) {
      t.at = t.fn + k;
      break;
    }
  return t;
}

// How often the guest really executes `at` and `at + 3` in `iterations` (a reference run of
// its own, before the probed guest exists: one simulated guest at a time).
std::map<std::uint64_t, std::uint64_t> executions(std::uint64_t at, std::uint64_t iterations) {
  return reference({Site{"sys_write", at, ""}, Site{"sys_write", at + 3, ""}}, iterations).executions;
}

std::uint64_t find_target() {
  hv::sim::DomainConfig c = demo_config(1, 1);
  c.start_paused = true;
  ProbedGuest g(c);
  return target(g).at;
}

TEST(JumpIsland, AShortJumpToAnIslandCountsEveryExecutionAndEverythingGoesBack) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  const std::uint64_t at = find_target();
  ASSERT_NE(at, 0u) << "guest/ changed: pick another point";
  const std::uint64_t expected = executions(at, kIterations).at(at);
  ASSERT_GT(expected, 0u);
  ProbedGuest g(demo_config(1, kIterations));
  const Target t = target(g);
  ASSERT_EQ(t.at, at);
  auto layout = g.host->layout(g.dom);
  const auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  std::uint64_t hits = 0, island = 0;
  {
    auto p = g.session->probe(
        g.dom, Gva{t.at},
        [&](HitContext& c) {
          EXPECT_EQ(c.regs().rip, t.at);
          ++hits;
          return 0;
        },
        {}, jump());
    ASSERT_TRUE(p) << p.error().what;
    auto info = p->info();
    ASSERT_TRUE(info);
    EXPECT_EQ(info->method, ProbeMethod::Jump);
    EXPECT_EQ(info->address.value, t.at);
    ASSERT_EQ(info->not_jump_because.rfind("a short jump (eb rel8) to an island at 0x", 0), 0u)
        << info->not_jump_because;
    EXPECT_NE(info->not_jump_because.find("no-branch-into-region"), std::string::npos) << info->not_jump_because;
    island =
        std::stoull(info->not_jump_because.substr(std::strlen("a short jump (eb rel8) to an island at ")), nullptr, 16);
    EXPECT_GT(island, t.at + 1);
    EXPECT_LE(island + 5, t.fn + 0x120);
    const std::uint64_t detour = info->slot.value;
    // Armed, paused: the island holds its jump to the detour before anything can reach it,
    // and a trap byte sends every hit to the detour until the short jump goes in.
    auto isl = g.peek(island, 5);
    std::int32_t rel = 0;
    std::memcpy(&rel, isl.data() + 1, 4);
    EXPECT_EQ(isl[0], 0xe9);
    EXPECT_EQ(island + 5 + static_cast<std::uint64_t>(std::int64_t{rel}), detour) << "the island jumps to the detour";
    EXPECT_EQ(g.peek(t.at, 1)[0], 0xcc);
    EXPECT_TRUE(info->jump_pending);

    g.start();
    ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending; })) << "the short jump was never written";
    auto eb = g.peek(t.at, 2);
    EXPECT_EQ(eb[0], 0xeb);
    EXPECT_EQ(t.at + 2 + static_cast<std::uint64_t>(std::int64_t{static_cast<std::int8_t>(eb[1])}), island);
    ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
    EXPECT_EQ(hits, expected) << "hits must equal the instruction's real executions";
    EXPECT_EQ(p->stats().hits, hits);
    const demo_stats ref = reference_stats(0, kIterations);
    EXPECT_EQ(g.stats(0).checksum, ref.checksum);
    EXPECT_EQ(g.stats(0).calls[DEMO_FN_WRITE], ref.calls[DEMO_FN_WRITE]);
  }
  // Unregistered: the region is the guest's at once; the island only after a quiescence (a
  // task interrupted between the eb and the island resumes at the island).
  EXPECT_EQ(g.peek(t.at, 2), (std::vector<std::uint8_t>{0x5b, 0xc3}));
  EXPECT_EQ(g.peek(island, 1)[0], 0xe9) << "the island waits for a quiescence";
  ASSERT_TRUE(run_until(g, [&] { return g.peek(layout->text_start, text.size()) == text; }))
      << "the island was never given back";
}

TEST(JumpIsland, TheModulesOwnRestoreGivesBackRegionAndIslandAfterAKill) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, 0));  // runs until stopped
  const Target t = target(g);
  ASSERT_NE(t.at, 0u);
  auto layout = g.host->layout(g.dom);
  const auto text = g.peek(layout->text_start, layout->text_end - layout->text_start);
  auto p = g.session->probe(
      g.dom, Gva{t.at}, [](HitContext&) { return 0; }, {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  ASSERT_EQ(p->info()->not_jump_because.rfind("a short jump", 0), 0u) << p->info()->not_jump_because;
  g.start();
  ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending; }));
  ASSERT_EQ(g.peek(t.at, 1)[0], 0xeb);
  ASSERT_NE(g.peek(layout->text_start, text.size()), text);
  // As SIGKILL would: nothing restored by Dom0. The module detaches (its fail-safe restore).
  (void)p->release();
  SessionTesting::abandon(std::move(g.session)).reset();
  auto restored = g.host->module_detach(g.dom);
  ASSERT_TRUE(restored) << restored.error().what;
  EXPECT_EQ(*restored, 2u) << "the region and its island";
  EXPECT_EQ(g.peek(layout->text_start, text.size()), text) << "byte for byte, island included";
}

TEST(JumpIsland, AnOlderModuleGetsNoShortJumpAndFastestSaysWhy) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  const std::uint64_t at = find_target();
  ASSERT_NE(at, 0u);
  const std::uint64_t expected = executions(at, kIterations).at(at);
  hv::sim::DomainConfig c = demo_config(1, kIterations);
  c.module_jump_island = false;  // publishes jump-entry, not the jump-island feature
  ProbedGuest g(c);
  const Target t = target(g);
  ASSERT_EQ(t.at, at);
  auto j = g.session->probe(
      g.dom, Gva{t.at}, [](HitContext&) { return 0; }, {}, jump());
  ASSERT_FALSE(j);
  EXPECT_EQ(j.error().code, Errc::NotSupported);
  EXPECT_NE(j.error().what.find("jump-island feature"), std::string::npos) << j.error().what;
  std::uint64_t hits = 0;
  auto f = g.session->probe(
      g.dom, Gva{t.at},
      [&](HitContext&) {
        ++hits;
        return 0;
      },
      {}, ProbeOptions{ProbeMethod::Fastest});
  ASSERT_TRUE(f) << f.error().what;
  EXPECT_EQ(f->info()->method, ProbeMethod::Trap);
  EXPECT_NE(f->info()->not_jump_because.find("jump-island feature"), std::string::npos) << f->info()->not_jump_because;
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(hits, expected);
}

TEST(JumpIsland, TwoProbesNeverShareAnIsland) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  const std::uint64_t at = find_target();
  ASSERT_NE(at, 0u);
  const auto expected = executions(at, kIterations);
  ProbedGuest g(demo_config(1, kIterations));
  const Target t = target(g);
  ASSERT_EQ(t.at, at);
  // The pop's region is [pop, ret]; `xor %edi,%edi` (3 bytes on) is a short jump of its own
  // (no 5-byte region: the jmp after it goes back before it), whose island must be another.
  auto first = g.session->probe(
      g.dom, Gva{t.at}, [](HitContext&) { return 0; }, {}, jump());
  ASSERT_TRUE(first) << first.error().what;
  auto second = g.session->probe(
      g.dom, Gva{t.at + 3}, [](HitContext&) { return 0; }, {}, jump());
  ASSERT_TRUE(second) << second.error().what;
  const std::string a = first->info()->not_jump_because, b = second->info()->not_jump_because;
  ASSERT_EQ(a.rfind("a short jump", 0), 0u) << a;
  ASSERT_EQ(b.rfind("a short jump", 0), 0u) << b;
  auto island_of = [](const std::string& s) {
    return std::stoull(s.substr(std::strlen("a short jump (eb rel8) to an island at ")), nullptr, 16);
  };
  const std::uint64_t ia = island_of(a), ib = island_of(b);
  EXPECT_TRUE(ia + 5 <= ib || ib + 5 <= ia) << std::hex << ia << " " << ib << ": islands overlap";
  g.start();
  ASSERT_TRUE(run_until(g, [&] { return !first->info()->jump_pending && !second->info()->jump_pending; }))
      << first->info()->jump_pending << second->info()->jump_pending;
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(first->stats().hits, expected.at(t.at));
  EXPECT_EQ(second->stats().hits, expected.at(t.at + 3));
}

}  // namespace
}  // namespace xenprobes::testing
