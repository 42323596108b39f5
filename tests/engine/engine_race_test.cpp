// XP probes on the simulated Xen, on the test's channel: a guest's own int3s (the debugger
// channel's), hits pending when their probe goes, a module detaching or withdrawing, handlers
// that translate afresh, the session ending while vCPUs run.
#include <cstring>
#include <set>
#include <tuple>
#include <thread>

#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"
#include "api/session_testing.hpp"
#include "xenprobes/guest_view.hpp"

#include "engine/engine_fixture.hpp"

namespace xenprobes::testing {
namespace {

// The guest's own int3 (text_poke_bp, an in-guest kprobe) stops the domain under debugging
// mode without a VIRQ; the channel finds it by polling, rewinds the vCPU and lets it retry
// until the guest has finished patching.
TEST(ForeignInt3, RewoundAndRetriedUntilTheGuestRemovesIt) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Debugger);
  ProbedGuest g(demo_config(2, 8));
  std::uint64_t hits = 0;
  auto p = g.session->probe(g.dom, "sys_read", [&](HitContext&) {
    ++hits;
    return 0;
  });
  ASSERT_TRUE(p);
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  std::uint64_t at = g.sym("demo_classify");  // the guest "patches" here: int3 over the nop5
  std::uint8_t orig = g.peek(at, 1)[0], cc = 0xcc;
  ASSERT_TRUE((*gv)->write(Gva{at}, std::as_bytes(std::span(&cc, 1))));
  g.start();
  // Let vCPUs run into it and be retried a while.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(g.session->run_once(1));
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
  ASSERT_TRUE((*gv)->write(Gva{at}, std::as_bytes(std::span(&orig, 1))));  // patching done
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  auto ref = reference_stats(0, 8, 2);
  EXPECT_EQ(g.stats(0).checksum, ref.checksum);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_CLASSIFY], ref.calls[DEMO_FN_CLASSIFY]);
  EXPECT_EQ(hits, 2 * expected_calls(DEMO_FN_READ, 8));
}

// A guest breakpoint that never goes away: after a bounded number of retries the channel
// gives the domain up — our probes are disarmed and debugging mode is switched off, so the
// guest takes its own #BP (the demo guest has no handler for it and oopses, as it would).
TEST(ForeignInt3, PermanentOneMakesTheChannelGiveUpCleanly) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Debugger);
  ProbedGuest g(demo_config(1, 0));
  std::uint64_t open_fn = g.sym("sys_open");
  auto text = g.peek(open_fn, 16);
  auto p = g.session->probe(g.dom, "sys_open", [](HitContext&) { return 0; });
  ASSERT_TRUE(p);
  auto gv = GuestView::open(g.session->hypervisor(), g.dom);
  std::uint64_t at = g.sym("demo_classify");
  std::uint8_t cc = 0xcc;
  ASSERT_TRUE((*gv)->write(Gva{at}, std::as_bytes(std::span(&cc, 1))));
  g.start();
  auto end = std::chrono::steady_clock::now() + 60s;
  while (g.session->hypervisor().domain_info(g.dom)->debugged && std::chrono::steady_clock::now() < end)
    ASSERT_TRUE(g.session->run_once(0));
  EXPECT_FALSE(g.session->hypervisor().domain_info(g.dom)->debugged);
  EXPECT_EQ(g.peek(open_fn, 16), text) << "our probe was disarmed";
  auto again = p->enable();
  ASSERT_FALSE(again) << "nothing may be armed in a domain the channel gave up";
  EXPECT_EQ(again.error().code, Errc::Busy);
  EXPECT_EQ(g.peek(open_fn, 16), text);
  ASSERT_TRUE(eventually_crashed(g));
  EXPECT_NE(g.host->crash_reason(g.dom).find("#BP"), std::string::npos) << g.host->crash_reason(g.dom);
}

// Stops that landed before an unregister are found (through the now disarmed point) and
// rewound onto the restored instruction: nothing stays paused, nothing runs mid-instruction.
TEST(Probe, UnregisterWithStopsPendingRewindsThem) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Debugger);
  for (unsigned round = 0; round < 5; ++round) {
    ProbedGuest g(demo_config(2, 0));
    auto p = g.session->probe(g.dom, "sys_read+5", [](HitContext&) { return 0; });
    ASSERT_TRUE(p);
    g.start();
    // Nobody runs the loop: the vCPUs stop on the probe and stay stopped.
    ASSERT_TRUE(eventually_paused(g));
    std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(p->unregister());
    EXPECT_FALSE(g.session->hypervisor().domain_info(g.dom)->paused) << "round " << round;
    // The guest runs on (however slowly a loaded host schedules its vCPUs).
    const auto it = g.stats(0).iterations + g.stats(1).iterations;
    EXPECT_TRUE(eventually([&] { return g.stats(0).iterations + g.stats(1).iterations > it; })) << "round " << round;
    EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
  }
}

