// GuestMemory: virtual and physical reads/writes, the translation cache and the mapping cache.
#include "mem/guest_memory.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "mem/fake_frame_source.hpp"
#include "unit/mem/page_table_builder.hpp"

namespace xenprobes::mem {
namespace {

using namespace xenprobes::mem::testing;

std::vector<std::byte> bytes(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int b : v) out.push_back(std::byte(b));
  return out;
}

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = std::byte((i * 7 + seed) & 0xFF);
  return out;
}

// A Long4 guest (the frames double as PV MFNs or HVM GFNs; it does not matter here):
//
//   va                      -> physical          frame    guest PTE flags
//   0x0000000000400000      -> 0x00500000        0x500    P|RW
//   0x0000000000401000      -> 0x07000000        0x7000   P|RW   (not contiguous with 0x500)
//   0x0000000000402000      not mapped
//   0x0000000000403000      -> 0x00501000        0x501    P      (read-only: "kernel text")
//   0x0000000000600000      -> 0x02000000 2 MiB  0x2000…  P|RW
//
//   tables: PML4 0x100 -> PDPT 0x101 -> PD 0x102 -> PT 0x103
class GuestMemoryTest : public ::testing::Test {
 protected:
  static constexpr std::uint64_t kA = 0x40'0000, kB = 0x40'1000, kHole = 0x40'2000, kText = 0x40'3000,
                                 kLarge = 0x60'0000;

