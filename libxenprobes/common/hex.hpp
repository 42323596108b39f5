// "0x1f": hex formatting for error and log messages (g++ 12 has no <format>).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

namespace xenprobes {

inline std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// "0f 1f 44 00 00": bytes for messages.
inline std::string hex_bytes(std::span<const std::uint8_t> b) {
  std::string s;
  char buf[4];
  for (std::uint8_t v : b) {
    std::snprintf(buf, sizeof buf, "%s%02x", s.empty() ? "" : " ", v);
    s += buf;
  }
  return s;
}

}  // namespace xenprobes
