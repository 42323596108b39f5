// The gate and its rules: each refusal is tripped by an instruction that trips only that rule.
#include <capstone/capstone.h>
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

using Pred = bool (*)(const Insn&);
struct NamedPred {
  const char* name;
  Pred p;
};
const NamedPred kRefusals[] = {
    {"is_trap_byte", is_trap_byte},
    {"is_context_return", is_context_return},
    {"is_software_interrupt", is_software_interrupt},
    {"is_halt", is_halt},
    {"is_deliberate_ud", is_deliberate_ud},
    {"is_gs_swap", is_gs_swap},
    {"is_ss_load", is_ss_load},
    {"is_far_transfer", is_far_transfer},
    {"is_transaction_begin", is_transaction_begin},
    {"is_opsize_relative_branch", is_opsize_relative_branch},
    {"is_addr32_rip_relative", is_addr32_rip_relative},
    {"is_interrupt_enable", is_interrupt_enable},
};

struct RefusalCase {
  const char* pred;
  std::vector<std::uint8_t> bytes;
  Errc code;
  const char* reason_word;
};

class Refusal : public ::testing::TestWithParam<RefusalCase> {};

TEST_P(Refusal, TripsOnlyItsRule) {
  const RefusalCase& c = GetParam();
  const Insn i = dec(c.bytes);
  ASSERT_EQ(i.length, c.bytes.size()) << i.describe();
  for (const NamedPred& np : kRefusals)
    EXPECT_EQ(np.p(i), std::string(np.name) == c.pred) << np.name << " on " << i.describe();
  EXPECT_FALSE(can_boost(i));
  auto plan = analyze(i);
  ASSERT_FALSE(plan) << i.describe();
  EXPECT_EQ(plan.error().code, c.code);
  EXPECT_NE(plan.error().what.find(c.reason_word), std::string::npos) << plan.error().what;
  EXPECT_NE(plan.error().what.find(hex_bytes(c.bytes)), std::string::npos) << plan.error().what;
}

INSTANTIATE_TEST_SUITE_P(
    X86, Refusal,
    ::testing::Values(RefusalCase{"is_trap_byte", {0xcc}, Errc::Busy, "foreign breakpoint"},          // int3
                      RefusalCase{"is_trap_byte", {0xf1}, Errc::Busy, "foreign breakpoint"},          // int1
                      RefusalCase{"is_context_return", {0x48, 0xcf}, Errc::InvalidArgument, "iret"},  // iretq
                      RefusalCase{"is_context_return", {0x48, 0x0f, 0x07}, Errc::InvalidArgument, "sysret"},
                      RefusalCase{"is_context_return", {0x0f, 0x35}, Errc::InvalidArgument, "sysexit"},
                      RefusalCase{"is_software_interrupt", {0xcd, 0x80}, Errc::InvalidArgument, "interrupt"},
                      RefusalCase{"is_software_interrupt", {0x0f, 0x05}, Errc::InvalidArgument, "system call"},
                      RefusalCase{"is_software_interrupt", {0x0f, 0x34}, Errc::InvalidArgument, "system call"},
                      RefusalCase{"is_halt", {0xf4}, Errc::InvalidArgument, "hlt"},                 // hlt
                      RefusalCase{"is_deliberate_ud", {0x0f, 0x0b}, Errc::InvalidArgument, "BUG"},  // ud2
                      RefusalCase{"is_gs_swap", {0x0f, 0x01, 0xf8}, Errc::InvalidArgument, "swapgs"},
                      RefusalCase{"is_ss_load", {0x8e, 0xd0}, Errc::InvalidArgument, "SS"},        // mov ss,eax
                      RefusalCase{"is_far_transfer", {0x48, 0xcb}, Errc::InvalidArgument, "far"},  // retfq
                      RefusalCase{"is_far_transfer", {0xff, 0x2f}, Errc::InvalidArgument, "far"},  // ljmp [rdi]
                      RefusalCase{"is_far_transfer", {0xff, 0x1f}, Errc::InvalidArgument, "far"},  // lcall [rdi]
                      RefusalCase{"is_transaction_begin", {0xc7, 0xf8, 0, 0, 0, 0}, Errc::InvalidArgument, "xbegin"},
#if CS_API_MAJOR >= 5
                      // Capstone 5 reads it as Intel does (66 ignored: rel32, 7 bytes); Capstone 4 as AMD
                      // does (rel16, 5 bytes). Either reading is refused, by the same rule.
                      RefusalCase{"is_opsize_relative_branch",
                                  {0x66, 0x0f, 0x84, 0x10, 0x00, 0x00, 0x00},
                                  Errc::InvalidArgument,
                                  "operand-size"},  // 66 je rel32 (Intel reading)
#else
                      RefusalCase{"is_opsize_relative_branch",
                                  {0x66, 0x0f, 0x84, 0x10, 0x00},
                                  Errc::InvalidArgument,
                                  "operand-size"},  // 66 je rel16 (AMD reading)
#endif
                      RefusalCase{"is_addr32_rip_relative",
                                  {0x67, 0x8b, 0x05, 0x10, 0, 0, 0},
                                  Errc::InvalidArgument,
                                  "addr32"},  // mov eax, [eip + 0x10]
                      RefusalCase{"is_interrupt_enable", {0xfb}, Errc::InvalidArgument, "shadow"}));  // sti

