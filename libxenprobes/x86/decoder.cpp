// The only Capstone user of libxenprobes: turns bytes into our Insn (insn.hpp).
#include <capstone/capstone.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "x86/insn.hpp"

namespace xenprobes::x86 {
namespace {

// One handle per thread: cs_disasm on a shared handle is not documented as thread-safe. With
// it, the one cs_insn (and its detail) that relative_branches() decodes every instruction into.
class Handle {
 public:
  Handle() {
    ok_ = cs_open(CS_ARCH_X86, CS_MODE_64, &h_) == CS_ERR_OK && cs_option(h_, CS_OPT_DETAIL, CS_OPT_ON) == CS_ERR_OK;
    if (ok_) insn_ = cs_malloc(h_);
  }
  ~Handle() {
    if (insn_ != nullptr) cs_free(insn_, 1);
    if (h_ != 0) cs_close(&h_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  bool ok() const { return ok_; }
  csh get() const { return h_; }
  cs_insn* insn() const { return insn_; }  // nullptr when it could not be allocated

 private:
  csh h_ = 0;
  bool ok_ = false;
  cs_insn* insn_ = nullptr;
};

Handle& handle() {
  thread_local Handle h;
  return h;
}

// Frees what cs_disasm allocated, whatever path we leave by.
struct InsnGuard {
  cs_insn* p = nullptr;
  std::size_t n = 0;
  ~InsnGuard() {
    if (p != nullptr) cs_free(p, n);
  }
};

Reg reg_of(unsigned r) {
  switch (r) {
    case X86_REG_RAX:
    case X86_REG_EAX: return Reg::Rax;
    case X86_REG_RCX:
    case X86_REG_ECX: return Reg::Rcx;
    case X86_REG_RDX:
    case X86_REG_EDX: return Reg::Rdx;
    case X86_REG_RBX:
    case X86_REG_EBX: return Reg::Rbx;
    case X86_REG_RSP:
    case X86_REG_ESP: return Reg::Rsp;
    case X86_REG_RBP:
    case X86_REG_EBP: return Reg::Rbp;
    case X86_REG_RSI:
    case X86_REG_ESI: return Reg::Rsi;
    case X86_REG_RDI:
    case X86_REG_EDI: return Reg::Rdi;
    case X86_REG_R8:
    case X86_REG_R8D: return Reg::R8;
    case X86_REG_R9:
    case X86_REG_R9D: return Reg::R9;
    case X86_REG_R10:
    case X86_REG_R10D: return Reg::R10;
    case X86_REG_R11:
    case X86_REG_R11D: return Reg::R11;
    case X86_REG_R12:
    case X86_REG_R12D: return Reg::R12;
    case X86_REG_R13:
    case X86_REG_R13D: return Reg::R13;
    case X86_REG_R14:
    case X86_REG_R14D: return Reg::R14;
    case X86_REG_R15:
    case X86_REG_R15D: return Reg::R15;
    case X86_REG_RIP:
    case X86_REG_EIP: return Reg::Rip;
    default: return Reg::None;
  }
}

Seg seg_of(unsigned r) {
  switch (r) {
    case X86_REG_ES: return Seg::Es;
    case X86_REG_CS: return Seg::Cs;
    case X86_REG_SS: return Seg::Ss;
    case X86_REG_DS: return Seg::Ds;
    case X86_REG_FS: return Seg::Fs;
    case X86_REG_GS: return Seg::Gs;
    default: return Seg::None;
  }
}

bool jcc_cond(unsigned id, Cond& cc) {
  switch (id) {
    case X86_INS_JO: cc = Cond::O; return true;
    case X86_INS_JNO: cc = Cond::NO; return true;
    case X86_INS_JB: cc = Cond::B; return true;
    case X86_INS_JAE: cc = Cond::AE; return true;
    case X86_INS_JE: cc = Cond::E; return true;
    case X86_INS_JNE: cc = Cond::NE; return true;
    case X86_INS_JBE: cc = Cond::BE; return true;
    case X86_INS_JA: cc = Cond::A; return true;
    case X86_INS_JS: cc = Cond::S; return true;
    case X86_INS_JNS: cc = Cond::NS; return true;
    case X86_INS_JP: cc = Cond::P; return true;
    case X86_INS_JNP: cc = Cond::NP; return true;
    case X86_INS_JL: cc = Cond::L; return true;
    case X86_INS_JGE: cc = Cond::GE; return true;
    case X86_INS_JLE: cc = Cond::LE; return true;
    case X86_INS_JG: cc = Cond::G; return true;
    default: return false;
  }
}

// The first memory operand (the one Insn::mem describes), or nullptr.
const cs_x86_op* first_mem(const cs_x86& x) {
  for (int i = 0; i < x.op_count; ++i)
    if (x.operands[i].type == X86_OP_MEM) return &x.operands[i];
  return nullptr;
}

// Capstone names the base of an addr32 (0x67) RIP-relative operand EIP; reg_of maps both to Rip.
bool is_rip(const cs_x86_op& mem) { return reg_of(mem.mem.base) == Reg::Rip; }

// Where the disp32 of a RIP-relative operand whose displacement Capstone says is `disp` starts
// in the instruction, or 0 when its bytes hold no such field (decode() refuses it). RIP-relative
// is always ModRM mod=00 rm=101 followed by a disp32 (never a SIB). Capstone 4.0.2 reports
// disp_size 2 when a 66 prefix is present (`66 89 05 <disp32>` = mov word [rip+X], ax), so the
// field is derived from the ModRM offset and its value cross-checked.
unsigned rip_disp32_at(const cs_insn& ci, std::int64_t disp) {
  const cs_x86& x = ci.detail->x86;
  const unsigned at = x.encoding.modrm_offset + 1u;
  if (x.encoding.modrm_offset == 0 || at + 4u > ci.size) return 0;
  std::uint32_t u = 0;
  for (unsigned k = 0; k < 4; ++k) u |= static_cast<std::uint32_t>(ci.bytes[at + k]) << (8 * k);
  return static_cast<std::int32_t>(u) == disp ? at : 0;
}

// Sets kind/branch (and the branch's operands) from Capstone's instruction id.
void classify(const cs_insn& ci, Insn& out) {
  const cs_x86& x = ci.detail->x86;
  const bool op0_imm = x.op_count > 0 && x.operands[0].type == X86_OP_IMM;
  const bool op0_reg = x.op_count > 0 && x.operands[0].type == X86_OP_REG;
  auto relative = [&](BranchKind b) {
    out.kind = Kind::Branch;
    out.branch = b;
    if (op0_imm) out.branch_target = Gva{static_cast<std::uint64_t>(x.operands[0].imm)};
  };
  switch (ci.id) {
    case X86_INS_NOP: out.kind = Kind::Nop; return;
    case X86_INS_ENDBR64:
    case X86_INS_ENDBR32: out.kind = Kind::Endbr; return;
    case X86_INS_INT3: out.kind = Kind::Int3; return;
    case X86_INS_INT1: out.kind = Kind::Int1; return;
    case X86_INS_INT: out.kind = Kind::IntN; return;
    case X86_INS_INTO: out.kind = Kind::Into; return;
    case X86_INS_HLT: out.kind = Kind::Hlt; return;
    case X86_INS_IRET:
    case X86_INS_IRETD:
    case X86_INS_IRETQ: out.kind = Kind::Iret; return;
    case X86_INS_SYSRET: out.kind = Kind::Sysret; return;
#if CS_API_MAJOR >= 5
    case X86_INS_SYSRETQ: out.kind = Kind::Sysret; return;  // 48 0f 07: its own id in Capstone 5
#endif
    case X86_INS_SYSEXIT: out.kind = Kind::Sysexit; return;
    case X86_INS_SYSCALL: out.kind = Kind::Syscall; return;
    case X86_INS_SYSENTER: out.kind = Kind::Sysenter; return;
    case X86_INS_UD0:
    case X86_INS_UD2:
#if CS_API_MAJOR >= 5
    case X86_INS_UD1:  // 0f b9: Capstone 5's name
#else
    case X86_INS_UD2B:  // 0f b9 (UD1): Capstone 4's name
#endif
      out.kind = Kind::Ud;
      return;
    case X86_INS_SWAPGS: out.kind = Kind::Swapgs; return;
    case X86_INS_PUSHF:
    case X86_INS_PUSHFD:
    case X86_INS_PUSHFQ: out.kind = Kind::Pushf; return;
    case X86_INS_POPF:
    case X86_INS_POPFD:
    case X86_INS_POPFQ: out.kind = Kind::Popf; return;
    case X86_INS_CLI: out.kind = Kind::Cli; return;
    case X86_INS_STI: out.kind = Kind::Sti; return;
    case X86_INS_MOV:
    case X86_INS_POP:
      if (op0_reg && x.operands[0].reg == X86_REG_SS) out.kind = Kind::LoadSs;
      return;
    case X86_INS_XBEGIN:
      out.kind = Kind::Xbegin;
      if (op0_imm) out.branch_target = Gva{static_cast<std::uint64_t>(x.operands[0].imm)};
      return;
    case X86_INS_JMP:
    case X86_INS_CALL:
      // FF /3 and FF /5 are far call and far jmp through memory (m16:64): Capstone 4 names
      // them LCALL/LJMP, Capstone 5 plain CALL/JMP, so the ModRM reg field decides.
      if (x.opcode[0] == 0xff && (((x.modrm >> 3) & 7) == 3 || ((x.modrm >> 3) & 7) == 5)) {
        out.kind = Kind::Branch;
        out.branch = BranchKind::Far;
        return;
      }
      if (ci.id == X86_INS_CALL) {
        if (op0_imm) {
          relative(BranchKind::Call);
        } else {
          out.kind = Kind::Branch;
          out.branch = BranchKind::CallIndirect;
          if (op0_reg) out.indirect_reg = reg_of(x.operands[0].reg);
        }
        return;
      }
      if (op0_imm) {
        relative(BranchKind::Jmp);
      } else {
        out.kind = Kind::Branch;
        out.branch = BranchKind::JmpIndirect;
        if (op0_reg) out.indirect_reg = reg_of(x.operands[0].reg);
      }
      return;
    case X86_INS_LOOP: relative(BranchKind::Loop); return;
    case X86_INS_LOOPE: relative(BranchKind::Loope); return;
    case X86_INS_LOOPNE: relative(BranchKind::Loopne); return;
    case X86_INS_JRCXZ:
    case X86_INS_JECXZ:
    case X86_INS_JCXZ: relative(BranchKind::Jrcxz); return;
    case X86_INS_RET:
      out.kind = Kind::Branch;
      out.branch = BranchKind::Ret;
      if (op0_imm) out.ret_imm = static_cast<std::uint16_t>(x.operands[0].imm);
      return;
    case X86_INS_LJMP:
    case X86_INS_LCALL:
    case X86_INS_RETF:
    case X86_INS_RETFQ:
      out.kind = Kind::Branch;
      out.branch = BranchKind::Far;
      return;
    default: {
      Cond cc{};
      if (jcc_cond(ci.id, cc)) {
        relative(BranchKind::Jcc);
        out.cc = cc;
      }
      return;
    }
  }
}

// Whether classify() makes `ci` a relative branch (Insn::is_relative_branch()), and its
// target as classify() sets branch_target (0 when the operand is no immediate), without an
// Insn: relative_branches()'s test compares the two over whole kernels.
bool relative_branch(const cs_insn& ci, std::uint64_t& target) {
  const cs_x86& x = ci.detail->x86;
  const bool op0_imm = x.op_count > 0 && x.operands[0].type == X86_OP_IMM;
  target = op0_imm ? static_cast<std::uint64_t>(x.operands[0].imm) : 0;
  switch (ci.id) {
    case X86_INS_JMP:
    case X86_INS_CALL:  // far through memory (FF /3, FF /5) or indirect: not relative
      return !(x.opcode[0] == 0xff && (((x.modrm >> 3) & 7) == 3 || ((x.modrm >> 3) & 7) == 5)) && op0_imm;
    case X86_INS_LOOP:
    case X86_INS_LOOPE:
    case X86_INS_LOOPNE:
    case X86_INS_JRCXZ:
    case X86_INS_JECXZ:
    case X86_INS_JCXZ: return true;
    default: {
      Cond cc{};
      return jcc_cond(ci.id, cc);
    }
  }
}

}  // namespace

std::string hex_addr(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string hex_bytes(std::span<const std::uint8_t> bytes) {
  std::string s;
  for (std::uint8_t b : bytes) {
    char buf[4];
    std::snprintf(buf, sizeof buf, s.empty() ? "%02x" : " %02x", b);
    s += buf;
  }
  return s;
}

std::string Insn::describe() const {
  return hex_addr(address.value) + ": " + hex_bytes(code()) + " (" + mnemonic + (op_str.empty() ? "" : " " + op_str) +
         ")";
}

Result<Insn> decode(std::span<const std::uint8_t> bytes, Gva addr) {
  Handle& h = handle();
  if (!h.ok()) return fail(Errc::NotSupported, "capstone: cannot open an x86-64 handle");
  const std::size_t avail = std::min(bytes.size(), kMaxInsnLen);
  InsnGuard g;
  g.n = cs_disasm(h.get(), bytes.data(), avail, addr.value, 1, &g.p);
  if (g.n == 0) {
    // Capstone reports truncated and invalid input the same way (cs_errno stays CS_ERR_OK).
    return fail(Errc::IllegalSequence,
                "no valid x86-64 instruction at " + hex_addr(addr.value) + ": bytes [" + hex_bytes(bytes.first(avail)) +
                    "]" +
                    (avail < kMaxInsnLen ? " (invalid, or truncated: only " + std::to_string(avail) + " byte(s) given)"
                                         : " (invalid)"));
  }
  const cs_insn& ci = g.p[0];
  const cs_x86& x = ci.detail->x86;

  Insn out;
  out.address = addr;
  out.length = static_cast<std::uint8_t>(ci.size);
  std::copy_n(ci.bytes, ci.size, out.bytes.begin());
  out.mnemonic = ci.mnemonic;
  out.op_str = ci.op_str;
  for (int i = 0; i < 4; ++i) out.prefixes[i] = x.prefix[i];
  out.rex = x.rex;
  out.has_modrm = x.encoding.modrm_offset != 0;
  out.disp_offset = x.encoding.disp_offset;
  out.disp_size = x.encoding.disp_size;
  out.imm_offset = x.encoding.imm_offset;
  out.imm_size = x.encoding.imm_size;

  if (const cs_x86_op* op = first_mem(x)) {
    out.mem.present = true;
    out.mem.seg = seg_of(op->mem.segment);
    out.mem.base = reg_of(op->mem.base);
    out.mem.index = reg_of(op->mem.index);
    out.mem.scale = static_cast<std::uint8_t>(op->mem.scale);
    out.mem.disp = op->mem.disp;
    out.mem.addr32 = x.prefix[3] == 0x67;
    out.is_rip_relative = is_rip(*op);
  }
  if (out.is_rip_relative) {
    const unsigned at = rip_disp32_at(ci, out.mem.disp);
    if (at == 0) {
      return fail(Errc::IllegalSequence, "RIP-relative operand without a disp32 after ModRM at " +
                                             hex_addr(addr.value) + ": bytes [" + hex_bytes(out.code()) + "]");
    }
    out.disp_offset = static_cast<std::uint8_t>(at);
    out.disp_size = 4;
  }
  classify(ci, out);
  return out;
}

Result<std::vector<Insn>> decode_function(std::span<const std::uint8_t> bytes, Gva start) {
  std::vector<Insn> out;
  std::size_t off = 0;
  while (off < bytes.size()) {
    auto r = decode(bytes.subspan(off), start + off);
    if (!r) {
      return fail(Errc::IllegalSequence,
                  "function at " + hex_addr(start.value) + ", offset " + hex_addr(off) + ": " + r.error().what);
    }
    off += r->length;
    out.push_back(std::move(*r));
  }
  return out;
}

Result<Insn> decode_at(std::span<const std::uint8_t> function_bytes, Gva func_start, Gva target) {
  if (target.value < func_start.value || target.value - func_start.value >= function_bytes.size()) {
    return fail(Errc::InvalidArgument, hex_addr(target.value) + " is outside the function at " +
                                           hex_addr(func_start.value) + " (" + std::to_string(function_bytes.size()) +
                                           " bytes)");
  }
  const std::uint64_t want = target.value - func_start.value;
  std::size_t off = 0;
  while (off < function_bytes.size()) {
    auto r = decode(function_bytes.subspan(off), func_start + off);
    if (!r) {
      return fail(Errc::IllegalSequence, "cannot reach " + hex_addr(target.value) + " from the function start " +
                                             hex_addr(func_start.value) + ": " + r.error().what);
    }
    if (off == want) return std::move(*r);
    if (want < off + r->length) {
      return fail(Errc::IllegalSequence, hex_addr(target.value) + " is not an instruction boundary: it is byte " +
                                             std::to_string(want - off) + " of the instruction starting at " +
                                             r->describe());
    }
    off += r->length;
  }
  return fail(Errc::IllegalSequence, "unreachable: " + hex_addr(target.value));  // not reached
}

namespace {

// decode_function()'s walk without an Insn: every instruction of `bytes` decoded into the
// thread's one cs_insn, with decode()'s refusals (no valid instruction in kMaxInsnLen bytes, a
// RIP-relative operand without its disp32), `each(ci, off)` called for every one in order. Fails
// exactly where decode_function() fails.
template <class Each>
Result<void> each_insn(std::span<const std::uint8_t> bytes, Gva start, Each&& each) {
  Handle& h = handle();
  if (!h.ok() || h.insn() == nullptr) return fail(Errc::NotSupported, "capstone: cannot open an x86-64 handle");
  cs_insn* ci = h.insn();
  std::size_t off = 0;
  while (off < bytes.size()) {
    // What decode() gives cs_disasm: at most kMaxInsnLen bytes.
    const std::uint8_t* code = bytes.data() + off;
    std::size_t avail = std::min(bytes.size() - off, kMaxInsnLen);
    std::uint64_t at = start.value + off;
    if (!cs_disasm_iter(h.get(), &code, &avail, &at, ci)) {
      return fail(Errc::IllegalSequence, "function at " + hex_addr(start.value) + ", offset " + hex_addr(off) +
                                             ": no valid x86-64 instruction");
    }
    const cs_x86_op* mem = first_mem(ci->detail->x86);
    if (mem != nullptr && is_rip(*mem) && rip_disp32_at(*ci, mem->mem.disp) == 0) {
      return fail(Errc::IllegalSequence, "function at " + hex_addr(start.value) + ", offset " + hex_addr(off) +
                                             ": RIP-relative operand without a disp32 after ModRM");
    }
    each(*ci, off);
    off += ci->size;
  }
  return {};
}

}  // namespace

Result<void> relative_branches(std::span<const std::uint8_t> bytes, Gva start, std::vector<RelativeBranch>& out) {
  out.clear();
  return each_insn(bytes, start, [&](const cs_insn& ci, std::size_t off) {
    if (std::uint64_t target = 0; relative_branch(ci, target)) out.push_back({start + off, Gva{target}});
  });
}

// materialized_addresses() (x86/jump_safety.cpp) of the Insn decode() would make of `ci`, from
// the same Capstone fields decode() copies into it: the memory operand's target when it is
// RIP-relative (the next instruction + disp) or absolute with a disp32 (no base: decode() sets
// mem.base from reg_of(), and takes disp_size from Capstone unless RIP-relative), then the
// immediate of 4 or 8 bytes of anything but a relative branch or xbegin.
Result<void> formed_addresses(std::span<const std::uint8_t> bytes, Gva start, std::vector<FormedAddress>& out) {
  out.clear();
  return each_insn(bytes, start, [&](const cs_insn& ci, std::size_t off) {
    const cs_x86& x = ci.detail->x86;
    const Gva by = start + off;
    if (const cs_x86_op* mem = first_mem(x)) {
      if (is_rip(*mem)) out.push_back({by, by.value + ci.size + static_cast<std::uint64_t>(mem->mem.disp)});
      else if (reg_of(mem->mem.base) == Reg::None && x.encoding.disp_size == 4)
        out.push_back({by, static_cast<std::uint64_t>(mem->mem.disp)});
    }
    const unsigned imm_at = x.encoding.imm_offset, imm_size = x.encoding.imm_size;
    if ((imm_size != 4 && imm_size != 8) || imm_at + imm_size > ci.size || ci.id == X86_INS_XBEGIN) return;
    if (std::uint64_t target = 0; relative_branch(ci, target)) return;
    std::uint64_t v = 0;
    if (imm_size == 8) {
      std::memcpy(&v, ci.bytes + imm_at, 8);
    } else {
      std::int32_t w = 0;
      std::memcpy(&w, ci.bytes + imm_at, 4);
      v = static_cast<std::uint64_t>(static_cast<std::int64_t>(w));
    }
    out.push_back({by, v});
  });
}

}  // namespace xenprobes::x86
