#include "x86/detour.hpp"

#include <algorithm>
#include <array>
#include <string>

namespace xenprobes::x86 {
namespace {

std::int64_t distance(Gva from, Gva to) { return static_cast<std::int64_t>(to.value - from.value); }

// The detour being written, in a buffer of its own until it is whole.
class Writer {
 public:
  explicit Writer(Gva runs_at) : at_(runs_at) {}

  Gva here() const { return at_ + n_; }
  std::size_t size() const { return n_; }
  const std::uint8_t* data() const { return buf_.data(); }

  Result<void> bytes(std::span<const std::uint8_t> b) {
    if (n_ + b.size() > buf_.size())
      return fail(Errc::NoSpace, "the detour outgrew " + std::to_string(buf_.size()) + " bytes");
    for (std::uint8_t x : b) buf_[n_++] = x;
    return {};
  }
  // An instruction of `len` bytes whose last 4 are a displacement from its end to `target`
  // (e8/e9 rel32, 0f 8x rel32).
  Result<void> rel32(std::span<const std::uint8_t> opcode, Gva target, const char* what) {
    const Gva end = here() + opcode.size() + 4;
    const std::int64_t d = distance(end, target);
    if (!fits_rel32(d))
      return fail(Errc::Range, std::string(what) + " at " + hex_addr(here().value) + " cannot reach " +
                                   hex_addr(target.value) + " with rel32");
    XP_TRY(bytes(opcode));
    return le32(static_cast<std::int32_t>(d));
  }
  Result<void> le32(std::int32_t v) {
    const auto u = static_cast<std::uint32_t>(v);
    const std::array<std::uint8_t, 4> b = {static_cast<std::uint8_t>(u), static_cast<std::uint8_t>(u >> 8),
                                           static_cast<std::uint8_t>(u >> 16), static_cast<std::uint8_t>(u >> 24)};
    return bytes(b);
  }
  // push imm32 (sign-extended to 64 bits).
  Result<void> push_imm32(Gva value, const Insn& why) {
    const auto v = static_cast<std::int64_t>(value.value);
    if (!fits_rel32(v))
      return fail(Errc::Range, why.describe() + ": its return address " + hex_addr(value.value) +
                                   " does not fit a sign-extended push imm32");
    const std::uint8_t op = 0x68;
    XP_TRY(bytes(std::span(&op, 1)));
    return le32(static_cast<std::int32_t>(v));
  }

 private:
  Gva at_;
  std::array<std::uint8_t, kMaxDetourSize> buf_{};
  std::size_t n_ = 0;
};

// `b` with its RIP-relative displacement rewritten for the copy that starts at `copy_at`.
Result<void> fix_rip_relative(std::span<std::uint8_t> b, const Insn& i, Gva copy_at) {
  if (!i.is_rip_relative) return {};
  if (i.disp_size != 4 || i.disp_offset == 0 || i.disp_offset + 4u > i.length)
    return fail(Errc::IllegalSequence, i.describe() + ": RIP-relative without a disp32 field");
  std::uint32_t u = 0;
  for (int k = 0; k < 4; ++k) u |= static_cast<std::uint32_t>(i.bytes[i.disp_offset + k]) << (8 * k);
  const Gva target = i.next() + static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int32_t>(u)));
  const std::int64_t d = distance(copy_at + i.length, target);
  if (!fits_rel32(d))
    return fail(Errc::Range, i.describe() + ": its operand " + hex_addr(target.value) +
                                 " is out of rel32 reach from the detour at " + hex_addr(copy_at.value));
  const auto n = static_cast<std::uint32_t>(static_cast<std::int32_t>(d));
  for (int k = 0; k < 4; ++k) b[i.disp_offset + k] = static_cast<std::uint8_t>(n >> (8 * k));
  return {};
}