// A vCPU that Xen pauses inside the guest module's int3 hook, after its trap-table lookup and
// before its mailbox write, publishes its hit after the pause: when that pause was the one in
// which the probe was unregistered, for a trap that is gone. Dom0 answers it at once (the
// original instruction runs, no handler): it does not wait out the module's timeout with
// interrupts off, nor count as a timeout. The sim stops the vCPU exactly there
// (SimHost::hold_module_hits); the module's clock never moves, so an unanswered hit would
// wait for ever.
TEST(Probe, AHitPublishedAfterItsProbeWasUnregisteredRunsTheOriginal) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  constexpr std::uint64_t kIters = 3;
  ProbedGuest g(demo_config(1, kIters));
  std::uint64_t hits = 0;
  auto p = g.session->probe(g.dom, "sys_write", [&](HitContext&) { return ++hits, 0; });
  ASSERT_TRUE(p) << p.error().what;
  ASSERT_TRUE(g.host->hold_module_hits(g.dom, VcpuId{0}, true));
  g.start();
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!g.host->module_hit_held(g.dom, VcpuId{0}).value_or(false) && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(g.host->module_hit_held(g.dom, VcpuId{0}).value_or(false)) << "the vCPU never reached the probe";
  ASSERT_TRUE(p->unregister());
  ASSERT_TRUE(g.host->hold_module_hits(g.dom, VcpuId{0}, false));  // the hit is published now
  ASSERT_TRUE(g.run_to_completion(20s)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(hits, 0u) << "a handler ran for a probe already unregistered";
  auto c = SessionTesting::module_counters(*g.session, g.dom);
  ASSERT_TRUE(c) << c.error().what;
  EXPECT_EQ(c->timeouts, 0u);
  EXPECT_EQ(c->hits, 1u);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_WRITE], expected_calls(DEMO_FN_WRITE, kIters));
}

// The guest module detaches (protocol.h "Detaching") while a program registers probes: until
// Dom0 has read the removal of `state`, a registration reaches the channel, which refuses it
// (the module's restore pass has read its table already); the registration fails saying so and
// leaves the guest's text as it was. Once the loop has run, the domain is no longer attached.
TEST(Probe, ARegistrationWhileTheGuestModuleDetachesIsRefusedAndWritesNothing) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, 3));
  auto p = g.session->probe(g.dom, "sys_write", [](HitContext&) { return 0; });
  ASSERT_TRUE(p) << p.error().what;
  const std::uint64_t read = g.sym("sys_read");
  const auto before = g.peek(read, 16);
  auto restored = g.host->module_detach(g.dom);
  ASSERT_TRUE(restored) << restored.error().what;
  EXPECT_GE(*restored, 1u) << "sys_write's trap byte";
  auto q = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_FALSE(q) << "a probe was registered on a module that is detaching";
  EXPECT_NE(q.error().what.find("detaching"), std::string::npos) << q.error().what;
  EXPECT_EQ(g.peek(read, 16), before) << "the refused registration wrote into the guest";
}

