// What jump probes know of a whole kernel build, kept once per build per process
// (docs/probes.md "Jump probes", "The index per kernel build"): the branches from one function
// of the core text into the middle of another, found by decoding every function (seconds; tens
// of seconds in a Dom0 under emulation). A second domain running the same build, or a second
// session of the same process, takes them from here instead of decoding again.
//
// What the index depends on: the relative branches of the decoded core text, so the text
// itself, as each guest runs it. A guest's build id says which build it claims to run; it is
// guest data, so an index is reused only when a keyed hash of the domain's whole core text
// (read as the guest runs it now, with the sites the kernel rewrites while it runs masked) and
// of its function table equal the ones the index was decoded from. What is masked, and why it
// cannot hide a branch the index would miss, is said at mask_runtime_sites() in jump_index.cpp.
// Everything is stored as offsets from the core text's start (_stext), so two KASLR slides of
// one build share it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/parallel.hpp"
#include "common/result.hpp"
#include "kernel/addresses_taken.hpp"
#include "guestmod/module_info.hpp"
#include "kernel/tables.hpp"
#include "symbols/symbol_table.hpp"
#include "xenprobes/types.hpp"

struct evp_mac_ctx_st;  // OpenSSL's EVP_MAC_CTX (jump_index.cpp includes OpenSSL)

namespace xenprobes::probe {

// Reads guest memory (the domain's, as the engine reads it).
using GuestRead = std::function<Result<void>(Gva, std::span<std::byte>)>;

// At most this many bytes between __start_notes and __stop_notes are read (Debian's 6.1 has a
// few hundred: the build id and Xen's ELF notes); a longer span is a lie.
inline constexpr std::uint64_t kMaxNotesBytes = std::uint64_t{16} * 1024;
inline constexpr std::size_t kMaxBuildIdBytes = 64;  // GNU build ids: 16 (md5), 20 (sha1)
inline constexpr std::size_t kMaxBannerBytes = 512;

// The GNU build id (NT_GNU_BUILD_ID, owner "GNU") in an ELF note section, as hex; nullopt when
// there is none or the notes are malformed (every size bounded by `notes`).
std::optional<std::string> gnu_build_id(std::span<const std::uint8_t> notes);

// Which build the guest says it runs, from its memory: "build-id <hex>" from the notes the
// kernel keeps mapped (__start_notes ... __stop_notes), else "banner <hash>" of linux_banner
// (printable, NUL-terminated within kMaxBannerBytes), else "" (then only the text hash keys
// the index). Hostile input: bounded and validated; a claim is never trusted on its own.
std::string kernel_build(const symbols::SymbolTable& syms, const GuestRead& read);

// SipHash-2-4 with a 64-bit output, OpenSSL's (EVP_MAC "SIPHASH"), under a key drawn once per
// process from OpenSSL's random generator and never shown: a guest cannot make its text hash
// like another's without knowing the key. finish() is nullopt when OpenSSL could not hash (no
// SIPHASH in the library, no randomness, no memory): what was hashed then matches nothing (the
// process's key failing is logged once). Copies are independent (EVP_MAC_CTX_dup).
class KeyedHash {
 public:
  KeyedHash();
  // Under this key instead of the process's: for the tests (SipHash's published vectors).
  explicit KeyedHash(std::span<const std::uint8_t, 16> key);
  KeyedHash(const KeyedHash&);
  KeyedHash& operator=(const KeyedHash&);
  KeyedHash(KeyedHash&&) noexcept = default;
  KeyedHash& operator=(KeyedHash&&) noexcept = default;
  ~KeyedHash() = default;

  void update(std::span<const std::uint8_t> bytes);
  void update_u64(std::uint64_t v);             // its 8 bytes, least significant first
  std::optional<std::uint64_t> finish() const;  // the tag's 8 bytes, least significant first

