// The jump probes' index per kernel build (probe/jump_index.hpp): the guest's claimed build,
// the keyed hash that checks it, and the process's cache.
#include "probe/jump_index.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

#include "common/hex.hpp"
#include "common/log.hpp"

namespace xenprobes::probe {

namespace {

constexpr std::uint32_t kNtGnuBuildId = 3;  // elf.h NT_GNU_BUILD_ID

std::uint32_t u32_at(std::span<const std::uint8_t> b, std::size_t off) {
  std::uint32_t v = 0;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}

std::uint64_t align4(std::uint64_t v) { return (v + 3) & ~std::uint64_t{3}; }

constexpr std::size_t kSipKeyBytes = 16, kSipTagBytes = 8;

// What OpenSSL last said went wrong on this thread, its queue emptied.
std::string openssl_error() {
  std::string why;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    why += why.empty() ? "" : "; ";
    why += buf;
  }
  return why.empty() ? std::string("no reason given") : why;
}

// A SipHash-2-4 context with a 64-bit tag under `key`, ready for its message; null on failure.
EVP_MAC_CTX* sip_context(EVP_MAC* mac, const unsigned char* key) {
  if (!mac) return nullptr;
  EVP_MAC_CTX* c = EVP_MAC_CTX_new(mac);
  std::size_t size = kSipTagBytes;
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size), OSSL_PARAM_construct_end()};
  if (c && EVP_MAC_init(c, key, kSipKeyBytes, params) == 1 && EVP_MAC_CTX_get_mac_size(c) == kSipTagBytes) return c;
  EVP_MAC_CTX_free(c);
  return nullptr;
}

// OpenSSL's SipHash, fetched once per process, and a context under the process's key that every
// KeyedHash() starts as a copy of (the key itself is wiped once it is in there). When either
// cannot be had, the reason is logged here, once, and no KeyedHash() hashes.
struct ProcessMac {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* keyed = nullptr;
  ProcessMac() {
    mac = EVP_MAC_fetch(nullptr, "SIPHASH", nullptr);
    unsigned char key[kSipKeyBytes];
    const bool random = mac && RAND_bytes(key, sizeof key) == 1;
    keyed = random ? sip_context(mac, key) : nullptr;
    OPENSSL_cleanse(key, sizeof key);
    if (!keyed)
      XP_LOG(Warn,
             "jump probes: no keyed hash (%s: %s): a kernel build's index of branches between functions is decoded for "
             "every domain, never reused",
             !mac      ? "OpenSSL has no SIPHASH"
             : !random ? "OpenSSL gave no random key"
                       : "OpenSSL's SIPHASH would not start",
             openssl_error().c_str());
  }
  ~ProcessMac() {
    EVP_MAC_CTX_free(keyed);
    EVP_MAC_free(mac);
  }
  ProcessMac(const ProcessMac&) = delete;
  ProcessMac& operator=(const ProcessMac&) = delete;
};

const ProcessMac& process_mac() {
  static const ProcessMac m;
  return m;
}

// A copy of `c` (null for null, or when OpenSSL cannot copy it).
EVP_MAC_CTX* dup_or_null(const EVP_MAC_CTX* c) {
  EVP_MAC_CTX* d = c ? EVP_MAC_CTX_dup(c) : nullptr;
  if (c && !d) ERR_clear_error();
  return d;
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
        if (auto tag = h.finish()) return "banner " + hex(*tag);
      }
    }
  }
  return {};
}

void KeyedHash::Free::operator()(evp_mac_ctx_st* c) const { EVP_MAC_CTX_free(c); }

KeyedHash::KeyedHash() : ctx_(dup_or_null(process_mac().keyed)) {}

KeyedHash::KeyedHash(std::span<const std::uint8_t, 16> key) : ctx_(sip_context(process_mac().mac, key.data())) {
  if (!ctx_) ERR_clear_error();
}

KeyedHash::KeyedHash(const KeyedHash& o) : ctx_(dup_or_null(o.ctx_.get())) {}

KeyedHash& KeyedHash::operator=(const KeyedHash& o) {
  if (this != &o) ctx_.reset(dup_or_null(o.ctx_.get()));
  return *this;
}

void KeyedHash::update(std::span<const std::uint8_t> bytes) {
  if (ctx_ && EVP_MAC_update(ctx_.get(), bytes.data(), bytes.size()) != 1) {
    ctx_.reset();
    ERR_clear_error();
  }
}

void KeyedHash::update_u64(std::uint64_t v) {
  std::uint8_t b[8];
  for (unsigned k = 0; k < 8; ++k) b[k] = static_cast<std::uint8_t>(v >> (8 * k));
  update(b);
}

std::optional<std::uint64_t> KeyedHash::finish() const {
  // On a copy: this one can take more bytes after.
  const std::unique_ptr<evp_mac_ctx_st, Free> c(dup_or_null(ctx_.get()));
  unsigned char tag[kSipTagBytes];
  std::size_t n = 0;
  if (!c || EVP_MAC_final(c.get(), tag, &n, sizeof tag) != 1 || n != sizeof tag) {
    ERR_clear_error();
    return std::nullopt;
  }
  std::uint64_t v = 0;
  for (unsigned k = 0; k < sizeof tag; ++k) v |= std::uint64_t{tag[k]} << (8 * k);
  return v;
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
