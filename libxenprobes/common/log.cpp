#include "common/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace xenprobes::log {
namespace {

Level level_from_env() {
  const char* s = std::getenv("XENPROBES_LOG");
  if (!s) return Level::Warn;
  if (!std::strcmp(s, "debug")) return Level::Debug;
  if (!std::strcmp(s, "info")) return Level::Info;
  if (!std::strcmp(s, "error")) return Level::Error;
  if (!std::strcmp(s, "off")) return Level::Off;
  return Level::Warn;
}

std::atomic<Level>& current() {
  static std::atomic<Level> l{level_from_env()};
  return l;
}

std::atomic<std::uint64_t> g_suppressed{0};

}  // namespace

Level level() { return current().load(std::memory_order_relaxed); }
void set_level(Level l) { current().store(l, std::memory_order_relaxed); }

std::uint64_t suppressed_total() { return g_suppressed.load(std::memory_order_relaxed); }
void count_suppressed() { g_suppressed.fetch_add(1, std::memory_order_relaxed); }

bool RateLimit::allow(Clock::time_point now, std::uint64_t* dropped) {
  std::lock_guard lock(mu_);
  if (in_window_ == 0 || now - window_ >= interval_ || now < window_) {
    window_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++pending_;
    total_.fetch_add(1, std::memory_order_relaxed);
    count_suppressed();
    return false;
  }
  ++in_window_;
  *dropped = std::exchange(pending_, 0);
  return true;
}

void write(Level l, const char* fmt, ...) {
  static const char* names[] = {"debug", "info", "warn", "error", "off"};
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "xenprobes %s: %s\n", names[static_cast<int>(l)], buf);
}

}  // namespace xenprobes::log
