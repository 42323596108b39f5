// Short jumps to islands and the proof that indirect jumps only leave a function: the rules
// behind them (x86/jump_safety.hpp), each tripped by a function written out byte by byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "x86/jump_safety.hpp"

namespace xenprobes::x86 {
namespace {

constexpr std::uint64_t F = 0xffffffff81000000;  // where the test functions live

JumpFunction fn(const std::vector<std::uint8_t>& bytes, const JumpContext& ctx) {
  auto r = JumpFunction::decode(bytes, Gva{F}, ctx);
  EXPECT_TRUE(r) << r.error().what;
  return r ? *r : JumpFunction{};
}

bool has(const std::string& s, const char* word) { return s.find(word) != std::string::npos; }

// A loop whose back edge lands inside the first instruction's 5-byte region, then padding:
//   F+0   31 c0                xor eax, eax
//   F+2   48 ff c0             inc rax            <- the jne's target
//   F+5   48 83 f8 0a          cmp rax, 10
//   F+9   75 f7                jne F+2
//   F+b   c3                   ret
//   F+c   cc                   int3               dead padding [F+c, F+16)
//   F+d   0f 1f 44 00 00       nop5
//   F+12  0f 1f 40 00          nop4
const std::vector<std::uint8_t> kLoop = {0x31, 0xc0, 0x48, 0xff, 0xc0, 0x48, 0x83, 0xf8, 0x0a, 0x75, 0xf7,
                                         0xc3, 0xcc, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x0f, 0x1f, 0x40, 0x00};

TEST(JumpIsland, DeadPaddingIsWhatFollowsTheLastRetOrJmp) {
  JumpContext ctx;
  auto p = dead_padding(fn(kLoop, ctx));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->first, Gva{F + 0xc});
  EXPECT_EQ(p->second, Gva{F + 0x16});

