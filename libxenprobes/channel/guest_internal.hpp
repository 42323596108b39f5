// Internal to the guest channel's files (channel/guest*.cpp): the accesses to the shared
// control area and the small helpers they share. Not installed.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "channel/guest.hpp"

namespace xenprobes::channel {

// Every shared field is naturally aligned (attach checks the offsets), so each is read or
// written with one atomic access: the guest may change it at any time, and a field read
// twice could give two different values.
template <typename T>
T load(const std::byte* p, std::memory_order o = std::memory_order_relaxed) {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(const_cast<std::byte*>(p))).load(o);
}
template <typename T>
void store(std::byte* p, T v, std::memory_order o = std::memory_order_relaxed) {
  std::atomic_ref<T>(*reinterpret_cast<T*>(p)).store(v, o);
}

inline std::string dom_str(DomId d) { return "domain " + std::to_string(d.value); }

// A mailbox's state, the field both sides compare-and-swap.
inline std::atomic_ref<std::uint32_t> state_of(std::byte* mb) {
  return std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(mb + offsetof(xenprobes_mailbox, state)));
}

inline std::vector<xenprobes_trap>::iterator lower_bound(std::vector<xenprobes_trap>& t, std::uint64_t addr) {
  return std::lower_bound(t.begin(), t.end(), addr,
                          [](const xenprobes_trap& x, std::uint64_t v) { return x.addr < v; });
}

inline std::vector<xenprobes_trap>::iterator find_trap(std::vector<xenprobes_trap>& t, std::uint64_t addr) {
  auto pos = lower_bound(t, addr);
  return pos != t.end() && pos->addr == addr ? pos : t.end();
}

}  // namespace xenprobes::channel
