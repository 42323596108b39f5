// The guest module's pure decisions (guest-module/xp_logic.c and xp_fallback.c), compiled as userspace C11 and
// driven here: the control-area layout, the trap-table search under hostile contents, address
// validation, Dom0's answers, the mailbox state machine (with step 2's spin), branch emulation of every form the
// fallback supports (relative, through a register, ret; never through memory), the return table, the fallback choice, xenstore numbers and the OEA pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <vector>

#include "xp_budget.h"
#include "xp_gone.h"
#include "xp_logic.h"

namespace {

// A guest layout like x86-64 Linux: core text, the module area, our OEA pool inside it.
constexpr std::uint64_t kText = 0xffffffff81000000ull;
constexpr std::uint64_t kTextEnd = 0xffffffff82000000ull;
constexpr std::uint64_t kModules = 0xffffffffc0000000ull;
constexpr std::uint64_t kModulesEnd = 0xffffffffff000000ull;
constexpr std::uint64_t kOea = 0xffffffffc0200000ull;
constexpr std::uint64_t kOeaEnd = kOea + 0x200000;
constexpr std::uint64_t kStack = 0xffffc90000013f00ull;  // a vmap'd kernel stack
constexpr std::uint64_t kRflagsIf = 0x200;               // IF: never taken from Dom0
constexpr std::uint64_t kRflagsDf = 0x400;

struct Guest {
  std::set<std::uint64_t> nx_pages;              // mapped but not executable
  std::map<std::uint64_t, std::uint64_t> stack;  // 8-byte words
  std::set<std::uint64_t> faulting;              // reads/writes there fault
  int writes = 0;

  static bool is_exec(void* ctx, std::uint64_t addr) {
    return !static_cast<Guest*>(ctx)->nx_pages.count(addr & ~0xfffull);
  }
  static bool read(void* ctx, std::uint64_t addr, std::uint64_t* val) {
    auto* g = static_cast<Guest*>(ctx);
    if (g->faulting.count(addr)) return false;
    auto it = g->stack.find(addr);
    *val = it == g->stack.end() ? 0 : it->second;
    return true;
  }
  static bool write(void* ctx, std::uint64_t addr, std::uint64_t val) {
    auto* g = static_cast<Guest*>(ctx);
    if (g->faulting.count(addr)) return false;
    g->stack[addr] = val;
    ++g->writes;
    return true;
  }

  xp_bounds bounds() {
    xp_bounds b{};
    b.ktext = {kText, kTextEnd};
    b.modules = {kModules, kModulesEnd};
    b.oea = {kOea, kOeaEnd};
    b.is_exec = &Guest::is_exec;
    b.ctx = this;
    return b;
  }
  xp_mem_ops mem() { return xp_mem_ops{&Guest::read, &Guest::write, this}; }
};

xenprobes_regs regs_at(std::uint64_t rip) {
  xenprobes_regs r{};
  r.rax = 0x1111;
  r.rbx = 0x2222;
  r.rcx = 0x3333;
  r.rsp = kStack;
  r.rip = rip;
  r.rflags = 0x2 | kRflagsIf;
  r.cs = 0x10;
  r.ss = 0x18;
  return r;
}

xenprobes_trap trap(std::uint64_t addr, std::uint32_t flags, std::initializer_list<std::uint8_t> insn,
                    std::uint64_t fallback = 0) {
  xenprobes_trap t{};
  t.addr = addr;
  t.flags = flags;
  t.fallback = fallback;
  t.len = static_cast<std::uint8_t>(insn.size());
  std::copy(insn.begin(), insn.end(), t.insn);
  return t;
}

// The address of a value that lives until the end of the full expression.
const xenprobes_trap* ptr(const xenprobes_trap& t) { return &t; }

// ---- the control area ----

TEST(ModuleLayout, ArraysAreAlignedDisjointAndInsideThePages) {
  xp_layout l{};
  ASSERT_EQ(xp_layout_compute(4, 1024, 256, &l), 0);
  EXPECT_EQ(l.mailbox_offset, 192u);  // 136-byte header rounded up to 64
  EXPECT_EQ(l.trap_offset, 192u + 4 * 224);
  EXPECT_EQ(l.ret_offset % XP_CTL_ALIGN, 0u);
  EXPECT_GE(l.ret_offset, l.trap_offset + 1024 * sizeof(xenprobes_trap));
  EXPECT_EQ(l.bytes, l.ret_offset + 256 * sizeof(xenprobes_ret));
  EXPECT_EQ(l.pages, (l.bytes + 4095) / 4096);
  EXPECT_LE(l.pages, static_cast<std::uint32_t>(XENPROBES_CTL_MAX_PAGES));
}

TEST(ModuleLayout, NoReturnTableIsFine) {
  xp_layout l{};
  ASSERT_EQ(xp_layout_compute(1, 1, 0, &l), 0);
  EXPECT_EQ(l.pages, 1u);
  EXPECT_EQ(l.bytes, l.ret_offset);
}

TEST(ModuleLayout, RefusesEmptyAndOversizedAreas) {
  xp_layout l{};
  EXPECT_EQ(xp_layout_compute(0, 16, 16, &l), -XP_EINVAL);
  EXPECT_EQ(xp_layout_compute(4, 0, 16, &l), -XP_EINVAL);
  // 64 pages = 262144 bytes: 8192 vCPUs' mailboxes alone need 1.8 MB.
  EXPECT_EQ(xp_layout_compute(8192, 1024, 256, &l), -XP_E2BIG);
  EXPECT_EQ(xp_layout_compute(1, 0xffffffffu, 0xffffffffu, &l), -XP_E2BIG);  // no overflow
  // Exactly at the limit still fits: the trap table starts at 192 + 224 rounded up to 448.
  const std::uint32_t traps = (XENPROBES_CTL_MAX_PAGES * 4096 - 448) / sizeof(xenprobes_trap);
  ASSERT_EQ(xp_layout_compute(1, traps, 0, &l), 0);
  EXPECT_EQ(l.pages, static_cast<std::uint32_t>(XENPROBES_CTL_MAX_PAGES));
  EXPECT_EQ(xp_layout_compute(1, traps + 2, 0, &l), -XP_E2BIG);
}

TEST(ModuleLayout, HeaderSaysWhatTheLayoutIs) {
  xp_layout l{};
  ASSERT_EQ(xp_layout_compute(2, 8, 4, &l), 0);
  xenprobes_ctl_header h;
  std::memset(&h, 0xa5, sizeof h);
  xp_header_init(&h, 2, &l, 8, 4, 250);
  EXPECT_EQ(h.magic, XENPROBES_CTL_MAGIC);
  EXPECT_EQ(h.version, static_cast<std::uint32_t>(XENPROBES_PROTOCOL_VERSION));
  EXPECT_EQ(h.nr_mailboxes, 2u);
  EXPECT_EQ(h.mailbox_offset, l.mailbox_offset);
  EXPECT_EQ(h.trap_capacity, 8u);
  EXPECT_EQ(h.trap_offset, l.trap_offset);
  EXPECT_EQ(h.ret_capacity, 4u);
  EXPECT_EQ(h.ret_offset, l.ret_offset);
  EXPECT_EQ(h.nr_traps, 0u);
  EXPECT_EQ(h.timeout_ms, 250u);
  EXPECT_EQ(h.dom0_gone, 0u);
  EXPECT_EQ(h.hits + h.timeouts + h.foreign + h.nested, 0u);
  EXPECT_EQ(h.wait_ns + h.wait_max_ns + h.over_budget + h.closing, 0u);
  EXPECT_EQ(h.ret_refused, 0u);
}

// ---- the trap table ----

// Entries exactly `capacity` long so that AddressSanitizer sees any read past the end.
std::vector<xenprobes_trap> table_of(std::initializer_list<std::uint64_t> addrs) {
  std::vector<xenprobes_trap> t;
  for (auto a : addrs) t.push_back(trap(a, XENPROBES_TRAP_FALLBACK, {0x55}, a + 0x100));
  return t;
}

TEST(ModuleTrapTable, BinarySearchFindsEveryLiveEntryAndNothingElse) {
  auto t = table_of({kText + 0x10, kText + 0x20, kText + 0x30, kText + 0x40, kText + 0x50});
  const auto n = static_cast<std::uint32_t>(t.size());
  for (const auto& e : t) {
    xenprobes_trap out{};
    ASSERT_TRUE(xp_trap_search(t.data(), n, n, e.addr, &out)) << std::hex << e.addr;
    EXPECT_EQ(out.addr, e.addr);
    EXPECT_EQ(out.fallback, e.fallback);
    EXPECT_EQ(out.insn[0], 0x55);
  }
  xenprobes_trap out{};
  EXPECT_FALSE(xp_trap_search(t.data(), n, n, kText + 0x11, &out));
  EXPECT_FALSE(xp_trap_search(t.data(), n, n, kText, &out));
  EXPECT_FALSE(xp_trap_search(t.data(), n, n, kText + 0x60, &out));
  // Only the first nr_traps entries are live.
  EXPECT_FALSE(xp_trap_search(t.data(), 2, n, kText + 0x30, &out));
  EXPECT_FALSE(xp_trap_scan(t.data(), 2, n, kText + 0x30, &out));
  EXPECT_FALSE(xp_trap_search(t.data(), 0, n, kText + 0x10, &out));
}

TEST(ModuleTrapTable, NrTrapsBeyondCapacityIsClamped) {
  auto t = table_of({kText + 0x10, kText + 0x20, kText + 0x30});
  xenprobes_trap out{};
  // Dom0 claims 2^32-1 live entries in a 3-entry table: no read past the table.
  EXPECT_TRUE(xp_trap_search(t.data(), 0xffffffffu, 3, kText + 0x30, &out));
  EXPECT_FALSE(xp_trap_search(t.data(), 0xffffffffu, 3, kText + 0x40, &out));
  EXPECT_TRUE(xp_trap_scan(t.data(), 0xffffffffu, 3, kText + 0x30, &out));
  EXPECT_FALSE(xp_trap_scan(t.data(), 0xffffffffu, 3, kText + 0x40, &out));
  // A capacity of 2 hides the third entry even from a correct nr_traps.
  EXPECT_FALSE(xp_trap_search(t.data(), 3, 2, kText + 0x30, &out));
  EXPECT_EQ(xp_live_traps(7, 3), 3u);
  EXPECT_EQ(xp_live_traps(2, 3), 2u);
}

TEST(ModuleTrapTable, UnsortedTableTerminatesAndTheScanStillFinds) {
  auto t = table_of({kText + 0x50, kText + 0x10, kText + 0x40, kText + 0x20, kText + 0x30});
  const auto n = static_cast<std::uint32_t>(t.size());
  int found_by_search = 0;
  for (const auto& e : t) {
    xenprobes_trap out{};
    found_by_search += xp_trap_search(t.data(), n, n, e.addr, &out);
    ASSERT_TRUE(xp_trap_scan(t.data(), n, n, e.addr, &out));
    EXPECT_EQ(out.addr, e.addr);
  }
  EXPECT_LT(found_by_search, 5);  // the binary search misses some: that is what scan is for
}

TEST(ModuleTrapTable, AllEqualAndExtremeAddressesTerminate) {
  std::vector<xenprobes_trap> t(64, trap(kText, XENPROBES_TRAP_FALLBACK, {0x90}, kText + 1));
  xenprobes_trap out{};
  EXPECT_TRUE(xp_trap_search(t.data(), 64, 64, kText, &out));
  EXPECT_FALSE(xp_trap_search(t.data(), 64, 64, 0, &out));
  EXPECT_FALSE(xp_trap_search(t.data(), 64, 64, ~0ull, &out));
  t[0].addr = ~0ull;
  t[63].addr = 0;
  EXPECT_FALSE(xp_trap_search(t.data(), 64, 64, 1, &out));
}

TEST(ModuleTrapTable, SnapshotCopiesEveryField) {
  auto e = trap(kText + 5, XENPROBES_TRAP_EMULATE, {0x0f, 0x84, 1, 2, 3, 4}, 0x1234);
  e.module = 0xeeeeeeee;
  xenprobes_trap out;
  std::memset(&out, 0x77, sizeof out);
  xp_trap_snapshot(&out, &e);
  EXPECT_EQ(out.addr, e.addr);
  EXPECT_EQ(out.fallback, e.fallback);
  EXPECT_EQ(out.flags, e.flags);
  EXPECT_EQ(out.len, 6);
  EXPECT_EQ(std::memcmp(out.insn, e.insn, sizeof e.insn), 0);
  EXPECT_EQ(out.module, 0xeeeeeeeeu);
}

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

// ---- Dom0's answer ----

TEST(ModuleAnswer, TakesGprsRipAndOnlyArithmeticFlags) {
  Guest g;
  auto b = g.bounds();
  auto hit = regs_at(kText + 0x100);
  hit.rflags = 0x2 | kRflagsIf | kRflagsDf | XP_RFLAGS_ZF;
  xenprobes_regs ans = hit;
  ans.rax = 0xdead;
  ans.r15 = 0xbeef;
  ans.rsp = hit.rsp - 8;
  ans.rip = kOea + 0x80;
  ans.rflags = XP_RFLAGS_CF | XP_RFLAGS_TF | XP_RFLAGS_OF | 0x3000 /* IOPL */;  // IF/DF/ZF clear
  ans.cs = 0x33;                                                                // user cs: must be ignored
  ans.ss = 0x2b;
  xenprobes_regs out{};
  ASSERT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_OK);
  EXPECT_EQ(out.rax, 0xdeadu);
  EXPECT_EQ(out.r15, 0xbeefu);
  EXPECT_EQ(out.rbx, hit.rbx);
  EXPECT_EQ(out.rsp, hit.rsp - 8);
  EXPECT_EQ(out.rip, kOea + 0x80);
  // TF set by Dom0 is dropped: the guest would take a #DB its kernel WARNs about.
  EXPECT_EQ(out.rflags, 0x2 | kRflagsIf | kRflagsDf | XP_RFLAGS_CF | XP_RFLAGS_OF);
  EXPECT_EQ(out.cs, 0x10u);
  EXPECT_EQ(out.ss, 0x18u);
}

