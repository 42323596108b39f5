// The guardian's journal: what a dead Dom0 process left in its guests, kept up to date in a
// shared memory file (memfd, MAP_SHARED) with plain stores, so a separate process — the
// guardian, xenprobes-guardian — can undo it after the owner was killed (docs/guardian.md).
//
//   offset 0                 JournalHeader (128 bytes; version 2)
//   header.domains_off       max_domains × JournalDomainRec (64 bytes)
//   header.patches_off       max_patches × JournalPatchRec  (64 bytes)
//   header.returns_off       max_returns × JournalReturnRec (48 bytes)
//
// Every record starts with a sequence word: odd while its writer changes it, even once it is
// consistent. A writer killed in the middle leaves it odd and the reader ignores it. The
// engine writes a record *before* the guest change it describes (a trap byte, a rewritten
// return address) and removes it only *after* undoing that change, so a record torn on
// either side never hides something to undo. The two counters of a domain record are single
// aligned 32-bit words written in place.
//
// A domain is named by its domid and its handle (xen_domain_handle_t): a domid is reused once
// its domain is gone, and recovery acts only on the domain whose handle the journal holds.
// Version 1 journals had no handle: this reader refuses them (a library and a guardian from
// different builds), so nothing is done to a domain it cannot tell from its successor.
//
// The reader treats the file as hostile input: every size, offset, count and field is
// checked; a journal that fails the header checks is refused as a whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "hv/hypervisor.hpp"
#include "xenprobes/types.hpp"

namespace xenprobes::guardian {

inline constexpr std::uint64_t kJournalMagic = 0x314c4e524a505830ull;  // "0XPJRNL1" little-endian
inline constexpr std::uint32_t kJournalVersion = 2;
inline constexpr std::size_t kJournalMaxBytes = std::size_t{8} * 4096;  // bytes of one patch (written / restore)
inline constexpr std::uint32_t kJournalMaxRecords = 1u << 20;           // per table, for the reader's checks

enum class JournalChannel : std::uint8_t { Debugger = 1, VmEvent = 2 };
enum class JournalMonitor : std::uint8_t { None = 0, DebugExceptions = 1, SoftwareBreakpoints = 2 };
enum class PatchKind : std::uint8_t {
  Text = 1,        // a trap byte over a kernel instruction; restore = the original byte
  SlotTrap = 2,    // the trap after a slot's copy; restore = a jmp to `resume`
  Trampoline = 3,  // the return trampoline's trap; never rewritten, used to move vCPUs
};

struct JournalHeader {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t header_size;
  std::uint32_t owner_pid;
  std::uint32_t clean;  // 1: the owner tore down in order, nothing is left to undo
  std::uint32_t max_domains, max_patches, max_returns;
  std::uint32_t domain_size, patch_size, return_size;
  std::uint64_t domains_off, patches_off, returns_off;
  std::uint64_t total_size;
  std::uint32_t refused;  // records that did not fit (their registration was refused)
  std::uint8_t reserved[44];
};
static_assert(sizeof(JournalHeader) == 128);

struct JournalDomainRec {
  std::uint32_t seq;
  std::uint32_t used;  // 1: in use
  std::uint32_t domid;
  std::uint8_t channel;  // JournalChannel
  std::uint8_t trap_byte;
  std::uint8_t monitor;  // JournalMonitor (vmevent)
  std::uint8_t pad0;
  std::uint32_t vcpus;
  // Written in place, not under seq:
  std::uint32_t held_pauses;    // pauses the process holds on the domain itself (0..255)
  std::uint32_t owed_unpauses;  // debugger channel: stops resumed whose pause is not released yet
  std::uint8_t handle[16];      // the domain's xen_domain_handle_t
  std::uint8_t reserved[20];
};
static_assert(sizeof(JournalDomainRec) == 64);

struct JournalPatchRec {
  std::uint32_t seq;
  std::uint32_t used;
  std::uint32_t domid;
  std::uint8_t kind;  // PatchKind
  std::uint8_t len;   // bytes of written[] and restore[] in use, 1..8
  std::uint8_t pad0[2];
  std::uint64_t gva;
  std::uint64_t resume;  // where a vCPU stopped on this trap goes on (Text: gva itself)
  std::uint8_t written[8];
  std::uint8_t restore[8];
  // A patch in a loaded module's text (Text only; 0 for the core kernel): its struct module and
  // what makes it that module (JournalModule). Zero in records of older writers.
  std::uint64_t module;
  std::uint32_t module_hash;
  std::uint16_t module_name_off, module_base_off;
};
static_assert(sizeof(JournalPatchRec) == 64);

// The module whose text a patch is in, as the guardian can check it without the guest's BTF or
// symbols: the struct module's address, where its name (char[], NUL-terminated, at most 56
// bytes) and its text base (a pointer) are inside it, and a hash of both (module_hash). A module
// unloaded since, and another loaded in its place, fails the check: recovery then leaves the
// patch alone rather than write into text that is no longer what was patched.
struct JournalModule {
  Gva address;
  std::uint32_t hash = 0;
  std::uint16_t name_off = 0, base_off = 0;
  bool operator==(const JournalModule&) const = default;
};
inline constexpr std::size_t kJournalModuleNameMax = 56;  // MODULE_NAME_LEN on 64-bit
// xenprobes_module_id() (protocol.h): FNV-1a (32 bits) over the name's bytes (without its NUL)
// and the text base's 8 bytes, little-endian, never 0; the guest module's identity of a module.
std::uint32_t module_hash(std::string_view name, std::uint64_t text_base);
// A reference the guardian can act on: a struct module in the kernel's half, the name and the
// base pointer inside its first 64 KiB and not overlapping. The writer and the reader insist on it.
bool module_reference_ok(const JournalModule&);

struct JournalReturnRec {
  std::uint32_t seq;
  std::uint32_t used;
  std::uint32_t domid;
  std::uint32_t pad0;
  std::uint64_t slot;  // the stack slot holding the trampoline address
  std::uint64_t ret;   // the real return address it held
  std::uint64_t trampoline;
  std::uint64_t reserved;
};
static_assert(sizeof(JournalReturnRec) == 48);

struct JournalLimits {
  std::uint32_t domains = 64;
  std::uint32_t patches = 16384;
  std::uint32_t returns = 16384;
};

// The writer, in the process that patches the guests. Not thread-safe (the engine is not).
class Journal {
 public:
  // A memfd of the right size, sealed against resizing, mapped shared, with an empty journal
  // in it.
  static Result<std::unique_ptr<Journal>> create(JournalLimits = {});
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  int fd() const { return fd_; }
  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(base_), size_}; }
  // For tests of the reader: the raw mapping.
  std::span<std::byte> raw() { return {static_cast<std::byte*>(base_), size_}; }

  void set_clean(bool);
  bool empty() const;  // no record in use

  [[nodiscard]] Result<void> add_domain(DomId, const hv::DomainHandle&, JournalChannel, std::uint8_t trap_byte,
                                        JournalMonitor, unsigned vcpus);
  bool has_domain(DomId d) const { return domains_.contains(d.value); }
  void remove_domain(DomId);  // with every patch and return of the domain
  // One pause more (recorded before the pause is asked for) or one fewer (after it was
  // released) that the process holds on the domain itself: the engine's, the channel's, and
  // any whose release failed, which the guardian then releases.
  void add_held_pause(DomId);
  void drop_held_pause(DomId);
  void set_owed_unpauses(DomId, unsigned owed);

  // Adds (or replaces) the record of a patch at gva. `written` and `restore` are 1..8 bytes
  // of the same length.
  // `module`: the module whose text holds a Text patch (none: the core kernel's text).
  [[nodiscard]] Result<void> add_patch(DomId, PatchKind, Gva, std::span<const std::uint8_t> written,
                                       std::span<const std::uint8_t> restore, Gva resume,
                                       const std::optional<JournalModule>& module = std::nullopt);
  void remove_patch(DomId, Gva);
  bool has_patch(DomId d, Gva a) const { return patches_.contains({d.value, a.value}); }

  // The hit path: no allocation, no system call. Returns the record's index for remove_return.
  [[nodiscard]] Result<std::uint32_t> add_return(DomId, Gva slot, std::uint64_t ret, Gva trampoline);
  void remove_return(std::uint32_t index);

 private:
  Journal(int fd, void* base, std::size_t size) : fd_(fd), base_(base), size_(size) {}
  JournalHeader& header() const { return *static_cast<JournalHeader*>(base_); }
  JournalDomainRec* dom_rec(std::uint32_t i) const;
  JournalPatchRec* patch_rec(std::uint32_t i) const;
  JournalReturnRec* ret_rec(std::uint32_t i) const;
  std::uint32_t domain_index(DomId) const;  // ~0u if absent
  static std::uint32_t id(DomId d) { return d.value; }
  void refuse();

  int fd_ = -1;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  std::map<std::uint32_t, std::uint32_t> domains_;                            // domid -> record
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint32_t> patches_;  // (domid, gva) -> record
  std::vector<std::uint32_t> free_domains_, free_patches_, free_returns_;
};

