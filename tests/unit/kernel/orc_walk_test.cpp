// The ORC stack walk (kernel/orc.hpp) over a hand-built v3 table and fake stacks: every frame
// and every end of a walk asserted exactly, hostile stacks included.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "kernel/orc.hpp"

namespace xenprobes::kernel::orc {
namespace {

constexpr std::uint64_t T = 0xffffffff81000000ull, kTextEnd = 0xffffffff81100000ull;
constexpr std::uint64_t S = 0xffffc90000010000ull;  // a task stack
constexpr std::uint64_t S2 = S + 0x1000;            // the interrupted stack above it

// The functions of the fake kernel.
constexpr std::uint64_t LEAF = T + 0x100, MID = T + 0x200, OUT = T + 0x300, ENTRY = T + 0x400, IRQ = T + 0x500,
                        BOTTOM = T + 0x600, TERM = T + 0x700, DOWN = T + 0x800, R10F = T + 0x900, SW = T + 0xa00,
                        PART = T + 0xb00;

constexpr std::uint16_t f3(unsigned sp, unsigned bp, unsigned type, unsigned signal = 0) {
  return static_cast<std::uint16_t>(sp | bp << 4 | type << 8 | signal << 11);
}
constexpr unsigned kUndef = 0, kEnd = 1, kCall = 2, kRegs = 3, kPartial = 4;

struct Row {
  std::uint64_t ip;
  std::int16_t sp_off, bp_off;
  std::uint16_t flags;
};

const std::vector<Row> kRows = {
    {LEAF, 8, 0, f3(kRegSp, kRegUndefined, kCall)},                 // leaf: return address at sp
    {MID, 8, 0, f3(kRegSp, kRegUndefined, kCall)},                  // push rbp
    {MID + 1, 16, -16, f3(kRegSp, kRegPrevSp, kCall)},              // mov rsp, rbp
    {MID + 4, 16, -16, f3(kRegBp, kRegPrevSp, kCall)},              // body: a frame-pointer frame
    {MID + 0x20, 8, 0, f3(kRegSp, kRegUndefined, kCall)},           // after pop rbp
    {OUT, 8, 0, f3(kRegSp, kRegUndefined, kCall)},                  // sub $32, rsp
    {OUT + 5, 40, 0, f3(kRegSp, kRegUndefined, kCall)},             // body
    {ENTRY, 0, 0, f3(kRegSp, kRegUndefined, kRegs, 1)},             // a pt_regs at sp
    {IRQ, 8, 0, f3(kRegSp, kRegUndefined, kCall)},                  // the interrupted function
    {BOTTOM, 0, 0, f3(kRegUndefined, kRegUndefined, kEnd)},         // a kernel thread's first frame
    {TERM, 0, 0, f3(kRegUndefined, kRegUndefined, kUndef)},         // entry code: undefined
    {DOWN, -64, 0, f3(kRegSp, kRegUndefined, kCall)},               // hostile: sp goes down
    {R10F, 0, 0, f3(kRegR10, kRegUndefined, kCall)},                // sp from r10 (a pt_regs register)
    {SW, 8, 0, f3(kRegSpIndirect, kRegUndefined, kCall)},           // a stack switch: sp = [sp] + 8
    {PART, 16, 0, f3(kRegSp, kRegUndefined, kPartial, 1)},          // an iret frame at sp + 16
    {PART + 0x10, 0, 0, f3(kRegUndefined, kRegUndefined, kUndef)},  // the table's end
};

Table table(const std::vector<Row>& rows, std::vector<Range> text) {
  const std::uint64_t base = T + 0x200000;
  std::vector<std::byte> ips, orcs;
  auto put = [](std::vector<std::byte>& v, const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    v.insert(v.end(), b, b + n);
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto rel = static_cast<std::int32_t>(static_cast<std::int64_t>(rows[i].ip - (base + 4 * i)));
    put(ips, &rel, 4);
    put(orcs, &rows[i].sp_off, 2);
    put(orcs, &rows[i].bp_off, 2);
    put(orcs, &rows[i].flags, 2);
  }
  auto t = Table::parse(base, ips, orcs, std::move(text), Format::V3);
  if (!t) throw std::runtime_error(t.error().what);
  return std::move(*t);
}

// Stack memory: 8-byte words; anything else is unreadable.
struct Stack {
  std::map<std::uint64_t, std::uint64_t> words;
  std::size_t reads = 0;
  ReadFn reader() {
    return [this](Gva a, std::span<std::byte> out) -> Result<void> {
      ++reads;
      if (out.size() != 8) return fail(Errc::InvalidArgument, "not a word");
      auto it = words.find(a.value);
      if (it == words.end()) return fail(Errc::Fault, "not mapped");
      std::memcpy(out.data(), &it->second, 8);
      return {};
    };
  }
};

class OrcWalk : public ::testing::Test {
 protected:
  OrcWalk() : u_(table(kRows, {{T, kTextEnd}})) {
    // The whole chain: LEAF <- MID (frame pointer) <- OUT (sp-based) <- ENTRY (pt_regs) <- IRQ
    // (on the interrupted stack) <- BOTTOM (end of stack).
    const std::uint64_t B = S + 8;  // MID's rbp: where it pushed the caller's
    st_.words[S] = MID + 0x10;      // LEAF's return address
    st_.words[B] = 0x5a5a;          // the caller's rbp, saved by MID
    st_.words[B + 8] = OUT + 0x10;  // MID's return address
    // OUT: 40 bytes to its caller's sp: S + 24 + 40 = S + 64, return address just below.
    st_.words[S + 56] = ENTRY + 0x10;
    // ENTRY's pt_regs at S + 64.
    st_.words[S + 64 + 32] = 0xb0b0;       // bp
    st_.words[S + 64 + 128] = IRQ + 0x20;  // ip
    st_.words[S + 64 + 136] = 0x10;        // cs: kernel
    st_.words[S + 64 + 152] = S2;          // sp
    st_.words[S2] = BOTTOM + 4;            // IRQ's return address
  }
  Walk walk(std::uint64_t rip, std::uint64_t rsp, std::uint64_t rbp, std::size_t max = kMaxFrames) {
    StartRegs s;
    s.rip = rip, s.rsp = rsp, s.rbp = rbp;
    return u_.walk(s, st_.reader(), max);
  }
  Unwinder u_;
  Stack st_;
};

using Ips = std::vector<std::uint64_t>;

TEST_F(OrcWalk, CallFramesAPtRegsFrameAndTheEndOfTheStack) {
  Walk w = walk(LEAF, S, S + 8);
  EXPECT_EQ(w.ips, (Ips{LEAF, MID + 0x10, OUT + 0x10, ENTRY + 0x10, IRQ + 0x20, BOTTOM + 4}));
  EXPECT_EQ(w.stop, Stop::EndOfStack);
  EXPECT_FALSE(w.fallback);
  EXPECT_STREQ(to_string(w.stop), "end of stack");
}

TEST_F(OrcWalk, TheDepthIsBounded) {
  Walk w = walk(LEAF, S, S + 8, 3);
  EXPECT_EQ(w.ips, (Ips{LEAF, MID + 0x10, OUT + 0x10}));
  EXPECT_EQ(w.stop, Stop::Depth);
  // 0 means 1, and nothing asks for more than kMaxFrames.
  EXPECT_EQ(walk(LEAF, S, S + 8, 0).ips, (Ips{LEAF}));
}

TEST_F(OrcWalk, APtRegsFrameFromUserModeEndsTheStack) {
  st_.words[S + 64 + 136] = 0x33;  // cs: user mode
  Walk w = walk(LEAF, S, S + 8);
  EXPECT_EQ(w.ips, (Ips{LEAF, MID + 0x10, OUT + 0x10, ENTRY + 0x10}));
  EXPECT_EQ(w.stop, Stop::EndOfStack);
  // A vCPU stopped in user mode has no kernel stack to walk.
  StartRegs s;
  s.rip = LEAF, s.rsp = S, s.user_mode = true;
  Walk u = u_.walk(s, st_.reader());
  EXPECT_TRUE(u.ips.empty());
  EXPECT_EQ(u.stop, Stop::EndOfStack);
}

TEST_F(OrcWalk, AnUnreadableWordEndsTheWalk) {
  st_.words.erase(S + 56);  // OUT's return address
  Walk w = walk(LEAF, S, S + 8);
  EXPECT_EQ(w.ips, (Ips{LEAF, MID + 0x10, OUT + 0x10}));
  EXPECT_EQ(w.stop, Stop::ReadFailed);
}

TEST_F(OrcWalk, AReturnAddressOutsideTheTextEndsTheWalk) {
  st_.words[S + 16] = 0x401000;  // MID's return address: user space
  Walk w = walk(LEAF, S, S + 8);
  EXPECT_EQ(w.ips, (Ips{LEAF, MID + 0x10}));
  EXPECT_EQ(w.stop, Stop::NoText);
  // A start outside the text: nothing.
  Walk n = walk(0xffffffffa0000000ull, S, 0);
  EXPECT_TRUE(n.ips.empty());
  EXPECT_EQ(n.stop, Stop::NoText);
}

TEST_F(OrcWalk, AnUndefinedEntryEndsTheWalk) {
  st_.words[S] = TERM + 0x11;
  Walk w = walk(LEAF, S, S + 8);
  EXPECT_EQ(w.ips, (Ips{LEAF, TERM + 0x11}));
  EXPECT_EQ(w.stop, Stop::Undefined);
}

TEST_F(OrcWalk, AFramePointerThatPointsAtItselfIsALoop) {
  const std::uint64_t B = S + 0x100;
  st_.words[B] = B;               // the saved rbp: itself
  st_.words[B + 8] = MID + 0x10;  // returning into the frame-pointer body again and again
  Walk w = walk(MID + 0x10, S, B);
  EXPECT_EQ(w.ips, (Ips{MID + 0x10, MID + 0x10}));
  EXPECT_EQ(w.stop, Stop::Loop);
}

TEST_F(OrcWalk, AStackPointerGoingDownWithinAStackIsALoop) {
  st_.words[S - 72] = MID + 0x10;
  Walk w = walk(DOWN, S, S + 8);
  EXPECT_EQ(w.ips, (Ips{DOWN}));
  EXPECT_EQ(w.stop, Stop::Loop);
}

TEST_F(OrcWalk, StackSwitchesAreBounded) {
  // Each frame switches to a stack 0x100 lower (sp = [sp] + 8), forever: allowed kMaxStackSwitches times.
  std::uint64_t sp = S + 0x8000;
  for (int k = 0; k < 20; ++k) {
    const std::uint64_t next = sp - 0x100;
    st_.words[sp] = next - 8;
    st_.words[next - 8] = SW + 1;
    sp = next;
  }
  Walk w = walk(SW, S + 0x8000, 0);
  EXPECT_EQ(w.ips.size(), 1 + kMaxStackSwitches);
  EXPECT_EQ(w.ips.back(), SW + 1);
  EXPECT_EQ(w.stop, Stop::Loop);
}

TEST_F(OrcWalk, StackPointersOutsideTheKernelsHalfOrMisalignedAreRefused) {
  Walk user = walk(LEAF, 0x7ffc00001000ull, 0);
  EXPECT_EQ(user.ips, (Ips{LEAF}));
  EXPECT_EQ(user.stop, Stop::BadStack);
  Walk odd = walk(LEAF, S + 3, 0);
  EXPECT_EQ(odd.ips, (Ips{LEAF}));
  EXPECT_EQ(odd.stop, Stop::BadStack);
  // A stack pointer at the very top: sp + 8 wraps.
  Walk wrap = walk(LEAF, ~0ull - 7, 0);
  EXPECT_EQ(wrap.ips, (Ips{LEAF}));
  EXPECT_EQ(wrap.stop, Stop::BadStack);
  EXPECT_EQ(st_.reads, 0u);  // none of them was read
}

TEST_F(OrcWalk, CodeWithoutAnEntryIsTakenAsAFramePointerFrame) {
  const std::uint64_t B = S + 0x200;
  st_.words[B] = 0;               // the caller's rbp
  st_.words[B + 8] = BOTTOM + 4;  // the return address above it
  Walk w = walk(T + 0x10, S, B);  // below the table's first entry
  EXPECT_EQ(w.ips, (Ips{T + 0x10, BOTTOM + 4}));
  EXPECT_EQ(w.stop, Stop::EndOfStack);
  EXPECT_TRUE(w.fallback);
}

TEST_F(OrcWalk, PtRegsRegistersOnlyWhereThereArePtRegs) {
  // The first frame has the stopped vCPU's registers: sp from r10 works.
  StartRegs s;
  s.rip = R10F, s.rsp = S, s.r10 = S2 + 8;
  Walk w = u_.walk(s, st_.reader());
  EXPECT_EQ(w.ips, (Ips{R10F, BOTTOM + 4}));
  EXPECT_EQ(w.stop, Stop::EndOfStack);
  // Past a call frame there are none: an entry that needs r10 cannot be followed.
  st_.words[S] = R10F + 0x11;
  Walk c = walk(LEAF, S, 0);
  EXPECT_EQ(c.ips, (Ips{LEAF, R10F + 0x11}));
  EXPECT_EQ(c.stop, Stop::BadEntry);
}

TEST_F(OrcWalk, AnIretFrame) {
  st_.words[S + 16] = IRQ + 0x20;  // ip
  st_.words[S + 24] = 0x10;        // cs
  st_.words[S + 40] = S2;          // sp
  Walk w = walk(PART, S, 0xb0b0);
  EXPECT_EQ(w.ips, (Ips{PART, IRQ + 0x20, BOTTOM + 4}));
  EXPECT_EQ(w.stop, Stop::EndOfStack);
  st_.words[S + 24] = 0x2b;  // from user mode
  Walk u = walk(PART, S, 0xb0b0);
  EXPECT_EQ(u.ips, (Ips{PART}));
  EXPECT_EQ(u.stop, Stop::EndOfStack);
}

TEST_F(OrcWalk, AModulesTableAndBackIntoTheKernel) {
  constexpr std::uint64_t M = 0xffffffffc0001000ull;
  u_.set_modules(
      {table({{M, 8, 0, f3(kRegSp, kRegUndefined, kCall)}, {M + 0x100, 0, 0, f3(kRegUndefined, kRegUndefined, kUndef)}},
             {{M, M + 0x1000}})});
  EXPECT_EQ(u_.module_tables(), 1u);
  st_.words[S] = BOTTOM + 4;
  Walk w = walk(M + 0x10, S, 0);
  EXPECT_EQ(w.ips, (Ips{M + 0x10, BOTTOM + 4}));
  EXPECT_EQ(w.stop, Stop::EndOfStack);
  // Past the module's text nothing describes it.
  Walk out = walk(M + 0x2000, S, 0);
  EXPECT_TRUE(out.ips.empty());
  EXPECT_EQ(out.stop, Stop::NoText);
}

}  // namespace
}  // namespace xenprobes::kernel::orc
