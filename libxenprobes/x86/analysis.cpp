#include "x86/analysis.hpp"

#include <algorithm>
#include <iterator>
#include <string>

namespace xenprobes::x86 {

std::string_view plan_name(Plan p) {
  switch (p) {
    case Plan::Boost: return "boost";
    case Plan::BoostRipRel: return "boost-riprel";
    case Plan::Skip: return "skip";
    case Plan::EmulateBranch: return "emulate-branch";
    case Plan::EmulateLoaded: return "emulate-loaded";
  }
  return "?";
}

bool is_trap_byte(const Insn& i) { return i.kind == Kind::Int3 || i.kind == Kind::Int1; }
bool is_context_return(const Insn& i) {
  return i.kind == Kind::Iret || i.kind == Kind::Sysret || i.kind == Kind::Sysexit;
}
bool is_software_interrupt(const Insn& i) {
  return i.kind == Kind::IntN || i.kind == Kind::Into || i.kind == Kind::Syscall || i.kind == Kind::Sysenter;
}
bool is_halt(const Insn& i) { return i.kind == Kind::Hlt; }
bool is_deliberate_ud(const Insn& i) { return i.kind == Kind::Ud; }
bool is_gs_swap(const Insn& i) { return i.kind == Kind::Swapgs; }
bool is_ss_load(const Insn& i) { return i.kind == Kind::LoadSs; }
bool is_far_transfer(const Insn& i) { return i.branch == BranchKind::Far; }
bool is_transaction_begin(const Insn& i) { return i.kind == Kind::Xbegin; }
bool is_opsize_relative_branch(const Insn& i) { return i.is_relative_branch() && i.has_opsize(); }
bool is_addr32_rip_relative(const Insn& i) { return i.is_rip_relative && i.has_addr32(); }
bool is_interrupt_enable(const Insn& i) { return i.kind == Kind::Sti; }

bool is_relative_branch(const Insn& i) { return i.is_relative_branch(); }
bool is_rip_relative(const Insn& i) { return i.is_rip_relative; }
bool is_ftrace_nop(const Insn& i) {
  static constexpr std::uint8_t kNop5[] = {0x0f, 0x1f, 0x44, 0x00, 0x00};
  return i.length == 5 && std::equal(std::begin(kNop5), std::end(kNop5), i.bytes.begin());
}
bool is_endbr(const Insn& i) { return i.kind == Kind::Endbr; }
bool is_skippable(const Insn& i) { return i.kind == Kind::Nop || i.kind == Kind::Endbr; }

bool is_padding_trap(std::span<const Insn> function, std::size_t k) {
  if (k >= function.size() || !is_trap_byte(function[k])) return false;
  std::size_t first = k;  // the run of trap bytes k belongs to starts at `first`
  while (first > 0 && is_trap_byte(function[first - 1])) --first;
  if (first == 0) return false;  // nothing before it: the run is not after anything
  const Insn& before = function[first - 1];
  const BranchKind b = before.branch;
  if (b == BranchKind::Ret || b == BranchKind::Jmp || b == BranchKind::JmpIndirect || is_context_return(before))
    return true;
  if (!is_deliberate_ud(before)) return false;
  for (std::size_t j = k + 1; j < function.size(); ++j)
    if (!is_trap_byte(function[j])) return false;  // code after it: the ud2 may have been a WARN()
  return true;
}

namespace {

struct Rule {
  bool (*trips)(const Insn&);
  Errc code;
  const char* why;
};

// The gate's list: the first rule that trips refuses the probe. Each reason says why running
// the instruction out of line (or emulating it) would be wrong.
constexpr Rule kRules[] = {
    {is_trap_byte, Errc::Busy, "foreign breakpoint: an int3/ICEBP is already there (a debugger, kprobes or text_poke)"},
    {is_context_return, Errc::InvalidArgument,
     "returns to another context (iret/sysret/sysexit): the probe would hijack a mode switch"},
    {is_software_interrupt, Errc::InvalidArgument,
     "software interrupt or system call: the entry path would see the slot as the return address"},
    {is_halt, Errc::InvalidArgument, "hlt parks the vCPU inside the slot until the next interrupt, pinning the slot"},
    {is_deliberate_ud, Errc::InvalidArgument,
     "deliberate #UD (BUG/WARN): the kernel's bug table knows the original address, not the slot"},
    {is_gs_swap, Errc::InvalidArgument, "swapgs: the trap would enter the guest's handler with the other GS base"},
    {is_ss_load, Errc::InvalidArgument, "loads SS: its interrupt shadow would cover the slot's tail"},
    {is_far_transfer, Errc::InvalidArgument, "far jump/call/return: changes CS"},
    {is_transaction_begin, Errc::InvalidArgument,
     "xbegin: relative abort address inside a transaction cannot be relocated or emulated"},
    {is_opsize_relative_branch, Errc::InvalidArgument,
     "operand-size prefix on a relative branch: Intel and AMD disagree on its length and target"},
    {is_addr32_rip_relative, Errc::InvalidArgument, "EIP-relative (addr32) operand: wraps at 4 GiB, not relocated"},
    {is_interrupt_enable, Errc::InvalidArgument,
     "sti: its one-instruction interrupt shadow would cover the slot's jump back instead of the next "
     "instruction (in `sti; hlt` a wakeup between the two is lost)"},
};

}  // namespace

bool can_boost(const Insn& i) {
  for (const Rule& r : kRules)
    if (r.trips(i)) return false;
  return i.branch == BranchKind::None;
}

Result<Plan> analyze(const Insn& i) {
  for (const Rule& r : kRules)
    if (r.trips(i)) return fail(r.code, i.describe() + ": " + r.why);
  switch (i.branch) {
    case BranchKind::None: break;
    case BranchKind::Jmp:
    case BranchKind::Jcc:
    case BranchKind::Call:
    case BranchKind::Loop:
    case BranchKind::Loope:
    case BranchKind::Loopne:
    case BranchKind::Jrcxz: return Plan::EmulateBranch;
    case BranchKind::JmpIndirect:
    case BranchKind::CallIndirect:
      if (i.indirect_reg != Reg::None) return Plan::EmulateBranch;
      if (i.mem.present) return Plan::EmulateLoaded;
      return fail(Errc::InvalidArgument, i.describe() + ": indirect branch with no operand");
    case BranchKind::Ret: return Plan::EmulateLoaded;
    case BranchKind::Far:  // refused by is_far_transfer
      break;
  }
  if (is_skippable(i)) return Plan::Skip;
  return i.is_rip_relative ? Plan::BoostRipRel : Plan::Boost;
}

Gva adjust_probe_address(std::span<const Insn> function, Gva requested) {
  if (function.size() >= 2 && function[0].address == requested && is_endbr(function[0])) return function[1].address;
  return requested;
}

bool cond_holds(Cond cc, std::uint64_t f) {
  const bool cf = f & kFlagCf, pf = f & kFlagPf, zf = f & kFlagZf, sf = f & kFlagSf, of = f & kFlagOf;
  // Even condition codes test a flag combination; odd ones are its negation (SDM Vol. 1 B.1).
  bool base = false;
  switch (static_cast<unsigned>(cc) >> 1) {
    case 0: base = of; break;                // O / NO
    case 1: base = cf; break;                // B / AE
    case 2: base = zf; break;                // E / NE
    case 3: base = cf || zf; break;          // BE / A
    case 4: base = sf; break;                // S / NS
    case 5: base = pf; break;                // P / NP
    case 6: base = sf != of; break;          // L / GE
    case 7: base = zf || (sf != of); break;  // LE / G
    default: break;                          // none: cc has four bits
  }
  return (static_cast<unsigned>(cc) & 1) ? !base : base;
}

Result<BranchOutcome> branch_outcome(const Insn& i, const CpuState& s) {
  BranchOutcome o;
  o.next_rip = i.next();
  // loop*/jrcxz count in ECX under an address-size prefix, RCX otherwise.
  const std::uint64_t mask = i.has_addr32() ? 0xffffffffull : ~0ull;
  const std::uint64_t rcx = s.gpr[static_cast<unsigned>(Reg::Rcx)];
  switch (i.branch) {
    case BranchKind::Jmp: o.next_rip = i.branch_target; return o;
    case BranchKind::Jcc:
      if (cond_holds(i.cc, s.rflags)) o.next_rip = i.branch_target;
      return o;
    case BranchKind::Call:
      o.push_return = true;
      o.return_addr = i.next();
      o.next_rip = i.branch_target;
      return o;
    case BranchKind::Loop:
    case BranchKind::Loope:
    case BranchKind::Loopne: {
      // loop* decrement the counter (without touching flags) before testing it.
      const std::uint64_t count = (rcx - 1) & mask;
      o.writes_rcx = true;
      o.rcx = (rcx & ~mask) | count;
      bool taken = count != 0;
      if (i.branch == BranchKind::Loope) taken = taken && (s.rflags & kFlagZf);
      if (i.branch == BranchKind::Loopne) taken = taken && !(s.rflags & kFlagZf);
      if (taken) o.next_rip = i.branch_target;
      return o;
    }
    case BranchKind::Jrcxz:
      if ((rcx & mask) == 0) o.next_rip = i.branch_target;
      return o;
    case BranchKind::JmpIndirect:
    case BranchKind::CallIndirect:
      if (i.indirect_reg == Reg::None || i.indirect_reg == Reg::Rip) break;
      o.next_rip = Gva{s.gpr[static_cast<unsigned>(i.indirect_reg)]};
      if (i.branch == BranchKind::CallIndirect) {
        o.push_return = true;
        o.return_addr = i.next();
      }
      return o;
    default: break;
  }
  return fail(Errc::InvalidArgument, i.describe() + ": not a branch emulated from registers");
}

Result<Gva> effective_address(const Insn& i, const CpuState& s) {
  if (!i.mem.present) return fail(Errc::InvalidArgument, i.describe() + ": no memory operand");
  auto reg = [&](Reg r) -> std::uint64_t {
    if (r == Reg::None) return 0;
    if (r == Reg::Rip) return i.next().value;  // RIP-relative: relative to the next instruction
    return s.gpr[static_cast<unsigned>(r)];
  };
  std::uint64_t ea = reg(i.mem.base) + reg(i.mem.index) * i.mem.scale + static_cast<std::uint64_t>(i.mem.disp);
  if (i.mem.addr32) ea &= 0xffffffffull;
  // In 64-bit mode only FS and GS have a base; the others are flat.
  if (i.mem.seg == Seg::Fs) ea += s.fs_base;
  if (i.mem.seg == Seg::Gs) ea += s.gs_base;
  return Gva{ea};
}

Result<BranchOutcome> loaded_branch_outcome(const Insn& i, std::uint64_t loaded) {
  BranchOutcome o;
  o.next_rip = Gva{loaded};
  switch (i.branch) {
    case BranchKind::Ret: o.release_bytes = 8u + i.ret_imm; return o;
    case BranchKind::JmpIndirect:
      if (!i.mem.present) break;
      return o;
    case BranchKind::CallIndirect:
      if (!i.mem.present) break;
      o.push_return = true;
      o.return_addr = i.next();
      return o;
    default: break;
  }
  return fail(Errc::InvalidArgument, i.describe() + ": not a ret or a branch through memory");
}

std::optional<std::string> xen_emulator_refusal(const Insn& i) {
  // The opcode after the legacy prefixes and REX.
  std::size_t k = 0;
  while (k < i.length && is_legacy_prefix(i.bytes[k])) ++k;
  if (k < i.length && (i.bytes[k] & 0xf0) == 0x40) ++k;
  if (k >= i.length) return std::nullopt;
  const std::uint8_t op = i.bytes[k];
  const std::uint8_t next = k + 1 < i.length ? i.bytes[k + 1] : 0;
  const bool rep = i.prefixes[0] == 0xf2 || i.prefixes[0] == 0xf3;
  if (rep && ((op >= 0x6c && op <= 0x6f) || (op >= 0xa4 && op <= 0xa7) || (op >= 0xaa && op <= 0xaf)))
    return "a rep string instruction: Xen's emulator runs it in chunks and leaves rip on it between "
           "them, so every chunk would be another hit";
  if (op == 0x0f && (next == 0x21 || next == 0x23))
    return "a debug-register move: Xen's HVM emulator has no debug-register access and would inject #UD";
  if (op == 0x0f && next == 0x01 && k + 2 < i.length) {
    const std::uint8_t modrm = i.bytes[k + 2];
    if ((modrm & 0xc0) == 0xc0) {
      // Register forms Xen 4.17 implements: clac, stac, xgetbv, xsetbv, vmfunc, xend, xtest,
      // invlpga, serialize/xsusldtrk, xresldtrk, rdpkru, wrpkru, swapgs, rdtscp, clzero,
      // smsw reg, lmsw reg. Everything else in the group (monitor, mwait, vmcall, ...) is not.
      static constexpr std::uint8_t kImplemented[] = {0xca, 0xcb, 0xd0, 0xd1, 0xd4, 0xd5, 0xd6, 0xdf,
                                                      0xe8, 0xe9, 0xee, 0xef, 0xf8, 0xf9, 0xfc};
      const bool smsw_lmsw = (modrm & 0x38) == 0x20 || (modrm & 0x38) == 0x30;
      if (!smsw_lmsw && std::find(std::begin(kImplemented), std::end(kImplemented), modrm) == std::end(kImplemented))
        return "an 0f 01 system instruction Xen's emulator does not implement (it would inject #UD)";
    }
  }
  if (op == 0x8f && (next & 0x1f) >= 8)
    return "an XOP-encoded instruction (LWP and friends): Xen's emulator would inject #UD";
  return std::nullopt;
}

}  // namespace xenprobes::x86
