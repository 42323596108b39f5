// The bounded LRU map under the translation and mapping caches (mem/lru_map.hpp): against a
// reference model over random operations (with a hash that collides on purpose, so probe
// chains and their backward-shift deletion are exercised), and allocation-free once warm.
#include <gtest/gtest.h>

#include <list>
#include <map>
#include <random>
#include <string>

#include "alloc_counter.hpp"
#include "mem/lru_map.hpp"

namespace xenprobes::mem::detail {
namespace {

// Four buckets for every key: long probe chains.
struct Collide {
  std::size_t operator()(std::uint64_t k) const { return k % 4; }
};

// The model: most recently used first.
struct Model {
  std::size_t capacity;
  std::list<std::pair<std::uint64_t, std::string>> order;
  std::string* find(std::uint64_t k) {
    for (auto it = order.begin(); it != order.end(); ++it)
      if (it->first == k) {
        order.splice(order.begin(), order, it);
        return &order.front().second;
      }
    return nullptr;
  }
  bool put(std::uint64_t k, std::string v) {
    if (std::string* s = find(k)) {
      *s = std::move(v);
      return false;
    }
    bool evicted = order.size() >= capacity;
    if (evicted) order.pop_back();
    order.emplace_front(k, std::move(v));
    return evicted;
  }
  bool has(std::uint64_t k) const {
    for (const auto& e : order)
      if (e.first == k) return true;
    return false;
  }
  bool erase(std::uint64_t k) {
    for (auto it = order.begin(); it != order.end(); ++it)
      if (it->first == k) {
        order.erase(it);
        return true;
      }
    return false;
  }
};

template <typename Hash>
void against_the_model(unsigned seed) {
  std::mt19937_64 rng(seed);
  const std::size_t cap = 1 + rng() % 40;
  LruMap<std::uint64_t, std::string, Hash> m(cap);
  Model ref{cap, {}};
  for (int op = 0; op < 20000; ++op) {
    const std::uint64_t k = rng() % 64;
    switch (rng() % 8) {
      case 0:
      case 1:
      case 2: {
        const std::string v = std::to_string(rng());
        ASSERT_EQ(m.put(k, v), ref.put(k, v)) << "put " << k << " at op " << op;
        break;
      }
      case 3:
      case 4: {
        std::string* a = m.find(k);
        std::string* b = ref.find(k);
        ASSERT_EQ(a == nullptr, b == nullptr) << "find " << k << " at op " << op;
        if (a) { ASSERT_EQ(*a, *b); }
        break;
      }
      case 5: ASSERT_EQ(m.erase(k), ref.erase(k)) << "erase " << k; break;
      case 6:
        if (rng() % 50 == 0) {
          m.clear();
          ref.order.clear();
        } else {
          ASSERT_EQ(m.contains(k), ref.has(k));  // neither changes the order
        }
        break;
      case 7: {
        const std::uint64_t mod = 2 + rng() % 5;
        const std::size_t n = m.erase_if([&](const std::uint64_t& key, const std::string&) { return key % mod == 0; });
        std::size_t rn = 0;
        for (auto it = ref.order.begin(); it != ref.order.end();)
          if (it->first % mod == 0) {
            it = ref.order.erase(it);
            ++rn;
          } else {
            ++it;
          }
        ASSERT_EQ(n, rn);
        break;
      }
    }
    ASSERT_EQ(m.size(), ref.order.size());
  }
  // Same contents; the eviction order is checked by the puts' return values above.
  for (const auto& [k, v] : ref.order) ASSERT_TRUE(m.contains(k)) << k;
}

TEST(LruMap, AgreesWithAModelUnderRandomOperations) {
  for (unsigned seed = 1; seed <= 20; ++seed) against_the_model<std::hash<std::uint64_t>>(seed);
}

TEST(LruMap, AgreesWithAModelWhenEveryKeyCollides) {
  for (unsigned seed = 1; seed <= 20; ++seed) against_the_model<Collide>(seed);
}

TEST(LruMap, EvictsTheLeastRecentlyUsed) {
  LruMap<int, int> m(3);
  EXPECT_FALSE(m.put(1, 10));
  EXPECT_FALSE(m.put(2, 20));
  EXPECT_FALSE(m.put(3, 30));
  ASSERT_NE(m.find(1), nullptr);  // 1 is now the most recent: 2 goes first
  EXPECT_TRUE(m.put(4, 40));
  EXPECT_FALSE(m.contains(2));
  EXPECT_TRUE(m.contains(1));
  EXPECT_EQ(*m.find(4), 40);
}

// Once warm, put/find/erase/clear allocate nothing: the hit path clears the translation
// cache every hit and caches a translation or two again.
TEST(LruMap, AllocatesNothingOnceWarm) {
  LruMap<std::uint64_t, std::uint64_t> m(4096);
  for (std::uint64_t k = 0; k < 5000; ++k) m.put(k, k);  // grown to its capacity
  m.clear();
  const std::uint64_t before = g_allocs.load();
  for (std::uint64_t round = 0; round < 10000; ++round) {
    m.clear();
    m.put(round, 1);
    m.put(round + 7, 2);
    (void)m.find(round);
    m.erase(round + 7);
  }
  EXPECT_EQ(g_allocs.load() - before, 0u);
}

}  // namespace
}  // namespace xenprobes::mem::detail
