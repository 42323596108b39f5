// "0x1f": hex formatting for error and log messages (g++ 12 has no <format>).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace xenprobes {

inline std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace xenprobes
