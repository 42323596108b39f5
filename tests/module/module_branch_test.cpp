// The guest module's branch decoding and emulation (guest-module/xp_fallback.c): every form the
// fallback supports (relative, through a register, ret; never through memory).
#include "module/module_logic_fixture.hpp"

namespace {

using namespace module_logic;

// ---- branch decoding and emulation ----

struct Decoded {
  std::vector<std::uint8_t> bytes;
  xp_branch_kind kind;
  std::int64_t disp;
};

TEST(ModuleBranch, DecodesEveryForm) {
  const Decoded cases[] = {
      {{0xeb, 0xfe}, XP_BR_JMP, -2},                            // jmp .
      {{0xe9, 0x00, 0x01, 0x00, 0x00}, XP_BR_JMP, 0x100},       // jmp +0x100
      {{0xe8, 0xfb, 0xff, 0xff, 0xff}, XP_BR_CALL, -5},         // call .
      {{0x74, 0x10}, XP_BR_JCC, 0x10},                          // je +0x10
      {{0x0f, 0x8f, 0x80, 0x00, 0x00, 0x00}, XP_BR_JCC, 0x80},  // jg +0x80
      {{0xe2, 0xf0}, XP_BR_LOOP, -16},                          // loop
      {{0xe1, 0x02}, XP_BR_LOOPE, 2},                           // loope
      {{0xe0, 0x7f}, XP_BR_LOOPNE, 127},                        // loopne
      {{0xe3, 0x80}, XP_BR_JRCXZ, -128},                        // jrcxz
      {{0xc3}, XP_BR_RET, 0},                                   // ret
      {{0xc2, 0x10, 0x00}, XP_BR_RET, 0},                       // ret $0x10
      {{0x3e, 0x74, 0x10}, XP_BR_JCC, 0x10},                    // ds je (branch hint)
      {{0x2e, 0x0f, 0x85, 1, 0, 0, 0}, XP_BR_JCC, 1},           // cs jne
      {{0xf2, 0xe9, 1, 0, 0, 0}, XP_BR_JMP, 1},                 // bnd jmp
      {{0xf2, 0xe8, 1, 0, 0, 0}, XP_BR_CALL, 1},                // bnd call
      {{0xf2, 0xc3}, XP_BR_RET, 0},                             // bnd ret
      {{0xf3, 0xc3}, XP_BR_RET, 0},                             // rep ret
      {{0x48, 0xe9, 1, 0, 0, 0}, XP_BR_JMP, 1},                 // rex.W jmp
      {{0x67, 0xe3, 0x05}, XP_BR_JRCXZ, 5},                     // jecxz
      {{0xff, 0xd0}, XP_BR_CALL_REG, 0},                        // call *%rax
      {{0x41, 0xff, 0xd3}, XP_BR_CALL_REG, 0},                  // call *%r11
      {{0xff, 0xe0}, XP_BR_JMP_REG, 0},                         // jmp *%rax
      {{0x41, 0xff, 0xe3}, XP_BR_JMP_REG, 0},                   // jmp *%r11
      {{0x3e, 0xff, 0xe2}, XP_BR_JMP_REG, 0},                   // notrack jmp *%rdx
      {{0x2e, 0x41, 0xff, 0xd3}, XP_BR_CALL_REG, 0},            // cs call *%r11 (retpoline padding)
      {{0xf2, 0xff, 0xd1}, XP_BR_CALL_REG, 0},                  // bnd call *%rcx
      {{0x48, 0xff, 0xe7}, XP_BR_JMP_REG, 0},                   // rex.W jmp *%rdi (W changes nothing)
  };
  for (const auto& c : cases) {
    xp_branch br{};
    ASSERT_TRUE(xp_decode_branch(c.bytes.data(), static_cast<std::uint32_t>(c.bytes.size()), &br))
        << "first byte 0x" << std::hex << int(c.bytes[0]);
    EXPECT_EQ(br.kind, c.kind);
    EXPECT_EQ(br.disp, c.disp);
    EXPECT_EQ(br.len, c.bytes.size());
  }
  xp_branch br{};
  const std::uint8_t ret16[] = {0xc2, 0x34, 0x12};
  ASSERT_TRUE(xp_decode_branch(ret16, 3, &br));
  EXPECT_EQ(br.imm16, 0x1234u);
  const std::uint8_t jg[] = {0x0f, 0x8f, 0, 0, 0, 0};
  ASSERT_TRUE(xp_decode_branch(jg, 6, &br));
  EXPECT_EQ(br.cc, 0xfu);
  const std::uint8_t jecxz[] = {0x67, 0xe3, 0};
  ASSERT_TRUE(xp_decode_branch(jecxz, 3, &br));
  EXPECT_TRUE(br.ecx);
}

TEST(ModuleBranch, RegisterFormsNameEveryRegister) {
  // ModRM.rm is the register, REX.B adds 8; /2 is call, /4 is jmp.
  for (std::uint32_t reg = 0; reg < 16; ++reg) {
    for (std::uint8_t op : {std::uint8_t{2}, std::uint8_t{4}}) {
      std::vector<std::uint8_t> b;
      if (reg >= 8) b.push_back(0x41);
      b.push_back(0xff);
      b.push_back(static_cast<std::uint8_t>(0xc0 | op << 3 | (reg & 7)));
      xp_branch br{};
      ASSERT_TRUE(xp_decode_branch(b.data(), static_cast<std::uint32_t>(b.size()), &br)) << reg;
      EXPECT_EQ(br.kind, op == 2 ? XP_BR_CALL_REG : XP_BR_JMP_REG) << reg;
      EXPECT_EQ(br.reg, reg);
      EXPECT_EQ(br.len, b.size());
      EXPECT_FALSE(xp_is_mem_indirect_branch(b.data(), static_cast<std::uint32_t>(b.size())));
    }
  }
  // Another REX (R, X, W, none of B) keeps rax..rdi.
  const std::uint8_t rexr[] = {0x44, 0xff, 0xd0};
  xp_branch br{};
  ASSERT_TRUE(xp_decode_branch(rexr, 3, &br));
  EXPECT_EQ(br.reg, std::uint32_t{XP_GPR_RAX});
  const std::uint8_t rexwb[] = {0x49, 0xff, 0xe7};
  ASSERT_TRUE(xp_decode_branch(rexwb, 3, &br));
  EXPECT_EQ(br.reg, std::uint32_t{XP_GPR_R15});
}

TEST(ModuleBranch, BranchesThroughMemoryAreRefusedAndNamed) {
  // What Dom0 plans as EmulateLoaded besides ret: the target is in memory.
  const std::vector<std::vector<std::uint8_t>> mem = {
      {0xff, 0x24, 0xfd, 0x00, 0x10, 0x00, 0x81},  // jmp *-0x7efff000(,%rdi,8) (a jump table)
      {0xff, 0x15, 0x10, 0x00, 0x00, 0x00},        // call *0x10(%rip)
      {0xff, 0x25, 0x10, 0x00, 0x00, 0x00},        // jmp *0x10(%rip)
      {0xff, 0x10},                                // call *(%rax)
      {0xff, 0x60, 0x08},                          // jmp *0x8(%rax)
      {0x41, 0xff, 0x13},                          // call *(%r11)
      {0x41, 0xff, 0x94, 0x24, 0, 1, 0, 0},        // call *0x100(%r12)
      {0x3e, 0xff, 0x24, 0xc5, 0, 0, 0, 0},        // notrack jmp *0(,%rax,8)
  };
  for (const auto& b : mem) {
    xp_branch br{};
    EXPECT_FALSE(xp_decode_branch(b.data(), static_cast<std::uint32_t>(b.size()), &br)) << std::hex << int(b[1]);
    EXPECT_TRUE(xp_is_mem_indirect_branch(b.data(), static_cast<std::uint32_t>(b.size()))) << std::hex << int(b[1]);
  }
  // Not a branch through memory: register forms, other ff forms, other instructions.
  const std::vector<std::vector<std::uint8_t>> other = {{0xff, 0xd0},
                                                        {0x41, 0xff, 0xe3},
                                                        {0xff, 0x30} /* push (%rax) */,
                                                        {0xff, 0x00} /* inc (%rax) */,
                                                        {0xff, 0x18} /* lcall *(%rax) */,
                                                        {0xe8, 0, 0, 0, 0},
                                                        {0xc3},
                                                        {0xff},
                                                        {}};
  for (const auto& b : other) EXPECT_FALSE(xp_is_mem_indirect_branch(b.data(), static_cast<std::uint32_t>(b.size())));
  EXPECT_FALSE(xp_is_mem_indirect_branch(nullptr, 2));
}

TEST(ModuleBranch, RefusesEverythingElse) {
  const std::vector<std::vector<std::uint8_t>> bad = {
      {},                                    // nothing
      {0x90},                                // nop
      {0x55},                                // push %rbp
      {0xff, 0x15, 0, 0, 0, 0},              // call *0(%rip)
      {0xff, 0x24, 0xfd, 0, 0x10, 0, 0x81},  // jmp *table(,%rdi,8)
      {0xff},                                // ff without ModRM
      {0xff, 0xd0, 0x90},                    // call *%rax, length longer than the instruction
      {0xff, 0xc0},                          // inc %eax
      {0xff, 0xc8},                          // dec %eax
      {0xff, 0xf0},                          // push %rax
      {0xff, 0xd8},                          // lcall with a register: invalid
      {0xff, 0xe8},                          // ljmp with a register: invalid
      {0x66, 0xff, 0xd0},                    // data16 call *%ax
      {0x67, 0xff, 0xd0},                    // addr32 call *%rax
      {0xf3, 0xff, 0xe0},                    // rep jmp *%rax
      {0x41, 0x3e, 0xff, 0xe3},              // REX not right before the opcode
      {0xea, 0, 0, 0, 0, 0, 0},              // far jmp (invalid in 64-bit)
      {0xcb},                                // lret
      {0xca, 0, 0},                          // lret $0
      {0xcc},                                // int3
      {0x66, 0xe9, 1, 0},                    // data16 jmp: truncates rip on AMD
      {0x66, 0xc3},                          // data16 ret
      {0x67, 0xe2, 0},                       // addr32 loop: would write ecx
      {0x67, 0xe9, 1, 0, 0, 0},              // addr32 jmp
      {0xf3, 0xe9, 1, 0, 0, 0},              // rep jmp
      {0xeb},                                // truncated
      {0xe9, 1, 0, 0},                       // truncated rel32
      {0xeb, 1, 0x90},                       // length longer than the instruction
      {0xc3, 0x90},
      {0x0f, 0x05},              // syscall
      {0x0f, 0x90, 0, 0, 0, 0},  // seto, not jcc
      {0x48},                    // REX alone
      {0x3e, 0x3e, 0x3e},        // prefixes alone
      {0x48, 0x3e, 0xeb, 0},     // REX must come right before the opcode
  };
  for (const auto& b : bad) {
    xp_branch br{};
    EXPECT_FALSE(xp_decode_branch(b.data(), static_cast<std::uint32_t>(b.size()), &br))
        << "size " << b.size() << " first 0x" << std::hex << (b.empty() ? 0 : int(b[0]));
  }
  std::uint8_t sixteen[16];
  std::memset(sixteen, 0x3e, sizeof sixteen);
  sixteen[14] = 0xeb;
  xp_branch br{};
  EXPECT_FALSE(xp_decode_branch(sixteen, 16, &br));     // longer than any x86 instruction
  ASSERT_TRUE(xp_decode_branch(sixteen + 1, 15, &br));  // 13 prefixes, eb, rel8: 15 bytes
  EXPECT_EQ(br.len, 15u);
  EXPECT_EQ(br.disp, 0x3e);
  EXPECT_FALSE(xp_decode_branch(nullptr, 2, &br));
}

TEST(ModuleBranch, ConditionCodesFollowTheSdm) {
  // Every combination of OF SF ZF PF CF against the SDM's definitions (Jcc, Table 7-4).
  for (int bits = 0; bits < 32; ++bits) {
    const bool of = bits & 1, sf = bits & 2, zf = bits & 4, pf = bits & 8, cf = bits & 16;
    const std::uint64_t fl = (of ? XP_RFLAGS_OF : 0) | (sf ? XP_RFLAGS_SF : 0) | (zf ? XP_RFLAGS_ZF : 0) |
                             (pf ? XP_RFLAGS_PF : 0) | (cf ? XP_RFLAGS_CF : 0);
    const bool expect[16] = {
        of,               // jo
        !of,              // jno
        cf,               // jb / jc / jnae
        !cf,              // jae / jnb / jnc
        zf,               // je / jz
        !zf,              // jne / jnz
        cf || zf,         // jbe / jna
        !cf && !zf,       // ja / jnbe
        sf,               // js
        !sf,              // jns
        pf,               // jp / jpe
        !pf,              // jnp / jpo
        sf != of,         // jl / jnge
        sf == of,         // jge / jnl
        zf || sf != of,   // jle / jng
        !zf && sf == of,  // jg / jnle
    };
    for (std::uint32_t cc = 0; cc < 16; ++cc)
      EXPECT_EQ(xp_condition(cc, fl), expect[cc]) << "cc " << cc << " flags 0x" << std::hex << fl;
  }
}

class ModuleEmulate : public ::testing::Test {
 protected:
  Guest g;
  xp_bounds b = g.bounds();
  xp_mem_ops m = g.mem();
  static constexpr std::uint64_t kAt = kText + 0x1000;  // the trap address

