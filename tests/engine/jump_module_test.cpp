// Jump probes in a loaded module's text (docs/probes.md "Jump probes in a module's text") on the
// simulated Xen, guest channel: the demo guest with part of its text made a loaded module
// (tests/engine/module_guest.hpp). A jump in the module counts every call and gives the text
// back; a branch from another function of the module into the region refuses it (the module's
// own index, built per module load); tail calls and islands are not tried there; a module that
// goes with its jump written, or waiting to be written, is never written again, neither by Dom0
// nor by the guest module's own restore.
#include <cstring>

#include "api/session_testing.hpp"
#include "common/log.hpp"
#include "engine/module_session.hpp"

namespace xenprobes::testing {
namespace {

constexpr std::uint64_t kIterations = 12;

ProbeOptions jump() { return ProbeOptions{ProbeMethod::Jump}; }

std::uint64_t jump_target(std::uint64_t at, const std::vector<std::uint8_t>& b) {
  std::int32_t v = 0;
  std::memcpy(&v, b.data() + 1, 4);
  return at + 5 + static_cast<std::uint64_t>(std::int64_t{v});
}

// The kstack chain runs once per workload iteration: demo_kstack_outer, a function of the module
// in Split::Callee, is called kIterations times.
TEST(JumpModule, AJumpInAModulesTextCountsEveryCallAndGivesTheTextBack) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ModuleSession m(Split::Callee, kIterations);
  const ModuleGuest& mg = m.mg;
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t at = g.sym("demo_kstack_outer");
  const auto text = g.peek(mg.text_start, mg.text_end - mg.text_start);
  std::uint64_t hits = 0;
  {
    auto p = s.probe(
        g.dom, "kmod:demo_kstack_outer",
        [&](HitContext& c) {
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
    EXPECT_EQ(g.peek(at, 1)[0], 0xcc) << "a trap byte until the module confirms quiescence";
    const std::uint64_t detour = info->slot.value;
    g.start();
    ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending; })) << "the jump was never written";
    const auto jmp = g.peek(at, 5);
    EXPECT_EQ(jmp[0], 0xe9);
    EXPECT_EQ(jump_target(at, jmp), detour) << "a jump from the module's text to the detour";
    ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
    EXPECT_EQ(hits, kIterations);
    EXPECT_EQ(p->stats().hits, hits);
    const demo_stats ref = reference_stats(0, kIterations);
    EXPECT_EQ(g.stats(0).checksum, ref.checksum) << "the guest's results unchanged";
  }
  EXPECT_EQ(g.peek(mg.text_start, text.size()), text) << "unregistered: the module's text is its own again";
}

// An async probe there: every call one record, from the module's text, nothing dropped.
TEST(JumpModule, AnAsyncProbeInAModulesTextRecordsEveryCall) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  // room for every record however late Dom0 reads
  ModuleSession m(Split::Callee, kIterations, [](hv::sim::DomainConfig& c) { c.module_ring_order = 16; });
  const ModuleGuest& mg = m.mg;
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t at = g.sym("demo_kstack_outer");
  const auto text = g.peek(mg.text_start, mg.text_end - mg.text_start);
  std::uint64_t records = 0, elsewhere = 0;
  {
    auto p = s.probe_async(g.dom, "kmod:demo_kstack_outer", [&](const AsyncHit& h) {
      ++records;
      elsewhere += h.regs.rip != at;
    });
    ASSERT_TRUE(p) << p.error().what;
    EXPECT_TRUE(p->info()->async);
    g.start();
    ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
    auto rs = s.ring_stats(g.dom);
    ASSERT_TRUE(rs) << rs.error().what;
    EXPECT_EQ(records, kIterations);
    EXPECT_EQ(elsewhere, 0u);
    EXPECT_EQ(rs->drops, 0u);
    EXPECT_EQ(rs->bad_keys, 0u);
  }
  EXPECT_EQ(g.peek(mg.text_start, text.size()), text);
}

