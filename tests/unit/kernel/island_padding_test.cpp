// Where a short jump's island may go (kernel/island_padding.hpp): the function's own dead
// padding and the previous function's, as the engine lists them and bench/kernel_coverage
// counts them, each tripped by a fake kernel written out byte by byte.
#include <gtest/gtest.h>

#include "fake_kernel.hpp"
#include "kernel/island_padding.hpp"
#include "x86/insn.hpp"

namespace xenprobes::kernel {
namespace {

using testing::FakeKernel;
using testing::kText;

// Two functions back to back, then a third:
//   A  kText+0x100  31 c0 (xor eax, eax); c3 (ret); cc; 28 x 90      dead padding [A+3, B)
//   B  kText+0x120  31 c0; 48 ff c0 (inc rax); c3; cc; 25 x 90         dead padding [B+6, C)
//   C  kText+0x140  c3
constexpr std::uint64_t A = kText + 0x100, B = kText + 0x120, C = kText + 0x140;

struct Layout {
  FakeKernel k;
  std::vector<std::uint8_t> a{0x31, 0xc0, 0xc3, 0xcc}, b{0x31, 0xc0, 0x48, 0xff, 0xc0, 0xc3, 0xcc};
  bool with_tables = true, readable = true;

  Layout() {
    a.resize(B - A, 0x90);
    b.resize(C - B, 0x90);
    k.sym(A, 'T', "fa");
    k.sym(B, 'T', "fb");
    k.sym(C, 'T', "fc");
    k.sym(C + 1, 'T', "fd");
  }
  // island_padding_near() for fb, as the engine calls it.
  IslandPaddingListed run(x86::SiteIndex& pad, const x86::SiteIndex* entered = nullptr,
                          const x86::SiteIndex* boot = nullptr) {
    k.put(A, a.data(), a.size());
    k.put(B, b.data(), b.size());
    k.put(C, "\xc3", 1);
    syms = k.symbols();
    tables = k.read();
    IslandPaddingSource src;
    src.syms = &syms;
    src.tables = with_tables ? &tables : nullptr;
    src.entered = entered;
    src.rules = island_padding_rules(syms);
    src.rules.boot_patched = boot;
    src.read = [this](Gva at, std::uint64_t size) -> Result<std::vector<std::uint8_t>> {
      if (!readable) return fail(Errc::Fault, "not mapped");
      std::vector<std::uint8_t> out(size);
      XP_TRY(k.reader()(at, std::as_writable_bytes(std::span(out))));
      return out;
    };
    auto insns = x86::decode_function(b, Gva{B});
    EXPECT_TRUE(insns);
    return island_padding_near(src, *insns, Gva{B}, Gva{C}, x86::JumpContext{}, pad);
  }
  symbols::SymbolTable syms;
  KernelTables tables;
};

// The padding listed at `at`, as [first, end).
std::pair<std::uint64_t, std::uint64_t> site(const x86::SiteIndex& pad, std::uint64_t at) {
  const x86::SiteIndex::Site* s = pad.overlapping(at, at + 1);
  if (!s) return {0, 0};
  return {s->addr, s->addr + s->len};
}

TEST(IslandPadding, TheFunctionsOwnAndThePreviousFunctions) {
  Layout l;
  x86::SiteIndex pad;
  IslandPaddingListed got = l.run(pad);
  EXPECT_TRUE(got.own);
  ASSERT_TRUE(got.previous);
  EXPECT_EQ(*got.previous, "fa");
  EXPECT_EQ(pad.size(), 2u);
  EXPECT_EQ(site(pad, B + 6), (std::pair{B + 6, C}));
  EXPECT_EQ(site(pad, A + 3), (std::pair{A + 3, B}));
  EXPECT_EQ(pad.overlapping(A + 3, A + 4)->what, "dead padding of fa");
  EXPECT_FALSE(pad.overlapping(A, A + 3));  // fa's code is never padding
}

TEST(IslandPadding, ThePreviousFunctionsPaddingNeedsItsBytesAndTheTables) {
  {
    Layout l;
    l.readable = false;
    x86::SiteIndex pad;
    IslandPaddingListed got = l.run(pad);
    EXPECT_TRUE(got.own);
    EXPECT_FALSE(got.previous);
    EXPECT_EQ(pad.size(), 1u);
  }
  {
    Layout l;
    l.with_tables = false;
    x86::SiteIndex pad;
    EXPECT_FALSE(l.run(pad).previous);
    EXPECT_EQ(pad.size(), 1u);
  }
}

TEST(IslandPadding, AnEntryFromOutsideOrATableSiteRefusesThePreviousFunctionsPadding) {
  {  // an exception fixup (or a jump label's target, a branch from elsewhere) lands in it
    Layout l;
    x86::SiteIndex entered, pad;
    entered.add(A + 0x10, 1, "__ex_table fixup");
    EXPECT_FALSE(l.run(pad, &entered).previous);
    EXPECT_FALSE(pad.overlapping(A, B));
    EXPECT_TRUE(pad.overlapping(B + 6, C));
  }
  {  // ... elsewhere it does not matter
    Layout l;
    x86::SiteIndex entered, pad;
    entered.add(A + 1, 1, "__ex_table fixup");
    EXPECT_TRUE(l.run(pad, &entered).previous);
  }
  {  // a jump label's site in it
    Layout l;
    l.k.jump_table({{A + 0x10, A + 2, kText + 0x900}});
    x86::SiteIndex pad;
    EXPECT_FALSE(l.run(pad).previous);
  }
  {  // a 5-byte static call starting 4 bytes before it reaches into it
    Layout l;
    l.k.static_calls({{A + 3 - 4, kText + 0x900}});
    x86::SiteIndex pad;
    EXPECT_FALSE(l.run(pad).previous);
  }
  {  // an exception-table instruction starting 2 bytes before it (its bytes may run into it)
    Layout l;
    l.k.ex_table({{A + 1, kText + 0x900, 0}});
    x86::SiteIndex pad;
    EXPECT_FALSE(l.run(pad).previous);
  }
  {  // a lock prefix in it
    Layout l;
    l.k.smp_locks({A + 0x18});
    x86::SiteIndex pad;
    EXPECT_FALSE(l.run(pad).previous);
  }
}

TEST(IslandPadding, ThePreviousFunctionIsDecodedWithoutJumpTables) {
  // fa ends with an indirect jump: no jump table is read for it, so its targets are unknown
  // and its padding could be one of them.
  Layout l;
  l.a = {0x31, 0xc0, 0xff, 0xe0, 0xcc};  // xor eax, eax; jmp rax; int3
  l.a.resize(B - A, 0x90);
  x86::SiteIndex pad;
  IslandPaddingListed got = l.run(pad);
  EXPECT_FALSE(got.previous);
  EXPECT_TRUE(got.own);
}

TEST(IslandPadding, CallDepthTrackingCutsThePaddingBeforeAFunctionWithoutPfx) {
  Layout l;
  l.k.sym(kText + 0xa00, 'T', "__call_sites");  // a 6.2+ kernel built with call thunks
  l.k.sym(kText + 0xa00, 'T', "__call_sites_end");
  x86::SiteIndex pad;
  IslandPaddingListed got = l.run(pad);
  ASSERT_TRUE(got.previous);
  EXPECT_TRUE(got.previous_cut.trimmed);
  EXPECT_EQ(site(pad, A + 3), (std::pair{A + 3, B - 16}));
  EXPECT_TRUE(got.own_cut.trimmed);  // fc has no __pfx_fc either
  EXPECT_EQ(site(pad, B + 6), (std::pair{B + 6, C - 16}));
}

TEST(IslandPadding, WithCallPaddingThePreviousFunctionIsTheOneBeforePfx) {
  // 6.2+: fb's 16 bytes of call padding are its own symbol, __pfx_fb, which has no padding of
  // its own (no ret); fa's padding ends where it starts.
  for (bool call_thunks : {false, true}) {
    Layout l;
    l.k.sym(B - 16, 't', "__pfx_fb");
    if (call_thunks) {
      l.k.sym(kText + 0xa00, 'T', "__call_sites");
      l.k.sym(kText + 0xa00, 'T', "__call_sites_end");
    }
    x86::SiteIndex pad;
    IslandPaddingListed got = l.run(pad);
    ASSERT_TRUE(got.previous) << call_thunks;
    EXPECT_EQ(*got.previous, "fa");
    // Never the __pfx_ bytes, and with call thunks nothing cut (they are the pfx symbol).
    EXPECT_EQ(site(pad, A + 3), (std::pair{A + 3, B - 16}));
    EXPECT_FALSE(got.previous_cut.trimmed);
  }
  {  // a __pfx_ symbol with code before it that does not end in padding: nothing listed
    Layout l;
    l.k.sym(B - 16, 't', "__pfx_fb");
    std::fill(l.a.begin() + 3, l.a.end(), 0xcc);
    l.a[B - 16 - A - 1] = 0xc3;  // a ret right before __pfx_fb: fa's padding [.., B-16) is empty
    x86::SiteIndex pad;
    EXPECT_FALSE(l.run(pad).previous);
  }
}

TEST(IslandPadding, ABootTimePatchSiteDropsThePadding) {
  Layout l;
  x86::SiteIndex boot, pad;
  boot.add(A + 0x8, 5, "alternative");
  IslandPaddingListed got = l.run(pad, nullptr, &boot);
  EXPECT_FALSE(got.previous);
  ASSERT_TRUE(got.previous_cut.dropped);
  EXPECT_NE(got.previous_cut.dropped->find("alternative"), std::string::npos);
  EXPECT_TRUE(got.own);
}

}  // namespace
}  // namespace xenprobes::kernel
