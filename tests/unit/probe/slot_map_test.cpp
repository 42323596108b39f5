// SlotMap against std::map under random inserts, overwrites and erases (clusters that wrap
// around the table's end included: keys are chosen to collide).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "probe/slot_map.hpp"

namespace xenprobes::probe {
namespace {

TEST(SlotMap, BehavesLikeAMap) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    SlotMap<int> m;
    if (round % 2) m.reserve(40);
    std::map<std::uint64_t, int*> ref;
    std::vector<int> values(64);
    // Few distinct keys in a stack-like range: heavy collisions and re-use.
    auto key = [&] { return 0xffffc90000010000ull + 8 * (rng() % 48); };
    for (int step = 0; step < 5000; ++step) {
      std::uint64_t k = key();
      int* v = &values[rng() % values.size()];
      switch (rng() % 3) {
        case 0:
          m.insert(k, v);
          ref[k] = v;
          break;
        case 1:
          m.erase(k);
          ref.erase(k);
          break;
        default: break;
      }
      ASSERT_EQ(m.size(), ref.size());
      std::uint64_t probe = key();
      auto it = ref.find(probe);
      ASSERT_EQ(m.find(probe), it == ref.end() ? nullptr : it->second) << "round " << round << " step " << step;
    }
    std::size_t seen = 0;
    m.for_each([&](std::uint64_t k, int* v) {
      ++seen;
      EXPECT_EQ(ref.at(k), v);
    });
    EXPECT_EQ(seen, ref.size());
  }
}

TEST(SlotMap, EmptyAndZeroKey) {
  SlotMap<int> m;
  EXPECT_EQ(m.find(0x1000), nullptr);
  m.erase(0x1000);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.find(0), nullptr);
}

}  // namespace
}  // namespace xenprobes::probe