// One instruction of the region, relocated to the writer's position.
Result<void> relocate(Writer& w, const Insn& i) {
  switch (i.branch) {
    case BranchKind::Jmp: return w.rel32(std::array<std::uint8_t, 1>{0xe9}, i.branch_target, "the jmp's copy");
    case BranchKind::Jcc:
      return w.rel32(std::array<std::uint8_t, 2>{0x0f, static_cast<std::uint8_t>(0x80 + static_cast<unsigned>(i.cc))},
                     i.branch_target, "the jcc's copy");
    case BranchKind::Call:
      XP_TRY(w.push_imm32(i.next(), i));
      return w.rel32(std::array<std::uint8_t, 1>{0xe9}, i.branch_target, "the call's copy");
    case BranchKind::CallIndirect: {
      // ff /2 becomes ff /4 on the same operand, after pushing the original return address.
      std::size_t op = 0;
      while (op < i.length && (is_legacy_prefix(i.bytes[op]) || (i.bytes[op] & 0xf0) == 0x40)) ++op;
      if (op + 1 >= i.length || i.bytes[op] != 0xff || ((i.bytes[op + 1] >> 3) & 7) != 2)
        return fail(Errc::InvalidArgument, i.describe() + ": not an ff /2 indirect call");
      XP_TRY(w.push_imm32(i.next(), i));
      std::array<std::uint8_t, kMaxInsnLen> b = i.bytes;
      b[op + 1] = static_cast<std::uint8_t>((b[op + 1] & ~0x38) | (4 << 3));
      XP_TRY(fix_rip_relative(b, i, w.here()));
      return w.bytes(std::span(b.data(), i.length));
    }
    case BranchKind::Loop:
    case BranchKind::Loope:
    case BranchKind::Loopne:
    case BranchKind::Jrcxz:
    case BranchKind::Far: return fail(Errc::InvalidArgument, i.describe() + ": cannot be relocated into a detour");
    case BranchKind::None:
    case BranchKind::Ret:
    case BranchKind::JmpIndirect: break;
  }
  if (i.kind == Kind::Xbegin)
    return fail(Errc::InvalidArgument, i.describe() + ": its relative abort address cannot be relocated");
  std::array<std::uint8_t, kMaxInsnLen> b = i.bytes;
  XP_TRY(fix_rip_relative(b, i, w.here()));
  return w.bytes(std::span(b.data(), i.length));
}

// Whether execution can go on past `i` (its copy needs the jump back after it).
bool falls_through(const Insn& i) {
  switch (i.branch) {
    case BranchKind::Jmp:
    case BranchKind::JmpIndirect:
    case BranchKind::Ret:
    case BranchKind::Far:
    case BranchKind::Call:          // relocated as push + jmp: the callee returns to the region's end
    case BranchKind::CallIndirect:  // likewise
      return false;
    default: return i.kind != Kind::Int3 && i.kind != Kind::Ud;
  }
}

}  // namespace

Result<DetourLayout> emit_detour(std::span<std::uint8_t> dest, Gva runs_at, const JumpFunction& f,
                                 const JumpRegion& region, Gva point, Gva entry) {
  if (region.count == 0 || region.first + region.count > f.insns().size())
    return fail(Errc::InvalidArgument, "the region is not one of the function's");
  return emit_detour(dest, runs_at, std::span(f.insns()).subspan(region.first, region.count), point, entry);
}

Result<DetourLayout> emit_detour(std::span<std::uint8_t> dest, Gva runs_at, std::span<const Insn> region, Gva point,
                                 Gva entry) {
  if (region.empty()) return fail(Errc::InvalidArgument, "an empty region");
  for (std::size_t j = 1; j < region.size(); ++j)
    if (region[j].address != region[j - 1].next())
      return fail(Errc::InvalidArgument, "the region's instructions are not back to back");
  const Gva start = region.front().address, end = region.back().next();
  Writer w(runs_at);
  DetourLayout l;
  bool called = false;
  for (const Insn& i : region) {
    if (i.address == point) {
      l.call_offset = w.size();
      XP_TRY(w.rel32(std::array<std::uint8_t, 1>{0xe8}, entry, "the detour's call to the jump entry"));
      l.resume_offset = w.size();
      called = true;
    }
    l.copies.emplace_back(i.address, w.size());
    XP_TRY(relocate(w, i));
  }
  if (!called)
    return fail(Errc::InvalidArgument, "the probed address " + hex_addr(point.value) +
                                           " is no instruction of the region at " + hex_addr(start.value));
  if (falls_through(region.back())) XP_TRY(w.rel32(std::array<std::uint8_t, 1>{0xe9}, end, "the detour's jump back"));
  if (dest.size() < w.size())
    return fail(Errc::NoSpace,
                "the detour needs " + std::to_string(w.size()) + " bytes, the slot has " + std::to_string(dest.size()));
  std::copy_n(w.data(), w.size(), dest.begin());
  l.size = w.size();
  return l;
}

}  // namespace xenprobes::x86