  // A branch into it makes it code: jne F+0xd instead of F+2.
  auto b = kLoop;
  b[10] = 0x02;
  EXPECT_FALSE(dead_padding(fn(b, ctx)));
  // So does an entry point from outside (an exception fixup), or a reserved site there.
  SiteIndex fixup, reserved;
  fixup.add(F + 0x14, 1, "__ex_table fixup");
  reserved.add(F + 0x10, 1, "lock prefix");
  JumpContext with_fixup, with_reserved;
  with_fixup.entry_points = &fixup;
  with_reserved.reserved = &reserved;
  EXPECT_FALSE(dead_padding(fn(kLoop, with_fixup)));
  EXPECT_FALSE(dead_padding(fn(kLoop, with_reserved)));
  // After a call (even to a function that never returns) nothing is known to be dead.
  auto c = kLoop;
  const std::uint8_t call[] = {0xe8, 0x00, 0x10, 0x00, 0x00};  // call F+0x100a instead of the cmp + jne + ret
  std::copy(std::begin(call), std::end(call), c.begin() + 5);
  c[10] = 0xcc;  // (the byte after the call: padding too)
  c[11] = 0xcc;
  EXPECT_FALSE(dead_padding(fn(c, ctx)));
  // Shorter than an island.
  std::vector<std::uint8_t> short_pad(kLoop.begin(), kLoop.begin() + 0xc);
  short_pad.insert(short_pad.end(), 4, 0xcc);  // ret; int3 x 4
  EXPECT_FALSE(dead_padding(fn(short_pad, ctx)));
  // A function with an indirect jump of unknown targets: no byte of it is known dead.
  auto t = kLoop;
  const std::uint8_t thunk_jmp[] = {0xe9, 0x00, 0x10, 0x00, 0x00};  // jmp F+0x100a, a retpoline thunk
  std::copy(std::begin(thunk_jmp), std::end(thunk_jmp), t.begin() + 5);
  t[10] = 0xcc;
  t[11] = 0xcc;
  SiteIndex thunks;
  thunks.add(F + 0x1000, 0x20, "__x86_indirect_thunk_rax");
  JumpContext with_thunks;
  with_thunks.indirect_thunks = &thunks;
  EXPECT_TRUE(dead_padding(fn(t, ctx)));  // a tail call to F+0x100a as far as bytes go
  EXPECT_FALSE(dead_padding(fn(t, with_thunks)));
}

TEST(JumpIsland, AShortJumpReachesAnIslandWhereNo5ByteRegionPasses) {
  JumpContext plain;
  const JumpVerdict no = check_jump(fn(kLoop, plain), Gva{F});
  ASSERT_FALSE(no.optimizable);  // [F, F+5) holds the jne's target F+2
  EXPECT_EQ(no.refusal.rule, JumpRule::NoBranchIntoRegion);

  SiteIndex pad;
  pad.add(F + 0xc, 10, "kLoop");
  JumpContext ctx;
  ctx.island_padding = &pad;
  const JumpFunction f = fn(kLoop, ctx);
  const JumpVerdict v = check_jump(f, Gva{F});
  ASSERT_TRUE(v.optimizable);
  EXPECT_EQ(v.region.start, Gva{F});
  EXPECT_EQ(v.region.length, 2);  // the xor alone: eb rel8 over it
  EXPECT_EQ(v.region.patch, kShortJumpLen);
  EXPECT_FALSE(v.starts_earlier);
  ASSERT_TRUE(v.island);
  EXPECT_EQ(*v.island, Gva{F + 0xc});
  EXPECT_EQ(v.refusal.rule, JumpRule::NoBranchIntoRegion) << "the 5-byte region's refusal stays told";

  // Islands other probes hold are skipped; with none left the point stays a trap probe.
  SiteIndex taken;
  taken.add(F + 0xc, kIslandLen, "another probe");
  ctx.islands_taken = &taken;
  EXPECT_EQ(*check_jump(f, Gva{F}).island, Gva{F + 0x11});
  taken.add(F + 0x11, kIslandLen, "a third probe");
  EXPECT_FALSE(check_jump(f, Gva{F}).optimizable);
  JumpRegion r;
  ASSERT_FALSE(check_region(f, Gva{F}, &r, kShortJumpLen));
  Gva island{};
  auto why = island_in_reach(f, r, &island);
  ASSERT_TRUE(why);
  EXPECT_EQ(why->rule, JumpRule::IslandInReach);
  EXPECT_TRUE(has(why->reason, "no free 5 bytes")) << why->reason;
  EXPECT_EQ(jump_rule_name(JumpRule::IslandInReach), "island-in-reach");
}

TEST(JumpIsland, TheShortRegionPassesTheSameRules) {
  SiteIndex pad;
  pad.add(F + 0xc, 10, "kLoop");
  JumpContext ctx;
  ctx.island_padding = &pad;
  // A 1-byte instruction takes the next one into its 2-byte region: the int3 padding at F+c
  // after the ret is fine, but a target inside is not. F+1 is no boundary at all.
  const JumpFunction f = fn(kLoop, ctx);
  JumpRegion r;
  EXPECT_FALSE(check_region(f, Gva{F + 0xb}, &r, kShortJumpLen));  // ret + int3
  EXPECT_EQ(r.length, 2);
  EXPECT_EQ(check_region(f, Gva{F + 1}, &r, kShortJumpLen)->rule, JumpRule::RegionInFunction);
  // xor eax,eax; then a 1-byte push rbp as the jne's target: [F, F+7) holds the target F+2.
  const std::vector<std::uint8_t> b = {0x31, 0xc0, 0x55, 0x48, 0x83, 0xf8, 0x0a, 0x75, 0xf9,
                                       0xc3, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc};
  SiteIndex pad2;
  pad2.add(F + 0xa, 8, "b");
  JumpContext ctx2;
  ctx2.island_padding = &pad2;
  const JumpFunction g = fn(b, ctx2);
  EXPECT_TRUE(check_jump(g, Gva{F}).optimizable);      // [F, F+2): the xor alone
  const JumpVerdict push = check_jump(g, Gva{F + 2});  // the push (1 byte) + cmp: [F+2, F+6)
  ASSERT_TRUE(push.optimizable);
  EXPECT_EQ(push.region.start, Gva{F + 2});
  EXPECT_EQ(push.region.length, 5);  // push + cmp (4): fine as a 5-byte region, no island
  EXPECT_FALSE(push.island);
  // Not into the function's end: the last int3 alone is 1 byte.
  EXPECT_EQ(fits_in_function(g, Gva{F + 0x11}, kShortJumpLen)->rule, JumpRule::FitsInFunction);
}

TEST(JumpIsland, ReachIsRel8FromTheShortJumpsEndAndNeverTheRegionItself) {
  JumpContext ctx;
  SiteIndex pad;
  ctx.island_padding = &pad;
  // Padding 126 bytes before the jump's end: reachable backwards (rel8 >= -128).
  pad.add(F + 2 - 128, 5, "the function before");
  JumpFunction f = fn(kLoop, ctx);
  EXPECT_EQ(*check_jump(f, Gva{F}).island, Gva{F + 2 - 128});
  // One byte further: out of reach; and padding past F+2+127 too.
  SiteIndex far;
  far.add(F + 2 - 129, 5, "too far back");
  far.add(F + 2 + 128, 5, "too far on");
  ctx.island_padding = &far;
  f = fn(kLoop, ctx);
  EXPECT_FALSE(check_jump(f, Gva{F}).optimizable);
  // Padding listed over the region itself: the island starts after the region.
  SiteIndex over;
  over.add(F, 8, "bogus");
  ctx.island_padding = &over;
  f = fn(kLoop, ctx);
  EXPECT_EQ(*check_jump(f, Gva{F}).island, Gva{F + 2});
  // The island's rel32 must reach the detour area.
  ctx.island_padding = &pad;
  ctx.detour_area = Gva{F + 0x100000000ull};
  ctx.detour_area_size = 0x1000;
  f = fn(kLoop, ctx);
  EXPECT_FALSE(check_jump(f, Gva{F}).optimizable);
}

TEST(JumpIsland, MaterializedAddresses) {
  auto at = [](std::vector<std::uint8_t> b) {
    auto i = decode(b, Gva{F});
    EXPECT_TRUE(i) << i.error().what;
    return i ? materialized_addresses(*i) : std::vector<std::uint64_t>{};
  };
  using V = std::vector<std::uint64_t>;
  EXPECT_EQ(at({0x48, 0x8d, 0x05, 0x10, 0x00, 0x00, 0x00}), V{F + 7 + 0x10});  // lea rax, [rip + 0x10]
  EXPECT_EQ(at({0x48, 0xc7, 0xc0, 0x00, 0x10, 0x00, 0x81}), V{F + 0x1000});    // mov rax, imm32 (sign-extended)
  EXPECT_EQ(at({0x48, 0xb8, 0x00, 0x20, 0x00, 0x81, 0xff, 0xff, 0xff, 0xff}), V{F + 0x2000});  // movabs
  EXPECT_EQ(at({0xff, 0x24, 0xc5, 0x00, 0x20, 0x00, 0x81}), V{F + 0x2000});                    // jmp [rax*8 + table]
  EXPECT_EQ(at({0xe8, 0x00, 0x10, 0x00, 0x00}), V{});                                          // call rel32: a branch
  EXPECT_EQ(at({0x75, 0xf7}), V{});                                                            // jne rel8
  EXPECT_EQ(at({0x48, 0x83, 0xf8, 0x0a}), V{});  // cmp rax, 10: an imm8 is no address
}

//   F+0   48 89 c7             mov rdi, rax
//   F+3   31 c0                xor eax, eax
//   F+5   e9 f6 0f 00 00       jmp F+0x1000 (__x86_indirect_thunk_rax: jmp *%rax)
const std::vector<std::uint8_t> kTail = {0x48, 0x89, 0xc7, 0x31, 0xc0, 0xe9, 0xf6, 0x0f, 0x00, 0x00};

TEST(JumpIsland, IndirectJumpsOnlyLeaveAFunctionNobodyFormsAnAddressIn) {
  SiteIndex thunks, taken;
  thunks.add(F + 0x1000, 0x20, "__x86_indirect_thunk_rax");
  JumpContext ctx;
  ctx.indirect_thunks = &thunks;
  EXPECT_TRUE(fn(kTail, ctx).unknown_targets()) << "without the list, the jump could land anywhere";
  EXPECT_TRUE(interior_address_taken(fn(kTail, ctx)));

  // Nobody forms an address inside: a tail call.
  taken.add(F + 0x40, 1, "the word at X");  // another function's
  ctx.addresses_taken = &taken;
  JumpFunction f = fn(kTail, ctx);
  EXPECT_FALSE(f.unknown_targets());
  EXPECT_TRUE(f.only_leaving_indirect_jumps());
  EXPECT_TRUE(check_jump(f, Gva{F}).optimizable);
  EXPECT_TRUE(dead_padding(f) == std::nullopt);  // (no padding in these bytes)

  // Somebody forms F+3 (a label, e.g. a computed goto's table): the taint stays.
  taken.add(F + 3, 1, "the word at 0xffffffff82000000");
  f = fn(kTail, ctx);
  ASSERT_TRUE(f.unknown_targets());
  EXPECT_FALSE(f.only_leaving_indirect_jumps());
  auto who = interior_address_taken(f);
  ASSERT_TRUE(who);
  EXPECT_TRUE(has(*who, "0xffffffff82000000")) << *who;
  EXPECT_FALSE(check_jump(f, Gva{F}).optimizable);

  // The function forms its own start (a base for arithmetic on its labels): the taint stays.
  SiteIndex none;
  ctx.addresses_taken = &none;
  const std::vector<std::uint8_t> self = {0x48, 0x8d, 0x05, 0xf9, 0xff, 0xff, 0xff,   // lea rax, [rip - 7] = F
                                          0x31, 0xc0, 0xe9, 0xf2, 0x0f, 0x00, 0x00};  // xor; jmp F+0x1000
  f = fn(self, ctx);
  ASSERT_TRUE(f.unknown_targets());
  who = interior_address_taken(f);
  ASSERT_TRUE(who);
  EXPECT_TRUE(has(*who, "own start")) << *who;
}

}  // namespace
}  // namespace xenprobes::x86
