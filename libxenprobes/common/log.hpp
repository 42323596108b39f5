// Minimal leveled logging to stderr; XENPROBES_LOG=debug|info|warn|error|off picks the level.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <mutex>

namespace xenprobes::log {

enum class Level { Debug = 0, Info, Warn, Error, Off };

Level level();
void set_level(Level l);
[[gnu::format(printf, 2, 3)]] void write(Level l, const char* fmt, ...);

// What a guest can make us log once per hit (a handler's odd return, an unreadable stack) must
// not flood Dom0's log: each such call site allows `burst` messages per `interval`, counts the
// ones it drops, and says how many with the next message it lets through (the way Linux's
// printk_ratelimited does for a kernel's own messages).
class RateLimit {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateLimit(unsigned burst = 10, Clock::duration interval = std::chrono::seconds(5))
      : burst_(burst), interval_(interval) {}
  // Whether a message may go out at `now`; when it may, `*dropped` receives how many were
  // suppressed since the last one that went out.
  bool allow(Clock::time_point now, std::uint64_t* dropped);
  std::uint64_t suppressed() const { return total_.load(std::memory_order_relaxed); }

 private:
  std::mutex mu_;
  const unsigned burst_;
  const Clock::duration interval_;
  Clock::time_point window_{};
  unsigned in_window_ = 0;
  std::uint64_t pending_ = 0;  // dropped, not reported yet
  std::atomic<std::uint64_t> total_{0};
};

// Every message any rate limit has suppressed in this process (for statistics).
std::uint64_t suppressed_total();
void count_suppressed();

}  // namespace xenprobes::log

#define XP_LOG(lvl, ...)                                                  \
  do {                                                                    \
    if (::xenprobes::log::Level::lvl >= ::xenprobes::log::level())        \
      ::xenprobes::log::write(::xenprobes::log::Level::lvl, __VA_ARGS__); \
  } while (0)

// XP_LOG for messages a guest can cause at will (once per hit): rate-limited per call site.
#define XP_LOG_RATELIMITED(lvl, fmt, ...)                                                                   \
  do {                                                                                                      \
    if (::xenprobes::log::Level::lvl >= ::xenprobes::log::level()) {                                        \
      static ::xenprobes::log::RateLimit xp_rl_;                                                            \
      std::uint64_t xp_dropped_ = 0;                                                                        \
      if (xp_rl_.allow(::xenprobes::log::RateLimit::Clock::now(), &xp_dropped_)) {                          \
        if (xp_dropped_)                                                                                    \
          ::xenprobes::log::write(::xenprobes::log::Level::lvl, fmt " (%llu similar messages suppressed)",  \
                                  __VA_ARGS__ __VA_OPT__(, ) static_cast<unsigned long long>(xp_dropped_)); \
        else ::xenprobes::log::write(::xenprobes::log::Level::lvl, fmt __VA_OPT__(, ) __VA_ARGS__);         \
      }                                                                                                     \
    }                                                                                                       \
  } while (0)