TEST(ModuleAnswer, TrapFlagStaysTheGuests) {
  Guest g;
  auto b = g.bounds();
  auto hit = regs_at(kText + 0x100);
  auto ans = hit;
  ans.rflags = hit.rflags | XP_RFLAGS_TF;  // a handler setting TF
  xenprobes_regs out{};
  ASSERT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_OK);
  EXPECT_EQ(out.rflags & XP_RFLAGS_TF, 0u);
  EXPECT_EQ(out.rflags, hit.rflags);
  // A guest that had TF itself (a kernel debugger stepping) keeps it whatever Dom0 says.
  hit.rflags |= XP_RFLAGS_TF;
  ans.rflags = hit.rflags & ~XP_RFLAGS_TF;
  ASSERT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_OK);
  EXPECT_EQ(out.rflags & XP_RFLAGS_TF, XP_RFLAGS_TF);
}

TEST(ModuleAnswer, RefusesRipOutsideTextAndWildStacks) {
  Guest g;
  auto b = g.bounds();
  auto hit = regs_at(kText + 0x100);
  xenprobes_regs out = regs_at(0x42);
  const xenprobes_regs untouched = out;
  for (std::uint64_t rip :
       std::initializer_list<std::uint64_t>{0x0, 0x400000, kStack, kModulesEnd, 0xffff888000000000}) {
    auto ans = hit;
    ans.rip = rip;
    EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_BAD_RIP) << std::hex << rip;
  }
  auto ans = hit;
  ans.rsp = hit.rsp + XP_RSP_SLACK;  // ret imm16 0xffff: still fine
  EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_OK);
  out = untouched;
  ans.rsp = hit.rsp + XP_RSP_SLACK + 8;
  EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_BAD_RSP);
  ans.rsp = hit.rsp - XP_RSP_SLACK - 8;
  EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_BAD_RSP);
  ans.rsp = 0;
  EXPECT_EQ(xp_answer_apply(&b, &hit, &ans, &out), XP_ANSWER_BAD_RSP);
  EXPECT_EQ(std::memcmp(&out, &untouched, sizeof out), 0);
}

TEST(ModuleAnswer, SnapshotCopiesEveryRegister) {
  xenprobes_regs src;
  auto* words = reinterpret_cast<std::uint64_t*>(&src);
  for (std::size_t i = 0; i < sizeof src / 8; ++i) words[i] = 0x1000 + i;
  xenprobes_regs dst{};
  xp_regs_snapshot(&dst, &src);
  EXPECT_EQ(std::memcmp(&dst, &src, sizeof src), 0);
}

// ---- the mailbox state machine ----

TEST(ModuleMailbox, RouteToDom0OnlyWhenEverythingIsFine) {
  EXPECT_EQ(xp_route_hit(false, false, false, 0, 4), XP_ROUTE_PUBLISH);
  EXPECT_EQ(xp_route_hit(false, false, false, 3, 4), XP_ROUTE_PUBLISH);
  EXPECT_EQ(xp_route_hit(true, false, false, 0, 4), XP_ROUTE_FALLBACK);   // Dom0 gone
  EXPECT_EQ(xp_route_hit(false, true, false, 0, 4), XP_ROUTE_FALLBACK);   // detaching
  EXPECT_EQ(xp_route_hit(false, false, true, 0, 4), XP_ROUTE_FALLBACK);   // nested hit
  EXPECT_EQ(xp_route_hit(false, false, false, 4, 4), XP_ROUTE_FALLBACK);  // no mailbox
  EXPECT_EQ(xp_route_hit(false, false, false, 0, 0), XP_ROUTE_FALLBACK);
}

TEST(ModuleMailbox, WaitEndsOnlyOnThisHitsAnswer) {
  const std::uint32_t seq = 7;
  const std::uint64_t claim = 2000;  // the claim deadline, past the deadline (100)
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_HIT, 6, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 7, seq, 10, 100, claim, false), XP_WAIT_DONE);
  // A DONE for an older hit (a late answer to an abandoned one) is not ours.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 6, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  // Garbage states written by Dom0 do not end the wait either.
  EXPECT_EQ(xp_wait_step(0x12345678, 7, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_IDLE, 7, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_ABANDONED, 7, seq, 10, 100, claim, false), XP_WAIT_AGAIN);
  // The deadline; an answer that is there wins over it.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_HIT, 6, seq, 100, 100, claim, false), XP_WAIT_TIMEOUT);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 7, seq, 200, 100, claim, false), XP_WAIT_DONE);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 7, seq, 5000, 100, claim, false), XP_WAIT_DONE);
  // Garbage past the deadline: time out (it is not a claim).
  EXPECT_EQ(xp_wait_step(0x12345678, 7, seq, 100, 100, claim, false), XP_WAIT_TIMEOUT);
  // Detaching gives up at once.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_HIT, 6, seq, 10, 100, claim, true), XP_WAIT_TIMEOUT);
  // seq wraps around: 0xffffffff + 1 == 0 is just another value.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 0, 0, 10, 100, claim, false), XP_WAIT_DONE);
}

TEST(ModuleMailbox, AClaimedHitIsWaitedForUpToTheClaimBound) {
  const std::uint32_t seq = 7;
  // Before the deadline, claimed or not: wait.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 10, 100, 2000, false), XP_WAIT_AGAIN);
  // Past the deadline a claim keeps the vCPU waiting: Dom0's handlers run on its stack.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 100, 100, 2000, false), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 1999, 100, 2000, false), XP_WAIT_AGAIN);
  // Even when detaching (give_up): the claim is honoured up to its bound.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 10, 100, 2000, true), XP_WAIT_AGAIN);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 2000, 100, 2000, true), XP_WAIT_TIMEOUT);
  // The hard bound.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, 2000, 100, 2000, false), XP_WAIT_TIMEOUT);
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_CLAIMED, 6, seq, ~0ull, 100, 2000, false), XP_WAIT_TIMEOUT);
  // Given back (HIT again) past the deadline: time out now, not at the bound.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_HIT, 6, seq, 150, 100, 2000, false), XP_WAIT_TIMEOUT);
  // The answer still wins.
  EXPECT_EQ(xp_wait_step(XENPROBES_MBOX_DONE, 7, seq, 1500, 100, 2000, false), XP_WAIT_DONE);
}

TEST(ModuleMailbox, ClaimBound) {
  // max(timeout, min(20 x timeout, 10 s)).
  EXPECT_EQ(XENPROBES_CLAIM_FACTOR, 20u);
  EXPECT_EQ(XENPROBES_CLAIM_MAX_MS, 10000u);
  EXPECT_EQ(xp_claim_bound_ms(1), 20u);
  EXPECT_EQ(xp_claim_bound_ms(20), 400u);
  EXPECT_EQ(xp_claim_bound_ms(500), 10000u);  // the module's default timeout
  EXPECT_EQ(xp_claim_bound_ms(499), 9980u);
  EXPECT_EQ(xp_claim_bound_ms(5000), 10000u);                // the module's largest timeout
  EXPECT_EQ(xp_claim_bound_ms(20000), 20000u);               // never below the timeout itself
  EXPECT_EQ(xp_claim_bound_ms(0xffffffffu), 0xffffffffull);  // no overflow
  EXPECT_EQ(xp_claim_bound_ms(0), 0u);
}

