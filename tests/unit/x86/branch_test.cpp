// Branch emulation: jcc conditions from RFLAGS, loop*/jrcxz from RCX, calls push the return.
#include <gtest/gtest.h>

#include <vector>

#include "x86/analysis.hpp"

namespace xenprobes::x86 {
namespace {

constexpr Gva kBase{0xffffffff81000000};

Insn dec(std::vector<std::uint8_t> b) {
  auto r = decode(b, kBase);
  EXPECT_TRUE(r) << r.error().what;
  return r ? *r : Insn{};
}

constexpr std::uint64_t CF = kFlagCf, PF = kFlagPf, ZF = kFlagZf, SF = kFlagSf, OF = kFlagOf;

// SDM Vol. 2 "Jcc": the condition each tttn tests, evaluated independently here.
bool expected(unsigned cc, std::uint64_t f) {
  const bool cf = f & CF, pf = f & PF, zf = f & ZF, sf = f & SF, of = f & OF;
  switch (cc) {
    case 0x0: return of;               // jo
    case 0x1: return !of;              // jno
    case 0x2: return cf;               // jb/jc
    case 0x3: return !cf;              // jae/jnc
    case 0x4: return zf;               // je
    case 0x5: return !zf;              // jne
    case 0x6: return cf || zf;         // jbe
    case 0x7: return !cf && !zf;       // ja
    case 0x8: return sf;               // js
    case 0x9: return !sf;              // jns
    case 0xa: return pf;               // jp
    case 0xb: return !pf;              // jnp
    case 0xc: return sf != of;         // jl
    case 0xd: return sf == of;         // jge
    case 0xe: return zf || sf != of;   // jle
    case 0xf: return !zf && sf == of;  // jg
  }
  return false;
}

TEST(BranchOutcome, EveryJccOverEveryFlagCombination) {
  const std::uint64_t flags[] = {CF, PF, ZF, SF, OF};
  for (unsigned cc = 0; cc < 16; ++cc) {
    // ffffffff81000000: 7x 10       jcc 0xffffffff81000012
    // ffffffff81000000: 0f 8x 00 10 00 00   jcc 0xffffffff81001006
    const Insn shrt = dec({static_cast<std::uint8_t>(0x70 + cc), 0x10});
    const Insn nr = dec({0x0f, static_cast<std::uint8_t>(0x80 + cc), 0x00, 0x10, 0x00, 0x00});
    ASSERT_EQ(static_cast<unsigned>(shrt.cc), cc) << shrt.describe();
    ASSERT_EQ(static_cast<unsigned>(nr.cc), cc) << nr.describe();
    for (unsigned m = 0; m < 32; ++m) {
      CpuState s;
      s.rflags = 0x2;  // reserved bit 1 is always set
      for (unsigned b = 0; b < 5; ++b)
        if (m & (1u << b)) s.rflags |= flags[b];
      const bool taken = expected(cc, s.rflags);
      EXPECT_EQ(cond_holds(static_cast<Cond>(cc), s.rflags), taken);
      auto o = branch_outcome(shrt, s);
      ASSERT_TRUE(o);
      EXPECT_EQ(o->next_rip, taken ? kBase + 0x12 : kBase + 2) << shrt.describe() << " m=" << m;
      EXPECT_FALSE(o->push_return);
      EXPECT_FALSE(o->writes_rcx);
      auto on = branch_outcome(nr, s);
      ASSERT_TRUE(on);
      EXPECT_EQ(on->next_rip, taken ? kBase + 0x1006 : kBase + 6) << nr.describe();
    }
  }
}

TEST(BranchOutcome, JmpAndCall) {
  CpuState s;
  // ffffffff81000000: eb fe            jmp ffffffff81000000
  auto j = branch_outcome(dec({0xeb, 0xfe}), s);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->next_rip, kBase);
  // ffffffff81000000: e9 fb ef ff ff   jmp ffffffff80fff000 (backwards, rel32)
  auto jb = branch_outcome(dec({0xe9, 0xfb, 0xef, 0xff, 0xff}), s);
  ASSERT_TRUE(jb);
  EXPECT_EQ(jb->next_rip, Gva{0xffffffff80fff000});
  // ffffffff81000000: e8 fb 0f 00 00   call ffffffff81001000
  auto c = branch_outcome(dec({0xe8, 0xfb, 0x0f, 0x00, 0x00}), s);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->next_rip, Gva{0xffffffff81001000});
  EXPECT_TRUE(c->push_return);
  EXPECT_EQ(c->return_addr, kBase + 5);
  EXPECT_EQ(c->release_bytes, 0u);
}

