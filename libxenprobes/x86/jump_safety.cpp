#include "x86/jump_safety.hpp"

#include <algorithm>
#include <cstring>

#include "x86/analysis.hpp"
#include "x86/relocate.hpp"

namespace xenprobes::x86 {

// ---- SiteIndex

void SiteIndex::add(std::uint64_t addr, std::uint32_t len, std::string what) {
  if (len == 0) len = 1;
  if (!sites_.empty() && addr < sites_.back().addr) sorted_ = false;
  sites_.push_back(Site{addr, len, std::move(what)});
  max_len_ = std::max(max_len_, len);
}

void SiteIndex::sort() const {
  std::stable_sort(sites_.begin(), sites_.end(), [](const Site& a, const Site& b) { return a.addr < b.addr; });
  sorted_ = true;
}

const SiteIndex::Site* SiteIndex::overlapping(std::uint64_t lo, std::uint64_t hi) const {
  if (!sorted_) sort();
  if (lo >= hi) return nullptr;
  // A site [addr, addr + len) overlaps [lo, hi) when addr < hi and addr + len > lo; no site
  // is longer than max_len_, so the first candidate starts at lo - max_len_ + 1.
  const std::uint64_t from = lo >= max_len_ ? lo - max_len_ + 1 : 0;
  auto it =
      std::lower_bound(sites_.begin(), sites_.end(), from, [](const Site& s, std::uint64_t a) { return s.addr < a; });
  for (; it != sites_.end() && it->addr < hi; ++it)
    if (it->addr + it->len > lo) return &*it;
  return nullptr;
}

// ---- Names

std::string_view jump_rule_name(JumpRule r) {
  switch (r) {
    case JumpRule::None: return "none";
    case JumpRule::RegionInFunction: return "region-in-function";
    case JumpRule::FitsInFunction: return "fits-in-function";
    case JumpRule::WholeInstructions: return "whole-instructions";
    case JumpRule::NoBranchIntoRegion: return "no-branch-into-region";
    case JumpRule::NoReservedAddress: return "no-reserved-address";
    case JumpRule::IslandInReach: return "island-in-reach";
  }
  return "?";
}

namespace {

JumpRefusal refusal(JumpRule r, std::string why) { return JumpRefusal{r, std::move(why)}; }

bool is_indirect_jump_to_thunk(const Insn& i, const JumpContext& c) {
  return i.branch == BranchKind::Jmp && c.indirect_thunks &&
         c.indirect_thunks->overlapping(i.branch_target.value, i.branch_target.value + 1);
}

// Reach of a rel32 field rewritten in the detour: from both ends of the detour area.
bool reaches_from_detour(const JumpContext& c, Gva target) {
  if (!c.detour_area) return true;
  const std::uint64_t lo = c.detour_area->value;
  const std::uint64_t hi = lo + c.detour_area_size;
  return fits_rel32(static_cast<std::int64_t>(target.value - lo)) &&
         fits_rel32(static_cast<std::int64_t>(target.value - hi));
}

// The address a RIP-relative operand names (relative to the original next instruction).
Gva rip_target(const Insn& i) { return i.next() + static_cast<std::uint64_t>(i.mem.disp); }

}  // namespace

// ---- JumpFunction

JumpFunction JumpFunction::from_insns(std::vector<Insn> insns, Gva start, Gva end, const JumpContext& ctx) {
  JumpFunction f;
  f.start_ = start;
  f.end_ = end;
  f.insns_ = std::move(insns);
  f.ctx_ = &ctx;
  for (const Insn& i : f.insns_) {
    if (i.is_relative_branch() || i.kind == Kind::Xbegin) {
      if (is_indirect_jump_to_thunk(i, ctx)) {
        // A retpoline: `jmp __x86_indirect_thunk_rax` is `jmp *%rax` (a computed goto or a
        // tail call; Linux's optprobes once treated a jump into its thunks the same way).
      } else {
        if (i.branch_target.value >= start.value && i.branch_target.value < end.value)
          f.targets_.push_back(Target{i.branch_target.value, i.address.value});
        continue;
      }
    } else if (i.branch != BranchKind::JmpIndirect) {
      continue;
    }
    // An indirect jump: its targets from the caller, or none of the function can be trusted.
    std::optional<std::vector<Gva>> known;
    if (ctx.indirect_targets) known = ctx.indirect_targets(i);
    if (!known) {
      // With IBT every indirect-branch target is an endbr64, which whole-instructions keeps
      // out of every region: nothing more to record.
      if (ctx.endbr_marks_indirect_targets) continue;
      if (!f.unknown_targets_)
        f.unknown_targets_ = "indirect jump " + i.describe() +
                             " with targets the caller cannot list (a jump table or computed goto could land "
                             "inside any region of the function)";
      continue;
    }
    for (Gva t : *known)
      if (t.value >= start.value && t.value < end.value) f.targets_.push_back(Target{t.value, i.address.value});
  }
  std::sort(f.targets_.begin(), f.targets_.end(), [](const Target& a, const Target& b) { return a.to < b.to; });
  // An indirect jump can only go where somebody formed an address: when nobody forms one inside
  // this function, its indirect jumps leave it.
  if (f.unknown_targets_ && ctx.addresses_taken && !interior_address_taken(f)) {
    f.unknown_targets_.reset();
    f.only_leaving_ = true;
  }
  return f;
}

Result<JumpFunction> JumpFunction::decode(std::span<const std::uint8_t> bytes, Gva start, const JumpContext& ctx) {
  auto insns = XP_TRY(decode_function(bytes, start));
  return from_insns(std::move(insns), start, start + bytes.size(), ctx);
}

std::size_t JumpFunction::index_of(Gva a) const {
  auto it = std::lower_bound(insns_.begin(), insns_.end(), a.value,
                             [](const Insn& i, std::uint64_t v) { return i.address.value < v; });
  if (it == insns_.end() || it->address != a) return npos;
  return static_cast<std::size_t>(it - insns_.begin());
}

std::optional<std::string> JumpFunction::target_inside(std::uint64_t lo, std::uint64_t hi) const {
  if (hi <= lo + 1) return std::nullopt;
  auto it =
      std::upper_bound(targets_.begin(), targets_.end(), lo, [](std::uint64_t v, const Target& t) { return v < t.to; });
  if (it != targets_.end() && it->to < hi) {
    auto from = index_of(Gva{it->from});
    return "the branch " + (from != npos ? insns_[from].describe() : hex_addr(it->from)) + " targets " +
           hex_addr(it->to);
  }
  if (ctx_ && ctx_->entry_points)
    if (const SiteIndex::Site* s = ctx_->entry_points->overlapping(lo + 1, hi))
      return s->what + " at " + hex_addr(s->addr) + " enters the function from outside";
  return std::nullopt;
}

// ---- The predicates

std::optional<JumpRefusal> region_in_function(const JumpFunction& f, Gva start) {
  if (start.value < f.start().value || start.value >= f.end().value)
    return refusal(JumpRule::RegionInFunction, hex_addr(start.value) + " is outside the function [" +
                                                   hex_addr(f.start().value) + ", " + hex_addr(f.end().value) + ")");
  if (f.index_of(start) == JumpFunction::npos)
    return refusal(JumpRule::RegionInFunction, hex_addr(start.value) +
                                                   " is not an instruction boundary of the function decoded from " +
                                                   hex_addr(f.start().value));
  return std::nullopt;
}

std::optional<JumpRefusal> fits_in_function(const JumpFunction& f, Gva start, std::uint8_t patch) {
  const std::size_t k = f.index_of(start);
  if (k == JumpFunction::npos) return region_in_function(f, start);
  std::uint64_t end = start.value;
  for (std::size_t j = k; j < f.insns().size() && end - start.value < patch; ++j) end = f.insns()[j].next().value;
  if (end - start.value < patch || end > f.end().value)
    return refusal(JumpRule::FitsInFunction, "the " + std::to_string(patch) + "-byte jump at " + hex_addr(start.value) +
                                                 " would cross the function's end " + hex_addr(f.end().value) +
                                                 " into the next one");
  return std::nullopt;
}

// Linux's optprobes copies only boostable instructions (no branch, no call); a detour here
// relocates relative branches and calls instead, so the copies stay exact.
std::optional<JumpRefusal> whole_instructions(const JumpFunction& f, const JumpRegion& r) {
  const JumpContext& c = f.context();
  for (std::size_t j = r.first; j < r.first + r.count; ++j) {
    const Insn& i = f.insns()[j];
    auto no = [&](const std::string& why) { return refusal(JumpRule::WholeInstructions, i.describe() + ": " + why); };
    // int3 padding after a ret or jmp (straight-line-speculation hardening) is never executed:
    // the copy stops mattering at the transfer, and a branch to the padding would be caught by
    // no-branch-into-region. (Padding after a BUG()'s ud2 never gets here: the ud2 before it
    // in the region is refused by the instruction rules first.)
    if (j > r.first && is_padding_trap(f.insns(), j)) continue;
    // The instruction rules first: whatever cannot run out of line behind a trap cannot in a
    // detour either.
    if (auto plan = analyze(i); !plan) return refusal(JumpRule::WholeInstructions, plan.error().what);
    if (is_endbr(i))
      return no("an indirect-branch landing pad (with IBT, overwriting it turns indirect calls into #CP)");
    if (i.is_rip_relative && !reaches_from_detour(c, rip_target(i)))
      return no("its RIP-relative operand is out of rel32 reach from the detour area");
    switch (i.branch) {
      case BranchKind::None:
      case BranchKind::Ret:
      case BranchKind::JmpIndirect:  // position-independent (a RIP-relative operand is rewritten)
        break;
      case BranchKind::Jmp:
      case BranchKind::Jcc:
        if (!reaches_from_detour(c, i.branch_target))
          return no("its target is out of rel32 reach from the detour area");
        break;
      case BranchKind::Call:
        // In the detour it becomes `push imm32; jmp rel32`: the callee sees (and returns to) the
        // original return address. That address is the region's end (a call is at least 5
        // bytes, so it always closes its region) and push imm32 sign-extends, so it must lie
        // in the top 2 GiB, as the kernel image does.
        if (!fits_rel32(static_cast<std::int64_t>(i.next().value)))
          return no("its return address does not fit a sign-extended push imm32");
        if (!reaches_from_detour(c, i.branch_target))
          return no("its target is out of rel32 reach from the detour area");
        break;
      case BranchKind::Loop:
      case BranchKind::Loope:
      case BranchKind::Loopne:
      case BranchKind::Jrcxz: return no("loop/jrcxz have only a rel8 form: the copy could not reach its target");
      case BranchKind::CallIndirect:
        // As a relative call: push <original return address>; jmp <the same operand>. The
        // push moves RSP, so an operand that reads RSP would name another slot; and the
        // return address must be the region's end (a short `call *%rax` may not close it).
        if (i.indirect_reg == Reg::Rsp || i.mem.base == Reg::Rsp || i.mem.index == Reg::Rsp)
          return no("an indirect call through RSP: the pushed return address would move its operand");
        if (j + 1 != r.first + r.count)
          return no("an indirect call inside the region would return into the middle of the jump");
        if (!fits_rel32(static_cast<std::int64_t>(i.next().value)))
          return no("its return address does not fit a sign-extended push imm32");
        break;
      case BranchKind::Far: return no("far transfer");
    }
  }
  return std::nullopt;
}

std::optional<JumpRefusal> no_branch_into_region(const JumpFunction& f, const JumpRegion& r) {
  if (f.unknown_targets()) return refusal(JumpRule::NoBranchIntoRegion, *f.unknown_targets());
  // Bytes 1 .. len-1: a branch to the region's start lands on the jump itself, one to its end
  // resumes after it; anything between lands inside the jump's rel32 or the tail of a copied
  // instruction. (Linux's optprobes checks [addr + 1, addr + 5] whatever the copied length;
  // a region here may be up to 19 bytes, all of them copied, so all of them count.)
  if (auto who = f.target_inside(r.start.value, r.end().value))
    return refusal(JumpRule::NoBranchIntoRegion,
                   *who + ", inside the region [" + hex_addr(r.start.value) + ", " + hex_addr(r.end().value) + ")");
  return std::nullopt;
}

std::optional<JumpRefusal> no_reserved_address(const JumpFunction& f, const JumpRegion& r) {
  const JumpContext& c = f.context();
  if (!c.reserved) return std::nullopt;
  if (const SiteIndex::Site* s = c.reserved->overlapping(r.start.value, r.end().value))
    return refusal(JumpRule::NoReservedAddress, s->what + " at " + hex_addr(s->addr) + " lies in the region [" +
                                                    hex_addr(r.start.value) + ", " + hex_addr(r.end().value) +
                                                    "): its owner rewrites or looks up those bytes");
  return std::nullopt;
}

std::optional<JumpRefusal> island_in_reach(const JumpFunction& f, const JumpRegion& r, Gva* island) {
  const JumpContext& c = f.context();
  auto none = [&](const std::string& why) {
    return refusal(JumpRule::IslandInReach, "no island for the short jump at " + hex_addr(r.start.value) + ": " + why);
  };
  if (!c.island_padding) return none("no dead padding is listed");
  // rel8 counts from the end of the 2-byte jump.
  const std::uint64_t from = r.start.value + kShortJumpLen;
  const std::uint64_t lo = from - 128, hi = from + 127;  // where an island may start, inclusive
  for (std::uint64_t at = lo; const SiteIndex::Site* p = c.island_padding->overlapping(at, hi + kIslandLen);
       at = p->addr + p->len) {
    const std::uint64_t first = std::max<std::uint64_t>(p->addr, lo);
    const std::uint64_t last = std::min<std::uint64_t>(p->addr + p->len - kIslandLen, hi);
    for (std::uint64_t t = first; p->len >= kIslandLen && t <= last; ++t) {
      if (t < r.end().value && t + kIslandLen > r.start.value) continue;  // inside the region itself
      if (c.islands_taken && c.islands_taken->overlapping(t, t + kIslandLen)) continue;
      if (!reaches_from_detour(c, Gva{t + kIslandLen})) continue;  // its rel32 to the detour
      if (island) *island = Gva{t};
      return std::nullopt;
    }
  }
  return none("no free " + std::to_string(kIslandLen) + " bytes of listed dead padding within rel8 reach [" +
              hex_addr(lo) + ", " + hex_addr(hi) + "]");
}

std::optional<JumpRefusal> check_region(const JumpFunction& f, Gva start, JumpRegion* out, std::uint8_t patch) {
  if (auto no = region_in_function(f, start)) return no;
  if (auto no = fits_in_function(f, start, patch)) return no;
  JumpRegion r;
  r.start = start;
  r.patch = patch;
  r.first = f.index_of(start);
  std::uint64_t len = 0;
  for (std::size_t j = r.first; len < patch; ++j) {
    len += f.insns()[j].length;
    ++r.count;
  }
  r.length = static_cast<std::uint8_t>(len);
  if (auto no = whole_instructions(f, r)) return no;
  if (auto no = no_branch_into_region(f, r)) return no;
  if (auto no = no_reserved_address(f, r)) return no;
  if (out) *out = r;
  return std::nullopt;
}

namespace {

// A region of a `patch`-byte jump serving `point`: its own, else the latest earlier start in the
// same basic block whose region covers it (at most patch - 1 bytes back: a region ends at the
// first instruction boundary >= patch bytes from its start). With a short jump, its island too.
bool find_region(const JumpFunction& f, Gva point, std::uint8_t patch, JumpVerdict& v) {
  JumpRegion r;
  Gva island{};
  auto accept = [&](bool earlier) {
    v.optimizable = true;
    v.starts_earlier = earlier;
    v.region = r;
    if (patch == kShortJumpLen) v.island = island;
    return true;
  };
  auto passes = [&](Gva start) {
    if (check_region(f, start, &r, patch)) return false;
    return patch != kShortJumpLen || !island_in_reach(f, r, &island);
  };
  if (passes(point)) return accept(false);
  const std::size_t k = f.index_of(point);
  if (k == JumpFunction::npos) return false;
  for (std::size_t j = k; j-- > 0;) {
    const Insn& i = f.insns()[j];
    if (point.value - i.address.value >= patch) break;
    if (i.branch != BranchKind::None) break;     // the point starts a basic block of its own
    if (passes(i.address)) return accept(true);  // (its region covers the point: len >= patch > point - start)
  }
  return false;
}

}  // namespace

JumpVerdict check_jump(const JumpFunction& f, Gva point) {
  JumpVerdict v;
  v.point = point;
  JumpRegion own;
  if (auto no = check_region(f, point, &own)) {
    v.refusal = *no;
  } else {
    v.optimizable = true;
    v.region = own;
    return v;
  }
  if (find_region(f, point, kJumpPatchLen, v)) return v;
  if (f.context().island_padding) find_region(f, point, kShortJumpLen, v);
  return v;
}

// ---- What the caller lists

std::optional<std::pair<Gva, Gva>> dead_padding(const JumpFunction& f) {
  const std::vector<Insn>& in = f.insns();
  if (f.unknown_targets()) return std::nullopt;  // an unknown target could be anywhere
  std::size_t k = in.size();
  while (k > 0 && (in[k - 1].kind == Kind::Int3 || in[k - 1].kind == Kind::Nop)) --k;
  if (k == 0 || k == in.size()) return std::nullopt;
  const BranchKind last = in[k - 1].branch;
  if (last != BranchKind::Ret && last != BranchKind::Jmp && last != BranchKind::JmpIndirect) return std::nullopt;
  const std::uint64_t lo = in[k].address.value, hi = f.end().value;
  if (hi - lo < kIslandLen) return std::nullopt;
  // Nothing may reach or own those bytes: a branch there would make them code.
  if (f.target_inside(lo - 1, hi)) return std::nullopt;
  if (const SiteIndex* r = f.context().reserved; r && r->overlapping(lo, hi)) return std::nullopt;
  return std::pair{Gva{lo}, Gva{hi}};
}

std::vector<std::uint64_t> materialized_addresses(const Insn& i) {
  std::vector<std::uint64_t> out;
  if (i.is_rip_relative) out.push_back(rip_target(i).value);
  else if (i.mem.present && i.mem.base == Reg::None && i.disp_size == 4)
    out.push_back(static_cast<std::uint64_t>(i.mem.disp));
  if (!i.is_relative_branch() && i.kind != Kind::Xbegin && (i.imm_size == 4 || i.imm_size == 8) &&
      i.imm_offset + i.imm_size <= i.length) {
    std::uint64_t v = 0;
    if (i.imm_size == 8) {
      std::memcpy(&v, i.bytes.data() + i.imm_offset, 8);
    } else {
      std::int32_t w = 0;
      std::memcpy(&w, i.bytes.data() + i.imm_offset, 4);
      v = static_cast<std::uint64_t>(static_cast<std::int64_t>(w));
    }
    out.push_back(v);
  }
  return out;
}

std::optional<std::string> interior_address_taken(const JumpFunction& f) {
  const SiteIndex* taken = f.context().addresses_taken;
  if (!taken) return std::string("the addresses the kernel forms are not known");
  if (const SiteIndex::Site* s = taken->overlapping(f.start().value + 1, f.end().value))
    return s->what + " forms " + hex_addr(s->addr) + ", inside the function";
  for (const Insn& i : f.insns())
    for (std::uint64_t a : materialized_addresses(i))
      if (a == f.start().value) return i.describe() + " forms the function's own start";
  return std::nullopt;
}

}  // namespace xenprobes::x86
