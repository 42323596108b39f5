// Our own decoded-instruction type. decoder.cpp is the only file that includes Capstone; every
// other layer reads these fields and never looks at opcode bytes itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "xenprobes/types.hpp"

namespace xenprobes::x86 {

inline constexpr std::size_t kMaxInsnLen = 15;

// Coarse identity of an instruction, only as fine as analysis.cpp needs.
enum class Kind : std::uint8_t {
  Other,  // everything not listed below
  Nop,    // 90, 0f 1f /0 (incl. the ftrace nop5 0f 1f 44 00 00), 66 90
  Endbr,  // endbr64 / endbr32 (f3 0f 1e fa / fb)
  Int3,   // cc
  Int1,   // f1 (ICEBP)
  IntN,   // cd ib
  Into,   // ce (invalid in 64-bit mode, listed for completeness)
  Hlt,
  Iret,  // iret / iretd / iretq
  Sysret,
  Sysexit,
  Syscall,
  Sysenter,
  Ud,  // ud0 / ud1 / ud2
  Swapgs,
  LoadSs,  // mov ss, r/m and pop ss: open an interrupt shadow
  Pushf,
  Popf,
  Cli,
  Sti,
  Xbegin,  // RTM: relative abort address
  Branch,  // see BranchKind
};

enum class BranchKind : std::uint8_t {
  None,
  Jmp,           // jmp rel8/rel32
  Jcc,           // jcc rel8/rel32, condition in Insn::cc
  Call,          // call rel32
  Loop,          // loop rel8
  Loope,         // loope/loopz rel8
  Loopne,        // loopne/loopnz rel8
  Jrcxz,         // jrcxz / jecxz rel8
  Ret,           // ret / ret imm16
  JmpIndirect,   // jmp r/m64
  CallIndirect,  // call r/m64
  Far,           // ljmp, lcall, retf: change CS
};

// Condition codes in the SDM's tttn order (the low nibble of 7x / 0f 8x).
enum class Cond : std::uint8_t {
  O = 0,
  NO,
  B,
  AE,
  E,
  NE,
  BE,
  A,
  S,
  NS,
  P,
  NP,
  L,
  GE,
  LE,
  G,
};

// Registers our fields can name: the 16 GPRs (index = SDM encoding: rax=0 … r15=15), RIP, none.
enum class Reg : std::uint8_t {
  Rax,
  Rcx,
  Rdx,
  Rbx,
  Rsp,
  Rbp,
  Rsi,
  Rdi,
  R8,
  R9,
  R10,
  R11,
  R12,
  R13,
  R14,
  R15,
  Rip,
  None,
};

enum class Seg : std::uint8_t { None, Es, Cs, Ss, Ds, Fs, Gs };

// The memory operand of an instruction (the first one, if several): enough to compute the
// effective address of e.g. `jmp qword ptr [rax*8 + table]` in Dom0.
struct MemOperand {
  bool present = false;
  Seg seg = Seg::None;
  Reg base = Reg::None;  // Reg::Rip for RIP-relative
  Reg index = Reg::None;
  std::uint8_t scale = 1;
  std::int64_t disp = 0;
  bool addr32 = false;  // 67 prefix: address computed in 32 bits
};

struct Insn {
  Gva address{};
  std::uint8_t length = 0;
  std::array<std::uint8_t, kMaxInsnLen> bytes{};
  std::string mnemonic;  // for messages only
  std::string op_str;    // for messages only

  Kind kind = Kind::Other;
  BranchKind branch = BranchKind::None;
  Cond cc = Cond::O;             // valid when branch == Jcc
  Gva branch_target{};           // valid for relative branches (Jmp/Jcc/Call/Loop*/Jrcxz) and xbegin
  std::uint16_t ret_imm = 0;     // ret imm16: bytes released after the pop
  Reg indirect_reg = Reg::None;  // jmp/call through a register

  bool has_modrm = false;
  bool is_rip_relative = false;  // a memory operand based on RIP (or EIP with 67)
  std::uint8_t disp_offset = 0;  // displacement field (0 = none)
  std::uint8_t disp_size = 0;
  std::uint8_t imm_offset = 0;  // immediate field; for relative branches this is the rel8/rel32
  std::uint8_t imm_size = 0;
  MemOperand mem;