  xp_emul run(std::initializer_list<std::uint8_t> insn, xenprobes_regs& r) {
    std::vector<std::uint8_t> v(insn);
    return xp_emulate(v.data(), static_cast<std::uint32_t>(v.size()), &r, &b, &m);
  }
};

TEST_F(ModuleEmulate, JmpRel8AndRel32) {
  auto r = regs_at(kAt);
  ASSERT_EQ(run({0xeb, 0x10}, r), XP_EMUL_OK);  // jmp +0x10
  EXPECT_EQ(r.rip, kAt + 2 + 0x10);
  r = regs_at(kAt);
  ASSERT_EQ(run({0xeb, 0xfe}, r), XP_EMUL_OK);  // jmp .
  EXPECT_EQ(r.rip, kAt);
  r = regs_at(kAt);
  ASSERT_EQ(run({0xe9, 0x00, 0xf0, 0xff, 0xff}, r), XP_EMUL_OK);  // jmp -0x1000
  EXPECT_EQ(r.rip, kAt + 5 - 0x1000);
  EXPECT_EQ(r.rsp, kStack);
  EXPECT_EQ(r.rcx, 0x3333u);
  EXPECT_EQ(g.writes, 0);
}

TEST_F(ModuleEmulate, JmpIntoTheOeaAndIntoModulesIsAllowed) {
  auto r = regs_at(kAt);
  const std::int64_t d = static_cast<std::int64_t>(kOea) - static_cast<std::int64_t>(kAt + 5);
  const auto u = static_cast<std::uint32_t>(d);
  ASSERT_EQ(run({0xe9, std::uint8_t(u), std::uint8_t(u >> 8), std::uint8_t(u >> 16), std::uint8_t(u >> 24)}, r),
            XP_EMUL_OK);
  EXPECT_EQ(r.rip, kOea);
}

TEST_F(ModuleEmulate, JccTakenAndNotTaken) {
  auto r = regs_at(kAt);
  r.rflags |= XP_RFLAGS_ZF;
  ASSERT_EQ(run({0x74, 0x20}, r), XP_EMUL_OK);  // je +0x20, ZF=1: taken
  EXPECT_EQ(r.rip, kAt + 2 + 0x20);
  r = regs_at(kAt);
  ASSERT_EQ(run({0x74, 0x20}, r), XP_EMUL_OK);  // ZF=0: falls through
  EXPECT_EQ(r.rip, kAt + 2);
  r = regs_at(kAt);
  r.rflags |= XP_RFLAGS_SF;                                             // SF != OF
  ASSERT_EQ(run({0x0f, 0x8c, 0x00, 0x01, 0x00, 0x00}, r), XP_EMUL_OK);  // jl +0x100
  EXPECT_EQ(r.rip, kAt + 6 + 0x100);
  r = regs_at(kAt);
  r.rflags |= XP_RFLAGS_SF | XP_RFLAGS_OF;
  ASSERT_EQ(run({0x0f, 0x8c, 0x00, 0x01, 0x00, 0x00}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kAt + 6);
  EXPECT_EQ(r.rsp, kStack);
  EXPECT_EQ(r.rflags, 0x2 | kRflagsIf | XP_RFLAGS_SF | XP_RFLAGS_OF);  // flags untouched
}

TEST_F(ModuleEmulate, CallPushesTheReturnAddress) {
  auto r = regs_at(kAt);
  ASSERT_EQ(run({0xe8, 0x00, 0x02, 0x00, 0x00}, r), XP_EMUL_OK);  // call +0x200
  EXPECT_EQ(r.rip, kAt + 5 + 0x200);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 5);
  EXPECT_EQ(g.writes, 1);
  // With branch hint and BND prefixes the return address is after the whole instruction.
  r = regs_at(kAt);
  ASSERT_EQ(run({0xf2, 0xe8, 0x00, 0x00, 0x00, 0x00}, r), XP_EMUL_OK);  // bnd call +0
  EXPECT_EQ(r.rip, kAt + 6);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 6);
}

