// The guest module's areas (guest-module/xp_logic.c): the control area's layout, the trap-table
// search under hostile contents, the xenstore numbers it reads and the OEA pool it hands out.
#include "module/module_logic_fixture.hpp"

namespace {

using namespace module_logic;

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
