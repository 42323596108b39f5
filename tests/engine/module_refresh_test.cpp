// Loaded modules that come and go after a Session has the guest's symbols (docs/guest-symbols.md
// "When modules come and go"), on every channel: `module:func` of a module loaded later
// resolves and is probed, a hit's stack is unwound through the module's own ORC table, a
// module that went takes its names and its table with it; a hit's walk looks at the module
// list at a bounded rate; check_modules() moves the generation when the list changed; a
// hostile list (a cycle, a bogus pointer) trusts no module and leaves the kernel's symbols
// alone. The guest: tests/engine/module_guest.hpp.
#include <memory>

#include "api/session_testing.hpp"
#include "common/log.hpp"
#include "engine/module_session.hpp"

namespace xenprobes::testing {
namespace {

using Clock = std::chrono::steady_clock;

// The demo's kstack chain from a hit at demo_kstack_leaf: five frames to the end of the stack.
std::vector<std::uint64_t> whole_chain(ProbedGuest& pg) {
  return {pg.sym("demo_kstack_leaf"), pg.sym("demo_kstack_middle") + DEMO_KSTACK_MIDDLE_OFF,
          pg.sym("demo_kstack_outer") + DEMO_KSTACK_OUTER_OFF, pg.sym("demo_kstack_entry") + DEMO_KSTACK_ENTRY_RET_OFF,
          pg.sym("demo_kstack_entry") + DEMO_KSTACK_ENTRY_IRQ_OFF};
}

std::vector<std::uint64_t> frames(const KernelStack& s) {
  std::vector<std::uint64_t> out;
  for (Gva f : s.frames) out.push_back(f.value);
  return out;
}

std::vector<std::string> names(const Result<std::vector<SymbolInfo>>& r) {
  std::vector<std::string> out;
  if (r)
    for (const SymbolInfo& i : *r) out.push_back(i.name);
  return out;
}

TEST(ModuleRefresh, AModuleLoadedAfterTheSymbolsIsResolvedProbedAndUnwoundThrough) {
  ModuleSession m(Split::Callee, 3);
  const ModuleGuest& g = m.mg;
  ProbedGuest& pg = m.g;
  Session& s = m.s;
  auto tables = s.load_unwind_tables(pg.dom);  // no module yet: the kernel's table only
  ASSERT_TRUE(tables) << tables.error().what;
  EXPECT_NE(tables->find("0 module table(s)"), std::string::npos) << *tables;
  const std::uint64_t gen0 = s.symbols_generation(pg.dom);
  EXPECT_GT(gen0, 0u);
  auto before = s.resolve(pg.dom, "kmod:demo_kstack_leaf");
  ASSERT_FALSE(before);
  EXPECT_EQ(before.error().code, Errc::NotFound) << before.error().what;

  ModuleWriter w(s.hypervisor(), pg.dom, g);
  w.load();
  auto leaf = s.resolve(pg.dom, "kmod:demo_kstack_leaf");
  ASSERT_TRUE(leaf) << leaf.error().what;
  EXPECT_EQ(leaf->value, pg.sym("demo_kstack_leaf"));
  EXPECT_GT(s.symbols_generation(pg.dom), gen0);
  EXPECT_EQ(names(s.find_symbols(pg.dom, "kmod:*")),
            (std::vector<std::string>{"kmod:demo_kstack_leaf", "kmod:demo_kstack_middle", "kmod:demo_kstack_outer"}));

  std::vector<KernelStack> stacks;
  std::vector<std::string> errors;
  auto p = s.probe(pg.dom, "kmod:demo_kstack_leaf", [&](HitContext& c) {
    auto st = s.kernel_stack(c);
    if (st) stacks.push_back(*st);
    else errors.push_back(st.error().what);
    return 0;
  });
  ASSERT_TRUE(p) << p.error().what;
  pg.start();
  ASSERT_TRUE(pg.run_to_completion());
  EXPECT_TRUE(errors.empty()) << errors.front();
  ASSERT_EQ(stacks.size(), 3u);
  for (const KernelStack& st : stacks) {
    // leaf, middle and outer through the module's table, then back into the kernel's.
    EXPECT_EQ(frames(st), whole_chain(pg));
    EXPECT_EQ(st.stopped, "end of stack");
    EXPECT_FALSE(st.guessed);
  }
  ASSERT_TRUE(p->unregister());

  // Unloaded: its names are gone, the kernel's stay, and its text is no kernel text any more.
  const std::uint64_t gen1 = s.symbols_generation(pg.dom);
  w.unload();
  auto after = s.resolve(pg.dom, "kmod:demo_kstack_leaf");
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().code, Errc::NotFound) << after.error().what;
  EXPECT_GT(s.symbols_generation(pg.dom), gen1);
  EXPECT_TRUE(names(s.find_symbols(pg.dom, "kmod:*")).empty());
  EXPECT_TRUE(names(s.find_symbols(pg.dom, "demo_kstack_leaf")).empty());
  auto entry = s.resolve(pg.dom, "demo_kstack_entry");
  ASSERT_TRUE(entry) << entry.error().what;
  EXPECT_EQ(entry->value, pg.sym("demo_kstack_entry"));
  auto refused = s.probe(pg.dom, Gva{pg.sym("demo_kstack_leaf")}, [](HitContext&) { return 0; });
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().what.find("not-kernel-text"), std::string::npos) << refused.error().what;
}

