// Internal to kernel/modules*.cpp: what struct module's layout from BTF (modules_layout.cpp)
// and the walk (modules.cpp) share. Not installed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernel/modules.hpp"

namespace xenprobes::kernel {

inline constexpr std::uint32_t kMaxStructBytes = 64u << 10;  // struct module is ~1.2 KiB

// Why the walk cannot decode with `l`, or nullopt: every field inside the struct (the walk
// reads struct_size bytes and decodes from them) and of a width load_field() reads.
std::optional<std::string> layout_error(const ModuleLayout& l);

}  // namespace xenprobes::kernel
