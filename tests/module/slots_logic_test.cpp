// guest-module/xp_slots.h: whether a task may still run code in the module's slots (the OEA
// pool and the fixup slots) when it detaches: the live part of a switched-out task's stack,
// the search for a slot address in it, and the bounded wait, as xp_slots.c calls them.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "xp_slots.h"

namespace {

constexpr xenprobes_u64 kStack = 0xffffc90000a40000;  // a vmap'd task stack
constexpr xenprobes_u64 kStackSize = 16384;
constexpr xenprobes_u64 kPool = 0xffffffffc0400000;           // the module's OEA pool
constexpr xenprobes_u64 kSlotsEnd = kPool + 0x200000 + 8192;  // ... and its fixup slots after it

// A switched-out task's stack as memory: word i at kStack + 8 i.
struct Stack {
  std::vector<xenprobes_u64> w = std::vector<xenprobes_u64>(kStackSize / 8, 0);
  void put(xenprobes_u64 addr, xenprobes_u64 v) { w.at((addr - kStack) / 8) = v; }
  // What xp_slots.c does with it: the live part, searched for a slot address.
  xp_stack check(xenprobes_u64 sp, xenprobes_u64* word = nullptr) const {
    xenprobes_u64 first = 0, n = 0;
    if (!xp_stack_live(kStack, kStackSize, sp, &first, &n)) return XP_STACK_UNKNOWN;
    const xenprobes_u64* live = w.data() + (first - kStack) / 8;
    const xenprobes_u64 i = xp_slots_find(live, n, kPool, kSlotsEnd);
    if (i == n) return XP_STACK_CLEAR;
    if (word) *word = live[i];
    return XP_STACK_IN_SLOT;
  }
};

TEST(Slots, TheLivePartRunsFromTheSavedStackPointerToTheTop) {
  xenprobes_u64 first = 0, n = 0;
  ASSERT_TRUE(xp_stack_live(kStack, kStackSize, kStack + 0x3f00, &first, &n));
  EXPECT_EQ(first, kStack + 0x3f00);
  EXPECT_EQ(n, 0x100u / 8);
  ASSERT_TRUE(xp_stack_live(kStack, kStackSize, kStack, &first, &n));
  EXPECT_EQ(n, kStackSize / 8);
  ASSERT_TRUE(xp_stack_live(kStack, kStackSize, kStack + kStackSize, &first, &n));  // nothing live
  EXPECT_EQ(n, 0u);
}

TEST(Slots, AStackPointerOutsideTheStackOrMisalignedSaysNothing) {
  xenprobes_u64 first = 0, n = 0;
  EXPECT_FALSE(xp_stack_live(kStack, kStackSize, kStack - 8, &first, &n));
  EXPECT_FALSE(xp_stack_live(kStack, kStackSize, kStack + kStackSize + 8, &first, &n));
  EXPECT_FALSE(xp_stack_live(kStack, kStackSize, kStack + 0x1004, &first, &n));
  EXPECT_FALSE(xp_stack_live(kStack, kStackSize, 0, &first, &n));  // an irq stack, a user sp: not this stack
  EXPECT_FALSE(xp_stack_live(kStack, 0, kStack, &first, &n));
  EXPECT_FALSE(xp_stack_live(~xenprobes_u64{0} - 7, 64, ~xenprobes_u64{0} - 7, &first, &n));  // wraps
}

TEST(Slots, TheSearchFindsTheFirstWordInTheHalfOpenRange) {
  const std::vector<xenprobes_u64> w = {kPool - 1, kSlotsEnd, 0, kSlotsEnd - 1, kPool};
  EXPECT_EQ(xp_slots_find(w.data(), w.size(), kPool, kSlotsEnd), 3u);
  EXPECT_EQ(xp_slots_find(w.data(), 3, kPool, kSlotsEnd), 3u);  // none among the first three
  EXPECT_EQ(xp_slots_find(w.data(), 0, kPool, kSlotsEnd), 0u);
  const std::vector<xenprobes_u64> start = {kPool};
  EXPECT_EQ(xp_slots_find(start.data(), 1, kPool, kSlotsEnd), 0u);
}

TEST(Slots, ATaskSleepingInAFaultTakenInAFixupSlotHoldsItsAddress) {
  // The page fault's pt_regs (ip = the copy in fixup slot 5) above the fault handler's frames,
  // the task switched out deeper down.
  Stack s;
  const xenprobes_u64 fault_regs = kStack + kStackSize - 0x400;
  const xenprobes_u64 slot_ip = kPool + 0x200000 + 5 * 32;
  s.put(fault_regs + 16 * 8, slot_ip);           // pt_regs->ip
  s.put(fault_regs + 17 * 8, 0x10);              // cs
  s.put(fault_regs - 0x40, 0xffffffff81a3c2d0);  // return addresses into the fault path
  xenprobes_u64 word = 0;
  EXPECT_EQ(s.check(kStack + kStackSize - 0x900, &word), XP_STACK_IN_SLOT);
  EXPECT_EQ(word, slot_ip);
  // Back from the fault and out of the slot: the frame is popped, the task sleeps elsewhere
  // with a shallower stack; the old frame's words lie below its stack pointer, dead.
  EXPECT_EQ(s.check(fault_regs + 18 * 8), XP_STACK_CLEAR);
}

TEST(Slots, ATaskPreemptedInAnOeaCopyOrInADetoursCallHoldsItsAddress) {
  Stack s;
  s.put(kStack + kStackSize - 0x200, kPool + 0x1234);  // an interrupt's saved ip in an OEA copy
  EXPECT_EQ(s.check(kStack + kStackSize - 0x600), XP_STACK_IN_SLOT);
  Stack d;
  d.put(kStack + kStackSize - 0x300, kPool + 0x8005);  // the detour's call: its return address
  EXPECT_EQ(d.check(kStack + kStackSize - 0x300), XP_STACK_IN_SLOT);
}

TEST(Slots, KernelAndModuleAddressesOutsideTheSlotsAreNoHold) {
  Stack s;
  s.put(kStack + kStackSize - 0x100, kPool - 0x40);  // the module's own code, before the pool
  s.put(kStack + kStackSize - 0x108, kSlotsEnd);     // just after the fixup slots
  s.put(kStack + kStackSize - 0x110, 0xffffffff81000000);
  EXPECT_EQ(s.check(kStack + kStackSize - 0x200), XP_STACK_CLEAR);
}

TEST(Slots, OnlyACleanUnwindClearsAStaleWordAndNothingClearsAnUnknownStack) {
  // A word in the slots left by an earlier syscall in the random-offset gap: the unwinder walks
  // every frame to the end and meets no slot.
  EXPECT_EQ(xp_stack_confirm(XP_STACK_IN_SLOT, XP_STACK_CLEAR), XP_STACK_CLEAR);
  EXPECT_EQ(xp_stack_confirm(XP_STACK_IN_SLOT, XP_STACK_IN_SLOT), XP_STACK_IN_SLOT);
  EXPECT_EQ(xp_stack_confirm(XP_STACK_IN_SLOT, XP_STACK_UNKNOWN), XP_STACK_IN_SLOT);  // an unwinder error
  EXPECT_EQ(xp_stack_confirm(XP_STACK_UNKNOWN, XP_STACK_CLEAR), XP_STACK_UNKNOWN);
  EXPECT_EQ(xp_stack_confirm(XP_STACK_CLEAR, XP_STACK_IN_SLOT), XP_STACK_CLEAR);  // not asked: nothing live
}

TEST(Slots, TheWaitEndsClearAtTheFirstLookWithNoHolderElseHeldAtTheDeadline) {
  EXPECT_EQ(xp_slots_look(0, false), XP_SLOTS_CLEAR);
  EXPECT_EQ(xp_slots_look(0, true), XP_SLOTS_CLEAR);
  EXPECT_EQ(xp_slots_look(1, false), XP_SLOTS_WAIT);
  EXPECT_EQ(xp_slots_look(3, false), XP_SLOTS_WAIT);
  EXPECT_EQ(xp_slots_look(1, true), XP_SLOTS_HELD);
}

TEST(Slots, EveryOutcomeHasItsOwnName) {
  std::set<std::string> names;
  for (xp_slots r : {XP_SLOTS_WAIT, XP_SLOTS_CLEAR, XP_SLOTS_HELD}) names.insert(xp_slots_name(r));
  EXPECT_EQ(names.size(), 3u);
  EXPECT_NE(std::string(xp_slots_name(XP_SLOTS_HELD)).find("stays loaded"), std::string::npos);
}

}  // namespace