// Session::check_modules: a look at the list and nothing else. The generation stays while the
// list does not change, and moves when a module comes and again when it goes (xenprobesd
// reads a domain's types again then: docs/xenprobesd.md "Types").
TEST(ModuleRefresh, CheckModulesMovesTheGenerationWhenAModuleComesOrGoes) {
  ModuleSession m(Split::Callee, 1);
  const ModuleGuest& g = m.mg;
  ProbedGuest& pg = m.g;
  Session& s = m.s;
  auto g0 = s.check_modules(pg.dom);
  ASSERT_TRUE(g0) << g0.error().what;
  EXPECT_EQ(*g0, s.symbols_generation(pg.dom));
  auto same = s.check_modules(pg.dom);
  ASSERT_TRUE(same) << same.error().what;
  EXPECT_EQ(*same, *g0);
  ModuleWriter w(s.hypervisor(), pg.dom, g);
  w.load();
  auto g1 = s.check_modules(pg.dom);
  ASSERT_TRUE(g1) << g1.error().what;
  EXPECT_GT(*g1, *g0);
  EXPECT_EQ(s.symbols_generation(pg.dom), *g1);
  auto again = s.check_modules(pg.dom);
  ASSERT_TRUE(again) << again.error().what;
  EXPECT_EQ(*again, *g1);
  w.unload();
  auto g2 = s.check_modules(pg.dom);
  ASSERT_TRUE(g2) << g2.error().what;
  EXPECT_GT(*g2, *g1);
}

