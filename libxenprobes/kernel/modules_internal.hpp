// Internal to kernel/modules*.cpp and kernel/module_*.cpp: what struct module's layout from BTF
// (modules_layout.cpp), the walk (modules.cpp) and the readers of what modules bring
// (module_symbols.cpp, module_btf.cpp) share. Not installed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/hex.hpp"
#include "kernel/modules.hpp"

namespace xenprobes::kernel {

inline constexpr std::uint32_t kMaxStructBytes = 64u << 10;  // struct module is ~1.2 KiB

// Why the walk cannot decode with `l`, or nullopt: every field inside the struct (the walk
// reads struct_size bytes and decodes from them) and of a width load_field() reads.
std::optional<std::string> layout_error(const ModuleLayout& l);

// `bytes` at `addr`, chunk by chunk; Fault naming `what` when a chunk cannot be read.
inline Result<std::vector<std::byte>> read_all(const ReadFn& read, std::uint64_t addr, std::uint64_t bytes,
                                               std::size_t chunk, const char* what) {
  std::vector<std::byte> out(bytes);
  for (std::uint64_t off = 0; off < bytes; off += chunk) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk, bytes - off);
    if (auto r = read(Gva{addr + off}, std::span(out.data() + off, n)); !r)
      return fail(Errc::Fault,
                  std::string("cannot read its ") + what + " at " + hex(addr + off) + ": " + r.error().what);
  }
  return out;
}

// [a, a + bytes) lies in the kernel's half and does not wrap.
inline bool in_kernel_half(std::uint64_t a, std::uint64_t bytes) {
  return a >= symbols::kKernelHalfStart && a + bytes >= a;
}

}  // namespace xenprobes::kernel
