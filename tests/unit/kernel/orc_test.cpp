// The ORC unwinder (kernel/orc.hpp) on hand-built tables and stacks: each entry and stack word
// below is annotated with what it means, and every walk's frames and end are asserted exactly.
// Hostile tables (unsorted, oversized, outside the text) and hostile stacks (loops, a stack
// pointer going down, unreadable or non-kernel stacks) end a walk or refuse a table, never
// anything worse.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "fake_kernel.hpp"
#include "kernel/orc.hpp"

namespace xenprobes::kernel::orc {
namespace {

using testing::kText;
using testing::kTextEnd;

// ORC flags (the entry's last 16 bits) by format.
constexpr std::uint16_t v1(unsigned sp, unsigned bp, unsigned type, unsigned end = 0) {
  return static_cast<std::uint16_t>(sp | bp << 4 | type << 8 | end << 10);
}
constexpr std::uint16_t v2(unsigned sp, unsigned bp, unsigned type, unsigned signal, unsigned end) {
  return static_cast<std::uint16_t>(sp | bp << 4 | type << 8 | signal << 10 | end << 11);
}
constexpr std::uint16_t v3(unsigned sp, unsigned bp, unsigned type, unsigned signal = 0) {
  return static_cast<std::uint16_t>(sp | bp << 4 | type << 8 | signal << 11);
}
// v1/v2 types; v3's are UNDEFINED 0, END 1, CALL 2, REGS 3, REGS_PARTIAL 4.
constexpr unsigned kCall1 = 0, kRegs1 = 1, kPartial1 = 2;
constexpr unsigned kUndef3 = 0, kEnd3 = 1, kCall3 = 2, kRegs3 = 3, kPartial3 = 4;

struct Row {
  std::uint64_t ip;
  std::int16_t sp_off, bp_off;
  std::uint16_t flags;
};

// The two raw arrays of a table whose address array starts at `ip_base`.
struct Raw {
  std::uint64_t ip_base = kText + 0x200000;  // in "rodata"
  std::vector<std::byte> ips, orcs;
  explicit Raw(const std::vector<Row>& rows) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::int64_t rel = static_cast<std::int64_t>(rows[i].ip - (ip_base + 4 * i));
      const auto r32 = static_cast<std::int32_t>(rel);
      append(ips, &r32, 4);
      append(orcs, &rows[i].sp_off, 2);
      append(orcs, &rows[i].bp_off, 2);
      append(orcs, &rows[i].flags, 2);
    }
  }
  static void append(std::vector<std::byte>& v, const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    v.insert(v.end(), b, b + n);
  }
  Result<Table> parse(Format f = Format::Auto, Limits l = {}) const {
    return Table::parse(ip_base, ips, orcs, {{kText, kTextEnd}}, f, l);
  }
};

// ---- decoding ----

Entry dec(std::uint16_t flags, Format f, std::int16_t sp = 8, std::int16_t bp = -16) {
  std::array<std::byte, 6> raw{};
  std::memcpy(raw.data(), &sp, 2);
  std::memcpy(raw.data() + 2, &bp, 2);
  std::memcpy(raw.data() + 4, &flags, 2);
  return decode(raw, f);
}

TEST(Orc, DecodesEachFormatsBits) {
  Entry e = dec(v1(kRegSp, kRegPrevSp, kCall1), Format::V1, 16, -16);
  EXPECT_EQ(e.sp_offset, 16);
  EXPECT_EQ(e.bp_offset, -16);
  EXPECT_EQ(e.sp_reg, kRegSp);
  EXPECT_EQ(e.bp_reg, kRegPrevSp);
  EXPECT_EQ(e.type, Type::Call);
  EXPECT_FALSE(e.signal);
  // v1: sp_reg UNDEFINED is the end of the stack with the end bit, else undefined; pt_regs
  // frames count as signal frames.
  EXPECT_EQ(dec(v1(kRegUndefined, 0, 0, 1), Format::V1).type, Type::EndOfStack);
  EXPECT_EQ(dec(v1(kRegUndefined, 0, 0, 0), Format::V1).type, Type::Undefined);
  EXPECT_EQ(dec(v1(kRegSp, 0, kRegs1), Format::V1).type, Type::Regs);
  EXPECT_TRUE(dec(v1(kRegSp, 0, kRegs1), Format::V1).signal);
  EXPECT_EQ(dec(v1(kRegSp, 0, kPartial1), Format::V1).type, Type::RegsPartial);
  EXPECT_EQ(dec(v1(kRegSp, 0, 3), Format::V1).type, Type::Unknown);
  // v2: a signal bit before the end bit.
  EXPECT_TRUE(dec(v2(kRegSp, 0, kCall1, 1, 0), Format::V2).signal);
  EXPECT_EQ(dec(v2(kRegSp, 0, kCall1, 1, 0), Format::V2).type, Type::Call);
  EXPECT_EQ(dec(v2(kRegUndefined, 0, 0, 0, 1), Format::V2).type, Type::EndOfStack);
  EXPECT_EQ(dec(v2(kRegUndefined, 0, 0, 1, 0), Format::V2).type, Type::Undefined);
  // v3: a 3-bit type, the signal bit above it.
  EXPECT_EQ(dec(v3(kRegSp, 0, kCall3), Format::V3).type, Type::Call);
  EXPECT_EQ(dec(v3(kRegUndefined, 0, kEnd3), Format::V3).type, Type::EndOfStack);
  EXPECT_EQ(dec(v3(kRegUndefined, 0, kUndef3), Format::V3).type, Type::Undefined);
  EXPECT_EQ(dec(v3(kRegSp, 0, kRegs3, 1), Format::V3).type, Type::Regs);
  EXPECT_TRUE(dec(v3(kRegSp, 0, kRegs3, 1), Format::V3).signal);
  EXPECT_EQ(dec(v3(kRegSp, 0, kPartial3), Format::V3).type, Type::RegsPartial);
  EXPECT_EQ(dec(v3(kRegSp, 0, 7), Format::V3).type, Type::Unknown);
  // The same bits mean different things: v1's CALL is v3's UNDEFINED.
  EXPECT_EQ(dec(v1(kRegSp, 0, kCall1), Format::V3).type, Type::Undefined);
}