// A probe in the kernel whose callers are a module's: the module loaded after the walk's tables
// were read is found by the walk that runs into its text, at most every 100 ms; unloaded, its
// table goes at the next look, at most a second later. The module clock is virtual: the test
// says when time passes.
TEST(ModuleRefresh, AHitsWalkLooksAtTheModuleListAtABoundedRate) {
  ModuleSession m(Split::Caller, 5);
  const ModuleGuest& g = m.mg;
  ProbedGuest& pg = m.g;
  Session& s = m.s;
  auto now = std::make_shared<Clock::time_point>(Clock::now());
  SessionTesting::set_module_clock(s, [now] { return *now; });
  ASSERT_TRUE(s.load_unwind_tables(pg.dom));

  ModuleWriter w(s.hypervisor(), pg.dom, g);
  std::vector<KernelStack> stacks;
  std::vector<std::uint64_t> gens;
  std::vector<std::string> errors;
  unsigned hit = 0;
  auto p = s.probe(pg.dom, "demo_kstack_leaf", [&](HitContext& c) {
    if (hit == 2) *now += std::chrono::milliseconds(150);   // a miss may look again
    if (hit == 4) *now += std::chrono::milliseconds(1100);  // the periodic look is due
    auto st = s.kernel_stack(c);
    if (st) stacks.push_back(*st);
    else errors.push_back(st.error().what);
    gens.push_back(s.symbols_generation(pg.dom));
    if (hit == 0) w.load();  // insmod between two hits
    if (hit == 3) w.unload();
    ++hit;
    return 0;
  });
  ASSERT_TRUE(p) << p.error().what;
  pg.start();
  ASSERT_TRUE(pg.run_to_completion());
  EXPECT_TRUE(errors.empty()) << errors.front();
  ASSERT_EQ(stacks.size(), 5u);
  const std::vector<std::uint64_t> chain = whole_chain(pg);
  const std::vector<std::uint64_t> cut(chain.begin(), chain.begin() + 2);  // leaf, middle: the kernel's
  // 0: no module. 1: loaded, but the last look is not 100 ms old: not seen.
  for (unsigned i : {0u, 1u}) {
    std::vector<std::uint64_t> f = frames(stacks[i]);
    ASSERT_GE(f.size(), 2u) << "hit " << i;
    EXPECT_LE(f.size(), 3u) << "hit " << i;  // at most the return address into the unknown text
    f.resize(2);
    EXPECT_EQ(f, cut) << "hit " << i;
    EXPECT_EQ(stacks[i].stopped, "address outside kernel text") << "hit " << i;
  }
  EXPECT_EQ(gens[1], gens[0]);
  // 2: the walk ran into the module's text and looked: through its table to the end.
  for (unsigned i : {2u, 3u}) {
    EXPECT_EQ(frames(stacks[i]), chain) << "hit " << i;
    EXPECT_EQ(stacks[i].stopped, "end of stack") << "hit " << i;
    EXPECT_FALSE(stacks[i].guessed) << "hit " << i;
  }
  EXPECT_GT(gens[2], gens[1]);
  // 4: unloaded after hit 3; a second later the look drops its table (and its names).
  EXPECT_EQ(stacks[4].stopped, "address outside kernel text");
  EXPECT_LE(stacks[4].frames.size(), 3u);
  EXPECT_GT(gens[4], gens[3]);
  EXPECT_TRUE(names(s.find_symbols(pg.dom, "kmod:*")).empty());
}

// Whatever the guest's list says, no module is trusted that a walk cannot trust (the walk's own
// checks: docs/probes.md "Address rules"), the kernel's symbols stay, and a sane list afterwards
// is read again.
TEST(ModuleRefresh, AHostileListDropsTheModulesAndKeepsTheKernel) {
  ModuleSession m(Split::Callee, 1);
  const ModuleGuest& g = m.mg;
  ProbedGuest& pg = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  ASSERT_TRUE(s.resolve(pg.dom, "kmod:demo_kstack_leaf"));
  auto kernel_fine = [&] {
    auto e = s.resolve(pg.dom, "demo_kstack_entry");
    return e && e->value == pg.sym("demo_kstack_entry");
  };
  const std::uint64_t list = ModuleGuest::kSlot0 + g.o.list;

  // A cycle: the module's next points at itself.
  w.u64(list, list);
  EXPECT_FALSE(s.resolve(pg.dom, "kmod:demo_kstack_leaf"));
  EXPECT_TRUE(names(s.find_symbols(pg.dom, "kmod:*")).empty());
  EXPECT_TRUE(kernel_fine());
  // Sane again: seen again.
  w.u64(list, ModuleGuest::kHead);
  EXPECT_TRUE(s.resolve(pg.dom, "kmod:demo_kstack_leaf"));
  // A bogus pointer in the head (non-canonical), then one to unmapped kernel memory.
  for (std::uint64_t bogus : {0xdead000000000100ull, 0xffffc90000000000ull}) {
    w.u64(ModuleGuest::kHead, bogus);
    EXPECT_FALSE(s.resolve(pg.dom, "kmod:demo_kstack_leaf")) << std::hex << bogus;
    EXPECT_TRUE(kernel_fine());
  }
  w.u64(ModuleGuest::kHead, list);
  EXPECT_TRUE(s.resolve(pg.dom, "kmod:demo_kstack_leaf"));

  // A list that changes between reads: another module in another struct module at each look;
  // each lookup answers for the list it saw.
  for (int i = 0; i < 6; ++i) {
    const bool odd = i % 2;
    w.load(odd ? "kmod2" : "kmod", odd ? ModuleGuest::kSlot1 : ModuleGuest::kSlot0);
    auto a = s.resolve(pg.dom, std::string(odd ? "kmod2" : "kmod") + ":demo_kstack_leaf");
    EXPECT_TRUE(a) << i << ": " << (a ? "" : a.error().what);
    EXPECT_FALSE(s.resolve(pg.dom, std::string(odd ? "kmod" : "kmod2") + ":demo_kstack_leaf")) << i;
  }
  EXPECT_TRUE(kernel_fine());
}