// What the reader found. Only consistent records of known kinds are listed.
struct JournalSnapshot {
  std::uint32_t owner_pid = 0;
  bool clean = false;
  std::uint32_t refused = 0;
  struct Domain {
    DomId domid;
    hv::DomainHandle handle{};
    JournalChannel channel;
    std::uint8_t trap_byte = 0;
    JournalMonitor monitor = JournalMonitor::None;
    unsigned vcpus = 0;
    unsigned held_pauses = 0;
    unsigned owed_unpauses = 0;
  };
  struct Patch {
    DomId domid;
    PatchKind kind;
    Gva gva;
    Gva resume;
    std::vector<std::uint8_t> written, restore;
    std::optional<JournalModule> module{};  // Text in a module's text
  };
  struct Return {
    DomId domid;
    Gva slot;
    std::uint64_t ret = 0;
    Gva trampoline;
  };
  std::vector<Domain> domains;
  std::vector<Patch> patches;
  std::vector<Return> returns;
  unsigned torn = 0;     // records caught in the middle of an update: ignored
  unsigned invalid = 0;  // records with impossible contents: ignored
};

// Validates and reads a journal image (a copy: the reader never keeps pointers into it).
[[nodiscard]] Result<JournalSnapshot> read_journal(std::span<const std::byte>);
// What the guardian was handed as its journal is one: a memfd (a regular file that takes
// seals) sealed against shrinking, growing and further seals, so that its size is the one
// the writer gave it, opened for reading.
[[nodiscard]] Result<void> check_journal_fd(int fd);
// check_journal_fd, then maps the file read-only (its size from fstat) and reads it.
[[nodiscard]] Result<JournalSnapshot> read_journal_fd(int fd);

}  // namespace xenprobes::guardian