TEST(Orc, TellsTheFormatFromTheEntries) {
  auto t1 = Raw({{kText, 8, 0, v1(kRegSp, 0, kCall1)},
                 {kText + 4, 16, 0, v1(kRegSp, 0, kCall1)},
                 {kText + 8, 0, 0, v1(kRegUndefined, 0, 0, 1)}})
                .parse();
  ASSERT_TRUE(t1) << t1.error().what;
  EXPECT_EQ(t1->format(), Format::V1);
  auto t2 = Raw({{kText, 8, 0, v2(kRegSp, 0, kCall1, 0, 0)}, {kText + 8, 0, 0, v2(kRegUndefined, 0, 0, 0, 1)}}).parse();
  ASSERT_TRUE(t2);
  EXPECT_EQ(t2->format(), Format::V2);
  auto t3 = Raw({{kText, 8, 0, v3(kRegSp, 0, kCall3)},
                 {kText + 4, 16, 0, v3(kRegSp, 0, kCall3)},
                 {kText + 8, 0, 0, v3(kRegUndefined, 0, kEnd3)}})
                .parse();
  ASSERT_TRUE(t3);
  EXPECT_EQ(t3->format(), Format::V3);
  // Nothing based on SP: no way to tell, refused unless the caller says.
  Raw none({{kText, 0, 0, v3(kRegUndefined, 0, kEnd3)}});
  auto t4 = none.parse();
  ASSERT_FALSE(t4);
  EXPECT_NE(t4.error().what.find("format cannot be told"), std::string::npos);
  EXPECT_TRUE(none.parse(Format::V3));
}

// ---- lookup and hostile tables ----

TEST(Orc, FindsTheLastEntryAtOrBelowAnAddress) {
  auto t = Raw({{kText + 0x10, 8, 0, v3(kRegSp, 0, kCall3)},
                {kText + 0x20, 16, 0, v3(kRegSp, 0, kCall3)},
                {kText + 0x20, 24, 0, v3(kRegSp, 0, kCall3)},  // a duplicate: the last one wins
                {kText + 0x30, 0, 0, v3(kRegUndefined, 0, kUndef3)}})
               .parse();
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->size(), 4u);
  EXPECT_EQ(t->find(kText + 0xf), nullptr);  // below the first entry
  ASSERT_NE(t->find(kText + 0x10), nullptr);
  EXPECT_EQ(t->find(kText + 0x10)->sp_offset, 8);
  EXPECT_EQ(t->find(kText + 0x1f)->sp_offset, 8);
  EXPECT_EQ(t->find(kText + 0x20)->sp_offset, 24);
  EXPECT_EQ(t->find(kText + 0x2f)->sp_offset, 24);
  EXPECT_EQ(t->find(kText + 0x40)->type, Type::Undefined);
  EXPECT_EQ(t->find(kTextEnd), nullptr);  // outside the text
  EXPECT_EQ(t->find(0x1000), nullptr);
}