TEST_F(ModuleEmulate, CallThroughARegisterPushesTheAddressAfterIt) {
  auto r = regs_at(kAt);
  r.rax = kText + 0x5000;
  ASSERT_EQ(run({0xff, 0xd0}, r), XP_EMUL_OK);  // call *%rax
  EXPECT_EQ(r.rip, kText + 0x5000);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 2);
  EXPECT_EQ(r.rax, kText + 0x5000);
  r = regs_at(kAt);
  r.r11 = kOea + 0x100;                               // into the OEA
  ASSERT_EQ(run({0x41, 0xff, 0xd3}, r), XP_EMUL_OK);  // call *%r11
  EXPECT_EQ(r.rip, kOea + 0x100);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 3);
  // Prefixes count in the return address.
  r = regs_at(kAt);
  r.r11 = kModules + 0x40;
  ASSERT_EQ(run({0x2e, 0x41, 0xff, 0xd3}, r), XP_EMUL_OK);  // cs call *%r11
  EXPECT_EQ(r.rip, kModules + 0x40);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 4);
  EXPECT_EQ(g.writes, 3);
}

TEST_F(ModuleEmulate, JmpThroughARegisterPushesNothing) {
  auto r = regs_at(kAt);
  r.rax = kText + 0x6000;
  ASSERT_EQ(run({0xff, 0xe0}, r), XP_EMUL_OK);  // jmp *%rax
  EXPECT_EQ(r.rip, kText + 0x6000);
  EXPECT_EQ(r.rsp, kStack);
  r = regs_at(kAt);
  r.r11 = kText + 0x7000;
  ASSERT_EQ(run({0x41, 0xff, 0xe3}, r), XP_EMUL_OK);  // jmp *%r11
  EXPECT_EQ(r.rip, kText + 0x7000);
  EXPECT_EQ(r.rsp, kStack);
  EXPECT_EQ(g.writes, 0);
}

