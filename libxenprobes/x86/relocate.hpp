// Slot code: the displaced instruction copied out of line, then a way back.
//
//   boosted (SlotTail::JmpBack)          trap after (SlotTail::Trap)
//   runs_at +0    insn (len bytes)       runs_at +0    insn (len bytes)
//           +len  e9 <rel32 → resume_at>         +len  <trap_byte>
//           +len+5                               +len+1
//
// Every function takes the buffer the bytes are written into (`dest`) apart from the guest
// address they will run at (`runs_at`): the buffer is usually a foreign mapping in Dom0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "x86/insn.hpp"

namespace xenprobes::x86 {

enum class SlotTail : std::uint8_t {
  JmpBack,  // jmp rel32 to resume_at: no second trap
  Trap,     // the channel's trap byte: Dom0 runs post-handlers, then sends the vCPU to resume_at
};

inline constexpr std::size_t kJmpRel32Len = 5;

// Bytes emit_slot() needs for `i` with `tail`.
std::size_t slot_size(const Insn& i, SlotTail tail);

// True when `d` fits a signed 32-bit displacement.
constexpr bool fits_rel32(std::int64_t d) { return static_cast<std::int64_t>(static_cast<std::int32_t>(d)) == d; }

// Writes `jmp rel32` (e9) at dest[0..5) for code running at `runs_at`, jumping to `target`.
// ENOSPC if dest is too small, ERANGE if target is beyond rel32 reach.
[[nodiscard]] Result<std::size_t> emit_jmp_rel32(std::span<std::uint8_t> dest, Gva runs_at, Gva target);

// Writes the slot for `i` (see the diagram above) and returns its length. A RIP-relative disp32
// is rewritten so the operand addresses the same byte from `runs_at`. EINVAL if `i` cannot be
// boosted (can_boost), ERANGE if the operand or resume_at is out of rel32 reach from the slot,
// ENOSPC if dest is too small. Nothing is written on failure.
[[nodiscard]] Result<std::size_t> emit_slot(std::span<std::uint8_t> dest, Gva runs_at, const Insn& i, Gva resume_at,
                                            SlotTail tail, std::uint8_t trap_byte);

}  // namespace xenprobes::x86
