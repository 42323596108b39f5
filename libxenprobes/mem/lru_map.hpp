// Internal: a bounded map that evicts the least recently used entry.
//
// Allocation-free once warm: entries live in a vector that grows to the capacity and is never
// shrunk, linked by index in recency order, with a free list; the index is an open-addressing
// table (linear probing, backward-shift deletion: no tombstones) that grows to twice the
// capacity. clear() costs O(size), not O(capacity): the hit path clears the translation cache
// on every hit (the guest ran and may have changed its page tables), and with a std::list and
// an std::unordered_map every hit then paid two allocations to cache its first translation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace xenprobes::mem::detail {

template <typename K, typename V, typename Hash = std::hash<K>>
class LruMap {
 public:
  explicit LruMap(std::size_t capacity) : capacity_(capacity ? capacity : 1) {}

  // Finds key and marks it most recently used; nullptr if absent.
  V* find(const K& key) {
    const std::uint32_t i = lookup(key);
    if (i == kNone) return nullptr;
    unlink(i);
    push_front(i);
    return &nodes_[i].kv->second;
  }

  bool contains(const K& key) const { return lookup(key) != kNone; }

  // Inserts (or replaces) key; evicts the least recently used entry first if full.
  // Returns true if an entry was evicted.
  bool put(const K& key, V value) {
    if (V* v = find(key)) {
      *v = std::move(value);
      return false;
    }
    bool evicted = false;
    if (size_ >= capacity_) {
      remove(tail_);
      evicted = true;
    }
    std::uint32_t i;
    if (free_ != kNone) {
      i = free_;
      free_ = nodes_[i].next;
    } else {
      i = static_cast<std::uint32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    nodes_[i].kv.emplace(key, std::move(value));
    if ((size_ + 1) * 2 > table_.size()) grow();
    insert_index(i);
    push_front(i);
    ++size_;
    return evicted;
  }

  bool erase(const K& key) {
    const std::uint32_t i = lookup(key);
    if (i == kNone) return false;
    remove(i);
    return true;
  }

  // Erases every entry for which pred(key, value) holds; returns how many.
  template <typename Pred>
  std::size_t erase_if(Pred pred) {
    std::size_t n = 0;
    for (std::uint32_t i = head_; i != kNone;) {
      const std::uint32_t next = nodes_[i].next;
      if (pred(nodes_[i].kv->first, nodes_[i].kv->second)) {
        remove(i);
        ++n;
      }
      i = next;
    }
    return n;
  }

  void clear() {
    // Every slot of the index emptied through its node: O(size), and no probe chain needs
    // to survive since every entry goes.
    for (std::uint32_t i = head_; i != kNone;) {
      Node& n = nodes_[i];
      const std::uint32_t next = n.next;
      table_[n.pos] = kNone;
      n.kv.reset();
      n.next = free_;
      free_ = i;
      i = next;
    }
    head_ = tail_ = kNone;
    size_ = 0;
  }

  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }

 private:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  struct Node {
    std::optional<std::pair<K, V>> kv;
    std::uint32_t prev = kNone, next = kNone;  // recency order; next links the free list too
    std::size_t pos = 0;                       // its slot in table_
  };

  std::size_t home(const K& key) const { return Hash{}(key) & (table_.size() - 1); }

  std::uint32_t lookup(const K& key) const {
    if (table_.empty()) return kNone;
    for (std::size_t p = home(key);; p = (p + 1) & (table_.size() - 1)) {
      const std::uint32_t i = table_[p];
      if (i == kNone) return kNone;
      if (nodes_[i].kv->first == key) return i;
    }
  }

  void insert_index(std::uint32_t i) {
    std::size_t p = home(nodes_[i].kv->first);
    while (table_[p] != kNone) p = (p + 1) & (table_.size() - 1);
    table_[p] = i;
    nodes_[i].pos = p;
  }

  void grow() {
    std::size_t n = table_.empty() ? 16 : table_.size() * 2;
    table_.assign(n, kNone);
    for (std::uint32_t i = head_; i != kNone; i = nodes_[i].next) insert_index(i);
  }

  // Backward-shift deletion: later entries of the probe chain move up into the hole.
  void erase_index(std::size_t hole) {
    const std::size_t mask = table_.size() - 1;
    table_[hole] = kNone;
    for (std::size_t p = (hole + 1) & mask; table_[p] != kNone; p = (p + 1) & mask) {
      const std::uint32_t i = table_[p];
      const std::size_t h = home(nodes_[i].kv->first);
      // Moves when its home is not in (hole, p] (cyclically): the hole breaks its chain.
      const bool stays = hole < p ? (h > hole && h <= p) : (h > hole || h <= p);
      if (stays) continue;
      table_[hole] = i;
      nodes_[i].pos = hole;
      table_[p] = kNone;
      hole = p;
    }
  }

  void unlink(std::uint32_t i) {
    Node& n = nodes_[i];
    (n.prev != kNone ? nodes_[n.prev].next : head_) = n.next;
    (n.next != kNone ? nodes_[n.next].prev : tail_) = n.prev;
    n.prev = n.next = kNone;
  }

  void push_front(std::uint32_t i) {
    Node& n = nodes_[i];
    n.prev = kNone;
    n.next = head_;
    if (head_ != kNone) nodes_[head_].prev = i;
    head_ = i;
    if (tail_ == kNone) tail_ = i;
  }

  void remove(std::uint32_t i) {
    erase_index(nodes_[i].pos);
    unlink(i);
    nodes_[i].kv.reset();
    nodes_[i].next = free_;
    free_ = i;
    --size_;
  }

  std::size_t capacity_;
  std::vector<Node> nodes_;           // grows to capacity_, never shrinks
  std::vector<std::uint32_t> table_;  // node indices, kNone = empty; a power of two
  std::uint32_t head_ = kNone, tail_ = kNone, free_ = kNone;
  std::size_t size_ = 0;
};

}  // namespace xenprobes::mem::detail
