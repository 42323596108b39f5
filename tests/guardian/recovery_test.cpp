// Recovery from the journal on the simulated Xen: a session abandoned with probes armed and
// hits in flight (as SIGKILL leaves it) is undone from its journal alone.
#include "guardian/guardian_fixture.hpp"

#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"

#include <optional>

namespace xenprobes::testing {
namespace {

class Abandoned : public ::testing::TestWithParam<ChannelKind> {};

// Every kind of probe, hits in flight, then the process "dies".
TEST_P(Abandoned, RecoveryFromTheJournalRestoresTheGuest) {
  constexpr unsigned kVcpus = 2;
  constexpr std::uint64_t kIters = 30;
  Guest g(GetParam(), kVcpus, kIters);
  std::uint64_t boosted = 0, emulated = 0, posts = 0, entries = 0, returns = 0;
  auto p1 = std::optional<Probe>(g.boosted_probe("sys_read", [&](HitContext&) { ++boosted; return 0; }));
  auto p2 = g.session->probe(g.dom, "sys_getppid+5", [](HitContext&) { return 0; }, [&](HitContext&) { ++posts; });
  auto p3 = g.session->probe(g.dom, g.branch_in("demo_recurse"), [&](HitContext&) { ++emulated; return 0; });
  auto p4 = g.session->ret_probe(
      g.dom, "demo_recurse",
      [&](HitContext& c, std::span<std::byte>) {
        // Deep in a recursion, well into the run: calls in flight on the stack.
        if (++entries > 40 && c.regs().rdi == 3) c.stop();
        return 0;
      },
      [&](HitContext&, std::span<std::byte>) { ++returns; }, RetProbeOptions{32, 0});
  ASSERT_TRUE(p1 && p2 && p3 && p4);
  EXPECT_EQ(p1->info()->mode, ExecMode::Boosted);
  EXPECT_EQ(p2->info()->mode, ExecMode::TrapAfter);
  EXPECT_EQ(p3->info()->mode, ExecMode::Emulated);
  const Gva tramp = p4->info()->trampoline;
  for (Probe* p : {&*p1, &*p2, &*p3, &*p4}) p->release();
  ASSERT_NE(g.text(), g.text_before) << "probes armed";

  ASSERT_TRUE(g.session->hypervisor().unpause(g.dom));
  ASSERT_TRUE(g.session->run());
  EXPECT_GT(boosted + posts + emulated, 0u);
  EXPECT_GT(g.on_stacks(tramp.value), 0u) << "return-probe calls in flight";
  // Nobody answers from here on: the vCPUs pile up on the traps.
  std::this_thread::sleep_for(50ms);

  int jfd = g.abandon();
  ASSERT_GE(jfd, 0);
  EXPECT_FALSE(g.host->wait_halted(g.dom, 300ms)) << "without recovery the guest is stuck";

  auto snap = probe::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap) << snap.error().what;
  EXPECT_FALSE(snap->clean);
  EXPECT_EQ(snap->torn, 0u);
  ASSERT_EQ(snap->domains.size(), 1u);
  EXPECT_GE(snap->patches.size(), 6u) << "4 points, a slot trap and the trampoline";
  EXPECT_GT(snap->returns.size(), 0u);

  auto hv = g.host->open();  // the guardian's own handle
  auto rep = probe::recover(*hv, *snap);
  EXPECT_EQ(rep.failures, 0u);
  EXPECT_EQ(rep.domains, 1u);
  // (Popped slots below a stack pointer may still hold the trampoline's address: dead data.)
  for (const auto& r : snap->returns) {
    std::uint64_t v = 0;
    std::memcpy(&v, g.peek(r.slot.value, 8).data(), 8);
    EXPECT_NE(v, tramp.value) << "a call in flight still returns to the trampoline";
  }
  EXPECT_GE(rep.restored, 4u);
  EXPECT_EQ(rep.left_alone, 0u);
  EXPECT_GT(rep.returns_restored, 0u);

  EXPECT_EQ(g.text(), g.text_before) << "kernel text byte-identical";
  EXPECT_EQ(*g.host->pause_count(g.dom), 0u) << "no pause left";
  auto info = hv->domain_info(g.dom);
  EXPECT_FALSE(info->debugged);
  ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.host->crash_reason(g.dom), "");
  for (unsigned v = 0; v < kVcpus; ++v)
    EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, kVcpus, info->type).checksum) << "vCPU " << v;
  if (GetParam() == ChannelKind::VmEvent) {
    // The ring is gone: a new monitor can be enabled.
    auto ring = hv->monitor_enable(g.dom);
    EXPECT_TRUE(ring) << ring.error().what;
  }
}

