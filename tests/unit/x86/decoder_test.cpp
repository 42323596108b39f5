// Decoding and the instruction-boundary check.
#include <gtest/gtest.h>

#include <vector>

#include "x86/insn.hpp"

namespace xenprobes::x86 {
namespace {

constexpr Gva kBase{0xffffffff81000000};

TEST(Decode, RipRelativeLoadFields) {
  // ffffffff81000000: 48 8b 05 f9 0f 00 00    mov rax, qword ptr [rip + 0xff9]
  const std::vector<std::uint8_t> b = {0x48, 0x8b, 0x05, 0xf9, 0x0f, 0x00, 0x00};
  auto r = decode(b, kBase);
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(r->length, 7);
  EXPECT_EQ(r->mnemonic, "mov");
  EXPECT_EQ(r->kind, Kind::Other);
  EXPECT_EQ(r->branch, BranchKind::None);
  EXPECT_TRUE(r->has_modrm);
  EXPECT_TRUE(r->is_rip_relative);
  EXPECT_EQ(r->disp_offset, 3);
  EXPECT_EQ(r->disp_size, 4);
  EXPECT_EQ(r->rex, 0x48);
  EXPECT_EQ(r->mem.base, Reg::Rip);
  EXPECT_EQ(r->mem.disp, 0xff9);
  EXPECT_EQ(r->next(), kBase + 7);
}

TEST(Decode, CmpRipRelativeWithImmediate) {
  // 80 3d 10 00 00 00 05    cmp byte ptr [rip + 0x10], 5   (disp at 2, imm8 at 6)
  const std::vector<std::uint8_t> b = {0x80, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x05};
  auto r = decode(b, kBase);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->is_rip_relative);
  EXPECT_EQ(r->disp_offset, 2);
  EXPECT_EQ(r->imm_offset, 6);
  EXPECT_EQ(r->imm_size, 1);
}

TEST(Decode, RipRelativeDispFieldUnderOperandSizePrefix) {
  // Capstone 4.0.2 reports disp_size 2 for these; the field is a disp32 all the same.
  // 66 89 05 10 00 00 00            mov word ptr [rip + 0x10], ax
  // 66 c7 05 10 00 00 00 34 12      mov word ptr [rip + 0x10], 0x1234
  // 66 0f 6f 05 10 00 00 00         movdqa xmm0, xmmword ptr [rip + 0x10]
  const std::vector<std::vector<std::uint8_t>> cases = {{0x66, 0x89, 0x05, 0x10, 0x00, 0x00, 0x00},
                                                        {0x66, 0xc7, 0x05, 0x10, 0x00, 0x00, 0x00, 0x34, 0x12},
                                                        {0x66, 0x0f, 0x6f, 0x05, 0x10, 0x00, 0x00, 0x00}};
  const unsigned offsets[] = {3, 3, 4};
  for (std::size_t k = 0; k < cases.size(); ++k) {
    auto r = decode(cases[k], kBase);
    ASSERT_TRUE(r) << r.error().what;
    EXPECT_TRUE(r->is_rip_relative);
    EXPECT_EQ(r->disp_offset, offsets[k]) << r->describe();
    EXPECT_EQ(r->disp_size, 4) << r->describe();
  }
}

TEST(Decode, RelativeBranchTargets) {
  // ffffffff81000000: e8 fb 0f 00 00    call 0xffffffff81001000
  auto call = decode(std::vector<std::uint8_t>{0xe8, 0xfb, 0x0f, 0x00, 0x00}, kBase);
  ASSERT_TRUE(call);
  EXPECT_EQ(call->branch, BranchKind::Call);
  EXPECT_EQ(call->branch_target, Gva{0xffffffff81001000});
  EXPECT_EQ(call->imm_offset, 1);
  EXPECT_EQ(call->imm_size, 4);
  // ffffffff81000000: 75 fe             jne 0xffffffff81000000 (itself)
  auto jne = decode(std::vector<std::uint8_t>{0x75, 0xfe}, kBase);
  ASSERT_TRUE(jne);
  EXPECT_EQ(jne->branch, BranchKind::Jcc);
  EXPECT_EQ(jne->cc, Cond::NE);
  EXPECT_EQ(jne->branch_target, kBase);
  // ffffffff81000000: 0f 8c 00 01 00 00 jl 0xffffffff81000106
  auto jl = decode(std::vector<std::uint8_t>{0x0f, 0x8c, 0x00, 0x01, 0x00, 0x00}, kBase);
  ASSERT_TRUE(jl);
  EXPECT_EQ(jl->cc, Cond::L);
  EXPECT_EQ(jl->branch_target, kBase + 0x106);
  // e2 fe loop $ ; e1 fe loope $ ; e0 fe loopne $ ; e3 fe jrcxz $
  const std::pair<std::uint8_t, BranchKind> loops[] = {
      {0xe2, BranchKind::Loop}, {0xe1, BranchKind::Loope}, {0xe0, BranchKind::Loopne}, {0xe3, BranchKind::Jrcxz}};
  for (auto [op, kind] : loops) {
    auto r = decode(std::vector<std::uint8_t>{op, 0xfe}, kBase);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->branch, kind) << r->describe();
    EXPECT_EQ(r->branch_target, kBase);
  }
}