TEST(ModuleMailbox, GivingUpAbandonsOrWaitsOrTakesTheAnswer) {
  const std::uint32_t seq = 9;
  // Dom0 completed the answer after the last check: use it, whenever and however often.
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_DONE, 9, seq, false, 0), XP_GIVE_UP_ANSWERED);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_DONE, 9, seq, true, 100), XP_GIVE_UP_ANSWERED);
  // A DONE for another hit is garbage: abandon regardless.
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_DONE, 8, seq, false, 0), XP_GIVE_UP_FORCE);
  // Claimed at the last moment: keep waiting while within the bound (however many tries).
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, false, 0), XP_GIVE_UP_WAIT);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, false, 1000), XP_GIVE_UP_WAIT);
  // Past the bound: swap from CLAIMED (Dom0 died mid-handler), a few times at most.
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, true, 0), XP_GIVE_UP_SWAP);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, true, XP_GIVE_UP_TRIES - 2), XP_GIVE_UP_SWAP);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_CLAIMED, 0, seq, true, XP_GIVE_UP_TRIES - 1), XP_GIVE_UP_FORCE);
  // Given back (HIT after our swap from CLAIMED failed): swap from HIT.
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_HIT, 0, seq, false, 1), XP_GIVE_UP_SWAP);
  EXPECT_EQ(xp_give_up_step(XENPROBES_MBOX_HIT, 0, seq, true, XP_GIVE_UP_TRIES - 1), XP_GIVE_UP_FORCE);
  // Anything else Dom0 must not write: abandon.
  for (std::uint32_t st : {XENPROBES_MBOX_IDLE, XENPROBES_MBOX_ABANDONED, 5u, 0x12345678u, 0xffffffffu}) {
    EXPECT_EQ(xp_give_up_step(st, seq, seq, false, 0), XP_GIVE_UP_FORCE) << st;
    EXPECT_EQ(xp_give_up_step(st, seq, seq, true, 0), XP_GIVE_UP_FORCE) << st;
  }
}

// The exchange as xp_exchange.c runs it (xp_wait, then the give-up loop), on a mailbox whose state
// a scripted Dom0 changes at given times. Returns how the hit ended and when.
struct Exchange {
  enum End { Answered, Abandoned } end;
  std::uint64_t at;  // time the wait ended
  unsigned swaps;    // compare-and-swaps tried
  std::uint32_t final_state;
};
using Dom0Script = std::function<void(std::uint64_t now, std::uint32_t& state, std::uint32_t& answer_seq)>;
Exchange run_exchange(std::uint64_t timeout, std::uint64_t claim_bound, bool detaching, const Dom0Script& dom0) {
  const std::uint32_t seq = 5;
  std::uint32_t state = XENPROBES_MBOX_HIT, answer_seq = 0;
  std::uint64_t now = 0;
  const std::uint64_t deadline = timeout, claim_deadline = claim_bound;
  auto wait = [&] {
    for (;;) {
      dom0(now, state, answer_seq);
      enum xp_wait w = xp_wait_step(state, answer_seq, seq, now, deadline, claim_deadline, detaching);
      if (w != XP_WAIT_AGAIN) return w;
      ++now;  // one poll slice
    }
  };
  Exchange r{Exchange::Abandoned, 0, 0, 0};
  enum xp_wait w = wait();
  std::uint32_t expected = XENPROBES_MBOX_HIT, tries = 0;
  while (w == XP_WAIT_TIMEOUT) {
    dom0(now, state, answer_seq);  // Dom0 may act between the last check and the swap
    ++r.swaps;
    if (r.swaps > 1) ++now;  // a round takes time: the clock moves on
    const std::uint32_t seen = state;
    if (seen == expected) {
      state = XENPROBES_MBOX_ABANDONED;
      r.at = now;
      r.final_state = state;
      return r;
    }
    switch (xp_give_up_step(seen, answer_seq, seq, now >= claim_deadline, tries++)) {
      case XP_GIVE_UP_ANSWERED: w = XP_WAIT_DONE; break;
      case XP_GIVE_UP_WAIT:
        w = wait();
        expected = XENPROBES_MBOX_HIT;
        break;
      case XP_GIVE_UP_SWAP: expected = seen; break;
      case XP_GIVE_UP_FORCE:
        state = XENPROBES_MBOX_ABANDONED;
        r.at = now;
        r.final_state = state;
        return r;
    }
  }
  r.end = Exchange::Answered;
  r.at = now;
  r.final_state = state;
  return r;
}

TEST(ModuleMailbox, ExchangeUnclaimedHitIsAbandonedAtTheTimeout) {
  auto r = run_exchange(100, 2000, false, [](std::uint64_t, std::uint32_t&, std::uint32_t&) {});
  EXPECT_EQ(r.end, Exchange::Abandoned);
  EXPECT_EQ(r.at, 100u);
  EXPECT_EQ(r.swaps, 1u);
}

TEST(ModuleMailbox, ExchangeASlowHandlerIsWaitedFor) {
  // Claimed at 50, answered at 700: far past the timeout, within the claim bound.
  auto r = run_exchange(100, 2000, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now == 50 && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now == 700 && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.end, Exchange::Answered);
  EXPECT_EQ(r.at, 700u);
  EXPECT_EQ(r.swaps, 0u);
}

TEST(ModuleMailbox, ExchangeAClaimAtTheLastMomentIsHonoured) {
  // Dom0 claims between the module's last check and its swap: the swap fails on CLAIMED, the
  // module waits on, and takes the answer.
  int looks_at_100 = 0;
  auto r = run_exchange(100, 2000, false, [&](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    // The first look at 100 is the wait's last check (HIT: time out); the second, the swap.
    if (now == 100 && ++looks_at_100 == 2) st = XENPROBES_MBOX_CLAIMED;
    if (now == 300 && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.end, Exchange::Answered);
  EXPECT_EQ(r.at, 300u);
  EXPECT_EQ(r.swaps, 1u);
}

TEST(ModuleMailbox, ExchangeAClaimNeverFinishedEndsAtTheBound) {
  // Dom0 claims, then dies: the module takes the fallback at the claim bound, swapping from
  // CLAIMED.
  auto r = run_exchange(100, 2000, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now == 10 && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
  });
  EXPECT_EQ(r.end, Exchange::Abandoned);
  EXPECT_GE(r.at, 2000u);  // the bound, plus the second swap's moment
  EXPECT_LE(r.at, 2001u);
  EXPECT_EQ(r.swaps, 2u);  // from HIT (found CLAIMED), then from CLAIMED
  EXPECT_EQ(r.final_state, XENPROBES_MBOX_ABANDONED);
  // Detaching changes nothing about a claim.
  auto d = run_exchange(100, 2000, true, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now == 0 && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
  });
  EXPECT_EQ(d.end, Exchange::Abandoned);
  EXPECT_GE(d.at, 2000u);
  EXPECT_LE(d.at, 2001u);
}

TEST(ModuleMailbox, ExchangeAHitGivenBackIsAbandonedWithoutWaitingForTheBound) {
  auto r = run_exchange(100, 2000, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now == 10 && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now == 400 && st == XENPROBES_MBOX_CLAIMED) st = XENPROBES_MBOX_HIT;  // refused after the claim
  });
  EXPECT_EQ(r.end, Exchange::Abandoned);
  EXPECT_EQ(r.at, 400u);
}

TEST(ModuleMailbox, ExchangeADom0FlippingStatesCannotHoldTheHookPastTheBound) {
  // Every look at the state sees another value: the hook still ends, by the bound.
  std::uint64_t looks = 0;
  auto r = run_exchange(100, 2000, false, [&](std::uint64_t, std::uint32_t& st, std::uint32_t&) {
    st = ++looks % 2 ? XENPROBES_MBOX_CLAIMED : XENPROBES_MBOX_HIT;
  });
  EXPECT_EQ(r.end, Exchange::Abandoned);
  EXPECT_LE(r.at, 2000u);
  EXPECT_LE(r.swaps, 2000u + XP_GIVE_UP_TRIES);
  // Past the bound a state that changes under every swap: at most XP_GIVE_UP_TRIES swaps.
  auto p = run_exchange(100, 100, false, [&](std::uint64_t, std::uint32_t& st, std::uint32_t&) {
    st = ++looks % 2 ? XENPROBES_MBOX_CLAIMED : XENPROBES_MBOX_HIT;
  });
  EXPECT_EQ(p.end, Exchange::Abandoned);
  EXPECT_LE(p.swaps, XP_GIVE_UP_TRIES);
  // Garbage: abandoned at the timeout, not waited for.
  auto g = run_exchange(100, 2000, false, [](std::uint64_t, std::uint32_t& st, std::uint32_t&) { st = 77; });
  EXPECT_EQ(g.end, Exchange::Abandoned);
  EXPECT_EQ(g.at, 100u);
}

// ---- spinning instead of notifying (protocol.h, "Spinning instead of notifying") ----

TEST(ModuleSpin, NotifyOnlyWhileDom0IsNotPolling) {
  EXPECT_TRUE(xp_hit_notify(0));
  // Any nonzero value Dom0 writes means "polling": the hit skips the notification.
  for (std::uint32_t v : {1u, 2u, 0x80000000u, 0xffffffffu}) EXPECT_FALSE(xp_hit_notify(v)) << v;
}

TEST(ModuleSpin, SpinUsIsBounded) {
  EXPECT_EQ(XP_SPIN_MAX_US, 1000);
  EXPECT_TRUE(xp_spin_us_ok(0));  // the default: never spin
  EXPECT_TRUE(xp_spin_us_ok(1));
  EXPECT_TRUE(xp_spin_us_ok(50));
  EXPECT_TRUE(xp_spin_us_ok(1000));
  EXPECT_FALSE(xp_spin_us_ok(1001));
  EXPECT_FALSE(xp_spin_us_ok(0x7fffffffu));
  EXPECT_FALSE(xp_spin_us_ok(0xffffffffu));
}

TEST(ModuleSpin, SpinEndIsMicrosecondsLaterAndSaturates) {
  EXPECT_EQ(xp_spin_until(0, 0), 0u);
  EXPECT_EQ(xp_spin_until(123, 0), 123u);
  EXPECT_EQ(xp_spin_until(0, 1), 1000u);
  EXPECT_EQ(xp_spin_until(5000, 1000), 5000u + 1000000u);
  EXPECT_EQ(xp_spin_until(7, 0xffffffffu), 7u + 0xffffffffull * 1000u);  // no 32-bit overflow
  // A clock near the top of its range: the end saturates instead of wrapping to the past.
  EXPECT_EQ(xp_spin_until(~0ull - 1001, 1), ~0ull - 1);
  EXPECT_EQ(xp_spin_until(~0ull - 1000, 1), ~0ull);  // just fits
  EXPECT_EQ(xp_spin_until(~0ull - 999, 1), ~0ull);   // would wrap: saturated
  EXPECT_EQ(xp_spin_until(~0ull - 999, 2), ~0ull);
  EXPECT_EQ(xp_spin_until(~0ull, 1000), ~0ull);
  EXPECT_EQ(xp_spin_until(~0ull, 0), ~0ull);
}