TEST(BranchOutcome, LoopFamilyAndJrcxz) {
  // ffffffff81000000: e2 fe  loop   $    e1 fe  loope $    e0 fe  loopne $    e3 fe  jrcxz $
  const Insn loop = dec({0xe2, 0xfe}), loope = dec({0xe1, 0xfe}), loopne = dec({0xe0, 0xfe}), jrcxz = dec({0xe3, 0xfe});
  const Gva taken = kBase, fall = kBase + 2;
  struct Row {
    const Insn* i;
    std::uint64_t rcx, rflags;
    Gva next;
    bool writes;
    std::uint64_t rcx_after;
  } rows[] = {
      {&loop, 5, 0, taken, true, 4},           {&loop, 1, 0, fall, true, 0},
      {&loop, 0, 0, taken, true, ~0ull},  // 0 - 1 wraps: 2^64-1 iterations left
      {&loope, 5, ZF, taken, true, 4},         {&loope, 5, 0, fall, true, 4},
      {&loope, 1, ZF, fall, true, 0},          {&loopne, 5, 0, taken, true, 4},
      {&loopne, 5, ZF, fall, true, 4},         {&loopne, 1, 0, fall, true, 0},
      {&jrcxz, 0, 0, taken, false, 0},         {&jrcxz, 1, 0, fall, false, 0},
      {&jrcxz, 1ull << 32, 0, fall, false, 0},
  };
  for (const Row& r : rows) {
    CpuState s;
    s.gpr[static_cast<unsigned>(Reg::Rcx)] = r.rcx;
    s.rflags = r.rflags;
    auto o = branch_outcome(*r.i, s);
    ASSERT_TRUE(o);
    EXPECT_EQ(o->next_rip, r.next) << r.i->describe() << " rcx=" << r.rcx;
    EXPECT_EQ(o->writes_rcx, r.writes) << r.i->describe();
    if (r.writes) { EXPECT_EQ(o->rcx, r.rcx_after) << r.i->describe(); }
  }
}

TEST(BranchOutcome, Addr32LoopUsesEcx) {
  // 67 e2 fd   loop $ with address size 32: counts in ECX, upper half of RCX untouched
  const Insn l = dec({0x67, 0xe2, 0xfd});
  CpuState s;
  s.gpr[static_cast<unsigned>(Reg::Rcx)] = 0x1234567800000001ull;
  auto o = branch_outcome(l, s);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->next_rip, kBase + 3);  // ECX became 0: falls through
  EXPECT_EQ(o->rcx, 0x1234567800000000ull);
  // 67 e3 fd   jecxz $: ECX == 0 although RCX != 0
  auto j = branch_outcome(dec({0x67, 0xe3, 0xfd}), s);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->next_rip, kBase + 3);
  s.gpr[static_cast<unsigned>(Reg::Rcx)] = 0x1234567800000000ull;
  EXPECT_EQ(branch_outcome(dec({0x67, 0xe3, 0xfd}), s)->next_rip, kBase);
}

TEST(BranchOutcome, IndirectThroughRegister) {
  CpuState s;
  s.gpr[static_cast<unsigned>(Reg::R11)] = 0xffffffff81234560ull;
  // 41 ff e3   jmp r11
  auto j = branch_outcome(dec({0x41, 0xff, 0xe3}), s);
  ASSERT_TRUE(j);
  EXPECT_EQ(j->next_rip, Gva{0xffffffff81234560});
  EXPECT_FALSE(j->push_return);
  // 41 ff d3   call r11
  auto c = branch_outcome(dec({0x41, 0xff, 0xd3}), s);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->next_rip, Gva{0xffffffff81234560});
  EXPECT_TRUE(c->push_return);
  EXPECT_EQ(c->return_addr, kBase + 3);
}

TEST(BranchOutcome, ThroughMemoryAndRet) {
  CpuState s;
  s.gpr[static_cast<unsigned>(Reg::Rax)] = 3;
  // ffffffff81000000: ff 24 c5 00 10 00 81   jmp [rax*8 + 0xffffffff81001000]
  const Insn jt = dec({0xff, 0x24, 0xc5, 0x00, 0x10, 0x00, 0x81});
  EXPECT_FALSE(branch_outcome(jt, s));  // needs the loaded target
  auto ea = effective_address(jt, s);
  ASSERT_TRUE(ea);
  EXPECT_EQ(*ea, Gva{0xffffffff81001018});
  auto o = loaded_branch_outcome(jt, 0xffffffff81000400ull);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->next_rip, Gva{0xffffffff81000400});
  EXPECT_FALSE(o->push_return);
  // ffffffff81000000: ff 15 fa 0f 00 00      call [rip + 0xffa] → reads ffffffff81001000
  const Insn cm = dec({0xff, 0x15, 0xfa, 0x0f, 0x00, 0x00});
  EXPECT_EQ(effective_address(cm, s).value(), Gva{0xffffffff81001000});
  auto co = loaded_branch_outcome(cm, 0x1234);
  ASSERT_TRUE(co);
  EXPECT_TRUE(co->push_return);
  EXPECT_EQ(co->return_addr, kBase + 6);
  // 65 ff 24 25 10 00 00 00   jmp gs:[0x10] → gs_base + 0x10
  s.gs_base = 0xffff888000000000ull;
  EXPECT_EQ(effective_address(dec({0x65, 0xff, 0x24, 0x25, 0x10, 0, 0, 0}), s).value(), Gva{0xffff888000000010});
  // c3 ret ; c2 10 00 ret 0x10
  auto r = loaded_branch_outcome(dec({0xc3}), 0xffffffff81000777ull);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->next_rip, Gva{0xffffffff81000777});
  EXPECT_EQ(r->release_bytes, 8u);
  EXPECT_EQ(loaded_branch_outcome(dec({0xc2, 0x10, 0x00}), 0)->release_bytes, 0x18u);
}

TEST(BranchOutcome, NonBranchesAreEinval) {
  CpuState s;
  const Insn mov = dec({0x48, 0x89, 0xe5});  // mov rbp, rsp
  auto a = branch_outcome(mov, s);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::InvalidArgument);
  EXPECT_EQ(loaded_branch_outcome(mov, 0).error().code, Errc::InvalidArgument);
  EXPECT_EQ(effective_address(mov, s).error().code, Errc::InvalidArgument);
  EXPECT_EQ(loaded_branch_outcome(dec({0xeb, 0x00}), 0).error().code, Errc::InvalidArgument);
}

}  // namespace
}  // namespace xenprobes::x86
