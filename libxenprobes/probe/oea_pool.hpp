// OeaPool: the slots of the out-of-line execution areas, managed in Dom0 by bitmaps.
//
// Each area is cut into fixed-size slots from its (page-aligned) start; a tail shorter than
// a slot is left unused. A slot is
//
//   Clean  never used, or reclaimed: may be handed out;
//   Used   holds the displaced instruction of a live probe;
//   Dirty  released, but a vCPU may still be executing in it (interrupted inside the copy, or
//          about to return to it): not handed out until reclaim() proves no vCPU RIP is inside.
//
//   area i:  | slot 0 | slot 1 | slot 2 | ... | slot n-1 | tail |
//            ^addr    ^addr+slot_size
//   used_[i]  bit k = slot k is Used      dirty_[i] bit k = slot k is Dirty      (else Clean)
//
// Not thread-safe: the engine owns one pool per domain and serialises access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <span>
#include <vector>

#include "common/result.hpp"
#include "common/types.hpp"
#include "guestmod/module_info.hpp"

namespace xenprobes::probe {

using guestmod::OeaArea;  // the module's published areas (guestmod/module_info.hpp)

enum class SlotState : std::uint8_t { Clean, Used, Dirty };

struct OeaPoolOptions {
  // Bytes per slot: a multiple of 16 (slot starts stay 16-byte aligned), 32..4096. 32 holds
  // the longest x86 instruction (15 bytes) plus a jmp rel32 (5) or a trap byte.
  std::size_t slot_size = 32;
  // wants_growth() once fewer Clean slots remain; 0 = an eighth of all slots (at least 1),
  // recomputed as areas are added.
  std::size_t low_water = 0;
};

class OeaPool {
 public:
  static constexpr std::size_t kDefaultSlotSize = 32;
  static constexpr std::size_t kSlotAlign = 16;

  // Fails with InvalidArgument for a bad slot size or an area add_area() refuses.
  [[nodiscard]] static Result<OeaPool> create(std::span<const OeaArea> areas, OeaPoolOptions options = {});

  // Adds an area (growth). Refused (InvalidArgument): not page aligned, size not a nonzero
  // page multiple, wrap-around, smaller than a slot, overlapping a known area, or beyond
  // XENPROBES_OEA_MAX_AREAS areas. Validation of guest input is read_module_info's job; this
  // only keeps the pool's own invariants.
  [[nodiscard]] Result<void> add_area(OeaArea area);

  // A Clean slot, now Used (the lowest address first). NoSpace when none is Clean; the
  // message counts Used + Dirty slots as "in use".
  [[nodiscard]] Result<Gva> allocate();
  // n adjacent Clean slots in one area, now Used (the lowest address first); each is released
  // on its own. NoSpace when no area has such a run; InvalidArgument for 0 or more than a
  // page's worth.
  [[nodiscard]] Result<Gva> allocate_run(std::size_t n);
  // Used → Dirty. InvalidArgument if `slot` is not the start of a Used slot.
  [[nodiscard]] Result<void> release(Gva slot);
  // Dirty → Clean for every Dirty slot that holds none of `vcpu_rips` (the RIPs of all vCPUs,
  // gathered with the domain paused). Returns how many slots became Clean.
  std::size_t reclaim(std::span<const std::uint64_t> vcpu_rips);

  bool contains(Gva va) const;                        // inside some area (slot or tail)
  std::optional<Gva> slot_of(Gva va) const;           // start of the slot holding va
  std::optional<SlotState> state_of(Gva slot) const;  // for a slot start only

  std::size_t slot_size() const { return slot_size_; }
  std::size_t total() const { return total_; }
  std::size_t used() const { return used_count_; }
  std::size_t dirty() const { return dirty_count_; }
  std::size_t clean() const { return total_ - used_count_ - dirty_count_; }
  std::size_t low_water() const;
  // Fewer Clean slots than the low-water mark, and room for one more area.
  bool wants_growth() const;
  const std::vector<OeaArea>& areas() const { return areas_; }

 private:
  struct Bits {
    std::vector<std::uint64_t> used, dirty;
    std::size_t slots = 0;
  };
  explicit OeaPool(OeaPoolOptions o) : slot_size_(o.slot_size), low_water_(o.low_water) {}
  // (area index, slot index) of the slot holding va.
  std::optional<std::pair<std::size_t, std::size_t>> locate(Gva va) const;
  Error exhausted() const;
  Gva slot_addr(std::size_t area, std::size_t slot) const {
    return areas_[area].addr + slot * static_cast<std::uint64_t>(slot_size_);
  }

  std::size_t slot_size_;
  std::size_t low_water_;
  std::vector<OeaArea> areas_;
  std::vector<Bits> bits_;  // parallel to areas_
  std::size_t total_ = 0, used_count_ = 0, dirty_count_ = 0;
};

}  // namespace xenprobes::probe