TEST(ModuleSpin, WaitStepsResultAlwaysWinsOverTheSpinBound) {
  const std::uint64_t until = 1000;
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, 0, until), XP_SPIN_AGAIN);
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, 999, until), XP_SPIN_AGAIN);
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, 1000, until), XP_SPIN_BLOCK);
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, ~0ull, until), XP_SPIN_BLOCK);
  for (std::uint64_t now : {0ull, 999ull, 1000ull, ~0ull}) {
    EXPECT_EQ(xp_spin_step(XP_WAIT_DONE, now, until), XP_SPIN_ENDED) << now;
    EXPECT_EQ(xp_spin_step(XP_WAIT_TIMEOUT, now, until), XP_SPIN_ENDED) << now;
  }
  // spin_us = 0 spins not even once (the module does not set `spinning` at all then).
  EXPECT_EQ(xp_spin_step(XP_WAIT_AGAIN, 42, xp_spin_until(42, 0)), XP_SPIN_BLOCK);
}

// Step 2 as xp_exchange.c runs it (xp_wait() with its spin, xp_spin()), in nanoseconds, on a
// mailbox whose state a scripted Dom0 changes: a spin check costs 100 ns, a block in Xen one
// slice (1 ms) or up to the next deadline.
struct SpinWait {
  enum xp_wait w;
  std::uint64_t at;          // when the wait ended
  unsigned spin_checks = 0;  // checks made while `spinning` was 1
  bool spun_out = false;     // the spin bound passed unanswered (XP_SPIN_BLOCK)
  unsigned polls = 0;        // blocks in Xen (SCHEDOP_poll)
};
constexpr std::uint64_t kUs = 1000, kMs = 1000 * 1000;
SpinWait run_spin_wait(std::uint32_t spin_us, std::uint64_t deadline, std::uint64_t claim_deadline, bool detaching,
                       const Dom0Script& dom0) {
  const std::uint32_t seq = 5;
  std::uint32_t state = XENPROBES_MBOX_HIT, answer_seq = 0;
  std::uint64_t now = 0;
  SpinWait r{XP_WAIT_AGAIN, 0};
  auto check = [&] {
    dom0(now, state, answer_seq);
    return xp_wait_step(state, answer_seq, seq, now, deadline, claim_deadline, detaching);
  };
  if (spin_us) {
    const std::uint64_t until = xp_spin_until(now, spin_us);
    for (;;) {
      const enum xp_wait w = check();
      ++r.spin_checks;
      const enum xp_spin s = xp_spin_step(w, now, until);
      if (s == XP_SPIN_ENDED) {
        r.w = w;
        r.at = now;
        return r;
      }
      if (s == XP_SPIN_BLOCK) {
        r.spun_out = true;
        break;
      }
      now += 100;  // cpu_relax(), then the clock again
    }
  }
  for (;;) {  // the one more check after the spin, then the wait as before
    const enum xp_wait w = check();
    if (w != XP_WAIT_AGAIN) {
      r.w = w;
      r.at = now;
      return r;
    }
    ++r.polls;
    now += std::min((now < deadline ? deadline : claim_deadline) - now, kMs);
  }
}

TEST(ModuleSpin, NoSpinWaitsAsBefore) {
  auto r = run_spin_wait(0, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 30 * kUs && st == XENPROBES_MBOX_HIT) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.w, XP_WAIT_DONE);
  EXPECT_EQ(r.spin_checks, 0u);
  EXPECT_EQ(r.polls, 1u);  // the answer is found after the first block (the notification's wakeup)
  EXPECT_EQ(r.at, 1 * kMs);
}

TEST(ModuleSpin, AnAnswerWithinTheSpinEndsItWithoutBlocking) {
  auto r = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 30 * kUs && st == XENPROBES_MBOX_HIT) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.w, XP_WAIT_DONE);
  EXPECT_EQ(r.at, 30 * kUs);
  EXPECT_FALSE(r.spun_out);
  EXPECT_EQ(r.polls, 0u);
  // Claimed first, answered within the spin: the same.
  auto c = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 5 * kUs && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now >= 60 * kUs && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(c.w, XP_WAIT_DONE);
  EXPECT_EQ(c.at, 60 * kUs);
  EXPECT_EQ(c.polls, 0u);
}

TEST(ModuleSpin, AnAnswerAfterTheSpinIsWaitedForAsBefore) {
  auto r = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 250 * kUs && st == XENPROBES_MBOX_HIT) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(r.w, XP_WAIT_DONE);
  EXPECT_TRUE(r.spun_out);
  EXPECT_EQ(r.spin_checks, 1001u);  // every 100 ns from 0 to the bound (100 us) included
  EXPECT_EQ(r.polls, 1u);
  EXPECT_EQ(r.at, 100 * kUs + 1 * kMs);
  // An answer that lands after the spin's last check (Dom0 read spinning == 1 and skipped the
  // notification) is found by the one more check after spinning = 0, not after a block.
  unsigned looks = 0;
  auto b = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [&](std::uint64_t, std::uint32_t& st, std::uint32_t& as) {
    if (++looks == 1002 && st == XENPROBES_MBOX_HIT) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(b.w, XP_WAIT_DONE);
  EXPECT_TRUE(b.spun_out);
  EXPECT_EQ(b.spin_checks, 1001u);
  EXPECT_EQ(b.at, 100 * kUs);
  EXPECT_EQ(b.polls, 0u);
}

