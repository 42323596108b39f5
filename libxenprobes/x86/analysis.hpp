// Classification of decoded instructions: named safety predicates (one rule, one reason each),
// one gate (analyze) that lists them all, and the pure branch emulation Dom0 uses instead of
// running branches out of line.
//
// Plans (what the engine does when the probe at this instruction is hit):
//
//   Boost            slot = copy + `jmp rel32` back (or + trap byte when a post-handler must run)
//   BoostRipRel      same, with the RIP-relative disp32 rewritten for the slot's address
//   Skip             a no-op (nop, ftrace nop5, endbr): no slot, resume at the next instruction
//   EmulateBranch    jmp/jcc/call rel, loop*, jrcxz, and jmp/call through a register:
//                    branch_outcome() gives the next RIP (and the return address to push)
//   EmulateLoaded    ret / ret imm16 and jmp/call through memory: Dom0 reads the target
//                    (at RSP, or at effective_address()) and calls loaded_branch_outcome()
//
// There is deliberately no "copy + trap after" plan for ret or indirect branches: the trap
// placed after such a copy is never reached (the branch leaves the slot), and a copied call
// would push a return address inside the slot, pinning it for as long as the callee runs.
// The trap-after tail exists, but only as the SlotTail of a Boost/BoostRipRel slot whose probe
// has a post-handler. Emulated plans run post-handlers right after the emulation.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "x86/insn.hpp"

namespace xenprobes::x86 {

enum class Plan : std::uint8_t { Boost, BoostRipRel, Skip, EmulateBranch, EmulateLoaded };

std::string_view plan_name(Plan p);

// ---- Safety predicates: each is one rule; the reason and errno live in analysis.cpp's table.
bool is_trap_byte(const Insn& i);               // int3 / ICEBP already at the address → EBUSY
bool is_context_return(const Insn& i);          // iret*, sysret, sysexit → EINVAL
bool is_software_interrupt(const Insn& i);      // int n, into, syscall, sysenter → EINVAL
bool is_halt(const Insn& i);                    // hlt → EINVAL
bool is_deliberate_ud(const Insn& i);           // ud0/ud1/ud2 (BUG/WARN) → EINVAL
bool is_gs_swap(const Insn& i);                 // swapgs → EINVAL
bool is_ss_load(const Insn& i);                 // mov ss / pop ss → EINVAL
bool is_far_transfer(const Insn& i);            // ljmp, lcall, retf → EINVAL
bool is_transaction_begin(const Insn& i);       // xbegin → EINVAL
bool is_opsize_relative_branch(const Insn& i);  // 66 + jmp/jcc/call rel → EINVAL
bool is_addr32_rip_relative(const Insn& i);     // 67 + [eip+disp] → EINVAL
bool is_interrupt_enable(const Insn& i);        // sti → EINVAL

// ---- Shape predicates (not refusals).
bool is_relative_branch(const Insn& i);
bool is_rip_relative(const Insn& i);
bool is_ftrace_nop(const Insn& i);  // exactly 0f 1f 44 00 00
bool is_endbr(const Insn& i);
bool is_skippable(const Insn& i);  // nop of any length, endbr
// True when function[k] is a trap byte (int3/ICEBP) that is padding, which no path runs, so a
// walk from the function's start may step over it. Padding is a run of trap bytes that starts
// right after an instruction execution never goes past:
//   - ret, jmp rel, jmp r/m (straight-line-speculation hardening puts an int3 after each, and
//     alignment may add more), iret, sysret, sysexit (they go to another context);
//   - ud0/ud1/ud2, but only when the run fills the rest of the function: a BUG() that ends it
//     (Linux 6.1's __pv_queued_spin_unlock_slowpath ends `ud2; int3 × 9`). A WARN()'s ud2 goes
//     on with the next instruction once the kernel has reported it, so a trap byte right after
//     one in the middle of a function is somebody else's breakpoint.
// A call, even to a function that never returns, does not start padding: nothing here knows
// which callees return. Nor does a far transfer (an lcall comes back). `function` is
// decode_function() of the whole function.
bool is_padding_trap(std::span<const Insn> function, std::size_t k);

// True when a copy of `i` followed by `jmp rel32` back behaves like `i` in place (after the
// RIP-relative fixup): no refusal applies and `i` is not a branch.
bool can_boost(const Insn& i);

// The gate: the plan for a probe on `i`, or the first refusal (EBUSY/EINVAL) with a message
// "<insn>: <reason>".
[[nodiscard]] Result<Plan> analyze(const Insn& i);

// Why Xen's HVM instruction emulator (what a vm_event EMULATE answer runs) would not execute
// the instruction the way the CPU does, or nothing. Without a slot (agentless probing) such
// an instruction cannot be probed: Xen would inject #UD into the guest, or run a rep string
// instruction in chunks that each trap again. From Xen 4.17's x86_emulate.c and
// hvm/emulate.c (see docs/probes.md, "The vm_event channel").
[[nodiscard]] std::optional<std::string> xen_emulator_refusal(const Insn& i);

// A probe requested on the endbr64 that starts a function moves to the next instruction, as
// kprobes does: with IBT on, an int3 over the endbr turns every indirect call of the function
// into a #CP. Anywhere else the address is returned unchanged. `function` is decode_function().
Gva adjust_probe_address(std::span<const Insn> function, Gva requested);

// ---- Branch emulation (pure functions).

// The registers emulation reads; the engine fills it from its register set.
struct CpuState {
  std::array<std::uint64_t, 16> gpr{};  // indexed by Reg (rax=0 … r15=15)
  std::uint64_t rflags = 0;
  std::uint64_t fs_base = 0;
  std::uint64_t gs_base = 0;
};

inline constexpr std::uint64_t kFlagCf = 1u << 0, kFlagPf = 1u << 2, kFlagZf = 1u << 6, kFlagSf = 1u << 7,
                               kFlagOf = 1u << 11;

struct BranchOutcome {
  Gva next_rip{};
  bool push_return = false;  // call: RSP -= 8, then store return_addr at [RSP]
  Gva return_addr{};
  std::uint32_t release_bytes = 0;  // ret: RSP += release_bytes (8 + imm16)
  bool writes_rcx = false;          // loop*: RCX (ECX with 67) becomes `rcx`
  std::uint64_t rcx = 0;
};

// True when condition `cc` holds for `rflags`.
bool cond_holds(Cond cc, std::uint64_t rflags);

// Relative branches and jmp/call through a register. EINVAL for anything else.
[[nodiscard]] Result<BranchOutcome> branch_outcome(const Insn& i, const CpuState& s);

// The address whose 8 bytes are the target of jmp/call through memory (RIP-relative operands
// are relative to the original next instruction). EINVAL if `i` has no memory operand.
[[nodiscard]] Result<Gva> effective_address(const Insn& i, const CpuState& s);

// ret / ret imm16 (`loaded` = the qword at RSP) and jmp/call through memory (`loaded` = the
// qword at effective_address()). EINVAL for anything else.
[[nodiscard]] Result<BranchOutcome> loaded_branch_outcome(const Insn& i, std::uint64_t loaded);

}  // namespace xenprobes::x86
