// The one way a byte of guest code changes. A patch is applied in the order the guest's
// safety needs: the guest's bytes are checked, the channel's trap table learns the trap (so
// that a vCPU reaching it is understood; a channel without one has nothing to learn), the
// guardian's journal records the patch (so that a process killed from here on is recovered),
// and only then are the bytes written. A step that fails undoes the steps before it, in
// reverse; so does dropping a Patch that was not committed.
//
// A committed patch is taken down in two phases, because a vCPU may already be stopped on
// the trap when it is removed: restore() puts the old bytes back (only over our own bytes),
// and forget() drops the journal record and the channel's entry once no vCPU can be stopped
// on it any more (after the channel's flush); the channel is then told the trap is forgotten
// (Channel::trap_forgotten), table or not. The caller holds the domain paused throughout.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "channel/channel.hpp"
#include "mem/guest_memory.hpp"
#include "guardian/journal.hpp"
#include "kernel/modules.hpp"
#include "xenprobes/result.hpp"
#include "xenprobes/types.hpp"

namespace xenprobes::probe {

using guardian::Journal;  // the guardian's journal records every patch (guardian/journal.hpp)
using guardian::PatchKind;

struct PatchSpec {
  Gva at;
  std::vector<std::uint8_t> bytes;         // written at `at`
  std::vector<std::uint8_t> expect;        // what `at` must hold before (empty: anything, e.g. a fresh slot)
  std::optional<channel::TrapEntry> trap;  // added to the channel's trap table first
  // The guardian's record: what it restores at `at` if the process dies (1..8 bytes).
  struct Record {
    PatchKind kind;
    Gva at;
    std::vector<std::uint8_t> written;
    std::vector<std::uint8_t> restore;
    Gva resume;
    std::optional<guardian::JournalModule> module{};  // a Text patch in a module's text
  };
  std::optional<Record> journal;  // ignored when the domain is not journaled
  std::function<void()> on_undo;  // the undo's last step (e.g. the slot goes back to its pool)
};

class Patch {
 public:
  enum class State { None, Applied, Restored };

  Patch() = default;
  Patch(Patch&& o) noexcept;
  Patch& operator=(Patch&& o) noexcept;
  Patch(const Patch&) = delete;
  Patch& operator=(const Patch&) = delete;
  ~Patch();  // applied and not committed: undone (failures logged)

  State state() const { return state_; }
  Gva at() const { return spec_.at; }
  bool committed() const { return committed_; }
  // Keeps the patch when the handle goes: from now on only restore() and forget() remove it.
  void commit() { committed_ = true; }
  // Every step, in reverse: the bytes (only over ours), the journal record, the trap entry,
  // on_undo. The patch is then gone.
  Result<void> undo();
  // Phase one of a removal: the old bytes go back if the guest still holds ours. Returns
  // false (nothing written) when it holds something else: the guest rewrote it.
  Result<bool> restore();
  // Phase two: the journal record and the channel's entry go. The patch is then gone.
  void forget();
  // A restored patch applied again: the bytes are checked and written again; the channel's
  // entry (which it still has) is replaced by `trap` when given.
  Result<void> reapply(std::optional<channel::TrapEntry> trap = std::nullopt);
  // The channel's entry for a patch it knows changes (e.g. its fallback moves to a new slot).
  Result<void> update_trap(const channel::TrapEntry& trap);

 private:
  friend class Patcher;
  Patch(mem::GuestMemory* m, channel::Channel* ch, channel::TrapTable* table, Journal* j, DomId dom, PatchSpec spec)
      : mem_(m), ch_(ch), table_(table), journal_(j), dom_(dom), spec_(std::move(spec)) {}
  Result<void> check_expected() const;
  void drop_entries();
  Result<void> write(std::span<const std::uint8_t> bytes);  // at `at`, transient_ or not

  mem::GuestMemory* mem_ = nullptr;
  channel::Channel* ch_ = nullptr;
  channel::TrapTable* table_ = nullptr;  // null: the channel keeps no trap table
  Journal* journal_ = nullptr;           // null: not journaled
  DomId dom_{0};
  PatchSpec spec_;
  std::vector<std::uint8_t> before_;  // what `at` held before the write
  bool trap_added_ = false;           // spec_.trap is the channel's (in its table, if it has one)
  bool transient_ = false;            // `at` is in memory the guest may free and reuse (Patcher)
  bool journaled_ = false;
  bool committed_ = false;
  State state_ = State::None;
};

// The module reference the guardian checks before restoring a text patch in a loaded module's
// text (guardian::JournalModule), from the module's identity and the guest's struct module
// layout; nullopt when the layout gives the guardian nothing it can read (then the patch is
// journaled as the core kernel's, its bytes still checked before they are restored).
std::optional<guardian::JournalModule> journal_module(const kernel::ModuleLayout&, const kernel::ModuleIdentity&);

class Patcher {
 public:
  // `table` is the channel's trap table (Channel::trap_table(), null when it keeps none);
  // `journal` is null for a domain the guardian does not watch. `reused(at)` says whether the
  // guest may free the page of `at` and reuse it (a loaded module's text: the module may be
  // unloaded): a write there lets go of its writable mapping at once
  // (GuestMemory::write_transient), because on a PV guest a frame Dom0 keeps mapped writable
  // cannot become a page table, and the guest's fork or exec would fail on it. Elsewhere (the
  // core kernel's text, the module's slot areas) the mapping stays cached.
  Patcher(mem::GuestMemory& m, channel::Channel& ch, channel::TrapTable* table, Journal* journal, DomId dom,
          std::function<bool(Gva)> reused = {})
      : mem_(m), ch_(ch), table_(table), journal_(journal), dom_(dom), reused_(std::move(reused)) {}
  // Check, trap entry, journal, write; the handle undoes all of it unless committed.
  [[nodiscard]] Result<Patch> apply(PatchSpec spec);
  // A one-off write over bytes that must be `expect` (no entry, no record): e.g. a slot's
  // trap turned into a jump before the channel lets go of the domain.
  [[nodiscard]] Result<void> replace(Gva at, std::span<const std::uint8_t> expect, std::span<const std::uint8_t> bytes);

 private:
  mem::GuestMemory& mem_;
  channel::Channel& ch_;
  channel::TrapTable* table_;
  Journal* journal_;
  DomId dom_;
  std::function<bool(Gva)> reused_;
};

}  // namespace xenprobes::probe