TEST(ModuleSpin, TheSpinNeverExtendsADeadline) {
  // The timeout comes before the spin bound: the hit times out at the timeout, not later.
  auto r = run_spin_wait(1000, 20 * kUs, 400 * kUs, false, [](std::uint64_t, std::uint32_t&, std::uint32_t&) {});
  EXPECT_EQ(r.w, XP_WAIT_TIMEOUT);
  EXPECT_EQ(r.at, 20 * kUs);
  EXPECT_FALSE(r.spun_out);
  EXPECT_EQ(r.polls, 0u);
  // A claim keeps it to the claim bound, spinning or not, and no further.
  auto c = run_spin_wait(1000, 20 * kUs, 400 * kUs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now >= 10 * kUs && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
  });
  EXPECT_EQ(c.w, XP_WAIT_TIMEOUT);
  EXPECT_EQ(c.at, 400 * kUs);
  EXPECT_FALSE(c.spun_out);  // the claim bound came first
  // A claim past the spin: the spin ends at its bound, the wait goes on to the answer.
  auto a = run_spin_wait(50, 10 * kMs, 200 * kMs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (now >= 10 * kUs && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now >= 150 * kMs && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(a.w, XP_WAIT_DONE);
  EXPECT_TRUE(a.spun_out);
  EXPECT_GE(a.at, 150 * kMs);
  EXPECT_LT(a.at, 151 * kMs);
  // Given back (HIT again) past the deadline while spinning: time out at once.
  auto g = run_spin_wait(1000, 20 * kUs, 400 * kUs, false, [](std::uint64_t now, std::uint32_t& st, std::uint32_t&) {
    if (now >= 5 * kUs && now < 30 * kUs && st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now >= 30 * kUs && st == XENPROBES_MBOX_CLAIMED) st = XENPROBES_MBOX_HIT;
  });
  EXPECT_EQ(g.w, XP_WAIT_TIMEOUT);
  EXPECT_EQ(g.at, 30 * kUs);
}

TEST(ModuleSpin, DetachingEndsTheSpinButNotAClaim) {
  auto r = run_spin_wait(1000, 10 * kMs, 200 * kMs, true, [](std::uint64_t, std::uint32_t&, std::uint32_t&) {});
  EXPECT_EQ(r.w, XP_WAIT_TIMEOUT);
  EXPECT_EQ(r.at, 0u);
  EXPECT_EQ(r.spin_checks, 1u);
  auto c = run_spin_wait(1000, 10 * kMs, 200 * kMs, true, [](std::uint64_t now, std::uint32_t& st, std::uint32_t& as) {
    if (st == XENPROBES_MBOX_HIT) st = XENPROBES_MBOX_CLAIMED;
    if (now >= 3 * kMs && st == XENPROBES_MBOX_CLAIMED) as = 5, st = XENPROBES_MBOX_DONE;
  });
  EXPECT_EQ(c.w, XP_WAIT_DONE);
  EXPECT_TRUE(c.spun_out);
  EXPECT_GE(c.at, 3 * kMs);
}

TEST(ModuleSpin, OnlyThisHitsAnswerEndsTheSpin) {
  // A DONE for an older seq (a late answer) or garbage: the spin runs out, then the timeout.
  for (std::uint32_t garbage : {XENPROBES_MBOX_DONE, XENPROBES_MBOX_IDLE, XENPROBES_MBOX_ABANDONED, 77u}) {
    auto r = run_spin_wait(100, 10 * kMs, 200 * kMs, false, [&](std::uint64_t, std::uint32_t& st, std::uint32_t& as) {
      st = garbage;
      as = 4;
    });
    EXPECT_EQ(r.w, XP_WAIT_TIMEOUT) << garbage;
    EXPECT_TRUE(r.spun_out) << garbage;
    EXPECT_EQ(r.at, 10 * kMs) << garbage;
  }
}

TEST(ModuleMailbox, Dom0IsGoneAfterDeadAfterTimeoutsInARow) {
  for (std::uint32_t n = 0; n < XENPROBES_DEAD_AFTER; ++n) EXPECT_FALSE(xp_dead_after(n)) << n;
  EXPECT_TRUE(xp_dead_after(XENPROBES_DEAD_AFTER));
  EXPECT_TRUE(xp_dead_after(XENPROBES_DEAD_AFTER + 1));
}

TEST(ModuleMailbox, FlagsMergeKeepsEverythingButArithmetic) {
  EXPECT_EQ(XP_RFLAGS_FROM_DOM0, 0x8d5ull);           // CF PF AF ZF SF OF
  EXPECT_EQ(XP_RFLAGS_FROM_DOM0 & XP_RFLAGS_TF, 0u);  // never TF
  EXPECT_EQ(xp_merge_flags(0x246, 0), 0x202ull);      // ZF, PF dropped; IF kept
  EXPECT_EQ(xp_merge_flags(0x2, ~0ull), 0x2ull | 0x8d5ull);
  EXPECT_EQ(xp_merge_flags(0x202, 0x302), 0x202ull);  // Dom0's TF ignored
  EXPECT_EQ(xp_merge_flags(0x302, 0x202), 0x302ull);  // the guest's own TF kept
}

// ---- branch decoding and emulation ----

struct Decoded {
  std::vector<std::uint8_t> bytes;
  xp_branch_kind kind;
  std::int64_t disp;
};

TEST(ModuleBranch, DecodesEveryForm) {
  const Decoded cases[] = {
      {{0xeb, 0xfe}, XP_BR_JMP, -2},                            // jmp .
      {{0xe9, 0x00, 0x01, 0x00, 0x00}, XP_BR_JMP, 0x100},       // jmp +0x100
      {{0xe8, 0xfb, 0xff, 0xff, 0xff}, XP_BR_CALL, -5},         // call .
      {{0x74, 0x10}, XP_BR_JCC, 0x10},                          // je +0x10
      {{0x0f, 0x8f, 0x80, 0x00, 0x00, 0x00}, XP_BR_JCC, 0x80},  // jg +0x80
      {{0xe2, 0xf0}, XP_BR_LOOP, -16},                          // loop
      {{0xe1, 0x02}, XP_BR_LOOPE, 2},                           // loope
      {{0xe0, 0x7f}, XP_BR_LOOPNE, 127},                        // loopne
      {{0xe3, 0x80}, XP_BR_JRCXZ, -128},                        // jrcxz
      {{0xc3}, XP_BR_RET, 0},                                   // ret
      {{0xc2, 0x10, 0x00}, XP_BR_RET, 0},                       // ret $0x10
      {{0x3e, 0x74, 0x10}, XP_BR_JCC, 0x10},                    // ds je (branch hint)
      {{0x2e, 0x0f, 0x85, 1, 0, 0, 0}, XP_BR_JCC, 1},           // cs jne
      {{0xf2, 0xe9, 1, 0, 0, 0}, XP_BR_JMP, 1},                 // bnd jmp
      {{0xf2, 0xe8, 1, 0, 0, 0}, XP_BR_CALL, 1},                // bnd call
      {{0xf2, 0xc3}, XP_BR_RET, 0},                             // bnd ret
      {{0xf3, 0xc3}, XP_BR_RET, 0},                             // rep ret
      {{0x48, 0xe9, 1, 0, 0, 0}, XP_BR_JMP, 1},                 // rex.W jmp
      {{0x67, 0xe3, 0x05}, XP_BR_JRCXZ, 5},                     // jecxz
      {{0xff, 0xd0}, XP_BR_CALL_REG, 0},                        // call *%rax
      {{0x41, 0xff, 0xd3}, XP_BR_CALL_REG, 0},                  // call *%r11
      {{0xff, 0xe0}, XP_BR_JMP_REG, 0},                         // jmp *%rax
      {{0x41, 0xff, 0xe3}, XP_BR_JMP_REG, 0},                   // jmp *%r11
      {{0x3e, 0xff, 0xe2}, XP_BR_JMP_REG, 0},                   // notrack jmp *%rdx
      {{0x2e, 0x41, 0xff, 0xd3}, XP_BR_CALL_REG, 0},            // cs call *%r11 (retpoline padding)
      {{0xf2, 0xff, 0xd1}, XP_BR_CALL_REG, 0},                  // bnd call *%rcx
      {{0x48, 0xff, 0xe7}, XP_BR_JMP_REG, 0},                   // rex.W jmp *%rdi (W changes nothing)
  };
  for (const auto& c : cases) {
    xp_branch br{};
    ASSERT_TRUE(xp_decode_branch(c.bytes.data(), static_cast<std::uint32_t>(c.bytes.size()), &br))
        << "first byte 0x" << std::hex << int(c.bytes[0]);
    EXPECT_EQ(br.kind, c.kind);
    EXPECT_EQ(br.disp, c.disp);
    EXPECT_EQ(br.len, c.bytes.size());
  }
  xp_branch br{};
  const std::uint8_t ret16[] = {0xc2, 0x34, 0x12};
  ASSERT_TRUE(xp_decode_branch(ret16, 3, &br));
  EXPECT_EQ(br.imm16, 0x1234u);
  const std::uint8_t jg[] = {0x0f, 0x8f, 0, 0, 0, 0};
  ASSERT_TRUE(xp_decode_branch(jg, 6, &br));
  EXPECT_EQ(br.cc, 0xfu);
  const std::uint8_t jecxz[] = {0x67, 0xe3, 0};
  ASSERT_TRUE(xp_decode_branch(jecxz, 3, &br));
  EXPECT_TRUE(br.ecx);
}

TEST(ModuleBranch, RegisterFormsNameEveryRegister) {
  // ModRM.rm is the register, REX.B adds 8; /2 is call, /4 is jmp.
  for (std::uint32_t reg = 0; reg < 16; ++reg) {
    for (std::uint8_t op : {std::uint8_t{2}, std::uint8_t{4}}) {
      std::vector<std::uint8_t> b;
      if (reg >= 8) b.push_back(0x41);
      b.push_back(0xff);
      b.push_back(static_cast<std::uint8_t>(0xc0 | op << 3 | (reg & 7)));
      xp_branch br{};
      ASSERT_TRUE(xp_decode_branch(b.data(), static_cast<std::uint32_t>(b.size()), &br)) << reg;
      EXPECT_EQ(br.kind, op == 2 ? XP_BR_CALL_REG : XP_BR_JMP_REG) << reg;
      EXPECT_EQ(br.reg, reg);
      EXPECT_EQ(br.len, b.size());
      EXPECT_FALSE(xp_is_mem_indirect_branch(b.data(), static_cast<std::uint32_t>(b.size())));
    }
  }
  // Another REX (R, X, W, none of B) keeps rax..rdi.
  const std::uint8_t rexr[] = {0x44, 0xff, 0xd0};
  xp_branch br{};
  ASSERT_TRUE(xp_decode_branch(rexr, 3, &br));
  EXPECT_EQ(br.reg, std::uint32_t{XP_GPR_RAX});
  const std::uint8_t rexwb[] = {0x49, 0xff, 0xe7};
  ASSERT_TRUE(xp_decode_branch(rexwb, 3, &br));
  EXPECT_EQ(br.reg, std::uint32_t{XP_GPR_R15});
}

TEST(ModuleBranch, BranchesThroughMemoryAreRefusedAndNamed) {
  // What Dom0 plans as EmulateLoaded besides ret: the target is in memory.
  const std::vector<std::vector<std::uint8_t>> mem = {
      {0xff, 0x24, 0xfd, 0x00, 0x10, 0x00, 0x81},  // jmp *-0x7efff000(,%rdi,8) (a jump table)
      {0xff, 0x15, 0x10, 0x00, 0x00, 0x00},        // call *0x10(%rip)
      {0xff, 0x25, 0x10, 0x00, 0x00, 0x00},        // jmp *0x10(%rip)
      {0xff, 0x10},                                // call *(%rax)
      {0xff, 0x60, 0x08},                          // jmp *0x8(%rax)
      {0x41, 0xff, 0x13},                          // call *(%r11)
      {0x41, 0xff, 0x94, 0x24, 0, 1, 0, 0},        // call *0x100(%r12)
      {0x3e, 0xff, 0x24, 0xc5, 0, 0, 0, 0},        // notrack jmp *0(,%rax,8)
  };
  for (const auto& b : mem) {
    xp_branch br{};
    EXPECT_FALSE(xp_decode_branch(b.data(), static_cast<std::uint32_t>(b.size()), &br)) << std::hex << int(b[1]);
    EXPECT_TRUE(xp_is_mem_indirect_branch(b.data(), static_cast<std::uint32_t>(b.size()))) << std::hex << int(b[1]);
  }
  // Not a branch through memory: register forms, other ff forms, other instructions.
  const std::vector<std::vector<std::uint8_t>> other = {{0xff, 0xd0},
                                                        {0x41, 0xff, 0xe3},
                                                        {0xff, 0x30} /* push (%rax) */,
                                                        {0xff, 0x00} /* inc (%rax) */,
                                                        {0xff, 0x18} /* lcall *(%rax) */,
                                                        {0xe8, 0, 0, 0, 0},
                                                        {0xc3},
                                                        {0xff},
                                                        {}};
  for (const auto& b : other) EXPECT_FALSE(xp_is_mem_indirect_branch(b.data(), static_cast<std::uint32_t>(b.size())));
  EXPECT_FALSE(xp_is_mem_indirect_branch(nullptr, 2));
}

TEST(ModuleBranch, RefusesEverythingElse) {
  const std::vector<std::vector<std::uint8_t>> bad = {
      {},                                    // nothing
      {0x90},                                // nop
      {0x55},                                // push %rbp
      {0xff, 0x15, 0, 0, 0, 0},              // call *0(%rip)
      {0xff, 0x24, 0xfd, 0, 0x10, 0, 0x81},  // jmp *table(,%rdi,8)
      {0xff},                                // ff without ModRM
      {0xff, 0xd0, 0x90},                    // call *%rax, length longer than the instruction
      {0xff, 0xc0},                          // inc %eax
      {0xff, 0xc8},                          // dec %eax
      {0xff, 0xf0},                          // push %rax
      {0xff, 0xd8},                          // lcall with a register: invalid
      {0xff, 0xe8},                          // ljmp with a register: invalid
      {0x66, 0xff, 0xd0},                    // data16 call *%ax
      {0x67, 0xff, 0xd0},                    // addr32 call *%rax
      {0xf3, 0xff, 0xe0},                    // rep jmp *%rax
      {0x41, 0x3e, 0xff, 0xe3},              // REX not right before the opcode
      {0xea, 0, 0, 0, 0, 0, 0},              // far jmp (invalid in 64-bit)
      {0xcb},                                // lret
      {0xca, 0, 0},                          // lret $0
      {0xcc},                                // int3
      {0x66, 0xe9, 1, 0},                    // data16 jmp: truncates rip on AMD
      {0x66, 0xc3},                          // data16 ret
      {0x67, 0xe2, 0},                       // addr32 loop: would write ecx
      {0x67, 0xe9, 1, 0, 0, 0},              // addr32 jmp
      {0xf3, 0xe9, 1, 0, 0, 0},              // rep jmp
      {0xeb},                                // truncated
      {0xe9, 1, 0, 0},                       // truncated rel32
      {0xeb, 1, 0x90},                       // length longer than the instruction
      {0xc3, 0x90},
      {0x0f, 0x05},              // syscall
      {0x0f, 0x90, 0, 0, 0, 0},  // seto, not jcc
      {0x48},                    // REX alone
      {0x3e, 0x3e, 0x3e},        // prefixes alone
      {0x48, 0x3e, 0xeb, 0},     // REX must come right before the opcode
  };
  for (const auto& b : bad) {
    xp_branch br{};
    EXPECT_FALSE(xp_decode_branch(b.data(), static_cast<std::uint32_t>(b.size()), &br))
        << "size " << b.size() << " first 0x" << std::hex << (b.empty() ? 0 : int(b[0]));
  }
  std::uint8_t sixteen[16];
  std::memset(sixteen, 0x3e, sizeof sixteen);
  sixteen[14] = 0xeb;
  xp_branch br{};
  EXPECT_FALSE(xp_decode_branch(sixteen, 16, &br));     // longer than any x86 instruction
  ASSERT_TRUE(xp_decode_branch(sixteen + 1, 15, &br));  // 13 prefixes, eb, rel8: 15 bytes
  EXPECT_EQ(br.len, 15u);
  EXPECT_EQ(br.disp, 0x3e);
  EXPECT_FALSE(xp_decode_branch(nullptr, 2, &br));
}

TEST(ModuleBranch, ConditionCodesFollowTheSdm) {
  // Every combination of OF SF ZF PF CF against the SDM's definitions (Jcc, Table 7-4).
  for (int bits = 0; bits < 32; ++bits) {
    const bool of = bits & 1, sf = bits & 2, zf = bits & 4, pf = bits & 8, cf = bits & 16;
    const std::uint64_t fl = (of ? XP_RFLAGS_OF : 0) | (sf ? XP_RFLAGS_SF : 0) | (zf ? XP_RFLAGS_ZF : 0) |
                             (pf ? XP_RFLAGS_PF : 0) | (cf ? XP_RFLAGS_CF : 0);
    const bool expect[16] = {
        of,               // jo
        !of,              // jno
        cf,               // jb / jc / jnae
        !cf,              // jae / jnb / jnc
        zf,               // je / jz
        !zf,              // jne / jnz
        cf || zf,         // jbe / jna
        !cf && !zf,       // ja / jnbe
        sf,               // js
        !sf,              // jns
        pf,               // jp / jpe
        !pf,              // jnp / jpo
        sf != of,         // jl / jnge
        sf == of,         // jge / jnl
        zf || sf != of,   // jle / jng
        !zf && sf == of,  // jg / jnle
    };
    for (std::uint32_t cc = 0; cc < 16; ++cc)
      EXPECT_EQ(xp_condition(cc, fl), expect[cc]) << "cc " << cc << " flags 0x" << std::hex << fl;
  }
}

class ModuleEmulate : public ::testing::Test {
 protected:
  Guest g;
  xp_bounds b = g.bounds();
  xp_mem_ops m = g.mem();
  static constexpr std::uint64_t kAt = kText + 0x1000;  // the trap address

  xp_emul run(std::initializer_list<std::uint8_t> insn, xenprobes_regs& r) {
    std::vector<std::uint8_t> v(insn);
    return xp_emulate(v.data(), static_cast<std::uint32_t>(v.size()), &r, &b, &m);
  }
};

TEST_F(ModuleEmulate, JmpRel8AndRel32) {
  auto r = regs_at(kAt);
  ASSERT_EQ(run({0xeb, 0x10}, r), XP_EMUL_OK);  // jmp +0x10
  EXPECT_EQ(r.rip, kAt + 2 + 0x10);
  r = regs_at(kAt);
  ASSERT_EQ(run({0xeb, 0xfe}, r), XP_EMUL_OK);  // jmp .
  EXPECT_EQ(r.rip, kAt);
  r = regs_at(kAt);
  ASSERT_EQ(run({0xe9, 0x00, 0xf0, 0xff, 0xff}, r), XP_EMUL_OK);  // jmp -0x1000
  EXPECT_EQ(r.rip, kAt + 5 - 0x1000);
  EXPECT_EQ(r.rsp, kStack);
  EXPECT_EQ(r.rcx, 0x3333u);
  EXPECT_EQ(g.writes, 0);
}

TEST_F(ModuleEmulate, JmpIntoTheOeaAndIntoModulesIsAllowed) {
  auto r = regs_at(kAt);
  const std::int64_t d = static_cast<std::int64_t>(kOea) - static_cast<std::int64_t>(kAt + 5);
  const auto u = static_cast<std::uint32_t>(d);
  ASSERT_EQ(run({0xe9, std::uint8_t(u), std::uint8_t(u >> 8), std::uint8_t(u >> 16), std::uint8_t(u >> 24)}, r),
            XP_EMUL_OK);
  EXPECT_EQ(r.rip, kOea);
}

TEST_F(ModuleEmulate, JccTakenAndNotTaken) {
  auto r = regs_at(kAt);
  r.rflags |= XP_RFLAGS_ZF;
  ASSERT_EQ(run({0x74, 0x20}, r), XP_EMUL_OK);  // je +0x20, ZF=1: taken
  EXPECT_EQ(r.rip, kAt + 2 + 0x20);
  r = regs_at(kAt);
  ASSERT_EQ(run({0x74, 0x20}, r), XP_EMUL_OK);  // ZF=0: falls through
  EXPECT_EQ(r.rip, kAt + 2);
  r = regs_at(kAt);
  r.rflags |= XP_RFLAGS_SF;                                             // SF != OF
  ASSERT_EQ(run({0x0f, 0x8c, 0x00, 0x01, 0x00, 0x00}, r), XP_EMUL_OK);  // jl +0x100
  EXPECT_EQ(r.rip, kAt + 6 + 0x100);
  r = regs_at(kAt);
  r.rflags |= XP_RFLAGS_SF | XP_RFLAGS_OF;
  ASSERT_EQ(run({0x0f, 0x8c, 0x00, 0x01, 0x00, 0x00}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kAt + 6);
  EXPECT_EQ(r.rsp, kStack);
  EXPECT_EQ(r.rflags, 0x2 | kRflagsIf | XP_RFLAGS_SF | XP_RFLAGS_OF);  // flags untouched
}

TEST_F(ModuleEmulate, CallPushesTheReturnAddress) {
  auto r = regs_at(kAt);
  ASSERT_EQ(run({0xe8, 0x00, 0x02, 0x00, 0x00}, r), XP_EMUL_OK);  // call +0x200
  EXPECT_EQ(r.rip, kAt + 5 + 0x200);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 5);
  EXPECT_EQ(g.writes, 1);
  // With branch hint and BND prefixes the return address is after the whole instruction.
  r = regs_at(kAt);
  ASSERT_EQ(run({0xf2, 0xe8, 0x00, 0x00, 0x00, 0x00}, r), XP_EMUL_OK);  // bnd call +0
  EXPECT_EQ(r.rip, kAt + 6);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 6);
}