TEST(Decode, IndirectAndReturn) {
  // ff e0              jmp rax
  auto jr = decode(std::vector<std::uint8_t>{0xff, 0xe0}, kBase);
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->branch, BranchKind::JmpIndirect);
  EXPECT_EQ(jr->indirect_reg, Reg::Rax);
  // 41 ff d3           call r11
  auto cr = decode(std::vector<std::uint8_t>{0x41, 0xff, 0xd3}, kBase);
  ASSERT_TRUE(cr);
  EXPECT_EQ(cr->branch, BranchKind::CallIndirect);
  EXPECT_EQ(cr->indirect_reg, Reg::R11);
  // ff 24 c5 00 10 00 81   jmp qword ptr [rax*8 - 0x7effefff]  (jump table)
  auto jt = decode(std::vector<std::uint8_t>{0xff, 0x24, 0xc5, 0x00, 0x10, 0x00, 0x81}, kBase);
  ASSERT_TRUE(jt);
  EXPECT_EQ(jt->branch, BranchKind::JmpIndirect);
  EXPECT_EQ(jt->indirect_reg, Reg::None);
  EXPECT_TRUE(jt->mem.present);
  EXPECT_EQ(jt->mem.base, Reg::None);
  EXPECT_EQ(jt->mem.index, Reg::Rax);
  EXPECT_EQ(jt->mem.scale, 8);
  EXPECT_EQ(jt->mem.disp, static_cast<std::int32_t>(0x81001000));
  // c2 10 00           ret 0x10
  auto ret = decode(std::vector<std::uint8_t>{0xc2, 0x10, 0x00}, kBase);
  ASSERT_TRUE(ret);
  EXPECT_EQ(ret->branch, BranchKind::Ret);
  EXPECT_EQ(ret->ret_imm, 0x10);
}

TEST(Decode, KindsAndPrefixes) {
  struct Case {
    std::vector<std::uint8_t> b;
    Kind kind;
  } cases[] = {
      {{0x90}, Kind::Nop},                                   // nop
      {{0x66, 0x90}, Kind::Nop},                             // xchg ax, ax (2-byte nop)
      {{0x0f, 0x1f, 0x44, 0x00, 0x00}, Kind::Nop},           // nop dword ptr [rax + rax] (ftrace)
      {{0xf3, 0x0f, 0x1e, 0xfa}, Kind::Endbr},               // endbr64
      {{0xcc}, Kind::Int3},                                  // int3
      {{0xf1}, Kind::Int1},                                  // int1 / icebp
      {{0xcd, 0x80}, Kind::IntN},                            // int 0x80
      {{0xf4}, Kind::Hlt},                                   // hlt
      {{0x48, 0xcf}, Kind::Iret},                            // iretq
      {{0x48, 0x0f, 0x07}, Kind::Sysret},                    // sysretq
      {{0x0f, 0x35}, Kind::Sysexit},                         // sysexit
      {{0x0f, 0x05}, Kind::Syscall},                         // syscall
      {{0x0f, 0x34}, Kind::Sysenter},                        // sysenter
      {{0x0f, 0x0b}, Kind::Ud},                              // ud2
      {{0x0f, 0xb9}, Kind::Ud},                              // ud1 (Capstone 4: "ud2b")
      {{0x0f, 0x01, 0xf8}, Kind::Swapgs},                    // swapgs
      {{0x8e, 0xd0}, Kind::LoadSs},                          // mov ss, eax
      {{0x9c}, Kind::Pushf},                                 // pushfq
      {{0x9d}, Kind::Popf},                                  // popfq
      {{0xfa}, Kind::Cli},                                   // cli
      {{0xfb}, Kind::Sti},                                   // sti
      {{0xc7, 0xf8, 0x00, 0x00, 0x00, 0x00}, Kind::Xbegin},  // xbegin $+6
      {{0x48, 0x89, 0xe5}, Kind::Other},                     // mov rbp, rsp
  };
  for (const auto& c : cases) {
    auto r = decode(c.b, kBase);
    ASSERT_TRUE(r) << r.error().what;
    EXPECT_EQ(r->kind, c.kind) << r->describe();
    EXPECT_EQ(r->length, c.b.size()) << r->describe();
  }
  // f0 48 0f b1 0e     lock cmpxchg qword ptr [rsi], rcx
  auto lk = decode(std::vector<std::uint8_t>{0xf0, 0x48, 0x0f, 0xb1, 0x0e}, kBase);
  ASSERT_TRUE(lk);
  EXPECT_TRUE(lk->has_lock());
  // 65 48 8b 04 25 28 00 00 00   mov rax, qword ptr gs:[0x28]
  auto gs = decode(std::vector<std::uint8_t>{0x65, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0}, kBase);
  ASSERT_TRUE(gs);
  EXPECT_EQ(gs->mem.seg, Seg::Gs);
  EXPECT_FALSE(gs->is_rip_relative);
}

