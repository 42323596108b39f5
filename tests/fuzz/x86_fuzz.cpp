// Fuzz target: instruction bytes through decode -> analyze -> relocate (x86/). The bytes at a
// probe point are the guest's kernel text; a hostile or just unusual kernel puts anything there.
// The guest module's own branch decoder (guest-module/xp_fallback.c, which the guest channel
// runs in Dom0 too) is checked against Capstone on the same bytes.
//
// Input: the instruction's address, the slot's address, the slot tail, register values, then
// the bytes (the first instruction, and up to 256 bytes as a "function").
//
// Invariants: a decoded instruction has length 1..15, holds exactly the input's first bytes,
// decodes the same from exactly those bytes, and its displacement/immediate fields lie inside
// it; a relative branch's target is next + its rel field; analyze() refuses with EBUSY/EINVAL
// and a printable reason, or its plan is consistent with the instruction; a boosted slot
// re-decodes to the same instruction addressing the same RIP-relative byte, followed by a
// jmp to resume_at (or the trap byte), and emit_slot writes nothing when it fails; branch
// emulation returns one of the two possible next rips; when the module's decoder accepts the
// bytes, Capstone decodes the same branch (kind, length, condition, target, register); the lean
// decoders of whole kernels (relative_branches, formed_addresses) fail where decode_function
// fails and give what its instructions give.
#include <array>

#include "fuzz/fuzz_common.hpp"
#include "x86/analysis.hpp"
#include "x86/insn.hpp"
#include "x86/jump_safety.hpp"
#include "x86/relocate.hpp"
#include "xp_logic.h"

using namespace xenprobes;
using namespace xenprobes::x86;
using fuzz::Input;

