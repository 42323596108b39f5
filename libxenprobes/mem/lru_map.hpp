// Internal: a bounded map that evicts the least recently used entry.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <unordered_map>
#include <utility>

namespace xenprobes::mem::detail {

template <typename K, typename V, typename Hash = std::hash<K>>
class LruMap {
 public:
  explicit LruMap(std::size_t capacity) : capacity_(capacity ? capacity : 1) {}

  // Finds key and marks it most recently used; nullptr if absent.
  V* find(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }

  bool contains(const K& key) const { return index_.count(key) != 0; }

  // Inserts (or replaces) key; evicts the least recently used entry first if full.
  // Returns true if an entry was evicted.
  bool put(const K& key, V value) {
    if (V* v = find(key)) {
      *v = std::move(value);
      return false;
    }
    bool evicted = false;
    if (order_.size() >= capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      evicted = true;
    }
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    return evicted;
  }

  bool erase(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    order_.erase(it->second);
    index_.erase(it);
    return true;
  }

  // Erases every entry for which pred(key, value) holds; returns how many.
  template <typename Pred>
  std::size_t erase_if(Pred pred) {
    std::size_t n = 0;
    for (auto it = order_.begin(); it != order_.end();) {
      if (pred(it->first, it->second)) {
        index_.erase(it->first);
        it = order_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }

  void clear() {
    index_.clear();
    order_.clear();
  }

  std::size_t size() const { return order_.size(); }
  std::size_t capacity() const { return capacity_; }

 private:
  using Order = std::list<std::pair<K, V>>;
  std::size_t capacity_;
  Order order_;  // most recently used first
  std::unordered_map<K, typename Order::iterator, Hash> index_;
};

}  // namespace xenprobes::mem::detail
