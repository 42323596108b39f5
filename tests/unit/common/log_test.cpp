// The rate limit for messages a guest can cause once per hit.
#include <gtest/gtest.h>

#include "common/log.hpp"

namespace xenprobes::log {
namespace {

using namespace std::chrono_literals;

TEST(RateLimit, ABurstGoesOutThenTheRestIsCountedAndReported) {
  RateLimit rl(3, 5s);
  const auto t0 = RateLimit::Clock::time_point{} + 100s;
  const std::uint64_t before = suppressed_total();
  std::uint64_t dropped = 99;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(rl.allow(t0 + i * 1ms, &dropped)) << i;
    EXPECT_EQ(dropped, 0u);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(rl.allow(t0 + 4s, &dropped));
  EXPECT_EQ(rl.suppressed(), 1000u);
  EXPECT_EQ(suppressed_total() - before, 1000u);
  // The next window: the first message out says how many were dropped, the next ones do not.
  ASSERT_TRUE(rl.allow(t0 + 5s, &dropped));
  EXPECT_EQ(dropped, 1000u);
  ASSERT_TRUE(rl.allow(t0 + 5s, &dropped));
  EXPECT_EQ(dropped, 0u);
}

TEST(RateLimit, AClockThatGoesBackStartsANewWindow) {
  RateLimit rl(1, 5s);
  const auto t0 = RateLimit::Clock::time_point{} + 100s;
  std::uint64_t dropped = 0;
  ASSERT_TRUE(rl.allow(t0, &dropped));
  EXPECT_FALSE(rl.allow(t0 + 1s, &dropped));
  EXPECT_TRUE(rl.allow(t0 - 1s, &dropped));  // never stuck behind a window in the future
  EXPECT_EQ(dropped, 1u);
}

TEST(RateLimit, TheMacroLetsTenPerSiteThroughThenCountsTheRest) {
  const Level was = level();
  set_level(Level::Warn);
  const std::uint64_t before = suppressed_total();
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 20; ++i) {  // well inside one 5 s window
    XP_LOG_RATELIMITED(Warn, "no arguments");
    XP_LOG_RATELIMITED(Warn, "argument %d", i);
  }
  const std::string out = ::testing::internal::GetCapturedStderr();
  set_level(was);
  EXPECT_EQ(suppressed_total() - before, 20u);
  EXPECT_NE(out.find("xenprobes warn: argument 9\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("argument 10"), std::string::npos) << out;
  std::size_t lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 20u) << out;
}

}  // namespace
}  // namespace xenprobes::log