TEST_F(ModuleEmulate, EveryRegisterIsReadFromItsOwnField) {
  // xenprobes_regs orders the registers rax rbx rcx rdx rsi rdi rbp rsp r8..r15; x86 encodes
  // them rax rcx rdx rbx rsp rbp rsi rdi r8..r15.
  for (std::uint32_t reg = 0; reg < 16; ++reg) {
    if (reg == XP_GPR_RSP) continue;  // below
    auto r = regs_at(kAt);
    std::uint64_t* f[16] = {&r.rax, &r.rcx, &r.rdx, &r.rbx, &r.rsp, &r.rbp, &r.rsi, &r.rdi,
                            &r.r8,  &r.r9,  &r.r10, &r.r11, &r.r12, &r.r13, &r.r14, &r.r15};
    for (std::uint32_t k = 0; k < 16; ++k)
      if (k != XP_GPR_RSP) *f[k] = kText + 0x10000 + k * 0x100;  // every register a different target
    std::vector<std::uint8_t> b;
    if (reg >= 8) b.push_back(0x41);
    b.push_back(0xff);
    b.push_back(static_cast<std::uint8_t>(0xe0 | (reg & 7)));
    ASSERT_EQ(xp_emulate(b.data(), static_cast<std::uint32_t>(b.size()), &r, &this->b, &m), XP_EMUL_OK) << reg;
    EXPECT_EQ(r.rip, kText + 0x10000 + reg * 0x100) << reg;
  }
}