// The guest module's own restore (Dom0 gone) writes a trap's original byte back where an int3
// still is: in a module's text only while that very module is loaded. Dom0 dies with probes in
// the module and in the kernel; the module is unloaded and (a) another module, whose own code
// holds 0xcc at the probed address (Linux's int3 after every `ret`), is loaded in its place: the
// restore leaves that byte alone and restores the kernel's; (b) the same module comes back at
// the same address: its trap byte is restored like the kernel's.
void dom0_dies_then_the_module_goes(bool another_comes) {
  ModuleSession m(Split::Callee, 40, {}, ModuleSession::Writer::Own);
  auto& hv = m.own;  // the guest's own doings: not through the session that dies
  ProbedGuest& pg = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t leaf = pg.sym("demo_kstack_leaf"), outer = pg.sym("demo_kstack_outer");
  const std::uint64_t getppid = pg.sym("sys_getppid");
  const auto leaf_before = pg.peek(leaf, 1), getppid_before = pg.peek(getppid, 16);
  std::uint64_t in_module = 0, in_kernel = 0;
  auto a = s.probe(pg.dom, "kmod:demo_kstack_leaf", [&](HitContext&) {
    ++in_module;
    return 0;
  });
  auto k = s.probe(pg.dom, "sys_getppid", [&](HitContext&) {
    ++in_kernel;
    return 0;
  });
  ASSERT_TRUE(a) << a.error().what;
  ASSERT_TRUE(k) << k.error().what;
  pg.start();
  while (in_module < 3 || in_kernel < 3) ASSERT_TRUE(s.run_once(5));
  ASSERT_EQ(pg.peek(leaf, 1), std::vector<std::uint8_t>{0xcc});
  a->release();
  k->release();
  SessionTesting::abandon(std::move(pg.session)).reset();  // SIGKILL: nothing restored

  ASSERT_TRUE(hv->pause(pg.dom));
  w.unload();
  EXPECT_EQ(w.gone, 1u) << "the module's trap entry did not name its module: Dom0 wrote no identity";
  if (another_comes) {
    w.load("other");
    EXPECT_EQ(w.gone, 1u) << "another module is not the one that went";
    // Its code: demo_kstack_outer returns at once; the 0xcc at leaf is its own (never run).
    w.write(outer, "\xc3", 1);
  } else {
    w.load("kmod");
    EXPECT_EQ(w.gone, 0u) << "the same module at the same address is back";
  }
  ASSERT_TRUE(hv->unpause(pg.dom));
  ASSERT_TRUE(pg.finish_without_dom0(120s)) << pg.host->crash_reason(pg.dom);
  const std::string console = pg.host->console(pg.dom);
  EXPECT_EQ(pg.peek(getppid, 16), getppid_before) << "the kernel's trap byte restored";
  if (another_comes) {
    EXPECT_EQ(pg.peek(leaf, 1), std::vector<std::uint8_t>{0xcc}) << "the other module's byte written over";
    EXPECT_NE(console.find("left 1 in modules unloaded since"), std::string::npos) << console;
  } else {
    EXPECT_EQ(pg.peek(leaf, 1), leaf_before) << "the same module's trap byte left in place";
    EXPECT_NE(console.find("left 0 in modules unloaded since"), std::string::npos) << console;
  }
}

