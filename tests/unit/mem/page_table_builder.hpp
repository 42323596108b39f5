// A small page-table builder for tests and benchmarks: writes real x86 page tables into a
// FakeFrameSource. Deliberately written apart from the walker's mask tables so a mistake in
// one does not hide in the other.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "mem/fake_frame_source.hpp"
#include "mem/paging.hpp"

namespace xenprobes::mem::testing {

inline constexpr std::uint64_t P = 1ull << 0;    // present
inline constexpr std::uint64_t RW = 1ull << 1;   // writable
inline constexpr std::uint64_t US = 1ull << 2;   // user
inline constexpr std::uint64_t PS = 1ull << 7;   // large page
inline constexpr std::uint64_t NX = 1ull << 63;  // execute-disable

inline constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

// An entry pointing at `frame` (a table or a 4 KiB page) with `flags`.
constexpr std::uint64_t entry(Frame frame, std::uint64_t flags) { return (frame.value << 12) | flags; }
// An entry mapping a large page at physical address `pa` (PS added).
constexpr std::uint64_t large(std::uint64_t pa, std::uint64_t flags) { return pa | flags | PS; }

class PageTableBuilder {
 public:
  // Tables are allocated from `first_table_frame` upwards; the first one is the root.
  PageTableBuilder(FakeFrameSource& ram, PagingMode mode, Frame first_table_frame = Frame{0x100})
      : ram_(ram), mode_(mode), next_(first_table_frame.value) {
    root_ = new_table();
  }

  Frame root() const { return root_; }
  std::uint64_t cr3() const { return root_.value << 12; }
  PagingMode mode() const { return mode_; }
  unsigned entry_bytes() const { return mode_ == PagingMode::Legacy32 ? 4 : 8; }

  Frame new_table() {
    Frame f{next_++};
    ram_.add_frame(f);
    return f;
  }

  void set(Frame table, unsigned index, std::uint64_t value) {
    const Gpa at = gpa_of(table) + std::uint64_t{index} * entry_bytes();
    if (entry_bytes() == 4) ram_.write_u32(at, static_cast<std::uint32_t>(value));
    else ram_.write_u64(at, value);
  }
  std::uint64_t get(Frame table, unsigned index) const {
    const std::uint64_t v = ram_.read_u64(gpa_of(table) + std::uint64_t{index} * entry_bytes());
    return entry_bytes() == 4 ? (v & 0xFFFF'FFFF) : v;
  }

  // Maps one page of `size` (4 KiB or a large size of this mode) at va → pa, creating missing
  // intermediate tables with P|RW|US so the leaf's flags decide the permissions.
  void map(std::uint64_t va, std::uint64_t pa, std::uint64_t size = 4 * KiB, std::uint64_t flags = P | RW) {
    const Shape s = shape();
    Frame table = root_;
    for (unsigned level = s.levels; level >= 1; --level) {
      const unsigned shift = 12 + s.bits * (level - 1);
      const unsigned idx = (va >> shift) & ((1u << (level == s.levels ? s.top_bits : s.bits)) - 1);
      if ((std::uint64_t{1} << shift) == size) {
        set(table, idx, size == 4 * KiB ? (pa | flags) : large(pa, flags));
        return;
      }
      if (level == 1) throw std::invalid_argument("bad page size for this mode");
      std::uint64_t e = get(table, idx);
      if (!(e & P)) {
        e = entry(new_table(), P | RW | US);
        set(table, idx, e);
      }
      table = Frame{(e & 0x000F'FFFF'FFFF'F000ull) >> 12};
    }
  }

 private:
  struct Shape {
    unsigned levels, bits, top_bits;
  };
  Shape shape() const {
    switch (mode_) {
      case PagingMode::Legacy32: return {2, 10, 10};
      case PagingMode::Pae: return {3, 9, 2};
      case PagingMode::Long4: return {4, 9, 9};
      case PagingMode::Long5: return {5, 9, 9};
      case PagingMode::None: break;
    }
    throw std::invalid_argument("no tables without paging");
  }

  FakeFrameSource& ram_;
  PagingMode mode_;
  std::uint64_t next_;
  Frame root_;
};

}  // namespace xenprobes::mem::testing
