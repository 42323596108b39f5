// The transparency sweep: a probe on every instruction of every demo-guest function in turn,
// with a pre-handler only and with a post-handler too. Each time the guest's results and
// counters must equal an unprobed run's, and the hits must equal the times the instruction
// really executed (counted by the simulated Xen in a reference run).
#include <iostream>
#include <map>
#include <set>

#include "engine/sweep_sites.hpp"

namespace xenprobes::testing {
namespace {

constexpr std::uint64_t kIterations = 2;

// The demo guest's functions that exist to carry the kernel's tables (guest/safety.S): each
// is refused, in part or whole, by an address rule. demo_bug_end (never run) carries the
// traps a BUG() leaves: its ud2s and int3s are refused by the instruction rules.
const std::set<std::string> kTableFunctions = {
    "demo_uaccess_copy",      "demo_static_branch", "demo_static_call",  "__SCT__demo_hook",
    "demo_locked_inc",        "__rcu_read_lock",    "lookup_address",    "demo_nokprobe_fn",
    "demo_entry_stub",        "demo_noinstr_fn",    "demo_kprobes_fn",   "demo_hook_target",
    "demo_uaccess_neighbour", "demo_get_user",      "demo_load_zeropad", "demo_bug_end"};

class Sweep : public ::testing::TestWithParam<bool> {};

TEST_P(Sweep, EveryInstructionIsTransparent) {
  const bool with_post = GetParam();
  auto sites = all_instructions();
  ASSERT_GT(sites.size(), 300u);
  Reference ref = reference(sites, kIterations);
  std::map<std::string, unsigned> modes;
  std::map<std::string, unsigned> refusals, rules;
  std::uint64_t total_hits = 0;
  for (const auto& site : sites) {
    SCOPED_TRACE(site.text);
    ProbedGuest g(demo_config(1, kIterations));
    std::uint64_t pre = 0, post = 0;
    PostHandler ph;
    if (with_post) ph = [&](HitContext&) { ++post; };
    auto p = g.session->probe(
        g.dom, Gva{site.address},
        [&](HitContext& c) {
          EXPECT_EQ(c.regs().rip, site.address);
          ++pre;
          return 0;
        },
        ph);
    if (!p) {
      // Refusals must say why, and only instructions that cannot be probed are refused.
      const std::string& what = p.error().what;
      // The guest module's own fallback must be able to run what it is given (guest channel).
      const bool module_fallback =
          test_channel() == ChannelKind::Guest && what.find("memory-indirect") != std::string::npos;
      // An exception-table instruction runs in a fixup slot (or in place): no post-handlers there.
      const bool fixup_post = with_post && what.find("post-handlers cannot run") != std::string::npos;
      EXPECT_TRUE(p.error().code == Errc::InvalidArgument || p.error().code == Errc::Busy || module_fallback ||
                  (fixup_post && p.error().code == Errc::NotSupported))
          << what;
      if (kTableFunctions.contains(site.function)) {
        // The functions that carry the kernel's tables: refused by an address rule, or (their
        // other instructions) for the same reasons as any other instruction.
        if (auto r = what.find("rule '"); r != std::string::npos)
          rules[what.substr(r, what.find('\'', r + 6) + 1 - r)]++;
        continue;
      }
      // Rules of an instruction's place in any function: the ftrace site asked for by address
      // (a probe on the function's first byte goes past it) and an endbr64 landing pad.
      bool placement_rule = false;
      for (const char* rule : {"rule 'ftrace-site'", "rule 'endbr64'"})
        if (what.find(rule) != std::string::npos) {
          rules[rule]++;
          placement_rule = true;
        }
      if (placement_rule) continue;
      if (auto r = what.find("rule '"); r != std::string::npos) {
        ADD_FAILURE() << "an address rule outside the functions that carry the kernel's tables: " << what;
      } else {
        refusals[what.substr(what.find(')') + 1)]++;
      }
      continue;
    }
    if (p->info()->address.value != site.address) {
      // Asked for at a function's first byte, placed past its ftrace site or its endbr64
      // (guest/ibt.S): that instruction has its own turn in the sweep.
      EXPECT_TRUE(p->info()->moved_because.find("ftrace") != std::string::npos ||
                  p->info()->moved_because.find("endbr64") != std::string::npos)
          << p->info()->moved_because;
      modes["moved"]++;
      continue;
    }
    switch (p->info()->mode) {
      case ExecMode::Boosted: modes["boosted"]++; break;
      case ExecMode::TrapAfter: modes["trap-after"]++; break;
      case ExecMode::Emulated: modes["emulated"]++; break;
      case ExecMode::Skipped: modes["skipped"]++; break;
      case ExecMode::Detour: modes["detour"]++; break;
    }
    g.start();
    ASSERT_TRUE(g.run_to_completion()) << site.function << ": " << g.host->crash_reason(g.dom);
    demo_stats st = g.stats(0);
    EXPECT_EQ(st.checksum, ref.stats.checksum);
    for (unsigned f = 0; f < DEMO_NFUNCS; ++f) EXPECT_EQ(st.calls[f], ref.stats.calls[f]) << "fn " << f;
    EXPECT_EQ(pre, ref.executions[site.address]) << "hits must equal real executions";
    if (with_post) { EXPECT_EQ(post, pre); }
    EXPECT_EQ(p->stats().unhandled, 0u);
    total_hits += pre;
  }
  std::cout << "[ sweep    ] " << sites.size() << " instructions, " << total_hits << " hits"
            << (with_post ? " (pre+post)" : " (pre)") << ":";
  for (auto& [m, n] : modes) std::cout << " " << m << " " << n;
  for (auto& [why, n] : refusals) std::cout << " | refused " << n << ":" << why;
  for (auto& [rule, n] : rules) std::cout << " | " << rule << " " << n;
  std::cout << "\n";
  // Only the idle hlt, on the debugger channel 1-byte instructions whose next byte a vCPU can
  // reach otherwise (a branch target, the end of the function), and on the guest channel the
  // memory-indirect branches its module's fallback cannot run, may be refused.
  unsigned refused = 0;
  for (auto& [why, n] : refusals) {
    refused += n;
    EXPECT_TRUE(why.find("hlt") != std::string::npos || why.find("branch target") != std::string::npos ||
                why.find("jump-table target") != std::string::npos ||
                why.find("ends its function") != std::string::npos || why.find("memory-indirect") != std::string::npos)
        << why;
  }
  EXPECT_LE(refused, sites.size() / 25) << "refusals must stay rare";
  // Every rule the demo guest's tables exercise is met, on every channel; the guest
  // channel's own rules only there.
  for (const char* r : {"rule 'exception-table'", "rule 'jump-label'", "rule 'static-call'",
                        "rule 'static-call-trampoline'", "rule 'smp-lock'", "rule 'entry-text'"})
    EXPECT_TRUE(rules.contains(r)) << r;
  const bool guest = test_channel() == ChannelKind::Guest;
  for (const char* r : {"rule 'guest-hook-path'", "rule 'noinstr'", "rule 'kprobes-text'", "rule 'kprobe-blacklist'"})
    EXPECT_EQ(rules.contains(r), guest) << r;
}

INSTANTIATE_TEST_SUITE_P(Handlers, Sweep, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "PrePost" : "Pre"; });

}  // namespace
}  // namespace xenprobes::testing