 private:
  struct Free {
    void operator()(evp_mac_ctx_st* c) const;
  };
  std::unique_ptr<evp_mac_ctx_st, Free> ctx_;  // null once anything failed
};

// The cross-function branches of one build, slide-independent.
struct CrossBranches {
  struct Branch {
    std::uint64_t to = 0, from = 0;  // offsets from the core text's start
    std::uint32_t fn = 0;            // index into names: the function the branch is in
  };
  std::vector<std::string> names;
  std::vector<Branch> branches;
  std::size_t unknown = 0;       // functions that did not decode: their branches are not known
  std::string build;             // kernel_build() of the domain it was decoded from
  std::uint32_t decoded_in = 0;  // that domain (for the log)
  double seconds = 0;            // what decoding took
};

// ---- Jump probes in a loaded module's text (probe/engine_jump_module.cpp).

// Why a jump at `region` could not reach a detour in one of `areas` (the guest module's slot
// areas) with rel32 jumps both ways (region -> slot, slot -> the region's end), naming the
// first such area; nullopt when every slot of every area is in reach.
std::optional<std::string> detour_out_of_reach(std::span<const guestmod::OeaArea> areas, Gva region_start,
                                               Gva region_end, std::uint64_t slot_size);

// ---- Building it (probe/jump_index_decode.cpp).

// The unit in which text that cannot be read is left out of an index: `unread` in
// decode_cross_branches() has one flag per page of this size.
inline constexpr std::uint64_t kPage = 4096;

// An index is decoded on at most kMaxIndexThreads threads, and on no more than one per
// kMinIndexFunctionsPerThread functions.
inline constexpr unsigned kMaxIndexThreads = kMaxWorkerThreads;
inline constexpr std::size_t kMinIndexFunctionsPerThread = 512;

// The functions of the core text an index decodes: the function (SymbolTable::function_containing)
// of every text symbol inside `core_text` that starts at that symbol, in address order, once
// each.
std::vector<symbols::Function> index_functions(const symbols::SymbolTable& syms, const kernel::Range& core_text);

// How many threads decode `functions` functions: min(the hardware's threads, kMaxIndexThreads),
// fewer when there are few functions, at least 1.
unsigned index_threads(std::size_t functions);

// Decodes every function of `fns` (index_functions(), in address order) out of the core text
// `text` (its first byte at `base`; unread[p] when its page p could not be read) with
// x86::relative_branches() for its branches into the middle of another function of the core
// text, and adds them to out.names and out.branches (in function order, then address order);
// a function that does not decode, or lies on an unread page, is counted in out.unknown (an
// empty one, or one larger than the engine's limit of 256 KiB, is left out). On up to
// `threads` threads, each over its own contiguous range of `fns`, merged in function order:
// the index is the same whatever `threads`. An exception of a thread (memory) is rethrown
// here, after every thread ended.
void decode_cross_branches(std::span<const std::uint8_t> text, std::uint64_t base, const std::vector<bool>& unread,
                           std::span<const symbols::Function> fns, unsigned threads, CrossBranches& out);

// The code addresses a kernel image forms inside its core text's functions
// (kernel/addresses_taken.hpp), at its link addresses, for a build: the tail-call proof.
struct TakenAddresses {
  std::uint64_t core_start = 0;  // the image's _stext: a domain's addresses are these + (its _stext − this)
  std::vector<kernel::TakenAddress> taken;
  double seconds = 0;  // what finding them took
};

// What an index is looked up by: the build the guest claims, and what the domain's own text
// and function table hash to (the check that makes the claim irrelevant to safety).
struct BuildKey {
  std::string build;
  std::uint64_t text_size = 0;
  std::uint64_t text_hash = 0;    // KeyedHash of the core text, runtime sites masked
  std::uint64_t layout_hash = 0;  // KeyedHash of the functions (offset, size, name)
};

class JumpIndexCache {
 public:
  static constexpr std::size_t kMaxBuilds = 8;  // least recently used first out
  static JumpIndexCache& process();

  // The index of exactly this text; counts a reuse, or a mismatch when an index of the same
  // claimed build exists for other text (a guest that lies, or runs changed text).
  std::shared_ptr<const CrossBranches> find(const BuildKey&);
  void put(const BuildKey&, std::shared_ptr<const CrossBranches>);  // counts a build

  // The addresses taken of a build's image (its build id), once per build too.
  std::shared_ptr<const TakenAddresses> find_taken(const std::string& build);
  void put_taken(const std::string& build, std::shared_ptr<const TakenAddresses>);  // counts a proof

  struct Counters {
    std::uint64_t proofs = 0;      // images read for their addresses taken
    std::uint64_t builds = 0;      // indexes decoded and kept
    std::uint64_t reuses = 0;      // found for a domain
    std::uint64_t mismatches = 0;  // a build claimed, its text not the one indexed
  };
  Counters counters() const;
  void clear();  // tests

 private:
  struct Entry {
    BuildKey key;
    std::shared_ptr<const CrossBranches> index;
    std::uint64_t used = 0;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, std::shared_ptr<const TakenAddresses>>> taken_;  // oldest first
  std::uint64_t clock_ = 0;
  Counters counters_;
};

}  // namespace xenprobes::probe