  // Legacy prefixes as Capstone groups them: [0] lock/rep (f0/f2/f3), [1] segment or branch hint
  // (2e/36/3e/26/64/65), [2] operand size (66), [3] address size (67); 0 = absent.
  std::array<std::uint8_t, 4> prefixes{};
  std::uint8_t rex = 0;

  Gva next() const { return address + length; }
  std::span<const std::uint8_t> code() const { return {bytes.data(), length}; }
  bool has_lock() const { return prefixes[0] == 0xf0; }
  bool has_opsize() const { return prefixes[2] == 0x66; }
  bool has_addr32() const { return prefixes[3] == 0x67; }
  bool is_relative_branch() const {
    switch (branch) {
      case BranchKind::Jmp:
      case BranchKind::Jcc:
      case BranchKind::Call:
      case BranchKind::Loop:
      case BranchKind::Loope:
      case BranchKind::Loopne:
      case BranchKind::Jrcxz: return true;
      default: return false;
    }
  }
  // "0xffffffff81000010: 48 8b 05 e9 0f 00 00 (mov rax, qword ptr [rip + 0xfe9])"
  std::string describe() const;
};

// Decodes one 64-bit-mode instruction at the start of `bytes`, which would be located at `addr`.
// Truncated or invalid input → EILSEQ, the message shows the address and the bytes.
[[nodiscard]] Result<Insn> decode(std::span<const std::uint8_t> bytes, Gva addr);

// Decodes linearly from a known function start to the end of `bytes` (the function's extent);
// any undecodable byte → EILSEQ naming the offset.
[[nodiscard]] Result<std::vector<Insn>> decode_function(std::span<const std::uint8_t> bytes, Gva start);

// A relative branch (Insn::is_relative_branch()) and its target (Insn::branch_target).
struct RelativeBranch {
  Gva address;
  Gva target;
};

// decode_function() reduced to what the jump probes' index uses, at a fraction of its cost (no
// Insn, one Capstone instruction per thread): fails exactly when decode_function() fails, and
// fills `out` with every instruction that is_relative_branch(), in order (cleared first; its
// contents are unspecified after a failure). A function of the whole kernel's, once per build
// (probe/jump_index.hpp).
[[nodiscard]] Result<void> relative_branches(std::span<const std::uint8_t> bytes, Gva start,
                                             std::vector<RelativeBranch>& out);

// An address an instruction forms: `value`, an operand of the instruction at `by`.
struct FormedAddress {
  Gva by;
  std::uint64_t value = 0;
};

// decode_function() + materialized_addresses() (x86/jump_safety.hpp) of every instruction,
// without an Insn, as relative_branches() is for branches: fails exactly when decode_function()
// fails, and fills `out` (cleared first; unspecified after a failure) with what
// materialized_addresses() returns for each instruction, in instruction order, each with its
// instruction. Every function of a kernel image, for the tail-call proof
// (kernel/addresses_taken.hpp).
[[nodiscard]] Result<void> formed_addresses(std::span<const std::uint8_t> bytes, Gva start,
                                            std::vector<FormedAddress>& out);

// Decodes the function from its start and returns the instruction starting at `target`.
// `target` outside the function → EINVAL; inside an instruction → EILSEQ naming the enclosing
// instruction and its start.
[[nodiscard]] Result<Insn> decode_at(std::span<const std::uint8_t> function_bytes, Gva func_start, Gva target);

// An x86 legacy prefix: lock, rep/repne, the segment overrides, operand and address size.
constexpr bool is_legacy_prefix(std::uint8_t b) {
  switch (b) {
    case 0xf0:
    case 0xf2:
    case 0xf3:
    case 0x2e:
    case 0x36:
    case 0x3e:
    case 0x26:
    case 0x64:
    case 0x65:
    case 0x66:
    case 0x67: return true;
    default: return false;
  }
}

// "48 8b 05" for messages.
std::string hex_bytes(std::span<const std::uint8_t> bytes);
std::string hex_addr(std::uint64_t v);

}  // namespace xenprobes::x86