TEST_F(ModuleEmulate, RegisterTargetsOutsideCodeAreRefusedWithoutSideEffects) {
  for (std::uint64_t to :
       std::initializer_list<std::uint64_t>{0x0, 0x400000, kStack, kTextEnd, kModulesEnd, 0xffff888000000000ull}) {
    auto r = regs_at(kAt);
    r.rbx = to;
    const auto before = r;
    EXPECT_EQ(run({0xff, 0xd3}, r), XP_EMUL_BAD_TARGET) << std::hex << to;  // call *%rbx
    EXPECT_EQ(run({0xff, 0xe3}, r), XP_EMUL_BAD_TARGET) << std::hex << to;  // jmp *%rbx
    EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
  }
  // A non-executable page in the module area.
  g.nx_pages.insert(kModules + 0x3000);
  auto r = regs_at(kAt);
  r.rax = kModules + 0x3010;
  EXPECT_EQ(run({0xff, 0xd0}, r), XP_EMUL_BAD_TARGET);
  // call *%rsp targets the stack as it was before the push: refused, nothing pushed.
  r = regs_at(kAt);
  EXPECT_EQ(run({0xff, 0xd4}, r), XP_EMUL_BAD_TARGET);
  EXPECT_EQ(r.rsp, kStack);
  EXPECT_EQ(g.writes, 0);
  // A call whose push faults changes nothing.
  g.faulting.insert(kStack - 8);
  r = regs_at(kAt);
  r.rax = kText + 0x5000;
  const auto before = r;
  EXPECT_EQ(run({0xff, 0xd0}, r), XP_EMUL_FAULT);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
}