TEST_F(ModuleEmulate, CallThroughARegisterPushesTheAddressAfterIt) {
  auto r = regs_at(kAt);
  r.rax = kText + 0x5000;
  ASSERT_EQ(run({0xff, 0xd0}, r), XP_EMUL_OK);  // call *%rax
  EXPECT_EQ(r.rip, kText + 0x5000);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 2);
  EXPECT_EQ(r.rax, kText + 0x5000);
  r = regs_at(kAt);
  r.r11 = kOea + 0x100;                               // into the OEA
  ASSERT_EQ(run({0x41, 0xff, 0xd3}, r), XP_EMUL_OK);  // call *%r11
  EXPECT_EQ(r.rip, kOea + 0x100);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 3);
  // Prefixes count in the return address.
  r = regs_at(kAt);
  r.r11 = kModules + 0x40;
  ASSERT_EQ(run({0x2e, 0x41, 0xff, 0xd3}, r), XP_EMUL_OK);  // cs call *%r11
  EXPECT_EQ(r.rip, kModules + 0x40);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 4);
  EXPECT_EQ(g.writes, 3);
}

TEST_F(ModuleEmulate, JmpThroughARegisterPushesNothing) {
  auto r = regs_at(kAt);
  r.rax = kText + 0x6000;
  ASSERT_EQ(run({0xff, 0xe0}, r), XP_EMUL_OK);  // jmp *%rax
  EXPECT_EQ(r.rip, kText + 0x6000);
  EXPECT_EQ(r.rsp, kStack);
  r = regs_at(kAt);
  r.r11 = kText + 0x7000;
  ASSERT_EQ(run({0x41, 0xff, 0xe3}, r), XP_EMUL_OK);  // jmp *%r11
  EXPECT_EQ(r.rip, kText + 0x7000);
  EXPECT_EQ(r.rsp, kStack);
  EXPECT_EQ(g.writes, 0);
}

TEST_F(ModuleEmulate, EveryRegisterIsReadFromItsOwnField) {
  // xenprobes_regs orders the registers rax rbx rcx rdx rsi rdi rbp rsp r8..r15; x86 encodes
  // them rax rcx rdx rbx rsp rbp rsi rdi r8..r15.
  for (std::uint32_t reg = 0; reg < 16; ++reg) {
    if (reg == XP_GPR_RSP) continue;  // below
    auto r = regs_at(kAt);
    std::uint64_t* f[16] = {&r.rax, &r.rcx, &r.rdx, &r.rbx, &r.rsp, &r.rbp, &r.rsi, &r.rdi,
                            &r.r8,  &r.r9,  &r.r10, &r.r11, &r.r12, &r.r13, &r.r14, &r.r15};
    for (std::uint32_t k = 0; k < 16; ++k)
      if (k != XP_GPR_RSP) *f[k] = kText + 0x10000 + k * 0x100;  // every register a different target
    std::vector<std::uint8_t> b;
    if (reg >= 8) b.push_back(0x41);
    b.push_back(0xff);
    b.push_back(static_cast<std::uint8_t>(0xe0 | (reg & 7)));
    ASSERT_EQ(xp_emulate(b.data(), static_cast<std::uint32_t>(b.size()), &r, &this->b, &m), XP_EMUL_OK) << reg;
    EXPECT_EQ(r.rip, kText + 0x10000 + reg * 0x100) << reg;
  }
}

TEST_F(ModuleEmulate, RegisterTargetsOutsideCodeAreRefusedWithoutSideEffects) {
  for (std::uint64_t to :
       std::initializer_list<std::uint64_t>{0x0, 0x400000, kStack, kTextEnd, kModulesEnd, 0xffff888000000000ull}) {
    auto r = regs_at(kAt);
    r.rbx = to;
    const auto before = r;
    EXPECT_EQ(run({0xff, 0xd3}, r), XP_EMUL_BAD_TARGET) << std::hex << to;  // call *%rbx
    EXPECT_EQ(run({0xff, 0xe3}, r), XP_EMUL_BAD_TARGET) << std::hex << to;  // jmp *%rbx
    EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
  }
  // A non-executable page in the module area.
  g.nx_pages.insert(kModules + 0x3000);
  auto r = regs_at(kAt);
  r.rax = kModules + 0x3010;
  EXPECT_EQ(run({0xff, 0xd0}, r), XP_EMUL_BAD_TARGET);
  // call *%rsp targets the stack as it was before the push: refused, nothing pushed.
  r = regs_at(kAt);
  EXPECT_EQ(run({0xff, 0xd4}, r), XP_EMUL_BAD_TARGET);
  EXPECT_EQ(r.rsp, kStack);
  EXPECT_EQ(g.writes, 0);
  // A call whose push faults changes nothing.
  g.faulting.insert(kStack - 8);
  r = regs_at(kAt);
  r.rax = kText + 0x5000;
  const auto before = r;
  EXPECT_EQ(run({0xff, 0xd0}, r), XP_EMUL_FAULT);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
}

