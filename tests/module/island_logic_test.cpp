// The guest module's pure decisions for short jumps to islands (guest-module/xp_logic.c,
// protocol.h "Short jumps to islands"): when a short region's bytes (the int3, `eb rel8` to its
// island) are Dom0's, when the module writes such a region back, and when an island's 5 bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <set>
#include <vector>

#include "module/module_logic_fixture.hpp"
#include "xp_logic.h"

namespace {

using namespace module_logic;

std::set<std::uint64_t> nx_pages;

bool is_exec(void*, std::uint64_t addr) { return !nx_pages.count(addr & ~0xfffull); }

xenprobes_trap entry(std::uint64_t addr, std::uint32_t flags, std::uint64_t fallback,
                     std::initializer_list<std::uint8_t> insn) {
  xenprobes_trap t{};
  t.addr = addr;
  t.flags = flags;
  t.fallback = fallback;
  t.len = static_cast<std::uint8_t>(insn.size());
  std::copy(insn.begin(), insn.end(), t.insn);
  return t;
}

std::vector<std::uint8_t> jmp32(std::uint64_t at, std::uint64_t to) {
  const auto rel = static_cast<std::uint32_t>(to - (at + 5));
  return {0xe9, static_cast<std::uint8_t>(rel), static_cast<std::uint8_t>(rel >> 8),
          static_cast<std::uint8_t>(rel >> 16), static_cast<std::uint8_t>(rel >> 24)};
}

// A 3-byte region (xor eax,eax; ret: 31 c0 c3) at kStart, its island 0x20 bytes further in the
// function's padding (int3s), both going to the detour.
struct Short {
  static constexpr std::uint64_t kStart = kText + 0x500;
  static constexpr std::uint64_t kIsland = kStart + 0x20;
  static constexpr std::uint64_t kDetour = kOea + 0x800;
  xenprobes_trap region = entry(kStart, XENPROBES_TRAP_REDIRECT, kDetour, {0x31, 0xc0, 0xc3});
  xenprobes_trap island = entry(kIsland, XENPROBES_TRAP_ISLAND, kDetour, {0xcc, 0xcc, 0x90, 0xcc, 0xcc});
  // eb <rel8 -> island>, the region's last byte kept
  std::vector<std::uint8_t> eb{0xeb, static_cast<std::uint8_t>(kIsland - (kStart + 2)), 0xc3};
};

class Island : public ::testing::Test {
 protected:
  void SetUp() override { nx_pages.clear(); }
  xp_bounds b{.ktext = {kText, kTextEnd},
              .modules = {kModules, kModulesEnd},
              .oea = {kOea, kOeaEnd},
              .is_exec = &is_exec,
              .ctx = nullptr};
};

TEST_F(Island, PairsOnlyAnIslandEntryOfTheSameDetour) {
  Short s;
  EXPECT_TRUE(xp_island_pairs(&s.region, &s.island));
  EXPECT_FALSE(xp_island_pairs(&s.region, nullptr));
  auto other = s.island;
  other.fallback += 0x20;  // another probe's island
  EXPECT_FALSE(xp_island_pairs(&s.region, &other));
  for (std::uint32_t f : {XENPROBES_TRAP_REDIRECT, XENPROBES_TRAP_JUMP, XENPROBES_TRAP_FALLBACK,
                          XENPROBES_TRAP_ISLAND | XENPROBES_TRAP_FALLBACK}) {
    auto e = s.island;
    e.flags = f;
    EXPECT_FALSE(xp_island_pairs(&s.region, &e)) << f;
  }
  auto four = s.island;
  four.len = 4;
  EXPECT_FALSE(xp_island_pairs(&s.region, &four));
}

TEST_F(Island, ShortJumpTargetBothWays) {
  std::uint64_t to = 0;
  const std::uint8_t fwd[] = {0xeb, 0x7f}, back[] = {0xeb, 0x80}, other[] = {0xe9, 0x00};
  ASSERT_TRUE(xp_short_jump_target(kText + 0x100, fwd, 2, &to));
  EXPECT_EQ(to, kText + 0x100 + 2 + 127);
  ASSERT_TRUE(xp_short_jump_target(kText + 0x100, back, 2, &to));
  EXPECT_EQ(to, kText + 0x100 + 2 - 128);
  EXPECT_FALSE(xp_short_jump_target(kText + 0x100, other, 2, &to));
  EXPECT_FALSE(xp_short_jump_target(kText + 0x100, fwd, 1, &to));
}

TEST_F(Island, ShortRegionIsOursOnlyWithItsIsland) {
  Short s;
  EXPECT_TRUE(xp_region_bytes_ours_island(&s.region, s.eb.data(), 3, &s.island));
  std::vector<std::uint8_t> int3{0xcc, 0xc0, 0xc3};
  EXPECT_TRUE(xp_region_bytes_ours_island(&s.region, int3.data(), 3, &s.island));
  // Without its island a 3-byte region is nobody's (an older module's rule: 5..15 bytes).
  EXPECT_FALSE(xp_region_bytes_ours_island(&s.region, s.eb.data(), 3, nullptr));
  EXPECT_FALSE(xp_region_bytes_ours(&s.region, int3.data(), 3));
  EXPECT_FALSE(xp_region_restore_ok(&b, &s.region, s.eb.data(), 3));
  // An eb elsewhere (one byte off, or to another island) is not ours.
  auto off = s.eb;
  off[1] += 1;
  EXPECT_FALSE(xp_region_bytes_ours_island(&s.region, off.data(), 3, &s.island));
  auto other = s.island;
  other.fallback += 0x20;
  EXPECT_FALSE(xp_region_bytes_ours_island(&s.region, s.eb.data(), 3, &other));
  // The original bytes: restored already.
  std::vector<std::uint8_t> orig{0x31, 0xc0, 0xc3};
  EXPECT_FALSE(xp_region_bytes_ours_island(&s.region, orig.data(), 3, &s.island));
  // An e9 needs 5 bytes of region, island or not.
  auto j = jmp32(Short::kStart, Short::kDetour);
  EXPECT_FALSE(xp_region_bytes_ours_island(&s.region, j.data(), 5, &s.island));
  // A 1-byte region: never (eb takes 2).
  auto one = s.region;
  one.len = 1;
  EXPECT_FALSE(xp_region_bytes_ours_island(&one, int3.data(), 3, &s.island));
}

TEST_F(Island, ShortRegionRestoreAsARegion) {
  Short s;
  EXPECT_TRUE(xp_region_restore_ok_island(&b, &s.region, s.eb.data(), 3, &s.island));
  auto oea = s.region;
  oea.addr = kOea + 0x10;
  EXPECT_FALSE(xp_region_restore_ok_island(&b, &oea, s.eb.data(), 3, &s.island));
  nx_pages.insert(Short::kStart & ~0xfffull);
  EXPECT_FALSE(xp_region_restore_ok_island(&b, &s.region, s.eb.data(), 3, &s.island));
  nx_pages.clear();
  auto int3_first = s.region;
  int3_first.insn[0] = 0xcc;
  EXPECT_FALSE(xp_region_restore_ok_island(&b, &int3_first, s.eb.data(), 3, &s.island));
  // A 5-byte region keeps the old rules with an island too: e9 to its detour.
  auto five = entry(Short::kStart, XENPROBES_TRAP_REDIRECT, Short::kDetour, {0x55, 0x48, 0x89, 0xe5, 0x90});
  auto j = jmp32(Short::kStart, Short::kDetour);
  EXPECT_TRUE(xp_region_restore_ok_island(&b, &five, j.data(), 5, nullptr));
  EXPECT_TRUE(xp_region_restore_ok_island(&b, &five, j.data(), 5, &s.island));
}

TEST_F(Island, IslandRestoreOnlyOverOurJumpToItsDetour) {
  Short s;
  auto j = jmp32(Short::kIsland, Short::kDetour);
  EXPECT_TRUE(xp_island_bytes_ours(&s.island, j.data(), 5));
  EXPECT_TRUE(xp_island_restore_ok(&b, &s.island, j.data(), 5));
  EXPECT_FALSE(xp_island_restore_ok(&b, &s.island, j.data(), 4));  // fewer bytes read
  auto elsewhere = jmp32(Short::kIsland, Short::kDetour + 0x40);
  EXPECT_FALSE(xp_island_restore_ok(&b, &s.island, elsewhere.data(), 5));
  std::vector<std::uint8_t> padding{0xcc, 0xcc, 0x90, 0xcc, 0xcc};
  EXPECT_FALSE(xp_island_restore_ok(&b, &s.island, padding.data(), 5));  // given back already
  // Only ISLAND entries of 5 bytes.
  for (std::uint32_t f :
       {XENPROBES_TRAP_REDIRECT, XENPROBES_TRAP_FALLBACK, XENPROBES_TRAP_ISLAND | XENPROBES_TRAP_JUMP}) {
    auto e = s.island;
    e.flags = f;
    EXPECT_FALSE(xp_island_restore_ok(&b, &e, j.data(), 5)) << f;
  }
  for (std::uint8_t len : {0, 4, 6, 15}) {
    auto e = s.island;
    e.len = len;
    EXPECT_FALSE(xp_island_restore_ok(&b, &e, j.data(), 5)) << int(len);
  }
  // Multi-byte nops are padding too: the original bytes are not the module's to judge.
  auto nops = s.island;
  const std::uint8_t nopw[] = {0x66, 0x2e, 0x0f, 0x1f, 0x84};
  std::copy(std::begin(nopw), std::end(nopw), nops.insn);
  EXPECT_TRUE(xp_island_restore_ok(&b, &nops, j.data(), 5));
}

TEST_F(Island, IslandRestoreOnlyInTextOutsideTheOeaAndExecutable) {
  Short s;
  auto at = [&](std::uint64_t a) {
    auto e = s.island;
    e.addr = a;
    return e;
  };
  for (std::uint64_t a : std::initializer_list<std::uint64_t>{kText + 0x10, kModules + 0x10}) {
    auto e = at(a);
    EXPECT_TRUE(xp_island_restore_ok(&b, &e, jmp32(a, e.fallback).data(), 5)) << std::hex << a;
  }
  for (std::uint64_t a :
       std::initializer_list<std::uint64_t>{kOea + 0x10, kStack, 0x1000ull, kTextEnd - 3, kOea - 3, ~0ull - 2}) {
    auto e = at(a);
    EXPECT_FALSE(xp_island_restore_ok(&b, &e, jmp32(a, e.fallback).data(), 5)) << std::hex << a;
  }
  auto cross = at(kText + 0x1ffd);
  EXPECT_TRUE(xp_island_restore_ok(&b, &cross, jmp32(cross.addr, cross.fallback).data(), 5));
  nx_pages.insert(kText + 0x2000);
  EXPECT_FALSE(xp_island_restore_ok(&b, &cross, jmp32(cross.addr, cross.fallback).data(), 5));
}

TEST_F(Island, TheOldRulesLeaveIslandsAlone) {
  Short s;
  // The one-byte restore never takes an island (an older rule would write insn[0] over it).
  EXPECT_FALSE(xp_restore_ok(&b, &s.island, 0xcc));
  auto nop = s.island;
  nop.insn[0] = 0x90;
  EXPECT_FALSE(xp_restore_ok(&b, &nop, 0xcc));
  // An int3 at an island's address is not one of ours.
  EXPECT_EQ(xp_int3_action(&s.island), XP_INT3_FOREIGN);
}

}  // namespace