TEST(Analyze, BoostablePlain) {
  // 48 89 e5   mov rbp, rsp ; 55 push rbp ; f0 48 0f b1 0e lock cmpxchg [rsi], rcx
  // 9c pushfq ; 9d popfq ; fa cli ; e6 e9 out 0xe9, al ; f3 a4 rep movsb (sti is refused:
  // see is_interrupt_enable)
  const std::vector<std::vector<std::uint8_t>> boost = {
      {0x48, 0x89, 0xe5}, {0x55}, {0xf0, 0x48, 0x0f, 0xb1, 0x0e}, {0x9c}, {0x9d}, {0xfa}, {0xe6, 0xe9}, {0xf3, 0xa4}};
  for (const auto& b : boost) {
    const Insn i = dec(b);
    EXPECT_TRUE(can_boost(i)) << i.describe();
    auto p = analyze(i);
    ASSERT_TRUE(p) << p.error().what;
    EXPECT_EQ(*p, Plan::Boost) << i.describe();
  }
}

TEST(Analyze, RipRelativeIsBoostRipRel) {
  // 48 8b 05 f9 0f 00 00   mov rax, [rip + 0xff9]
  const Insn i = dec({0x48, 0x8b, 0x05, 0xf9, 0x0f, 0x00, 0x00});
  EXPECT_TRUE(is_rip_relative(i));
  EXPECT_TRUE(can_boost(i));
  EXPECT_EQ(analyze(i).value(), Plan::BoostRipRel);
}

TEST(Analyze, BranchesAreEmulated) {
  struct C {
    std::vector<std::uint8_t> b;
    Plan plan;
  } cases[] = {
      {{0xeb, 0x10}, Plan::EmulateBranch},                          // jmp $+0x12
      {{0xe9, 0, 1, 0, 0}, Plan::EmulateBranch},                    // jmp rel32
      {{0x74, 0x05}, Plan::EmulateBranch},                          // je
      {{0xe8, 0, 0, 0, 0}, Plan::EmulateBranch},                    // call $+5
      {{0xe2, 0xfe}, Plan::EmulateBranch},                          // loop
      {{0xe3, 0xfe}, Plan::EmulateBranch},                          // jrcxz
      {{0xff, 0xe0}, Plan::EmulateBranch},                          // jmp rax
      {{0xff, 0xd0}, Plan::EmulateBranch},                          // call rax
      {{0xc3}, Plan::EmulateLoaded},                                // ret
      {{0xc2, 0x08, 0x00}, Plan::EmulateLoaded},                    // ret 8
      {{0xff, 0x25, 0x10, 0, 0, 0}, Plan::EmulateLoaded},           // jmp [rip + 0x10]
      {{0xff, 0x14, 0xc5, 0, 0x10, 0, 0x81}, Plan::EmulateLoaded},  // call [rax*8 + tbl]
      {{0x3e, 0xff, 0xe0}, Plan::EmulateBranch},                    // notrack jmp rax
  };
  for (const auto& c : cases) {
    const Insn i = dec(c.b);
    EXPECT_FALSE(can_boost(i)) << i.describe();
    auto p = analyze(i);
    ASSERT_TRUE(p) << p.error().what;
    EXPECT_EQ(*p, c.plan) << i.describe() << " → " << plan_name(*p);
  }
  EXPECT_TRUE(is_relative_branch(dec({0x74, 0x05})));
  EXPECT_FALSE(is_relative_branch(dec({0xff, 0xe0})));
}