TEST_F(ModuleEmulate, CallThatCannotPushChangesNothing) {
  g.faulting.insert(kStack - 8);
  auto r = regs_at(kAt);
  const auto before = r;
  EXPECT_EQ(run({0xe8, 0x00, 0x02, 0x00, 0x00}, r), XP_EMUL_FAULT);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
}

TEST_F(ModuleEmulate, LoopDecrementsRcx) {
  auto r = regs_at(kAt);
  r.rcx = 3;
  ASSERT_EQ(run({0xe2, 0xfe}, r), XP_EMUL_OK);  // loop .
  EXPECT_EQ(r.rcx, 2u);
  EXPECT_EQ(r.rip, kAt);
  r = regs_at(kAt);
  r.rcx = 1;
  ASSERT_EQ(run({0xe2, 0xfe}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rcx, 0u);
  EXPECT_EQ(r.rip, kAt + 2);
  r = regs_at(kAt);
  r.rcx = 0;  // wraps to 2^64-1: taken
  ASSERT_EQ(run({0xe2, 0x10}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rcx, ~0ull);
  EXPECT_EQ(r.rip, kAt + 2 + 0x10);
}

TEST_F(ModuleEmulate, LoopeAndLoopneLookAtZf) {
  auto r = regs_at(kAt);
  r.rcx = 5;
  r.rflags |= XP_RFLAGS_ZF;
  ASSERT_EQ(run({0xe1, 0x10}, r), XP_EMUL_OK);  // loope: rcx != 0 && ZF
  EXPECT_EQ(r.rip, kAt + 0x12);
  EXPECT_EQ(r.rcx, 4u);
  r = regs_at(kAt);
  r.rcx = 5;
  ASSERT_EQ(run({0xe1, 0x10}, r), XP_EMUL_OK);  // ZF=0: not taken, rcx still decremented
  EXPECT_EQ(r.rip, kAt + 2);
  EXPECT_EQ(r.rcx, 4u);
  r = regs_at(kAt);
  r.rcx = 5;
  ASSERT_EQ(run({0xe0, 0x10}, r), XP_EMUL_OK);  // loopne: rcx != 0 && !ZF
  EXPECT_EQ(r.rip, kAt + 0x12);
  r = regs_at(kAt);
  r.rcx = 5;
  r.rflags |= XP_RFLAGS_ZF;
  ASSERT_EQ(run({0xe0, 0x10}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kAt + 2);
  r = regs_at(kAt);
  r.rcx = 1;
  r.rflags |= XP_RFLAGS_ZF;
  ASSERT_EQ(run({0xe1, 0x10}, r), XP_EMUL_OK);  // rcx reaches 0: not taken
  EXPECT_EQ(r.rip, kAt + 2);
  EXPECT_EQ(r.rcx, 0u);
}

TEST_F(ModuleEmulate, JrcxzAndJecxz) {
  auto r = regs_at(kAt);
  r.rcx = 0;
  ASSERT_EQ(run({0xe3, 0x08}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kAt + 2 + 8);
  EXPECT_EQ(r.rcx, 0u);  // not modified
  r = regs_at(kAt);
  r.rcx = 0x100000000ull;  // rcx != 0 but ecx == 0
  ASSERT_EQ(run({0xe3, 0x08}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kAt + 2);
  r = regs_at(kAt);
  r.rcx = 0x100000000ull;
  ASSERT_EQ(run({0x67, 0xe3, 0x08}, r), XP_EMUL_OK);  // jecxz
  EXPECT_EQ(r.rip, kAt + 3 + 8);
  EXPECT_EQ(r.rcx, 0x100000000ull);
}

TEST_F(ModuleEmulate, RetPopsTheReturnAddress) {
  g.stack[kStack] = kText + 0x4242;
  auto r = regs_at(kAt);
  ASSERT_EQ(run({0xc3}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kText + 0x4242);
  EXPECT_EQ(r.rsp, kStack + 8);
  EXPECT_EQ(g.writes, 0);
  r = regs_at(kAt);
  ASSERT_EQ(run({0xc2, 0x18, 0x00}, r), XP_EMUL_OK);  // ret $0x18
  EXPECT_EQ(r.rip, kText + 0x4242);
  EXPECT_EQ(r.rsp, kStack + 8 + 0x18);
  r = regs_at(kAt);
  ASSERT_EQ(run({0xf3, 0xc3}, r), XP_EMUL_OK);  // rep ret
  EXPECT_EQ(r.rsp, kStack + 8);
}

TEST_F(ModuleEmulate, RetToAnythingButCodeIsRefused) {
  for (std::uint64_t to : std::initializer_list<std::uint64_t>{0x0, 0x7fffdeadbeef, kStack, kTextEnd + 8}) {
    g.stack[kStack] = to;
    auto r = regs_at(kAt);
    const auto before = r;
    EXPECT_EQ(run({0xc3}, r), XP_EMUL_BAD_TARGET) << std::hex << to;
    EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
  }
  g.faulting.insert(kStack);
  auto r = regs_at(kAt);
  EXPECT_EQ(run({0xc3}, r), XP_EMUL_FAULT);
}

TEST_F(ModuleEmulate, BranchesOutOfTextAreRefusedWithoutSideEffects) {
  // At the very end of kernel text a jmp +0x7f lands in kernel data.
  auto r = regs_at(kTextEnd - 2);
  auto before = r;
  EXPECT_EQ(run({0xeb, 0x7f}, r), XP_EMUL_BAD_TARGET);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
  // A call whose target is not executable pushes nothing.
  g.nx_pages.insert((kAt + 5 + 0x10000) & ~0xfffull);
  r = regs_at(kAt);
  before = r;
  EXPECT_EQ(run({0xe8, 0x00, 0x00, 0x01, 0x00}, r), XP_EMUL_BAD_TARGET);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
  EXPECT_EQ(g.writes, 0);
  // A loop that would leave text does not even decrement rcx.
  r = regs_at(kTextEnd - 2);
  r.rcx = 2;
  EXPECT_EQ(run({0xe2, 0x10}, r), XP_EMUL_BAD_TARGET);
  EXPECT_EQ(r.rcx, 2u);
  // rip + disp wrapping around the address space.
  r = regs_at(kAt);
  r.rip = ~0ull - 1;
  EXPECT_EQ(run({0xeb, 0x10}, r), XP_EMUL_BAD_TARGET);
}

TEST_F(ModuleEmulate, NotABranch) {
  auto r = regs_at(kAt);
  EXPECT_EQ(run({0x55}, r), XP_EMUL_UNSUPPORTED);                    // push %rbp
  EXPECT_EQ(run({0x48, 0x89, 0xe5}, r), XP_EMUL_UNSUPPORTED);        // mov %rsp,%rbp
  EXPECT_EQ(run({0xff, 0x25, 0, 0, 0, 0}, r), XP_EMUL_UNSUPPORTED);  // jmp *0(%rip)
  EXPECT_EQ(run({0xff, 0x10}, r), XP_EMUL_UNSUPPORTED);              // call *(%rax)
  EXPECT_EQ(r.rip, kAt);
  EXPECT_EQ(g.writes, 0);
}

// ---- the return table ----

TEST(ModuleReturnTable, FindsTheSlotAndNeverAFreeEntry) {
  std::vector<xenprobes_ret> t(4);
  t[1] = {kStack - 0x100, kText + 0x500};
  t[3] = {kStack - 0x200, kText + 0x600};
  EXPECT_EQ(xp_ret_find(t.data(), 4, kStack - 0x100), 1);
  EXPECT_EQ(xp_ret_find(t.data(), 4, kStack - 0x200), 3);
  EXPECT_EQ(xp_ret_find(t.data(), 3, kStack - 0x200), -1);  // beyond the capacity
  EXPECT_EQ(xp_ret_find(t.data(), 4, kStack - 0x300), -1);
  EXPECT_EQ(xp_ret_find(t.data(), 4, 0), -1);  // slot 0 means free
  EXPECT_EQ(xp_ret_find(t.data(), 0, kStack - 0x100), -1);
}

TEST(ModuleReturnTable, TheSlotIsBelowTheStackPointerAtTheTrampolinesTrap) {
  // The probed function's `ret` popped the slot: rsp at the trap = slot + 8.
  EXPECT_EQ(xp_return_slot(kStack + 8), kStack);
}

// ---- the fallback ----

class ModuleFallback : public ::testing::Test {
 protected:
  Guest g;
  xp_bounds b = g.bounds();
  xp_mem_ops m = g.mem();
  std::vector<xenprobes_ret> rets = std::vector<xenprobes_ret>(8);
  static constexpr std::uint64_t kAt = kText + 0x2000;
  static constexpr std::uint64_t kTrampoline = kOea + 0xff0;

  xp_fallback take(const xenprobes_trap& e, xenprobes_regs& r) {
    return xp_take_fallback(&e, &r, rets.data(), static_cast<std::uint32_t>(rets.size()), &b, &m);
  }
};

TEST_F(ModuleFallback, ResumesAtTheSlot) {
  auto r = regs_at(kAt);
  ASSERT_EQ(take(trap(kAt, XENPROBES_TRAP_FALLBACK, {0x55}, kOea + 0x40), r), XP_FB_OK);
  EXPECT_EQ(r.rip, kOea + 0x40);
  EXPECT_EQ(r.rsp, kStack);
}

TEST_F(ModuleFallback, RefusesASlotAddressOutsideCode) {
  auto r = regs_at(kAt);
  const auto before = r;
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_FALLBACK, {0x55}, kStack), r), XP_FB_BAD_TARGET);
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_FALLBACK, {0x55}, 0), r), XP_FB_BAD_TARGET);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
}

TEST_F(ModuleFallback, EmulatesTheOriginalBranch) {
  auto r = regs_at(kAt);
  ASSERT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0xe8, 0x10, 0x00, 0x00, 0x00}), r), XP_FB_OK);
  EXPECT_EQ(r.rip, kAt + 5 + 0x10);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 5);
  // A retpoline site patched to `call *%r11` (what Dom0 plans as EmulateBranch).
  r = regs_at(kAt);
  r.r11 = kText + 0x9000;
  ASSERT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0x41, 0xff, 0xd3}), r), XP_FB_OK);
  EXPECT_EQ(r.rip, kText + 0x9000);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 3);
  r = regs_at(kAt);
  r.rax = kText + 0x9100;
  ASSERT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0xff, 0xe0}), r), XP_FB_OK);  // jmp *%rax
  EXPECT_EQ(r.rip, kText + 0x9100);
  EXPECT_EQ(r.rsp, kStack);
  // Through memory: not emulated (Dom0 refuses to arm such an EMULATE trap on the guest channel).
  r = regs_at(kAt);
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0xff, 0x24, 0xfd, 0, 0x10, 0, 0x81}), r), XP_FB_EMULATE_FAILED);
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0x55}), r), XP_FB_EMULATE_FAILED);
  g.stack[kStack] = kStack;  // a ret to the stack
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0xc3}), r), XP_FB_BAD_TARGET);
  EXPECT_EQ(r.rip, kAt);
}

