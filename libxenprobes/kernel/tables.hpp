// The guest kernel's own tables, read from its memory: which addresses the kernel itself
// rewrites at run time (jump labels, static calls, SMP lock prefixes), which instructions it
// expects to fault (the exception table), and which ranges its own int3 path and entry code
// occupy (the section bounds, the kprobe blacklist). The address rules (address_rules.hpp)
// consult this index at every registration.
//
// Trust. Everything here comes from a guest that may be hostile or simply another kernel
// version: table bounds come from the symbols (also hostile), every size is bounded, every
// decoded address must fall inside the kernel's text (or its freed init text, counted apart),
// nothing is assumed sorted, and a linked list is walked with a bound and a cycle check.
// Where a table cannot be read, the table says so (TableStatus) and the rules fall back to
// their strictest form for it.
//
// Layouts are Linux's on x86-64 (v5.18 to at least v6.12), relative offsets as in
// arch/x86/include/asm/extable.h, jump_label.h (CONFIG_HAVE_ARCH_JUMP_LABEL_RELATIVE),
// include/linux/static_call_types.h, arch/x86/include/asm/alternative.h (LOCK_PREFIX) and
// kernel/kprobes.c (struct kprobe_blacklist_entry).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "symbols/symbol_table.hpp"
#include "xenprobes/types.hpp"

namespace xenprobes::kernel {

// A half-open address range [start, end).
struct Range {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  bool contains(std::uint64_t a) const { return a >= start && a < end; }
  bool overlaps(std::uint64_t lo, std::uint64_t hi) const { return lo < end && hi > start; }
  bool empty() const { return end <= start; }
  bool operator==(const Range&) const = default;
};

// Bounds on what is read from a guest (a distribution 6.1 kernel has ~8k exception entries,
// ~30k jump entries, ~12k static-call sites, ~40k lock sites, ~1.5k blacklist entries).
struct Limits {
  std::size_t max_entries = 1u << 20;         // per table
  std::size_t max_blacklist = 1u << 16;       // kprobe_blacklist list nodes
  std::size_t chunk_bytes = 64u << 10;        // one guest read
  std::size_t max_modules = 4096;             // loaded-module list nodes (a distribution has ~100)
  std::size_t max_module_entries = 1u << 21;  // the loaded modules' table entries, all together
};

// One exception-table entry: the instruction that may fault, where the fault goes, and the
// handler type and its data (data & 0xff is the EX_TYPE_*).
struct ExEntry {
  std::uint64_t insn = 0;
  std::uint64_t fixup = 0;
  std::int32_t data = 0;
  unsigned type() const { return static_cast<std::uint32_t>(data) & 0xffu; }
};

// A run-time-patched site: its first byte and the key that flips it; for a jump label also
// the target its `jmp` goes to while the key says so (a nop in the text until then, so a
// decoder of the text alone does not see that branch).
struct Site {
  std::uint64_t addr = 0;
  std::uint64_t key = 0;
  std::uint64_t target = 0;  // jump labels; 0 for static calls
};

struct TableStatus {
  const char* name = "";         // "__ex_table", "__jump_table", ...
  bool found = false;            // its bounds were in the symbols and it could be read
  std::size_t entries = 0;       // kept
  std::size_t init_entries = 0;  // pointing into freed init text: dropped
  std::size_t invalid = 0;       // pointing outside the kernel's text: dropped
  bool freed = false;            // found: its memory is unmapped because the kernel freed it (.smp_locks)
  std::string why;               // when !found: what was missing or wrong (or a note when found)
};

// Reads `out.size()` bytes of guest memory at `addr`.
using ReadFn = std::function<Result<void>(Gva addr, std::span<std::byte> out)>;

// Linux's table entries, decoded from their raw bytes: the same formats in the core kernel's
// sections and in each module's (struct module's extable, jump_entries, static_call_sites).
// `base` is the guest address of raw[0] (offsets are relative to each field); `keep` decides
// for each decoded address whether the entry is kept (it counts what it drops).
namespace entries {
inline constexpr std::size_t kExSize = 12, kJumpSize = 16, kStaticCallSize = 8, kLockSize = 4;
using KeepFn = std::function<bool(std::uint64_t addr)>;
void decode_ex(std::uint64_t base, std::span<const std::byte> raw, const KeepFn& keep, std::vector<ExEntry>& out);
void decode_jumps(std::uint64_t base, std::span<const std::byte> raw, const KeepFn& keep, std::vector<Site>& out);
void decode_static_calls(std::uint64_t base, std::span<const std::byte> raw, const KeepFn& keep,
                         std::vector<Site>& out);
// Where a decoded address may point: `text` (kept), `init` (freed after init: dropped, counted
// in init_entries), anything else (a corrupt or hostile entry: dropped, counted in invalid).
KeepFn classifier(Range text, Range init, TableStatus& st);
// `bytes` of guest memory at `addr` in reads of at most limits.chunk_bytes; on failure
// nullopt and st.why says where.
std::optional<std::vector<std::byte>> read_bytes(const ReadFn& read, std::uint64_t addr, std::uint64_t bytes,
                                                 const Limits& limits, TableStatus& st);
}  // namespace entries

class ModuleTables;
struct Module;

class KernelTables {
 public:
  KernelTables() = default;

