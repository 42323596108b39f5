// The table-driven walker, one fixture per paging mode. Each fixture draws its tables; the
// builder writes exactly those entries into a FakeFrameSource, and the tests walk them.
#include "mem/walker.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "mem/fake_frame_source.hpp"
#include "unit/mem/page_table_builder.hpp"

namespace xenprobes::mem {
namespace {

using namespace xenprobes::mem::testing;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Long-mode address from its table indices, sign-extended from bit 47 (or 56 with LA57).
constexpr std::uint64_t va4(std::uint64_t l4, std::uint64_t l3, std::uint64_t l2, std::uint64_t l1,
                            std::uint64_t off = 0) {
  std::uint64_t v = l4 << 39 | l3 << 30 | l2 << 21 | l1 << 12 | off;
  return (v & (1ull << 47)) ? v | 0xFFFF'0000'0000'0000ull : v;
}
constexpr std::uint64_t va5(std::uint64_t l5, std::uint64_t l4, std::uint64_t l3, std::uint64_t l2, std::uint64_t l1,
                            std::uint64_t off = 0) {
  std::uint64_t v = l5 << 48 | l4 << 39 | l3 << 30 | l2 << 21 | l1 << 12 | off;
  return (v & (1ull << 56)) ? v | 0xFE00'0000'0000'0000ull : v;
}

class WalkerTest : public ::testing::Test {
 protected:
  Result<Translation> walk_va(std::uint64_t va) { return walk(ctx_, Gva{va}, cache_); }
  // Asserts a failed walk with `code` whose message mentions every `part`.
  void expect_error(std::uint64_t va, Errc code, std::initializer_list<std::string> parts) {
    auto t = walk_va(va);
    ASSERT_FALSE(t) << "walk of " << std::hex << va << " succeeded: 0x" << t->address.value;
    EXPECT_EQ(t.error().code, code) << t.error().what;
    for (const auto& p : parts) EXPECT_TRUE(contains(t.error().what, p)) << t.error().what << "\n  lacks: " << p;
  }