// A vCPU stopped in a post-handler slot, and the slot's trap: both go on without Dom0.
TEST_P(Abandoned, VcpusInsidePostHandlerSlotsGoOn) {
  constexpr std::uint64_t kIters = 200;
  Guest g(GetParam(), 2, kIters);
  std::uint64_t posts = 0;
  auto p = g.session->probe(g.dom, "sys_getppid+5", [](HitContext&) { return 0; }, [&](HitContext& c) {
    if (++posts == 40) c.stop();
  });
  ASSERT_TRUE(p);
  p->release();
  ASSERT_TRUE(g.session->hypervisor().unpause(g.dom));
  ASSERT_TRUE(g.session->run());
  std::this_thread::sleep_for(30ms);
  int jfd = g.abandon();
  auto snap = probe::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap);
  auto hv = g.host->open();
  auto rep = probe::recover(*hv, *snap);
  EXPECT_EQ(rep.failures, 0u);
  EXPECT_EQ(g.text(), g.text_before);
  ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << g.host->crash_reason(g.dom);
  auto type = GetParam() == ChannelKind::VmEvent ? hv::GuestType::Hvm : hv::GuestType::Pv;
  for (unsigned v = 0; v < 2; ++v) EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, 2, type).checksum);
}

// Bytes that changed since we wrote them are not ours any more: left alone, and the
// administrator's own pause (the domain was created paused) is not released either.
TEST_P(Abandoned, ChangedBytesAreLeftAloneAndForeignPausesKept) {
  Guest g(GetParam(), 1, 5);
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  auto b = g.session->probe(g.dom, "sys_write", [](HitContext&) { return 0; });
  ASSERT_TRUE(a && b);
  const Gva changed = a->info()->address, kept = b->info()->address;
  a->release();
  b->release();
  int jfd = g.abandon();
  auto hv = g.host->open();
  // Someone else rewrote the byte at `changed` meanwhile.
  {
    mem::HypervisorFrameSource src(*hv, g.dom);
    mem::GuestMemory m(src);
    m.set_context(*mem::paging_context(*hv->domain_info(g.dom), *hv->get_vcpu_regs(g.dom, VcpuId{0})));
    std::uint8_t cc = 0xcc;
    ASSERT_TRUE(m.write(changed, std::as_bytes(std::span(&cc, 1))));
  }
  auto snap = probe::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap);
  auto rep = probe::recover(*hv, *snap);
  EXPECT_EQ(rep.left_alone, 1u);
  EXPECT_EQ(rep.restored, 1u);
  EXPECT_EQ(rep.failures, 0u);
  EXPECT_EQ(g.peek(changed.value, 1)[0], 0xcc) << "not ours: untouched";
  const auto off = kept.value - g.layout.text_start;
  EXPECT_EQ(g.peek(kept.value, 1)[0], g.text_before[off]) << "ours: restored";
  EXPECT_EQ(*g.host->pause_count(g.dom), 1u) << "the creation pause is not ours to release";
}

// A domain that died meanwhile is skipped, and nothing fails.
TEST_P(Abandoned, ADomainGoneIsSkipped) {
  Guest g(GetParam(), 1, 5);
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(a);
  a->release();
  int jfd = g.abandon();
  ASSERT_TRUE(g.host->destroy_domain(g.dom));
  auto snap = probe::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap);
  auto hv = g.host->open();
  auto rep = probe::recover(*hv, *snap);
  EXPECT_EQ(rep.gone, 1u);
  EXPECT_EQ(rep.domains, 0u);
  EXPECT_EQ(rep.failures, 0u);
}

// An orderly end leaves the guardian nothing: the clean flag, and no record.
TEST_P(Abandoned, TheCleanPathLeavesNothingToDo) {
  Guest g(GetParam(), 2, 20);
  std::uint64_t entries = 0;
  auto a = g.session->probe(g.dom, "sys_getppid+5", [](HitContext&) { return 0; }, [](HitContext&) {});
  auto r = g.session->ret_probe(
      g.dom, "demo_recurse",
      [&](HitContext& c, std::span<std::byte>) {
        if (++entries == 30) c.stop();
        return 0;
      },
      nullptr, RetProbeOptions{32, 0});
  ASSERT_TRUE(a && r);
  a->release();
  r->release();
  ASSERT_TRUE(g.session->hypervisor().unpause(g.dom));
  ASSERT_TRUE(g.session->run());
  int jfd = ::dup(SessionTesting::journal_fd(*g.session));
  g.session.reset();  // the orderly end
  auto snap = probe::read_journal_fd(jfd);
  ::close(jfd);
  ASSERT_TRUE(snap);
  EXPECT_TRUE(snap->clean);
  EXPECT_TRUE(snap->domains.empty() && snap->patches.empty() && snap->returns.empty());
  auto hv = g.host->open();
  auto rep = probe::recover(*hv, *snap);
  EXPECT_EQ(rep.domains + rep.restored + rep.unpaused + rep.failures, 0u);
  ASSERT_TRUE(g.host->wait_halted(g.dom, 60s)) << g.host->crash_reason(g.dom);
}

INSTANTIATE_TEST_SUITE_P(Channels, Abandoned, ::testing::Values(ChannelKind::Debugger, ChannelKind::VmEvent),
                         [](const auto& i) { return std::string(channel_kind_name(i.param)); });

// The guest channel is never journaled: its module has a fail-safe of its own.
TEST(GuardianJournalScope, TheGuestChannelIsNotJournaled) {
  Guest g(ChannelKind::Guest, 1, 5);
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(a);
  auto snap = probe::read_journal_fd(SessionTesting::journal_fd(*g.session));
  ASSERT_TRUE(snap);
  EXPECT_TRUE(snap->domains.empty() && snap->patches.empty());
}

}  // namespace
}  // namespace xenprobes::testing
