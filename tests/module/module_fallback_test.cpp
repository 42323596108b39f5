// The guest module's fallback when Dom0 does not answer (guest-module/xp_fallback.c): the return
// table, and the choice between resuming at a slot, emulating a branch and finishing a return.
#include "module/module_logic_fixture.hpp"

namespace {

using namespace module_logic;

// ---- the return table ----

TEST(ModuleReturnTable, FindsTheSlotAndNeverAFreeEntry) {
  std::vector<xenprobes_ret> t(4);
  t[1] = {kStack - 0x100, kText + 0x500};
  t[3] = {kStack - 0x200, kText + 0x600};
  EXPECT_EQ(xp_ret_find(t.data(), 4, kStack - 0x100), 1);
  EXPECT_EQ(xp_ret_find(t.data(), 4, kStack - 0x200), 3);
  EXPECT_EQ(xp_ret_find(t.data(), 3, kStack - 0x200), -1);  // beyond the capacity
  EXPECT_EQ(xp_ret_find(t.data(), 4, kStack - 0x300), -1);
  EXPECT_EQ(xp_ret_find(t.data(), 4, 0), -1);  // slot 0 means free
  EXPECT_EQ(xp_ret_find(t.data(), 0, kStack - 0x100), -1);
}

TEST(ModuleReturnTable, TheSlotIsBelowTheStackPointerAtTheTrampolinesTrap) {
  // The probed function's `ret` popped the slot: rsp at the trap = slot + 8.
  EXPECT_EQ(xp_return_slot(kStack + 8), kStack);
}

// ---- the fallback ----

class ModuleFallback : public ::testing::Test {
 protected:
  Guest g;
  xp_bounds b = g.bounds();
  xp_mem_ops m = g.mem();
  std::vector<xenprobes_ret> rets = std::vector<xenprobes_ret>(8);
  static constexpr std::uint64_t kAt = kText + 0x2000;
  static constexpr std::uint64_t kTrampoline = kOea + 0xff0;

  xp_fallback take(const xenprobes_trap& e, xenprobes_regs& r) {
    return xp_take_fallback(&e, &r, rets.data(), static_cast<std::uint32_t>(rets.size()), &b, &m);
  }
};

TEST_F(ModuleFallback, ResumesAtTheSlot) {
  auto r = regs_at(kAt);
  ASSERT_EQ(take(trap(kAt, XENPROBES_TRAP_FALLBACK, {0x55}, kOea + 0x40), r), XP_FB_OK);
  EXPECT_EQ(r.rip, kOea + 0x40);
  EXPECT_EQ(r.rsp, kStack);
}

TEST_F(ModuleFallback, RefusesASlotAddressOutsideCode) {
  auto r = regs_at(kAt);
  const auto before = r;
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_FALLBACK, {0x55}, kStack), r), XP_FB_BAD_TARGET);
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_FALLBACK, {0x55}, 0), r), XP_FB_BAD_TARGET);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
}

TEST_F(ModuleFallback, EmulatesTheOriginalBranch) {
  auto r = regs_at(kAt);
  ASSERT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0xe8, 0x10, 0x00, 0x00, 0x00}), r), XP_FB_OK);
  EXPECT_EQ(r.rip, kAt + 5 + 0x10);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 5);
  // A retpoline site patched to `call *%r11` (what Dom0 plans as EmulateBranch).
  r = regs_at(kAt);
  r.r11 = kText + 0x9000;
  ASSERT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0x41, 0xff, 0xd3}), r), XP_FB_OK);
  EXPECT_EQ(r.rip, kText + 0x9000);
  EXPECT_EQ(r.rsp, kStack - 8);
  EXPECT_EQ(g.stack.at(kStack - 8), kAt + 3);
  r = regs_at(kAt);
  r.rax = kText + 0x9100;
  ASSERT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0xff, 0xe0}), r), XP_FB_OK);  // jmp *%rax
  EXPECT_EQ(r.rip, kText + 0x9100);
  EXPECT_EQ(r.rsp, kStack);
  // Through memory: not emulated (Dom0 refuses to arm such an EMULATE trap on the guest channel).
  r = regs_at(kAt);
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0xff, 0x24, 0xfd, 0, 0x10, 0, 0x81}), r), XP_FB_EMULATE_FAILED);
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0x55}), r), XP_FB_EMULATE_FAILED);
  g.stack[kStack] = kStack;  // a ret to the stack
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_EMULATE, {0xc3}), r), XP_FB_BAD_TARGET);
  EXPECT_EQ(r.rip, kAt);
}

