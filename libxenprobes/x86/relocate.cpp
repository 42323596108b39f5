#include "x86/relocate.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "x86/analysis.hpp"

namespace xenprobes::x86 {
namespace {

// Signed distance from `from` to `to`; canonical addresses make the wrapping subtraction exact.
std::int64_t distance(Gva from, Gva to) { return static_cast<std::int64_t>(to.value - from.value); }

void put_le32(std::uint8_t* p, std::int32_t v) {
  const auto u = static_cast<std::uint32_t>(v);
  for (int k = 0; k < 4; ++k) p[k] = static_cast<std::uint8_t>(u >> (8 * k));
}

std::int32_t get_le32(const std::uint8_t* p) {
  std::uint32_t u = 0;
  for (int k = 0; k < 4; ++k) u |= static_cast<std::uint32_t>(p[k]) << (8 * k);
  return static_cast<std::int32_t>(u);
}

}  // namespace

std::size_t slot_size(const Insn& i, SlotTail tail) {
  return i.length + (tail == SlotTail::JmpBack ? kJmpRel32Len : 1);
}

Result<std::size_t> emit_jmp_rel32(std::span<std::uint8_t> dest, Gva runs_at, Gva target) {
  if (dest.size() < kJmpRel32Len)
    return fail(Errc::NoSpace, "jmp rel32 needs 5 bytes, buffer has " + std::to_string(dest.size()));
  const std::int64_t d = distance(runs_at + kJmpRel32Len, target);
  if (!fits_rel32(d)) {
    return fail(Errc::Range,
                "jmp at " + hex_addr(runs_at.value) + " to " + hex_addr(target.value) + ": out of rel32 reach");
  }
  dest[0] = 0xe9;
  put_le32(&dest[1], static_cast<std::int32_t>(d));
  return kJmpRel32Len;
}

Result<std::size_t> emit_slot(std::span<std::uint8_t> dest, Gva runs_at, const Insn& i, Gva resume_at, SlotTail tail,
                              std::uint8_t trap_byte) {
  if (!can_boost(i)) {
    return fail(Errc::InvalidArgument,
                i.describe() + ": cannot run out of line (branches are emulated; see analyze())");
  }
  const std::size_t need = slot_size(i, tail);
  if (dest.size() < need) {
    return fail(Errc::NoSpace, "slot for " + i.describe() + " needs " + std::to_string(need) + " bytes, buffer has " +
                                   std::to_string(dest.size()));
  }
  // Build the whole slot aside, so nothing is written on failure.
  std::array<std::uint8_t, kMaxInsnLen + kJmpRel32Len> buf{};
  std::copy_n(i.bytes.begin(), i.length, buf.begin());

  if (i.is_rip_relative) {
    if (i.disp_size != 4 || i.disp_offset == 0 || i.disp_offset + 4u > i.length) {
      return fail(Errc::IllegalSequence, i.describe() + ": RIP-relative without a disp32 field");
    }
    // Same effective address from the slot: orig_next + disp == slot_next + new_disp.
    const Gva ea = i.next() + static_cast<std::uint64_t>(static_cast<std::int64_t>(get_le32(&i.bytes[i.disp_offset])));
    const std::int64_t nd = distance(runs_at + i.length, ea);
    if (!fits_rel32(nd)) {
      return fail(Errc::Range, i.describe() + ": operand " + hex_addr(ea.value) +
                                   " is out of rel32 reach from the slot at " + hex_addr(runs_at.value));
    }
    put_le32(&buf[i.disp_offset], static_cast<std::int32_t>(nd));
  }

  if (tail == SlotTail::JmpBack) {
    XP_TRY(emit_jmp_rel32(std::span(buf).subspan(i.length), runs_at + i.length, resume_at));
  } else {
    buf[i.length] = trap_byte;
  }
  std::copy_n(buf.begin(), need, dest.begin());
  return need;
}

}  // namespace xenprobes::x86