// Disabled (its region given back) while the module is there, then the module goes: enabling
// it is refused by rule 'module-gone' and writes nothing.
TEST(JumpModule, EnablingAJumpProbeWhoseModuleWentIsRefused) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ModuleSession m(Split::Callee, kIterations);
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t at = g.sym("demo_kstack_outer");
  const auto before = g.peek(at, 16);
  std::uint64_t hits = 0;
  auto p = s.probe(
      g.dom, "kmod:demo_kstack_outer", [&](HitContext&) { return ++hits, 0; }, {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending; }));
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(hits, kIterations);
  ASSERT_TRUE(p->disable());
  EXPECT_EQ(g.peek(at, 16), before) << "disabled: the region is the module's again";
  w.unload();
  w.load("other");
  auto on = p->enable();
  ASSERT_FALSE(on);
  EXPECT_EQ(on.error().code, Errc::NotFound);
  EXPECT_NE(on.error().what.find("refused by rule 'module-gone'"), std::string::npos) << on.error().what;
  EXPECT_EQ(g.peek(at, 16), before) << "enable wrote into another module's text";
  ASSERT_TRUE(p->unregister());
  EXPECT_EQ(g.peek(at, 16), before);
}

// demo_cross_from jumps to demo_cross_into+2; in Split::Cross both are functions of the module.
TEST(JumpModule, ABranchFromAnotherFunctionOfTheModuleIsNeverInsideARegion) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ModuleSession m(Split::Cross, 1);
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  auto pre = [](HitContext&) { return 0; };
  const std::uint64_t at = g.sym("demo_cross_into");
  ASSERT_EQ(g.peek(at, 2), (std::vector<std::uint8_t>{0x31, 0xc0})) << "the layout this test names";
  auto p = s.probe(g.dom, "kmod:demo_cross_into", pre, {}, jump());
  ASSERT_FALSE(p) << "a jump over the target of demo_cross_from's branch";
  EXPECT_EQ(p.error().code, Errc::NotSupported);
  EXPECT_NE(p.error().what.find("no-branch-into-region"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("a branch from demo_cross_from [kmod]"), std::string::npos) << p.error().what;
  EXPECT_NE(p.error().what.find("(a short jump to an island is not tried in a module's text)"), std::string::npos)
      << p.error().what;
  auto q = s.probe(g.dom, Gva{at + 2}, pre, {}, jump());  // the target starts its own region
  ASSERT_TRUE(q) << q.error().what;
  EXPECT_EQ(q->info()->method, ProbeMethod::Jump);
  // A trap probe there is what Fastest gives, saying why.
  auto f = s.probe(g.dom, Gva{at}, pre, {}, ProbeOptions{ProbeMethod::Fastest});
  ASSERT_TRUE(f) << f.error().what;
  EXPECT_EQ(f->info()->method, ProbeMethod::Trap);
  EXPECT_NE(f->info()->not_jump_because.find("a branch from demo_cross_from [kmod]"), std::string::npos);
}

// The module's index is kept by the module's identity: a module unloaded and loaded again (here
// in another struct module, with demo_cross_from's branch into demo_cross_into gone from its
// code) is decoded afresh, and the region its old branch refused is a jump now.
TEST(JumpModule, AModuleLoadedAgainIsIndexedAfresh) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ModuleSession m(Split::Cross, 1);
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  auto pre = [](HitContext&) { return 0; };
  auto p = s.probe(g.dom, "kmod:demo_cross_into", pre, {}, jump());
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().what.find("a branch from demo_cross_from [kmod]"), std::string::npos) << p.error().what;
  w.unload();
  // demo_cross_from: movl $2, %eax; jmp demo_cross_into+2 becomes movl $2, %eax; ret; nop.
  const std::uint64_t from = g.sym("demo_cross_from");
  ASSERT_EQ(g.peek(from + 5, 1)[0], 0xeb) << "the layout this test names";
  w.write(from + 5, "\xc3\x90", 2);
  w.load("kmod", ModuleGuest::kSlot1);
  auto q = s.probe(g.dom, "kmod:demo_cross_into", pre, {}, jump());
  ASSERT_TRUE(q) << "the old load's index was used: " << q.error().what;
  EXPECT_EQ(q->info()->method, ProbeMethod::Jump);
}

// demo_locked_inc's `lock incq` in the module, while the kernel may still rewrite lock prefixes
// (the demo kernel's .smp_locks is mapped): a module's lock sites are not read, so no region
// covers an instruction with a lock prefix. The `ret` after it would take the 5-byte region
// [lock incq, ret) otherwise (seen accepted with the reservation taken out).
TEST(JumpModule, NoRegionCoversALockPrefixInAModuleWhileTheKernelMayRewriteThem) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ModuleSession m(Split::Cross, 1);
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t fn = g.sym("demo_locked_inc");
  ASSERT_EQ(g.peek(fn + 0xc, 5), (std::vector<std::uint8_t>{0xf0, 0x48, 0xff, 0x00, 0xc3}))
      << "the layout this test names";
  auto p = s.probe(
      g.dom, Gva{fn + 0x10}, [](HitContext&) { return 0; }, {}, jump());
  // (The refusal the jump rules report is the point's own region's: it would cross the
  // function's end. Without the lock prefix reserved, the earlier region is accepted.)
  ASSERT_FALSE(p) << "a region over the lock prefix of a module";
  EXPECT_NE(p.error().what.find("refused by jump rule"), std::string::npos) << p.error().what;
}