TEST_F(ModuleFallback, FinishesAReturnFromTheReturnTable) {
  rets[2] = {kStack + 0x40, kText + 0x7777};
  rets[5] = {kStack + 0x80, kText + 0x8888};
  auto r = regs_at(kTrampoline);
  r.rsp = kStack + 0x48;  // the ret popped the slot at kStack + 0x40
  ASSERT_EQ(take(trap(kTrampoline, XENPROBES_TRAP_RETURN, {0x90}), r), XP_FB_OK);
  EXPECT_EQ(r.rip, kText + 0x7777);
  EXPECT_EQ(r.rsp, kStack + 0x48);  // nothing more to pop
  EXPECT_EQ(rets[2].slot, 0u);      // the instance is finished
  EXPECT_EQ(rets[5].slot, kStack + 0x80);
  // The same slot again: no entry any more.
  r = regs_at(kTrampoline);
  r.rsp = kStack + 0x48;
  EXPECT_EQ(take(trap(kTrampoline, XENPROBES_TRAP_RETURN, {0x90}), r), XP_FB_NO_RETURN);
  EXPECT_EQ(r.rip, kTrampoline);
}

TEST_F(ModuleFallback, AReturnTableEntryWithABadAddressStays) {
  rets[0] = {kStack + 0x40, kStack};
  auto r = regs_at(kTrampoline);
  r.rsp = kStack + 0x48;
  EXPECT_EQ(take(trap(kTrampoline, XENPROBES_TRAP_RETURN, {0x90}), r), XP_FB_BAD_TARGET);
  EXPECT_EQ(rets[0].slot, kStack + 0x40);
  EXPECT_EQ(r.rip, kTrampoline);
  // A module loaded with ret_capacity=0 has no return table at all.
  const auto e = trap(kTrampoline, XENPROBES_TRAP_RETURN, {0x90});
  EXPECT_EQ(xp_take_fallback(&e, &r, nullptr, 0, &b, &m), XP_FB_NO_RETURN);
}

TEST_F(ModuleFallback, HostileEntriesAreRefused) {
  auto r = regs_at(kAt);
  const auto before = r;
  EXPECT_EQ(take(trap(kAt, 0, {0x55}, kOea), r), XP_FB_BAD_ENTRY);
  EXPECT_EQ(take(trap(kAt, XENPROBES_TRAP_FALLBACK | XENPROBES_TRAP_EMULATE, {0xeb, 0}, kOea), r), XP_FB_BAD_ENTRY);
  EXPECT_EQ(take(trap(kAt, 8, {0x55}, kOea), r), XP_FB_BAD_ENTRY);
  EXPECT_EQ(take(trap(kAt, 0xffffffffu, {0x55}, kOea), r), XP_FB_BAD_ENTRY);
  auto e = trap(kAt, XENPROBES_TRAP_FALLBACK, {0x55}, kOea);
  e.len = 16;
  EXPECT_EQ(take(e, r), XP_FB_BAD_ENTRY);
  e.len = 255;
  EXPECT_EQ(take(e, r), XP_FB_BAD_ENTRY);
  // EMULATE without bytes, or with len larger than the instruction.
  auto j = trap(kAt, XENPROBES_TRAP_EMULATE, {0xeb, 0x10});
  j.len = 0;
  EXPECT_EQ(take(j, r), XP_FB_BAD_ENTRY);
  j.len = 15;
  EXPECT_EQ(take(j, r), XP_FB_EMULATE_FAILED);
  EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0);
}

TEST_F(ModuleFallback, TrapsInsideTheOeaMayHaveNoOriginalBytes) {
  // protocol.h: len 0 only for a trap inside an OEA area with FALLBACK or RETURN.
  auto post = trap(kOea + 0x20, XENPROBES_TRAP_FALLBACK, {}, kText + 0x2005);
  ASSERT_EQ(post.len, 0);
  auto r = regs_at(kOea + 0x20);
  ASSERT_EQ(take(post, r), XP_FB_OK);
  EXPECT_EQ(r.rip, kText + 0x2005);
  rets[0] = {kStack + 0x40, kText + 0x7777};
  auto tramp = trap(kTrampoline, XENPROBES_TRAP_RETURN, {});
  r = regs_at(kTrampoline);
  r.rsp = kStack + 0x48;
  ASSERT_EQ(take(tramp, r), XP_FB_OK);
  EXPECT_EQ(r.rip, kText + 0x7777);
}

}  // namespace
