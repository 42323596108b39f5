// Minimal leveled logging to stderr; XENPROBES_LOG=debug|info|warn|error|off picks the level.
#pragma once

#include <cstdarg>

namespace xenprobes::log {

enum class Level { Debug = 0, Info, Warn, Error, Off };

Level level();
void set_level(Level l);
[[gnu::format(printf, 2, 3)]] void write(Level l, const char* fmt, ...);

}  // namespace xenprobes::log

#define XP_LOG(lvl, ...)                                                         \
  do {                                                                           \
    if (::xenprobes::log::Level::lvl >= ::xenprobes::log::level())               \
      ::xenprobes::log::write(::xenprobes::log::Level::lvl, __VA_ARGS__);        \
  } while (0)