// demo_tail_call (`jmp *%rax`) in the module: its indirect jump refuses every region, and the
// proof from the kernel image is not for module text.
TEST(JumpModule, NoTailCallProofInAModulesText) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ModuleSession m(Split::Cross, 1);
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  auto p = s.probe(
      g.dom, "kmod:demo_tail_call", [](HitContext&) { return 0; }, {}, jump());
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().what.find("tail calls are not proven in a module's text"), std::string::npos) << p.error().what;
}

// Dom0's side of a module that goes (rule 'module-gone'): (a) with the jump written, the module
// unloaded (b: and another loaded over its text): unregistering writes nothing there; (c) with
// the jump still waiting for its quiescence when the module goes: it is never written.
enum class Gone { Unloaded, Replaced };

void dom0_after_the_module_went(Gone how) {
  ModuleSession m(Split::Callee, kIterations);
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t at = g.sym("demo_kstack_outer");
  std::uint64_t hits = 0;
  auto p = s.probe(
      g.dom, "kmod:demo_kstack_outer", [&](HitContext&) { return ++hits, 0; }, {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending; }));
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(hits, kIterations);
  const auto written = g.peek(at, 5);
  ASSERT_EQ(written[0], 0xe9);

  // The guest has halted: nothing runs the module's text any more.
  w.unload();
  if (how == Gone::Replaced) w.load("other");
  ::testing::internal::CaptureStderr();
  auto unreg = p->unregister();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(unreg) << unreg.error().what;
  EXPECT_EQ(g.peek(at, 5), written) << "Dom0 wrote into the text of a module that went";
  if (log::level() <= log::Level::Warn) { EXPECT_NE(log.find("nothing written"), std::string::npos) << log; }
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
}

TEST(JumpModule, Dom0WritesNothingIntoTheTextOfAModuleThatWentWithItsJump) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  dom0_after_the_module_went(Gone::Unloaded);
}

TEST(JumpModule, Dom0WritesNothingIntoAnotherModuleLoadedOverTheJump) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  dom0_after_the_module_went(Gone::Replaced);
}

TEST(JumpModule, AJumpWaitingForItsQuiescenceIsNeverWrittenOnceItsModuleWent) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ModuleSession m(Split::Callee, kIterations);
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t at = g.sym("demo_kstack_outer");
  const auto before = g.peek(at, 5);
  std::uint64_t hits = 0;
  auto p = s.probe(
      g.dom, "kmod:demo_kstack_outer", [&](HitContext&) { return ++hits, 0; }, {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  ASSERT_TRUE(p->info()->jump_pending);
  const auto trapped = g.peek(at, 5);
  ASSERT_EQ(trapped[0], 0xcc);
  // Unloaded before the guest ran (the simulated guest keeps running the code, which the trap
  // byte still sends to the detour): the jump waits for a quiescence, then finds the module gone.
  w.unload();
  w.load("other");
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.peek(at, 5), trapped) << "the jump was written into another module's text";
  EXPECT_TRUE(p->info()->jump_pending);
  ASSERT_TRUE(p->unregister());
  EXPECT_EQ(g.peek(at, 5), trapped) << "unregistering wrote into another module's text";
  EXPECT_NE(trapped, before);
}

