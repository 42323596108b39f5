// A jump probe's detour: the code a 5-byte `jmp rel32` over a region (jump_safety.hpp) sends
// the vCPU to. Laid out as include/xenprobes/protocol.h "Jump probes" describes:
//
//   runs_at        copies of the region's instructions before the probed one (relocated)
//   call_offset    e8 <rel32 → entry>            the hit (the guest module's jump entry)
//   resume_offset  copies of the probed instruction and the rest of the region (relocated)
//                  e9 <rel32 → region end>       unless the last copy never falls through
//
// Relocation keeps what each instruction does where it stands in the kernel: a RIP-relative
// operand addresses the same byte; jmp and jcc (rel8 or rel32) become rel32 forms reaching the
// same target; `call rel32` becomes push <original return address>; jmp <target>, and an
// indirect call push <original return address>; jmp <the same operand>, so the callee sees and
// returns to the original return address (the region's end: jump_safety makes a call close its
// region). Everything else is copied as it is. Pure code: bytes in, bytes out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "x86/jump_safety.hpp"
#include "x86/relocate.hpp"

namespace xenprobes::x86 {

inline constexpr std::size_t kCallRel32Len = 5;
// A detour is at most: 15 copies of 1..15 bytes each growing by at most 5 (a call becomes
// push imm32 + jmp rel32), the call, the jump back. Regions are ≤ 19 bytes, so far less.
inline constexpr std::size_t kMaxDetourSize = 128;

struct DetourLayout {
  std::size_t size = 0;           // bytes written
  std::size_t call_offset = 0;    // the `call` to the entry
  std::size_t resume_offset = 0;  // call_offset + 5: where the hit resumes
  // Where each of the region's instructions has its copy: (its address, the copy's offset).
  // A vCPU sent to one of those addresses while the jump covers it must go to the copy.
  std::vector<std::pair<Gva, std::size_t>> copies;
  // The copy of the instruction at `a` (an instruction of the region), or nullopt.
  std::optional<std::size_t> copy_of(Gva a) const {
    for (const auto& [at, off] : copies)
      if (at == a) return off;
    return std::nullopt;
  }
};

// Writes the detour for `region` of `f`, probed at `point` (an instruction of the region: its
// start, or a later one when check_jump found an earlier start), running at `runs_at` and
// calling `entry`. ERANGE when a target or operand is out of rel32 reach from the detour,
// EINVAL when `point` is no instruction of the region or an instruction cannot be relocated,
// ENOSPC when `dest` is too small. Nothing is written on failure.
[[nodiscard]] Result<DetourLayout> emit_detour(std::span<std::uint8_t> dest, Gva runs_at, const JumpFunction& f,
                                               const JumpRegion& region, Gva point, Gva entry);
// The same from the region's instructions themselves (in order, back to back).
[[nodiscard]] Result<DetourLayout> emit_detour(std::span<std::uint8_t> dest, Gva runs_at, std::span<const Insn> region,
                                               Gva point, Gva entry);

}  // namespace xenprobes::x86
