// The guest module's return-slot write (guest-module/xp_fallback.c, xp_ret_write(); protocol.h
// "Return slots written by the module"): the write Dom0's answer asks for happens only at the
// hit's own stack pointer, only with the trampoline of the trap table, only over the return
// address Dom0 recorded, and is put back when the trampoline's entry is gone right after it.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "xp_ret_write.h"

namespace {

constexpr std::uint64_t kStack = 0xffffc90000013f00ull;
constexpr std::uint64_t kRet = 0xffffffff81234567ull;        // the caller's return address
constexpr std::uint64_t kTramp = 0xffffffffc0200040ull;      // the return trampoline (an OEA slot)
constexpr std::uint64_t kOtherTrap = 0xffffffff81000100ull;  // a probe point's trap

// A stack of 8-byte words, every access counted; `after_write` runs once after the first write
// (what Dom0 does while the vCPU is paused right after its store).
struct Stack {
  std::map<std::uint64_t, std::uint64_t> words;
  unsigned reads = 0, writes = 0;
  bool fault = false;
  std::function<void()> after_write;

  static bool read(void* ctx, std::uint64_t a, std::uint64_t* v) {
    auto* s = static_cast<Stack*>(ctx);
    ++s->reads;
    auto it = s->words.find(a);
    if (s->fault || it == s->words.end()) return false;
    *v = it->second;
    return true;
  }
  static bool write(void* ctx, std::uint64_t a, std::uint64_t v) {
    auto* s = static_cast<Stack*>(ctx);
    ++s->writes;
    if (s->fault || !s->words.count(a)) return false;
    s->words[a] = v;
    if (auto f = std::exchange(s->after_write, nullptr)) f();
    return true;
  }
  xp_mem_ops mem() { return xp_mem_ops{&Stack::read, &Stack::write, this}; }
};

xenprobes_trap trap(std::uint64_t addr, std::uint32_t flags) {
  xenprobes_trap t{};
  t.addr = addr;
  t.flags = flags;
  t.fallback = flags == XENPROBES_TRAP_FALLBACK ? addr + 0x100 : 0;
  return t;
}

struct RetWrite : ::testing::Test {
  Stack st;
  // Sorted by addr, as Dom0 keeps it.
  std::vector<xenprobes_trap> table{trap(kOtherTrap, XENPROBES_TRAP_FALLBACK), trap(kTramp, XENPROBES_TRAP_RETURN)};
  std::uint32_t nr = 2;
  xp_ret_request q{kStack, kRet, kTramp};

  void SetUp() override { st.words[kStack] = kRet; }
  xp_ret_result run(std::uint64_t hit_rsp = kStack) {
    xp_mem_ops m = st.mem();
    return xp_ret_write(&q, hit_rsp, table.data(), &nr, static_cast<std::uint32_t>(table.size()), &m);
  }
};

TEST_F(RetWrite, TheTrampolineGoesOverTheExpectedReturnAddress) {
  EXPECT_EQ(run(), XP_RET_WRITTEN);
  EXPECT_EQ(st.words[kStack], kTramp);
  EXPECT_EQ(st.writes, 1u);
}

TEST_F(RetWrite, NoSlotAsksForNothingAndTouchesNothing) {
  q.slot = 0;
  EXPECT_EQ(run(), XP_RET_NONE);
  EXPECT_EQ(st.reads + st.writes, 0u);
}

TEST_F(RetWrite, ASlotThatHoldsAnotherValueIsRefusedAndNeverWritten) {
  st.words[kStack] = kRet + 5;  // not the return address Dom0 recorded
  EXPECT_EQ(run(), XP_RET_MISMATCH);
  EXPECT_EQ(st.words[kStack], kRet + 5);
  EXPECT_EQ(st.writes, 0u);
}

TEST_F(RetWrite, OnlyTheHitsOwnStackPointer) {
  st.words[kStack + 8] = kRet;
  q.slot = kStack + 8;  // another word of the stack, holding what Dom0 expects
  EXPECT_EQ(run(), XP_RET_BAD_SLOT);
  st.words[kStack + 1] = kRet;
  q.slot = kStack + 1;  // misaligned, and it is the hit's rsp
  EXPECT_EQ(run(kStack + 1), XP_RET_BAD_SLOT);
  EXPECT_EQ(st.reads + st.writes, 0u);
  EXPECT_EQ(st.words[kStack + 8], kRet);
}

TEST_F(RetWrite, OnlyTheReturnTrampolineOfTheTrapTable) {
  q.value = kOtherTrap;  // a trap, but not a RETURN entry
  EXPECT_EQ(run(), XP_RET_BAD_VALUE);
  q.value = 0xffffffffc0200080ull;  // in no entry
  EXPECT_EQ(run(), XP_RET_BAD_VALUE);
  q.value = kTramp;
  nr = 1;  // the trampoline's entry is not live
  EXPECT_EQ(run(), XP_RET_BAD_VALUE);
  nr = 2;
  q.expect = kTramp;  // "replace the trampoline by itself"
  st.words[kStack] = kTramp;
  EXPECT_EQ(run(), XP_RET_BAD_VALUE);
  EXPECT_EQ(st.writes, 0u);
}

TEST_F(RetWrite, AnUnsortedTableStillFindsTheTrampoline) {
  std::swap(table[0], table[1]);  // the binary search misses; the scan finds it, as the hook's
  EXPECT_EQ(run(), XP_RET_WRITTEN);
  EXPECT_EQ(st.words[kStack], kTramp);
}

TEST_F(RetWrite, AFaultingSlotIsNotWritten) {
  st.fault = true;
  EXPECT_EQ(run(), XP_RET_FAULT);
  EXPECT_EQ(st.writes, 0u);
}

TEST_F(RetWrite, ATrampolineRemovedRightAfterTheWriteGetsTheSlotPutBack) {
  // Dom0 paused the guest after the check: it put its slots back (here nothing to put back:
  // the slot did not hold the trampoline yet) and removed the trampoline's entry.
  st.after_write = [&] { nr = 1, table[1] = trap(0, 0); };
  EXPECT_EQ(run(), XP_RET_UNDONE);
  EXPECT_EQ(st.words[kStack], kRet) << "the return address is back";
  EXPECT_EQ(st.writes, 2u);
}

TEST_F(RetWrite, ASlotDom0AlreadyPutBackIsLeftAsItIs) {
  // Dom0 paused the guest after the write: it saw the trampoline, put kRet back itself and
  // removed the entry; the module's look after the write finds the entry gone and the slot
  // no longer holding the trampoline.
  st.after_write = [&] { st.words[kStack] = kRet, nr = 1, table[1] = trap(0, 0); };
  EXPECT_EQ(run(), XP_RET_UNDONE);
  EXPECT_EQ(st.words[kStack], kRet);
  EXPECT_EQ(st.writes, 1u);
}

}  // namespace