TEST(Analyze, NopsAndEndbrAreSkipped) {
  const Insn nop5 = dec({0x0f, 0x1f, 0x44, 0x00, 0x00});  // nop dword ptr [rax + rax] (ftrace)
  EXPECT_TRUE(is_ftrace_nop(nop5));
  EXPECT_EQ(analyze(nop5).value(), Plan::Skip);
  const Insn nop7 = dec({0x0f, 0x1f, 0x80, 0, 0, 0, 0});  // nop dword ptr [rax]
  EXPECT_FALSE(is_ftrace_nop(nop7));
  EXPECT_EQ(analyze(nop7).value(), Plan::Skip);
  const Insn endbr = dec({0xf3, 0x0f, 0x1e, 0xfa});  // endbr64
  EXPECT_TRUE(is_endbr(endbr));
  EXPECT_EQ(analyze(endbr).value(), Plan::Skip);
}

TEST(AdjustProbeAddress, MovesPastEntryEndbrOnly) {
  //   +0 f3 0f 1e fa       endbr64
  //   +4 0f 1f 44 00 00    nop5 (ftrace)
  //   +9 f3 0f 1e fa       endbr64 (e.g. an indirect-jump target inside the function)
  //   +d c3                ret
  const std::vector<std::uint8_t> b = {0xf3, 0x0f, 0x1e, 0xfa, 0x0f, 0x1f, 0x44,
                                       0x00, 0x00, 0xf3, 0x0f, 0x1e, 0xfa, 0xc3};
  auto f = decode_function(b, kBase);
  ASSERT_TRUE(f);
  EXPECT_EQ(adjust_probe_address(*f, kBase), kBase + 4);
  EXPECT_EQ(adjust_probe_address(*f, kBase + 4), kBase + 4);
  EXPECT_EQ(adjust_probe_address(*f, kBase + 9), kBase + 9);
  // No endbr at the entry: unchanged.
  auto g = decode_function(std::span(b).subspan(4), kBase);
  ASSERT_TRUE(g);
  EXPECT_EQ(adjust_probe_address(*g, kBase), kBase);
}

// Which trap bytes of a function are padding: is_padding_trap for each instruction, from
// annotated bytes ('P' padding, '.' anything else, trap bytes in the flow included).
struct PaddingCase {
  const char* what;
  std::vector<std::uint8_t> bytes;
  const char* expected;  // one letter per decoded instruction
};

class Padding : public ::testing::TestWithParam<PaddingCase> {};

TEST_P(Padding, MarksOnlyTrapsNoPathRuns) {
  const PaddingCase& c = GetParam();
  auto f = decode_function(c.bytes, kBase);
  ASSERT_TRUE(f) << f.error().what;
  std::string got;
  for (std::size_t k = 0; k < f->size(); ++k) got += is_padding_trap(*f, k) ? 'P' : '.';
  EXPECT_EQ(got, c.expected);
  EXPECT_FALSE(is_padding_trap(*f, f->size())) << "past the end";
}

