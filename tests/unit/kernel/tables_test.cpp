// The guest kernel's tables read from (fake) guest memory: Linux's formats, and hostile
// layouts: unsorted, out of range, wrong sizes, loops, unreadable pages.
#include <gtest/gtest.h>

#include "unit/kernel/fake_kernel.hpp"

namespace xenprobes::testing {
namespace {

using kernel::KernelTables;

TEST(KernelTables, ExceptionTableEntriesAreDecodedRelativeToTheirFields) {
  FakeKernel k;
  k.ex_table({{kText + 0x100, kText + 0x180, 3}, {kText + 0x40, kText + 0x48, 0x10001}});
  auto t = k.read();
  ASSERT_TRUE(t.ex_status().found) << t.ex_status().why;
  EXPECT_EQ(t.ex_status().entries, 2u);
  const kernel::ExEntry* e = t.exception_entry(kText + 0x100);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->fixup, kText + 0x180);
  EXPECT_EQ(e->type(), 3u);
  // Not sorted in the guest: found anyway.
  ASSERT_NE(t.exception_entry(kText + 0x40), nullptr);
  EXPECT_EQ(t.exception_entry(kText + 0x40)->type(), 1u);
  EXPECT_EQ(t.exception_entry(kText + 0x41), nullptr);
  EXPECT_EQ(t.exception_entry_in(kText + 0x41, kText + 0x100), nullptr);
  EXPECT_NE(t.exception_entry_in(kText + 0x41, kText + 0x101), nullptr);
}

TEST(KernelTables, EntriesOutsideTheTextAreDroppedAndCounted) {
  FakeKernel k;
  k.ex_table({{kText + 0x10, kText, 1}, {kInit + 0x10, kInit, 1}, {kRodata + 0x10, kText, 1}, {0, kText, 1}});
  auto t = k.read();
  ASSERT_TRUE(t.ex_status().found);
  EXPECT_EQ(t.ex_status().entries, 1u);
  EXPECT_EQ(t.ex_status().init_entries, 1u);
  EXPECT_EQ(t.ex_status().invalid, 2u);
  EXPECT_EQ(t.exception_entry(kRodata + 0x10), nullptr);
  EXPECT_NE(t.summary().find("2 invalid dropped"), std::string::npos) << t.summary();
}

TEST(KernelTables, ATableWhoseSizeIsNotWholeEntriesIsNotRead) {
  FakeKernel k;
  k.bounds("__start___ex_table", "__stop___ex_table", kRodata, 13);
  auto t = k.read();
  EXPECT_FALSE(t.ex_status().found);
  EXPECT_NE(t.ex_status().why.find("12-byte entries"), std::string::npos) << t.ex_status().why;
}

TEST(KernelTables, ReversedBoundsAreRefused) {
  FakeKernel k;
  k.sym(kRodata + 0x100, 'R', "__start___jump_table");
  k.sym(kRodata, 'R', "__stop___jump_table");
  auto t = k.read();
  EXPECT_FALSE(t.jump_status().found);
  EXPECT_NE(t.jump_status().why.find("below"), std::string::npos) << t.jump_status().why;
}

TEST(KernelTables, ATableLargerThanTheLimitIsNotRead) {
  FakeKernel k;
  k.bounds("__start___ex_table", "__stop___ex_table", kRodata, 12 * 100);
  kernel::Limits l;
  l.max_entries = 99;
  auto t = k.read(l);
  EXPECT_FALSE(t.ex_status().found);
  EXPECT_NE(t.ex_status().why.find("limit"), std::string::npos) << t.ex_status().why;
}

TEST(KernelTables, AnUnreadableTableSaysWhere) {
  FakeKernel k;
  k.ex_table({{kText + 0x10, kText, 1}});
  k.unreadable.push_back(kRodata + 4);
  auto t = k.read();
  EXPECT_FALSE(t.ex_status().found);
  EXPECT_NE(t.ex_status().why.find("not mapped"), std::string::npos) << t.ex_status().why;
  EXPECT_EQ(t.exception_entry(kText + 0x10), nullptr);
}

TEST(KernelTables, MissingSymbolsAreNamed) {
  FakeKernel k;
  auto t = k.read();
  EXPECT_FALSE(t.ex_status().found);
  EXPECT_NE(t.ex_status().why.find("__start___ex_table"), std::string::npos);
  EXPECT_FALSE(t.blacklist_status().found);
  EXPECT_NE(t.summary().find("not read"), std::string::npos);
}

TEST(KernelTables, WithoutTextBoundsNothingIsTrusted) {
  FakeKernel k;
  k.map.clear();  // no _stext/_etext
  k.ex_table({{kText + 0x10, kText, 1}});
  auto t = k.read();
  EXPECT_TRUE(t.core_text().empty());
  EXPECT_FALSE(t.ex_status().found);
  EXPECT_NE(t.ex_status().why.find("_stext"), std::string::npos) << t.ex_status().why;
}

TEST(KernelTables, JumpLabelSitesCoverFiveBytesAndKeysLoseTheirFlags) {
  FakeKernel k;
  const std::uint64_t key = kData + 0x800;
  k.jump_table({{kText + 0x200, kText + 0x280, key | 1}, {kText + 0x100, kText + 0x180, key | 2}});
  auto t = k.read();
  ASSERT_TRUE(t.jump_status().found) << t.jump_status().why;
  EXPECT_EQ(t.jump_status().entries, 2u);
  const kernel::Site* s = t.jump_label_in(kText + 0x203, kText + 0x204);  // its 4th byte
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->addr, kText + 0x200);
  EXPECT_EQ(s->key, key);
  EXPECT_EQ(s->target, kText + 0x280);                                // where the jmp goes while the key is on
  EXPECT_NE(t.jump_label_in(kText + 0x1fd, kText + 0x201), nullptr);  // an instruction ending on it
  EXPECT_EQ(t.jump_label_in(kText + 0x205, kText + 0x210), nullptr);  // just after
  EXPECT_EQ(t.jump_label_in(kText + 0x1f0, kText + 0x200), nullptr);  // just before
}