TEST(Orc, AnUnsortedTableIsRefusedAsAWhole) {
  auto t = Raw({{kText + 0x10, 8, 0, v3(kRegSp, 0, kCall3)},
                {kText + 0x30, 8, 0, v3(kRegSp, 0, kCall3)},
                {kText + 0x20, 8, 0, v3(kRegSp, 0, kCall3)}})
               .parse();
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, Errc::InvalidArgument);
  EXPECT_NE(t.error().what.find("not sorted (entry 2 at 0xffffffff81000020"), std::string::npos) << t.error().what;
  // An entry outside the text still counts for the order: refused too, not silently dropped.
  auto u =
      Raw({{kText + 0x10, 8, 0, v3(kRegSp, 0, kCall3)}, {0xffffffff80000000ull, 8, 0, v3(kRegSp, 0, kCall3)}}).parse();
  EXPECT_FALSE(u);
}

TEST(Orc, SizesCountsAndEntriesOutsideTheTextAreChecked) {
  Raw r({{kText, 8, 0, v3(kRegSp, 0, kCall3)}, {kText + 8, 8, 0, v3(kRegSp, 0, kCall3)}});
  // Arrays that disagree.
  auto bad = Table::parse(r.ip_base, std::span(r.ips).first(4), r.orcs, {{kText, kTextEnd}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what.find("do not describe the same entries"), std::string::npos);
  EXPECT_FALSE(Table::parse(r.ip_base, std::span(r.ips).first(5), std::span(r.orcs).first(6), {{kText, kTextEnd}}));
  EXPECT_FALSE(Table::parse(r.ip_base, {}, {}, {{kText, kTextEnd}}));
  // Over the entry limit.
  Limits small;
  small.max_entries = 1;
  auto big = r.parse(Format::Auto, small);
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().what.find("over the limit of 1"), std::string::npos);
  // Entries pointing below, inside and past the text (its end address is kept: a terminator).
  auto t = Raw({{kText - 0x1000, 8, 0, v3(kRegSp, 0, kCall3)},
                {kText, 8, 0, v3(kRegSp, 0, kCall3)},
                {kTextEnd, 0, 0, v3(kRegUndefined, 0, kUndef3)},
                {kTextEnd + 0x1000, 8, 0, v3(kRegSp, 0, kCall3)}})
               .parse();
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->size(), 2u);
  EXPECT_EQ(t->dropped(), 2u);
  EXPECT_EQ(t->summary(), "2 entries (v3 (Linux 6.4+)), 2 outside the text dropped");
  // Every entry outside: nothing to unwind with.
  EXPECT_FALSE(Raw({{kTextEnd + 0x10, 8, 0, v3(kRegSp, 0, kCall3)}}).parse());
  // An address array placed at the very top of the address space would wrap.
  EXPECT_FALSE(Table::parse(~0ull - 3, r.ips, r.orcs, {{kText, kTextEnd}}));
}

TEST(Orc, TheKernelsTableFromItsSymbolsAndMemory) {
  testing::FakeKernel k;
  Raw r({{kText, 8, 0, v1(kRegSp, 0, kCall1)}, {kText + 0x40, 16, 0, v1(kRegSp, 0, kCall1)}});
  const std::uint64_t orc_at = r.ip_base + 0x100;
  k.put(r.ip_base, r.ips.data(), r.ips.size());
  k.put(orc_at, r.orcs.data(), r.orcs.size());
  auto syms_without = k.symbols();
  auto none = read_kernel_table(syms_without, k.reader());
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Errc::NotFound);
  EXPECT_NE(none.error().what.find("CONFIG_UNWINDER_ORC"), std::string::npos);
  k.bounds("__start_orc_unwind_ip", "__stop_orc_unwind_ip", r.ip_base, r.ips.size());
  k.bounds("__start_orc_unwind", "__stop_orc_unwind", orc_at, r.orcs.size());
  auto t = read_kernel_table(k.symbols(), k.reader());
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->size(), 2u);
  EXPECT_EQ(t->format(), Format::V1);
  EXPECT_EQ(t->find(kText + 0x41)->sp_offset, 16);
  EXPECT_TRUE(t->covers(testing::kInit));  // init text is described too
  // Unreadable entries: a Fault naming the table.
  k.unreadable.push_back(orc_at + 6);
  auto f = read_kernel_table(k.symbols(), k.reader());
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code, Errc::Fault);
  // Sizes that disagree (one more address than entries).
  testing::FakeKernel k2;
  k2.bounds("__start_orc_unwind_ip", "__stop_orc_unwind_ip", r.ip_base, r.ips.size() + 4);
  k2.bounds("__start_orc_unwind", "__stop_orc_unwind", orc_at, r.orcs.size());
  auto m = read_kernel_table(k2.symbols(), k2.reader());
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, Errc::InvalidArgument);
  // A module's count over the limit is refused before anything is read.
  Limits small;
  small.max_entries = 1000;
  auto huge = read_module_table(k.reader(), r.ip_base, orc_at, 1ull << 40, {kText, kTextEnd}, Format::V1, small);
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.error().what.find("over the limit"), std::string::npos);
}

}  // namespace
}  // namespace xenprobes::kernel::orc