TEST(ModuleRefresh, TheGuestModulesRestoreLeavesAModuleThatWentAlone) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  dom0_dies_then_the_module_goes(true);
}

TEST(ModuleRefresh, TheGuestModulesRestoreRestoresAModuleThatCameBack) {
  XP_ONLY_ON_CHANNEL(ChannelKind::Guest);
  dom0_dies_then_the_module_goes(false);
}

// Dom0's own `module-gone` path (probe/engine_patch.cpp), on every channel: probes in a module's
// text, the module unloaded (and, in (b), another module loaded over the same text, whose own
// code may hold the trap byte's value there) while one probe is armed and one disabled.
// Unregistering the armed probe writes nothing at its address: the trap byte stays as it is
// (writing the saved byte back would change the other module's code); the user is told why in
// the log; enabling the disabled one is refused with the rule and writes nothing either. A
// probe in the kernel's text in the same session is restored as usual.
void dom0_unregisters_after_the_module_went(bool another_comes) {
  ModuleSession m(Split::Callee, 3);
  ProbedGuest& pg = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t leaf = pg.entry("demo_kstack_leaf"), middle = pg.entry("demo_kstack_middle");
  const std::uint64_t getppid = pg.entry("sys_getppid");
  const auto leaf_before = pg.peek(leaf, 1), middle_before = pg.peek(middle, 1), getppid_before = pg.peek(getppid, 16);
  std::uint64_t in_leaf = 0, in_middle = 0, in_kernel = 0;
  auto a = s.probe(pg.dom, Gva{leaf}, [&](HitContext&) {
    ++in_leaf;
    return 0;
  });
  auto b = s.probe(pg.dom, Gva{middle}, [&](HitContext&) {
    ++in_middle;
    return 0;
  });
  auto k = s.probe(pg.dom, Gva{getppid}, [&](HitContext&) {
    ++in_kernel;
    return 0;
  });
  ASSERT_TRUE(a) << a.error().what;
  ASSERT_TRUE(b) << b.error().what;
  ASSERT_TRUE(k) << k.error().what;
  pg.start();
  ASSERT_TRUE(pg.run_to_completion()) << pg.host->crash_reason(pg.dom);
  EXPECT_EQ(in_leaf, 3u);
  EXPECT_EQ(in_middle, 3u);
  EXPECT_EQ(in_kernel, expected_calls(DEMO_FN_GETPPID, 3));
  ASSERT_TRUE(b->disable());
  EXPECT_EQ(pg.peek(middle, 1), middle_before);
  const std::vector<std::uint8_t> trapped = pg.peek(leaf, 1);
  ASSERT_EQ(trapped[0], trap_byte());

  // The guest has halted: nothing runs the module's text any more.
  w.unload();
  if (another_comes) w.load("other");
  const std::string why =
      another_comes ? "module kmod was unloaded and other loaded over its text" : "module kmod was unloaded";
  ::testing::internal::CaptureStderr();
  auto unreg = a->unregister();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(unreg) << unreg.error().what;
  EXPECT_EQ(pg.peek(leaf, 1), trapped) << "Dom0 wrote into the text of a module that went";
  EXPECT_NE(trapped, leaf_before);
  if (log::level() <= log::Level::Warn) {
    EXPECT_NE(log.find(why), std::string::npos) << log;
    EXPECT_NE(log.find("nothing written"), std::string::npos) << log;
  }

  auto on = b->enable();
  ASSERT_FALSE(on);
  EXPECT_EQ(on.error().code, Errc::NotFound);
  EXPECT_NE(on.error().what.find("refused by rule 'module-gone': " + why), std::string::npos) << on.error().what;
  EXPECT_EQ(pg.peek(middle, 1), middle_before) << "enable wrote into the text of a module that went";
  ASSERT_TRUE(b->unregister());
  EXPECT_EQ(pg.peek(middle, 1), middle_before);

  ASSERT_TRUE(k->unregister());
  EXPECT_EQ(pg.peek(getppid, 16), getppid_before) << "the kernel's probe was not restored";
  EXPECT_TRUE(pg.host->crash_reason(pg.dom).empty()) << pg.host->crash_reason(pg.dom);
}

