// kill -9 at any point, on the simulated Xen: a session registers every kind of probe, lets
// the guest hit them, and unregisters them; its process "dies" at the N-th hypervisor call
// (every call from there on fails, as nothing more reaches Xen from a killed process), the
// session is dropped without cleanup, and recovery runs from the journal alone. Whatever N,
// the guest's text must come back byte-identical, no pause of ours may remain, and the
// workload must finish with the results it has without probes.
//
// XENPROBES_KILL_RUNS (default 200) sets the kills per channel: the first 8 at the first calls,
// the rest at calls drawn from a fixed seed; docs/reliability.md has the figures.
#include "guardian/guardian_fixture.hpp"

#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace xenprobes::testing {
namespace {

class KilledAt : public ::testing::TestWithParam<ChannelKind> {};

unsigned kill_runs() {
  const char* e = std::getenv("XENPROBES_KILL_RUNS");
  if (!e || !*e) return 200;
  return static_cast<unsigned>(std::strtoul(e, nullptr, 10));
}

// The life of the session: registration, hits, unregistration. Every step may fail once the
// process is "dead"; the steps go on regardless, as the code after a failed call would.
// Returns whether the domain was unpaused (its creator's pause released).
bool live(Guest& g, Gva branch) {
  std::vector<Probe> probes;
  auto keep = [&](Result<Probe> p) {
    if (p) probes.push_back(std::move(*p));
  };
  keep(g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; }));
  keep(g.session->probe(
      g.dom, "sys_getppid+5", [](HitContext&) { return 0; }, [](HitContext&) {}));
  keep(g.session->probe(g.dom, branch, [](HitContext&) { return 0; }));
  keep(g.session->ret_probe(
      g.dom, "demo_recurse", [](HitContext&, std::span<std::byte>) { return 0; },
      [](HitContext&, std::span<std::byte>) {}, RetProbeOptions{32, 0}));
  const bool started = g.session->hypervisor().unpause(g.dom).has_value();
  for (int i = 0; i < 30; ++i)
    if (!g.session->run_once(2)) break;
  for (Probe& p : probes)
    if (!p.unregister()) p.release();  // a failed unregister keeps its handle: let it go
  return started;
}

TEST_P(KilledAt, AnyHypervisorCallLeavesTheGuestRecoverable) {
  constexpr std::uint64_t kIters = 6;
  const hv::GuestType type = GetParam() == ChannelKind::VmEvent ? hv::GuestType::Hvm : hv::GuestType::Pv;
  const demo_stats want = reference_stats(0, kIters, 1, type);

  // How many calls a whole life takes (the kills are spread over them).
  std::uint64_t calls = 0;
  {
    Guest g(GetParam(), 1, kIters);
    const Gva branch = g.branch_in("demo_recurse");
    const std::uint64_t from = g.host->total_calls();
    ASSERT_TRUE(live(g, branch));
    calls = g.host->total_calls() - from;
    for (int i = 0; i < 30000 && !g.host->wait_halted(g.dom, 0s); ++i) ASSERT_TRUE(g.session->run_once(2));
    ASSERT_TRUE(g.host->wait_halted(g.dom, 0s)) << g.host->crash_reason(g.dom);
    EXPECT_EQ(g.text(), g.text_before);
  }
  ASSERT_GT(calls, 20u);

  std::mt19937_64 rng(std::hash<std::string>{}(channel_kind_name(GetParam())));
  const unsigned runs = kill_runs();
  for (unsigned run = 0; run < runs; ++run) {
    // The first kills at the first calls (attach, the first patch), the rest anywhere.
    const std::uint64_t at = run < 8 ? run : rng() % calls;
    SCOPED_TRACE("killed at call " + std::to_string(at) + " of " + std::to_string(calls));
    Guest g(GetParam(), 1, kIters);
    const Gva branch = g.branch_in("demo_recurse");
    g.host->fail_from_call(at, Errc::Io);
    const bool started = live(g, branch);
    const int jfd = g.abandon();
    ASSERT_GE(jfd, 0);
    g.host->clear_faults();  // the guardian's own handle works

    auto snap = guardian::read_journal_fd(jfd);
    ::close(jfd);
    ASSERT_TRUE(snap) << snap.error().what;
    auto hv = g.host->open();
    auto rep = guardian::recover(*hv, *snap);
    EXPECT_EQ(rep.failures, 0u);
    EXPECT_EQ(rep.left_alone, 0u);
    if (!started) {
      ASSERT_TRUE(hv->unpause(g.dom));  // the creator's pause, never released
    }
    ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << "the guest did not finish: " << g.host->crash_reason(g.dom);
    EXPECT_EQ(g.host->crash_reason(g.dom), "");
    EXPECT_EQ(g.text(), g.text_before) << "kernel text byte-identical";
    EXPECT_EQ(*g.host->pause_count(g.dom), 0u) << "no pause left";
    EXPECT_EQ(g.stats(0).checksum, want.checksum);
    if (HasFailure()) break;  // one account of the first kill that went wrong is enough
  }
}

INSTANTIATE_TEST_SUITE_P(Channels, KilledAt, ::testing::Values(ChannelKind::Debugger, ChannelKind::VmEvent),
                         [](const auto& i) { return std::string(channel_kind_name(i.param)); });

}  // namespace
}  // namespace xenprobes::testing