  // Reads every table it can; never fails as a whole (a table it cannot read is marked so).
  static KernelTables read(const symbols::SymbolTable& syms, const ReadFn& read, const Limits& limits = {});

  // The kernel's text, [_stext, _etext); empty if unknown.
  const Range& core_text() const { return text_; }
  const Range& init_text() const { return init_text_; }
  // .entry.text, .noinstr.text and .kprobes.text; nullopt when their bounds are unknown.
  const std::optional<Range>& entry_text() const { return entry_; }
  const std::optional<Range>& noinstr_text() const { return noinstr_; }
  const std::optional<Range>& kprobes_text() const { return kprobes_; }

  // The loaded modules (modules.hpp): null until refresh_modules() ran. A live module's core
  // text whose tables were read counts as kernel text; the lookups below answer for it too.
  const ModuleTables* modules() const { return modules_.get(); }
  // The live, readable module whose core text holds `addr`, or null. O(log n).
  const Module* live_module_at(std::uint64_t addr) const;
  // Re-reads the module list when it may have changed since the last walk (modules.hpp,
  // ModuleTables::changed: the list head's two pointers and each live module's state and
  // links); the first call also reads the guest's BTF for struct module's layout. Returns
  // whether it walked the list (never again once the BTF gave no layout: no module can be
  // read). Call it after read() and whenever the modules matter (probe/engine_modules.cpp).
  bool refresh_modules(const symbols::SymbolTable& syms, const ReadFn& read, const Limits& limits = {});
  // For tests: modules read elsewhere.
  void set_modules(ModuleTables m);

  // The entry covering exactly this instruction address (faults report the instruction's
  // own address), or null. O(log n), over the core kernel's or the holding module's table.
  const ExEntry* exception_entry(std::uint64_t insn) const;
  // The first entry whose instruction lies in [lo, hi), or null.
  const ExEntry* exception_entry_in(std::uint64_t lo, std::uint64_t hi) const;
  // A jump-label or static-call site whose `site_len` bytes overlap [lo, hi), or null.
  const Site* jump_label_in(std::uint64_t lo, std::uint64_t hi) const;
  const Site* static_call_in(std::uint64_t lo, std::uint64_t hi) const;
  // A lock prefix recorded in .smp_locks inside [lo, hi), or nullopt.
  std::optional<std::uint64_t> smp_lock_in(std::uint64_t lo, std::uint64_t hi) const;
  // A kprobe_blacklist range holding `addr`, or null. The kernel adds each module's NOKPROBE
  // functions and .kprobes.text to the same list: ranges in a live module's text count too.
  const Range* blacklisted(std::uint64_t addr) const;

  const TableStatus& ex_status() const { return ex_status_; }
  const TableStatus& jump_status() const { return jump_status_; }
  const TableStatus& static_call_status() const { return sc_status_; }
  const TableStatus& smp_locks_status() const { return locks_status_; }
  const TableStatus& blacklist_status() const { return bl_status_; }
  // "__ex_table 812 entries, __jump_table …": for logs and the doctor.
  std::string summary() const;

  // Bytes of a jump-label site (jmp rel32 / nop5) and of a static-call site (call/jmp rel32).
  static constexpr std::uint64_t kJumpSiteLen = 5;
  static constexpr std::uint64_t kStaticCallSiteLen = 5;

  // For tests: tables built directly.
  static KernelTables from_parts(Range text, std::vector<ExEntry> ex, std::vector<Site> jumps, std::vector<Site> calls,
                                 std::vector<std::uint64_t> locks, std::vector<Range> blacklist);

 private:
  void index();
  void read_blacklist(const symbols::SymbolTable& syms, const ReadFn& read, const Limits& limits);
  void merge_blacklist();
  static const Site* site_in(const std::vector<Site>& v, std::uint64_t len, std::uint64_t lo, std::uint64_t hi);

  Range text_, init_text_;
  std::optional<Range> entry_, noinstr_, kprobes_;
  std::vector<ExEntry> ex_;           // sorted by insn
  std::vector<Site> jumps_, calls_;   // sorted by addr
  std::vector<std::uint64_t> locks_;  // sorted
  std::vector<Range> blacklist_;      // sorted by start, merged
  std::vector<Range> bl_outside_;     // plausible ranges outside the core text (module candidates)
  std::vector<Range> module_bl_;      // those inside a live module's text: sorted, merged
  std::shared_ptr<const ModuleTables> modules_;
  // struct module's layout from the guest's BTF, read once (modules.hpp).
  struct LayoutCache;
  std::shared_ptr<const LayoutCache> layout_;
  static TableStatus named(const char* n) {
    TableStatus s;
    s.name = n;
    return s;
  }
  TableStatus ex_status_ = named("__ex_table"), jump_status_ = named("__jump_table"),
              sc_status_ = named(".static_call_sites"), locks_status_ = named(".smp_locks"),
              bl_status_ = named("kprobe_blacklist");
};

}  // namespace xenprobes::kernel
