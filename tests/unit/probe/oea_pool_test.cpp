// OeaPool: slot states, exhaustion, quiescent reclaim, growth.
#include <gtest/gtest.h>

#include <array>
#include <set>

#include "probe/oea_pool.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::probe {
namespace {

constexpr std::uint64_t kBase = 0xffffffffa0000000ull;

OeaPool make(std::initializer_list<OeaArea> areas, OeaPoolOptions o = {}) {
  auto p = OeaPool::create(std::vector<OeaArea>(areas), o);
  EXPECT_TRUE(p.has_value()) << p.error().what;
  return std::move(*p);
}

TEST(OeaPool, SlotSizeRules) {
  const OeaArea a{Gva{kBase}, 4096};
  for (std::size_t bad : {0u, 8u, 16u, 24u, 40u, 8192u})
    EXPECT_EQ(OeaPool::create(std::span(&a, 1), {.slot_size = bad}).error().code, Errc::InvalidArgument) << bad;
  for (std::size_t good : {32u, 48u, 64u, 4096u})
    EXPECT_TRUE(OeaPool::create(std::span(&a, 1), {.slot_size = good}).has_value()) << good;
}

TEST(OeaPool, AllocatesAlignedDistinctSlotsUntilNoSpace) {
  auto pool = make({{Gva{kBase}, 4096}});
  ASSERT_EQ(pool.total(), 128u);
  EXPECT_EQ(pool.slot_size(), OeaPool::kDefaultSlotSize);
  std::set<std::uint64_t> seen;
  for (unsigned i = 0; i < 128; ++i) {
    auto s = pool.allocate();
    ASSERT_TRUE(s.has_value()) << s.error().what;
    EXPECT_EQ(s->value % 16, 0u);
    EXPECT_EQ(s->value, kBase + 32 * i);  // lowest address first
    EXPECT_TRUE(seen.insert(s->value).second);
    EXPECT_EQ(pool.state_of(*s), SlotState::Used);
  }
  EXPECT_EQ(pool.used(), 128u);
  EXPECT_EQ(pool.clean(), 0u);
  auto r = pool.allocate();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::NoSpace);
  EXPECT_EQ(r.error().what,
            "out-of-line execution area exhausted: 128 slots in use; load the guest module with a "
            "larger area (or let it grow)");
}

TEST(OeaPool, RunsAreAdjacentCleanSlotsInOneAreaAndReleasedOneByOne) {
  auto pool = make({{Gva{kBase}, 4096}, {Gva{kBase + 0x10000}, 4096}});
  // Area 0: slots 0 and 2 used, 1 dirty: the first run of 3 starts at slot 3.
  auto s0 = pool.allocate(), s1 = pool.allocate(), s2 = pool.allocate();
  ASSERT_TRUE(s0 && s1 && s2);
  ASSERT_TRUE(pool.release(*s1));
  auto run = pool.allocate_run(3);
  ASSERT_TRUE(run) << run.error().what;
  EXPECT_EQ(run->value, kBase + 3 * 32);
  for (unsigned k = 0; k < 3; ++k) EXPECT_EQ(pool.state_of(*run + 32 * k), SlotState::Used) << k;
  EXPECT_EQ(pool.used(), 5u);
  // Fill area 0 up to one free slot at its end: a run of 2 goes to area 1, never across.
  while (pool.clean() > 128 + 1) ASSERT_TRUE(pool.allocate());
  auto two = pool.allocate_run(2);
  ASSERT_TRUE(two) << two.error().what;
  EXPECT_EQ(two->value, kBase + 0x10000);
  // Each slot of a run is released on its own.
  ASSERT_TRUE(pool.release(*two + 32));
  EXPECT_EQ(pool.state_of(*two), SlotState::Used);
  EXPECT_EQ(pool.state_of(*two + 32), SlotState::Dirty);
  EXPECT_EQ(pool.allocate_run(0).error().code, Errc::InvalidArgument);
  EXPECT_EQ(pool.allocate_run(129).error().code, Errc::InvalidArgument);
  EXPECT_EQ(pool.allocate_run(1)->value, kBase + 127 * 32) << "a run of one is allocate()";
}

TEST(OeaPool, ARunNeedsThatManyAdjacentSlots) {
  auto pool = make({{Gva{kBase}, 4096}});
  std::vector<Gva> all;
  for (unsigned i = 0; i < 128; ++i) all.push_back(*pool.allocate());
  for (unsigned i = 0; i < 128; i += 2) ASSERT_TRUE(pool.release(all[i]));
  std::array<std::uint64_t, 1> none{};
  pool.reclaim(std::span(none.data(), 0));
  EXPECT_EQ(pool.clean(), 64u);
  auto r = pool.allocate_run(2);  // 64 clean slots, none adjacent
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::NoSpace);
}