// The guest changes its page tables between hits (a stack freed and reused, a process gone):
// each hit translates afresh. Here "the guest" points the page of demo_ppid at the frame of
// another page while probes run; the handler's next read must follow the new mapping, not a
// translation cached from an earlier hit.
TEST(Probe, HandlersTranslateAfreshOnEveryHit) {
  ProbedGuest g(demo_config(1, 0));
  const std::uint64_t va = g.sym(DEMO_SYM_PPID), other = g.sym("__start_rodata");
  ASSERT_EQ(va & 0xfff, 0u);
  ASSERT_EQ(other & 0xfff, 0u);
  std::uint32_t other_value = 0;
  ASSERT_TRUE(g.host->peek(g.dom, other, std::as_writable_bytes(std::span(&other_value, 1))));
  ASSERT_NE(other_value, 1u);
  std::vector<std::uint32_t> seen;
  auto p = g.session->probe(g.dom, "sys_getppid", [&](HitContext& c) {
    std::uint32_t v = 0;
    if (c.read(Gva{va}, std::as_writable_bytes(std::span(&v, 1)))) seen.push_back(v);
    return 0;
  });
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  while (seen.size() < 5) ASSERT_TRUE(g.session->run_once(5));
  EXPECT_EQ(seen.back(), 1u);

  // The guest's side: rewrite the leaf entry of va's page, domain paused.
  auto hv = g.host->open();
  mem::HypervisorFrameSource src(*hv, g.dom);
  mem::GuestMemory gm(src);
  ASSERT_TRUE(hv->pause(g.dom));
  auto ctx = mem::paging_context(*hv->domain_info(g.dom), *hv->get_vcpu_regs(g.dom, VcpuId{0}));
  ASSERT_TRUE(ctx);
  gm.set_context(*ctx);
  auto t = gm.translate(Gva{va}), u = gm.translate(Gva{other});
  ASSERT_TRUE(t && u);
  ASSERT_EQ(t->page_size, 4096u) << "the demo image is mapped with 4 KiB pages";
  const Frame table = t->table_frames[t->depth - 1];
  const std::size_t at = ((va >> 12) & 511) * 8;
  const std::uint64_t entry = t->entries[t->depth - 1];
  const std::uint64_t moved = (entry & ~0x000ffffffffff000ull) | (u->frame().value << 12);
  {
    auto m = hv->map_frames(g.dom, std::span(&table, 1), hv::MapAccess::ReadWrite);
    ASSERT_TRUE(m) << m.error().what;
    std::memcpy(m->data() + at, &moved, 8);
  }
  ASSERT_TRUE(hv->unpause(g.dom));
  const std::size_t before = seen.size();
  while (seen.size() < before + 5) ASSERT_TRUE(g.session->run_once(5));
  EXPECT_EQ(seen.back(), other_value) << "a translation cached from an earlier hit was used";

  ASSERT_TRUE(p->unregister());
  ASSERT_TRUE(hv->pause(g.dom));
  {
    auto m = hv->map_frames(g.dom, std::span(&table, 1), hv::MapAccess::ReadWrite);
    ASSERT_TRUE(m);
    std::memcpy(m->data() + at, &entry, 8);
  }
  ASSERT_TRUE(hv->unpause(g.dom));
}

TEST(Probe, SessionEndWhileVcpusRunThroughPostHandlerSlots) {
  // Post-handler slots end with a trap byte. A vCPU can be inside such a slot when Dom0
  // detaches; the slot must let it go on by itself afterwards.
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    ProbedGuest g(demo_config(2, 400));
    std::uint64_t posts = 0;
    auto p = g.session->probe(
        g.dom, "sys_getppid+5", [](HitContext&) { return 0; }, [&](HitContext&) { ++posts; });
    ASSERT_TRUE(p) << p.error().what;
    g.start();
    while (posts < 50u * (round + 1)) ASSERT_TRUE(g.session->run_once(5));
    p->release();
    g.session.reset();  // detach with both vCPUs running through the probe
    ASSERT_TRUE(g.finish_without_dom0(120s)) << g.host->crash_reason(g.dom);
    for (unsigned v = 0; v < 2; ++v) EXPECT_EQ(g.stats(v).checksum, reference_stats(v, 400, 2).checksum);
  }
}

TEST(Probe, GuestModuleWithdrawingDropsTheDomainWithoutWritingToIt) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ProbedGuest g(demo_config(1, 0));
  std::uint64_t hits = 0;
  auto p = g.session->probe(g.dom, "sys_getppid", [&](HitContext&) {
    ++hits;
    return 0;
  });
  ASSERT_TRUE(p);
  g.start();
  while (hits < 5) ASSERT_TRUE(g.session->run_once(5));
  // The module withdraws (its detach removes `state` first, then restores the text itself).
  auto other = g.host->open();
  ASSERT_TRUE(other->xs_rm("/local/domain/" + std::to_string(g.dom.value) + "/data/xenprobes/state"));
  auto end = std::chrono::steady_clock::now() + 10s;
  while (p->info() && std::chrono::steady_clock::now() < end) ASSERT_TRUE(g.session->run_once(5));
  auto info = p->info();
  ASSERT_FALSE(info) << "the session still holds the probe";
  EXPECT_EQ(info.error().code, Errc::NotFound);
  EXPECT_TRUE(p->unregister()) << "unregistering a dropped probe is not an error";
}

}  // namespace
}  // namespace xenprobes::testing
