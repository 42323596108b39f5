// Slot code: exact bytes of both tails, RIP-relative rewrite (same effective address), ERANGE.
#include <gtest/gtest.h>

#include <vector>

#include "x86/analysis.hpp"
#include "x86/relocate.hpp"

namespace xenprobes::x86 {
namespace {

constexpr Gva kProbe{0xffffffff81000100};  // where the original instruction lives
constexpr Gva kSlot{0xffffffffa0000000};   // where the slot runs (module area, +512 MiB)
constexpr std::uint8_t kTrap = 0xcc;

Insn dec(std::vector<std::uint8_t> b, Gva at = kProbe) {
  auto r = decode(b, at);
  EXPECT_TRUE(r) << r.error().what;
  return r ? *r : Insn{};
}

std::vector<std::uint8_t> v(std::span<const std::uint8_t> s) { return {s.begin(), s.end()}; }

TEST(EmitJmpRel32, ForwardBackwardAndRange) {
  std::uint8_t buf[5];
  // ffffffffa0000000: e9 fb 00 00 00   jmp ffffffffa0000100
  ASSERT_EQ(emit_jmp_rel32(buf, kSlot, kSlot + 0x100).value(), 5u);
  EXPECT_EQ(v(buf), (std::vector<std::uint8_t>{0xe9, 0xfb, 0x00, 0x00, 0x00}));
  // ffffffffa0000000: e9 fb 00 00 e1   jmp ffffffff81000100 (backwards: 0xe10000fb = -0x1effff05)
  ASSERT_TRUE(emit_jmp_rel32(buf, kSlot, kProbe));
  EXPECT_EQ(v(buf), (std::vector<std::uint8_t>{0xe9, 0xfb, 0x00, 0x00, 0xe1}));
  // Exactly at the edges of rel32 reach: -2^31 and 2^31-1 from the end of the jmp.
  EXPECT_TRUE(emit_jmp_rel32(buf, kSlot, Gva{kSlot.value + 5 - 0x80000000ull}));
  EXPECT_EQ(v(buf), (std::vector<std::uint8_t>{0xe9, 0x00, 0x00, 0x00, 0x80}));
  EXPECT_TRUE(emit_jmp_rel32(buf, kSlot, Gva{kSlot.value + 5 + 0x7fffffffull}));
  auto far = emit_jmp_rel32(buf, kSlot, Gva{kSlot.value + 5 + 0x80000000ull});
  ASSERT_FALSE(far);
  EXPECT_EQ(far.error().code, Errc::Range);
  EXPECT_EQ(emit_jmp_rel32(std::span(buf).first(4), kSlot, kSlot).error().code, Errc::NoSpace);
}

TEST(EmitSlot, BoostedLayoutIsExact) {
  // ffffffff81000100: 48 89 e5   mov rbp, rsp
  const Insn i = dec({0x48, 0x89, 0xe5});
  std::vector<std::uint8_t> buf(32, 0xaa);
  auto n = emit_slot(buf, kSlot, i, i.next(), SlotTail::JmpBack, kTrap);
  ASSERT_TRUE(n) << n.error().what;
  EXPECT_EQ(*n, 8u);
  EXPECT_EQ(*n, slot_size(i, SlotTail::JmpBack));
  // ffffffffa0000000: 48 89 e5         mov rbp, rsp
  // ffffffffa0000003: e9 fb 00 00 e1   jmp ffffffff81000103
  //   rel32 = 0xffffffff81000103 - 0xffffffffa0000008 = -0x1effff05 = 0xe10000fb
  EXPECT_EQ(std::vector<std::uint8_t>(buf.begin(), buf.begin() + 9),
            (std::vector<std::uint8_t>{0x48, 0x89, 0xe5, 0xe9, 0xfb, 0x00, 0x00, 0xe1, 0xaa}));
  // Decoding the slot at its run address gives back the jump to the resume address.
  auto back = decode(std::span(buf).subspan(3), kSlot + 3);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->branch_target, i.next());
}

TEST(EmitSlot, TrapAfterLayoutIsExact) {
  // ffffffff81000100: 55   push rbp
  const Insn i = dec({0x55});
  std::vector<std::uint8_t> buf(8, 0xaa);
  auto n = emit_slot(buf, kSlot, i, i.next(), SlotTail::Trap, 0xf1);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 2u);
  // ffffffffa0000000: 55   push rbp
  // ffffffffa0000001: f1   int1 (the channel's trap byte)
  EXPECT_EQ(v(buf), (std::vector<std::uint8_t>{0x55, 0xf1, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa}));
}

// The operand's effective address, computed by decoding the bytes where they run.
Gva ea_of(std::span<const std::uint8_t> code, Gva at) {
  auto i = decode(code, at);
  EXPECT_TRUE(i) << i.error().what;
  return effective_address(*i, CpuState{}).value();
}

