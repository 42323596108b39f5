// Integers read out of bytes a guest or a file gave us: memcpy, never a cast (the bytes may be
// unaligned and are not objects of that type). Little-endian, as x86-64 and every guest read.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>

namespace xenprobes {

template <typename T>
requires std::is_trivially_copyable_v<T> T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace xenprobes