TEST(OeaPool, SlotCountNotAMultipleOf64AndUnusedTail) {
  // 4096 / 48 = 85 slots, 16 bytes of tail.
  auto pool = make({{Gva{kBase}, 4096}}, {.slot_size = 48});
  EXPECT_EQ(pool.total(), 85u);
  for (unsigned i = 0; i < 85; ++i) ASSERT_TRUE(pool.allocate().has_value()) << i;
  EXPECT_EQ(pool.allocate().error().code, Errc::NoSpace);
  const Gva tail{kBase + 85 * 48};
  EXPECT_TRUE(pool.contains(tail));
  EXPECT_FALSE(pool.slot_of(tail).has_value());
  EXPECT_FALSE(pool.state_of(tail).has_value());
  EXPECT_EQ(pool.slot_of(Gva{kBase + 84 * 48 + 47}), Gva{kBase + 84 * 48});
}

TEST(OeaPool, ReleaseMakesDirtyAndDirtyIsNotReused) {
  auto pool = make({{Gva{kBase}, 4096}});
  std::vector<Gva> s;
  for (unsigned i = 0; i < 128; ++i) s.push_back(*pool.allocate());
  ASSERT_TRUE(pool.release(s[5]).has_value());
  EXPECT_EQ(pool.state_of(s[5]), SlotState::Dirty);
  EXPECT_EQ(pool.used(), 127u);
  EXPECT_EQ(pool.dirty(), 1u);
  EXPECT_EQ(pool.clean(), 0u);
  auto r = pool.allocate();
  ASSERT_FALSE(r.has_value());  // a dirty slot is never handed out
  EXPECT_NE(r.error().what.find("exhausted: 128 slots in use"), std::string::npos) << r.error().what;

  EXPECT_EQ(pool.release(s[5]).error().code, Errc::InvalidArgument);               // twice
  EXPECT_EQ(pool.release(s[6] + 8).error().code, Errc::InvalidArgument);           // not a slot start
  EXPECT_EQ(pool.release(Gva{kBase + 4096}).error().code, Errc::InvalidArgument);  // outside
}

TEST(OeaPool, ReclaimOnlyWhenNoRipInsideTheSlot) {
  auto pool = make({{Gva{kBase}, 4096}});
  std::vector<Gva> s;
  for (unsigned i = 0; i < 128; ++i) s.push_back(*pool.allocate());
  ASSERT_TRUE(pool.release(s[7]).has_value());
  const std::uint64_t start = s[7].value;

  // A vCPU at the first or the last byte of the slot keeps it dirty.
  for (std::uint64_t rip : {start, start + 5, start + 31}) {
    std::array<std::uint64_t, 3> rips{0xffffffff81000000ull, rip, start + 32};
    EXPECT_EQ(pool.reclaim(rips), 0u) << std::hex << rip;
    EXPECT_EQ(pool.state_of(s[7]), SlotState::Dirty);
  }
  // RIPs just outside (previous and next slot) do not.
  std::array<std::uint64_t, 2> outside{start - 1, start + 32};
  EXPECT_EQ(pool.reclaim(outside), 1u);
  EXPECT_EQ(pool.state_of(s[7]), SlotState::Clean);
  EXPECT_EQ(pool.dirty(), 0u);
  EXPECT_EQ(pool.clean(), 1u);
  EXPECT_EQ(pool.reclaim({}), 0u);
  EXPECT_EQ(*pool.allocate(), s[7]);

  // Several dirty slots at once, one of them busy.
  for (unsigned i : {1u, 64u, 127u}) ASSERT_TRUE(pool.release(s[i]).has_value());
  std::array<std::uint64_t, 1> busy{s[64].value + 16};
  EXPECT_EQ(pool.reclaim(busy), 2u);
  EXPECT_EQ(pool.state_of(s[1]), SlotState::Clean);
  EXPECT_EQ(pool.state_of(s[64]), SlotState::Dirty);
  EXPECT_EQ(pool.state_of(s[127]), SlotState::Clean);
}

TEST(OeaPool, ContainsAndSlotOf) {
  auto pool = make({{Gva{kBase}, 8192}, {Gva{kBase + 0x100000}, 4096}});
  EXPECT_TRUE(pool.contains(Gva{kBase}));
  EXPECT_TRUE(pool.contains(Gva{kBase + 8191}));
  EXPECT_FALSE(pool.contains(Gva{kBase + 8192}));
  EXPECT_FALSE(pool.contains(Gva{kBase - 1}));
  EXPECT_TRUE(pool.contains(Gva{kBase + 0x100fff}));
  EXPECT_EQ(pool.slot_of(Gva{kBase + 33}), Gva{kBase + 32});
  EXPECT_EQ(pool.slot_of(Gva{kBase + 0x100000 + 95}), Gva{kBase + 0x100000 + 64});
  EXPECT_FALSE(pool.slot_of(Gva{kBase + 8192}).has_value());
  EXPECT_FALSE(pool.slot_of(Gva{0}).has_value());
  EXPECT_FALSE(pool.state_of(Gva{kBase + 1}).has_value());
  EXPECT_EQ(pool.state_of(Gva{kBase}), SlotState::Clean);
}

