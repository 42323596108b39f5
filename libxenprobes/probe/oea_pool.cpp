#include "probe/oea_pool.hpp"

#include <algorithm>
#include <bit>
#include <limits>

#include "xenprobes/protocol.h"

namespace xenprobes::probe {

namespace {
bool test(const std::vector<std::uint64_t>& b, std::size_t k) { return (b[k / 64] >> (k % 64)) & 1; }
void set(std::vector<std::uint64_t>& b, std::size_t k) { b[k / 64] |= 1ull << (k % 64); }
void clear(std::vector<std::uint64_t>& b, std::size_t k) { b[k / 64] &= ~(1ull << (k % 64)); }
}  // namespace

Result<OeaPool> OeaPool::create(std::span<const OeaArea> areas, OeaPoolOptions options) {
  if (options.slot_size < 32 || options.slot_size > kPageSize || options.slot_size % kSlotAlign)
    return fail(Errc::InvalidArgument,
                "OEA slot size " + std::to_string(options.slot_size) + " must be a multiple of 16 between 32 and 4096");
  OeaPool pool(options);
  for (const auto& a : areas) XP_TRY(pool.add_area(a));
  return pool;
}

Result<void> OeaPool::add_area(OeaArea a) {
  if (areas_.size() >= XENPROBES_OEA_MAX_AREAS)
    return fail(Errc::InvalidArgument, "OEA pool already has " + std::to_string(areas_.size()) + " areas");
  if (a.addr.value % kPageSize || a.size == 0 || a.size % kPageSize ||
      a.size - 1 > std::numeric_limits<std::uint64_t>::max() - a.addr.value)
    return fail(Errc::InvalidArgument, "OEA area is not a page-aligned, nonwrapping range of whole pages");
  if (a.size < slot_size_) return fail(Errc::InvalidArgument, "OEA area is smaller than one slot");
  for (const auto& o : areas_)
    if (a.addr.value <= o.last() && o.addr.value <= a.last())
      return fail(Errc::InvalidArgument, "OEA area overlaps an area the pool already has");
  Bits b;
  b.slots = static_cast<std::size_t>(a.size / slot_size_);
  b.used.assign((b.slots + 63) / 64, 0);
  b.dirty.assign((b.slots + 63) / 64, 0);
  total_ += b.slots;
  areas_.push_back(a);
  bits_.push_back(std::move(b));
  return {};
}

Result<Gva> OeaPool::allocate() {
  for (std::size_t i = 0; i < bits_.size(); ++i) {
    auto& b = bits_[i];
    for (std::size_t w = 0; w < b.used.size(); ++w) {
      std::uint64_t free = ~(b.used[w] | b.dirty[w]);
      if (w == b.used.size() - 1 && b.slots % 64) free &= (1ull << (b.slots % 64)) - 1;  // past the end
      if (!free) continue;
      std::size_t k = w * 64 + static_cast<std::size_t>(std::countr_zero(free));
      set(b.used, k);
      ++used_count_;
      return slot_addr(i, k);
    }
  }
  return std::unexpected(exhausted());
}

Result<Gva> OeaPool::allocate_run(std::size_t n) {
  if (n == 1) return allocate();
  if (n == 0 || n * slot_size_ > kPageSize)
    return fail(Errc::InvalidArgument,
                "a run of " + std::to_string(n) + " OEA slots (1.." + std::to_string(kPageSize / slot_size_) + ")");
  for (std::size_t i = 0; i < bits_.size(); ++i) {
    auto& b = bits_[i];
    std::size_t run = 0;
    for (std::size_t k = 0; k < b.slots; ++k) {
      run = test(b.used, k) || test(b.dirty, k) ? 0 : run + 1;
      if (run < n) continue;
      for (std::size_t j = k + 1 - n; j <= k; ++j) set(b.used, j);
      used_count_ += n;
      return slot_addr(i, k + 1 - n);
    }
  }
  return std::unexpected(exhausted());
}

Error OeaPool::exhausted() const {
  return Error{Errc::NoSpace, "out-of-line execution area exhausted: " + std::to_string(used_count_ + dirty_count_) +
                                  " slots in use; load the guest module with a larger area (or let it grow)"};
}

Result<void> OeaPool::release(Gva slot) {
  auto loc = locate(slot);
  if (!loc || slot_addr(loc->first, loc->second) != slot)
    return fail(Errc::InvalidArgument, "not the start of an OEA slot");
  auto& b = bits_[loc->first];
  if (!test(b.used, loc->second)) return fail(Errc::InvalidArgument, "OEA slot released but not in use");
  clear(b.used, loc->second);
  set(b.dirty, loc->second);
  --used_count_;
  ++dirty_count_;
  return {};
}

std::size_t OeaPool::reclaim(std::span<const std::uint64_t> vcpu_rips) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < bits_.size(); ++i) {
    auto& b = bits_[i];
    for (std::size_t w = 0; w < b.dirty.size(); ++w) {
      for (std::uint64_t d = b.dirty[w]; d; d &= d - 1) {
        std::size_t k = w * 64 + static_cast<std::size_t>(std::countr_zero(d));
        const std::uint64_t start = slot_addr(i, k).value;
        bool busy = false;
        for (auto rip : vcpu_rips) busy |= rip - start < slot_size_;  // start <= rip < start + size
        if (busy) continue;
        clear(b.dirty, k);
        --dirty_count_;
        ++n;
      }
    }
  }
  return n;
}

std::optional<std::pair<std::size_t, std::size_t>> OeaPool::locate(Gva va) const {
  for (std::size_t i = 0; i < areas_.size(); ++i) {
    if (!areas_[i].contains(va)) continue;
    auto k = static_cast<std::size_t>((va.value - areas_[i].addr.value) / slot_size_);
    if (k >= bits_[i].slots) return std::nullopt;  // the unused tail
    return std::pair{i, k};
  }
  return std::nullopt;
}

bool OeaPool::contains(Gva va) const {
  for (const auto& a : areas_)
    if (a.contains(va)) return true;
  return false;
}

std::optional<Gva> OeaPool::slot_of(Gva va) const {
  auto loc = locate(va);
  if (!loc) return std::nullopt;
  return slot_addr(loc->first, loc->second);
}

std::optional<SlotState> OeaPool::state_of(Gva slot) const {
  auto loc = locate(slot);
  if (!loc || slot_addr(loc->first, loc->second) != slot) return std::nullopt;
  const auto& b = bits_[loc->first];
  if (test(b.used, loc->second)) return SlotState::Used;
  if (test(b.dirty, loc->second)) return SlotState::Dirty;
  return SlotState::Clean;
}

std::size_t OeaPool::low_water() const {
  if (low_water_) return low_water_;
  return std::max<std::size_t>(1, total_ / 8);
}

bool OeaPool::wants_growth() const { return clean() < low_water() && areas_.size() < XENPROBES_OEA_MAX_AREAS; }

}  // namespace xenprobes::probe