TEST(EmitSlot, RipRelativeKeepsEffectiveAddress) {
  const std::vector<std::vector<std::uint8_t>> cases = {
      {0x48, 0x8b, 0x05, 0xf9, 0x0f, 0x00, 0x00},                    // mov rax, [rip + 0xff9]
      {0x80, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x05},                    // cmp byte [rip + 0x10], 5  (imm after)
      {0x48, 0x8d, 0x3d, 0x00, 0xf0, 0xff, 0xff},                    // lea rdi, [rip - 0x1000]
      {0xc7, 0x05, 0x08, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00},  // mov dword [rip+8], 1
      {0xc5, 0xfa, 0x6f, 0x05, 0x00, 0x10, 0x00, 0x00},              // vmovdqu xmm0, [rip + 0x1000] (VEX)
      {0xf0, 0x48, 0x0f, 0xb1, 0x0d, 0x20, 0, 0, 0},                 // lock cmpxchg [rip + 0x20], rcx
      {0x66, 0xc7, 0x05, 0x10, 0, 0, 0, 0x34, 0x12},                 // mov word [rip + 0x10], 0x1234
      {0x66, 0x89, 0x05, 0xf0, 0xff, 0xff, 0xff},                    // mov word [rip - 0x10], ax
  };
  for (const auto& b : cases) {
    const Insn i = dec(b);
    ASSERT_TRUE(i.is_rip_relative) << i.describe();
    ASSERT_EQ(analyze(i).value(), Plan::BoostRipRel) << i.describe();
    const Gva before = effective_address(i, CpuState{}).value();
    for (Gva slot : {kSlot, Gva{kProbe.value - 0x10000000}, kProbe + 0x40}) {
      std::vector<std::uint8_t> buf(32, 0);
      auto n = emit_slot(buf, slot, i, i.next(), SlotTail::JmpBack, kTrap);
      ASSERT_TRUE(n) << n.error().what;
      EXPECT_EQ(ea_of(buf, slot), before) << i.describe() << " from slot " << hex_addr(slot.value);
      // Everything but the displacement is copied unchanged.
      for (std::size_t k = 0; k < i.length; ++k) {
        if (k >= i.disp_offset && k < i.disp_offset + 4u) continue;
        EXPECT_EQ(buf[k], b[k]) << i.describe() << " byte " << k;
      }
    }
  }
}

TEST(EmitSlot, RipRelativeOutOfReachIsErange) {
  // ffffffff81000100: 48 8b 05 f9 0f 00 00   mov rax, [rip + 0xff9]  → ffffffff810010f9
  const Insn i = dec({0x48, 0x8b, 0x05, 0xf9, 0x0f, 0x00, 0x00});
  std::vector<std::uint8_t> buf(32, 0xaa);
  const Gva too_far{0xffffffff81000100ull + 0x90000000ull};  // > 2 GiB above the operand
  auto r = emit_slot(buf, too_far, i, i.next(), SlotTail::Trap, kTrap);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Range);
  EXPECT_NE(r.error().what.find("out of rel32 reach"), std::string::npos) << r.error().what;
  EXPECT_EQ(buf, std::vector<std::uint8_t>(32, 0xaa));  // nothing written
}

TEST(EmitSlot, ResumeOutOfReachIsErangeAndNothingWritten) {
  const Insn i = dec({0x55});  // push rbp
  std::vector<std::uint8_t> buf(8, 0xaa);
  auto r = emit_slot(buf, Gva{0xffff888000000000}, i, i.next(), SlotTail::JmpBack, kTrap);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Range);
  EXPECT_EQ(buf, std::vector<std::uint8_t>(8, 0xaa));
}

TEST(EmitSlot, RefusesBranchesAndSmallBuffers) {
  std::vector<std::uint8_t> buf(32, 0);
  // 74 05  je: emulated, never copied
  auto br = emit_slot(buf, kSlot, dec({0x74, 0x05}), kProbe + 2, SlotTail::JmpBack, kTrap);
  ASSERT_FALSE(br);
  EXPECT_EQ(br.error().code, Errc::InvalidArgument);
  // c3 ret
  EXPECT_EQ(emit_slot(buf, kSlot, dec({0xc3}), kProbe + 1, SlotTail::Trap, kTrap).error().code, Errc::InvalidArgument);
  // cc int3: refused by the gate's rules
  EXPECT_EQ(emit_slot(buf, kSlot, dec({0xcc}), kProbe + 1, SlotTail::Trap, kTrap).error().code, Errc::InvalidArgument);
  // 48 89 e5 needs 8 bytes boosted
  const Insn mov = dec({0x48, 0x89, 0xe5});
  EXPECT_EQ(emit_slot(std::span(buf).first(7), kSlot, mov, mov.next(), SlotTail::JmpBack, kTrap).error().code,
            Errc::NoSpace);
  EXPECT_TRUE(emit_slot(std::span(buf).first(4), kSlot, mov, mov.next(), SlotTail::Trap, kTrap));
}

TEST(FitsRel32, Edges) {
  EXPECT_TRUE(fits_rel32(0x7fffffffll));
  EXPECT_TRUE(fits_rel32(-0x80000000ll));
  EXPECT_FALSE(fits_rel32(0x80000000ll));
  EXPECT_FALSE(fits_rel32(-0x80000001ll));
}

}  // namespace
}  // namespace xenprobes::x86