// A module's text is freed when the guest unloads the module, and its frames may become page
// tables: on a PV guest Dom0 keeps no writable mapping of it after a write (such a mapping is a
// writable type reference, and the guest's fork or exec would fail to pin its page tables:
// seen on a real Xen, e2e stock_pv_jump_module). The core kernel's text keeps its cached
// mapping.
TEST(ModuleRefresh, Dom0KeepsNoWritableMappingOfAModulesText) {
  ModuleSession m(Split::Callee, 3);
  ProbedGuest& pg = m.g;
  Session& s = m.s;
  ModuleWriter& w = m.w;
  w.load();
  const std::uint64_t leaf = pg.entry("demo_kstack_leaf"), getppid = pg.entry("sys_getppid");
  const auto leaf_before = pg.peek(leaf, 1);
  // An HVM guest's page tables are plain memory to Xen: there every mapping stays cached.
  const unsigned kept = guest_type_for() == hv::GuestType::Pv ? 0u : 1u;
  auto writable = [&](std::uint64_t va) {
    auto n = pg.host->writable_mappings(pg.dom, va);
    EXPECT_TRUE(n) << n.error().what;
    return n ? *n : 1000u;
  };
  // The core kernel's text keeps its cached mapping after a write (the demo guest's text is
  // one page: the module's functions share the frame, which the module's write lets go).
  std::uint64_t in_kernel = 0, in_leaf = 0;
  auto k = s.probe(pg.dom, Gva{getppid}, [&](HitContext&) {
    ++in_kernel;
    return 0;
  });
  ASSERT_TRUE(k) << k.error().what;
  EXPECT_GT(writable(getppid), 0u) << "the core kernel's text lost its cached mapping";
  auto a = s.probe(pg.dom, Gva{leaf}, [&](HitContext&) {
    ++in_leaf;
    return 0;
  });
  ASSERT_TRUE(a) << a.error().what;
  ASSERT_EQ(pg.peek(leaf, 1)[0], trap_byte());
  EXPECT_EQ(writable(leaf), kept) << "the trap byte's write left the module's text mapped writable";
  pg.start();
  ASSERT_TRUE(pg.run_to_completion()) << pg.host->crash_reason(pg.dom);
  EXPECT_EQ(in_leaf, 3u);
  EXPECT_EQ(in_kernel, expected_calls(DEMO_FN_GETPPID, 3));
  ASSERT_TRUE(a->disable());
  EXPECT_EQ(pg.peek(leaf, 1), leaf_before);
  EXPECT_EQ(writable(leaf), kept) << "the restore left the module's text mapped writable";
  ASSERT_TRUE(a->enable());
  EXPECT_EQ(writable(leaf), kept) << "arming again left the module's text mapped writable";
  ASSERT_TRUE(a->unregister());
  EXPECT_EQ(pg.peek(leaf, 1), leaf_before);
  EXPECT_EQ(writable(leaf), kept);
  ASSERT_TRUE(k->unregister());
  EXPECT_TRUE(pg.host->crash_reason(pg.dom).empty()) << pg.host->crash_reason(pg.dom);
}

TEST(ModuleRefresh, Dom0WritesNothingIntoTheTextOfAModuleThatWent) { dom0_unregisters_after_the_module_went(false); }

TEST(ModuleRefresh, Dom0WritesNothingIntoAnotherModuleLoadedOverTheText) {
  dom0_unregisters_after_the_module_went(true);
}

}  // namespace
}  // namespace xenprobes::testing