namespace {

std::int64_t sext(const Insn& i, unsigned off, unsigned size) {
  std::uint64_t u = 0;
  for (unsigned k = 0; k < size; ++k) u |= std::uint64_t{i.bytes[off + k]} << (8 * k);
  const unsigned sh = 64 - 8 * size;
  return static_cast<std::int64_t>(u << sh) >> sh;
}

void check_insn(const Insn& i, std::span<const std::uint8_t> bytes, Gva addr) {
  const std::string at = i.describe();
  FUZZ_CHECK(fuzz::printable(at), at);
  FUZZ_CHECK(i.length >= 1 && i.length <= kMaxInsnLen && i.length <= bytes.size(), at);
  FUZZ_CHECK(std::equal(i.bytes.begin(), i.bytes.begin() + i.length, bytes.begin()),
             at + ": bytes differ from the input");
  FUZZ_CHECK(i.address == addr && i.next().value == addr.value + i.length);
  if (i.disp_size)
    FUZZ_CHECK(i.disp_offset > 0 && i.disp_offset + i.disp_size <= i.length, at + ": displacement outside");
  // imm_offset/imm_size come from Capstone 4.0.2, which gets some sizes wrong (`in eax, imm8`
  // reports 4); insn.hpp documents them for relative branches only, where they must be right.
  if (i.imm_size && i.is_relative_branch())
    FUZZ_CHECK(i.imm_offset > 0 && i.imm_offset + i.imm_size <= i.length, at + ": rel field outside");
  if (i.is_rip_relative)
    FUZZ_CHECK(i.mem.present && i.mem.base == Reg::Rip && i.disp_size == 4 && sext(i, i.disp_offset, 4) == i.mem.disp,
               at + ": RIP-relative without its disp32");
  if (i.mem.present)
    FUZZ_CHECK(i.mem.scale == 1 || i.mem.scale == 2 || i.mem.scale == 4 || i.mem.scale == 8 || i.mem.scale == 0, at);
  if (i.is_relative_branch() && !i.has_opsize() && (i.imm_size == 1 || i.imm_size == 4)) {
    const std::uint64_t want = i.next().value + static_cast<std::uint64_t>(sext(i, i.imm_offset, i.imm_size));
    FUZZ_CHECK(i.branch_target.value == (i.has_addr32() ? want & 0xffffffffull : want) || i.branch_target.value == want,
               at + ": target " + fuzz::hexs(i.branch_target.value) + ", next + rel = " + fuzz::hexs(want));
  }
  // The same from exactly its own bytes (nothing after it matters).
  auto again = decode(std::span(i.bytes.data(), i.length), addr);
  FUZZ_CHECK(again && again->length == i.length && again->kind == i.kind && again->branch == i.branch &&
                 again->branch_target == i.branch_target && again->is_rip_relative == i.is_rip_relative,
             at + ": decodes differently from its own bytes");
}

void check_plan(const Insn& i, Gva runs_at, Gva resume, SlotTail tail, std::uint8_t trap, const CpuState& s,
                std::uint64_t loaded) {
  auto plan = analyze(i);
  (void)xen_emulator_refusal(i);
  if (auto why = xen_emulator_refusal(i)) FUZZ_CHECK(fuzz::printable(*why));
  if (!plan) {
    FUZZ_CHECK(plan.error().code == Errc::Busy || plan.error().code == Errc::InvalidArgument, plan.error().what);
    FUZZ_CHECK(fuzz::printable(plan.error().what));
    FUZZ_CHECK(!can_boost(i));
    return;
  }
  const std::string at = i.describe() + " (" + std::string(plan_name(*plan)) + ")";
  switch (*plan) {
    case Plan::Skip: FUZZ_CHECK(is_skippable(i) && i.branch == BranchKind::None, at); break;
    case Plan::Boost:
    case Plan::BoostRipRel: {
      FUZZ_CHECK(can_boost(i) && (*plan == Plan::BoostRipRel) == i.is_rip_relative, at);
      const std::size_t need = slot_size(i, tail);
      // Too small a buffer: NoSpace, nothing written.
      std::vector<std::uint8_t> small(need - 1, 0x5a);
      auto r0 = emit_slot(small, runs_at, i, resume, tail, trap);
      FUZZ_CHECK(!r0 && r0.error().code == Errc::NoSpace, at);
      FUZZ_CHECK(std::all_of(small.begin(), small.end(), [](std::uint8_t b) { return b == 0x5a; }),
                 at + ": wrote on failure");
      std::unique_ptr<std::uint8_t[]> dest(new std::uint8_t[need]);  // exactly: ASan sees any overrun
      std::memset(dest.get(), 0x5a, need);
      auto r = emit_slot(std::span(dest.get(), need), runs_at, i, resume, tail, trap);
      if (!r) {
        FUZZ_CHECK(r.error().code == Errc::Range, at + ": " + r.error().what);
        for (std::size_t k = 0; k < need; ++k) FUZZ_CHECK(dest[k] == 0x5a, at + ": wrote on failure");
        break;
      }
      FUZZ_CHECK(*r == need, at);
      auto copy = decode(std::span(dest.get(), need), runs_at);
      FUZZ_CHECK(copy && copy->length == i.length && copy->kind == i.kind && copy->mnemonic == i.mnemonic,
                 at + ": the slot's copy decodes differently");
      if (i.is_rip_relative) {
        FUZZ_CHECK(copy->is_rip_relative, at);
        const std::uint64_t ea = i.next().value + static_cast<std::uint64_t>(i.mem.disp);
        const std::uint64_t ea2 = copy->next().value + static_cast<std::uint64_t>(copy->mem.disp);
        FUZZ_CHECK(ea == ea2, at + ": the slot addresses " + fuzz::hexs(ea2) + " instead of " + fuzz::hexs(ea));
      } else {
        FUZZ_CHECK(std::equal(dest.get(), dest.get() + i.length, i.bytes.begin()),
                   at + ": the copy is not the original");
      }
      if (tail == SlotTail::Trap) {
        FUZZ_CHECK(dest[i.length] == trap, at);
      } else {
        auto jmp = decode(std::span(dest.get() + i.length, kJmpRel32Len), runs_at + i.length);
        FUZZ_CHECK(jmp && jmp->branch == BranchKind::Jmp && jmp->branch_target == resume, at + ": the jmp back misses");
      }
      break;
    }
    case Plan::EmulateBranch: {
      auto o = branch_outcome(i, s);
      FUZZ_CHECK(o.has_value(), at + ": " + o.error().what);
      if (i.is_relative_branch()) FUZZ_CHECK(o->next_rip == i.next() || o->next_rip == i.branch_target, at);
      else
        FUZZ_CHECK(i.indirect_reg != Reg::None && i.indirect_reg != Reg::Rip &&
                       o->next_rip.value == s.gpr[static_cast<unsigned>(i.indirect_reg)],
                   at);
      if (o->push_return) FUZZ_CHECK(o->return_addr == i.next(), at);
      FUZZ_CHECK(o->push_return == (i.branch == BranchKind::Call || i.branch == BranchKind::CallIndirect), at);
      break;
    }
    case Plan::EmulateLoaded: {
      auto o = loaded_branch_outcome(i, loaded);
      FUZZ_CHECK(o && o->next_rip.value == loaded, at);
      if (i.branch == BranchKind::Ret) {
        FUZZ_CHECK(o->release_bytes == 8u + i.ret_imm && !o->push_return, at);
      } else {
        auto ea = effective_address(i, s);
        FUZZ_CHECK(ea.has_value(), at);
      }
      break;
    }
  }
}

// The module's decoder against Capstone's.
void check_module_decoder(std::span<const std::uint8_t> bytes, Gva addr) {
  for (std::uint32_t len = 1; len <= std::min<std::size_t>(bytes.size(), kMaxInsnLen); ++len) {
    xp_branch br;
    std::memset(&br, 0, sizeof br);
    if (!xp_decode_branch(bytes.data(), len, &br)) continue;
    auto i = decode(bytes.first(len), addr);
    const std::string at = "module decoder accepts [" + hex_bytes(bytes.first(len)) + "]";
    FUZZ_CHECK(i.has_value(), at + " which Capstone does not decode");
    FUZZ_CHECK(br.len == len && i->length == len,
               at + ": lengths " + std::to_string(br.len) + "/" + std::to_string(i->length));
    FUZZ_CHECK(!xp_is_mem_indirect_branch(bytes.data(), len), at);
    const std::uint64_t target = i->next().value + static_cast<std::uint64_t>(br.disp);
    switch (br.kind) {
      case XP_BR_JMP:
        FUZZ_CHECK(i->branch == BranchKind::Jmp && i->branch_target.value == target, at + ": " + i->describe());
        break;
      case XP_BR_JCC:
        FUZZ_CHECK(
            i->branch == BranchKind::Jcc && static_cast<unsigned>(i->cc) == br.cc && i->branch_target.value == target,
            at + ": " + i->describe());
        break;
      case XP_BR_CALL:
        FUZZ_CHECK(i->branch == BranchKind::Call && i->branch_target.value == target, at + ": " + i->describe());
        break;
      case XP_BR_LOOP:
        FUZZ_CHECK(i->branch == BranchKind::Loop && i->branch_target.value == target, at + ": " + i->describe());
        break;
      case XP_BR_LOOPE:
        FUZZ_CHECK(i->branch == BranchKind::Loope && i->branch_target.value == target, at + ": " + i->describe());
        break;
      case XP_BR_LOOPNE:
        FUZZ_CHECK(i->branch == BranchKind::Loopne && i->branch_target.value == target, at + ": " + i->describe());
        break;
      case XP_BR_JRCXZ:
        FUZZ_CHECK(i->branch == BranchKind::Jrcxz && br.ecx == i->has_addr32(), at + ": " + i->describe());
        FUZZ_CHECK(
            (i->branch_target.value & (br.ecx ? 0xffffffffull : ~0ull)) == (target & (br.ecx ? 0xffffffffull : ~0ull)),
            at + ": " + i->describe());
        break;
      case XP_BR_RET:
        FUZZ_CHECK(i->branch == BranchKind::Ret && i->ret_imm == br.imm16, at + ": " + i->describe());
        break;
      case XP_BR_CALL_REG:
      case XP_BR_JMP_REG:
        FUZZ_CHECK(i->branch == (br.kind == XP_BR_CALL_REG ? BranchKind::CallIndirect : BranchKind::JmpIndirect) &&
                       !i->mem.present && static_cast<unsigned>(i->indirect_reg) == br.reg,
                   at + ": " + i->describe());
        break;
      default: FUZZ_CHECK(false, at + ": kind " + std::to_string(br.kind));
    }
    // The channel arms EMULATE entries the module accepts: Dom0's analysis must agree it is a branch.
    auto plan = analyze(*i);
    FUZZ_CHECK(!plan || *plan == Plan::EmulateBranch || *plan == Plan::EmulateLoaded,
               at + ": planned " + (plan ? std::string(plan_name(*plan)) : plan.error().what));
  }
}

// The lean decoders of whole kernels (the jump index's relative_branches(), the tail-call
// proof's formed_addresses()) fail exactly when decode_function() fails, and give what its
// instructions give.
void check_lean_decoders(std::span<const std::uint8_t> fn, Gva addr, const Result<std::vector<Insn>>& all) {
  std::vector<RelativeBranch> rel;
  std::vector<FormedAddress> formed;
  const bool rel_ok = relative_branches(fn, addr, rel).has_value();
  const bool formed_ok = formed_addresses(fn, addr, formed).has_value();
  FUZZ_CHECK(rel_ok == all.has_value() && formed_ok == all.has_value(), "a lean decoder fails differently");
  if (!all) return;
  std::size_t r = 0, f = 0;
  for (const Insn& i : *all) {
    if (i.is_relative_branch()) {
      FUZZ_CHECK(r < rel.size() && rel[r].address == i.address && rel[r].target == i.branch_target,
                 i.describe() + ": relative_branches() differs");
      ++r;
    }
    for (std::uint64_t a : materialized_addresses(i)) {
      FUZZ_CHECK(f < formed.size() && formed[f].by == i.address && formed[f].value == a,
                 i.describe() + ": formed_addresses() differs");
      ++f;
    }
  }
  FUZZ_CHECK(r == rel.size() && f == formed.size(), "a lean decoder gives more");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > 512) return 0;
  Input in(data, size);
  const std::uint8_t b0 = in.u8();
  const Gva addr{b0 & 1 ? in.u64() : 0xffffffff81000000ull + in.u16()};
  const Gva runs_at{b0 & 2 ? in.u64() : 0xffffffffa0000000ull + in.u16()};
  const Gva resume{b0 & 4 ? in.u64() : addr.value + (in.u8() % 16)};
  const SlotTail tail = b0 & 8 ? SlotTail::Trap : SlotTail::JmpBack;
  const std::uint8_t trap = b0 & 16 ? 0xcc : 0xf1;
  CpuState s;
  for (unsigned k = in.u8() % 17; k-- > 0;) s.gpr[in.u8() % 16] = in.u64();
  s.rflags = in.u16();
  s.fs_base = in.u64();
  s.gs_base = in.u64();
  const std::uint64_t loaded = in.u64();
  const auto bytes = in.rest();
  if (bytes.empty()) return 0;