TEST(KernelTables, StaticCallSitesAndLockPrefixes) {
  FakeKernel k;
  k.static_calls({{kText + 0x300, (kData + 0x900) | 1}});
  k.smp_locks({kText + 0x400, kText + 0x380, kRodata});
  auto t = k.read();
  ASSERT_TRUE(t.static_call_status().found);
  ASSERT_NE(t.static_call_in(kText + 0x300, kText + 0x305), nullptr);
  EXPECT_EQ(t.static_call_in(kText + 0x300, kText + 0x305)->key, kData + 0x900);
  ASSERT_TRUE(t.smp_locks_status().found);
  EXPECT_EQ(t.smp_locks_status().entries, 2u);
  EXPECT_EQ(t.smp_locks_status().invalid, 1u);
  EXPECT_EQ(t.smp_lock_in(kText + 0x380, kText + 0x388), kText + 0x380);
  EXPECT_FALSE(t.smp_lock_in(kText + 0x381, kText + 0x388));
}

TEST(KernelTables, AnUnmappedLockTableWasFreedAndListsNothingThatChanges) {
  FakeKernel k;
  k.smp_locks({kText + 0x400});
  k.unreadable.push_back(kRodata + 0x3000);
  auto t = k.read();
  EXPECT_TRUE(t.smp_locks_status().found) << t.smp_locks_status().why;
  EXPECT_EQ(t.smp_locks_status().entries, 0u);
  EXPECT_NE(t.smp_locks_status().why.find("freed"), std::string::npos);
  EXPECT_FALSE(t.smp_lock_in(kText + 0x400, kText + 0x404));
  // Without its bounds, though, nothing is known.
  FakeKernel none;
  EXPECT_FALSE(none.read().smp_locks_status().found);
}

TEST(KernelTables, TheBlacklistIsWalkedAndMerged) {
  FakeKernel k;
  k.blacklist({{kText + 0x500, kText + 0x540},
               {kText + 0x520, kText + 0x560},
               {kText + 0x600, kText + 0x610},
               {kInit, kInit + 0x10},
               {kRodata, kRodata + 8}});
  auto t = k.read();
  ASSERT_TRUE(t.blacklist_status().found) << t.blacklist_status().why;
  EXPECT_EQ(t.blacklist_status().entries, 3u);
  EXPECT_EQ(t.blacklist_status().init_entries, 1u);
  EXPECT_EQ(t.blacklist_status().invalid, 1u);
  ASSERT_NE(t.blacklisted(kText + 0x55f), nullptr);
  EXPECT_EQ(t.blacklisted(kText + 0x55f)->start, kText + 0x500);
  EXPECT_EQ(t.blacklisted(kText + 0x560), nullptr);
  EXPECT_NE(t.blacklisted(kText + 0x600), nullptr);
  EXPECT_EQ(t.blacklisted(kText + 0x4ff), nullptr);
}

TEST(KernelTables, ABlacklistThatLoopsIsNotTrusted) {
  FakeKernel k;
  k.blacklist({{kText + 0x500, kText + 0x540}, {kText + 0x600, kText + 0x610}});
  k.u64(kData + 0x140, kData + 0x100);  // the second node points back at the first, not the head
  auto t = k.read();
  EXPECT_FALSE(t.blacklist_status().found);
  EXPECT_NE(t.blacklist_status().why.find("loops"), std::string::npos) << t.blacklist_status().why;
  EXPECT_EQ(t.blacklisted(kText + 0x500), nullptr);
}

TEST(KernelTables, ABlacklistNodeOutsideTheKernelHalfEndsTheWalk) {
  FakeKernel k;
  k.blacklist({{kText + 0x500, kText + 0x540}});
  k.u64(kData + 0x100, 0x00007fff00001000ull);
  auto t = k.read();
  EXPECT_FALSE(t.blacklist_status().found);
  EXPECT_NE(t.blacklist_status().why.find("outside"), std::string::npos) << t.blacklist_status().why;
}

TEST(KernelTables, ABlacklistLongerThanTheLimitIsNotTrusted) {
  FakeKernel k;
  std::vector<std::array<std::uint64_t, 2>> many(20, {kText + 0x500, kText + 0x540});
  k.blacklist(many);
  kernel::Limits l;
  l.max_blacklist = 10;
  auto t = k.read(l);
  EXPECT_FALSE(t.blacklist_status().found);
}

TEST(KernelTables, SectionBoundsOutsideTheTextAreIgnored) {
  FakeKernel k;
  k.sym(kText + 0x1000, 'T', "__entry_text_start");
  k.sym(kText + 0x2000, 'T', "__entry_text_end");
  k.sym(kText + 0x3000, 'T', "__noinstr_text_start");
  k.sym(kRodata, 'T', "__noinstr_text_end");  // past _etext: a lie
  auto t = k.read();
  ASSERT_TRUE(t.entry_text());
  EXPECT_TRUE(t.entry_text()->contains(kText + 0x1fff));
  EXPECT_FALSE(t.noinstr_text());
  EXPECT_FALSE(t.kprobes_text());
}

}  // namespace
}  // namespace xenprobes::testing
