#include "hv/sim/page_table_builder.hpp"

#include <cstring>

namespace xenprobes::hv::sim {
namespace {
constexpr std::uint64_t kAddrMask = 0x000ffffffffff000ull;
unsigned index_of(std::uint64_t va, unsigned level) {  // level 4..1
  return (va >> (12 + 9 * (level - 1))) & 0x1ff;
}
}  // namespace

PageTableBuilder::PageTableBuilder(std::span<std::uint8_t> ram, std::uint64_t table_base, std::uint64_t table_limit,
                                   std::function<std::uint64_t(std::uint64_t)> entry_frame)
    : ram_(ram), next_(table_base), limit_(table_limit), entry_frame_(std::move(entry_frame)) {
  // The root as Linux allocates it with page-table isolation compiled in: an 8 KiB-aligned
  // pair, the kernel's table first and the user's (here: empty, mapping nothing) second
  // (PGD_ALLOCATION_ORDER 1). A cr3 with bit 12 set then names a user table that maps no
  // kernel text, as a PTI guest's vCPU holds in user mode.
  next_ = (next_ + 0x1fff) & ~0x1fffull;
  auto root = alloc_table();
  root_ = root ? *root : 0;
  best_effort(alloc_table(), "sim: the user half of the root pair");
}

Result<std::uint64_t> PageTableBuilder::alloc_table() {
  if (next_ + 4096 > limit_ || next_ + 4096 > ram_.size())
    return fail(Errc::NoMemory, "sim: page-table region exhausted");
  std::uint64_t gpa = next_;
  next_ += 4096;
  std::memset(ram_.data() + gpa, 0, 4096);
  return gpa;
}

std::uint64_t& PageTableBuilder::entry(std::uint64_t table_gpa, unsigned index) {
  return *reinterpret_cast<std::uint64_t*>(ram_.data() + table_gpa + std::size_t{index} * 8);
}

Result<std::uint64_t> PageTableBuilder::next_table(std::uint64_t table_gpa, unsigned index) {
  std::uint64_t& e = entry(table_gpa, index);
  if (e & kPresent) {
    if (e & kLarge) return fail(Errc::Exists, "sim: mapping overlaps a large page");
    // Entries hold entry frames; tables live in our own RAM, so keep a reverse lookup by
    // remembering that entry_frame is gfn + constant (PV) or identity (HVM).
    std::uint64_t frame = (e & kAddrMask) >> 12;
    std::uint64_t delta = entry_frame_(0);
    return (frame - delta) << 12;
  }
  std::uint64_t t = XP_TRY(alloc_table());
  // Intermediate entries are permissive; the leaf decides.
  e = (entry_frame_(t >> 12) << 12) | kPresent | kWrite | kAccessed;
  return t;
}

Result<void> PageTableBuilder::map_4k(std::uint64_t va, std::uint64_t gpa, std::uint64_t len, std::uint64_t flags) {
  if ((va | gpa | len) & 0xfff) return fail(Errc::InvalidArgument, "sim: map_4k needs page alignment");
  for (std::uint64_t off = 0; off < len; off += 4096) {
    std::uint64_t t = root_;
    for (unsigned level = 4; level > 1; --level) t = XP_TRY(next_table(t, index_of(va + off, level)));
    std::uint64_t& e = entry(t, index_of(va + off, 1));
    e = (entry_frame_((gpa + off) >> 12) << 12) | flags | kPresent | kAccessed;
  }
  return {};
}

Result<void> PageTableBuilder::map_2m(std::uint64_t va, std::uint64_t gpa, std::uint64_t len, std::uint64_t flags) {
  constexpr std::uint64_t k2m = 2ull << 20;
  if ((va | gpa | len) & (k2m - 1)) return fail(Errc::InvalidArgument, "sim: map_2m needs 2 MiB alignment");
  for (std::uint64_t off = 0; off < len; off += k2m) {
    std::uint64_t t = root_;
    for (unsigned level = 4; level > 2; --level) t = XP_TRY(next_table(t, index_of(va + off, level)));
    std::uint64_t& e = entry(t, index_of(va + off, 2));
    e = (entry_frame_((gpa + off) >> 12) << 12) | flags | kPresent | kAccessed | kLarge;
  }
  return {};
}

}  // namespace xenprobes::hv::sim
