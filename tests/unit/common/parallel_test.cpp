// common/parallel.hpp: ranges of about equal weight, in order and covering the list once; the
// work of every part done, on other threads, and the first failure rethrown after all ended.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/parallel.hpp"

namespace xenprobes {
namespace {

// The ranges are contiguous, in order, cover [0, n) once, and there are min(parts, n) of them
// (one when n is 0).
void expect_cover(const std::vector<std::pair<std::size_t, std::size_t>>& r, std::size_t n, std::size_t parts) {
  ASSERT_EQ(r.size(), std::clamp<std::size_t>(parts, 1, std::max<std::size_t>(1, n)));
  std::size_t at = 0;
  for (const auto& [lo, hi] : r) {
    EXPECT_EQ(lo, at);
    EXPECT_LE(lo, hi);
    at = hi;
  }
  EXPECT_EQ(at, n);
}

TEST(Parallel, SplitByWeightCoversTheListInOrder) {
  for (std::size_t n : {0u, 1u, 3u, 10u, 1000u})
    for (std::size_t parts : {0u, 1u, 2u, 4u, 16u}) {
      SCOPED_TRACE(std::to_string(n) + " items, " + std::to_string(parts) + " parts");
      expect_cover(split_by_weight(n, parts, [](std::size_t) { return std::uint64_t{1}; }), n, parts);
      expect_cover(split_by_weight(n, parts, [](std::size_t i) { return std::uint64_t{i % 7 == 0 ? 100u : 0u}; }), n,
                   parts);
    }
}

TEST(Parallel, SplitByWeightBalancesTheWeight) {
  // 1000 items of weight 1 in 4 parts: 250 each.
  const auto even = split_by_weight(1000, 4, [](std::size_t) { return std::uint64_t{1}; });
  for (const auto& [lo, hi] : even) EXPECT_EQ(hi - lo, 250u);
  // One heavy item first: it fills the first part alone.
  const auto heavy = split_by_weight(9, 2, [](std::size_t i) { return std::uint64_t{i == 0 ? 8u : 1u}; });
  EXPECT_EQ(heavy[0], std::make_pair(std::size_t{0}, std::size_t{1}));
  EXPECT_EQ(heavy[1], std::make_pair(std::size_t{1}, std::size_t{9}));
}

TEST(Parallel, RunPartsRunsEveryPartOnceAndPartZeroHere) {
  std::vector<int> ran(5, 0);
  std::vector<std::thread::id> on(5);
  run_parts(5, [&](std::size_t p) {
    ++ran[p];
    on[p] = std::this_thread::get_id();
  });
  EXPECT_EQ(ran, std::vector<int>(5, 1));
  EXPECT_EQ(on[0], std::this_thread::get_id());
  for (std::size_t p = 1; p < 5; ++p) EXPECT_NE(on[p], std::this_thread::get_id());
  run_parts(0, [&](std::size_t) { ADD_FAILURE() << "no part to run"; });
}

TEST(Parallel, RunPartsRethrowsTheFirstFailureAfterEveryPartEnded) {
  std::atomic<int> ended = 0;
  try {
    run_parts(4, [&](std::size_t p) {
      if (p == 3) throw std::runtime_error("part 3");
      if (p == 2) throw std::length_error("part 2");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ++ended;
    });
    ADD_FAILURE() << "nothing thrown";
  } catch (const std::length_error& e) { EXPECT_STREQ(e.what(), "part 2"); }
  EXPECT_EQ(ended.load(), 2);
}

TEST(Parallel, WorkerThreads) {
  EXPECT_EQ(worker_threads(0, 512), 1u);
  EXPECT_EQ(worker_threads(1023, 512), 1u);
  EXPECT_LE(worker_threads(1024, 512), 2u);
  EXPECT_LE(worker_threads(1u << 20, 512), kMaxWorkerThreads);
  EXPECT_LE(worker_threads(1u << 20, 512, 1), 1u);
  EXPECT_EQ(worker_threads(1u << 20, 512),
            std::min(kMaxWorkerThreads, std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_EQ(worker_threads(100, 0),
            std::min({100u, kMaxWorkerThreads, std::max(1u, std::thread::hardware_concurrency())}));
}

}  // namespace
}  // namespace xenprobes
