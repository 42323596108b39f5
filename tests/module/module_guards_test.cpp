// What the guest module refuses or gives up on (guest-module/xp_logic.c, xp_gone.h, xp_budget.h):
// trap entries of modules that went, the budget of waiting for Dom0, and the addresses it
// resumes at, restores or classifies.
#include "module/module_logic_fixture.hpp"

#include "xp_budget.h"
#include "xp_gone.h"

namespace {

using namespace module_logic;

// ---- modules that went (protocol.h "Modules that go") ----

TEST(ModuleIdentity, FnvOfTheNameUpToItsNulThenTheBase) {
  // Worked out by hand (FNV-1a, 32 bits) for "ext4" at 0xffffffffc0a00000.
  EXPECT_EQ(xenprobes_module_id("ext4", 56, 0xffffffffc0a00000ull), 0x5ede893cu);
  const char padded[56] = "ext4\0junk after the NUL";
  EXPECT_EQ(xenprobes_module_id(padded, sizeof padded, 0xffffffffc0a00000ull), 0x5ede893cu);
  EXPECT_EQ(xenprobes_module_id("ext4xyz", 4, 0xffffffffc0a00000ull), 0x5ede893cu) << "at most max bytes";
  EXPECT_NE(xenprobes_module_id("ext4", 56, 0xffffffffc0a01000ull), 0x5ede893cu) << "the base counts";
  EXPECT_NE(xenprobes_module_id("ext3", 56, 0xffffffffc0a00000ull), 0x5ede893cu) << "the name counts";
  EXPECT_EQ(xenprobes_module_id("", 56, 0), 0x9be17165u);
}

TEST(ModuleGone, AModuleJoinsOnlyWhenALiveEntryNamesIt) {
  std::vector<xenprobes_trap> t = {trap(kModules + 0x10, XENPROBES_TRAP_EMULATE, {0x55}),
                                   trap(kModules + 0x20, XENPROBES_TRAP_EMULATE, {0x55}),
                                   trap(kText + 0x10, XENPROBES_TRAP_EMULATE, {0x55})};
  t[0].module = 7;
  t[1].module = 9;  // beyond nr_traps below: not live
  xp_gone g{};
  EXPECT_FALSE(xp_gone_going(&g, 9, t.data(), 1, 3)) << "only the first nr_traps entries are live";
  EXPECT_FALSE(xp_gone_going(&g, 9, t.data(), 3, 1)) << "nr_traps is clamped to the capacity";
  EXPECT_FALSE(xp_gone_going(&g, 5, t.data(), 3, 3)) << "a module nobody probed leaves no trace";
  EXPECT_FALSE(xp_gone_going(&g, 0, t.data(), 3, 3)) << "0 is no module";
  EXPECT_EQ(g.n, 0u);
  EXPECT_TRUE(xp_gone_going(&g, 7, t.data(), 3, 3));
  EXPECT_TRUE(xp_gone_going(&g, 7, t.data(), 3, 3));
  EXPECT_EQ(g.n, 1u) << "once";
  EXPECT_TRUE(xp_gone_has(&g, &t[0]));
  EXPECT_FALSE(xp_gone_has(&g, &t[1]));
  EXPECT_FALSE(xp_gone_has(&g, &t[2])) << "core kernel text has no module";
  xp_gone_coming(&g, 5);  // another module comes: nothing changes
  EXPECT_TRUE(xp_gone_has(&g, &t[0]));
  xp_gone_coming(&g, 7);  // the same name at the same base: back
  EXPECT_FALSE(xp_gone_has(&g, &t[0]));
  EXPECT_EQ(g.n, 0u);
}

TEST(ModuleGone, FullMeansEveryModuleEntryCountsAsGone) {
  std::vector<xenprobes_trap> t(XP_GONE_MAX + 2, trap(kModules + 0x10, XENPROBES_TRAP_EMULATE, {0x55}));
  for (std::uint32_t i = 0; i < t.size(); ++i) t[i].module = 100 + i;
  const auto n = static_cast<std::uint32_t>(t.size());
  xp_gone g{};
  for (std::uint32_t i = 0; i < XP_GONE_MAX; ++i) ASSERT_TRUE(xp_gone_going(&g, 100 + i, t.data(), n, n));
  EXPECT_FALSE(g.full);
  EXPECT_FALSE(xp_gone_has(&g, &t[XP_GONE_MAX]));
  EXPECT_TRUE(xp_gone_going(&g, 100 + XP_GONE_MAX, t.data(), n, n));
  EXPECT_TRUE(g.full);
  EXPECT_EQ(g.n, std::uint32_t{XP_GONE_MAX}) << "never past the array";
  EXPECT_TRUE(xp_gone_has(&g, &t[XP_GONE_MAX + 1])) << "full: a module entry is left alone";
  xp_gone_coming(&g, 100);
  EXPECT_TRUE(xp_gone_has(&g, &t[0])) << "full stays full";
  xenprobes_trap kernel = trap(kText + 0x10, XENPROBES_TRAP_EMULATE, {0x55});
  EXPECT_FALSE(xp_gone_has(&g, &kernel)) << "the kernel's entries are restored whatever the set";
  g.full = false;
  g.n = 0xffffffffu;  // a corrupt count reads and writes inside the array only
  EXPECT_TRUE(xp_gone_has(&g, &t[1]));
  xp_gone_coming(&g, 101);
  EXPECT_EQ(g.n, std::uint32_t{XP_GONE_MAX - 1});
  EXPECT_FALSE(xp_gone_has(&g, &t[1]));
}

// ---- the waiting budget (xp_budget.h) ----

TEST(ModuleBudget, WaitsAddUpToTheBudgetThenTheCpusHitsGoWithoutDom0) {
  xp_budget b{};
  constexpr std::uint64_t kBudget = 10'000;
  xp_budget_look(&b, 0x1000, 5);
  EXPECT_TRUE(xp_budget_allows(&b, kBudget));
  xp_budget_charge(&b, 4'000);
  xp_budget_look(&b, 0x1000, 5);  // the same task, not switched: the sum goes on
  EXPECT_TRUE(xp_budget_allows(&b, kBudget));
  xp_budget_charge(&b, 5'999);
  EXPECT_TRUE(xp_budget_allows(&b, kBudget)) << "9,999 of 10,000 spent";
  xp_budget_charge(&b, 1);
  xp_budget_look(&b, 0x1000, 5);
  EXPECT_FALSE(xp_budget_allows(&b, kBudget)) << "spent";
  EXPECT_EQ(b.spent_ns, 10'000u);
}

TEST(ModuleBudget, ASwitchOrAnotherTaskStartsTheSumAgain) {
  xp_budget b{};
  xp_budget_look(&b, 0x1000, 5);
  xp_budget_charge(&b, 50);
  xp_budget_look(&b, 0x1000, 6);  // the task was switched out and back in
  EXPECT_EQ(b.spent_ns, 0u);
  xp_budget_charge(&b, 50);
  xp_budget_look(&b, 0x2000, 6);  // another task runs on the CPU
  EXPECT_EQ(b.spent_ns, 0u);
  xp_budget_charge(&b, 50);
  xp_budget_look(&b, 0x1000, 6);  // the first again, with the count it had: still a switch
  EXPECT_EQ(b.spent_ns, 0u);
  EXPECT_TRUE(xp_budget_allows(&b, 10));
}

TEST(ModuleBudget, ZeroIsNoBoundAndTheSumNeverWraps) {
  xp_budget b{};
  xp_budget_look(&b, 0x1000, 1);
  xp_budget_charge(&b, ~std::uint64_t{0} - 1);
  EXPECT_TRUE(xp_budget_allows(&b, 0)) << "budget 0: no bound";
  xp_budget_charge(&b, 5);  // would wrap to 3
  EXPECT_EQ(b.spent_ns, ~std::uint64_t{0});
  EXPECT_FALSE(xp_budget_allows(&b, ~std::uint64_t{0} - 1));
}

// ---- addresses ----

TEST(ModuleAddresses, ClassifyByRangeOeaFirst) {
  Guest g;
  auto b = g.bounds();
  EXPECT_EQ(xp_addr_classify(&b, kText), XP_ADDR_KTEXT);
  EXPECT_EQ(xp_addr_classify(&b, kTextEnd - 1), XP_ADDR_KTEXT);
  EXPECT_EQ(xp_addr_classify(&b, kTextEnd), XP_ADDR_BAD);  // kernel data after _etext
  EXPECT_EQ(xp_addr_classify(&b, kModules), XP_ADDR_MODULE);
  EXPECT_EQ(xp_addr_classify(&b, kOea), XP_ADDR_OEA);
  EXPECT_EQ(xp_addr_classify(&b, kOeaEnd - 1), XP_ADDR_OEA);
  EXPECT_EQ(xp_addr_classify(&b, kOeaEnd), XP_ADDR_MODULE);
  EXPECT_EQ(xp_addr_classify(&b, kModulesEnd), XP_ADDR_BAD);            // fixmap etc.
  EXPECT_EQ(xp_addr_classify(&b, 0x400000), XP_ADDR_BAD);               // user space
  EXPECT_EQ(xp_addr_classify(&b, 0xffff888000001000ull), XP_ADDR_BAD);  // direct map
  EXPECT_EQ(xp_addr_classify(&b, kStack), XP_ADDR_BAD);
}

// An int3 executed at a text trap whose byte is restored is stale (run the original
// instruction); one whose byte is still an int3 is a hit; the OEA's traps are always hits.
TEST(ModuleAddresses, StaleTrapOnlyInTextWithTheByteRestored) {
  Guest g;
  auto b = g.bounds();
  EXPECT_TRUE(xp_trap_stale(&b, kText + 0x1819, 0x53));      // push rbx is back
  EXPECT_FALSE(xp_trap_stale(&b, kText + 0x1819, XP_INT3));  // still armed: a hit
  EXPECT_TRUE(xp_trap_stale(&b, kModules + 0x10, 0x89));     // module text alike
  EXPECT_FALSE(xp_trap_stale(&b, kOea + 0x40, 0x53));        // a slot's trap: never stale
  EXPECT_FALSE(xp_trap_stale(&b, kOeaEnd - 1, 0x00));
  EXPECT_TRUE(xp_trap_stale(&b, kOeaEnd, 0x00));  // past the OEA: module text again
}

TEST(ModuleAddresses, ResumeNeedsAnExecutablePage) {
  Guest g;
  auto b = g.bounds();
  EXPECT_TRUE(xp_resume_ok(&b, kText + 0x1234));
  EXPECT_TRUE(xp_resume_ok(&b, kOea + 0x40));
  EXPECT_TRUE(xp_resume_ok(&b, kModules + 0x10));
  g.nx_pages.insert(kModules);  // module data
  EXPECT_FALSE(xp_resume_ok(&b, kModules + 0x10));
  EXPECT_FALSE(xp_resume_ok(&b, 0));
  EXPECT_FALSE(xp_resume_ok(&b, kStack));
  b.is_exec = nullptr;  // no page check: ranges only
  EXPECT_TRUE(xp_resume_ok(&b, kModules + 0x10));
}

TEST(ModuleAddresses, RestoreOnlyInt3sOutsideTheOeaInText) {
  Guest g;
  auto b = g.bounds();
  auto at = [](std::uint64_t addr, std::uint8_t orig) { return trap(addr, XENPROBES_TRAP_FALLBACK, {orig}, kOea); };
  EXPECT_TRUE(xp_restore_ok(&b, ptr(at(kText + 0x10, 0x55)), 0xcc));
  EXPECT_TRUE(xp_restore_ok(&b, ptr(at(kModules + 0x10, 0x0f)), 0xcc));
  EXPECT_FALSE(xp_restore_ok(&b, ptr(at(kOea + 0x10, 0x55)), 0xcc));   // slot traps stay
  EXPECT_FALSE(xp_restore_ok(&b, ptr(at(kText + 0x10, 0x55)), 0x55));  // already restored
  EXPECT_FALSE(xp_restore_ok(&b, ptr(at(kText + 0x10, 0xcc)), 0xcc));  // pointless
  EXPECT_FALSE(xp_restore_ok(&b, ptr(at(kStack, 0x55)), 0xcc));        // never outside text
  EXPECT_FALSE(xp_restore_ok(&b, ptr(at(0x1000, 0x55)), 0xcc));
  // len 0 (protocol.h: only for traps inside the OEA) or > 15: no original byte to restore.
  auto e = at(kText + 0x10, 0x55);
  e.len = 0;
  EXPECT_FALSE(xp_restore_ok(&b, &e, 0xcc));
  e.len = 16;
  EXPECT_FALSE(xp_restore_ok(&b, &e, 0xcc));
  g.nx_pages.insert(kModules);
  EXPECT_FALSE(xp_restore_ok(&b, ptr(at(kModules + 0x10, 0x55)), 0xcc));
}

}  // namespace