TEST(Decode, TruncatedAndInvalidAreEilseqWithBytes) {
  // 48 8b 05 f9 0f    mov rax, [rip+…] cut after 5 of 7 bytes
  auto t = decode(std::vector<std::uint8_t>{0x48, 0x8b, 0x05, 0xf9, 0x0f}, kBase);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, Errc::IllegalSequence);
  EXPECT_NE(t.error().what.find("48 8b 05 f9 0f"), std::string::npos) << t.error().what;
  EXPECT_NE(t.error().what.find("0xffffffff81000000"), std::string::npos) << t.error().what;
  // 06: push es, invalid in 64-bit mode
  auto inv = decode(std::vector<std::uint8_t>{0x06, 0x90, 0x90}, kBase);
  ASSERT_FALSE(inv);
  EXPECT_EQ(inv.error().code, Errc::IllegalSequence);
  auto empty = decode(std::span<const std::uint8_t>{}, kBase);
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, Errc::IllegalSequence);
}

// A little function:
//   +0  f3 0f 1e fa             endbr64
//   +4  0f 1f 44 00 00          nop dword ptr [rax + rax]   (ftrace)
//   +9  55                      push rbp
//   +a  48 89 e5                mov rbp, rsp
//   +d  48 8b 05 00 10 00 00    mov rax, qword ptr [rip + 0x1000]
//   +14 5d                      pop rbp
//   +15 c3                      ret
const std::vector<std::uint8_t> kFunc = {0xf3, 0x0f, 0x1e, 0xfa, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55, 0x48,
                                         0x89, 0xe5, 0x48, 0x8b, 0x05, 0x00, 0x10, 0x00, 0x00, 0x5d, 0xc3};

TEST(DecodeFunction, LinearFromStart) {
  auto f = decode_function(kFunc, kBase);
  ASSERT_TRUE(f) << f.error().what;
  ASSERT_EQ(f->size(), 7u);
  const unsigned offs[] = {0x0, 0x4, 0x9, 0xa, 0xd, 0x14, 0x15};
  for (std::size_t k = 0; k < 7; ++k) EXPECT_EQ((*f)[k].address, kBase + offs[k]);
}

TEST(DecodeFunction, UndecodableTailNamesOffset) {
  std::vector<std::uint8_t> b = kFunc;
  b.push_back(0x06);  // push es: invalid
  auto f = decode_function(b, kBase);
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code, Errc::IllegalSequence);
  EXPECT_NE(f.error().what.find("offset 0x16"), std::string::npos) << f.error().what;
}

TEST(DecodeAt, BoundaryAccepted) {
  auto r = decode_at(kFunc, kBase, kBase + 0xd);
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(r->mnemonic, "mov");
  EXPECT_TRUE(r->is_rip_relative);
}

TEST(DecodeAt, MidInstructionRefusedNamingEnclosing) {
  // +0x10 is byte 3 of the mov at +0xd.
  auto r = decode_at(kFunc, kBase, kBase + 0x10);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::IllegalSequence);
  EXPECT_NE(r.error().what.find("not an instruction boundary"), std::string::npos);
  EXPECT_NE(r.error().what.find("0xffffffff8100000d"), std::string::npos) << r.error().what;
  EXPECT_NE(r.error().what.find("mov"), std::string::npos) << r.error().what;
}

TEST(DecodeAt, OutsideFunctionIsEinval) {
  auto r = decode_at(kFunc, kBase, kBase + kFunc.size());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
  auto below = decode_at(kFunc, kBase, Gva{kBase.value - 1});
  ASSERT_FALSE(below);
  EXPECT_EQ(below.error().code, Errc::InvalidArgument);
}

}  // namespace
}  // namespace xenprobes::x86
