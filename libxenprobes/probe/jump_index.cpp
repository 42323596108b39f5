// The jump probes' index per kernel build (probe/jump_index.hpp): the guest's claimed build,
// the keyed hash that checks it, and the process's cache.
#include "probe/jump_index.hpp"

#include <algorithm>
#include <cstring>
#include <random>

#include "common/hex.hpp"

namespace xenprobes::probe {

namespace {

constexpr std::uint32_t kNtGnuBuildId = 3;  // elf.h NT_GNU_BUILD_ID

std::uint32_t u32_at(std::span<const std::uint8_t> b, std::size_t off) {
  std::uint32_t v = 0;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

std::uint64_t align4(std::uint64_t v) { return (v + 3) & ~std::uint64_t{3}; }

std::uint64_t rotl(std::uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct ProcessKey {
  std::uint64_t k0, k1;
  ProcessKey() {
    std::random_device rd;
    k0 = (std::uint64_t{rd()} << 32) ^ rd();
    k1 = (std::uint64_t{rd()} << 32) ^ rd();
  }
};

const ProcessKey& process_key() {
  static const ProcessKey k;
  return k;
}

}  // namespace

std::optional<std::string> gnu_build_id(std::span<const std::uint8_t> notes) {
  std::size_t off = 0;
  while (notes.size() - off >= 12) {
    const std::uint64_t namesz = u32_at(notes, off), descsz = u32_at(notes, off + 4);
    const std::uint32_t type = u32_at(notes, off + 8);
    const std::uint64_t name_at = off + 12, desc_at = name_at + align4(namesz);
    if (namesz > notes.size() || descsz > notes.size() || desc_at > notes.size() ||
        align4(descsz) > notes.size() - desc_at)
      return std::nullopt;  // a note that runs past the section: malformed
    if (type == kNtGnuBuildId && namesz == 4 && std::memcmp(notes.data() + name_at, "GNU", 4) == 0) {
      if (descsz == 0 || descsz > kMaxBuildIdBytes) return std::nullopt;
      std::string out;
      for (std::uint64_t k = 0; k < descsz; ++k) {
        static const char kHex[] = "0123456789abcdef";
        out += kHex[notes[desc_at + k] >> 4];
        out += kHex[notes[desc_at + k] & 15];
      }
      return out;
    }
    off = desc_at + align4(descsz);
  }
  return std::nullopt;
}

std::string kernel_build(const symbols::SymbolTable& syms, const GuestRead& read) {
  auto at = [&](const char* name) -> std::optional<std::uint64_t> {
    auto s = syms.lookup(name);
    if (!s || s->size() != 1) return std::nullopt;  // absent, or ambiguous
    return s->front().address.value;
  };
  if (auto lo = at("__start_notes"), hi = at("__stop_notes"); lo && hi && *hi > *lo && *hi - *lo <= kMaxNotesBytes) {
    std::vector<std::uint8_t> notes(*hi - *lo);
    if (read(Gva{*lo}, std::as_writable_bytes(std::span(notes))))
      if (auto id = gnu_build_id(notes)) return "build-id " + *id;
  }
  if (auto b = at("linux_banner")) {
    std::vector<std::uint8_t> s(kMaxBannerBytes);
    if (read(Gva{*b}, std::as_writable_bytes(std::span(s)))) {
      auto nul = std::find(s.begin(), s.end(), 0);
      const bool printable =
          std::all_of(s.begin(), nul, [](std::uint8_t c) { return c == '\n' || (c >= 32 && c < 127); });
      if (nul != s.end() && nul != s.begin() && printable) {
        KeyedHash h;
        h.update(std::span(s.data(), static_cast<std::size_t>(nul - s.begin())));
        return "banner " + hex(h.finish());
      }
    }
  }
  return {};
}

// SipHash-2-4 (Aumasson and Bernstein), 64-bit output.
KeyedHash::KeyedHash() {
  const ProcessKey& k = process_key();
  v0_ = k.k0 ^ 0x736f6d6570736575ull;
  v1_ = k.k1 ^ 0x646f72616e646f6dull;
  v2_ = k.k0 ^ 0x6c7967656e657261ull;
  v3_ = k.k1 ^ 0x7465646279746573ull;
}

void KeyedHash::block(std::uint64_t m) {
  v3_ ^= m;
  for (int r = 0; r < 2; ++r) {
    v0_ += v1_;
    v1_ = rotl(v1_, 13) ^ v0_;
    v0_ = rotl(v0_, 32);
    v2_ += v3_;
    v3_ = rotl(v3_, 16) ^ v2_;
    v0_ += v3_;
    v3_ = rotl(v3_, 21) ^ v0_;
    v2_ += v1_;
    v1_ = rotl(v1_, 17) ^ v2_;
    v2_ = rotl(v2_, 32);
  }
  v0_ ^= m;
}

void KeyedHash::update(std::span<const std::uint8_t> bytes) {
  std::size_t k = 0;
  total_ += bytes.size();
  while (k < bytes.size() && tail_len_) {  // finish a partial word
    tail_ |= std::uint64_t{bytes[k++]} << (8 * tail_len_);
    if (++tail_len_ == 8) {
      block(tail_);
      tail_ = 0;
      tail_len_ = 0;
    }
  }
  for (; bytes.size() - k >= 8; k += 8) {
    std::uint64_t m = 0;
    std::memcpy(&m, bytes.data() + k, 8);
    block(m);
  }
  for (; k < bytes.size(); ++k) tail_ |= std::uint64_t{bytes[k]} << (8 * tail_len_++);
}

void KeyedHash::update_u64(std::uint64_t v) {
  std::uint8_t b[8];
  std::memcpy(b, &v, 8);
  update(b);
}

std::uint64_t KeyedHash::finish() const {
  KeyedHash h = *this;
  h.block(h.tail_ | ((h.total_ & 0xff) << 56));
  h.v2_ ^= 0xff;
  h.block(0);  // the 4 finalization rounds: two blocks of zero (xoring 0 changes nothing)
  h.block(0);
  return h.v0_ ^ h.v1_ ^ h.v2_ ^ h.v3_;
}

JumpIndexCache& JumpIndexCache::process() {
  static JumpIndexCache c;
  return c;
}

std::shared_ptr<const CrossBranches> JumpIndexCache::find(const BuildKey& k) {
  std::lock_guard lock(mu_);
  bool claimed = false;
  for (Entry& e : entries_) {
    if (e.key.build != k.build) continue;
    if (e.key.text_size == k.text_size && e.key.text_hash == k.text_hash && e.key.layout_hash == k.layout_hash) {
      e.used = ++clock_;
      ++counters_.reuses;
      return e.index;
    }
    claimed = true;
  }
  if (claimed && !k.build.empty()) ++counters_.mismatches;
  return nullptr;
}

void JumpIndexCache::put(const BuildKey& k, std::shared_ptr<const CrossBranches> idx) {
  std::lock_guard lock(mu_);
  ++counters_.builds;
  if (entries_.size() >= kMaxBuilds)
    entries_.erase(std::min_element(entries_.begin(), entries_.end(),
                                    [](const Entry& a, const Entry& b) { return a.used < b.used; }));
  entries_.push_back(Entry{k, std::move(idx), ++clock_});
}

std::shared_ptr<const TakenAddresses> JumpIndexCache::find_taken(const std::string& build) {
  std::lock_guard lock(mu_);
  for (const auto& [b, t] : taken_)
    if (b == build) return t;
  return nullptr;
}

void JumpIndexCache::put_taken(const std::string& build, std::shared_ptr<const TakenAddresses> t) {
  std::lock_guard lock(mu_);
  ++counters_.proofs;
  if (taken_.size() >= kMaxBuilds) taken_.erase(taken_.begin());
  taken_.emplace_back(build, std::move(t));
}

JumpIndexCache::Counters JumpIndexCache::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

void JumpIndexCache::clear() {
  std::lock_guard lock(mu_);
  entries_.clear();
  taken_.clear();
}

}  // namespace xenprobes::probe
