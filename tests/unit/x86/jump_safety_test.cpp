// Jump safety: each rule tripped by a function written out byte by byte, with the region a
// 5-byte jump would cover, and the search for an earlier start in the same basic block.
#include <gtest/gtest.h>

#include <vector>

#include "x86/jump_safety.hpp"

namespace xenprobes::x86 {
namespace {

constexpr std::uint64_t F = 0xffffffff81000000;  // where the test functions live

JumpFunction fn(const std::vector<std::uint8_t>& bytes, const JumpContext& ctx, std::uint64_t at = F) {
  auto r = JumpFunction::decode(bytes, Gva{at}, ctx);
  EXPECT_TRUE(r) << r.error().what;
  return r ? *r : JumpFunction{};
}

// The rule that refuses a region starting at `start`, or None.
JumpRule refused_by(const JumpFunction& f, std::uint64_t start, std::string* why = nullptr) {
  JumpRegion r;
  auto no = check_region(f, Gva{start}, &r);
  if (why) *why = no ? no->reason : "";
  return no ? no->rule : JumpRule::None;
}

bool has(const std::string& s, const char* word) { return s.find(word) != std::string::npos; }

// A function whose every region is fine: the baseline the other tests change one thing in.
//   F+0   48 89 e5          mov rbp, rsp
//   F+3   31 c0             xor eax, eax
//   F+5   48 83 c0 01       add rax, 1
//   F+9   48 89 c7          mov rdi, rax
//   F+c   c3                ret
const std::vector<std::uint8_t> kPlain = {0x48, 0x89, 0xe5, 0x31, 0xc0, 0x48, 0x83, 0xc0, 0x01, 0x48, 0x89, 0xc7, 0xc3};

TEST(JumpSafety, PlainRegionsAreWholeInstructions) {
  JumpContext ctx;
  JumpFunction f = fn(kPlain, ctx);
  JumpRegion r;
  ASSERT_FALSE(check_region(f, Gva{F}, &r));
  EXPECT_EQ(r.start, Gva{F});
  EXPECT_EQ(r.length, 5);  // mov (3) + xor (2)
  EXPECT_EQ(r.count, 2u);
  ASSERT_FALSE(check_region(f, Gva{F + 3}, &r));
  EXPECT_EQ(r.length, 6);  // xor (2) + add (4): the jump's tail byte is the add's last byte
  auto v = check_jump(f, Gva{F + 3});
  EXPECT_TRUE(v.optimizable);
  EXPECT_FALSE(v.starts_earlier);
  EXPECT_EQ(jump_rule_name(JumpRule::NoBranchIntoRegion), "no-branch-into-region");
}

TEST(JumpSafety, RegionInFunction) {
  JumpContext ctx;
  JumpFunction f = fn(kPlain, ctx);
  std::string why;
  // Inside the mov at F+0, not a boundary.
  EXPECT_EQ(refused_by(f, F + 1, &why), JumpRule::RegionInFunction);
  EXPECT_TRUE(has(why, "not an instruction boundary")) << why;
  EXPECT_TRUE(region_in_function(f, Gva{F + 2}));
  // Before and after the function.
  EXPECT_EQ(refused_by(f, F - 5, &why), JumpRule::RegionInFunction);
  EXPECT_TRUE(has(why, "outside the function")) << why;
  EXPECT_EQ(refused_by(f, F + kPlain.size()), JumpRule::RegionInFunction);
  EXPECT_FALSE(region_in_function(f, Gva{F + 9}));
}

TEST(JumpSafety, FitsInFunction) {
  JumpContext ctx;
  JumpFunction f = fn(kPlain, ctx);
  std::string why;
  // F+9: mov rdi, rax (3) + ret (1) = 4 bytes, then the function ends: the jump's last byte
  // would be the next function's first.
  EXPECT_EQ(refused_by(f, F + 9, &why), JumpRule::FitsInFunction);
  EXPECT_TRUE(has(why, "cross the function's end")) << why;
  EXPECT_EQ(refused_by(f, F + 0xc), JumpRule::FitsInFunction);  // the ret alone
  // F+5: add (4) + mov (3) = 7 bytes, ends at F+c: inside.
  EXPECT_FALSE(fits_in_function(f, Gva{F + 5}));
  EXPECT_EQ(refused_by(f, F + 5), JumpRule::None);
}

TEST(JumpSafety, WholeInstructionsRipRelative) {
  //   F+0   48 8b 05 f9 0f 00 00   mov rax, [rip + 0xff9]   → F+0x1000
  //   F+7   c3                     ret
  //   F+8   cc                     int3 (padding)
  const std::vector<std::uint8_t> b = {0x48, 0x8b, 0x05, 0xf9, 0x0f, 0x00, 0x00, 0xc3, 0xcc};
  JumpContext anywhere;
  EXPECT_EQ(refused_by(fn(b, anywhere), F), JumpRule::None);
  // Detours in the module area, 512 MiB above: rel32 reaches F+0x1000.
  JumpContext near;
  near.detour_area = Gva{0xffffffffa0000000};
  near.detour_area_size = 1 << 20;
  EXPECT_EQ(refused_by(fn(b, near), F), JumpRule::None);
  // Detours 3 GiB below (the direct map, say): out of reach.
  JumpContext far;
  far.detour_area = Gva{F - (3ull << 30)};
  far.detour_area_size = 1 << 20;
  std::string why;
  JumpFunction ff = fn(b, far);
  EXPECT_EQ(refused_by(ff, F, &why), JumpRule::WholeInstructions);
  EXPECT_TRUE(has(why, "RIP-relative operand is out of rel32 reach")) << why;
  EXPECT_TRUE(has(why, "48 8b 05 f9 0f 00 00")) << why;
}

TEST(JumpSafety, WholeInstructionsCall) {
  //   F+0   31 c0             xor eax, eax
  //   F+2   e8 f9 0f 00 00    call F+0x1000     (the region's last instruction: ends at F+7)
  //   F+7   c3                ret
  const std::vector<std::uint8_t> b = {0x31, 0xc0, 0xe8, 0xf9, 0x0f, 0x00, 0x00, 0xc3};
  JumpContext ctx;
  JumpRegion r;
  JumpFunction f = fn(b, ctx);
  ASSERT_FALSE(check_region(f, Gva{F}, &r));
  EXPECT_EQ(r.end(), Gva{F + 7});  // the return address the relocated call pushes
  // The same bytes in the direct map (0xffff888000000000): push imm32 cannot hold the return
  // address.
  std::string why;
  JumpFunction low = fn(b, ctx, 0xffff888000000000);
  EXPECT_EQ(refused_by(low, 0xffff888000000000, &why), JumpRule::WholeInstructions);
  EXPECT_TRUE(has(why, "sign-extended push imm32")) << why;
  // The call's target out of reach of the detour area.
  JumpContext far;
  far.detour_area = Gva{F + (3ull << 30)};
  EXPECT_EQ(refused_by(fn(b, far), F, &why), JumpRule::WholeInstructions);
  EXPECT_TRUE(has(why, "target is out of rel32 reach")) << why;
}

TEST(JumpSafety, WholeInstructionsRefusals) {
  JumpContext ctx;
  std::string why;
  struct Case {
    std::vector<std::uint8_t> bytes;
    const char* word;
  };
  const Case cases[] = {
      // F+0 31 c0 xor eax,eax · F+2 cc int3 · F+3 48 89 c7 mov rdi,rax · F+6 c3 ret
      {{0x31, 0xc0, 0xcc, 0x48, 0x89, 0xc7, 0xc3}, "foreign breakpoint"},
      // F+0 31 c0 · F+2 0f 0b ud2 (BUG) · F+4 48 89 c7 · F+7 c3
      {{0x31, 0xc0, 0x0f, 0x0b, 0x48, 0x89, 0xc7, 0xc3}, "deliberate #UD"},
      // F+0 31 c0 · F+2 e2 fc loop F+0 · F+4 48 89 c7 · F+7 c3   (F+0 is the start: allowed)
      {{0x31, 0xc0, 0xe2, 0xfc, 0x48, 0x89, 0xc7, 0xc3}, "rel8 form"},
      // F+0 31 c0 · F+2 ff d0 call rax · F+4 48 89 c7 · F+7 c3   (the call returns to F+4)
      {{0x31, 0xc0, 0xff, 0xd0, 0x48, 0x89, 0xc7, 0xc3}, "middle of the jump"},
      // F+0 31 c0 · F+2 ff 54 24 08 call [rsp+8] · F+6 c3
      {{0x31, 0xc0, 0xff, 0x54, 0x24, 0x08, 0xc3, 0xc3}, "through RSP"},
      // F+0 f3 0f 1e fa endbr64 · F+4 48 89 c7 · F+7 c3
      {{0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x89, 0xc7, 0xc3}, "landing pad"},
      // F+0 31 c0 · F+2 fb sti · F+3 48 89 c7 · F+6 c3
      {{0x31, 0xc0, 0xfb, 0x48, 0x89, 0xc7, 0xc3}, "sti"},
  };
  for (const Case& c : cases) {
    JumpFunction f = fn(c.bytes, ctx);
    EXPECT_EQ(refused_by(f, F, &why), JumpRule::WholeInstructions) << c.word;
    EXPECT_TRUE(has(why, c.word)) << why;
    EXPECT_TRUE(whole_instructions(f, JumpRegion{Gva{F}, 5, 0, 3})) << c.word;
  }
}

TEST(JumpSafety, WholeInstructionsIndirectCallClosingTheRegion) {
  //   F+0   31 c0                xor eax, eax
  //   F+2   ff 15 f8 0f 00 00    call [rip + 0xff8]   → [F+0x1000]; returns to F+8, the region's end
  //   F+8   c3                   ret
  const std::vector<std::uint8_t> b = {0x31, 0xc0, 0xff, 0x15, 0xf8, 0x0f, 0x00, 0x00, 0xc3};
  JumpContext ctx;
  JumpRegion r;
  ASSERT_FALSE(check_region(fn(b, ctx), Gva{F}, &r));
  EXPECT_EQ(r.end(), Gva{F + 8});
}

TEST(JumpSafety, WholeInstructionsIntPaddingAfterRet) {
  //   F+0   48 89 c7          mov rdi, rax
  //   F+3   c3                ret
  //   F+4   cc cc cc cc       int3 padding (never executed)
  const std::vector<std::uint8_t> b = {0x48, 0x89, 0xc7, 0xc3, 0xcc, 0xcc, 0xcc, 0xcc};
  JumpContext ctx;
  JumpRegion r;
  ASSERT_FALSE(check_region(fn(b, ctx), Gva{F}, &r));
  EXPECT_EQ(r.length, 5);
  // The same int3 in the flow (after the mov, before the ret) is somebody's breakpoint.
  const std::vector<std::uint8_t> live = {0x48, 0x89, 0xc7, 0xcc, 0xc3, 0xcc, 0xcc, 0xcc};
  EXPECT_EQ(refused_by(fn(live, ctx), F), JumpRule::WholeInstructions);
  // The padding after a BUG()'s ud2 (F+3 0f 0b, F+5 cc cc cc) is padding too, but a region
  // reaching it holds the ud2, which the instruction rules refuse first.
  const std::vector<std::uint8_t> bug = {0x48, 0x89, 0xc7, 0x0f, 0x0b, 0xcc, 0xcc, 0xcc};
  std::string why;
  EXPECT_EQ(refused_by(fn(bug, ctx), F, &why), JumpRule::WholeInstructions);
  EXPECT_TRUE(has(why, "deliberate #UD")) << why;
}

TEST(JumpSafety, NoBranchIntoBytesOneToFour) {
  //   F+0   31 c0             xor eax, eax
  //   F+2   48 89 c7          mov rdi, rax     ← target of the jne
  //   F+5   85 c0             test eax, eax
  //   F+7   75 f9             jne F+2
  //   F+9   48 89 f8          mov rax, rdi
  //   F+c   c3                ret
  const std::vector<std::uint8_t> b = {0x31, 0xc0, 0x48, 0x89, 0xc7, 0x85, 0xc0, 0x75, 0xf9, 0x48, 0x89, 0xf8, 0xc3};
  JumpContext ctx;
  JumpFunction f = fn(b, ctx);
  std::string why;
  // [F, F+5): F+2 is byte 2 of the jump.
  EXPECT_EQ(refused_by(f, F, &why), JumpRule::NoBranchIntoRegion);
  EXPECT_TRUE(has(why, "jne")) << why;
  EXPECT_TRUE(has(why, "0xffffffff81000002")) << why;
  // [F+2, F+7): the target is the region's start, where the jump itself is: fine.
  EXPECT_EQ(refused_by(f, F + 2), JumpRule::None);
  // [F+5, F+c) holds the jne itself (relocated as jne rel32 in the detour): fine.
  EXPECT_EQ(refused_by(f, F + 5), JumpRule::None);
}

TEST(JumpSafety, NoBranchIntoRegionEntryPoints) {
  // kPlain, with F+3 named as an exception fixup (the kernel jumps there on a fault).
  SiteIndex entries;
  entries.add(F + 3, 1, "__ex_table fixup");
  JumpContext ctx;
  ctx.entry_points = &entries;
  JumpFunction f = fn(kPlain, ctx);
  std::string why;
  EXPECT_EQ(refused_by(f, F, &why), JumpRule::NoBranchIntoRegion);
  EXPECT_TRUE(has(why, "__ex_table fixup at 0xffffffff81000003 enters the function from outside")) << why;
  EXPECT_EQ(refused_by(f, F + 3), JumpRule::None);  // the region's start
}

// A jump table: `jmp [rax*8 + table]`, its cases inside the function.
//   F+0   48 83 f8 02             cmp rax, 2
//   F+4   77 0f                   ja F+0x15
//   F+6   ff 24 c5 00 20 00 81    jmp [rax*8 + 0xffffffff81002000]
//   F+d   31 c0                   xor eax, eax      case 0
//   F+f   c3                      ret
//   F+10  b8 01 00 00 00          mov eax, 1        case 1
//   F+15  48 89 c7                mov rdi, rax      case 2, and the ja
//   F+18  31 c0                   xor eax, eax
//   F+1a  c3                      ret
const std::vector<std::uint8_t> kSwitch = {0x48, 0x83, 0xf8, 0x02, 0x77, 0x0f, 0xff, 0x24, 0xc5,
                                           0x00, 0x20, 0x00, 0x81, 0x31, 0xc0, 0xc3, 0xb8, 0x01,
                                           0x00, 0x00, 0x00, 0x48, 0x89, 0xc7, 0x31, 0xc0, 0xc3};

TEST(JumpSafety, JumpTableUnknownMakesTheFunctionUnsafe) {
  JumpContext ctx;
  JumpFunction f = fn(kSwitch, ctx);
  ASSERT_TRUE(f.unknown_targets());
  std::string why;
  // Even a region nowhere near the cases.
  EXPECT_EQ(refused_by(f, F + 0x10, &why), JumpRule::NoBranchIntoRegion);
  EXPECT_TRUE(has(why, "jmp qword ptr [rax*8")) << why;
  EXPECT_FALSE(check_jump(f, Gva{F + 0x10}).optimizable);
}

TEST(JumpSafety, JumpTableUnknownOnAnIbtKernel) {
  // Built with IBT, every indirect-jump target starts with endbr64, which no region may hold:
  // the unknown jump no longer taints the function.
  JumpContext ctx;
  ctx.endbr_marks_indirect_targets = true;
  JumpFunction f = fn(kSwitch, ctx);
  EXPECT_FALSE(f.unknown_targets());
  EXPECT_EQ(refused_by(f, F + 0x10), JumpRule::None);
}

TEST(JumpSafety, JumpTableWithItsEntries) {
  JumpContext ctx;
  int asked = 0;
  ctx.indirect_targets = [&](const Insn& i) -> std::optional<std::vector<Gva>> {
    ++asked;
    if (i.mem.disp != static_cast<std::int64_t>(0xffffffff81002000)) return std::nullopt;
    return std::vector<Gva>{Gva{F + 0xd}, Gva{F + 0x10}, Gva{F + 0x15}};
  };
  JumpFunction f = fn(kSwitch, ctx);
  EXPECT_EQ(asked, 1);
  EXPECT_FALSE(f.unknown_targets());
  std::string why;
  // [F+d, F+15): xor, ret, mov eax,1: case 1 at F+10 is inside.
  EXPECT_EQ(refused_by(f, F + 0xd, &why), JumpRule::NoBranchIntoRegion);
  EXPECT_TRUE(has(why, "0xffffffff81000010")) << why;
  // [F+10, F+15): the mov eax, 1 alone, a case's own start: fine.
  EXPECT_EQ(refused_by(f, F + 0x10), JumpRule::None);
  // [F+15, F+1a): starts at case 2 / the ja's target: fine.
  EXPECT_EQ(refused_by(f, F + 0x15), JumpRule::None);
}

TEST(JumpSafety, RetpolineThunkJumpIsIndirect) {
  //   F+0   48 89 c7             mov rdi, rax
  //   F+3   31 c0                xor eax, eax
  //   F+5   e9 f6 0f 00 00       jmp F+0x1000 (__x86_indirect_thunk_rax: jmp *%rax)
  const std::vector<std::uint8_t> b = {0x48, 0x89, 0xc7, 0x31, 0xc0, 0xe9, 0xf6, 0x0f, 0x00, 0x00};
  JumpContext plain;
  EXPECT_EQ(refused_by(fn(b, plain), F), JumpRule::None);  // a tail call to F+0x1000 as far as bytes go
  SiteIndex thunks;
  thunks.add(F + 0x1000, 0x20, "__x86_indirect_thunk_rax");
  JumpContext ctx;
  ctx.indirect_thunks = &thunks;
  std::string why;
  EXPECT_EQ(refused_by(fn(b, ctx), F, &why), JumpRule::NoBranchIntoRegion);
  EXPECT_TRUE(has(why, "indirect jump")) << why;
}

TEST(JumpSafety, NoReservedAddress) {
  JumpContext ctx;
  SiteIndex reserved;
  ctx.reserved = &reserved;
  // A jump-label site of 5 bytes at F+9 (mov rdi, rax; ret in kPlain's bytes: only the address
  // matters here), and an exception-table instruction at F+5.
  reserved.add(F + 9, 5, "jump label");
  reserved.add(F + 5, 1, "__ex_table entry");
  JumpFunction f = fn(kPlain, ctx);
  std::string why;
  EXPECT_EQ(refused_by(f, F, &why), JumpRule::None);                   // [F, F+5): F+5 is just past it
  EXPECT_EQ(refused_by(f, F + 3, &why), JumpRule::NoReservedAddress);  // [F+3, F+9)
  EXPECT_TRUE(has(why, "__ex_table entry at 0xffffffff81000005")) << why;
  // A site that starts before the region and reaches into it.
  SiteIndex early;
  early.add(F - 2, 5, "static call");
  ctx.reserved = &early;
  EXPECT_EQ(refused_by(fn(kPlain, ctx), F, &why), JumpRule::NoReservedAddress);
  EXPECT_TRUE(has(why, "static call")) << why;
}

TEST(JumpSafety, SiteIndexIsNotTrustedToBeSorted) {
  SiteIndex s;
  s.add(300, 1, "c");
  s.add(100, 4, "a");
  s.add(200, 1, "b");
  ASSERT_NE(s.overlapping(102, 110), nullptr);
  EXPECT_EQ(s.overlapping(102, 110)->what, "a");
  EXPECT_EQ(s.overlapping(104, 200), nullptr);
  EXPECT_EQ(s.overlapping(150, 201)->what, "b");
  EXPECT_EQ(s.overlapping(301, 400), nullptr);
}

TEST(JumpSafety, EarlierStartInTheSameBasicBlock) {
  // kPlain at F+9: mov rdi, rax; ret crosses the end. The region [F+5, F+c) covers F+9 and
  // passes: the detour runs add, calls the handler, then runs the copy of the mov.
  JumpContext ctx;
  JumpFunction f = fn(kPlain, ctx);
  auto v = check_jump(f, Gva{F + 9});
  ASSERT_TRUE(v.optimizable);
  EXPECT_TRUE(v.starts_earlier);
  EXPECT_EQ(v.region.start, Gva{F + 5});
  EXPECT_EQ(v.region.end(), Gva{F + 0xc});
  EXPECT_EQ(v.refusal.rule, JumpRule::FitsInFunction);  // why its own region was not used
  // The ret at F+c: earlier starts F+9 (4 bytes, crosses the end) and F+5 (ends at F+c, does
  // not cover it): none.
  auto ret = check_jump(f, Gva{F + 0xc});
  EXPECT_FALSE(ret.optimizable);
  EXPECT_EQ(ret.refusal.rule, JumpRule::FitsInFunction);
}

TEST(JumpSafety, EarlierStartStopsAtABranch) {
  //   F+0   48 85 c0       test rax, rax
  //   F+3   74 fb          je F+0
  //   F+5   31 c0          xor eax, eax     ← probed: its own region crosses the end
  //   F+7   c3             ret
  const std::vector<std::uint8_t> b = {0x48, 0x85, 0xc0, 0x74, 0xfb, 0x31, 0xc0, 0xc3};
  JumpContext ctx;
  JumpFunction f = fn(b, ctx);
  // [F+3, F+8) passes every rule (the je is relocated to rel32, its target F+0 is outside),
  // but the je ends the basic block before F+5: the handler placed before the copy of F+5
  // would run whether or not the je is taken.
  EXPECT_EQ(refused_by(f, F + 3), JumpRule::None);
  auto v = check_jump(f, Gva{F + 5});
  EXPECT_FALSE(v.optimizable);
  EXPECT_EQ(v.refusal.rule, JumpRule::FitsInFunction);
  auto je = check_jump(f, Gva{F + 3});
  EXPECT_TRUE(je.optimizable);
  EXPECT_FALSE(je.starts_earlier);
}

TEST(JumpSafety, EarlierStartRefusedWhenThePointIsABranchTarget) {
  // kSwitch with a table whose third entry is F+18 (xor eax, eax; ret). A probe there: its own
  // region crosses the function's end, and the only earlier start in reach, F+15, would put
  // the jump over F+18, a table target.
  JumpContext ctx;
  ctx.indirect_targets = [](const Insn&) -> std::optional<std::vector<Gva>> {
    return std::vector<Gva>{Gva{F + 0xd}, Gva{F + 0x10}, Gva{F + 0x18}};
  };
  JumpFunction f = fn(kSwitch, ctx);
  auto v = check_jump(f, Gva{F + 0x18});
  EXPECT_FALSE(v.optimizable);
  EXPECT_EQ(v.refusal.rule, JumpRule::FitsInFunction);
  std::string why;
  EXPECT_EQ(refused_by(f, F + 0x15, &why), JumpRule::NoBranchIntoRegion);
  EXPECT_TRUE(has(why, "0xffffffff81000018")) << why;
}

}  // namespace
}  // namespace xenprobes::x86