// A module GOING (its exit running, its text still there) while the jump waits: the jump is not
// written into it; the trap byte keeps counting every call; unregistering gives the bytes back
// (the module is still in the list, its text not freed).
TEST(JumpModule, NoJumpIsWrittenIntoAModuleThatIsGoing) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ModuleSession m(Split::Callee, kIterations);
  const ModuleGuest& mg = m.mg;
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t at = g.sym("demo_kstack_outer");
  const auto before = g.peek(at, 16);
  std::uint64_t hits = 0;
  auto p = s.probe(
      g.dom, "kmod:demo_kstack_outer", [&](HitContext&) { return ++hits, 0; }, {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  w.u32(ModuleGuest::kSlot0 + mg.o.state, 2);  // MODULE_STATE_GOING
  g.start();
  ASSERT_TRUE(g.run_to_completion()) << g.host->crash_reason(g.dom);
  EXPECT_EQ(hits, kIterations);
  EXPECT_TRUE(p->info()->jump_pending) << "a jump was written into a module that is going";
  EXPECT_EQ(g.peek(at, 1)[0], 0xcc);
  ASSERT_TRUE(p->unregister());
  EXPECT_EQ(g.peek(at, 16), before);
}

// Disabled, then its module starts GOING: enabling it is refused and writes nothing (the guest
// module's notifier has seen the module go, so its restore would not know the region).
TEST(JumpModule, EnablingAJumpProbeInAModuleThatIsGoingIsRefused) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  ModuleSession m(Split::Callee, 1);
  const ModuleGuest& mg = m.mg;
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t at = g.sym("demo_kstack_outer");
  const auto before = g.peek(at, 16);
  auto p = s.probe(
      g.dom, "kmod:demo_kstack_outer", [](HitContext&) { return 0; }, {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  ASSERT_TRUE(p->disable());
  EXPECT_EQ(g.peek(at, 16), before);
  w.u32(ModuleGuest::kSlot0 + mg.o.state, 2);  // MODULE_STATE_GOING
  auto on = p->enable();
  ASSERT_FALSE(on);
  EXPECT_NE(on.error().what.find("refused by rule 'module-gone'"), std::string::npos) << on.error().what;
  EXPECT_EQ(g.peek(at, 16), before) << "enable wrote into a module that is going";
  ASSERT_TRUE(p->unregister());
  EXPECT_EQ(g.peek(at, 16), before);
}

// The guest module's own restore (Dom0 gone) after the module went with a jump written in its
// text: (a) another module is loaded over it: the region is left alone (its bytes are the other
// module's now); (b) the same module is back at the same address: the region is restored.
void dom0_dies_with_a_jump_then_the_module_goes(bool another_comes) {
  ModuleSession m(Split::Callee, 60, {}, ModuleSession::Writer::Own);
  auto& hv = m.own;  // the guest's own doings: not through the session that dies
  ProbedGuest& g = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t at = g.sym("demo_kstack_outer");
  const auto before = g.peek(at, 5);
  std::uint64_t hits = 0;
  auto p = s.probe(
      g.dom, "kmod:demo_kstack_outer", [&](HitContext&) { return ++hits, 0; }, {}, jump());
  ASSERT_TRUE(p) << p.error().what;
  g.start();
  ASSERT_TRUE(run_until(g, [&] { return !p->info()->jump_pending && hits >= 3; }));
  ASSERT_TRUE(hv->pause(g.dom));
  const auto written = g.peek(at, 5);
  ASSERT_EQ(written[0], 0xe9);
  ASSERT_TRUE(hv->unpause(g.dom));
  p->release();
  SessionTesting::abandon(std::move(g.session)).reset();  // SIGKILL: nothing restored

  ASSERT_TRUE(hv->pause(g.dom));
  w.unload();
  EXPECT_EQ(w.gone, 1u) << "the region's entry did not name its module: Dom0 wrote no identity";
  if (another_comes) {
    w.load("other");
    EXPECT_EQ(w.gone, 1u);
  } else {
    w.load("kmod");
    EXPECT_EQ(w.gone, 0u) << "the same module at the same address is back";
  }
  ASSERT_TRUE(hv->unpause(g.dom));
  ASSERT_TRUE(g.finish_without_dom0(120s)) << g.host->crash_reason(g.dom);
  const std::string console = g.host->console(g.dom);
  if (another_comes) {
    EXPECT_EQ(g.peek(at, 5), written) << "the guest module wrote into another module's text";
    EXPECT_NE(console.find("left 1 in modules unloaded since"), std::string::npos) << console;
  } else {
    EXPECT_EQ(g.peek(at, 5), before) << "the same module's region left patched";
    EXPECT_NE(console.find("left 0 in modules unloaded since"), std::string::npos) << console;
  }
}

TEST(JumpModule, TheGuestModulesRestoreLeavesTheRegionOfAModuleThatWentAlone) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  dom0_dies_with_a_jump_then_the_module_goes(true);
}

TEST(JumpModule, TheGuestModulesRestoreRestoresTheRegionOfAModuleThatCameBack) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  dom0_dies_with_a_jump_then_the_module_goes(false);
}

}  // namespace
}  // namespace xenprobes::testing