  void SetUp() override {
    b_.map(kA, 0x50'0000);
    b_.map(kB, 0x700'0000);
    b_.map(kText, 0x50'1000, 4 * KiB, P);
    b_.map(kLarge, 0x200'0000, 2 * MiB, P | RW);
    for (std::uint64_t f : {0x500, 0x501, 0x7000, 0x2000, 0x2001}) ram_.add_frame(Frame{f});
    mem_.set_context(PagingMode::Long4, b_.cr3());
  }

  std::vector<std::byte> phys(std::uint64_t pa, std::size_t n) {
    std::vector<std::byte> out(n);
    ram_.read(Gpa{pa}, out);
    return out;
  }

  FakeFrameSource ram_;
  PageTableBuilder b_{ram_, PagingMode::Long4};
  GuestMemory mem_{ram_};
};

TEST_F(GuestMemoryTest, ReadAcrossPageBoundary) {
  ram_.write(Gpa{0x50'0FF8}, bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  ram_.write(Gpa{0x700'0000}, bytes({9, 10, 11, 12, 13, 14, 15, 16}));
  std::vector<std::byte> out(16);
  ASSERT_TRUE(mem_.read(Gva{kA + 0xFF8}, out));
  EXPECT_EQ(out, bytes({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}));
}

TEST_F(GuestMemoryTest, WriteAcrossPageBoundary) {
  const auto data = pattern(100, 3);
  ASSERT_TRUE(mem_.write(Gva{kA + 0xFD0}, data));
  auto got = phys(0x50'0FD0, 0x30);
  const auto tail = phys(0x700'0000, 100 - 0x30);
  got.insert(got.end(), tail.begin(), tail.end());
  EXPECT_EQ(got, data);
  std::vector<std::byte> back(100);
  ASSERT_TRUE(mem_.read(Gva{kA + 0xFD0}, back));
  EXPECT_EQ(back, data);
}

TEST_F(GuestMemoryTest, ReadInsideALargePageCrossesFourKilobyteBoundaries) {
  const auto data = pattern(64, 9);
  ram_.write(Gpa{0x200'0FE0}, data);
  std::vector<std::byte> out(64);
  ASSERT_TRUE(mem_.read(Gva{kLarge + 0xFE0}, out));
  EXPECT_EQ(out, data);
}

TEST_F(GuestMemoryTest, TypedHelpers) {
  ASSERT_TRUE(mem_.write_u64(Gva{kA + 0xFFC}, 0x1122'3344'5566'7788ull));  // straddles
  EXPECT_EQ(*mem_.read_u64(Gva{kA + 0xFFC}), 0x1122'3344'5566'7788ull);
  EXPECT_EQ(*mem_.read_u32(Gva{kA + 0xFFC}), 0x5566'7788u);
  EXPECT_EQ(*mem_.read_u32(Gva{kB}), 0x1122'3344u);
  EXPECT_EQ(*mem_.read_u16(Gva{kB + 2}), 0x1122u);
  EXPECT_EQ(*mem_.read_u8(Gva{kB + 3}), 0x11u);
  ASSERT_TRUE(mem_.write_u8(Gva{kA}, 0xCC));
  ASSERT_TRUE(mem_.write_u16(Gva{kA + 2}, 0xBEEF));
  ASSERT_TRUE(mem_.write_u32(Gva{kA + 4}, 0xDEAD'BEEF));
  EXPECT_EQ(*mem_.read_u64(Gva{kA}), 0xDEAD'BEEF'BEEF'00CCull);

  struct ListHead {
    std::uint64_t next, prev;
  };
  ASSERT_TRUE(mem_.write_as(Gva{kA + 0x100}, ListHead{1, 2}));
  auto lh = mem_.read_as<ListHead>(Gva{kA + 0x100});
  ASSERT_TRUE(lh);
  EXPECT_EQ(lh->next, 1u);
  EXPECT_EQ(lh->prev, 2u);
}

TEST_F(GuestMemoryTest, ReadFaultsOnUnmappedPage) {
  std::vector<std::byte> out(32);
  auto r = mem_.read(Gva{kB + 0xFF0}, out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Fault);
  EXPECT_NE(r.error().what.find("PTE (level 1) index 0x2"), std::string::npos) << r.error().what;
  EXPECT_NE(r.error().what.find("gva 0x402000"), std::string::npos) << r.error().what;
}

TEST_F(GuestMemoryTest, ReadStringAcrossPages) {
  const char s[] = "/etc/passwd";
  ram_.write(Gpa{0x50'0FFA}, std::as_bytes(std::span(s, 6)));       // "/etc/p" at the page end
  ram_.write(Gpa{0x700'0000}, std::as_bytes(std::span(s + 6, 6)));  // "asswd\0"
  auto str = mem_.read_string(Gva{kA + 0xFFA}, 256);
  ASSERT_TRUE(str) << str.error().what;
  EXPECT_EQ(*str, "/etc/passwd");
}

TEST_F(GuestMemoryTest, ReadStringTruncatesAtMaxLen) {
  ram_.write(Gpa{0x50'0000}, std::as_bytes(std::span("kworker/0:1", 12)));
  EXPECT_EQ(*mem_.read_string(Gva{kA}, 7), "kworker");
  EXPECT_EQ(*mem_.read_string(Gva{kA}, 0), "");
  EXPECT_EQ(*mem_.read_string(Gva{kA}, 100), "kworker/0:1");
}

TEST_F(GuestMemoryTest, ReadStringStopsBeforeAnUnmappedPage) {
  // The NUL is the last byte of the page before the hole: the hole is never touched.
  ram_.write(Gpa{0x700'0FFD}, bytes({'o', 'k', 0}));
  EXPECT_EQ(*mem_.read_string(Gva{kB + 0xFFD}, 100), "ok");
  // Without a NUL the read runs into the hole and faults.
  ram_.write(Gpa{0x700'0FFD}, bytes({'n', 'o', '!'}));
  auto str = mem_.read_string(Gva{kB + 0xFFD}, 100);
  ASSERT_FALSE(str);
  EXPECT_EQ(str.error().code, Errc::Fault);
}

TEST_F(GuestMemoryTest, PhysicalReadWriteAcrossFrames) {
  const auto data = pattern(0x30, 5);
  ASSERT_TRUE(mem_.write_phys(Gpa{0x200'0FF0}, data));
  std::vector<std::byte> out(0x30);
  ASSERT_TRUE(mem_.read_phys(Gpa{0x200'0FF0}, out));
  EXPECT_EQ(out, data);
  EXPECT_EQ(phys(0x200'1000, 0x20), std::vector<std::byte>(data.begin() + 0x10, data.end()));
  auto r = mem_.read_phys(Gpa{0x9999'0000}, out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Fault);
  EXPECT_NE(r.error().what.find("physical 0x99990000"), std::string::npos) << r.error().what;
}

TEST_F(GuestMemoryTest, NoPagingReadsPhysicalAddresses) {
  ram_.write_u64(Gpa{0x50'0010}, 42);
  mem_.set_context(PagingMode::None, 0);
  EXPECT_EQ(*mem_.read_u64(Gva{0x50'0010}), 42u);
}

// ---- translation cache ----

TEST_F(GuestMemoryTest, SecondTranslationDoesNotMapOrWalkAgain) {
  auto t1 = mem_.translate(Gva{kA + 0x10});
  ASSERT_TRUE(t1);
  const std::size_t maps = ram_.map_calls();
  EXPECT_EQ(maps, 4u);  // PML4, PDPT, PD, PT
  auto t2 = mem_.translate(Gva{kA + 0x20});
  ASSERT_TRUE(t2);
  EXPECT_EQ(t2->address.value, 0x50'0020u);
  EXPECT_EQ(ram_.map_calls(), maps);
  EXPECT_EQ(mem_.stats().translations_walked, 1u);
  EXPECT_EQ(mem_.stats().translations_cached, 1u);
}

TEST_F(GuestMemoryTest, RepeatedReadsMapEachFrameOnce) {
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(mem_.read_u64(Gva{kA + 8 * i}));
  EXPECT_EQ(ram_.map_calls(), 5u);  // 4 tables + 1 data frame
  EXPECT_EQ(mem_.stats().maps, 5u);
  EXPECT_EQ(mem_.stats().translations_walked, 1u);
  EXPECT_EQ(mem_.stats().translations_cached, 9u);
}

TEST_F(GuestMemoryTest, InvalidateTranslationsForcesAWalk) {
  ram_.write_u64(Gpa{0x50'0000}, 1);
  ram_.write_u64(Gpa{0x700'0000}, 2);
  EXPECT_EQ(*mem_.read_u64(Gva{kA}), 1u);
  // The guest remaps kA to 0x7000000; the cache does not see it …
  b_.map(kA, 0x700'0000);
  EXPECT_EQ(*mem_.read_u64(Gva{kA}), 1u);
  // … until told.
  mem_.invalidate_translations();
  EXPECT_EQ(*mem_.read_u64(Gva{kA}), 2u);
  EXPECT_EQ(mem_.stats().translations_walked, 2u);
}

TEST_F(GuestMemoryTest, InvalidateFrameDropsTranslationsThatUsedIt) {
  ASSERT_TRUE(mem_.translate(Gva{kA}));
  ASSERT_TRUE(mem_.translate(Gva{kLarge}));  // walks PML4, PDPT, PD only
  mem_.reset_stats();
  mem_.invalidate_frame(Frame{0x103});  // the PT: kA's walk read it, kLarge's did not
  ASSERT_TRUE(mem_.translate(Gva{kA}));
  ASSERT_TRUE(mem_.translate(Gva{kLarge}));
  EXPECT_EQ(mem_.stats().translations_walked, 1u);
  EXPECT_EQ(mem_.stats().translations_cached, 1u);
  EXPECT_EQ(mem_.stats().maps, 1u);  // the PT frame, mapped again
}

TEST_F(GuestMemoryTest, CacheIsKeyedByCr3) {
  // A second address space mapping kA elsewhere.
  PageTableBuilder other(ram_, PagingMode::Long4, Frame{0x900});
  other.map(kA, 0x700'0000);
  ram_.write_u64(Gpa{0x50'0000}, 1);
  ram_.write_u64(Gpa{0x700'0000}, 2);
  for (int round = 0; round < 3; ++round) {
    mem_.set_context(PagingMode::Long4, b_.cr3());
    EXPECT_EQ(*mem_.read_u64(Gva{kA}), 1u);
    mem_.set_context(PagingMode::Long4, other.cr3());
    EXPECT_EQ(*mem_.read_u64(Gva{kA}), 2u);
  }
  EXPECT_EQ(mem_.stats().translations_walked, 2u);
  EXPECT_EQ(mem_.stats().translations_cached, 4u);
}

TEST_F(GuestMemoryTest, ModeChangeDropsTranslations) {
  ASSERT_TRUE(mem_.translate(Gva{kA}));
  mem_.set_context(PagingMode::Long5, b_.cr3());
  mem_.set_context(PagingMode::Long4, b_.cr3());
  ASSERT_TRUE(mem_.translate(Gva{kA}));
  EXPECT_EQ(mem_.stats().translations_walked, 2u);
}

TEST_F(GuestMemoryTest, FailedWalksAreNotCached) {
  ASSERT_FALSE(mem_.translate(Gva{kHole}));
  b_.map(kHole, 0x50'0000);
  EXPECT_TRUE(mem_.translate(Gva{kHole}));
}

TEST_F(GuestMemoryTest, TranslationCacheIsBounded) {
  GuestMemory small(ram_, GuestMemoryOptions{.mapping_cache_frames = 16, .translation_cache_pages = 2});
  small.set_context(PagingMode::Long4, b_.cr3());
  for (std::uint64_t va : {kA, kB, kText, kA}) ASSERT_TRUE(small.translate(Gva{va}));
  EXPECT_EQ(small.stats().translations_walked, 4u);  // kA was evicted by kText
}

// ---- mapping cache ----

TEST_F(GuestMemoryTest, MappingCacheIsBoundedAndEvicts) {
  GuestMemory small(ram_, GuestMemoryOptions{.mapping_cache_frames = 4, .translation_cache_pages = 64});
  small.set_context(PagingMode::Long4, b_.cr3());
  for (int i = 0; i < 10; ++i) {
    b_.map(0x80'0000 + i * 0x1000ull, 0x1000'0000 + i * 0x1000ull);
    ram_.add_frame(Frame{0x1'0000ull + i});
  }
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(small.read_u64(Gva{0x80'0000 + i * 0x1000ull}));
    EXPECT_LE(ram_.live_mappings(), 4u);  // mem_ has mapped nothing in this test
  }
  EXPECT_GT(small.stats().mapping_evictions, 0u);
  // The first data frame was evicted: reading it again maps it again (translation is cached).
  const std::size_t before = ram_.map_calls();
  ASSERT_TRUE(small.read_u64(Gva{0x80'0000}));
  EXPECT_EQ(ram_.map_calls(), before + 1);
  EXPECT_EQ(ram_.map_log().back().first, Frame{0x1'0000});
}

TEST_F(GuestMemoryTest, FlushUnmapsEverything) {
  ASSERT_TRUE(mem_.read_u64(Gva{kA}));
  EXPECT_EQ(ram_.live_mappings(), 5u);
  mem_.flush();
  EXPECT_EQ(ram_.live_mappings(), 0u);
  ASSERT_TRUE(mem_.read_u64(Gva{kA}));
  EXPECT_EQ(mem_.stats().translations_walked, 2u);
}

TEST_F(GuestMemoryTest, MapFailureIsReportedAndNotCached) {
  ASSERT_TRUE(mem_.translate(Gva{kA}));
  ram_.fail_next_maps(1, Errc::Again);
  auto r = mem_.read_u64(Gva{kA});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Again);
  EXPECT_TRUE(mem_.read_u64(Gva{kA}));
}

// ---- writes and mapping access ----

TEST_F(GuestMemoryTest, WriteUpgradesAReadOnlyMapping) {
  ASSERT_TRUE(mem_.read_u64(Gva{kA}));
  EXPECT_EQ(ram_.map_calls(hv::MapAccess::ReadWrite), 0u);  // reads never map writable
  ASSERT_TRUE(mem_.write_u8(Gva{kA}, 0xCC));
  EXPECT_EQ(ram_.map_calls(hv::MapAccess::ReadWrite), 1u);
  EXPECT_EQ(ram_.map_log().back(), std::make_pair(Frame{0x500}, hv::MapAccess::ReadWrite));
  EXPECT_EQ(mem_.stats().mapping_upgrades, 1u);
  EXPECT_EQ(ram_.live_mappings(), 5u);  // replaced, not added
  // The writable mapping serves later reads and writes.
  const std::size_t maps = ram_.map_calls();
  EXPECT_EQ(*mem_.read_u8(Gva{kA}), 0xCCu);
  ASSERT_TRUE(mem_.write_u8(Gva{kA + 1}, 0x90));
  EXPECT_EQ(ram_.map_calls(), maps);
}

TEST_F(GuestMemoryTest, RefusedWritableMappingLeavesMemoryUnchanged) {
  // Like Xen refusing a writable mapping of a PV page-table page.
  ram_.deny_writable(Frame{0x7000});
  ram_.write(Gpa{0x50'0FF8}, pattern(8, 1));
  ram_.write(Gpa{0x700'0000}, pattern(8, 2));
  ASSERT_TRUE(mem_.read_u64(Gva{kB}));  // kB's frame is mapped read-only now
  auto r = mem_.write(Gva{kA + 0xFF8}, pattern(16, 77));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Permission);
  EXPECT_NE(r.error().what.find("cannot write gva 0x400ff8"), std::string::npos) << r.error().what;
  EXPECT_EQ(phys(0x50'0FF8, 8), pattern(8, 1)) << "first page written although the second was refused";
  EXPECT_EQ(phys(0x700'0000, 8), pattern(8, 2));
  // The read-only mapping survived the refused upgrade.
  const std::size_t maps = ram_.map_calls();
  EXPECT_TRUE(mem_.read_u64(Gva{kB}));
  EXPECT_EQ(ram_.map_calls(), maps);
}

TEST_F(GuestMemoryTest, WriteIntoAnUnmappedPageLeavesMemoryUnchanged) {
  ram_.write(Gpa{0x700'0FF8}, pattern(8, 4));
  auto r = mem_.write_transient(Gva{kB + 0xFF8}, pattern(16, 5));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Fault);
  EXPECT_EQ(phys(0x700'0FF8, 8), pattern(8, 4));
}

TEST_F(GuestMemoryTest, WriteIgnoresTheGuestsReadOnlyBit) {
  // Dom0 patches kernel text that the guest maps read-only; the walk reports it.
  auto t = mem_.translate(Gva{kText});
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->writable);
  ASSERT_TRUE(mem_.write_u8(Gva{kText + 5}, 0xCC));
  EXPECT_EQ(phys(0x50'1005, 1), bytes({0xCC}));
}

// Stacks and data: the guest frees and reuses those frames, and on PV a frame Dom0 keeps
// mapped writable cannot become a page table. A transient write leaves no writable mapping.
TEST_F(GuestMemoryTest, TransientWriteLeavesNoWritableMappingBehind) {
  ASSERT_TRUE(mem_.write_u64(Gva{kText}, 1));  // text: the cached writable mapping stays
  EXPECT_EQ(ram_.live_writable(Frame{0x501}), 1u);
  const auto data = pattern(16, 9);
  ASSERT_TRUE(mem_.write_transient(Gva{kA + 0xFF8}, data));  // across two frames
  EXPECT_EQ(ram_.live_writable(Frame{0x500}), 0u);
  EXPECT_EQ(ram_.live_writable(Frame{0x7000}), 0u);
  EXPECT_EQ(ram_.live_writable(Frame{0x501}), 1u);
  std::vector<std::byte> back(16);
  ASSERT_TRUE(mem_.read(Gva{kA + 0xFF8}, back));
  EXPECT_EQ(back, data);
  // A read-only mapping of the same frame before the write goes too (it was upgraded).
  ASSERT_TRUE(mem_.read_u64(Gva{kB}));
  ASSERT_TRUE(mem_.write_u64_transient(Gva{kB}, 5));
  EXPECT_EQ(ram_.live_writable(Frame{0x7000}), 0u);
  EXPECT_EQ(*mem_.read_u64(Gva{kB}), 5u);
}

TEST_F(GuestMemoryTest, TransientWritesKeepTheirMappingsWhenTurnedOff) {
  GuestMemoryOptions o;
  o.transient_data_writes = false;  // an HVM guest
  GuestMemory hvm(ram_, o);
  hvm.set_context(PagingMode::Long4, b_.cr3());
  ASSERT_TRUE(hvm.write_u64_transient(Gva{kA}, 3));
  EXPECT_EQ(ram_.live_writable(Frame{0x500}), 1u);
  EXPECT_EQ(*hvm.read_u64(Gva{kA}), 3u);
}

TEST_F(GuestMemoryTest, FailedTransientWriteLeavesNothingMappedWritable) {
  // The second page is not mapped: nothing is written, and the first frame is not kept.
  auto r = mem_.write_transient(Gva{kB + 0xFF8}, pattern(16, 5));
  ASSERT_FALSE(r);
  EXPECT_EQ(ram_.live_writable(Frame{0x7000}), 0u);
}

TEST_F(GuestMemoryTest, PageTablesAreMappedReadOnly) {
  ASSERT_TRUE(mem_.write_u64(Gva{kA}, 7));
  for (const auto& [frame, access] : ram_.map_log()) {
    if (frame.value >= 0x100 && frame.value <= 0x103) {
      EXPECT_EQ(access, hv::MapAccess::Read) << std::hex << frame.value;
    }
  }
}

}  // namespace
}  // namespace xenprobes::mem
