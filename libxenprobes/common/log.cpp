#include "common/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

}  // namespace

Level level() { return current().load(std::memory_order_relaxed); }
void set_level(Level l) { current().store(l, std::memory_order_relaxed); }

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