INSTANTIATE_TEST_SUITE_P(
    Walk, Padding,
    ::testing::Values(
        //   +0 48 89 c7 mov rdi,rax · +3 c3 ret · +4 cc cc int3 × 2 (SLS, alignment)
        PaddingCase{"after_ret", {0x48, 0x89, 0xc7, 0xc3, 0xcc, 0xcc}, "..PP"},
        //   +0 c2 08 00 ret 8 · +3 cc
        PaddingCase{"after_ret_imm", {0xc2, 0x08, 0x00, 0xcc}, ".P"},
        //   +0 eb 02 jmp +4 · +2 cc · +3 cc · +4 c3 ret   (the run after a jmp, then code)
        PaddingCase{"after_jmp", {0xeb, 0x02, 0xcc, 0xcc, 0xc3}, ".PP."},
        //   +0 ff e0 jmp rax · +2 cc · +3 f1 (ICEBP counts as a trap byte too)
        PaddingCase{"after_jmp_indirect", {0xff, 0xe0, 0xcc, 0xf1}, ".PP"},
        //   +0 48 cf iretq · +2 cc (sysret and sysexit alike: the next instruction runs elsewhere)
        PaddingCase{"after_iret", {0x48, 0xcf, 0xcc}, ".P"},
        //   Linux 6.1 __pv_queued_spin_unlock_slowpath's end: +0 e8 00 00 00 00 call · +5 0f 0b
        //   ud2 (a WARN: goes on) · +7 e9 00 00 00 00 jmp · +c 0f 0b ud2 (BUG) · +e cc × 3 to the end
        PaddingCase{"after_bug_to_the_end",
                    {0xe8, 0, 0, 0, 0, 0x0f, 0x0b, 0xe9, 0, 0, 0, 0, 0x0f, 0x0b, 0xcc, 0xcc, 0xcc},
                    "....PPP"},
        //   Just the BUG: +0 0f 0b ud2 · +2 cc (ud0/ud1 count the same; Capstone 4 and 5
        //   disagree on their length, so they are not spelled out here)
        PaddingCase{"after_ud2_to_the_end", {0x0f, 0x0b, 0xcc}, ".P"},
        //   A WARN's ud2 in the middle: +0 0f 0b · +2 cc (over the next instruction's first
        //   byte, say) · +3 c3 ret. The kernel resumes after the ud2: that int3 is in the flow.
        PaddingCase{"after_warn_mid_function", {0x0f, 0x0b, 0xcc, 0xc3}, "..."},
        //   ... and every trap byte of its run: +0 0f 0b · +2 cc cc · +4 90 nop
        PaddingCase{"run_after_ud2_then_code", {0x0f, 0x0b, 0xcc, 0xcc, 0x90}, "...."},
        //   A call never starts padding, whatever its callee: +0 e8 00 00 00 00 · +5 cc
        PaddingCase{"after_call", {0xe8, 0, 0, 0, 0, 0xcc}, ".."},
        //   In the flow: +0 31 c0 xor · +2 cc · +3 cc · +4 c3 (a run after code is not padding)
        PaddingCase{"in_the_flow", {0x31, 0xc0, 0xcc, 0xcc, 0xc3}, "...."},
        //   The function's first byte: nothing before it
        PaddingCase{"at_the_start", {0xcc, 0xc3}, ".."},
        //   Not a trap byte at all: the nop after a ret is not "padding" here
        PaddingCase{"nop_after_ret", {0xc3, 0x90}, ".."}),
    [](const auto& info) { return std::string(info.param.what); });

}  // namespace
}  // namespace xenprobes::x86

namespace xenprobes::x86 {
namespace {

std::optional<std::string> refusal(std::vector<std::uint8_t> b) {
  auto i = decode(b, Gva{0xffffffff81000000ull});
  EXPECT_TRUE(i) << i.error().what;
  return i ? xen_emulator_refusal(*i) : std::optional<std::string>("undecodable");
}

TEST(XenEmulator, RefusesWhatItCannotRunAsTheCpuDoes) {
  EXPECT_TRUE(refusal({0xf3, 0xa4}));        // rep movsb
  EXPECT_TRUE(refusal({0xf3, 0x48, 0xab}));  // rep stosq
  EXPECT_TRUE(refusal({0x0f, 0x21, 0xc0}));  // mov rax, dr0
  EXPECT_TRUE(refusal({0x0f, 0x23, 0xf8}));  // mov dr7, rax
  EXPECT_TRUE(refusal({0x0f, 0x01, 0xc8}));  // monitor
  EXPECT_TRUE(refusal({0x0f, 0x01, 0xc9}));  // mwait
  EXPECT_TRUE(refusal({0x0f, 0x01, 0xc1}));  // vmcall
  EXPECT_NE(refusal({0xf3, 0xa4})->find("chunks"), std::string::npos);
}

TEST(XenEmulator, AcceptsWhatItImplements) {
  EXPECT_FALSE(refusal({0x48, 0x89, 0xe5}));  // mov rbp, rsp
  EXPECT_FALSE(refusal({0xa4}));              // movsb without rep
  EXPECT_FALSE(refusal({0x0f, 0x01, 0xca}));  // clac
  EXPECT_FALSE(refusal({0x0f, 0x01, 0xcb}));  // stac
  EXPECT_FALSE(refusal({0x0f, 0x01, 0xf8}));  // swapgs
  EXPECT_FALSE(refusal({0x0f, 0x01, 0xf9}));  // rdtscp
  EXPECT_FALSE(refusal({0x0f, 0x01, 0xe0}));  // smsw eax
  EXPECT_FALSE(refusal({0x0f, 0x01, 0x38}));  // invlpg [rax]: a memory form
  EXPECT_FALSE(refusal({0x8f, 0xc0}));        // pop rax (8f /0, not XOP)
}

}  // namespace
}  // namespace xenprobes::x86