TEST_F(ModuleFallback, FinishesAReturnFromTheReturnTable) {
  rets[2] = {kStack + 0x40, kText + 0x7777};
  rets[5] = {kStack + 0x80, kText + 0x8888};
  auto r = regs_at(kTrampoline);
  r.rsp = kStack + 0x48;  // the ret popped the slot at kStack + 0x40
  ASSERT_EQ(take(trap(kTrampoline, XENPROBES_TRAP_RETURN, {0x90}), r), XP_FB_OK);
  EXPECT_EQ(r.rip, kText + 0x7777);
  EXPECT_EQ(r.rsp, kStack + 0x48);  // nothing more to pop
  EXPECT_EQ(rets[2].slot, 0u);      // the instance is finished
  EXPECT_EQ(rets[5].slot, kStack + 0x80);
  // The same slot again: no entry any more.
  r = regs_at(kTrampoline);
  r.rsp = kStack + 0x48;
  EXPECT_EQ(take(trap(kTrampoline, XENPROBES_TRAP_RETURN, {0x90}), r), XP_FB_NO_RETURN);
  EXPECT_EQ(r.rip, kTrampoline);
}

TEST_F(ModuleFallback, AReturnTableEntryWithABadAddressStays) {
  rets[0] = {kStack + 0x40, kStack};
  auto r = regs_at(kTrampoline);
  r.rsp = kStack + 0x48;
  EXPECT_EQ(take(trap(kTrampoline, XENPROBES_TRAP_RETURN, {0x90}), r), XP_FB_BAD_TARGET);
  EXPECT_EQ(rets[0].slot, kStack + 0x40);
  EXPECT_EQ(r.rip, kTrampoline);
  // A module loaded with ret_capacity=0 has no return table at all.
  const auto e = trap(kTrampoline, XENPROBES_TRAP_RETURN, {0x90});
  EXPECT_EQ(xp_take_fallback(&e, &r, nullptr, 0, &b, &m), XP_FB_NO_RETURN);
}

TEST_F(ModuleFallback, HostileEntriesAreRefused) {
  auto r = regs_at(kAt);
  const auto before = r;
  EXPECT_EQ(take(trap(kAt, 0, {0x55}, kOea), r), XP_FB_BAD_ENTRY);
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_FALLBACK | XENPROBES_TRAP_EMULATE, {0xeb, 0}, kOea), r), XP_FB_BAD_ENTRY);
  EXPECT_EQ(take(trap(kAt, 8, {0x55}, kOea), r), XP_FB_BAD_ENTRY);
  EXPECT_EQ(take(trap(kAt, 0xffffffffu, {0x55}, kOea), r), XP_FB_BAD_ENTRY);
  auto e = trap(kAt, XENPROBES_TRAP_FALLBACK, {0x55}, kOea);
  e.len = 16;
  EXPECT_EQ(take(e, r), XP_FB_BAD_ENTRY);
  e.len = 255;
  EXPECT_EQ(take(e, r), XP_FB_BAD_ENTRY);
  // EMULATE without bytes, or with len larger than the instruction.
  auto j = trap(kAt, XENPROBES_TRAP_EMULATE, {0xeb, 0x10});
  j.len = 0;
  EXPECT_EQ(take(j, r), XP_FB_BAD_ENTRY);
  j.len = 15;
  EXPECT_EQ(take(j, r), XP_FB_EMULATE_FAILED);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
}

TEST_F(ModuleFallback, TrapsInsideTheOeaMayHaveNoOriginalBytes) {
  // protocol.h: len 0 only for a trap inside an OEA area with FALLBACK or RETURN.
  auto post = trap(kOea + 0x20, XENPROBES_TRAP_FALLBACK, {}, kText + 0x2005);
  ASSERT_EQ(post.len, 0);
  auto r = regs_at(kOea + 0x20);
  ASSERT_EQ(take(post, r), XP_FB_OK);
  EXPECT_EQ(r.rip, kText + 0x2005);
  rets[0] = {kStack + 0x40, kText + 0x7777};
  auto tramp = trap(kTrampoline, XENPROBES_TRAP_RETURN, {});
  r = regs_at(kTrampoline);
  r.rsp = kStack + 0x48;
  ASSERT_EQ(take(tramp, r), XP_FB_OK);
  EXPECT_EQ(r.rip, kText + 0x7777);
}

// ---- xenstore values ----

bool parse(const char* s, std::uint64_t max, std::uint64_t* v) { return xp_parse_decimal(s, std::strlen(s), max, v); }

TEST(ModuleDecimal, StrictDigitsOnly) {
  std::uint64_t v = 0;
  EXPECT_TRUE(parse("0", ~0ull, &v));
  EXPECT_EQ(v, 0u);
  EXPECT_TRUE(parse("4096", ~0ull, &v));
  EXPECT_EQ(v, 4096u);
  EXPECT_TRUE(parse("18446744073709551615", ~0ull, &v));
  EXPECT_EQ(v, ~0ull);
  for (const char* bad : {"", "007", "00", "+1", "-1", " 1", "1 ", "1\n", "0x10", "1e3", "12a", "18446744073709551616",
                          "99999999999999999999", "123456789012345678901"})
    EXPECT_FALSE(parse(bad, ~0ull, &v)) << '"' << bad << '"';
  EXPECT_TRUE(parse("16777216", XENPROBES_OEA_MAX_SIZE, &v));
  EXPECT_FALSE(parse("16777217", XENPROBES_OEA_MAX_SIZE, &v));
  const char nul[] = {'1', '\0', '2'};
  EXPECT_FALSE(xp_parse_decimal(nul, 3, ~0ull, &v));  // xenstore values may hold a NUL
  EXPECT_FALSE(xp_parse_decimal(nullptr, 1, ~0ull, &v));
}

// ---- the OEA pool ----

TEST(ModuleOeaPool, HandsOutDisjointPageAlignedAreasUntilFull) {
  xp_oea_pool p{};
  p.base = kOea;
  p.size = 0x200000;
  std::uint64_t a = 0;
  ASSERT_EQ(xp_oea_take(&p, 0x20000, &a), XP_OEA_OK);
  EXPECT_EQ(a, kOea);
  ASSERT_EQ(xp_oea_take(&p, 0x1000, &a), XP_OEA_OK);
  EXPECT_EQ(a, kOea + 0x20000);
  EXPECT_EQ(p.count, 2u);
  EXPECT_EQ(p.areas[1].start, kOea + 0x20000);
  EXPECT_EQ(p.areas[1].end, kOea + 0x21000);
  EXPECT_EQ(xp_oea_take(&p, 0x200000, &a), XP_OEA_EXHAUSTED);
  ASSERT_EQ(xp_oea_take(&p, 0x200000 - 0x21000, &a), XP_OEA_OK);  // exactly the rest
  EXPECT_EQ(p.used, p.size);
  EXPECT_EQ(xp_oea_take(&p, 0x1000, &a), XP_OEA_EXHAUSTED);
  EXPECT_EQ(p.count, 3u);
}

TEST(ModuleOeaPool, RefusesBadRequestsAndStopsAtTheAreaLimit) {
  xp_oea_pool p{};
  p.base = kOea;
  p.size = 64ull << 20;
  std::uint64_t a = 0;
  EXPECT_EQ(xp_oea_take(&p, 0, &a), XP_OEA_BAD_REQUEST);
  EXPECT_EQ(xp_oea_take(&p, 100, &a), XP_OEA_BAD_REQUEST);
  EXPECT_EQ(xp_oea_take(&p, XENPROBES_OEA_MAX_SIZE + 4096ull, &a), XP_OEA_BAD_REQUEST);
  EXPECT_EQ(xp_oea_take(&p, ~0ull & ~0xfffull, &a), XP_OEA_BAD_REQUEST);
  for (int i = 0; i < XENPROBES_OEA_MAX_AREAS; ++i) ASSERT_EQ(xp_oea_take(&p, 4096, &a), XP_OEA_OK) << i;
  EXPECT_EQ(xp_oea_take(&p, 4096, &a), XP_OEA_LIMIT);
  for (std::uint32_t i = 1; i < p.count; ++i) EXPECT_EQ(p.areas[i].start, p.areas[i - 1].end);
  // A corrupt pool (used > size) hands out nothing.
  xp_oea_pool q{};
  q.size = 4096;
  q.used = 8192;
  EXPECT_EQ(xp_oea_take(&q, 4096, &a), XP_OEA_EXHAUSTED);
}

TEST(ModuleOeaPool, AnAreaWhosePublicationFailedIsHandedOutAgain) {
  xp_oea_pool p{};
  p.base = kOea;
  p.size = 0x10000;
  std::uint64_t a = 0, b = 0;
  ASSERT_EQ(xp_oea_take(&p, 0x2000, &a), XP_OEA_OK);
  ASSERT_EQ(xp_oea_take(&p, 0x3000, &b), XP_OEA_OK);
  xp_oea_undo_last(&p);
  EXPECT_EQ(p.count, 1u);
  EXPECT_EQ(p.used, 0x2000u);
  std::uint64_t c = 0;
  ASSERT_EQ(xp_oea_take(&p, 0x1000, &c), XP_OEA_OK);
  EXPECT_EQ(c, b);  // same start: oea/1 never existed for Dom0
  xp_oea_undo_last(&p);
  xp_oea_undo_last(&p);
  xp_oea_undo_last(&p);  // nothing left: no underflow
  EXPECT_EQ(p.count, 0u);
  EXPECT_EQ(p.used, 0u);
}

TEST(ModuleOeaPool, EveryResultHasAOneLineReason) {
  for (auto r : {XP_OEA_OK, XP_OEA_BAD_REQUEST, XP_OEA_LIMIT, XP_OEA_EXHAUSTED}) {
    const char* s = xp_oea_reason(r);
    ASSERT_NE(s, nullptr);
    EXPECT_GT(std::strlen(s), 0u);
    EXPECT_EQ(std::strchr(s, '\n'), nullptr);
  }
  EXPECT_STREQ(xp_oea_reason(XP_OEA_LIMIT), "area limit reached");
}

}  // namespace
