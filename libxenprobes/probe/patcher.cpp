#include "probe/patcher.hpp"

#include <algorithm>
#include <utility>

#include "common/hex.hpp"
#include "common/log.hpp"

namespace xenprobes::probe {
namespace {

Result<std::vector<std::uint8_t>> read_bytes(mem::GuestMemory& m, Gva at, std::size_t n) {
  std::vector<std::uint8_t> out(n);
  XP_TRY(m.read(at, std::as_writable_bytes(std::span(out))));
  return out;
}

}  // namespace

Patch::Patch(Patch&& o) noexcept
    : mem_(o.mem_),
      ch_(o.ch_),
      table_(o.table_),
      journal_(o.journal_),
      dom_(o.dom_),
      spec_(std::move(o.spec_)),
      before_(std::move(o.before_)),
      trap_added_(o.trap_added_),
      transient_(o.transient_),
      journaled_(o.journaled_),
      committed_(o.committed_),
      state_(std::exchange(o.state_, State::None)) {}

Patch& Patch::operator=(Patch&& o) noexcept {
  if (this != &o) {
    this->~Patch();
    new (this) Patch(std::move(o));
  }
  return *this;
}

Patch::~Patch() {
  if (state_ == State::None || committed_) return;
  if (auto u = undo(); !u)
    XP_LOG(Error, "domain %u: cannot undo the patch at %s: %s", dom_.value, hex(spec_.at.value).c_str(),
           u.error().what.c_str());
}

Result<void> Patch::write(std::span<const std::uint8_t> bytes) {
  return transient_ ? mem_->write_transient(spec_.at, std::as_bytes(bytes))
                    : mem_->write(spec_.at, std::as_bytes(bytes));
}

Result<void> Patch::check_expected() const {
  if (spec_.expect.empty()) return {};
  auto now = XP_TRY(read_bytes(*mem_, spec_.at, spec_.expect.size()));
  if (now != spec_.expect)
    return fail(Errc::Again, hex(spec_.at.value) + " holds " + hex_bytes(std::span(now)) + ", not the " +
                                 hex_bytes(std::span(spec_.expect)) + " it was decoded from: the guest rewrote it");
  return {};
}

void Patch::drop_entries() {
  if (journaled_) {
    journal_->remove_patch(dom_, spec_.journal->at);
    journaled_ = false;
  }
  if (trap_added_) {
    if (table_) table_->trap_removed(dom_, spec_.trap->addr);
    ch_->trap_forgotten(dom_, spec_.trap->addr);
    trap_added_ = false;
  }
}

Result<bool> Patch::restore() {
  if (state_ != State::Applied) return state_ == State::Restored;
  auto now = XP_TRY(read_bytes(*mem_, spec_.at, spec_.bytes.size()));
  bool ours = now == spec_.bytes;
  // Only over our own bytes: if the guest rewrote them, the old ones would corrupt its new code.
  if (ours) XP_TRY(write(before_));
  state_ = State::Restored;
  return ours;
}

void Patch::forget() {
  if (state_ == State::None) return;
  drop_entries();
  state_ = State::None;
}

Result<void> Patch::undo() {
  if (state_ == State::None) return {};
  Result<void> r;
  if (auto b = restore(); !b) r = std::unexpected(b.error());
  else if (!*b)
    XP_LOG(Warn, "domain %u: %s no longer holds what we wrote; left as the guest has it", dom_.value,
           hex(spec_.at.value).c_str());
  drop_entries();
  state_ = State::None;
  if (spec_.on_undo) std::exchange(spec_.on_undo, nullptr)();
  return r;
}

Result<void> Patch::reapply(std::optional<channel::TrapEntry> trap) {
  if (state_ == State::Applied) return {};
  if (state_ != State::Restored)
    return fail(Errc::InvalidArgument, "no patch at " + hex(spec_.at.value) + " to apply again");
  XP_TRY(check_expected());
  if (trap && trap_added_) {
    if (table_) XP_TRY(table_->trap_added(dom_, *trap));
    spec_.trap = trap;
  }
  XP_TRY(write(spec_.bytes));
  state_ = State::Applied;
  return {};
}

Result<void> Patch::update_trap(const channel::TrapEntry& trap) {
  if (!trap_added_) return fail(Errc::InvalidArgument, "the patch at " + hex(spec_.at.value) + " has no trap entry");
  if (table_) XP_TRY(table_->trap_added(dom_, trap));
  spec_.trap = trap;
  return {};
}

Result<Patch> Patcher::apply(PatchSpec spec) {
  if (spec.bytes.empty()) return fail(Errc::InvalidArgument, "an empty patch");
  if (!spec.expect.empty() && spec.expect.size() < spec.bytes.size())
    return fail(Errc::InvalidArgument, "a patch checks fewer bytes than it writes");
  Patch p(&mem_, &ch_, table_, journal_, dom_, std::move(spec));
  p.transient_ = reused_ && reused_(p.spec_.at);
  // From here on the handle undoes what was done (nothing written yet: Restored writes nothing,
  // but on_undo runs).
  p.state_ = Patch::State::Restored;
  // Nothing is written over bytes we have not checked (or, for a fresh slot, read to put back).
  XP_TRY(p.check_expected());
  p.before_ = XP_TRY(read_bytes(mem_, p.spec_.at, p.spec_.bytes.size()));
  if (p.spec_.trap) {
    if (table_) XP_TRY(table_->trap_added(dom_, *p.spec_.trap));
    p.trap_added_ = true;
  }
  if (p.spec_.journal && journal_) {
    const auto& j = *p.spec_.journal;
    XP_TRY(journal_->add_patch(dom_, j.kind, j.at, j.written, j.restore, j.resume, j.module));
    p.journaled_ = true;
  }
  XP_TRY(p.write(p.spec_.bytes));
  p.state_ = Patch::State::Applied;
  return p;
}

Result<void> Patcher::replace(Gva at, std::span<const std::uint8_t> expect, std::span<const std::uint8_t> bytes) {
  auto now = XP_TRY(read_bytes(mem_, at, expect.size()));
  if (!std::equal(now.begin(), now.end(), expect.begin(), expect.end()))
    return fail(Errc::Again, hex(at.value) + " holds " + hex_bytes(std::span(now)) + ", not the expected " +
                                 hex_bytes(expect) + ": left as it is");
  return reused_ && reused_(at) ? mem_.write_transient(at, std::as_bytes(bytes)) : mem_.write(at, std::as_bytes(bytes));
}

std::optional<guardian::JournalModule> journal_module(const kernel::ModuleLayout& l, const kernel::ModuleIdentity& m) {
  if (m.name.empty() || m.name.size() >= guardian::kJournalModuleNameMax || l.name.size < m.name.size() + 1 ||
      l.core_base.size != 8 || l.name.offset > 0xffff || l.core_base.offset > 0xffff)
    return std::nullopt;
  guardian::JournalModule j{Gva{m.address}, guardian::module_hash(m.name, m.text.start),
                            static_cast<std::uint16_t>(l.name.offset), static_cast<std::uint16_t>(l.core_base.offset)};
  // What the journal accepts (the guardian reads 56 bytes of name and 8 of base).
  if (!guardian::module_reference_ok(j)) return std::nullopt;
  return j;
}

}  // namespace xenprobes::probe