  auto i = decode(bytes, addr);
  if (!i) {
    FUZZ_CHECK(i.error().code == Errc::IllegalSequence, i.error().what);
    FUZZ_CHECK(fuzz::printable(i.error().what));
  } else {
    check_insn(*i, bytes, addr);
    check_plan(*i, runs_at, resume, tail, trap, s, loaded);
  }
  check_module_decoder(bytes, addr);

  // The bytes as a whole function: contiguous instructions, decode_at at every boundary.
  const auto fn = bytes.first(std::min<std::size_t>(bytes.size(), 256));
  auto all = decode_function(fn, addr);
  check_lean_decoders(fn, addr, all);
  // (A function that wraps around the top of the address space cannot come from the symbols,
  // whose extents never wrap: decode_at refuses addresses past the wrap, decode_function does not.)
  const bool wraps = addr.value + fn.size() < addr.value;
  if (all && !wraps) {
    std::uint64_t a = addr.value;
    for (const Insn& k : *all) {
      FUZZ_CHECK(k.address.value == a && k.length >= 1);
      a += k.length;
    }
    FUZZ_CHECK(a - addr.value == fn.size());
    const Gva moved = adjust_probe_address(*all, addr);
    FUZZ_CHECK(moved == addr || (all->size() >= 2 && is_endbr(all->front()) && moved == (*all)[1].address));
    const Insn& pick = (*all)[in.u8() % all->size()];
    auto at = decode_at(fn, addr, pick.address);
    FUZZ_CHECK(at && at->address == pick.address && at->length == pick.length);
    if (pick.length > 1) {
      auto mid = decode_at(fn, addr, pick.address + 1);
      FUZZ_CHECK(!mid && mid.error().code == Errc::IllegalSequence,
                 pick.describe() + ": " + (mid ? "decoded " + mid->describe() : mid.error().what));
    }
  } else if (!all) {
    FUZZ_CHECK(all.error().code == Errc::IllegalSequence);
  }
  auto outside = decode_at(fn, addr, addr + fn.size());
  FUZZ_CHECK(!outside && outside.error().code == Errc::InvalidArgument);
  return 0;
}
