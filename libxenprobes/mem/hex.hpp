// Internal: hex formatting for error messages (g++ 12 has no <format>).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace xenprobes::mem::detail {

inline std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace xenprobes::mem::detail
