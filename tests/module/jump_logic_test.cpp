// The guest module's pure decisions for jump probes (guest-module/xp_logic.c, protocol.h "Jump
// probes"): what the int3 hook does with JUMP and REDIRECT entries, which call of the jump entry
// is a hit, how Dom0's answer to a jump hit becomes the registers it resumes with (rip, rsp
// bounds, flags), and when the module's own restore writes a jump's region back.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <set>
#include <vector>

#include "module/module_logic_fixture.hpp"
#include "xp_logic.h"

namespace {

// The same guest layout as the module's other tests (module_logic_fixture.hpp).
using namespace module_logic;

std::set<std::uint64_t> nx_pages;

bool is_exec(void*, std::uint64_t addr) { return !nx_pages.count(addr & ~0xfffull); }

xp_bounds bounds() {
  xp_bounds b{};
  b.ktext = {kText, kTextEnd};
  b.modules = {kModules, kModulesEnd};
  b.oea = {kOea, kOeaEnd};
  b.is_exec = &is_exec;
  return b;
}

class Jump : public ::testing::Test {
 protected:
  void SetUp() override { nx_pages.clear(); }
  xp_bounds b = bounds();
};

xenprobes_trap entry(std::uint64_t addr, std::uint32_t flags, std::uint64_t fallback,
                     std::initializer_list<std::uint8_t> insn = {}) {
  xenprobes_trap t{};
  t.addr = addr;
  t.flags = flags;
  t.fallback = fallback;
  t.len = static_cast<std::uint8_t>(insn.size());
  std::copy(insn.begin(), insn.end(), t.insn);
  return t;
}

// The address of a value that lives until the end of the full expression.
const xenprobes_trap* ptr_of(const xenprobes_trap& t) { return &t; }

// `e9 <rel32>` at `at` jumping to `to`.
std::vector<std::uint8_t> jmp(std::uint64_t at, std::uint64_t to) {
  const auto rel = static_cast<std::uint32_t>(to - (at + 5));
  return {0xe9, static_cast<std::uint8_t>(rel), static_cast<std::uint8_t>(rel >> 8),
          static_cast<std::uint8_t>(rel >> 16), static_cast<std::uint8_t>(rel >> 24)};
}

// ---- the int3 hook and the two new kinds ----

TEST_F(Jump, Int3AtAJumpKeyIsForeignAtARegionARedirect) {
  EXPECT_EQ(xp_int3_action(ptr_of(entry(kOea + 0x40, XENPROBES_TRAP_JUMP, kText + 0x10))), XP_INT3_FOREIGN);
  EXPECT_EQ(xp_int3_action(ptr_of(entry(kText + 0x10, XENPROBES_TRAP_REDIRECT, kOea))), XP_INT3_REDIRECT);
  for (std::uint32_t f : {XENPROBES_TRAP_FALLBACK, XENPROBES_TRAP_EMULATE, XENPROBES_TRAP_RETURN, 0u,
                          XENPROBES_TRAP_REDIRECT | XENPROBES_TRAP_JUMP})
    EXPECT_EQ(xp_int3_action(ptr_of(entry(kText + 0x10, f, kOea))), XP_INT3_HIT) << f;
}

TEST_F(Jump, RedirectResumesAtTheDetourValidatedAndJumpIsNoTrap) {
  xenprobes_regs r{};
  r.rip = kText + 0x10;
  r.rsp = kStack;
  auto red = entry(kText + 0x10, XENPROBES_TRAP_REDIRECT, kOea + 0x100, {0x55, 0x48, 0x89, 0xe5, 0x53});
  ASSERT_EQ(xp_take_fallback(&red, &r, nullptr, 0, &b, nullptr), XP_FB_OK);
  EXPECT_EQ(r.rip, kOea + 0x100);
  EXPECT_EQ(r.rsp, kStack);

  auto bad = entry(kText + 0x10, XENPROBES_TRAP_REDIRECT, kStack, {0x55, 0, 0, 0, 0});
  r.rip = kText + 0x10;
  EXPECT_EQ(xp_take_fallback(&bad, &r, nullptr, 0, &b, nullptr), XP_FB_BAD_TARGET);
  EXPECT_EQ(r.rip, kText + 0x10);

  auto key = entry(kOea + 0x40, XENPROBES_TRAP_JUMP, kText + 0x10);
  EXPECT_EQ(xp_take_fallback(&key, &r, nullptr, 0, &b, nullptr), XP_FB_BAD_ENTRY);
  // Exactly one flag: a combination is no kind at all.
  auto both = entry(kText + 0x10, XENPROBES_TRAP_REDIRECT | XENPROBES_TRAP_FALLBACK, kOea);
  EXPECT_EQ(xp_take_fallback(&both, &r, nullptr, 0, &b, nullptr), XP_FB_BAD_ENTRY);
}

// ---- which call of the jump entry is a hit ----

TEST_F(Jump, LookupNeedsTheJumpEntryOfThisCallInsideTheOea) {
  const std::uint64_t call = kOea + 0x40, ret = call + 5;
  auto e = entry(call, XENPROBES_TRAP_JUMP, kText + 0x10);
  EXPECT_EQ(xp_jump_call_addr(ret), call);
  EXPECT_EQ(xp_jump_lookup(&b, &e, ret), XP_JUMP_HIT);
  EXPECT_EQ(xp_jump_lookup(&b, nullptr, ret), XP_JUMP_FOREIGN);  // none in the table
  EXPECT_EQ(xp_jump_lookup(&b, &e, ret + 1), XP_JUMP_FOREIGN);   // another call
  EXPECT_EQ(xp_jump_lookup(&b, &e, 3), XP_JUMP_FOREIGN);         // no wrap below 0
  for (std::uint32_t f :
       {XENPROBES_TRAP_REDIRECT, XENPROBES_TRAP_FALLBACK, 0u, XENPROBES_TRAP_JUMP | XENPROBES_TRAP_FALLBACK}) {
    auto other = entry(call, f, kText + 0x10);
    EXPECT_EQ(xp_jump_lookup(&b, &other, ret), XP_JUMP_FOREIGN) << f;
  }
  // A detour outside the OEA is none of ours.
  auto outside = entry(kText + 0x40, XENPROBES_TRAP_JUMP, kText + 0x10);
  EXPECT_EQ(xp_jump_lookup(&b, &outside, kText + 0x45), XP_JUMP_FOREIGN);
  auto last = entry(kOeaEnd - 5, XENPROBES_TRAP_JUMP, kText + 0x10);
  EXPECT_EQ(xp_jump_lookup(&b, &last, kOeaEnd), XP_JUMP_HIT);
}

// ---- async jump entries (protocol.h "Async jump probes") ----

// An async JUMP entry at `call` for probe `probe` with `ncaps` specs at `specs`.
xenprobes_trap async_entry(std::uint64_t call, std::uint32_t probe, std::uint8_t ncaps, std::uint64_t specs) {
  xenprobes_trap t = entry(call, XENPROBES_TRAP_JUMP | XENPROBES_TRAP_ASYNC, kText + 0x10);
  const auto off = static_cast<std::uint32_t>(specs - call);
  for (unsigned i = 0; i < 4; ++i) {
    t.insn[XENPROBES_ASYNC_KEY_PROBE + i] = static_cast<std::uint8_t>(probe >> (8 * i));
    t.insn[XENPROBES_ASYNC_KEY_SPECS + i] = static_cast<std::uint8_t>(off >> (8 * i));
  }
  t.insn[XENPROBES_ASYNC_KEY_NCAPS] = ncaps;
  return t;
}

TEST_F(Jump, AsyncEntryIsAnAsyncHitOnlyWithBothFlagsInsideTheOea) {
  const std::uint64_t call = kOea + 0x40, ret = call + 5;
  auto a = async_entry(call, 7, 0, 0);
  EXPECT_EQ(xp_jump_lookup(&b, &a, ret), XP_JUMP_ASYNC);
  EXPECT_EQ(xp_jump_lookup(&b, &a, ret + 1), XP_JUMP_FOREIGN);
  auto lone = entry(call, XENPROBES_TRAP_ASYNC, kText + 0x10);  // ASYNC without JUMP
  EXPECT_EQ(xp_jump_lookup(&b, &lone, ret), XP_JUMP_FOREIGN);
  auto extra = entry(call, XENPROBES_TRAP_JUMP | XENPROBES_TRAP_ASYNC | XENPROBES_TRAP_FALLBACK, kText + 0x10);
  EXPECT_EQ(xp_jump_lookup(&b, &extra, ret), XP_JUMP_FOREIGN);
  auto outside = async_entry(kText + 0x40, 7, 0, 0);
  EXPECT_EQ(xp_jump_lookup(&b, &outside, kText + 0x45), XP_JUMP_FOREIGN);
  // An int3 there (another debugger's, on the detour's call) is foreign to the hook: a key,
  // never a trap byte of ours.
  EXPECT_EQ(xp_int3_action(&a), XP_INT3_FOREIGN);
}

TEST_F(Jump, AsyncKeyGivesTheProbeAndSpecsBeforeOrAfterTheCall) {
  const std::uint64_t call = kOea + 0x40;
  xp_async_key k{};
  auto none = async_entry(call, 0xdeadbeef, 0, 0x1234);  // ncaps 0: the offset is not used
  ASSERT_EQ(xp_jump_async_key(&b, &none, &k), 0);
  EXPECT_EQ(k.probe, 0xdeadbeefu);
  EXPECT_EQ(k.ncaps, 0u);
  EXPECT_EQ(k.specs, 0u);

  auto after = async_entry(call, 3, XENPROBES_RING_CAPS_MAX, call + 0x60);
  ASSERT_EQ(xp_jump_async_key(&b, &after, &k), 0);
  EXPECT_EQ(k.probe, 3u);
  EXPECT_EQ(k.ncaps, XENPROBES_RING_CAPS_MAX);
  EXPECT_EQ(k.specs, call + 0x60);

  auto before = async_entry(call, 3, 2, kOea);  // a negative offset
  ASSERT_EQ(xp_jump_async_key(&b, &before, &k), 0);
  EXPECT_EQ(k.specs, kOea);

  // The last specs that fit end exactly at the OEA's end.
  auto last = async_entry(call, 3, 2, kOeaEnd - 16);
  ASSERT_EQ(xp_jump_async_key(&b, &last, &k), 0);
  EXPECT_EQ(k.specs, kOeaEnd - 16);
}

TEST_F(Jump, AsyncKeyRefusesWhatBreaksARule) {
  const std::uint64_t call = kOea + 0x40;
  xp_async_key k{};
  auto many = async_entry(call, 1, XENPROBES_RING_CAPS_MAX + 1, call + 0x20);
  EXPECT_EQ(xp_jump_async_key(&b, &many, &k), -XP_EINVAL);
  for (unsigned i : {5u, 6u, 7u}) {
    auto dirty = async_entry(call, 1, 1, call + 0x20);
    dirty.insn[i] = 1;
    EXPECT_EQ(xp_jump_async_key(&b, &dirty, &k), -XP_EINVAL) << i;
  }
  auto odd = async_entry(call, 1, 1, call + 0x24);
  EXPECT_EQ(xp_jump_async_key(&b, &odd, &k), -XP_EINVAL);
  auto below = async_entry(call, 1, 1, kOea - 8);
  EXPECT_EQ(xp_jump_async_key(&b, &below, &k), -XP_EINVAL);
  auto straddles = async_entry(call, 1, 2, kOeaEnd - 8);  // the second spec past the end
  EXPECT_EQ(xp_jump_async_key(&b, &straddles, &k), -XP_EINVAL);
  auto past = async_entry(kOeaEnd - 5, 1, 1, kOeaEnd + 0x100);
  EXPECT_EQ(xp_jump_async_key(&b, &past, &k), -XP_EINVAL);
}

// ---- Dom0's answer to a jump hit ----

struct Hit {
  static constexpr std::uint64_t kProbed = kText + 0x1234;
  static constexpr std::uint64_t kRet = kOea + 0x45;  // call + 5 in the detour
  xenprobes_regs regs{};
  Hit() {
    regs.rax = 1;
    regs.rbx = 2;
    regs.rcx = 3;
    regs.rsp = kStack;
    regs.rip = kProbed;
    regs.rflags = 0x2 | kRflagsIf;
    regs.cs = 0x10;
    regs.ss = 0x18;
  }
};

TEST_F(Jump, AnswerAtTheProbedAddressContinuesInTheDetour) {
  Hit h;
  xenprobes_regs a = h.regs;
  a.rax = 0xaa;
  a.r15 = 0xf15;
  a.rflags = 0xffffffffffffffffull;  // every flag: only the arithmetic ones may be taken
  a.cs = 0x33;
  a.ss = 0x2b;
  xenprobes_regs out{};
  ASSERT_EQ(xp_jump_answer_apply(&b, &h.regs, &a, Hit::kRet, &out), XP_ANSWER_OK);
  EXPECT_EQ(out.rip, Hit::kRet);
  EXPECT_EQ(out.rsp, kStack);
  EXPECT_EQ(out.rax, 0xaau);
  EXPECT_EQ(out.rbx, 2u);
  EXPECT_EQ(out.r15, 0xf15u);
  EXPECT_EQ(out.rflags, 0x2 | kRflagsIf | XP_RFLAGS_FROM_DOM0);
  EXPECT_EQ(out.rflags & (XP_RFLAGS_TF | kRflagsDf), 0u);
  EXPECT_EQ(out.cs, 0x10u);
  EXPECT_EQ(out.ss, 0x18u);
}

TEST_F(Jump, AnotherRipSkipsTheInstructionWhereverItIsValid) {
  Hit h;
  xenprobes_regs a = h.regs;
  a.rip = kText + 0x2000;  // e.g. an emulated ret: rip from the stack, rsp + 8
  a.rsp = kStack + 8;
  xenprobes_regs out{};
  ASSERT_EQ(xp_jump_answer_apply(&b, &h.regs, &a, Hit::kRet, &out), XP_ANSWER_OK);
  EXPECT_EQ(out.rip, kText + 0x2000);
  EXPECT_EQ(out.rsp, kStack + 8);
  // In the OEA (a detour copy further on) is fine too.
  a.rip = Hit::kRet + 7;
  ASSERT_EQ(xp_jump_answer_apply(&b, &h.regs, &a, Hit::kRet, &out), XP_ANSWER_OK);
  EXPECT_EQ(out.rip, Hit::kRet + 7);
  // Outside code, or on a page that is not executable: unusable.
  out = {};
  a.rip = kStack;
  EXPECT_EQ(xp_jump_answer_apply(&b, &h.regs, &a, Hit::kRet, &out), XP_ANSWER_BAD_RIP);
  nx_pages.insert((kText + 0x2000) & ~0xfffull);
  a.rip = kText + 0x2000;
  EXPECT_EQ(xp_jump_answer_apply(&b, &h.regs, &a, Hit::kRet, &out), XP_ANSWER_BAD_RIP);
  EXPECT_EQ(out.rip, 0u);  // untouched
}

TEST_F(Jump, RspMayOnlyRiseByAtMostAPageInWords) {
  Hit h;
  xenprobes_regs a = h.regs, out{};
  for (std::uint64_t up : std::initializer_list<std::uint64_t>{0ull, 8ull, 16ull, 4088ull, 4096ull}) {
    a.rsp = kStack + up;
    EXPECT_EQ(xp_jump_answer_apply(&b, &h.regs, &a, Hit::kRet, &out), XP_ANSWER_OK) << up;
    EXPECT_EQ(out.rsp, kStack + up);
  }
  out = {};
  for (std::uint64_t rsp : std::initializer_list<std::uint64_t>{kStack - 8, kStack - 1, kStack + 4104, kStack + 4,
                                                                kStack + 4097, 0ull, ~0ull}) {
    a.rsp = rsp;
    EXPECT_EQ(xp_jump_answer_apply(&b, &h.regs, &a, Hit::kRet, &out), XP_ANSWER_BAD_RSP) << rsp;
  }
  EXPECT_EQ(out.rsp, 0u);
  // The rsp rule holds for the probed address too (rip is checked after rsp).
  a.rip = kStack;
  a.rsp = kStack - 8;
  EXPECT_EQ(xp_jump_answer_apply(&b, &h.regs, &a, Hit::kRet, &out), XP_ANSWER_BAD_RSP);
}

TEST_F(Jump, AHitAtTheTopOfTheAddressSpaceDoesNotWrap) {
  Hit h;
  h.regs.rsp = ~0ull - 7;
  xenprobes_regs a = h.regs, out{};
  a.rsp = 8;  // wrapped: far below in unsigned terms
  EXPECT_EQ(xp_jump_answer_apply(&b, &h.regs, &a, Hit::kRet, &out), XP_ANSWER_BAD_RSP);
}

// ---- the module's own restore of a jump's region ----

struct Region {
  static constexpr std::uint64_t kStart = kText + 0x500;
  static constexpr std::uint64_t kDetour = kOea + 0x800;
  xenprobes_trap e = entry(kStart, XENPROBES_TRAP_REDIRECT, kDetour,
                           {0x55, 0x48, 0x89, 0xe5, 0x41, 0x57});  // push rbp; mov rsp,rbp; push r15
};

TEST_F(Jump, RegionBytesOursOnlyForTheInt3OrTheJumpToThisDetour) {
  Region r;
  auto j = jmp(Region::kStart, Region::kDetour);
  j.push_back(0x57);  // the rest of the region kept
  EXPECT_TRUE(xp_region_bytes_ours(&r.e, j.data(), 6));
  std::vector<std::uint8_t> int3_orig{0xcc, 0x48, 0x89, 0xe5, 0x41, 0x57};
  EXPECT_TRUE(xp_region_bytes_ours(&r.e, int3_orig.data(), 6));
  std::vector<std::uint8_t> int3_rel{0xcc, j[1], j[2], j[3], j[4], 0x57};  // rel32 written first
  EXPECT_TRUE(xp_region_bytes_ours(&r.e, int3_rel.data(), 6));
  std::vector<std::uint8_t> orig{0x55, 0x48, 0x89, 0xe5, 0x41, 0x57};
  EXPECT_FALSE(xp_region_bytes_ours(&r.e, orig.data(), 6));  // restored already
  auto elsewhere = jmp(Region::kStart, Region::kDetour + 0x40);
  elsewhere.push_back(0x57);
  EXPECT_FALSE(xp_region_bytes_ours(&r.e, elsewhere.data(), 6));  // someone else's jump
  std::vector<std::uint8_t> short_jmp{0xeb, 0x10, 0x89, 0xe5, 0x41, 0x57};
  EXPECT_FALSE(xp_region_bytes_ours(&r.e, short_jmp.data(), 6));
  EXPECT_FALSE(xp_region_bytes_ours(&r.e, j.data(), 5));  // fewer bytes read than the region
}

TEST_F(Jump, RegionJumpBackwardsAcrossTheAddressSpace) {
  // A detour below the region (module text above the OEA): a negative rel32.
  auto e = entry(kModules + 0x400000, XENPROBES_TRAP_REDIRECT, kOea + 0x10, {0x0f, 0x1f, 0x44, 0x00, 0x00});
  auto j = jmp(e.addr, e.fallback);
  EXPECT_GE(j[4], 0x80u);
  EXPECT_TRUE(xp_region_bytes_ours(&e, j.data(), 5));
  EXPECT_TRUE(xp_region_restore_ok(&b, &e, j.data(), 5));
}

TEST_F(Jump, RegionRestoreWholeOrNothing) {
  Region r;
  auto j = jmp(Region::kStart, Region::kDetour);
  j.push_back(0x57);
  EXPECT_TRUE(xp_region_restore_ok(&b, &r.e, j.data(), 6));
  std::vector<std::uint8_t> other{0x90, 0x90, 0x90, 0x90, 0x90, 0x90};
  EXPECT_FALSE(xp_region_restore_ok(&b, &r.e, other.data(), 6));

  // Only REDIRECT entries, only 5..15 bytes.
  for (std::uint32_t f :
       {XENPROBES_TRAP_FALLBACK, XENPROBES_TRAP_JUMP, XENPROBES_TRAP_REDIRECT | XENPROBES_TRAP_FALLBACK}) {
    auto e = r.e;
    e.flags = f;
    EXPECT_FALSE(xp_region_restore_ok(&b, &e, j.data(), 6)) << f;
  }
  for (std::uint8_t len : {0, 1, 4, 16, 255}) {
    auto e = r.e;
    e.len = len;
    std::vector<std::uint8_t> cur(j);
    cur.resize(255, 0x90);
    EXPECT_FALSE(xp_region_restore_ok(&b, &e, cur.data(), 255)) << int(len);
  }
  {
    auto e = r.e;
    e.len = 15;
    std::vector<std::uint8_t> cur(j);
    cur.resize(15, 0x90);
    EXPECT_TRUE(xp_region_restore_ok(&b, &e, cur.data(), 15));
  }
  // An original first byte that is an int3 would put an int3 back.
  {
    auto e = r.e;
    e.insn[0] = 0xcc;
    EXPECT_FALSE(xp_region_restore_ok(&b, &e, j.data(), 6));
  }
}

TEST_F(Jump, RegionRestoreOnlyInTextOutsideTheOeaAndExecutable) {
  Region r;
  auto at = [&](std::uint64_t addr) {
    auto e = r.e;
    e.addr = addr;
    return e;
  };
  auto bytes_for = [&](const xenprobes_trap& e) {
    auto j = jmp(e.addr, e.fallback);
    j.push_back(0x57);
    return j;
  };
  for (std::uint64_t a : std::initializer_list<std::uint64_t>{kText + 0x10, kModules + 0x10}) {
    auto e = at(a);
    EXPECT_TRUE(xp_region_restore_ok(&b, &e, bytes_for(e).data(), 6)) << std::hex << a;
  }
  for (std::uint64_t a :
       std::initializer_list<std::uint64_t>{kOea + 0x10, kStack, 0x1000ull, kTextEnd - 3, kOea - 3, ~0ull - 2}) {
    auto e = at(a);
    EXPECT_FALSE(xp_region_restore_ok(&b, &e, bytes_for(e).data(), 6)) << std::hex << a;
  }
  // Across a page boundary: both pages must be executable.
  auto cross = at(kText + 0x1ffd);
  auto cb = bytes_for(cross);
  EXPECT_TRUE(xp_region_restore_ok(&b, &cross, cb.data(), 6));
  nx_pages.insert(kText + 0x2000);
  EXPECT_FALSE(xp_region_restore_ok(&b, &cross, cb.data(), 6));
  nx_pages.clear();
  nx_pages.insert(kText + 0x1000);
  EXPECT_FALSE(xp_region_restore_ok(&b, &cross, cb.data(), 6));
}

TEST_F(Jump, TheSingleByteRestoreLeavesJumpsAlone) {
  Region r;
  EXPECT_FALSE(xp_restore_ok(&b, &r.e, 0xcc));  // a region is restored whole, never insn[0]
  auto key = entry(kText + 0x10, XENPROBES_TRAP_JUMP, kText + 0x10, {0x55});
  EXPECT_FALSE(xp_restore_ok(&b, &key, 0xcc));
  auto trap = entry(kText + 0x10, XENPROBES_TRAP_FALLBACK, kOea, {0x55});
  EXPECT_TRUE(xp_restore_ok(&b, &trap, 0xcc));
}

// ---- the header ----

TEST_F(Jump, HeaderInitZeroesNested) {
  xp_layout l{};
  ASSERT_EQ(xp_layout_compute(1, 8, 0, &l), 0);
  xenprobes_ctl_header h;
  std::memset(&h, 0xa5, sizeof h);
  xp_header_init(&h, 1, &l, 8, 0, 500);
  EXPECT_EQ(h.nested, 0u);
  EXPECT_EQ(h.async_bad, 0u);
  EXPECT_EQ(h.notify_skipped, 0u);
  EXPECT_EQ(h.wait_ns, 0u);
  EXPECT_EQ(h.wait_max_ns, 0u);
  EXPECT_EQ(h.ret_refused, 0u);
  EXPECT_EQ(h.dom0_hold, 0u);
  EXPECT_EQ(offsetof(xenprobes_ctl_header, nested), offsetof(xenprobes_ctl_header, foreign) + 8);
  EXPECT_EQ(offsetof(xenprobes_ctl_header, async_bad), offsetof(xenprobes_ctl_header, nested) + 8);
  // Each counter took the first reserved word of its day: no offset before it moved.
  EXPECT_EQ(offsetof(xenprobes_ctl_header, notify_skipped), offsetof(xenprobes_ctl_header, async_bad) + 8);
  EXPECT_EQ(offsetof(xenprobes_ctl_header, wait_ns), offsetof(xenprobes_ctl_header, notify_skipped) + 8);
  EXPECT_EQ(offsetof(xenprobes_ctl_header, wait_max_ns), offsetof(xenprobes_ctl_header, wait_ns) + 8);
  EXPECT_EQ(offsetof(xenprobes_ctl_header, over_budget), offsetof(xenprobes_ctl_header, wait_max_ns) + 8);
  EXPECT_EQ(offsetof(xenprobes_ctl_header, closing), offsetof(xenprobes_ctl_header, over_budget) + 8);
  EXPECT_EQ(offsetof(xenprobes_ctl_header, dom0_hold), offsetof(xenprobes_ctl_header, closing) + 8);
  EXPECT_EQ(offsetof(xenprobes_ctl_header, ret_refused), offsetof(xenprobes_ctl_header, dom0_hold) + 4);
  // The mailbox's fields of "Return slots written by the module" took its first reserved words.
  EXPECT_EQ(offsetof(xenprobes_mailbox, stack_top), offsetof(xenprobes_mailbox, regs) + sizeof(xenprobes_regs));
  EXPECT_EQ(offsetof(xenprobes_mailbox, ret_value), offsetof(xenprobes_mailbox, stack_top) + 24);
  EXPECT_EQ(offsetof(xenprobes_mailbox, reserved), offsetof(xenprobes_mailbox, ret_value) + 8);
  EXPECT_EQ(sizeof(xenprobes_mailbox), 224u);
  EXPECT_EQ(sizeof(xenprobes_ctl_header), 136u);
  EXPECT_EQ(h.over_budget, 0u);
  EXPECT_EQ(h.closing, 0u);
}

}  // namespace
