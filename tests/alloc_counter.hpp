// Counts every allocation of the process (operator new replaced: malloc/free underneath), for
// the tests that assert and the benchmarks that report allocations per operation. Include it
// in exactly one source file of a program.
//
// Every form that pairs with the replaced deletes is replaced too (plain and nothrow, single
// and array): the standard library allocates some buffers with the nothrow form
// (std::stable_sort's temporary buffer), and AddressSanitizer reports a block from its own
// nothrow new freed by our delete. The aligned forms are left alone, as a pair.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

inline std::atomic<std::uint64_t> g_allocs{0};

namespace xp_alloc_counter {
inline void* allocate(std::size_t n) noexcept {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
}  // namespace xp_alloc_counter

// The replaced operators pair malloc with free; g++ 12 sees only the new/free mismatch.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (void* p = xp_alloc_counter::allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = xp_alloc_counter::allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return xp_alloc_counter::allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return xp_alloc_counter::allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop
