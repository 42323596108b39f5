// The transparency sweep with jump probes (guest channel): every instruction of every demo-guest
// function in turn is asked for as a jump probe, synchronous or async. Where the jump rules
// accept it, the guest's results and counters must equal an unprobed run's and the hits must
// equal the times the instruction really executed (a region may start before the point: every
// execution still passes through the detour's call, since nothing branches into a region). Where
// they refuse it, the refusal names the rule. Never a wrong jump, never a trap in disguise.
#include <iostream>
#include <map>

#include "engine/sweep_sites.hpp"

namespace xenprobes::testing {
namespace {

constexpr std::uint64_t kIterations = 2;

// "…: cannot be a jump probe: refused by jump rule 'no-branch-into-region': …" -> the rule's
// name; other refusals (an address rule, the region's length, …) by their text.
std::string reason_of(const std::string& what) {
  if (auto r = what.find("jump rule '"); r != std::string::npos)
    return what.substr(r + 5, what.find('\'', r + 11) + 1 - (r + 5));
  if (auto r = what.find("rule '"); r != std::string::npos) return what.substr(r, what.find('\'', r + 6) + 1 - r);
  if (auto r = what.find("cannot be "); r != std::string::npos) return what.substr(r, 80);
  // "0x…: bytes (insn): why": the instruction rules' reason, without the address.
  if (auto r = what.find("): "); r != std::string::npos) return what.substr(r + 3, 60);
  return what.substr(0, 80);
}

class JumpSweep : public ::testing::TestWithParam<bool> {};

TEST_P(JumpSweep, EveryJumpIsTransparentAndEveryRefusalNamed) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  const bool async = GetParam();
  auto sites = all_instructions();
  ASSERT_GT(sites.size(), 300u);
  Reference ref = reference(sites, kIterations);
  std::map<std::string, unsigned> refusals;
  unsigned jumps = 0, moved = 0, short_jumps = 0;
  std::uint64_t total_hits = 0;
  for (const auto& site : sites) {
    SCOPED_TRACE(site.function + ": " + site.text);
    auto cfg = demo_config(1, kIterations);
    cfg.module_ring_order = 20;  // 1 MiB: every record of a run, however late Dom0 reads them
    ProbedGuest g(cfg);
    std::uint64_t hits = 0, wrong = 0;
    Result<Probe> p = async ? g.session->probe_async(g.dom, Gva{site.address},
                                                     [&](const AsyncHit& h) {
                                                       wrong += h.regs.rip != h.address.value;
                                                       ++hits;
                                                     })
                            : g.session->probe(
                                  g.dom, Gva{site.address},
                                  [&](HitContext& c) {
                                    wrong += c.regs().rip != c.address().value;
                                    ++hits;
                                    return 0;
                                  },
                                  {}, ProbeOptions{ProbeMethod::Jump});
    if (!p) {
      // Refused as a whole: an address or instruction rule for any probe (InvalidArgument,
      // Busy), or NotSupported naming why it cannot be a jump.
      EXPECT_TRUE(p.error().code == Errc::NotSupported || p.error().code == Errc::InvalidArgument ||
                  p.error().code == Errc::Busy)
          << p.error().what;
      refusals[reason_of(p.error().what)]++;
      continue;
    }
    auto info = p->info();
    ASSERT_TRUE(info);
    EXPECT_EQ(info->method, ProbeMethod::Jump);
    EXPECT_EQ(info->mode, ExecMode::Detour);
    EXPECT_EQ(info->async, async);
    if (info->address.value != site.address) {
      ++moved;  // asked for at a function's first byte: placed past its ftrace site (its own turn)
      continue;
    }
    ++jumps;
    // A short jump to an island (protocol.h "Short jumps to islands"): said, with the island.
    const bool is_short = info->not_jump_because.starts_with("a short jump");
    EXPECT_TRUE(info->not_jump_because.empty() || is_short) << info->not_jump_because;
    short_jumps += is_short;
    g.start();
    ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
    if (async) {
      ASSERT_TRUE(g.session->ring_stats(g.dom));  // reads what the rings still hold
    }
    demo_stats st = g.stats(0);
    EXPECT_EQ(st.checksum, ref.stats.checksum);
    for (unsigned f = 0; f < DEMO_NFUNCS; ++f) EXPECT_EQ(st.calls[f], ref.stats.calls[f]) << "fn " << f;
    EXPECT_EQ(hits, ref.executions[site.address]) << "hits must equal real executions";
    EXPECT_EQ(wrong, 0u) << "every hit reports the probed address as rip";
    total_hits += hits;
    if (is_short)
      std::cout << "[ jump sweep ] short: " << site.function << ": " << site.text << " (" << hits << " hits)\n";
  }
  std::cout << "[ jump sweep ] " << (async ? "async" : "sync") << ": " << sites.size() << " instructions, " << jumps
            << " jumps (" << short_jumps << " of them short jumps to islands; " << total_hits << " hits), " << moved
            << " moved past an ftrace site";
  for (auto& [why, n] : refusals) std::cout << " | " << n << " " << why;
  std::cout << "\n";
  EXPECT_GT(jumps, sites.size() / 2) << "most of the demo guest's instructions can be jump probes";
  EXPECT_GT(short_jumps, 0u)
      << "the demo guest has points only a short jump to an island serves (sys_write's last pop)";
}

INSTANTIATE_TEST_SUITE_P(Delivery, JumpSweep, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

}  // namespace
}  // namespace xenprobes::testing