TEST(OeaPool, AddAreaRules) {
  auto pool = make({{Gva{kBase}, 8192}});
  EXPECT_EQ(pool.add_area({Gva{kBase + 4096}, 8192}).error().code, Errc::InvalidArgument);  // overlap
  EXPECT_EQ(pool.add_area({Gva{kBase - 4096}, 8192}).error().code, Errc::InvalidArgument);  // overlap
  EXPECT_EQ(pool.add_area({Gva{kBase + 0x10000 + 8}, 4096}).error().code, Errc::InvalidArgument);
  EXPECT_EQ(pool.add_area({Gva{kBase + 0x10000}, 0}).error().code, Errc::InvalidArgument);
  EXPECT_EQ(pool.add_area({Gva{kBase + 0x10000}, 100}).error().code, Errc::InvalidArgument);
  EXPECT_EQ(pool.add_area({Gva{0xfffffffffffff000ull}, 8192}).error().code, Errc::InvalidArgument);
  EXPECT_TRUE(pool.add_area({Gva{0xfffffffffffff000ull}, 4096}).has_value());  // ends at the top
  EXPECT_TRUE(pool.contains(Gva{~0ull}));
  EXPECT_EQ(pool.areas().size(), 2u);
  for (unsigned i = 2; i < XENPROBES_OEA_MAX_AREAS; ++i)
    ASSERT_TRUE(pool.add_area({Gva{kBase + 0x100000ull * i}, 4096}).has_value()) << i;
  EXPECT_EQ(pool.add_area({Gva{kBase + 0x10000000ull}, 4096}).error().code, Errc::InvalidArgument);
  EXPECT_EQ(OeaPool::create(std::vector<OeaArea>{{Gva{kBase}, 4096}, {Gva{kBase}, 4096}}).error().code,
            Errc::InvalidArgument);
}

TEST(OeaPool, GrowthContinuesAfterExhaustion) {
  auto pool = make({{Gva{kBase}, 4096}});
  for (unsigned i = 0; i < 128; ++i) ASSERT_TRUE(pool.allocate().has_value());
  ASSERT_EQ(pool.allocate().error().code, Errc::NoSpace);
  ASSERT_TRUE(pool.add_area({Gva{kBase + 0x200000}, 4096}).has_value());
  EXPECT_EQ(pool.total(), 256u);
  EXPECT_EQ(*pool.allocate(), Gva{kBase + 0x200000});
}

TEST(OeaPool, LowWaterMark) {
  auto pool = make({{Gva{kBase}, 4096}});  // 128 slots, default low water 128 / 8 = 16
  EXPECT_EQ(pool.low_water(), 16u);
  std::vector<Gva> s;
  for (unsigned i = 0; i < 112; ++i) s.push_back(*pool.allocate());
  EXPECT_EQ(pool.clean(), 16u);
  EXPECT_FALSE(pool.wants_growth());
  s.push_back(*pool.allocate());
  EXPECT_TRUE(pool.wants_growth());
  // Dirty slots are not clean: releasing does not help until reclaim.
  ASSERT_TRUE(pool.release(s.back()).has_value());
  EXPECT_TRUE(pool.wants_growth());
  EXPECT_EQ(pool.reclaim({}), 1u);
  EXPECT_FALSE(pool.wants_growth());
  s.push_back(*pool.allocate());
  ASSERT_TRUE(pool.add_area({Gva{kBase + 0x100000}, 4096}).has_value());
  EXPECT_EQ(pool.low_water(), 32u);   // recomputed
  EXPECT_FALSE(pool.wants_growth());  // 143 clean

  auto fixed = make({{Gva{kBase}, 4096}}, {.low_water = 100});
  EXPECT_FALSE(fixed.wants_growth());
  for (unsigned i = 0; i < 29; ++i) ASSERT_TRUE(fixed.allocate().has_value());
  EXPECT_TRUE(fixed.wants_growth());  // 99 clean < 100

  // At the area limit, growth is pointless.
  auto full = make({{Gva{kBase}, 4096}});
  for (unsigned i = 1; i < XENPROBES_OEA_MAX_AREAS; ++i)
    ASSERT_TRUE(full.add_area({Gva{kBase + 0x100000ull * i}, 4096}).has_value());
  while (full.allocate().has_value()) {}
  EXPECT_EQ(full.clean(), 0u);
  EXPECT_FALSE(full.wants_growth());
}

}  // namespace
}  // namespace xenprobes::probe
