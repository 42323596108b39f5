// Builds real x86-64 4-level page tables inside guest RAM, the way a guest kernel would, so
// the library's Dom0-side walker has something true to walk. Table pages are taken from a
// reserved region of guest RAM; entries hold the frame numbers Xen would put there (GFNs for
// HVM guests, MFNs for PV guests: the caller supplies the gfn -> entry-frame function).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "common/result.hpp"

namespace xenprobes::hv::sim {

class PageTableBuilder {
 public:
  static constexpr std::uint64_t kPresent = 1, kWrite = 2, kUser = 4, kAccessed = 0x20, kDirty = 0x40, kLarge = 0x80,
                                 kGlobal = 0x100, kNx = 1ull << 63;

  // ram: guest RAM (GPA 0 at ram[0]); tables are allocated in [table_base, table_limit).
  PageTableBuilder(std::span<std::uint8_t> ram, std::uint64_t table_base, std::uint64_t table_limit,
                   std::function<std::uint64_t(std::uint64_t gfn)> entry_frame);

  std::uint64_t root_gpa() const { return root_; }

  // Maps [va, va+len) to [gpa, gpa+len) with 4 KiB pages (both page aligned).
  Result<void> map_4k(std::uint64_t va, std::uint64_t gpa, std::uint64_t len, std::uint64_t flags);
  // Maps with 2 MiB pages (va, gpa and len 2 MiB aligned).
  Result<void> map_2m(std::uint64_t va, std::uint64_t gpa, std::uint64_t len, std::uint64_t flags);

 private:
  Result<std::uint64_t> alloc_table();
  // Returns the GPA of the table the entry at (table, index) points to, creating it.
  Result<std::uint64_t> next_table(std::uint64_t table_gpa, unsigned index);
  std::uint64_t& entry(std::uint64_t table_gpa, unsigned index);

  std::span<std::uint8_t> ram_;
  std::uint64_t next_, limit_, root_ = 0;
  std::function<std::uint64_t(std::uint64_t)> entry_frame_;
};

}  // namespace xenprobes::hv::sim