TEST_F(ModuleEmulate, CallThatCannotPushChangesNothing) {
  g.faulting.insert(kStack - 8);
  auto r = regs_at(kAt);
  const auto before = r;
  EXPECT_EQ(run({0xe8, 0x00, 0x02, 0x00, 0x00}, r), XP_EMUL_FAULT);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
}

TEST_F(ModuleEmulate, LoopDecrementsRcx) {
  auto r = regs_at(kAt);
  r.rcx = 3;
  ASSERT_EQ(run({0xe2, 0xfe}, r), XP_EMUL_OK);  // loop .
  EXPECT_EQ(r.rcx, 2u);
  EXPECT_EQ(r.rip, kAt);
  r = regs_at(kAt);
  r.rcx = 1;
  ASSERT_EQ(run({0xe2, 0xfe}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rcx, 0u);
  EXPECT_EQ(r.rip, kAt + 2);
  r = regs_at(kAt);
  r.rcx = 0;  // wraps to 2^64-1: taken
  ASSERT_EQ(run({0xe2, 0x10}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rcx, ~0ull);
  EXPECT_EQ(r.rip, kAt + 2 + 0x10);
}

TEST_F(ModuleEmulate, LoopeAndLoopneLookAtZf) {
  auto r = regs_at(kAt);
  r.rcx = 5;
  r.rflags |= XP_RFLAGS_ZF;
  ASSERT_EQ(run({0xe1, 0x10}, r), XP_EMUL_OK);  // loope: rcx != 0 && ZF
  EXPECT_EQ(r.rip, kAt + 0x12);
  EXPECT_EQ(r.rcx, 4u);
  r = regs_at(kAt);
  r.rcx = 5;
  ASSERT_EQ(run({0xe1, 0x10}, r), XP_EMUL_OK);  // ZF=0: not taken, rcx still decremented
  EXPECT_EQ(r.rip, kAt + 2);
  EXPECT_EQ(r.rcx, 4u);
  r = regs_at(kAt);
  r.rcx = 5;
  ASSERT_EQ(run({0xe0, 0x10}, r), XP_EMUL_OK);  // loopne: rcx != 0 && !ZF
  EXPECT_EQ(r.rip, kAt + 0x12);
  r = regs_at(kAt);
  r.rcx = 5;
  r.rflags |= XP_RFLAGS_ZF;
  ASSERT_EQ(run({0xe0, 0x10}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kAt + 2);
  r = regs_at(kAt);
  r.rcx = 1;
  r.rflags |= XP_RFLAGS_ZF;
  ASSERT_EQ(run({0xe1, 0x10}, r), XP_EMUL_OK);  // rcx reaches 0: not taken
  EXPECT_EQ(r.rip, kAt + 2);
  EXPECT_EQ(r.rcx, 0u);
}

TEST_F(ModuleEmulate, JrcxzAndJecxz) {
  auto r = regs_at(kAt);
  r.rcx = 0;
  ASSERT_EQ(run({0xe3, 0x08}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kAt + 2 + 8);
  EXPECT_EQ(r.rcx, 0u);  // not modified
  r = regs_at(kAt);
  r.rcx = 0x100000000ull;  // rcx != 0 but ecx == 0
  ASSERT_EQ(run({0xe3, 0x08}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kAt + 2);
  r = regs_at(kAt);
  r.rcx = 0x100000000ull;
  ASSERT_EQ(run({0x67, 0xe3, 0x08}, r), XP_EMUL_OK);  // jecxz
  EXPECT_EQ(r.rip, kAt + 3 + 8);
  EXPECT_EQ(r.rcx, 0x100000000ull);
}

TEST_F(ModuleEmulate, RetPopsTheReturnAddress) {
  g.stack[kStack] = kText + 0x4242;
  auto r = regs_at(kAt);
  ASSERT_EQ(run({0xc3}, r), XP_EMUL_OK);
  EXPECT_EQ(r.rip, kText + 0x4242);
  EXPECT_EQ(r.rsp, kStack + 8);
  EXPECT_EQ(g.writes, 0);
  r = regs_at(kAt);
  ASSERT_EQ(run({0xc2, 0x18, 0x00}, r), XP_EMUL_OK);  // ret $0x18
  EXPECT_EQ(r.rip, kText + 0x4242);
  EXPECT_EQ(r.rsp, kStack + 8 + 0x18);
  r = regs_at(kAt);
  ASSERT_EQ(run({0xf3, 0xc3}, r), XP_EMUL_OK);  // rep ret
  EXPECT_EQ(r.rsp, kStack + 8);
}

TEST_F(ModuleEmulate, RetToAnythingButCodeIsRefused) {
  for (std::uint64_t to : std::initializer_list<std::uint64_t>{0x0, 0x7fffdeadbeef, kStack, kTextEnd + 8}) {
    g.stack[kStack] = to;
    auto r = regs_at(kAt);
    const auto before = r;
    EXPECT_EQ(run({0xc3}, r), XP_EMUL_BAD_TARGET) << std::hex << to;
    EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
  }
  g.faulting.insert(kStack);
  auto r = regs_at(kAt);
  EXPECT_EQ(run({0xc3}, r), XP_EMUL_FAULT);
}

TEST_F(ModuleEmulate, BranchesOutOfTextAreRefusedWithoutSideEffects) {
  // At the very end of kernel text a jmp +0x7f lands in kernel data.
  auto r = regs_at(kTextEnd - 2);
  auto before = r;
  EXPECT_EQ(run({0xeb, 0x7f}, r), XP_EMUL_BAD_TARGET);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
  // A call whose target is not executable pushes nothing.
  g.nx_pages.insert((kAt + 5 + 0x10000) & ~0xfffull);
  r = regs_at(kAt);
  before = r;
  EXPECT_EQ(run({0xe8, 0x00, 0x00, 0x01, 0x00}, r), XP_EMUL_BAD_TARGET);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
  EXPECT_EQ(g.writes, 0);
  // A loop that would leave text does not even decrement rcx.
  r = regs_at(kTextEnd - 2);
  r.rcx = 2;
  EXPECT_EQ(run({0xe2, 0x10}, r), XP_EMUL_BAD_TARGET);
  EXPECT_EQ(r.rcx, 2u);
  // rip + disp wrapping around the address space.
  r = regs_at(kAt);
  r.rip = ~0ull - 1;
  EXPECT_EQ(run({0xeb, 0x10}, r), XP_EMUL_BAD_TARGET);
}

TEST_F(ModuleEmulate, NotABranch) {
  auto r = regs_at(kAt);
  EXPECT_EQ(run({0x55}, r), XP_EMUL_UNSUPPORTED);                    // push %rbp
  EXPECT_EQ(run({0x48, 0x89, 0xe5}, r), XP_EMUL_UNSUPPORTED);        // mov %rsp,%rbp
  EXPECT_EQ(run({0xff, 0x25, 0, 0, 0, 0}, r), XP_EMUL_UNSUPPORTED);  // jmp *0(%rip)
  EXPECT_EQ(run({0xff, 0x10}, r), XP_EMUL_UNSUPPORTED);              // call *(%rax)
  EXPECT_EQ(r.rip, kAt);
  EXPECT_EQ(g.writes, 0);
}

}  // namespace