  FakeFrameSource ram_;
  MapCache cache_{ram_, 64};
  PagingContext ctx_;
};

// ---------------------------------------------------------------------------------------------
// Legacy32: 2 levels of 1024 × 4-byte entries, 4 MiB pages with CR4.PSE.
//
//   cr3 = 0x00100000
//     |
//     v  PD @ frame 0x100                         PT @ frame 0x101
//   +-------+------------+------------------+    +-------+------------+-----------------+
//   | 0x000 | 0x00101007 | -> PT 0x101 P|RW|US|    | 0x005 | 0x00200003 | page 0x200 P|RW |
//   | 0x001 | 0x00400083 | 4 MiB @ 0x400000 PS|    | 0x006 | 0          | not present     |
//   | 0x002 | 0x00824083 | 4 MiB @ 0x12_00800000 |  +-------+------------+-----------------+
//   |       |            |  (PSE-36: 0x12 in bits 20:13)
//   | 0x003 | 0x00e00083 | + bit 21: reserved |
//   | 0x300 | 0          | not present        |
//   +-------+------------+--------------------+
class Legacy32Test : public WalkerTest {
 protected:
  void SetUp() override {
    PageTableBuilder b(ram_, PagingMode::Legacy32);
    const Frame pt = b.new_table();
    b.set(b.root(), 0x000, entry(pt, P | RW | US));
    b.set(b.root(), 0x001, large(0x0040'0000, P | RW));
    b.set(b.root(), 0x002, large(0x0080'0000 | (0x12 << 13), P | RW));
    b.set(b.root(), 0x003, large(0x00C0'0000 | (1u << 21), P | RW));
    b.set(pt, 0x005, entry(Frame{0x200}, P | RW));
    ctx_ = {.mode = PagingMode::Legacy32, .cr3 = b.cr3(), .pse = true};
  }
};

TEST_F(Legacy32Test, FourKilobytePage) {
  auto t = walk_va(0x0000'5123);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 0x20'0123u);
  EXPECT_EQ(t->page_size, 4 * KiB);
  EXPECT_EQ(t->depth, 2u);
  EXPECT_EQ(t->table_frames[0], Frame{0x100});
  EXPECT_EQ(t->table_frames[1], Frame{0x101});
  EXPECT_EQ(t->entries[1], 0x0020'0003u);
  EXPECT_TRUE(t->writable);
  EXPECT_FALSE(t->user);  // the PTE lacks U/S
  EXPECT_FALSE(t->nx);    // no XD in 32-bit entries
}

TEST_F(Legacy32Test, FourMegabytePage) {
  auto t = walk_va(0x0041'2345);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 0x41'2345u);
  EXPECT_EQ(t->page_size, 4 * MiB);
  EXPECT_EQ(t->depth, 1u);
}

TEST_F(Legacy32Test, Pse36HighAddressBits) {
  auto t = walk_va(0x0080'0010);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 0x12'0080'0010u);
}

TEST_F(Legacy32Test, WithoutCr4PsePsIsIgnored) {
  // PDE 0x001 is then a pointer to a "page table" at frame 0x400, which is not guest RAM.
  ctx_.pse = false;
  expect_error(0x0041'2345, Errc::Fault, {"cannot map", "PTE (level 1", "frame 0x400"});
}

TEST_F(Legacy32Test, NotPresentPde) {
  expect_error(0xC000'0000, Errc::Fault, {"not present", "PDE (level 2) index 0x300", "entry 0x0", "gva 0xc0000000"});
}

TEST_F(Legacy32Test, NotPresentPte) {
  expect_error(0x0000'6000, Errc::Fault, {"not present", "PTE (level 1) index 0x6", "gva 0x6000"});
}

TEST_F(Legacy32Test, ReservedBit21InLargePde) {
  expect_error(0x00C0'0000, Errc::Io, {"reserved bits 0x200000", "PDE (level 2) index 0x3"});
}

TEST_F(Legacy32Test, Pse36BitsAboveMaxPhysAddrAreReserved) {
  ctx_.max_phys_bits = 36;  // PSE-36 bits for 39:36 become reserved: 0x12 has bit 36 set
  expect_error(0x0080'0010, Errc::Io, {"reserved bits 0x20000", "PDE (level 2) index 0x2"});
}

TEST_F(Legacy32Test, AddressAbove4GiBIsInvalid) { expect_error(0x1'0000'0000, Errc::InvalidArgument, {"above 4 GiB"}); }

// ---------------------------------------------------------------------------------------------
// PAE: a 4-entry PDPT at a 32-byte aligned cr3, then PD and PT of 512 × 8-byte entries.
//
//   cr3 = 0x00100020  (PDPT at offset 0x20 of frame 0x100; offset 0x00 holds a decoy)
//     |
//     v  PDPT @ 0x100020            PD @ frame 0x101                      PT @ frame 0x103
//   +---+----------+-----------+  +-----+-----------------------+-----+  +-----+--------+------+
//   | 0 | 0x101001 | -> PD 0x101|  |  0  | 0x103007 -> PT 0x103  P|RW|US|  |  4  | 0x205007 page 0x205
//   | 1 | 0        | not present|  |  1  | NX|0x600083  2 MiB @ 0x600000 |  |  5  | 0       not present
//   | 2 | 0x104081 | PS: reserved| |  2  | 0         not present   |    |  +-----+--------+------+
//   | 3 | 0x102001 | -> PD 0x102|  |  3  | bit62|0x104007 reserved |    |
//   +---+----------+-----------+  +-----+-----------------------+-----+
//   (PDPTEs have no R/W, U/S, XD)
class PaeTest : public WalkerTest {
 protected:
  void SetUp() override {
    PageTableBuilder b(ram_, PagingMode::Pae);
    const Frame pdpt = b.root();
    const Frame pd = b.new_table(), pd3 = b.new_table(), pt = b.new_table();
    ASSERT_EQ(pd, Frame{0x101});
    ASSERT_EQ(pt, Frame{0x103});
    b.set(pdpt, 0, 0xDEAD'0000);  // decoy at offset 0: a walker ignoring cr3's offset trips on it
    b.set(pdpt, 4 + 0, entry(pd, P));
    b.set(pdpt, 4 + 2, entry(Frame{0x104}, P | PS));
    b.set(pdpt, 4 + 3, entry(pd3, P));
    b.set(pd, 0, entry(pt, P | RW | US));
    b.set(pd, 1, large(0x60'0000, P | RW) | NX);
    b.set(pd, 3, entry(Frame{0x104}, P | RW | US) | (1ull << 62));
    b.set(pt, 4, entry(Frame{0x205}, P | RW | US));
    ctx_ = {.mode = PagingMode::Pae, .cr3 = b.cr3() + 0x20};
  }
};

TEST_F(PaeTest, FourKilobytePage) {
  auto t = walk_va(0x0000'4ABC);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 0x20'5ABCu);
  EXPECT_EQ(t->page_size, 4 * KiB);
  EXPECT_EQ(t->depth, 3u);
  EXPECT_EQ(t->table_frames[0], Frame{0x100});
  EXPECT_EQ(t->table_frames[1], Frame{0x101});
  EXPECT_EQ(t->table_frames[2], Frame{0x103});
  EXPECT_TRUE(t->writable);  // PDPTE has no R/W: only the PDE and PTE count
  EXPECT_TRUE(t->user);
  EXPECT_FALSE(t->nx);
}

TEST_F(PaeTest, TwoMegabytePageWithNx) {
  auto t = walk_va(0x0023'4567);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 0x63'4567u);
  EXPECT_EQ(t->page_size, 2 * MiB);
  EXPECT_TRUE(t->nx);
  EXPECT_FALSE(t->user);
}

TEST_F(PaeTest, NotPresentAtEachLevel) {
  expect_error(0x4000'0000, Errc::Fault, {"not present", "PDPTE (level 3) index 0x1", "entry 0x0"});
  expect_error(0x0040'0000, Errc::Fault, {"not present", "PDE (level 2) index 0x2"});
  expect_error(0x0000'5000, Errc::Fault, {"not present", "PTE (level 1) index 0x5"});
}

TEST_F(PaeTest, PsInPdpteIsReserved) {
  expect_error(0x8000'0000, Errc::Io, {"reserved bits 0x80", "PDPTE (level 3) index 0x2", "entry 0x104081"});
}

TEST_F(PaeTest, Bit62InPdeIsReserved) {
  expect_error(0x0060'0000, Errc::Io, {"reserved bits 0x4000000000000000", "PDE (level 2) index 0x3"});
}

TEST_F(PaeTest, XdWithoutNxeIsReserved) {
  ctx_.nxe = false;
  expect_error(0x0020'0000, Errc::Io, {"reserved bits 0x8000000000000000", "PDE (level 2) index 0x1"});
}

// ---------------------------------------------------------------------------------------------
// Long4: PML4 -> PDPT (PS: 1 GiB) -> PD (PS: 2 MiB) -> PT.
//
//   cr3 = 0x00100000
//     |
//     v  PML4 @ 0x100               PDPT @ 0x101                       PD @ 0x103
//   +-------+------------------+  +---+--------------------------+  +---+------------------------+
//   | 0x000 | -> PDPT 0x101    |  | 0 | -> PD 0x103   P|RW|US    |  | 0 | -> PT 0x104  P|RW|US   |
//   | 0x001 | PS: reserved     |  | 1 | 1 GiB @ 0x40000000 P|RW|US|  | 1 | 2 MiB @ 0x200000 P|US  |
//   | 0x002 | not present      |  | 2 | not present              |  | 2 | not present            |
//   | 0x1ff | -> PDPT 0x102 P|RW|  | 3 | 1 GiB + bit 13: reserved |  | 3 | 2 MiB + bit 20: reserved|
//   +-------+------------------+  +---+--------------------------+  +---+------------------------+
//            PDPT @ 0x102 (kernel half)      PT @ 0x104
//          +-------+-------------------+  +---+-------------------------------+
//          | 0x1fe | -> PD 0x105 P|RW  |  | 3 | NX | page 0x300  P|RW|US     |
//          +-------+-------------------+  | 4 | not present                   |
//            PD @ 0x105                   | 5 | page at 2^45 (bit 45)  P      |
//          +---+---------------------+    +---+-------------------------------+
//          | 0 | 2 MiB @ 0x1000000 P |   0xffffffff80000000 (kernel text) -> 0x1000000
//          +---+---------------------+
class Long4Test : public WalkerTest {
 protected:
  void SetUp() override {
    PageTableBuilder b(ram_, PagingMode::Long4);
    const Frame pml4 = b.root();
    const Frame pdpt = b.new_table(), kpdpt = b.new_table(), pd = b.new_table(), pt = b.new_table(),
                kpd = b.new_table();
    ASSERT_EQ(kpd, Frame{0x105});
    b.set(pml4, 0x000, entry(pdpt, P | RW | US));
    b.set(pml4, 0x001, entry(pdpt, P | RW | US | PS));
    b.set(pml4, 0x1ff, entry(kpdpt, P | RW));
    b.set(pdpt, 0, entry(pd, P | RW | US));
    b.set(pdpt, 1, large(1 * GiB, P | RW | US));
    b.set(pdpt, 3, large(3 * GiB | (1 << 13), P | RW | US));
    b.set(pd, 0, entry(pt, P | RW | US));
    b.set(pd, 1, large(2 * MiB, P | US));
    b.set(pd, 3, large(6 * MiB | (1 << 20), P | RW));
    b.set(pt, 3, entry(Frame{0x300}, P | RW | US) | NX);
    b.set(pt, 5, (1ull << 45) | P);
    b.set(kpdpt, 0x1fe, entry(kpd, P | RW));
    b.set(kpd, 0, large(16 * MiB, P));
    ctx_ = {.mode = PagingMode::Long4, .cr3 = b.cr3()};
  }
};

TEST_F(Long4Test, FourKilobytePage) {
  auto t = walk_va(va4(0, 0, 0, 3, 0x123));
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 0x30'0123u);
  EXPECT_EQ(t->page_size, 4 * KiB);
  EXPECT_EQ(t->depth, 4u);
  const Frame expect[] = {Frame{0x100}, Frame{0x101}, Frame{0x103}, Frame{0x104}};
  for (unsigned i = 0; i < 4; ++i) EXPECT_EQ(t->table_frames[i], expect[i]) << i;
  EXPECT_TRUE(t->writable);
  EXPECT_TRUE(t->user);
  EXPECT_TRUE(t->nx);
}

TEST_F(Long4Test, TwoMegabytePage) {
  auto t = walk_va(va4(0, 0, 1, 0, 0) + 0x1'2345);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 2 * MiB + 0x1'2345);
  EXPECT_EQ(t->page_size, 2 * MiB);
  EXPECT_EQ(t->depth, 3u);
  EXPECT_FALSE(t->writable);
  EXPECT_TRUE(t->user);
}

TEST_F(Long4Test, OneGigabytePage) {
  auto t = walk_va(va4(0, 1, 0, 0, 0) + 0x1234'5678);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 1 * GiB + 0x1234'5678);
  EXPECT_EQ(t->page_size, 1 * GiB);
  EXPECT_EQ(t->depth, 2u);
}

TEST_F(Long4Test, KernelHalfAddress) {
  auto t = walk_va(0xFFFF'FFFF'8000'1234ull);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 16 * MiB + 0x1234);
  EXPECT_FALSE(t->writable);
  EXPECT_FALSE(t->user);
}

TEST_F(Long4Test, PcidBitsInCr3AreIgnored) {
  ctx_.cr3 |= 0x5;  // CR4.PCIDE: CR3[11:0] is the PCID
  auto t = walk_va(va4(0, 0, 0, 3));
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 0x30'0000u);
}

struct NotPresentCase {
  std::uint64_t va;
  const char* where;
};

class Long4NotPresent : public Long4Test, public ::testing::WithParamInterface<NotPresentCase> {};

TEST_P(Long4NotPresent, NamesLevelIndexEntryAndAddress) {
  const auto& c = GetParam();
  auto t = walk_va(c.va);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, Errc::Fault);
  EXPECT_TRUE(contains(t.error().what, c.where)) << t.error().what;
  EXPECT_TRUE(contains(t.error().what, "not present")) << t.error().what;
  EXPECT_TRUE(contains(t.error().what, "gva 0x")) << t.error().what;
}

INSTANTIATE_TEST_SUITE_P(EachLevel, Long4NotPresent,
                         ::testing::Values(NotPresentCase{va4(2, 0, 0, 0), "PML4E (level 4) index 0x2 (entry 0x0)"},
                                           NotPresentCase{va4(0, 2, 0, 0), "PDPTE (level 3) index 0x2 (entry 0x0)"},
                                           NotPresentCase{va4(0, 0, 2, 0), "PDE (level 2) index 0x2 (entry 0x0)"},
                                           NotPresentCase{va4(0, 0, 0, 4), "PTE (level 1) index 0x4 (entry 0x0)"}));

TEST_F(Long4Test, PsInPml4eIsReserved) {
  expect_error(va4(1, 0, 0, 0), Errc::Io, {"reserved bits 0x80", "PML4E (level 4) index 0x1"});
}

TEST_F(Long4Test, MisalignedLargePagesAreReserved) {
  expect_error(va4(0, 3, 0, 0), Errc::Io, {"reserved bits 0x2000", "PDPTE (level 3) index 0x3"});
  expect_error(va4(0, 0, 3, 0), Errc::Io, {"reserved bits 0x100000", "PDE (level 2) index 0x3"});
}

TEST_F(Long4Test, BitsAboveMaxPhysAddrAreReserved) {
  // PT[5] points at 2^45: fine with the default 52-bit MAXPHYADDR …
  auto t = walk_va(va4(0, 0, 0, 5));
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 1ull << 45);
  // … reserved on a 40-bit machine.
  ctx_.max_phys_bits = 40;
  expect_error(va4(0, 0, 0, 5), Errc::Io, {"reserved bits 0x200000000000", "PTE (level 1) index 0x5"});
}

TEST_F(Long4Test, Cr3AboveMaxPhysAddrIsInvalid) {
  ctx_.max_phys_bits = 40;
  ctx_.cr3 = 1ull << 44;
  expect_error(0, Errc::InvalidArgument, {"cr3", "MAXPHYADDR"});
}

TEST_F(Long4Test, XdWithoutNxeIsReserved) {
  ctx_.nxe = false;
  expect_error(va4(0, 0, 0, 3), Errc::Io, {"reserved bits 0x8000000000000000", "PTE (level 1)"});
}

TEST_F(Long4Test, NonCanonicalAddresses) {
  expect_error(0x0000'8000'0000'0000ull, Errc::InvalidArgument, {"non-canonical", "48-bit"});
  expect_error(0xFFFF'7FFF'FFFF'FFFFull, Errc::InvalidArgument, {"non-canonical"});
  expect_error(0x0001'0000'0000'0000ull, Errc::InvalidArgument, {"non-canonical"});
  EXPECT_EQ(ram_.map_calls(), 0u);  // rejected before reading anything
}

// ---------------------------------------------------------------------------------------------
// Long5 (LA57): one more level above Long4; 57-bit canonical addresses.
//
//   cr3 = 0x00100000
//     |
//     v  PML5 @ 0x100           PML4 @ 0x101        PDPT @ 0x103       PD @ 0x104      PT @ 0x105
//   +-------+--------------+  +---+-----------+  +---+-----------+  +---+---------+  +---+------------+
//   | 0x000 | -> PML4 0x101|  | 0 | -> 0x103  |  | 0 | -> 0x104  |  | 0 | -> 0x105|  | 1 | page 0x300 |
//   | 0x001 | -> PML4 0x102|  +---+-----------+  +---+-----------+  +---+---------+  +---+------------+
//   | 0x002 | PS: reserved |    PML4 @ 0x102       PDPT @ 0x106
//   | 0x003 | not present  |  +---+-----------+  +---+-------------------------+
//   +-------+--------------+  | 0 | -> 0x106  |  | 0 | 1 GiB @ 0x80000000      |
//                             +---+-----------+  +---+-------------------------+
class Long5Test : public WalkerTest {
 protected:
  void SetUp() override {
    PageTableBuilder b(ram_, PagingMode::Long5);
    const Frame pml5 = b.root();
    const Frame pml4a = b.new_table(), pml4b = b.new_table(), pdpt = b.new_table(), pd = b.new_table(),
                pt = b.new_table(), pdpt_b = b.new_table();
    ASSERT_EQ(pdpt_b, Frame{0x106});
    b.set(pml5, 0, entry(pml4a, P | RW | US));
    b.set(pml5, 1, entry(pml4b, P | RW | US));
    b.set(pml5, 2, entry(pml4b, P | RW | US | PS));
    b.set(pml4a, 0, entry(pdpt, P | RW | US));
    b.set(pdpt, 0, entry(pd, P | RW | US));
    b.set(pd, 0, entry(pt, P | RW | US));
    b.set(pt, 1, entry(Frame{0x300}, P | RW));
    b.set(pml4b, 0, entry(pdpt_b, P | RW));
    b.set(pdpt_b, 0, large(2 * GiB, P | RW));
    ctx_ = {.mode = PagingMode::Long5, .cr3 = b.cr3()};
  }
};

TEST_F(Long5Test, FourKilobytePageWalksFiveLevels) {
  auto t = walk_va(va5(0, 0, 0, 0, 1, 0x42));
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 0x30'0042u);
  EXPECT_EQ(t->depth, 5u);
  EXPECT_EQ(t->table_frames[0], Frame{0x100});
  EXPECT_EQ(t->table_frames[4], Frame{0x105});
}

TEST_F(Long5Test, OneGigabytePageAbove48Bits) {
  const std::uint64_t va = va5(1, 0, 0, 0, 0) + 0x1234;  // 0x0001000000001234
  auto t = walk_va(va);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, 2 * GiB + 0x1234);
  EXPECT_EQ(t->page_size, 1 * GiB);
  EXPECT_EQ(t->depth, 3u);
  // The same address is non-canonical with 4 levels.
  ctx_.mode = PagingMode::Long4;
  expect_error(va, Errc::InvalidArgument, {"non-canonical"});
}

TEST_F(Long5Test, NonCanonicalFor57Bits) {
  expect_error(0x0100'0000'0000'0000ull, Errc::InvalidArgument, {"non-canonical", "57-bit"});
}

TEST_F(Long5Test, NotPresentPml5e) {
  expect_error(va5(3, 0, 0, 0, 0), Errc::Fault, {"not present", "PML5E (level 5) index 0x3"});
}

TEST_F(Long5Test, PsInPml5eIsReserved) {
  expect_error(va5(2, 0, 0, 0, 0), Errc::Io, {"reserved bits 0x80", "PML5E (level 5) index 0x2"});
}

// ---------------------------------------------------------------------------------------------
// No paging: linear == physical, nothing is read.

TEST_F(WalkerTest, NoPagingIsIdentity) {
  ctx_ = {.mode = PagingMode::None};
  auto t = walk_va(0x1234'5678);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->address.value, 0x1234'5678u);
  EXPECT_EQ(t->depth, 0u);
  EXPECT_EQ(ram_.map_calls(), 0u);
  expect_error(1ull << 32, Errc::InvalidArgument, {"above 4 GiB"});
}

// ---------------------------------------------------------------------------------------------
// PV vs HVM: one walker. The same layout is built twice: once with GFNs (HVM: tables and data
// in guest-physical frames 0x100…) and once with MFNs (PV: the entries hold machine frames
// 0x7f000…, and cr3 is the machine address of the L4). In both cases the walker maps exactly
// cr3 >> 12 and then the frame numbers it found in the entries, nothing else.
//
//   HVM  cr3 0x100000 -> PML4 GFN 0x100 -> PDPT 0x101 -> PD 0x102 -> PT 0x103 -> data GFN 0x200
//   PV   cr3 0x7f000000 -> PML4 MFN 0x7f000 -> 0x7f001 -> 0x7f002 -> 0x7f003 -> data MFN 0x9a000

TEST(WalkerFrames, PvMfnsAndHvmGfnsWalkTheSameWay) {
  const std::uint64_t va = 0xFFFF'8880'0012'3456ull;  // a Linux direct-map address
  struct Guest {
    Frame first_table;
    Frame data;
  };
  for (const Guest g : {Guest{Frame{0x100}, Frame{0x200}}, Guest{Frame{0x7f000}, Frame{0x9a000}}}) {
    FakeFrameSource ram;
    PageTableBuilder b(ram, PagingMode::Long4, g.first_table);
    b.map(va & ~0xFFFull, gpa_of(g.data).value, 4 * KiB, P | RW);
    MapCache cache(ram, 16);
    auto t = walk({.mode = PagingMode::Long4, .cr3 = b.cr3()}, Gva{va}, cache);
    ASSERT_TRUE(t) << t.error().what;
    EXPECT_EQ(t->address.value, gpa_of(g.data).value + 0x456);
    ASSERT_EQ(ram.map_log().size(), 4u);
    EXPECT_EQ(ram.map_log()[0].first, Frame{b.cr3() >> 12}) << "top table comes from cr3 >> 12";
    for (unsigned i = 0; i < 4; ++i) {
      EXPECT_EQ(ram.map_log()[i].first, Frame{g.first_table.value + i});
      EXPECT_EQ(ram.map_log()[i].second, hv::MapAccess::Read);
      EXPECT_EQ(t->table_frames[i], ram.map_log()[i].first);
      if (i > 0) {  // each table frame is the frame number held by the previous level's entry
        EXPECT_EQ(t->table_frames[i].value, (t->entries[i - 1] & 0x000F'FFFF'FFFF'F000ull) >> 12);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Hostile tables: errors, never crashes or loops.

// A PML4 entry pointing back at the PML4 (the "recursive mapping" some kernels use on
// purpose): the walk reads exactly one entry per level and ends at the table itself.
//
//   PML4 @ 0x100: [0x1ed] -> 0x100 (itself)  P|RW
//   va = indices (0x1ed, 0x1ed, 0x1ed, 0x1ed) -> the PML4 frame as data
TEST(WalkerHostile, SelfReferenceTerminatesAfterOneReadPerLevel) {
  FakeFrameSource ram;
  PageTableBuilder b(ram, PagingMode::Long4);
  b.set(b.root(), 0x1ed, entry(b.root(), P | RW));
  MapCache cache(ram, 16);
  auto t = walk({.mode = PagingMode::Long4, .cr3 = b.cr3()}, Gva{va4(0x1ed, 0x1ed, 0x1ed, 0x1ed, 8)}, cache);
  ASSERT_TRUE(t) << t.error().what;
  EXPECT_EQ(t->address.value, b.cr3() + 8);
  EXPECT_EQ(t->depth, 4u);
  for (unsigned i = 0; i < 4; ++i) EXPECT_EQ(t->table_frames[i], b.root());
  EXPECT_EQ(ram.map_calls(), 1u);  // one frame, mapped once, read four times
}

TEST(WalkerHostile, SelfReferenceWithPsIsRejected) {
  FakeFrameSource ram;
  PageTableBuilder b(ram, PagingMode::Long4);
  b.set(b.root(), 0, entry(b.root(), P | RW | PS));
  MapCache cache(ram, 16);
  auto t = walk({.mode = PagingMode::Long4, .cr3 = b.cr3()}, Gva{0}, cache);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, Errc::Io);
  EXPECT_TRUE(contains(t.error().what, "reserved bits")) << t.error().what;
}

TEST(WalkerHostile, EntryPointingAtAbsentFrame) {
  FakeFrameSource ram;
  PageTableBuilder b(ram, PagingMode::Long4);
  b.set(b.root(), 0, entry(Frame{0xF'FFFF'FFFFull}, P | RW));  // largest 52-bit frame: no RAM there
  MapCache cache(ram, 16);
  auto t = walk({.mode = PagingMode::Long4, .cr3 = b.cr3()}, Gva{0}, cache);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, Errc::Fault);
  EXPECT_TRUE(contains(t.error().what, "cannot map the table holding PDPTE (level 3, frame 0xfffffffff)"))
      << t.error().what;
}

TEST(WalkerHostile, Cr3PointingAtAbsentFrame) {
  FakeFrameSource ram;
  MapCache cache(ram, 16);
  auto t = walk({.mode = PagingMode::Long4, .cr3 = 0x5000}, Gva{0}, cache);
  ASSERT_FALSE(t);
  EXPECT_TRUE(contains(t.error().what, "PML4E (level 4, frame 0x5)")) << t.error().what;
}

TEST(WalkerHostile, MappingFailureKeepsTheSourceErrorCode) {
  FakeFrameSource ram;
  PageTableBuilder b(ram, PagingMode::Long4);
  b.map(0x1000, 0x20'0000);
  MapCache cache(ram, 16);
  ram.fail_next_maps(1, Errc::NoMemory);
  auto t = walk({.mode = PagingMode::Long4, .cr3 = b.cr3()}, Gva{0x1000}, cache);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, Errc::NoMemory);
  EXPECT_TRUE(contains(t.error().what, "injected")) << t.error().what;
  EXPECT_TRUE(walk({.mode = PagingMode::Long4, .cr3 = b.cr3()}, Gva{0x1000}, cache));
}

// Random garbage tables in every mode: every walk ends with a translation or one of the
// documented errors. (Run under ASan/UBSan this also proves no out-of-frame reads.)
TEST(WalkerHostile, RandomTablesNeverCrash) {
  std::mt19937_64 rng(20240601);
  for (PagingMode mode : {PagingMode::Legacy32, PagingMode::Pae, PagingMode::Long4, PagingMode::Long5}) {
    FakeFrameSource ram;
    constexpr unsigned kFrames = 12;
    for (unsigned f = 0; f < kFrames; ++f) {
      auto& page = ram.add_frame(Frame{f});
      for (std::size_t i = 0; i < page.size(); i += 8) {
        // Mostly small frame numbers (so walks go deep) with plain P, or random flags, or
        // raw noise.
        const std::uint64_t flags = (rng() % 3 == 0) ? P : (rng() & 0x8000'0000'0000'01FFull);
        std::uint64_t e = (rng() % 4 == 0) ? rng() : ((rng() % (kFrames + 2)) << 12) | flags;
        std::memcpy(page.data() + i, &e, 8);
      }
    }
    MapCache cache(ram, 4);
    unsigned ok = 0, errors = 0;
    for (int i = 0; i < 20000; ++i) {
      PagingContext ctx{.mode = mode,
                        .cr3 = rng() & 0xFFFF,
                        .max_phys_bits = 32 + unsigned(rng() % 21),
                        .pse = bool(rng() & 1),
                        .nxe = bool(rng() & 1)};
      std::uint64_t va = rng();
      if (i % 2) {  // half the addresses in range for the mode, so walks get going
        if (mode == PagingMode::Long5) va = va5(0, 0, 0, 0, 0, va & 0x00FF'FFFF'FFFF'FFFFull);
        else if (mode == PagingMode::Long4) va = va4(0, 0, 0, 0, va & 0xFFFF'FFFF'FFFFull);
        else va &= 0xFFFF'FFFF;
      }
      auto t = walk(ctx, Gva{va}, cache);
      if (t) {
        ++ok;
        ASSERT_GE(t->depth, 1u);
        ASSERT_LE(t->depth, kMaxLevels);
        ASSERT_EQ(t->address.value & 0xFFF, va & 0xFFF);
      } else {
        ++errors;
        const Errc c = t.error().code;
        ASSERT_TRUE(c == Errc::Fault || c == Errc::Io || c == Errc::InvalidArgument) << t.error().what;
      }
    }
    EXPECT_GT(ok, 0u) << to_string(mode);
    EXPECT_GT(errors, 0u) << to_string(mode);
  }
}

}  // namespace
}  // namespace xenprobes::mem
