// SlotMap: live return-probe instances by stack slot, without a heap allocation per insert
// (the hit path of every tracked call inserts and erases one). Open addressing with linear
// probing and backward-shift deletion; it grows only in reserve(), called at registration,
// or when an insert finds it more than half full.
#pragma once

#include <cstdint>
#include <vector>

namespace xenprobes::probe {

template <typename T>
class SlotMap {
 public:
  // Room for `n` entries at most half full.
  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    if (cap > table_.size()) rehash(cap);
  }

  T* find(std::uint64_t key) const {
    if (table_.empty() || key == kEmpty) return nullptr;
    for (std::size_t i = index(key);; i = (i + 1) & mask()) {
      if (table_[i].key == key) return table_[i].value;
      if (table_[i].key == kEmpty) return nullptr;
    }
  }

  void insert(std::uint64_t key, T* value) {
    if (2 * (size_ + 1) > table_.size()) rehash(table_.empty() ? 16 : 2 * table_.size());
    for (std::size_t i = index(key);; i = (i + 1) & mask()) {
      if (table_[i].key == key) {
        table_[i].value = value;
        return;
      }
      if (table_[i].key == kEmpty) {
        table_[i] = {key, value};
        ++size_;
        return;
      }
    }
  }

  void erase(std::uint64_t key) {
    if (table_.empty()) return;
    std::size_t i = index(key);
    while (table_[i].key != key) {
      if (table_[i].key == kEmpty) return;
      i = (i + 1) & mask();
    }
    // Backward shift: move later entries of the cluster into the hole when their home
    // position allows it, so lookups never need tombstones.
    for (std::size_t j = (i + 1) & mask();; j = (j + 1) & mask()) {
      if (table_[j].key == kEmpty) break;
      std::size_t home = index(table_[j].key);
      bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
      if (movable) {
        table_[i] = table_[j];
        i = j;
      }
    }
    table_[i] = {kEmpty, nullptr};
    --size_;
  }

  std::size_t size() const { return size_; }

  template <typename F>
  void for_each(F&& f) const {
    for (const Entry& e : table_)
      if (e.key != kEmpty) f(e.key, e.value);
  }

 private:
  // Stack slots are 8-byte aligned kernel addresses: 0 never occurs.
  static constexpr std::uint64_t kEmpty = 0;
  struct Entry {
    std::uint64_t key = kEmpty;
    T* value = nullptr;
  };
  std::size_t mask() const { return table_.size() - 1; }
  std::size_t index(std::uint64_t key) const {
    return static_cast<std::size_t>((key >> 3) * 0x9e3779b97f4a7c15ull >> 20) & mask();
  }
  void rehash(std::size_t cap) {
    std::vector<Entry> old = std::move(table_);
    table_.assign(cap, Entry{});
    size_ = 0;
    for (const Entry& e : old)
      if (e.key != kEmpty) insert(e.key, e.value);
  }

  std::vector<Entry> table_;
  std::size_t size_ = 0;
};

}  // namespace xenprobes::probe
