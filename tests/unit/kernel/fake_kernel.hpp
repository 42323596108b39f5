// A fake guest kernel for the kernel-layer tests: a few pages of memory at kernel addresses,
// filled entry by entry in Linux's table formats, and the symbols that bound the tables.
#pragma once

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"

namespace xenprobes::testing {

inline constexpr std::uint64_t kText = 0xffffffff81000000ull;     // _stext
inline constexpr std::uint64_t kTextEnd = 0xffffffff81100000ull;  // _etext
inline constexpr std::uint64_t kInit = 0xffffffff82000000ull;     // _sinittext
inline constexpr std::uint64_t kInitEnd = 0xffffffff82010000ull;
inline constexpr std::uint64_t kRodata = 0xffffffff81200000ull;  // where the tables live
inline constexpr std::uint64_t kData = 0xffffffff81300000ull;    // the blacklist's nodes

struct FakeKernel {
  std::map<std::uint64_t, std::uint8_t> mem;  // byte-wise: hostile layouts are easy to write
  std::string map;                            // System.map text
  std::vector<std::uint64_t> unreadable;      // reads touching these fail

  FakeKernel() {
    sym(kText, 'T', "_stext");
    sym(kTextEnd, 'T', "_etext");
    sym(kInit, 'T', "_sinittext");
    sym(kInitEnd, 'T', "_einittext");
  }
  void sym(std::uint64_t a, char type, const std::string& name) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx %c ", static_cast<unsigned long long>(a), type);
    map += buf + name + "\n";
  }
  void put(std::uint64_t a, const void* p, std::size_t n) {
    auto* b = static_cast<const std::uint8_t*>(p);
    for (std::size_t i = 0; i < n; ++i) mem[a + i] = b[i];
  }
  void s32(std::uint64_t a, std::int64_t v) {
    auto x = static_cast<std::int32_t>(v);
    put(a, &x, 4);
  }
  void s64(std::uint64_t a, std::int64_t v) { put(a, &v, 8); }
  void u64(std::uint64_t a, std::uint64_t v) { put(a, &v, 8); }

  // A table of `n` entries at `at`, bounded by the two symbols.
  void bounds(const std::string& start, const std::string& stop, std::uint64_t at, std::uint64_t bytes) {
    sym(at, 'R', start);
    sym(at + bytes, 'R', stop);
  }
  // __ex_table entries {insn, fixup, data}, relative to each field.
  void ex_table(const std::vector<std::array<std::uint64_t, 3>>& entries, std::uint64_t at = kRodata) {
    bounds("__start___ex_table", "__stop___ex_table", at, entries.size() * 12);
    for (std::size_t k = 0; k < entries.size(); ++k) {
      std::uint64_t e = at + 12 * k;
      s32(e, static_cast<std::int64_t>(entries[k][0] - e));
      s32(e + 4, static_cast<std::int64_t>(entries[k][1] - (e + 4)));
      s32(e + 8, static_cast<std::int64_t>(entries[k][2]));
    }
  }
  // __jump_table entries {code, target, key | flags}.
  void jump_table(const std::vector<std::array<std::uint64_t, 3>>& entries, std::uint64_t at = kRodata + 0x1000) {
    bounds("__start___jump_table", "__stop___jump_table", at, entries.size() * 16);
    for (std::size_t k = 0; k < entries.size(); ++k) {
      std::uint64_t e = at + 16 * k;
      s32(e, static_cast<std::int64_t>(entries[k][0] - e));
      s32(e + 4, static_cast<std::int64_t>(entries[k][1] - (e + 4)));
      s64(e + 8, static_cast<std::int64_t>(entries[k][2] - (e + 8)));
    }
  }
  // .static_call_sites entries {addr, key | flags}.
  void static_calls(const std::vector<std::array<std::uint64_t, 2>>& entries, std::uint64_t at = kRodata + 0x2000) {
    bounds("__start_static_call_sites", "__stop_static_call_sites", at, entries.size() * 8);
    for (std::size_t k = 0; k < entries.size(); ++k) {
      std::uint64_t e = at + 8 * k;
      s32(e, static_cast<std::int64_t>(entries[k][0] - e));
      s32(e + 4, static_cast<std::int64_t>(entries[k][1] - (e + 4)));
    }
  }
  void smp_locks(const std::vector<std::uint64_t>& sites, std::uint64_t at = kRodata + 0x3000) {
    sym(at, 'R', "__smp_locks");
    sym(at + 4 * sites.size(), 'R', "__smp_locks_end");
    for (std::size_t k = 0; k < sites.size(); ++k) s32(at + 4 * k, static_cast<std::int64_t>(sites[k] - (at + 4 * k)));
  }
  // kprobe_blacklist: a circular list through `ranges.size()` nodes of 40 bytes.
  void blacklist(const std::vector<std::array<std::uint64_t, 2>>& ranges) {
    const std::uint64_t head = kData;
    sym(head, 'd', "kprobe_blacklist");
    std::uint64_t prev = head;
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      std::uint64_t node = kData + 0x100 + 0x40 * k;
      u64(prev, node);  // prev->next
      u64(node + 8, prev);
      u64(node + 16, ranges[k][0]);
      u64(node + 24, ranges[k][1]);
      u64(node + 32, 0);
      prev = node;
    }
    u64(prev, head);
    u64(head + 8, prev);
  }

  symbols::SymbolTable symbols() const {
    auto t = symbols::SymbolTable::parse(map, "fake System.map");
    if (!t) throw std::runtime_error(t.error().what);
    return std::move(*t);
  }
  kernel::ReadFn reader() const {
    return [this](Gva a, std::span<std::byte> out) -> Result<void> {
      for (std::uint64_t u : unreadable)
        if (u >= a.value && u < a.value + out.size()) return fail(Errc::Fault, "not mapped");
      for (std::size_t i = 0; i < out.size(); ++i) {
        auto it = mem.find(a.value + i);
        out[i] = std::byte{it == mem.end() ? std::uint8_t{0} : it->second};
      }
      return {};
    };
  }
  kernel::KernelTables read(kernel::Limits l = {}) const { return kernel::KernelTables::read(symbols(), reader(), l); }
};

}  // namespace xenprobes::testing
